"""Issue 43.1 on the screen: the trouble log's screen (``e``) and ``n`` walking the
unacknowledged events first, on the demo's simulated cluster and its story (the XID 79 GPU that
falls off the bus), with a row an earlier session kept in the state folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable, Input

from gpuctl.fleet.demo import demo_nodes, story
from gpuctl.fleet.fleet import simulated_fleet
from gpuctl.fleet.troublelog import TroubleLog
from gpuctl.tui import GpuctlApp, make_app
from gpuctl.tui.screens.events import (
    EventFilter,
    EventsScreen,
    NoteScreen,
    parse_event_filter,
)
from gpuctl.tui.view import next_stop
from gpuctl_tests import helpers
from gpuctl_tests.helpers import until


def demo_app(state: Path, log: TroubleLog | None = None) -> GpuctlApp:
    fleet = simulated_fleet(demo_nodes(3, 4), interval=0.2)
    app = make_app(fleet, simulated=True, state_dir=state, trouble_log=log)
    app.background.append(lambda: story(fleet, stall_every=3600, burns=app.stress_flow.own_burns))
    return app


def last_notice(app: GpuctlApp) -> str:
    return [n.message for n in app._notifications][-1]


async def story_told(pilot: Pilot[Any], app: GpuctlApp) -> None:
    await until(
        pilot,
        lambda: helpers.all_live(app.store.snaps.values()) and app.overview.nodes.lines,
        "every node live on screen",
    )
    rows = app.trouble_log.rows.values
    await until(
        pilot,
        lambda: (
            {("sim-02", 3, "xid"), ("sim-02", 3, "gpu_lost")}
            <= {(r.node, r.gpu, r.kind) for r in rows()}
        ),
        "the story's XID 79 and lost GPU in the trouble log",
        timeout=30,
    )


async def test_n_walks_unacknowledged_events_first_and_the_screen_acknowledges_them(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    path = state / "events.jsonl"
    # an earlier session's row: XID 48 on sim-01 GPU 2, a GPU in no trouble now
    old = TroubleLog(path).note("sim-01", 2, "xid", "48", evidence={"temp": 71, "power": 350.0})
    # a node's text with a terminal escape in it
    TroubleLog.open(path).note(
        "sim-03", None, "unreachable", detail={"reason": "timeout \x1b[31mred\x07"}
    )
    log = TroubleLog.open(path)
    app = demo_app(state, log)
    async with app.run_test(size=(120, 40)) as pilot:
        await story_told(pilot, app)
        nodes = app.overview.nodes
        await pilot.press("home")
        await pilot.press("n")
        assert nodes.cursor == ("sim-01", 2)  # unacknowledged first, though quiet now
        assert "unacknowledged: sim-01 GPU 2: XID 48" in last_notice(app)
        await pilot.press("n")
        assert nodes.cursor == ("sim-02", 3)  # the story's XID 79
        await pilot.press("n")
        assert nodes.cursor[0] == "sim-03"  # the unreachable row: the node's first line

        await pilot.press("e")
        screen = app.screen
        assert isinstance(screen, EventsScreen)
        lasts = [r.last for r in screen.rows]
        assert lasts == sorted(lasts, reverse=True)  # newest first
        table = screen.query_one("#events-table", DataTable)
        cells = [str(c) for row in range(table.row_count) for c in table.get_row_at(row)]
        assert any("XID 79: GPU has fallen off the bus" in c for c in cells)
        assert any("timeout red" in c for c in cells)
        assert not any("\x1b" in c or "\x07" in c for c in cells)

        await pilot.press("slash")
        box = screen.query_one("#events-filter", Input)
        box.value = "kind=xid node=sim-01"
        await pilot.press("enter")
        assert [r.id for r in screen.rows] == [old.id]
        await pilot.press("enter")
        assert isinstance(app.screen, NoteScreen)
        await pilot.press(*"reseated")
        await pilot.press("enter")
        await until(pilot, lambda: log.rows[old.id].acked is not None, "the acknowledgement")
        assert log.rows[old.id].ack_note == "reseated"
        # written at once: another process reads it
        assert TroubleLog.open(path).rows[old.id].ack_note == "reseated"
        await pilot.press("u")  # the unacknowledged only: it is gone from the list
        assert old.id not in [r.id for r in screen.rows]

        await pilot.press("escape")
        assert app.screen is app.overview
        await pilot.press("home")
        await pilot.press("n")
        assert nodes.cursor == ("sim-02", 3)  # acknowledged: n no longer stops at sim-01 GPU 2


async def test_the_demo_keeps_its_story_in_memory_not_in_the_state_folder(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    app = demo_app(state)
    async with app.run_test(size=(80, 24)) as pilot:
        await story_told(pilot, app)
        await pilot.press("e")
        assert isinstance(app.screen, EventsScreen)
        kinds = {(r.node, r.gpu, r.kind) for r in app.screen.rows}
        assert ("sim-02", 3, "xid") in kinds
    assert app.trouble_log.path is None
    assert not (state / "events.jsonl").exists()


def test_the_filter_names_what_it_does_not_understand() -> None:
    found, error = parse_event_filter("node=sim-01 gpu=3 kind=xid unacked h100")
    assert error is None
    assert (found.node, found.gpu, found.kind, found.state, found.words) == (
        "sim-01",
        3,
        "xid",
        "unacked",
        ("h100",),
    )
    # the states the STATE column shows, as gpuctl events --state takes them
    for state in ("active", "ended", "open", "acked"):
        assert parse_event_filter(f"gpu=3 {state}") == (EventFilter(gpu=3, state=state), None)
    _, error = parse_event_filter("kind=fire")
    assert error is not None and "kind=fire" in error


def test_n_tours_the_unacknowledged_first_then_the_rest_and_never_sticks() -> None:
    unacked = {5}.__contains__
    trouble = {2, 5, 7}.__contains__
    stops = []
    here = 0
    for _ in range(4):
        found = next_stop(10, here, 1, unacked, trouble)
        assert found is not None
        stops.append(here := found)
    assert stops == [5, 2, 7, 5]  # one unacknowledged event does not hold n on it
    assert next_stop(10, 5, -1, unacked, trouble) == 7  # N: the tour backwards
    assert next_stop(10, 9, 1, unacked, trouble) == 5  # from no stop: unacknowledged first
    assert next_stop(10, 9, 1, {0}.__contains__, trouble) == 0  # round the end
    assert next_stop(10, 3, 1, lambda _i: False, trouble) == 5  # none: as n always went
    assert next_stop(10, 3, 1, lambda _i: False, lambda _i: False) is None


@pytest.mark.slow
async def test_a_failed_acceptance_run_is_an_event(tmp_path: Path) -> None:
    """``a`` where the suite's Python has no torch: the run fails (env), and the trouble log
    keeps it with the failure's words."""
    from gpuctl_tests.tui.test_accept_sim import accept, message, python_without_torch

    python = python_without_torch()
    fleet = simulated_fleet(demo_nodes(1, 2), interval=0.5)
    log = TroubleLog(tmp_path / "events.jsonl")
    app = make_app(
        fleet,
        simulated=True,
        state_dir=tmp_path,
        accept_options={"python": python},
        trouble_log=log,
    )
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.store.snaps["sim-01"].gpus, "sim-01 live")
        await accept(pilot, "sim-01")
        await until(pilot, lambda: log.newest(kind="accept"), "the failed run in the log")
        (row,) = log.newest(kind="accept")
        assert (row.node, row.gpu, row.detail["verdict"]) == ("sim-01", None, "FAIL")
        assert row.detail["failures"] == [message(python)]
        await pilot.press("e")
        screen = app.screen
        assert isinstance(screen, EventsScreen)
        table = screen.query_one("#events-table", DataTable)
        cells = [str(c) for row_i in range(table.row_count) for c in table.get_row_at(row_i)]
        assert any(c.startswith("acceptance FAIL: torch is not importable") for c in cells)
