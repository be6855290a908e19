"""Slurm as inventory and transport, against the real one-node Slurm: sinfo discovery, the
srun link, and which job holds which GPU."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpuctl.config import load_config, parse_config
from gpuctl.core.model import NodeSnapshot, NodeState
from gpuctl.fleet.build import fleet_from_config
from gpuctl.fleet.fleet import Fleet
from gpuctl.fleet.slurm import SlurmError, discover
from gpuctl.remote.slurm import (
    SlurmClient,
    parse_gres_gpus,
    parse_idx,
    parse_scontrol_job,
    parse_sinfo,
)
from gpuctl_tests.harness.slurm import SlurmCluster
from gpuctl_tests.helpers import wait_until

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
async def wait_fleet(
    fleet: Fleet,
    pred: Callable[[dict[str, NodeSnapshot]], Any],
    timeout: float = 30.0,
    what: str = "the fleet state",
) -> dict[str, NodeSnapshot]:
    changed = asyncio.Event()
    fleet.subscribe(lambda _s: changed.set())
    deadline = time.monotonic() + timeout
    while True:
        snaps = {s.name: s for s in fleet.snapshots()}
        if pred(snaps):
            return snaps
        left = deadline - time.monotonic()
        if left <= 0:
            now = {n: (s.state.value, s.reason, dict(s.annotations)) for n, s in snaps.items()}
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}; now {now}")
        changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), min(left, 0.5))


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
