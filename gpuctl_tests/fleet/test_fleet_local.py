"""The Fleet over real agents: in-process simulated nodes and local agent subprocesses."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from typing import Any

import pytest

from gpuctl import service
from gpuctl.core.deadline import wait_for
from gpuctl.core.model import NodeSnapshot, NodeState
from gpuctl.fleet.fleet import Fleet, simulated_fleet
from gpuctl.fleet.links import LocalLink
from gpuctl.fleet.session import AgentSession, LinkError
from gpuctl_tests.helpers import fleet_changes, wait_until_async

# real burners (or stops of every burner of this user here): these modules share one worker
pytestmark = pytest.mark.burners


async def wait_for_state(fleet: Fleet, pred, timeout: float = 15.0) -> list[NodeSnapshot]:
    """Wait until ``pred(snapshots)`` holds, woken by the fleet's own updates."""
    await wait_until_async(
        lambda: pred(fleet.snapshots()),
        timeout,
        "the fleet state",
        wake=fleet_changes(fleet),
        now=lambda: [(s.name, s.state.value) for s in fleet.snapshots()],
    )
    return fleet.snapshots()


async def test_simulated_fleet_streams_and_keeps_history() -> None:
    fleet = simulated_fleet([("a", "2:H100"), ("b", "3:A100")], interval=0.1)
    await fleet.start()
    try:
        snaps = await wait_for_state(
            fleet, lambda ss: all(len(fleet.history(s.name, 0)) >= 3 for s in ss)
        )
        by_name = {s.name: s for s in snaps}
        assert by_name["a"].state is NodeState.LIVE
        assert len(by_name["a"].gpus) == 2 and len(by_name["b"].gpus) == 3
        assert by_name["b"].info is not None and by_name["b"].info.gpus[0].name is not None
        assert "A100" in by_name["b"].info.gpus[0].name
        # request/reply routing by id while samples stream
        reply = await fleet.request("a", {"type": "ping"})
        assert reply["type"] == "pong"
        reply = await fleet.request("a", {"type": "bogus"})
        assert reply["type"] == "error" and reply["code"] == "unknown_request"
    finally:
        await fleet.stop()


async def test_sim_load_heats_the_gpu() -> None:
    fleet = simulated_fleet([("a", "1:H100")], interval=0.1)
    await fleet.start()
    try:
        await wait_for_state(fleet, lambda ss: ss[0].gpus)
        reply = await fleet.request(
            "a", {"type": "simulate", "action": "load", "gpus": [0], "load": 1.0}
        )
        assert reply["type"] == "ok"
        snaps = await wait_for_state(
            fleet, lambda ss: ss[0].gpus and (ss[0].gpus[0].util_gpu or 0) >= 99
        )
        g = snaps[0].gpus[0]
        assert g.power is not None and g.power > 300
        burner = [p for p in g.processes if p.command == "gpuctl-burn"]
        assert [p.user for p in burner] == [service.user_name()]  # the agent's user's
    finally:
        await fleet.stop()


async def test_local_agent_death_is_unreachable_then_recovers() -> None:
    link = LocalLink(simulate="2", interval=0.2)
    fleet = Fleet({"n1": link}, backoff_base=0.2, backoff_max=0.5)
    await fleet.start()
    try:
        await wait_for_state(fleet, lambda ss: ss[0].last_sample_t is not None)
        pid = fleet.nodes["n1"].session.info.pid  # type: ignore[union-attr]
        os.kill(pid, signal.SIGKILL)
        snaps = await wait_for_state(fleet, lambda ss: ss[0].state is NodeState.UNREACHABLE)
        assert snaps[0].reason and snaps[0].reason.startswith("closed")
        snaps = await wait_for_state(
            fleet,
            lambda ss: (
                ss[0].state is NodeState.LIVE
                and fleet.nodes["n1"].session is not None
                and getattr(fleet.nodes["n1"].session.info, "pid", None) != pid
            ),
        )
    finally:
        await fleet.stop()


async def test_frozen_agent_turns_stale_then_live_again() -> None:
    fleet = Fleet({"frozen": LocalLink(simulate="1", interval=0.1)}, stale_after=0.3)
    await fleet.start()
    try:
        await wait_for_state(fleet, lambda ss: ss[0].last_sample_t is not None)
        pid = fleet.nodes["frozen"].session.info.pid  # type: ignore[union-attr]
        os.kill(pid, signal.SIGSTOP)  # a hung node: the link stays up, samples stop
        try:
            snaps = await wait_for_state(fleet, lambda ss: ss[0].state is NodeState.STALE)
            age = snaps[0].age(time.time())
            assert age is not None and age >= 0.3
        finally:
            os.kill(pid, signal.SIGCONT)
        await wait_for_state(fleet, lambda ss: ss[0].state is NodeState.LIVE)
    finally:
        await fleet.stop()


async def test_missing_python_is_reported() -> None:
    fleet = Fleet({"bad": LocalLink(python="/nonexistent/python3")}, backoff_base=5)
    await fleet.start()
    try:
        snaps = await wait_for_state(fleet, lambda ss: ss[0].state is NodeState.UNREACHABLE)
        assert snaps[0].reason is not None and snaps[0].reason.startswith("no_python")
    finally:
        await fleet.stop()


async def test_agent_crash_before_hello_carries_stderr() -> None:
    link = LocalLink(python=sys.executable, extra_args=("--interval", "0"))
    fleet = Fleet({"x": link}, backoff_base=5)
    await fleet.start()
    try:
        snaps = await wait_for_state(fleet, lambda ss: ss[0].state is NodeState.UNREACHABLE)
        assert snaps[0].reason is not None and "agent_crashed" in snaps[0].reason
    finally:
        await fleet.stop()


async def test_handshake_rejects_other_protocol() -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(b'{"type":"hello","protocol":99}\n')
    reader.feed_eof()
    session = AgentSession(reader, writer=_NullWriter())
    with pytest.raises(LinkError) as e:
        await session.handshake(1.0)
    assert e.value.reason == "protocol" and "99" in e.value.message


class _NullWriter:
    def write(self, data: object) -> None:
        pass


async def test_burn_progress_does_not_push_an_xid_out_of_the_kept_events() -> None:
    fleet = simulated_fleet([("a", "2:H100")], interval=0.1)
    seen: list[str] = []
    fleet.on_event(lambda _n, e: seen.append(e.kind))
    await fleet.start()
    try:
        await wait_for_state(fleet, lambda ss: ss[0].gpus)
        await fleet.request("a", {"type": "simulate", "action": "xid", "gpu": 1, "xid": 79})
        reply = await fleet.request("a", {"type": "stress_start", "gpus": [0], "duration": 60})
        assert reply["type"] == "ok", reply
        await wait_for_state(fleet, lambda ss: seen.count("burn") >= 3)
        await fleet.request("a", {"type": "stress_stop", "gpus": "all"})
        await wait_for_state(
            fleet,
            lambda ss: any(
                e.kind == "burn" and e.detail.get("state") in ("done", "failed")
                for e in fleet.events("a")
            ),
        )
        kept = fleet.events("a")
        assert [e.detail.get("xid") for e in kept if e.kind == "xid"] == [79]
        assert not any(e.kind == "burn" and e.detail.get("state") == "running" for e in kept)
        assert seen.count("burn") > sum(1 for e in kept if e.kind == "burn")
    finally:
        await fleet.stop()


async def test_a_fleet_beyond_the_open_file_limit_raises_the_soft_limit() -> None:
    # ``ulimit -n`` is often 1024 while the hard limit is far higher: a fleet of more nodes
    # than the soft limit has room for raises it instead of failing them "too many open files".
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    open_now = len(os.listdir("/proc/self/fd"))
    nodes = 40  # 4 pipe ends each: far beyond the few fds left below
    if hard != resource.RLIM_INFINITY and hard < open_now + 4 * nodes + 300:
        pytest.skip(f"the hard open-file limit ({hard}) leaves no room to test this")
    resource.setrlimit(resource.RLIMIT_NOFILE, (open_now + 16, hard))
    try:
        fleet = simulated_fleet(
            [(f"n{i}", "1:H100") for i in range(nodes)], interval=0.2, backoff_max=60
        )
        await fleet.start()
        try:
            snaps = await wait_for_state(
                fleet, lambda ss: all(s.last_sample_t is not None for s in ss), timeout=30
            )
            assert all(s.state is NodeState.LIVE for s in snaps)
            assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= open_now + 4 * nodes
        finally:
            await fleet.stop()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


class _CancelLosingReader:
    """An agent's stream that says hello, then loses the first cancel of its read the way
    Python 3.11's ``asyncio.wait_for`` does when its inner await finishes at that moment: the
    read returns (end of stream) instead of raising."""

    def __init__(self, link: _CancelLosingLink) -> None:
        self.link = link
        self.said_hello = False

    async def readline(self) -> bytes:
        from gpuctl.node import protocol

        if not self.said_hello:
            self.said_hello = True
            return protocol.encode({"type": "hello", "protocol": protocol.PROTOCOL_VERSION})
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            if self.link.lost_cancel:
                raise
            self.link.lost_cancel = True  # once: then the node task reconnects
        return b""


class _CancelLosingLink(LocalLink):
    def __init__(self) -> None:
        super().__init__()
        self.lost_cancel = False

    async def open(self) -> AgentSession:
        reader = _CancelLosingReader(self)

        class _Sink:
            def write(self, data: bytes) -> None:
                pass

        return AgentSession(reader, _Sink())


async def test_stop_ends_a_node_task_that_lost_a_cancel() -> None:
    link = _CancelLosingLink()
    fleet = Fleet({"a": link}, backoff_base=0.05, backoff_max=0.05)
    await fleet.start()
    await wait_for_state(fleet, lambda ss: ss[0].state is NodeState.LIVE)
    try:
        await wait_for(fleet.stop(), 10)
    except TimeoutError:
        pytest.fail("Fleet.stop() waited for ever on a node task that lost a cancel")
    assert link.lost_cancel
    assert fleet.nodes["a"].task is None


def test_a_sample_keeps_every_field_of_the_snapshot_it_does_not_carry() -> None:
    """``Fleet._on_sample`` builds the node's next snapshot field by field (not with
    ``dataclasses.replace``): a field it does not name would fall back to its default. Every
    field of ``NodeSnapshot`` is either one a sample sets or kept from the snapshot before."""
    import dataclasses

    from gpuctl.core.model import GpuSample, HostSample, NodeInfo
    from gpuctl.fleet.session import Sample

    fleet = simulated_fleet([("a", "1:H100")])
    rt = fleet.nodes["a"]
    kept = {"link": "ssh", "info": NodeInfo(hostname="a"), "annotations": {0: {"slurm_job": "7"}}}
    rt.snapshot = dataclasses.replace(rt.snapshot, reason="was down", **kept)
    sample = Sample(t=1e9, gpus=(GpuSample(index=0, t=1e9),), host=HostSample(cpus=4))
    fleet._on_sample(rt, sample)
    set_by_sample = {"state", "gpus", "last_sample_t", "reason", "parents", "host"}
    snap = rt.snapshot
    for f in dataclasses.fields(NodeSnapshot):
        if f.name not in set_by_sample:
            assert f.name in {"name", *kept}, f"a new field {f.name}: keep it in _on_sample"
    assert {k: getattr(snap, k) for k in kept} == kept and snap.name == "a"
    assert (snap.state, snap.gpus, snap.last_sample_t, snap.reason, snap.host) == (
        NodeState.LIVE,
        sample.gpus,
        1e9,
        None,
        sample.host,
    )


async def test_a_command_ends_when_its_background_task_lost_a_cancel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``running_fleet`` (``export``/``record`` until Ctrl-C) ends the demo's story as
    ``Fleet.stop`` ends node tasks: on Python 3.11 a request's ``asyncio.wait_for`` can lose the
    cancel, and a story that lost it went on for ever (``gpuctl export --demo`` never exited
    on SIGTERM: a CI run). The story here loses its first cancel as that one did."""
    from gpuctl.cli import common
    from gpuctl.fleet import demo

    lost: list[bool] = []
    started = asyncio.Event()

    tasks: list[asyncio.Task[Any]] = []

    async def story(fleet: Fleet) -> None:
        tasks.append(asyncio.current_task())  # type: ignore[arg-type]
        started.set()
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if lost:
                    raise
                lost.append(True)  # as wait_for on 3.11: the cancel swallowed, the task goes on

    monkeypatch.setattr(demo, "story", story)
    fleet = simulated_fleet([("a", "1:H100")])

    async def run() -> None:
        async with common.running_fleet(fleet, demo=True) as stop:
            await started.wait()
            stop.set()  # as SIGTERM does
            await stop.wait()

    runner = asyncio.create_task(run())
    done, _ = await asyncio.wait({runner}, timeout=10)  # no cancel from outside: as the CLI
    if not done:
        runner.cancel()  # (which the old code's await of the story then passes on to it)
        with contextlib.suppress(asyncio.CancelledError):
            await runner
        pytest.fail("running_fleet waited for ever on a story that lost a cancel")
    assert lost == [True]
    assert tasks[0].done()  # ended, not left running (the old code gave up on it)
