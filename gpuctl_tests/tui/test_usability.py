"""What a new user ran into on the screen (issue 15's "wrong today"), driven by keys at 80x24,
120x40 and 200x60 over replayed nodes: the footer, GPU rows that fit, the scrollbar and the
cursor, burns that end, the filter, the configured keys, and the words."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from textual.coordinate import Coordinate
from textual.pilot import Pilot
from textual.widgets import DataTable, Footer, Input, Static
from textual.widgets._footer import FooterKey, FooterLabel

from gpuctl.config import TuiSettings
from gpuctl.core.model import NodeState
from gpuctl.fleet.fixed_links import ReplayLink, recorded_node
from gpuctl.fleet.fleet import Fleet
from gpuctl.jobs import Executor, JobStore
from gpuctl.node.readers.sim import SimReader
from gpuctl.tui import GpuctlApp, make_app
from gpuctl.tui.fleet_store import BURN_ENDED_SHOWN_S
from gpuctl.tui.screens.confirm import ConfirmScreen
from gpuctl.tui.widgets.panes import JobsPane
from gpuctl.workloads.accept_suite.schema import SECTIONS
from gpuctl_tests.helpers import until
from gpuctl_tests.tui.conftest import NOW, T0, replay_app, replay_fleet, rows_view, settle
from gpuctl_tests.tui.hostile import ScriptedAgentLink
from gpuctl_tests.tui.test_panes import messages, sleeps

SIZES = [(80, 24), (120, 40), (200, 60)]


def row_text(app: GpuctlApp, node: str, gpu: int | None) -> str:
    """The text of a node's GPU line as painted (scrolled into view first)."""
    nodes = app.overview.nodes
    y = next(i for i, ln in enumerate(nodes.lines) if (ln.node, ln.gpu) == (node, gpu))
    nodes.scroll_to(y=y, animate=False, immediate=True)
    return nodes.render_line(y - int(nodes.scroll_offset.y)).text


def footer_items(app: GpuctlApp) -> list[tuple[str, int, int]]:
    """(what, x, right edge) of each footer item, left to right."""
    footer = app.screen.query_one(Footer)
    out = []
    for w in footer.walk_children():
        if isinstance(w, FooterKey):
            out.append((w.description or w.key, w.region.x, w.region.right))
        elif isinstance(w, FooterLabel):
            out.append((str(w.content), w.region.x, w.region.right))
    return out


def many_nodes(n: int, spec: str = "4:H100", clock: Callable[[], float] = lambda: NOW) -> Fleet:
    links = {
        f"node-{i:02d}": ReplayLink(recorded_node(f"node-{i:02d}", spec, seed=i, samples=3, t0=T0))
        for i in range(n)
    }
    return Fleet(links, clock=clock, stale_after=1e9)


async def all_shown(pilot: Pilot[Any], n: int) -> None:
    app = pilot.app
    assert isinstance(app, GpuctlApp)
    await until(
        pilot,
        lambda: (
            sum(1 for s in app.store.snaps.values() if s.last_sample_t == T0 + 2) == n
            and not app.store.pending
            and not app._flush_scheduled
        ),
        "every node's last sample on screen",
    )


# -- footer -----------------------------------------------------------------------------------
@pytest.mark.parametrize("size", SIZES)
async def test_footer_fits_and_says_panes_then_help(tmp_path: Path, size: tuple[int, int]) -> None:
    app = replay_app(tmp_path)
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        items = footer_items(app)
        names = [what for what, _, _ in items]
        assert names[-2:] == ["help", "quit"], names
        assert max(right for _, _, right in items) <= size[0], items  # nothing cut
        # "1 2 3 panes  ? help", not "123 panes? help"
        keys = [x for what, x, _ in items if what in ("1", "2", "3")]
        assert len(keys) == 3 and keys[1] - keys[0] >= 2 and keys[2] - keys[1] >= 2, items
        label = next(i for i, (what, _, _) in enumerate(items) if what == "panes")
        assert items[label + 1][1] > items[label][2], items  # a space before "? help"


async def test_read_only_footer_offers_no_stress_keys_which_still_explain(tmp_path: Path) -> None:
    app = replay_app(tmp_path, read_only=True)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        names = [what for what, _, _ in footer_items(app)]
        assert not {"stress", "stress GPU", "stress node", "accept"} & set(names), names
        assert "help" in names and "quit" in names
        await pilot.press("s")
        await until(pilot, lambda: any("read-only" in m for m in messages(app)), "the refusal")
        assert not isinstance(app.screen, ConfirmScreen)


# -- GPU rows ---------------------------------------------------------------------------------
@pytest.mark.parametrize("size", SIZES)
async def test_gpu_rows_keep_badges_job_and_burn_at_every_size(
    tmp_path: Path, size: tuple[int, int]
) -> None:
    app = replay_app(tmp_path)
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        await rows_view(pilot)
        assert "alice" in row_text(app, "gpu-a01", 0)
        assert "XID" in row_text(app, "gpu-a01", 1)
        burning = row_text(app, "gpu-a01", 2)
        assert "PWRCAP" in burning and "BURN 612 TF/s 0 err" in burning, burning
        assert "100%" in burning and "78/80G" in burning
        # narrow, the power column is the draw only: the flags, burn and owner keep the room
        assert ("699/700W" if size[0] >= 90 else "699W") in burning


@pytest.mark.parametrize("size", SIZES)
async def test_no_horizontal_scrollbar_and_the_cursor_stays_in_view(
    tmp_path: Path, size: tuple[int, int]
) -> None:
    """Twenty nodes need the vertical scrollbar; no horizontal one may cover the last row, and
    the cursor stays on screen when the window shrinks."""
    app = make_app(many_nodes(20), clock=lambda: NOW, state_dir=tmp_path)
    async with app.run_test(size=size) as pilot:
        await all_shown(pilot, 20)
        await rows_view(pilot)
        nodes = app.overview.nodes

        def cursor_in_view() -> bool:
            top = int(nodes.scroll_offset.y)
            return top <= nodes.cursor_y < top + nodes.scrollable_content_region.height

        assert nodes.show_vertical_scrollbar
        assert not nodes.show_horizontal_scrollbar
        await pilot.press("end")
        assert nodes.cursor == ("node-19", 3)
        await until(pilot, cursor_in_view, "the last GPU on screen")
        # the last GPU's row is painted, not covered
        assert "°C" in row_text(app, "node-19", 3)
        await pilot.resize_terminal(size[0], 14)
        await until(pilot, cursor_in_view, "the cursor in view after a resize")
        assert not nodes.show_horizontal_scrollbar


# -- burns ------------------------------------------------------------------------------------
async def test_burn_rows_show_time_left_and_a_finished_burn_goes_away(tmp_path: Path) -> None:
    now = [NOW]
    app = make_app(many_nodes(1, clock=lambda: now[0]), clock=lambda: now[0], state_dir=tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await all_shown(pilot, 1)
        fleet = app.fleet
        burn: dict[str, Any] = {"state": "running", "tflops": 600.0, "errors": 0}
        fleet.annotate("node-00", 1, burn={**burn, "ends_at": NOW + 14 * 60 + 5})
        await until(pilot, lambda: "14m left" in row_text(app, "node-00", 1), "the time left")
        fleet.annotate("node-00", 1, burn={**burn, "state": "done", "verdict": "OK"})
        await until(pilot, lambda: "BURN done" in row_text(app, "node-00", 1), "the verdict")
        assert "OK" in row_text(app, "node-00", 1) and "left" not in row_text(app, "node-00", 1)
        now[0] += BURN_ENDED_SHOWN_S + 1
        fleet.annotate("node-00", 0, slurm_job="7")  # any change repaints the node
        await until(pilot, lambda: "job 7" in row_text(app, "node-00", 0), "the repaint")
        assert "BURN" not in row_text(app, "node-00", 1)
        assert app.fleet.snapshot("node-00").burn(1) is not None  # only the screen let it go


# -- filter -----------------------------------------------------------------------------------
async def test_an_invalid_filter_is_not_applied_and_no_match_is_said(tmp_path: Path) -> None:
    app = replay_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        nodes = app.overview.nodes
        box = app.overview.query_one("#filter", Input)
        await pilot.press("slash", *"gpu-a", "space", *"temp>")
        assert box.border_title and "temp>" in str(box.border_title)
        await pilot.press("enter")
        # The box stays open with its error: Enter did not leave "gpu-a" filtering unexplained.
        assert box.display and app.focused is box
        assert any("filter not applied" in m for m in messages(app))
        await pilot.press("escape")
        assert not box.display and app.store.filter.empty

        await pilot.press("slash", *"nosuchnode", "enter")
        assert not box.display
        assert nodes.lines and nodes.lines[0].kind == "nomatch"
        assert "no GPU matches the filter 'nosuchnode'" in nodes.render_line(0).text
        shown = str(app.overview.query_one("#filter-shown", Static).content)
        assert shown == "filter: nosuchnode (no match)"
        assert app.overview.selection() is None
        await pilot.press("s")  # nothing hidden gets burned
        assert any("select a GPU first" in m for m in messages(app))


# -- configured keys --------------------------------------------------------------------------
async def test_the_heatmap_hint_names_the_configured_key(tmp_path: Path) -> None:
    app = replay_app(tmp_path, tui=TuiSettings(keys={"heatmap": "h"}))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("h")
        status = str(app.overview.query_one("#heat-status", Static).render())
        assert "(h: next metric" in status and "(m:" not in status


# -- words ------------------------------------------------------------------------------------
async def test_one_node_one_gpu_is_singular(tmp_path: Path) -> None:
    app = make_app(many_nodes(1, "1:H100"), clock=lambda: NOW, state_dir=tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await all_shown(pilot, 1)
        nodes = app.overview.nodes
        head = nodes.render_line(0).text
        assert "  1× H100 80GB HBM3  util" in head and "GPUs" not in head
        await pilot.press("B")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question")
        assert app.screen.question.startswith("Burn all 1 GPU on 1 live node for 60 min?")


def test_simulated_memory_adds_up() -> None:
    """Processes hold at most what is used, and what is used is at most what there is: a
    burning demo GPU once listed 114 GiB of processes on an 80 GiB GPU."""
    for seed in range(30):
        reader = SimReader.from_spec("8:H100,4:L40S", seed=seed)
        reader.simulate("load", {"gpus": "all", "load": 1.0})
        for g in reader.sample():
            held = sum(p["mem"] for p in g["processes"])
            assert held <= g["mem_used"] <= g["mem_total"], (seed, g)


# -- jobs pane --------------------------------------------------------------------------------
@pytest.mark.slow
async def test_the_highlighted_job_is_the_one_c_cancels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new job sorts in on top: the highlight used to stay on a row index (another job)
    while ``c`` cancelled the job selected before."""
    monkeypatch.setenv("GPUCTL_STATE_DIR", str(tmp_path / "state"))
    store = JobStore()
    ex = Executor("local", python=sys.executable, job_root=str(tmp_path / "jobs"), store=store)
    first, second = ex.submit(sleeps), ex.submit(sleeps)
    jobs = [first, second]
    try:
        app = make_app(replay_fleet(), state_dir=tmp_path / "ui", job_store=store)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("2")
            pane = app.overview.query_one(JobsPane)
            table = app.overview.query_one("#jobs-table", DataTable)
            await until(pilot, lambda: table.row_count == 2, "two jobs")
            await pilot.press("down")  # the first job (the list is newest first)
            await until(pilot, lambda: pane.selected == first.id, "the first job selected")
            jobs.append(ex.submit(sleeps))  # the newest: it sorts in above
            await until(pilot, lambda: table.row_count == 3, "the new job")
            await pilot.pause()
            highlighted = table.coordinate_to_cell_key(Coordinate(table.cursor_row, 0)).row_key
            assert highlighted.value == first.id == pane.selected
            await pilot.press("c")
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question")
            assert first.id[:12] in app.screen.question
            await pilot.press("n")
    finally:
        for job in jobs:
            job.cancel()


# -- acceptance pane --------------------------------------------------------------------------
def stalling_agent(req: dict[str, Any]) -> list[dict[str, Any]]:
    """A stand-in agent whose suite passes ENV, starts COMPUTE and then runs until stopped."""
    rid = req.get("id")
    if req.get("type") == "accept_stop":
        return [{"type": "ok", "request": "accept_stop", "id": rid}]
    if req.get("type") != "accept_start":
        return [{"type": "error", "code": "unknown_request", "message": "no", "id": rid}]

    def section(name: str, state: str, verdict: str | None = None) -> dict[str, Any]:
        detail = {"event": "section", "run": "r", "section": name, "state": state}
        if verdict:
            detail["verdict"] = verdict
        return {"type": "event", "t": NOW, "kind": "accept", "gpu": None, "detail": detail}

    return [
        {"type": "ok", "request": "accept_start", "id": rid, "run": "r", "pid": 1},
        {"type": "event", "t": NOW, "kind": "accept", "gpu": None, "detail": {"event": "start"}},
        section("env", "start"),
        section("env", "end", "PASS"),
        section("compute", "start"),
    ]


async def test_a_cancelled_acceptance_run_says_cancelled_and_ends(tmp_path: Path) -> None:
    node = recorded_node("ok-01", "2:H100", samples=3, t0=NOW - 2.5)
    fleet = Fleet({"ok-01": ScriptedAgentLink(node, stalling_agent)}, clock=lambda: NOW)
    app = make_app(fleet, state_dir=tmp_path, clock=lambda: NOW)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.store.snaps["ok-01"].state is NodeState.LIVE, "live")
        await until(pilot, lambda: app.overview.nodes.lines, "the node on screen")
        await pilot.press("a")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question")
        await pilot.press("y")
        table = app.overview.query_one("#accept-table", DataTable)
        await until(pilot, lambda: str(table.get_cell("ok-01", "compute")) == "▶ run", "running")
        await pilot.press("a")  # again: cancel
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question")
        assert "Cancel" in app.screen.question
        await pilot.press("y")
        run = app.accept_flow.run
        assert run is not None
        await until(pilot, run.done, "the run to end")
        await until(pilot, lambda: str(table.get_cell("ok-01", "verdict")) == "CANCELLED", "it")
        cells = {s: str(table.get_cell("ok-01", s)) for s in SECTIONS}
        assert cells["env"] == "PASS" and cells["compute"] == "-", cells
        assert "ERROR" not in cells.values() and "▶ run" not in cells.values(), cells
        note = str(app.overview.query_one("#accept-note", Static).render())
        assert "acceptance cancelled on ok-01" in note and "running" not in note


# -- detail -----------------------------------------------------------------------------------
async def test_detail_events_in_words_with_ages_that_move_and_a_scroll(tmp_path: Path) -> None:
    now = [NOW]
    burn = {"state": "done", "verdict": "OK", "tflops_mean": 611.6, "errors": 0, "owner": {}}
    events: list[dict[str, Any]] = [
        {"type": "event", "t": T0 + k, "kind": "xid", "gpu": k % 4, "detail": {"xid": 79}}
        for k in range(30)
    ]
    events.append({"type": "event", "t": T0 + 31, "kind": "burn", "gpu": 2, "detail": burn})
    messages_ = recorded_node("n-01", "4:H100", samples=3, t0=T0, events=events)
    fleet = Fleet({"n-01": ReplayLink(messages_)}, clock=lambda: now[0], stale_after=1e9)
    app = make_app(fleet, clock=lambda: now[0], state_dir=tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: len(fleet.events("n-01")) == 31, "the events")
        await until(pilot, lambda: app.overview.nodes.lines, "the node on screen")
        await pilot.press("enter")
        box = await until(pilot, lambda: app.screen.query("#detail-events-box"), "the detail")
        text = app.screen.query_one("#detail-events", Static)
        await until(pilot, lambda: "burn done" in str(text.render()), "the events")
        lines = str(text.render()).splitlines()
        # GPU 0's own first (its 8 XIDs, newest first), then the other GPUs' (issue 39.7)
        xid79 = "XID 79: GPU has fallen off the bus: drain and reset the node"
        assert lines[0].endswith(f"GPU 0  {xid79}"), lines[0]
        assert all("GPU 0  " in line for line in lines[:8])
        assert lines[8].endswith("GPU 2  burn done: OK, 612 TF/s"), lines[8]
        assert lines[9].endswith(f"GPU 1  {xid79}") and "xid=" not in str(text.render())
        assert len(lines) == 31  # every kept event, not the last twelve
        assert box.first().max_scroll_y > 0  # more than fit: it scrolls
        assert lines[0].lstrip().startswith(f"{int(NOW - T0 - 28)}s ago")
        now[0] += 300
        await until(pilot, lambda: str(text.render()).lstrip().startswith("5m ago"), "ages")


# -- screenshot -------------------------------------------------------------------------------
async def test_screenshot_without_a_downloads_folder(tmp_path: Path) -> None:
    assert not (Path.home() / "Downloads").exists()  # the tests' home has none
    app = replay_app(tmp_path / "state")
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        app.action_screenshot()
        saved = await until(
            pilot, lambda: [m for m in messages(app) if "screenshot" in m], "the notification"
        )
        assert saved[0].startswith("screenshot saved to "), saved
        files = list((tmp_path / "state" / "screenshots").glob("*.svg"))
        assert len(files) == 1 and "<svg" in files[0].read_text()
        assert saved[0] == f"screenshot saved to {files[0]}"


async def test_help_at_80x24_starts_with_moving_about_and_its_headers_whole(
    tmp_path: Path,
) -> None:
    """Issue 39.10: at 80x24 the help cut its headers ("id (remap in [t") and opened on ``s``:
    the arrows and Enter, what a newcomer needs first, were two screens down."""
    from gpuctl.tui.screens.help import HelpScreen
    from gpuctl_tests.tui.test_hostile import drawn

    app = replay_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), "help")
        await pilot.pause()
        table = app.screen.query_one("#help-table", DataTable)
        keys = [str(table.get_row_at(i)[0]) for i in range(table.row_count)]
        assert keys[0] == "↑" and keys.index("⏎") < keys.index("esc") < keys.index("s"), keys
        header = next(line for line in drawn(app).splitlines() if " does " in line)
        assert all(f" {word}" in header for word in ("key", "does", "id", "where")), header
