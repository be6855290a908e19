"""The main screen's process panel: the node under the cursor's processes in the lines the GPU
list leaves (one node at 80x24, 120x40, 200x60), the cursor GPU's first, the process view's
rows; none where the list needs the room (several nodes at 80x24), and no GPU row cut for it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

from gpuctl.fleet.fixed_links import ReplayLink, recorded_node
from gpuctl.fleet.fleet import Fleet
from gpuctl.tui import GpuctlApp, make_app
from gpuctl.tui.procview import process_rows
from gpuctl.tui.widgets.node_procs import MIN_LINES, NodeProcs
from gpuctl_tests.helpers import until
from gpuctl_tests.tui.conftest import rows_view
from gpuctl_tests.tui.test_hostile import drawn

T0 = 1_700_000_000.0
SAMPLES = 20
NOW = T0 + SAMPLES - 0.5


def app_of(tmp_path: Path, nodes: int, prefix: str = "dgx-") -> GpuctlApp:
    links = {
        f"{prefix}{i:02d}": ReplayLink(
            recorded_node(f"{prefix}{i:02d}", "8:H100", seed=11 + i, t0=T0, samples=SAMPLES)
        )
        for i in range(nodes)
    }
    fleet = Fleet(links, clock=lambda: NOW)
    return make_app(fleet, clock=lambda: NOW, state_dir=tmp_path)


async def settled(pilot: Pilot[Any]) -> GpuctlApp:
    app = pilot.app
    assert isinstance(app, GpuctlApp)

    def done() -> bool:
        snaps = app.store.snaps
        return (
            len(snaps) == len(app.fleet.nodes)
            and all(s.last_sample_t == T0 + SAMPLES - 1 for s in snaps.values())
            and not app.store.pending
            and not app._flush_scheduled
        )

    await until(pilot, done, "every node's last sample on screen")
    await rows_view(pilot)
    await pilot.pause()
    return app


def panel_pids(text: str) -> list[str]:
    """The PIDs of the panel's rows as drawn (the lines under its column titles)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if "processes on" in line)
    assert lines[start + 1].split()[:3] == ["GPU", "PID", "USER"], lines[start + 1]
    out = []
    for line in lines[start + 2 :]:
        words = line.split()
        if len(words) < 3 or not words[1].isdigit():
            break
        out.append(words[1])
    return out


def list_whole(app: GpuctlApp) -> bool:
    nodes = app.overview.nodes
    return nodes.size.height >= len(nodes.lines) and nodes.scroll_offset.y == 0


async def test_a_long_node_name_gives_way_to_the_gpus_count_at_80_columns(tmp_path: Path) -> None:
    """A 60-character name took the whole title at 80 columns: the GPU's count fell off."""
    app = app_of(tmp_path, 1, prefix="rack17-row4-chassis2-" * 3)
    async with app.run_test(size=(80, 24)) as pilot:
        await settled(pilot)
        await pilot.press("down")
        await pilot.pause()
        title = next(line for line in drawn(app).splitlines() if "processes on" in line)
        assert " on GPU 1" in title and len(title.rstrip()) <= 80, title
        assert "rack17-row4" in title, title


@pytest.mark.parametrize("size", [(80, 24), (120, 40), (200, 60)], ids=lambda s: f"{s[0]}x{s[1]}")
async def test_one_node_shows_the_selected_gpus_processes_first_below_its_rows(
    tmp_path: Path, size: tuple[int, int]
) -> None:
    app = app_of(tmp_path, 1)
    async with app.run_test(size=size) as pilot:
        await settled(pilot)
        panel = app.overview.query_one(NodeProcs)
        assert panel.size.height >= MIN_LINES and list_whole(app)
        snap = app.store.snaps["dgx-00"]
        busy = next(g.index for g in snap.gpus if g.processes and g.index > 0)
        assert app.overview.nodes.cursor == ("dgx-00", 0)
        await pilot.press(*["down"] * busy)
        await pilot.pause()
        assert panel.gpu == busy
        rows = process_rows(snap, now=NOW)  # the process view's rows, its order
        first = [str(r.pid) for r in rows if busy in r.gpus]
        rest = [str(r.pid) for r in rows if busy not in r.gpus]
        shown = panel_pids(drawn(app))
        assert shown and shown == (first + rest)[: len(shown)]
        # the title says what its figures count, on one line within the width
        title = next(line for line in drawn(app).splitlines() if "processes on" in line)
        assert f"{len(rows)} processes on dgx-00 · {len(first)} on GPU {busy}" in title, title
        assert "node:" not in title and len(title.rstrip()) <= size[0], title
        # the filter box takes lines at the bottom: the panel gives them up, not the list
        await pilot.press("slash")
        await pilot.pause()
        assert list_whole(app)
        await pilot.press("escape")
        # the heatmap has no panel
        await pilot.press("m")
        await pilot.pause()
        assert panel.size.height == 0 and "processes on" not in drawn(app)


async def test_no_panel_where_the_list_needs_the_room(tmp_path: Path) -> None:
    """Three nodes of 8 GPUs as rows at 80x24: the list fills the pane, no panel; one line per
    node (``v``) leaves room, and the panel shows the node under the cursor."""
    app = app_of(tmp_path, 3)
    async with app.run_test(size=(80, 24)) as pilot:
        await settled(pilot)
        panel = app.overview.query_one(NodeProcs)
        assert not app.overview.nodes.compact
        assert panel.size.height == 0 and "processes on" not in drawn(app)
        await pilot.press("v")
        await pilot.pause()
        assert panel.size.height >= MIN_LINES and list_whole(app)
        await pilot.press("down")
        await pilot.pause()
        assert "processes on dgx-01" in drawn(app)
