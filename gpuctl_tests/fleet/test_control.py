"""Stress control over real agents: burn annotations follow the agents' events."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from gpuctl.core.model import NodeState
from gpuctl.fleet import control
from gpuctl.fleet.fixed_links import recorded_node
from gpuctl.fleet.fleet import Fleet, simulated_fleet
from gpuctl.fleet.links import LocalLink
from gpuctl.fleet.session import LinkError
from gpuctl_tests.helpers import fleet_changes, wait_until_async
from gpuctl_tests.tui.hostile import ScriptedAgentLink

# real burners (or stops of every burner of this user here): these modules share one worker
pytestmark = pytest.mark.burners


async def wait_for(fleet: Fleet, pred: Callable[[], Any], timeout: float = 15.0) -> Any:
    """Wait until ``pred()`` is truthy, woken by the fleet's own updates."""
    return await wait_until_async(
        pred, timeout, "the burns", wake=fleet_changes(fleet), now=lambda: control.burning(fleet)
    )


def burn(fleet: Fleet, node: str, gpu: int) -> Mapping[str, Any]:
    return control.burn_of(fleet.snapshot(node), gpu) or {}


async def live(fleet: Fleet) -> None:
    await fleet.start()
    await wait_for(fleet, lambda: all(s.state is NodeState.LIVE for s in fleet.snapshots()))


async def test_burn_runs_shows_progress_and_ends_at_its_duration() -> None:
    fleet = simulated_fleet([("n1", "2:H100")], interval=0.2)
    try:
        await live(fleet)
        control.configure(fleet, {"max_duration": 60, "unknown_key": 1})
        reply = await control.set_stress(fleet, "n1", [0], True, duration=1.5)
        assert reply["type"] == "ok" and reply["started"] == [0] and reply["engine"] == "sim"
        assert control.burning(fleet) == [("n1", 0)]
        assert burn(fleet, "n1", 0)["state"] in ("starting", "running")
        running = await wait_for(fleet, lambda: burn(fleet, "n1", 0).get("tflops"))
        assert running > 100
        assert burn(fleet, "n1", 0)["ends_at"] > time.time()
        done = await wait_for(
            fleet, lambda: burn(fleet, "n1", 0).get("state") == "done" and burn(fleet, "n1", 0)
        )
        assert done["verdict"] == "OK" and done["reason"] == "duration reached"
        assert control.burning(fleet) == []
        assert burn(fleet, "n1", 1) == {}
    finally:
        await fleet.stop()


async def test_node_burn_and_stop_and_refusals() -> None:
    fleet = simulated_fleet([("n1", "2:A100"), ("n2", "1:H100")], interval=0.2)
    try:
        await live(fleet)
        await control.set_stress(fleet, "n1", None, True)
        assert control.burning(fleet) == [("n1", 0), ("n1", 1)]
        assert burn(fleet, "n1", 0)["ends_at"] == pytest.approx(time.time() + 3600, abs=30)
        await control.set_stress(fleet, "n1", None, False)
        await wait_for(fleet, lambda: not control.burning(fleet))
        assert burn(fleet, "n1", 1)["reason"] == "stopped on request"
        with pytest.raises(control.StressError, match="n2: dtype must be one of"):
            await control.set_stress(fleet, "n2", [0], True, dtype="fp8")
        with pytest.raises(control.StressError, match="n2: no GPU 3 on this node"):
            await control.set_stress(fleet, "n2", [3], True)
        control.configure(fleet, {"max_duration": 10})
        with pytest.raises(control.StressError, match="exceeds the maximum of 10"):
            await control.set_stress(fleet, "n2", [0], True, duration=60)
        with pytest.raises(control.StressError, match="no node named"):
            await control.set_stress(fleet, "nope", [0], True)
    finally:
        await fleet.stop()
    with pytest.raises(LinkError):
        await control.set_stress(fleet, "n2", [0], True)


async def test_link_loss_marks_active_burns_failed_and_the_agent_stops_them() -> None:
    fleet = Fleet({"local": LocalLink(simulate="1", interval=0.2)}, backoff_base=30)
    try:
        await live(fleet)
        # A real CPU burner (the agent is simulated, the burn is not) so that there is a
        # process to outlive the link, or not.
        await control.set_stress(fleet, "local", [0], True, options={"device": "cpu", "size": 64})
        pid = await wait_for(fleet, lambda: burn(fleet, "local", 0).get("pid"))
        session = fleet.nodes["local"].session
        assert session is not None
        os.kill(int(session.info.pid), signal.SIGKILL)
        failed = await wait_for(
            fleet,
            lambda: burn(fleet, "local", 0).get("state") == "failed" and burn(fleet, "local", 0),
        )
        assert "link lost" in failed["reason"]
        assert control.burning(fleet) == []

        def gone() -> bool:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    return f.read().rsplit(")", 1)[1].split()[0] in "ZX"
            except FileNotFoundError:
                return True

        await wait_until_async(gone, 10, "the burner to go with its agent")
    finally:
        await fleet.stop()


def _burn_fails_at_once(req: dict[str, Any]) -> list[dict[str, Any]]:
    """An agent whose burner cannot start: its answer, then "starting" and "failed"."""
    if req.get("type") != "stress_start":
        return [{"type": "ok", "request": req.get("type"), "id": req.get("id")}]

    def event(state: str, reason: str | None = None) -> dict[str, Any]:
        detail = {"state": state, "engine": "torch", "verdict": None, "reason": reason}
        return {"type": "event", "t": 0, "kind": "burn", "gpu": 0, "detail": detail}

    return [
        {"type": "ok", "request": "stress_start", "id": req["id"], "started": [0], "busy": []},
        event("starting"),
        event("failed", "cannot start /nonexistent/python3: No such file or directory"),
    ]


async def test_a_burn_that_fails_at_once_says_so_and_is_not_left_starting() -> None:
    """A burner whose Python cannot start: the agent answers, says "starting" and "failed"
    at once, and the login side can read all three in one go. The "failed" was handled
    before ``set_stress`` read the answer, which then put "starting" over it: the burn showed
    as starting for good (the screen's BURN, the CLI waiting on it)."""
    hello = recorded_node("n1", "1:H100", samples=1, t0=time.time())
    fleet = Fleet({"n1": ScriptedAgentLink(hello, _burn_fails_at_once, together=True)})
    try:
        await live(fleet)
        reply = await control.set_stress(fleet, "n1", [0], True)
        assert reply["started"] == [0]
        assert burn(fleet, "n1", 0).get("state") == "failed", burn(fleet, "n1", 0)
        assert burn(fleet, "n1", 0)["reason"].startswith("cannot start /nonexistent/python3")
        assert control.burning(fleet) == []
    finally:
        await fleet.stop()
