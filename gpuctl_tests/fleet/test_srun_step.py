"""One srun step for all the nodes of a job, on the real four-node Slurm (one slurmd per network
namespace): every node live with its own samples, requests reach only their node, one agent's
death leaves the others streaming, and no agent outlives gpuctl."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpuctl.config import parse_config
from gpuctl.core.model import NodeEvent, NodeSnapshot, NodeState
from gpuctl.fleet.build import fleet_from_config
from gpuctl.fleet.fleet import Fleet
from gpuctl.fleet.slurm import StepLink
from gpuctl.node import protocol
from gpuctl_tests.fleet.test_slurm import FAST
from gpuctl_tests.harness import all_pids, is_alive
from gpuctl_tests.harness.slurm import SlurmCluster
from gpuctl_tests.helpers import REPO, wait_fleet, wait_until

pytestmark = pytest.mark.slurm


# -- pure -----------------------------------------------------------------------------------
def test_pieces_fit_under_srun_label_cuts_and_join_back() -> None:
    line = protocol.encode({"type": "sample", "pad": "x" * 5000, "plus": "+=" * 700})
    out = protocol.pieces(line)
    parts = out.splitlines(keepends=True)
    assert len(line) == 6437 and len(parts) == 7
    assert all(len(p) <= protocol.PIECE_BYTES + 2 for p in parts)
    assert [p[:1] for p in parts] == [b"+"] * 6 + [b"="]
    joiner = protocol.Joiner()
    got = [joiner.feed(p.rstrip(b"\n")) for p in parts]
    assert got[:-1] == [None] * 6 and got[-1] == line.rstrip(b"\n")
    short = protocol.encode({"type": "pong"})
    assert protocol.pieces(short) == short and joiner.feed(short.rstrip(b"\n")) == short[:-1]


def test_step_argv_for_one_node_is_what_srun_link_ran_and_shared_adds_labels() -> None:
    from gpuctl.reach.slurm import SlurmClient, SlurmValueError

    client = SlurmClient()
    assert client.step_argv("7", ["n1"], ["true"]) == [
        "srun", "--overlap", "--jobid=7", "-w", "n1", "-N1", "-n1", "--quiet",
        "--kill-on-bad-exit=1", "true",
    ]  # fmt: skip
    assert client.step_argv("7", ["n1", "n2", "n3"], ["true"], shared=True) == [
        "srun", "--overlap", "--jobid=7", "-w", "n[1-3]", "-N3", "--ntasks-per-node=1",
        "--quiet", "--input=all", "--label", "--kill-on-bad-exit=0", "true",
    ]  # fmt: skip
    with pytest.raises(SlurmValueError):
        client.step_argv("7; rm", ["n1"], ["true"])


def test_srun_step_key_chooses_one_srun_per_node() -> None:
    from gpuctl.config import ConfigError
    from gpuctl.fleet.slurm import SrunLink

    base = '[clusters.hpc]\nvia = "srun"\nnodes = "n[1-3]"\n'
    fleet = fleet_from_config(parse_config(base))
    assert {type(rt.link) for rt in fleet.nodes.values()} == {StepLink}
    fleet = fleet_from_config(parse_config(base + 'srun_step = "per-node"\n'))
    assert {type(rt.link) for rt in fleet.nodes.values()} == {SrunLink}
    one = fleet_from_config(parse_config('[clusters.hpc]\nvia = "srun"\nnodes = "n1"\n'))
    assert type(one.nodes["n1"].link) is SrunLink  # one node: nothing to share
    with pytest.raises(ConfigError, match=r"srun_step: must be one of shared, per-node"):
        parse_config(base + 'srun_step = "one"\n')


# -- the real four-node Slurm ----------------------------------------------------------------
def _hold(slurm: SlurmCluster) -> str:
    job = slurm.run(["sbatch", "--parsable", "-N4", "-J", "hold", "--wrap", "sleep 600"])
    jid = job.stdout.strip().split(";")[0]
    wait_until(
        lambda: slurm.run(["squeue", "-h", "-j", jid, "-o", "%T"]).stdout.strip() == "RUNNING",
        30,
        "the four-node job running",
    )
    return jid


def _fleet_config(slurm: SlurmCluster, tmp_path: Path, *extra: str) -> str:
    return "\n".join(
        [
            "[clusters.hpc]",
            'via = "srun"',
            f'nodes = "node[01-0{len(slurm.nodes)}]"',
            f'slurm_conf = "{slurm.conf_path}"',
            f'bundle_dir = "{tmp_path / "shared"}"',
            'simulate = "2:H100"',
            "interval = 0.2",
            *extra,
        ]
    )


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(kv.split("=", 1) for kv in raw.decode(errors="replace").split("\0") if "=" in kv)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def agents(job: str) -> dict[int, str]:
    """pid -> node of every agent process of ``job`` on this machine (all the nodes)."""
    found = {}
    for pid in all_pids():
        cmd = _cmdline(pid)
        if not os.path.basename(cmd.split(" ")[0]).startswith("python") or " agent " not in cmd:
            continue  # the shell around the agent names it too
        env = _environ(pid)
        if env.get("SLURM_JOB_ID") == job and "SLURMD_NODENAME" in env:
            found[pid] = env["SLURMD_NODENAME"]
    return found


def sruns(parent: int) -> list[int]:
    return [p for p in all_pids() if _cmdline(p).startswith("srun ") and _ppid(p) == parent]


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def _steps(slurm: SlurmCluster, job: str) -> list[str]:
    out = slurm.run(["squeue", "-h", "-s", "-j", job, "-o", "%i"]).stdout.split()
    return [s for s in out if not s.endswith((".batch", ".extern"))]


async def _held_fleet(slurm: SlurmCluster, tmp_path: Path) -> tuple[str, Fleet]:
    """A job holding every node, and a fleet that reaches them through one step of it."""
    job = await asyncio.to_thread(_hold, slurm)
    return job, fleet_from_config(parse_config(_fleet_config(slurm, tmp_path)), **FAST)


def _live(ss: dict[str, NodeSnapshot], names: list[str]) -> bool:
    return all(
        ss[n].state is NodeState.LIVE and ss[n].last_sample_t is not None and len(ss[n].gpus) == 2
        for n in names
    )


async def test_one_step_carries_every_node_and_requests_reach_only_theirs(
    slurm_nodes: SlurmCluster, tmp_path: Path
) -> None:
    slurm = slurm_nodes
    job, fleet = await _held_fleet(slurm, tmp_path)
    assert all(isinstance(rt.link, StepLink) for rt in fleet.nodes.values())
    burns: list[tuple[str, NodeEvent]] = []
    fleet.on_event(lambda node, e: burns.append((node, e)) if e.kind == "burn" else None)
    await fleet.start()
    try:
        snaps = await wait_fleet(fleet, lambda ss: _live(ss, slurm.nodes), what="4 nodes live")
        # one srun on the login side, one step in Slurm, one agent per node
        assert len(sruns(os.getpid())) == 1
        assert len(await asyncio.to_thread(_steps, slurm, job)) == 1
        assert sorted((await asyncio.to_thread(agents, job)).values()) == slurm.nodes
        # each node's own samples: its simulated GPUs differ from the others'
        uuids = {n: tuple(g.uuid for g in snaps[n].gpus) for n in slurm.nodes}
        assert len(set(uuids.values())) == 4, uuids
        # a burn asked of node02 runs on node02 only
        reply = await fleet.request("node02", {"type": "stress_start", "gpus": [1], "duration": 60})
        assert reply["type"] == "ok", reply
        await wait_fleet(
            fleet, lambda ss: sum(1 for n, _ in burns if n == "node02") >= 3, what="burn events"
        )
        assert {n for n, _ in burns} == {"node02"}
        for node in slurm.nodes:
            status = await fleet.request(node, {"type": "stress_status"})
            running = [b for b in status.get("burns", []) if b.get("state") == "running"]
            assert (len(running), node) == ((1, node) if node == "node02" else (0, node)), status
        # pings keep each agent alive: well past a short liveness timeout all still stream
        fleet.configure_agents(liveness_timeout=2)
        t0 = fleet.snapshot("node04").last_sample_t or 0.0
        await asyncio.sleep(3)  # longer than liveness_timeout: what is tested is time itself
        snaps = await wait_fleet(
            fleet,
            lambda ss: _live(ss, slurm.nodes) and (ss["node04"].last_sample_t or 0) > t0 + 2.5,
            what="all nodes still live past the liveness timeout",
        )
    finally:
        await fleet.stop()
    # stopping gpuctl ends every agent (burner included) and the step; the job stays
    await asyncio.to_thread(wait_until, lambda: not agents(job), 15, "no agent left")
    assert sruns(os.getpid()) == []
    assert await asyncio.to_thread(_steps, slurm, job) == []
    await asyncio.to_thread(slurm.run, ["scancel", job])


async def test_one_agent_dying_leaves_the_others_live(
    slurm_nodes: SlurmCluster, tmp_path: Path
) -> None:
    slurm = slurm_nodes
    job, fleet = await _held_fleet(slurm, tmp_path)
    seen: list[NodeSnapshot] = []
    fleet.subscribe(seen.append)
    await fleet.start()
    try:
        await wait_fleet(fleet, lambda ss: _live(ss, slurm.nodes), what="4 nodes live")
        (victim,) = [p for p, n in (await asyncio.to_thread(agents, job)).items() if n == "node03"]
        before = {n: fleet.snapshot(n).last_sample_t or 0.0 for n in slurm.nodes}
        mark = len(seen)
        os.kill(victim, signal.SIGKILL)
        await wait_fleet(
            fleet,
            lambda ss: any(
                s.name == "node03" and "agent killed by SIGKILL" in (s.reason or "") for s in seen
            ),
            what="node03 reported with why",
        )
        # the others kept streaming through the same step, without a break
        others = [n for n in slurm.nodes if n != "node03"]
        await wait_fleet(
            fleet,
            lambda ss: all((ss[n].last_sample_t or 0) > before[n] + 1.0 for n in others),
            what="the other nodes still streaming",
        )
        assert not any(s.name in others and s.state is not NodeState.LIVE for s in seen[mark:])
        # node03 comes back on an srun of its own
        await wait_fleet(fleet, lambda ss: _live(ss, slurm.nodes), what="node03 back")
        assert len(sruns(os.getpid())) == 2
        assert sorted((await asyncio.to_thread(agents, job)).values()) == slurm.nodes
    finally:
        await fleet.stop()
    await asyncio.to_thread(wait_until, lambda: not agents(job), 15, "no agent left")
    await asyncio.to_thread(slurm.run, ["scancel", job])


_KEEP_RUNNING = """
import asyncio, sys
from gpuctl.config import parse_config
from gpuctl.fleet.build import fleet_from_config

async def main():
    fleet = fleet_from_config(parse_config(sys.stdin.read()))
    await fleet.start()
    while not all(s.last_sample_t for s in fleet.snapshots()):
        await asyncio.sleep(0.1)
    print("live", flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


def test_gpuctl_killed_leaves_no_agent_on_any_node(
    slurm_nodes: SlurmCluster, tmp_path: Path
) -> None:
    """gpuctl dies without a word (SIGKILL): srun's stdin closes, every agent stops."""
    slurm = slurm_nodes
    job = _hold(slurm)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _KEEP_RUNNING],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(_fleet_config(slurm, tmp_path))
        proc.stdin.close()
        assert proc.stdout.readline().strip() == "live"
        pids = agents(job)
        assert sorted(pids.values()) == slurm.nodes
        (srun,) = sruns(proc.pid)
        proc.kill()
        proc.wait()
        wait_until(lambda: not agents(job), 15, "no agent left")
        wait_until(lambda: not is_alive(srun), 15, "srun gone")
        assert not any(is_alive(p) for p in pids)
        wait_until(lambda: _steps(slurm, job) == [], 15, "no step left")
    finally:
        if proc.poll() is None:
            proc.kill()
        slurm.run(["scancel", job])


async def test_a_step_srun_refuses_reads_as_slurm_saying_why(
    slurm_nodes: SlurmCluster, tmp_path: Path
) -> None:
    text = _fleet_config(slurm_nodes, tmp_path, "jobid = 999999")
    fleet = fleet_from_config(parse_config(text), **FAST)
    await fleet.start()
    try:
        snaps = await wait_fleet(
            fleet,
            lambda ss: all(s.state is NodeState.UNREACHABLE for s in ss.values()),
            what="every node unreachable",
        )
    finally:
        await fleet.stop()
    for name, snap in snaps.items():
        assert (snap.reason or "").startswith(f"slurm: {name}: the shared srun step ended: srun:")
        assert "999999" in (snap.reason or ""), snap.reason
