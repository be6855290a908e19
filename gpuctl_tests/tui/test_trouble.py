"""Issue 26 at 3 a.m.: where am I (the selected row highlighted whole, in every theme), where
is the trouble (counted in the header, each count a filter; ``n`` / ``N``; "trouble first"
that holds still under the cursor; red for faults only), and footers that fit 80 columns with
``? help`` and ``q quit`` on every screen, offering only keys that do something there."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import msgspec
import pytest
from rich.segment import Segment
from textual.color import Color
from textual.pilot import Pilot
from textual.widgets import DataTable, Label, Static

from gpuctl.config import TuiSettings
from gpuctl.core.model import NodeSnapshot
from gpuctl.fleet.recording.reader import RecordingReader
from gpuctl.fleet.recording.replayer import Replayer
from gpuctl.tui import GpuctlApp
from gpuctl.tui.replay import ReplayApp
from gpuctl.tui.screens.detail import DetailScreen
from gpuctl.tui.screens.help import HelpScreen
from gpuctl.tui.screens.processes import ProcessScreen
from gpuctl_tests.fleet.test_record import recording  # noqa: F401  (a fixture)
from gpuctl_tests.helpers import until
from gpuctl_tests.tui.conftest import acknowledge_all, replay_app, settle
from gpuctl_tests.tui.test_panes import fill_history
from gpuctl_tests.tui.test_snapshots import job_store_with_three_jobs
from gpuctl_tests.tui.test_usability import footer_items

THEMES = ["gpuctl-dark", "gpuctl-light", "gpuctl-high-contrast"]
SIZE = (120, 36)


def theme_colour(app: GpuctlApp, variable: str) -> tuple[int, int, int]:
    value = app.current_theme.variables.get(variable) or getattr(app.current_theme, variable)
    return Color.parse(value).rgb


def bg(seg: Segment) -> tuple[int, int, int] | None:
    colour = seg.style.bgcolor if seg.style else None
    return None if colour is None else colour.get_truecolor()


def fg(seg: Segment) -> tuple[int, int, int] | None:
    colour = seg.style.color if seg.style else None
    return None if colour is None else colour.get_truecolor()


def near(a: tuple[int, int, int] | None, b: tuple[int, int, int]) -> bool:
    """The same colour give or take the rounding of a blend."""
    return a is not None and all(abs(x - y) <= 4 for x, y in zip(a, b, strict=True))


def cursor_line(app: GpuctlApp) -> list[Segment]:
    nodes = app.overview.nodes
    return list(nodes.render_line(nodes.cursor_y - int(nodes.scroll_offset.y)))


def gpu_line(app: GpuctlApp, node: str, gpu: int) -> list[Segment]:
    nodes = app.overview.nodes
    y = next(i for i, ln in enumerate(nodes.lines) if (ln.node, ln.gpu) == (node, gpu))
    nodes.scroll_to(y=y, animate=False, immediate=True)
    return list(nodes.render_line(y - int(nodes.scroll_offset.y)))


def header_trouble(app: GpuctlApp) -> str:
    return str(app.overview.query_one("#trouble", Label).content)


def shown_gpus(app: GpuctlApp) -> list[tuple[str, int | None]]:
    return [(ln.node, ln.gpu) for ln in app.overview.nodes.lines if ln.kind == "gpu"]


def with_gpu(snap: NodeSnapshot, index: int, **changes: Any) -> NodeSnapshot:
    gpus = tuple(
        msgspec.structs.replace(g, **changes) if g.index == index else g for g in snap.gpus
    )
    return replace(snap, gpus=gpus)


async def flushed(pilot: Pilot[Any]) -> None:
    app = pilot.app
    assert isinstance(app, GpuctlApp)
    await until(pilot, lambda: not app.store.pending and not app._flush_scheduled, "the flush")
    await pilot.pause()


# -- where am I -------------------------------------------------------------------------------
@pytest.mark.parametrize("theme", THEMES)
async def test_the_selected_row_is_highlighted_whole_in_every_theme(
    tmp_path: Path, theme: str
) -> None:
    fill_history(tmp_path / "accept.sqlite")
    app = replay_app(
        tmp_path, tui=TuiSettings(theme=theme), job_store=job_store_with_three_jobs(tmp_path)
    )
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert app.theme == theme
        cursor = theme_colour(app, "block-cursor-background")
        await pilot.press("down", "down")
        line = cursor_line(app)
        assert {bg(s) for s in line if s.text} == {cursor}, line  # every cell, badges too
        other = gpu_line(app, "gpu-a01", 0)
        assert cursor not in {bg(s) for s in other}
        await pilot.press("v")  # the compact view: a node's line
        assert {bg(s) for s in cursor_line(app) if s.text} == {cursor}
        await pilot.press("v", "m")  # the heatmap: the cell, and its node's label
        heat = app.overview.heatmap
        row = list(heat.render_line(0))
        label = next(s for s in row if s.text.strip() == "gpu-a01")
        assert bg(label) == cursor, row
        assert any("◀▶" in s.text for s in row)
        for pane, table_id in (("2", "#jobs-table"), ("3", "#accept-table")):
            await pilot.press(pane)
            table = app.overview.query_one(table_id, DataTable)
            await until(pilot, lambda table=table: table.row_count > 0, f"rows in {table_id}")
            y = table.cursor_row + 1  # under the column titles
            cells = [s for s in table.render_line(y) if s.text.strip()]
            assert cells and {bg(s) for s in cells} == {cursor}, (table_id, cells)


# -- where is the trouble ---------------------------------------------------------------------
async def test_the_header_counts_trouble_and_each_count_filters(tmp_path: Path) -> None:
    app = replay_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        # gpu-a01 GPU 1 had XID 79; gpu-b02 is stale, gpu-c03 unreachable
        counts = app.store.trouble()
        assert counts["xid"] == 1 and counts["down"] == 2 and counts["lost"] == 0, counts
        text = header_trouble(app)
        assert "1 XID" in text and "2 down" in text and "lost" not in text, text
        assert "unfilter" not in [what for what, _, _ in footer_items(app)]
        # choosing a count: its link runs the filter of that problem
        label = app.overview.query_one("#trouble", Label)
        await pilot.click(label, offset=(1 + text.index("XID"), 0))
        await pilot.pause()
        assert app.store.filter.text == "xid"
        assert shown_gpus(app) == [("gpu-a01", 1)]
        assert "filter: xid" in str(app.overview.query_one("#filter-shown", Label).content)
        names = [what for what, _, _ in footer_items(app)]
        assert "unfilter" in names and "filter" not in names  # it says so
        await pilot.press("escape")  # Esc clears a kept filter
        await pilot.pause()
        assert app.store.filter.empty and len(shown_gpus(app)) == 6
        assert "unfilter" not in [what for what, _, _ in footer_items(app)]
        # from the keyboard: the palette offers each count (from another pane too)
        await pilot.press("2")
        commands = {c.title: c for c in app.get_system_commands(app.overview)}
        commands["Show trouble: down (2)"].callback()
        await pilot.pause()
        assert app.overview.current_pane() == "gpus"
        assert {n for n, _ in shown_gpus(app)} == {"gpu-b02"}
        assert any(ln.node == "gpu-c03" for ln in app.overview.nodes.lines)
        # a GPU that falls off the bus is counted at once
        snap = app.store.snaps["gpu-a01"]
        app._on_snapshot(with_gpu(snap, 3, state="lost"))
        await flushed(pilot)
        assert "1 lost" in header_trouble(app)


async def test_n_jumps_to_the_next_trouble_and_shift_n_back(tmp_path: Path) -> None:
    app = replay_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        acknowledge_all(app)  # n walks the trouble of now (unacknowledged events first: 43.1)
        nodes = app.overview.nodes
        assert nodes.cursor == ("gpu-a01", 0)
        await pilot.press("n")
        assert nodes.cursor == ("gpu-a01", 1)  # the XID
        await pilot.press("n")  # the stale node, once: its first GPU
        assert nodes.cursor == ("gpu-b02", 0)
        await pilot.press("n")
        assert nodes.cursor == ("gpu-c03", None)  # the unreachable one
        await pilot.press("n")  # round the end
        assert nodes.cursor == ("gpu-a01", 1)
        await pilot.press("N")
        assert nodes.cursor == ("gpu-c03", None)
        await pilot.press("v", "home", "n")  # the compact view: a node's line
        assert nodes.cursor == ("gpu-b02", None)  # gpu-a01 is first: n moves on
        await pilot.press("v", "m")
        heat = app.overview.heatmap
        assert heat.selected() == ("gpu-b02", 0)
        await pilot.press("n")
        assert heat.selected() == ("gpu-c03", None)
        await pilot.press("n")
        assert heat.selected() == ("gpu-a01", 1)
        await pilot.press("N")
        assert heat.selected() == ("gpu-c03", None)


async def test_trouble_first_starts_at_the_top_and_holds_still_under_the_cursor(
    tmp_path: Path,
) -> None:
    app = replay_app(tmp_path)
    async with app.run_test(size=(120, 14)) as pilot:
        await settle(pilot)
        nodes = app.overview.nodes
        await pilot.press("end")
        assert int(nodes.scroll_offset.y) > 0
        await pilot.press("o")
        assert nodes.sort == "trouble"
        assert int(nodes.scroll_offset.y) == 0 and nodes.cursor == ("gpu-a01", 1)
        order = shown_gpus(app)
        assert order[0] == ("gpu-a01", 1) and order[-2:] == [("gpu-b02", 0), ("gpu-b02", 1)]
        await pilot.press("down", "down")
        chosen = nodes.cursor
        assert chosen is not None and chosen[0] == "gpu-a01"
        row = nodes.cursor_y - int(nodes.scroll_offset.y)
        # a GPU falls off the bus: the rows stay until the next re-sort
        nodes.resort_s = 3600.0
        lost = next(i for n, i in order if n == "gpu-a01" and (n, i) != chosen and i != 1)
        app._on_snapshot(with_gpu(app.store.snaps["gpu-a01"], lost, state="lost"))
        await flushed(pilot)
        assert shown_gpus(app) == order and nodes.cursor == chosen
        # the re-sort comes: the lost GPU goes first, the selected GPU stays selected, and on
        # the same line of the screen
        nodes.resort_s = 0.0
        app._on_snapshot(app.store.snaps["gpu-a01"])
        await flushed(pilot)
        assert shown_gpus(app)[0] == ("gpu-a01", lost)
        assert nodes.cursor == chosen
        assert nodes.cursor_y - int(nodes.scroll_offset.y) == row


async def test_red_is_for_faults_not_for_a_busy_gpu_at_its_power_cap(tmp_path: Path) -> None:
    app = replay_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        error = theme_colour(app, "error")
        busy = gpu_line(app, "gpu-a01", 2)  # 100% busy, at its power cap, burning
        util = next(s for s in busy if "100%" in s.text)
        cap = next(s for s in busy if "PWRCAP" in s.text)
        assert not near(fg(util), error) and not near(fg(cap), error), busy
        xid = next(s for s in gpu_line(app, "gpu-a01", 1) if "XID" in s.text)
        assert near(fg(xid), error)


# -- footers ----------------------------------------------------------------------------------
def assert_fits(app: GpuctlApp, where: str, width: int = 80) -> list[str]:
    items = footer_items(app)
    names = [what for what, _, _ in items]
    assert names[-2:] == ["help", "quit"], (where, names)
    assert max(right for _, _, right in items) <= width, (where, repr(items))
    return names


async def test_every_footer_fits_80_columns_and_offers_what_works_there(
    tmp_path: Path,
) -> None:
    fill_history(tmp_path / "accept.sqlite")
    app = replay_app(tmp_path, job_store=job_store_with_three_jobs(tmp_path))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        names = assert_fits(app, "GPU list")
        assert {"trouble", "map", "filter", "procs"} <= set(names), names
        app.overview.action_trouble("xid")  # a kept filter: the footer says so, and fits
        await pilot.pause()
        assert "unfilter" in assert_fits(app, "GPU list, filtered")
        await pilot.press("escape")
        await pilot.press("v")
        assert_fits(app, "compact")
        await pilot.press("v", "m")
        assert "trouble" in assert_fits(app, "heatmap")
        await pilot.press("escape", "2")
        await pilot.pause()
        names = assert_fits(app, "jobs pane")
        assert not {"map", "filter", "detail", "stress", "procs"} & set(names), names
        await pilot.press("3")
        await pilot.pause()
        names = assert_fits(app, "acceptance pane")
        assert not {"map", "filter", "stress", "procs"} & set(names) and "accept" in names
        await pilot.press("1", "down", "enter")
        assert isinstance(app.screen, DetailScreen)
        assert_fits(app, "detail")
        await pilot.press("escape", "p")
        assert isinstance(app.screen, ProcessScreen)
        names = assert_fits(app, "processes")
        assert not {"stress", "procs", "accept"} & set(names), names
        await pilot.press("s")  # not offered, and does nothing here
        await pilot.pause()
        assert isinstance(app.screen, ProcessScreen)
        assert not any("stress" in n.message for n in app._notifications)


async def test_the_replay_footer_ends_with_help_and_quit(
    recording: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    app = ReplayApp(Replayer(RecordingReader(recording), speed=1000), state_dir=tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.overview.nodes.lines, "the replayed nodes")
        # the footer is composed after the first frames: wait for all of it
        await until(pilot, lambda: "quit" in [w for w, _, _ in footer_items(app)], "the footer")
        await pilot.pause()
        names = assert_fits(app, "replay")
        assert {"pause", "±10s"} <= set(names), names


# -- help -------------------------------------------------------------------------------------
async def test_help_says_esc_closes_it_lists_each_key_once_and_has_a_legend(
    tmp_path: Path,
) -> None:
    app = replay_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        rows = app.help_rows()
        same = [(key, what, bid) for key, what, bid, _ in rows]
        assert len(same) == len(set(same)), sorted(same)
        assert ("↑", "up", "cursor_up", "GPU list, heatmap") in rows
        assert ("n", "next GPU in trouble", "next_problem", "GPU list, heatmap") in rows
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        assert "esc" in str(app.screen.query_one("#help-title", Static).content)
        table = app.screen.query_one(DataTable)
        keys = [str(table.get_row_at(i)[0]) for i in range(table.row_count)]
        for badge in ("LOST", "XID", "ECC", "THERM", "PWRCAP", "BURN", "T", "P", "red"):
            assert badge in keys, badge
        await pilot.press("end")
        assert table.cursor_row == table.row_count - 1 and table.scroll_x == 0
        await pilot.press("escape")
        assert app.screen is app.overview
