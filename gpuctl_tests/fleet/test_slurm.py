"""Slurm as inventory and transport, against the real one-node Slurm: sinfo discovery, the
srun link, and which job holds which GPU."""

from __future__ import annotations

import asyncio
import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpuctl.config import load_config, parse_config
from gpuctl.core.model import NodeState
from gpuctl.fleet.build import fleet_from_config
from gpuctl.fleet.slurm import JobWatcher, SlurmError, discover
from gpuctl.reach.slurm import (
    SlurmClient,
    parse_gres_gpus,
    parse_idx,
    parse_scontrol_job,
    parse_sinfo,
)
from gpuctl_tests.harness.slurm import SlurmCluster
from gpuctl_tests.helpers import wait_fleet, wait_until

FAST = {"backoff_base": 0.2, "backoff_max": 0.5, "stale_after": 1.0}


# -- parsing (pure) ---------------------------------------------------------------------------
def test_parse_gres() -> None:
    assert parse_gres_gpus("gpu:h100:2") == (2, "h100")
    assert parse_gres_gpus("gpu:4") == (4, None)
    assert parse_gres_gpus("gpu:a100:2(S:0-1),gpu:v100:1,nic:1") == (3, "a100")
    assert parse_gres_gpus("(null)") == (0, None)
    assert parse_idx("gpu:h100:3(IDX:0-1,3)") == [0, 1, 3]
    assert parse_idx("gpu:a100:1(IDX:2),gpu:v100:1(IDX:5)") == [2, 5]
    assert parse_idx("gpu:h100:0(IDX:N/A)") == []


def test_parse_sinfo_merges_partitions_and_reads_states() -> None:
    text = (
        "g01|gpu*|gpu:h100:8|mixed|none\n"
        "g01|long|gpu:h100:8|mixed|none\n"
        "g02|gpu*|gpu:h100:8|drained|bad | fan\n"
        "c01|cpu|(null)|down*|Not responding\n"
    )
    nodes = {n.name: n for n in parse_sinfo(text)}
    assert nodes["g01"].partitions == ("gpu", "long") and nodes["g01"].gpus == 8
    assert nodes["g01"].reason is None and not nodes["g01"].down
    assert nodes["g02"].drained and nodes["g02"].reason == "bad | fan"
    assert nodes["c01"].down and nodes["c01"].gpus == 0


def test_parse_scontrol_job_detail() -> None:
    text = (
        "JobId=7 JobName=x\n"
        "   JOB_GRES=gpu:h100:3\n"
        "     Nodes=g[01-02] CPU_IDs=0 Mem=100 GRES=gpu:h100:1(IDX:1)\n"
        "     Nodes=g03 CPU_IDs=0-1 Mem=100 GRES=gpu:h100:2(IDX:0,2)\n"
    )
    assert parse_scontrol_job(text) == {"g01": [1], "g02": [1], "g03": [0, 2]}


def test_missing_sinfo_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SlurmError, match=r"^sinfo not found: is this a Slurm login node\?$"):
        discover()


# -- the real Slurm ---------------------------------------------------------------------------
def _cancel_jobs(slurm: SlurmCluster) -> None:
    """scancel our jobs and wait until squeue lists none (the node may read "mixed" a while)."""
    slurm.cancel_all()
    wait_until(
        lambda: not slurm.run(["squeue", "-h", "-t", "PD,R,CG,S", "-o", "%i"]).stdout.split(),
        30,
        "jobs to end",
    )


def _config(slurm: SlurmCluster, tmp_path: Path, **keys: Any) -> Path:
    lines = [
        "[clusters.hpc]",
        'via = "srun"',
        f'partition = "{slurm.partition}"',
        f'slurm_conf = "{slurm.conf_path}"',
        f'bundle_dir = "{tmp_path / "shared"}"',
        "simulate = 2",
        "interval = 0.2",
        *(f"{k} = {v!r}".replace("'", '"') for k, v in keys.items()),
    ]
    path = tmp_path / "config.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.slurm
def test_sinfo_discovery(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    client = SlurmClient(slurm_cluster.conf_path)
    (node,) = discover(slurm_cluster.partition, client=client)
    assert node.name == slurm_cluster.node
    assert node.partitions == (slurm_cluster.partition,)
    assert (node.gpus, node.gpu_type) == (2, "h100")
    assert node.state in ("idle", "mixed", "allocated") and not node.down
    assert discover("nosuchpartition", client=client) == []
    # a drained node reads as drained, with its reason
    slurm_cluster.run(
        ["scontrol", "update", f"NodeName={slurm_cluster.node}", "State=DRAIN", "Reason=bad fan"]
    )
    try:
        (node,) = discover(client=client)
        assert node.drained and node.reason == "bad fan"
    finally:
        slurm_cluster.resume()
        slurm_cluster.wait_idle()
    # a config without nodes takes them from sinfo
    config = load_config(_config(slurm_cluster, tmp_path))
    fleet = fleet_from_config(config)
    assert fleet.names == [slurm_cluster.node]
    assert fleet.nodes[slurm_cluster.node].link.kind == "srun"


@pytest.mark.slurm
async def test_srun_link_and_gpu_jobs(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    node = slurm_cluster.node
    config = load_config(_config(slurm_cluster, tmp_path))
    fleet = fleet_from_config(config, **FAST)
    for w in fleet.watchers:
        w.interval = 0.3
    # no job of ours on the node: the srun link says what to do
    await fleet.start()
    try:
        snaps = await wait_fleet(fleet, lambda ss: ss[node].state is NodeState.UNREACHABLE)
        assert snaps[node].reason == (
            f"no_job: no running Slurm job of yours on {node}: start one "
            f"(salloc -w {node} ...) or set jobid = N for this cluster"
        )
        out = await asyncio.to_thread(
            slurm_cluster.run,
            ["sbatch", "--parsable", "--gpus=1", "-J", "holder", "--wrap", "sleep 300"],
        )
        job = out.stdout.strip().split(";")[0]
        # the link finds the job, starts the agent as a step, and the watcher marks the GPU
        snaps = await wait_fleet(
            fleet,
            lambda ss: (
                ss[node].last_sample_t is not None
                and any(a.get("slurm_job") == job for a in ss[node].annotations.values())
            ),
            what="agent streaming through srun and the job shown on its GPU",
        )
        assert snaps[node].link == "srun"
        held = {g: dict(a) for g, a in snaps[node].annotations.items() if a.get("slurm_job")}
        detail = await asyncio.to_thread(slurm_cluster.run, ["scontrol", "show", "job", "-d", job])
        (idx,) = parse_scontrol_job(detail.stdout)[node]
        assert held == {idx: {"slurm_job": job, "slurm_user": slurm_cluster.user}}
        # the job ends: the GPU is free again and the agent step went with the job
        await asyncio.to_thread(slurm_cluster.run, ["scancel", job])
        await wait_fleet(
            fleet,
            lambda ss: (
                not any(a.get("slurm_job") for a in ss[node].annotations.values())
                and ss[node].state is not NodeState.LIVE
            ),
            what="annotation cleared and the agent gone with the job",
        )
    finally:
        await fleet.stop()
        await asyncio.to_thread(_cancel_jobs, slurm_cluster)


@pytest.mark.slurm
async def test_srun_link_with_configured_job(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    out = await asyncio.to_thread(
        slurm_cluster.run, ["sbatch", "--parsable", "-J", "mine", "--wrap", "sleep 300"]
    )
    job = int(out.stdout.strip().split(";")[0])
    text = _config(slurm_cluster, tmp_path).read_text()
    text = text.replace(
        f'partition = "{slurm_cluster.partition}"\n',
        f'nodes = "{slurm_cluster.node}"\njobid = {job}\nsimulate = "1:L40S"\n',
    ).replace("simulate = 2\n", "")
    fleet = fleet_from_config(parse_config(text), **FAST)
    await fleet.start()
    try:
        snaps = await wait_fleet(
            fleet, lambda ss: ss[slurm_cluster.node].last_sample_t is not None, what="streaming"
        )
        info = snaps[slurm_cluster.node].info
        assert info is not None and [g.name for g in info.gpus] == ["NVIDIA L40S"]
        reply = await fleet.request(slurm_cluster.node, {"type": "ping"})
        assert reply["type"] == "pong"
        steps = await asyncio.to_thread(
            slurm_cluster.run, ["squeue", "-h", "-s", "-j", str(job), "-o", "%i"]
        )
        assert f"{job}.0" in steps.stdout.split() or any(
            s.startswith(f"{job}.") for s in steps.stdout.split()
        )
    finally:
        await fleet.stop()
        # closing the link ended the step, not the job
        steps = await asyncio.to_thread(
            slurm_cluster.run, ["squeue", "-h", "-s", "-j", str(job), "-o", "%i"]
        )
        await asyncio.to_thread(_cancel_jobs, slurm_cluster)
    assert [s for s in steps.stdout.split() if not s.endswith(".batch")] == []


def _recording(tool: str, folder: Path) -> Path:
    """A ``tool`` first on PATH that writes its argv (one line, fields split by \\x1f) to
    ``folder/<tool>.argv`` and then runs the real one: the real Slurm answers, the test sees
    what gpuctl asked."""
    real = shutil.which(tool)
    assert real is not None
    folder.mkdir(exist_ok=True)
    log = folder / f"{tool}.argv"
    script = folder / tool
    script.write_text(
        "#!/bin/sh\n"
        f"{{ for a in \"$@\"; do printf '%s\\037' \"$a\"; done; echo; }} >> '{log}'\n"
        f"exec '{real}' \"$@\"\n"
    )
    script.chmod(0o755)
    return log


def _calls(log: Path) -> list[list[str]]:
    if not log.exists():
        return []
    return [line.split("\x1f")[:-1] for line in log.read_text().splitlines()]


class _Annotations:
    def __init__(self) -> None:
        self.gpus: dict[tuple[str, int], dict[str, Any]] = {}

    def annotate(self, node: str, gpu: int, **values: Any) -> None:
        self.gpus[(node, gpu)] = values


@pytest.mark.slurm
async def test_the_watcher_asks_slurm_only_about_its_nodes(
    slurm_cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One squeue per poll, filtered by Slurm to the watched nodes and to running jobs (never
    the whole queue as --json); scontrol once per GPU job, not once per poll; a watched name
    Slurm does not know is dropped from the query instead of failing every poll."""
    bin_dir = tmp_path / "bin"
    squeue_log = _recording("squeue", bin_dir)
    scontrol_log = _recording("scontrol", bin_dir)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    out = await asyncio.to_thread(
        slurm_cluster.run, ["sbatch", "--parsable", "--gpus=1", "-J", "gpu", "--wrap", "sleep 300"]
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
        squeue_log.unlink(missing_ok=True)
        seen = _Annotations()
        watcher = JobWatcher(
            seen, [slurm_cluster.node, "ghost01"], client=SlurmClient(slurm_cluster.conf_path)
        )
        await watcher.poll_once()
        assert watcher.error is None and watcher.unknown == {"ghost01"}
        (held,) = [k for k, v in seen.gpus.items() if v["slurm_job"]]
        assert held[0] == slurm_cluster.node
        assert seen.gpus[held] == {"slurm_job": job, "slurm_user": slurm_cluster.user}
        await watcher.poll_once()
        await watcher.poll_once()
        calls = _calls(squeue_log)
        # the first query named the unknown node and was refused; every later one left it out
        assert [c for c in calls if "--nodelist=ghost01,localhost" in c] == calls[:1]
        assert len(calls) == 4
        for argv in calls:
            assert "--json" not in argv and "--states=RUNNING" in argv, argv
            assert any(a.startswith("--nodelist=") for a in argv), argv
        assert all(f"--nodelist={slurm_cluster.node}" in c for c in calls[1:])
        details = [c for c in _calls(scontrol_log) if c[:3] == ["-d", "show", "job"]]
        assert [c[3] for c in details] == [job]  # three polls, one scontrol for the job
        assert watcher.delay == watcher.interval  # Slurm answered fast: no backoff
    finally:
        await asyncio.to_thread(_cancel_jobs, slurm_cluster)


async def test_the_watcher_waits_longer_while_slurm_does_not_answer(
    tmp_path: Path, closed_port: int
) -> None:
    """A controller that refuses connections: each failed poll doubles the wait."""
    from gpuctl_tests.harness.slurm import missing_parts

    if missing_parts():
        pytest.skip(str(missing_parts()))
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        "ClusterName=dead\nSlurmctldHost=localhost(127.0.0.1)\n"
        f"SlurmctldPort={closed_port}\nAuthType=auth/none\nCredType=cred/none\n"
        "NodeName=n1 CPUs=1\nPartitionName=p Nodes=n1\n"
    )
    watcher = JobWatcher(_Annotations(), ["n1"], client=SlurmClient(conf, timeout=0.5))
    await watcher.poll_once()
    assert watcher.error is not None and watcher.error.startswith("squeue ")
    assert watcher.delay == 20
    await watcher.poll_once()
    assert watcher.delay == 40


@pytest.mark.slurm
async def test_a_node_seen_down_at_discovery_is_asked_again(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """Discovery saw the node down; Slurm has it up now: the link asks sinfo again instead of
    refusing for the rest of the session (it goes on to look for the user's job)."""
    from gpuctl.fleet.session import LinkError
    from gpuctl.fleet.slurm import SrunLink
    from gpuctl.reach.slurm import SlurmNode

    config = load_config(_config(slurm_cluster, tmp_path))
    node = next(iter(config.clusters.values())).template
    assert node is not None
    stale = SlurmNode(slurm_cluster.node, ("debug",), 2, "h100", "down*", "Not responding")
    link = SrunLink(replace(node, name=slurm_cluster.node), slurm_node=stale)
    with pytest.raises(LinkError) as err:
        await link.open()
    assert err.value.reason == "no_job", str(err.value)
    assert link.slurm_node is not None and not link.slurm_node.down


@pytest.mark.slurm
async def test_srun_link_replaces_a_tampered_bundle_and_never_runs_it(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """The bundle on the shared folder was replaced (same name, other content): the node's boot
    code refuses it by its sha256, gpuctl writes its own again, and the agent starts."""
    import io
    import zipfile

    from gpuctl.bundle import write_bundle
    from gpuctl.config import parse_config
    from gpuctl.fleet.slurm import SrunLink

    out = await asyncio.to_thread(
        slurm_cluster.run, ["sbatch", "--parsable", "-J", "hold", "--wrap", "sleep 300"]
    )
    job = int(out.stdout.strip().split(";")[0])
    try:
        await asyncio.to_thread(
            wait_until,
            lambda: (
                slurm_cluster.run(["squeue", "-h", "-j", str(job), "-o", "%T"]).stdout.strip()
                == "RUNNING"
            ),
            30,
            "the holding job to run",
        )
        shared = tmp_path / "shared"
        shared.mkdir(mode=0o700)
        bundle = write_bundle(shared)
        marker = tmp_path / "tampered-code-ran"
        evil = io.BytesIO()
        with zipfile.ZipFile(evil, "w") as zf:
            zf.writestr("gpuctl/__init__.py", "")
            zf.writestr("gpuctl/node/__init__.py", "")
            zf.writestr(
                "gpuctl/node/__main__.py",
                f"open({str(marker)!r}, 'w').close()\ndef main(argv=None):\n    return 0\n",
            )
        bundle.write_bytes(evil.getvalue())
        text = _config(slurm_cluster, tmp_path).read_text()
        text = text.replace(
            f'partition = "{slurm_cluster.partition}"\n',
            f'nodes = "{slurm_cluster.node}"\njobid = {job}\n',
        )
        (node,) = parse_config(text).nodes()
        link = SrunLink(node)
        session = await link.open()
        try:
            info = await session.handshake(timeout=60)
            assert len(info.gpus) == 2
        finally:
            await session.close()
        assert not marker.exists()
        assert bundle.read_bytes() != evil.getvalue()
    finally:
        await asyncio.to_thread(_cancel_jobs, slurm_cluster)
