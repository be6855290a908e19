"""The fleet's side of the dead-man's switch, over local agent subprocesses: every agent gets the
fleet's liveness timeout and burn cap at the handshake, and pings keep it alive past that
timeout; once the fleet stops pinging, the agent leaves."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gpuctl.core.model import NodeState
from gpuctl.fleet import control
from gpuctl.fleet.fleet import Fleet
from gpuctl.fleet.links import LocalLink
from gpuctl_tests.fleet.test_fleet_local import wait_for_state
from gpuctl_tests.helpers import wait_until_async


def alive(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return text[text.rindex(")") + 2] not in "ZX"


async def test_agents_get_the_fleets_options_and_pings_keep_them_alive() -> None:
    fleet = Fleet({"n1": LocalLink(simulate="1", interval=0.5)}, liveness_timeout=1.5)
    control.configure(fleet, {"max_duration": 120})
    await fleet.start()
    try:
        await wait_for_state(fleet, lambda ss: ss[0].state is NodeState.LIVE)
        session = fleet.nodes["n1"].session
        assert session is not None
        agent = int(session.info.pid)
        # configure with no field is a query: the agent runs with the fleet's options
        now = await fleet.request("n1", {"type": "configure"})
        assert (now["liveness_timeout"], now["max_duration"]) == (1.5, 120.0)
        with pytest.raises(control.StressError) as info:
            await control.set_stress(fleet, "n1", [0], True, duration=121)
        assert "exceeds the maximum of 120 s" in info.value.message
        # Three timeouts later the agent still runs: the fleet pinged it.
        await asyncio.sleep(3 * 1.5)  # the span under test, not a wait for a condition
        assert alive(agent) and fleet.snapshot("n1").state is NodeState.LIVE
        assert fleet.nodes["n1"].session is session
    finally:
        await fleet.stop()


async def test_options_reach_live_agents_and_bad_ones_are_refused() -> None:
    fleet = Fleet({"n1": LocalLink(simulate="1", interval=0.5)})
    await fleet.start()
    try:
        await wait_for_state(fleet, lambda ss: ss[0].state is NodeState.LIVE)
        fleet.configure_agents(max_duration=90)

        async def capped() -> bool:
            return (await fleet.request("n1", {"type": "configure"}))["max_duration"] == 90

        await wait_until_async(capped, 10, "the live agent to get the new cap")
        with pytest.raises(ValueError, match="max_duration"):
            fleet.configure_agents(max_duration=8 * 86400)
        with pytest.raises(ValueError, match="liveness_timeout"):
            fleet.configure_agents(liveness_timeout=0.5)
    finally:
        await fleet.stop()
