"""What a new user ran into on the screen (issue 15's "wrong today"), driven by keys at 80x24,
120x40 and 200x60 over replayed nodes: the footer, GPU rows that fit, the scrollbar and the
cursor, burns that end, the filter, the configured keys, and the words."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Footer, Input, Static
from textual.widgets._footer import FooterKey, FooterLabel

from gpuctl.fleet.fleet import Fleet
from gpuctl.fleet.replay import ReplayLink, recorded_node
from gpuctl.node.readers.sim import SimReader
from gpuctl.tui import GpuctlApp, make_app
from gpuctl.tui.screens.confirm import ConfirmScreen
from gpuctl.tui.store import BURN_ENDED_SHOWN_S
from gpuctl_tests.tui.conftest import NOW, T0, replay_app, settle
from gpuctl_tests.tui.test_panes import messages, until

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
        assert "alice" in row_text(app, "gpu-a01", 0)
        assert "XID" in row_text(app, "gpu-a01", 1)
        burning = row_text(app, "gpu-a01", 2)
        assert "PWRCAP" in burning and "BURN 612 TF/s 0 err" in burning, burning
        assert "100%" in burning and "78/80G" in burning and "699/700W" in burning


@pytest.mark.parametrize("size", SIZES)
async def test_no_horizontal_scrollbar_and_the_cursor_stays_in_view(
    tmp_path: Path, size: tuple[int, int]
) -> None:
    """Twenty nodes need the vertical scrollbar; no horizontal one may cover the last row, and
    the cursor stays on screen when the window shrinks."""
    app = make_app(many_nodes(20), clock=lambda: NOW, state_dir=tmp_path)
    async with app.run_test(size=size) as pilot:
        await all_shown(pilot, 20)
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
        assert "H100" in row_text(app, "node-19", 3)
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
    app = replay_app(tmp_path, config_tui={"keys": {"heatmap": "h"}})
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
        assert "  1 GPU  util" in nodes.render_line(0).text
        await pilot.press("B")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question")
        assert app.screen.question.startswith("Burn all 1 GPU on 1 live node?")


def test_simulated_memory_adds_up() -> None:
    """Processes hold at most what is used, and what is used is at most what there is: a
    burning demo GPU once listed 114 GiB of processes on an 80 GiB GPU."""
    for seed in range(30):
        reader = SimReader.from_spec("8:H100,4:L40S", seed=seed)
        reader.simulate("load", {"gpus": "all", "load": 1.0})
        for g in reader.sample():
            held = sum(p["mem"] for p in g["processes"])
            assert held <= g["mem_used"] <= g["mem_total"], (seed, g)
