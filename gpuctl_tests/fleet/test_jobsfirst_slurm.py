"""``gpuctl status --mine`` / ``--job`` against the real one-node Slurm (#43.2): a batch job of
ours holds one GRES GPU; the agent runs as a step of it (``via = "srun"``, simulated GPUs); the
squeue watch puts the job on its GPU and the one-shot status waits for the watch's first poll."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuctl.reach.slurm import parse_scontrol_job
from gpuctl_tests.fleet.test_slurm import _cancel_jobs, _config
from gpuctl_tests.harness.slurm import SlurmCluster
from gpuctl_tests.helpers import node_env, wait_until
from gpuctl_tests.processes import Start


def _status(slurm: SlurmCluster, config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = node_env({**slurm.env, "GPUCTL_CONFIG": str(config), "COLUMNS": "200"})
    return subprocess.run(
        [sys.executable, "-m", "gpuctl", "status", "--timeout", "90", *args],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )


@pytest.mark.slurm
def test_status_mine_and_job_list_the_gpu_of_the_job_with_its_totals(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    config = _config(slurm_cluster, tmp_path)
    # every GPU of a job counts as idle: the simulated load does not decide the test
    config.write_text(config.read_text() + "[fleet]\nidle_below = 100\n")
    out = slurm_cluster.run(
        ["sbatch", "--parsable", "--gpus=1", "-J", "holder", "--wrap", "sleep 300"]
    )
    job = out.stdout.strip().split(";")[0]
    try:
        wait_until(
            lambda: (
                slurm_cluster.run(["squeue", "-h", "-j", job, "-o", "%T"]).stdout.strip()
                == "RUNNING"
            ),
            30,
            "the GPU job running",
        )
        detail = slurm_cluster.run(["scontrol", "show", "job", "-d", job])
        (idx,) = parse_scontrol_job(detail.stdout)[slurm_cluster.node]

        mine = _status(slurm_cluster, config, "--mine", "--json")
        assert mine.returncode == 0, mine.stderr
        doc = json.loads(mine.stdout)
        (node,) = doc["nodes"]
        assert node["name"] == slurm_cluster.node
        (gpu,) = node["gpus"]  # the node has two GPUs: only the job's is listed
        assert (gpu["index"], gpu["slurm_job"], gpu["slurm_user"]) == (
            idx,
            job,
            slurm_cluster.user,
        )
        assert isinstance(gpu["alloc_idle_s"], float)
        assert doc["idle_watched"] is False  # seconds watched, not idle_after
        (totals,) = doc["jobs"]
        assert (totals["job"], totals["user"], totals["gpus"], totals["nodes"]) == (
            job,
            slurm_cluster.user,
            1,
            [slurm_cluster.node],
        )
        assert totals["mem_total"] == gpu["mem_total"] and totals["power"] == gpu["power"]

        table = _status(slurm_cluster, config, "--job", job)
        assert table.returncode == 0, table.stderr
        rows = table.stdout.splitlines()[1:]
        assert [r.split()[:2] for r in rows] == [[slurm_cluster.node, str(idx)]]
        assert f"gpuctl: job {job} {slurm_cluster.user}: 1 GPU on 1 node, util" in table.stderr
        # a one-shot cannot flag a GPU allocated but idle: said, where a GPU is in a job
        assert "gpuctl: allocated but idle: a one-shot status watches seconds, not the 30m" in (
            table.stderr
        )

        other = _status(slurm_cluster, config, "--job", "999999")
        assert other.returncode == 0, other.stderr
        assert other.stdout.splitlines()[1:] == []
        assert "gpuctl: no GPU of a running Slurm job 999999 on these nodes" in other.stderr
        assert "allocated but idle" not in other.stderr  # no GPU of a job shown: not said
    finally:
        _cancel_jobs(slurm_cluster)


def test_status_job_takes_a_job_id_said_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gpuctl", "status", "--demo", "--job", "abc"],
        capture_output=True,
        text=True,
        timeout=60,
        env=node_env(),
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "gpuctl: --job takes a Slurm job id, e.g. --job 4242 (not 'abc')"
    ]


@pytest.mark.slurm
async def test_a_gpu_processs_cgroup_job_wins_over_squeues_gpu_index(
    slurm_cluster: SlurmCluster,
    nvml_lib_dir: Path,
    tmp_path: Path,
    procs: Start,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Slurm's numbering and the node's differ: the job holds GPU ``idx`` by Slurm's count,
    and its process (a real ``sleep`` in the job's cgroup, laid out as Slurm's) runs on the
    node's other GPU. The agent reads the process's cgroup; the squeue watch puts the job on
    the GPU its process is on."""
    import asyncio

    from gpuctl.fleet.fleet import Fleet
    from gpuctl.fleet.links import LocalLink
    from gpuctl.fleet.slurm import JobWatcher
    from gpuctl.reach.slurm import SlurmClient
    from gpuctl_tests.harness.cgroups import V1, moved_into, slurm_v1
    from gpuctl_tests.helpers import wait_fleet
    from gpuctl_tests.node.nvml_stub import NvmlStub

    node = slurm_cluster.node
    out = await asyncio.to_thread(
        slurm_cluster.run,
        ["sbatch", "--parsable", "--gpus=1", "-J", "moved", "--wrap", "sleep 300"],
    )
    job = out.stdout.strip().split(";")[0]
    try:
        await asyncio.to_thread(
            wait_until,
            lambda: (
                slurm_cluster.run(["squeue", "-h", "-j", job, "-o", "%T"]).stdout.strip()
                == "RUNNING"
            ),
            30,
            "the GPU job running",
        )
        detail = await asyncio.to_thread(slurm_cluster.run, ["scontrol", "show", "job", "-d", job])
        (idx,) = parse_scontrol_job(detail.stdout)[node]
        other = 1 - idx
        task = procs("sleep", "321")
        with moved_into(V1, slurm_v1(int(job)), task.pid):
            stub = NvmlStub(
                nvml_lib_dir, tmp_path / "nvml.conf", f"count 2\nproc {other} {task.pid} 64\n"
            )
            for key, value in stub.env().items():
                monkeypatch.setenv(key, value)  # the local agent's environment
            fleet = Fleet({node: LocalLink(interval=0.2)})
            watcher = JobWatcher(fleet, [node], client=SlurmClient(slurm_cluster.conf_path))
            await fleet.start()
            try:
                await wait_fleet(
                    fleet,
                    lambda ss: any(p.slurm_job == job for g in ss[node].gpus for p in g.processes),
                    what="the process's cgroup job in a sample",
                )
                await watcher.poll_once()
                notes = fleet.snapshot(node).annotations
                assert notes[other] == {"slurm_job": job, "slurm_user": slurm_cluster.user}
            finally:
                await fleet.stop()
    finally:
        await asyncio.to_thread(_cancel_jobs, slurm_cluster)
