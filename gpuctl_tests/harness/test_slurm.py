"""The private one-node Slurm: it schedules, runs and reports jobs like a real cluster."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from gpuctl_tests.harness import HarnessError, is_alive
from gpuctl_tests.harness.slurm import SlurmCluster, missing_parts
from gpuctl_tests.helpers import unavailable, wait_until

pytestmark = pytest.mark.slurm


def test_sinfo_lists_the_node_with_its_gpus(slurm_cluster: SlurmCluster) -> None:
    out = slurm_cluster.run(["sinfo", "-h", "-N", "-o", "%N|%P|%G"]).stdout.split()
    assert out == [f"{slurm_cluster.node}|{slurm_cluster.partition}*|gpu:h100:2"]
    data = json.loads(slurm_cluster.run(["sinfo", "--json"]).stdout)
    (node,) = data["nodes"]
    assert node["name"] == slurm_cluster.node
    assert node["gres"] == "gpu:h100:2"


def test_srun_runs_on_this_machine(slurm_cluster: SlurmCluster) -> None:
    r = slurm_cluster.run(["srun", "-N1", "hostname"])
    assert r.stdout.strip() == socket.gethostname()


def test_gpus_are_handed_out_and_overasking_is_refused(slurm_cluster: SlurmCluster) -> None:
    one = slurm_cluster.run(["srun", "--gpus=1", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES"])
    assert one.stdout.strip() in ("0", "1")
    two = slurm_cluster.run(["srun", "--gpus=2", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES"])
    assert two.stdout.strip() == "0,1"
    r = slurm_cluster.run(["srun", "--gpus=3", "true"], check=False, timeout=30)
    assert r.returncode != 0
    assert "not available" in r.stderr


def test_sbatch_job_runs_to_completion(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    out = tmp_path / "job.out"
    r = slurm_cluster.run(
        ["sbatch", "--parsable", "--gpus=1", "-J", "harness", "-o", str(out)],
        input="#!/bin/sh\necho gpu=$CUDA_VISIBLE_DEVICES job=$SLURM_JOB_ID\n",
    )
    job = r.stdout.strip().split(";")[0]
    assert job.isdigit()
    # squeue --json works; the job is listed until it ends
    data = json.loads(slurm_cluster.run(["squeue", "--json"]).stdout)
    assert isinstance(data["jobs"], list)

    def finished() -> bool:
        if not slurm_cluster.jobcomp_path.exists():
            return False
        return any(
            f"JobId={job} " in line and "JobState=COMPLETED" in line
            for line in slurm_cluster.jobcomp_path.read_text().splitlines()
        )

    wait_until(finished, 30, f"job {job} COMPLETED in the jobcomp file")
    text = out.read_text()
    assert text.startswith("gpu=") and text.strip().endswith(f"job={job}")
    slurm_cluster.wait_idle()


def test_a_running_job_shows_in_squeue_json(slurm_cluster: SlurmCluster) -> None:
    job = slurm_cluster.run(
        ["sbatch", "--parsable", "--gpus=1", "--wrap", "sleep 60"]
    ).stdout.strip()

    def running() -> dict[str, object] | None:
        data = json.loads(slurm_cluster.run(["squeue", "--json"]).stdout)
        for j in data["jobs"]:
            if str(j["job_id"]) == job and j["job_state"] == "RUNNING":
                return j  # type: ignore[no-any-return]
        return None

    j = wait_until(running, 30, f"job {job} running")
    assert j["nodes"] == slurm_cluster.node
    assert "gpu" in json.dumps(j)  # the GPU request is in the job record
    slurm_cluster.run(["scancel", job], timeout=10)
    slurm_cluster.wait_idle()
    # run() works in the cluster's folder: the job's default output never lands in the checkout
    assert (slurm_cluster.dir / f"slurm-{job}.out").exists()
    assert not (Path.cwd() / f"slurm-{job}.out").exists()


def test_stop_leaves_no_process_and_a_bad_config_shows_the_log(tmp_path: Path) -> None:
    reason = missing_parts()
    if reason:
        unavailable(reason)
    cluster = SlurmCluster(tmp_path / "own", min_job_age=2)
    job = cluster.run(["sbatch", "--parsable", "--wrap", "sleep 300"]).stdout.strip()
    wait_until(
        lambda: cluster.run(["squeue", "-h", "-j", job, "-o", "%T"]).stdout.strip() == "RUNNING",
        30,
        "the job running",
    )
    pids = cluster.processes()
    assert len(pids) >= 4  # munged, slurmctld, slurmd, slurmstepd (+ the job's sleep)
    cluster.stop()
    assert cluster.processes() == set()
    assert not any(is_alive(p) for p in pids)

    broken = SlurmCluster(tmp_path / "broken", start=False)
    broken.conf_path.write_text(broken.conf_path.read_text() + "NoSuchKey=1\n")
    with pytest.raises(HarnessError, match=r"(?s)slurmctld.*NoSuchKey"):
        broken.start(timeout=15)
    assert broken.processes() == set()


def test_a_port_taken_before_slurmctld_binds_it_gives_new_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another test Slurm on this machine may bind a port between the harness choosing it and
    slurmctld binding it: slurmctld then dies with "Address already in use", and the harness
    starts the cluster again on new ports instead of failing the session."""
    import gpuctl_tests.harness.slurm as harness

    reason = missing_parts()
    if reason:
        unavailable(reason)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        chosen: list[list[int]] = []
        real = harness._free_ports

        def first_one_taken(n: int) -> list[int]:
            ports = real(n)
            if not chosen:
                ports[0] = taken  # the controller's port, already someone else's
            chosen.append(ports)
            return ports

        monkeypatch.setattr(harness, "_free_ports", first_one_taken)
        cluster = SlurmCluster(tmp_path / "own")
        try:
            assert len(chosen) == 2 and chosen[0][0] == taken
            assert cluster.ctld_port == chosen[1][0] != taken
            assert "Address already in use" in (tmp_path / "own" / "slurmctld.log").read_text()
            r = cluster.run(["sinfo", "-h", "-o", "%N"])
            assert r.stdout.split() == [cluster.node]
        finally:
            cluster.stop()


def test_several_nodes_each_in_its_own_network_namespace(tmp_path: Path) -> None:
    """``nodes=3``: node01..node03, one slurmd each in its own network namespace with its own
    address; one srun step reaches all three; stop() leaves no process, namespace or bridge."""
    import subprocess

    reason = missing_parts(multi=True)
    if reason:
        unavailable(reason)
    cluster = SlurmCluster(tmp_path / "three", nodes=3)
    try:
        assert cluster.net is not None
        out = cluster.run(["sinfo", "-h", "-N", "-o", "%N|%T|%G"]).stdout.split()
        assert out == [f"node0{i}|idle|gpu:h100:2" for i in (1, 2, 3)]
        r = cluster.run(
            [
                "srun",
                "-N3",
                "--label",
                "sh",
                "-c",
                'echo "$SLURMD_NODENAME $(hostname) $(hostname -I)"',
            ],
            timeout=60,
        )
        seen = {}
        for line in r.stdout.splitlines():
            task, _, text = line.partition(": ")
            node, host, addrs = text.split(" ", 2)
            assert host == node  # its own hostname
            seen[node] = (int(task), addrs)
        assert sorted(seen) == ["node01", "node02", "node03"]
        for i, node in enumerate(cluster.nodes):
            addrs = seen[node][1]
            # its own address, and not the machine's: the step ran inside the namespace
            assert addrs.split() == [cluster.net.addresses[i]], addrs
        assert len({t for t, _ in seen.values()}) == 3
        names = list(cluster.net.names)
        bridge = cluster.net.bridge
        pids = cluster.processes()
    finally:
        cluster.stop()
    assert cluster.processes() == set()
    assert not any(is_alive(p) for p in pids)
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(n in left for n in names)
    links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout
    assert bridge not in links
