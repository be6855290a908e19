"""Fleet behaviour this issue added: a silent link is dropped and reconnected, the Slurm job
watcher runs with the fleet, and a broken config never reaches the fleet."""

from __future__ import annotations

import contextlib
import os
import signal

from gpuctl.config import parse_config
from gpuctl.core.model import NodeState
from gpuctl.fleet.build import ClusterFleet, fleet_from_config
from gpuctl.fleet.fleet import Fleet
from gpuctl.fleet.links import LocalLink
from gpuctl_tests.helpers import fleet_changes, wait_until_async


async def _wait(fleet: Fleet, pred, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    await wait_until_async(
        lambda: pred(fleet.snapshots()[0]),
        timeout,
        "the node's state",
        wake=fleet_changes(fleet),
        now=lambda: fleet.snapshots()[0],
    )


async def test_silent_link_is_dropped_and_reconnected() -> None:
    fleet = Fleet(
        {"hung": LocalLink(simulate="1", interval=0.1)},
        stale_after=0.3,
        backoff_base=0.1,
        backoff_max=0.2,
    )
    reasons: list[str | None] = []
    fleet.subscribe(lambda s: reasons.append(s.reason))
    await fleet.start()
    pid = 0
    try:
        await _wait(fleet, lambda s: s.last_sample_t is not None)
        session = fleet.nodes["hung"].session
        assert session is not None
        pid = session.info.pid
        os.kill(pid, signal.SIGSTOP)  # a hung node: the link stays open, nothing comes
        await _wait(fleet, lambda s: s.state is NodeState.STALE)
        # after 4 x stale_after of silence the fleet drops the link and starts a new agent
        await _wait(
            fleet,
            lambda s: (
                s.state is NodeState.LIVE
                and fleet.nodes["hung"].session is not None
                and getattr(fleet.nodes["hung"].session.info, "pid", None) != pid
            ),
        )
        assert any(r and r.startswith("reconnecting: no sample for") for r in reasons), reasons
    finally:
        await fleet.stop()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    # the dropped agent was killed when its link closed

    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    await wait_until_async(gone, 10, f"agent {pid} to go with its link")


async def test_local_cluster_from_config_streams() -> None:
    config = parse_config(
        '[clusters.here]\nvia = "local"\nnodes = "sim[1-2]"\nsimulate = 2\ninterval = 0.2\n'
    )
    fleet = fleet_from_config(config)
    assert isinstance(fleet, ClusterFleet) and fleet.names == ["sim1", "sim2"]
    await fleet.start()
    try:
        sampled = lambda: all(s.last_sample_t for s in fleet.snapshots())  # noqa: E731
        await wait_until_async(sampled, 20, "a sample of each node", now=fleet.snapshots)
        assert [len(s.gpus) for s in fleet.snapshots()] == [2, 2]
    finally:
        await fleet.stop()


def test_empty_config_is_this_machine() -> None:
    fleet = fleet_from_config(parse_config(""))
    assert fleet.names == ["localhost"]
    assert fleet.nodes["localhost"].link.kind == "local"
