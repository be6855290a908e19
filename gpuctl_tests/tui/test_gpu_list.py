"""The GPU list's column titles, orders (``o``) and compact mode (``v``), over a replayed fleet."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuctl.core.model import GpuSample, NodeSnapshot, NodeState
from gpuctl.node import metrics
from gpuctl.tui.gpusort import SORTS, metric, next_sort, order_gpus, order_nodes
from gpuctl.tui.screens.detail import DetailScreen
from gpuctl.tui.view import screen_word
from gpuctl.tui.widgets.gpu_columns import COLUMNS, columns_at, list_title
from gpuctl.tui.widgets.node_columns import compact_columns_at, gpu_bars
from gpuctl.tui.widgets.overview import GpuColumns, NodeList, column_titles
from gpuctl_tests.tui.conftest import replay_app, settle

SIZE = (120, 36)


def gpu_rows(nodes: NodeList) -> list[tuple[str, int | None]]:
    return [(line.node, line.gpu) for line in nodes.lines if line.kind == "gpu"]


def titles(app: object) -> str:
    columns = app.screen.query_one(GpuColumns)  # type: ignore[attr-defined]
    return str(columns.render())


async def test_o_cycles_the_orders_and_marks_the_column(tmp_path: Path) -> None:
    app = replay_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        nodes = app.overview.nodes
        fleet_order = gpu_rows(nodes)
        assert fleet_order[:4] == [("gpu-a01", i) for i in range(4)]
        assert "TEMP " in titles(app) and "↓" not in titles(app)
        temps = {(n, g.index): g.temp for n, s in app.store.snaps.items() for g in s.gpus}
        await pilot.press("o", "o")  # trouble first, then hottest
        rows = gpu_rows(nodes)
        a01 = [r for r in rows if r[0] == "gpu-a01"]
        assert [temps[r] for r in a01] == sorted((temps[r] for r in a01), reverse=True)
        assert rows[0] == max(temps, key=lambda k: temps[k] or 0)
        assert "TEMP↓" in titles(app)
        await pilot.press("o", "o")  # busiest, then most idle
        utils = {(n, g.index): g.util_gpu for n, s in app.store.snaps.items() for g in s.gpus}
        rows = gpu_rows(nodes)
        assert utils[rows[0]] == min(utils.values())
        assert "UTIL↑" in titles(app)
        await pilot.press("o", "o")  # memory, power
        assert nodes.sort == "power" and "POWER↓" in titles(app)
        # then the registry's other sorts (video engines, PCIe), then the fleet's order
        await pilot.press(*["o"] * (len(SORTS) - 6 + 1))
        assert gpu_rows(nodes) == fleet_order
        assert "↓" not in titles(app) and "↑" not in titles(app)


async def test_o_sorts_by_each_registry_sort_metric_and_marks_its_title(tmp_path: Path) -> None:
    """``o`` reaches every metric the registry flags "sort" (NVENC, NVDEC, PCIe TX/RX were
    missing: the cycle was written by hand); each orders the GPUs, largest first, and at 200
    columns marks its column's title."""
    app = replay_app(tmp_path)
    async with app.run_test(size=(200, 50)) as pilot:
        await settle(pilot)
        nodes = app.overview.nodes
        seen = []
        for _ in SORTS:
            await pilot.press("o")
            seen.append(nodes.sort)
            key, _title, column, descending = next(s for s in SORTS if s[0] == nodes.sort)
            if key == "trouble":
                continue
            m = metrics.BY_NAME.get(column) or metrics.BY_KEY["mem_used"]
            values = [
                metric(next(g for g in app.store.snaps[n].gpus if g.index == i), column)
                for n, i in gpu_rows(nodes)
                if n == "gpu-a01"
            ]
            known = [v for v in values if v is not None]
            assert known == sorted(known, reverse=descending), (key, values)
            arrow = "↓" if descending else "↑"
            assert list_title(m) + arrow in titles(app) or (
                column == "mem" and "MEMORY↓" in titles(app)
            )
        sortable = [screen_word(m) for m in metrics.flagged("sort")]
        assert {c for k, _t, c, _d in SORTS if k in seen} == {"flags", *sortable}
        assert {"enc", "dec", "pcie_tx", "pcie_rx"} <= set(seen)
        await pilot.press("o")
        assert nodes.sort is None


async def test_v_shows_one_line_per_node_and_keeps_the_selection(tmp_path: Path) -> None:
    app = replay_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        nodes = app.overview.nodes
        await pilot.press("v")
        assert [(line.kind, line.node) for line in nodes.lines] == [
            ("node", "gpu-a01"),
            ("node", "gpu-b02"),
            ("node", "gpu-c03"),
        ]
        assert nodes.cursor == ("gpu-a01", None)
        assert titles(app).startswith(" NODE")
        await pilot.press("down")
        assert app.overview.selection() == ("gpu-b02", None)
        await pilot.press("v")
        assert nodes.cursor == ("gpu-b02", 0)
        assert len(gpu_rows(nodes)) == 6
        await pilot.press("v", "enter")
        assert isinstance(app.screen, DetailScreen) and app.screen.node == "gpu-b02"


def snap(name: str, temps: list[int | None], state: NodeState = NodeState.LIVE) -> NodeSnapshot:
    gpus = tuple(
        GpuSample(i, 0.0, temp=t, util_gpu=10 * i, state="lost" if t is None else "ok")
        for i, t in enumerate(temps)
    )
    return NodeSnapshot(name, state, gpus=gpus)


def test_orders_put_unknowns_and_dead_nodes_last() -> None:
    a = snap("a", [40, 70, None])
    b = snap("b", [80, 30])
    down = snap("c", [], NodeState.UNREACHABLE)
    lost = snap("d", [None])
    assert order_nodes([down, lost, a, b], "hot") == ["b", "a", "d", "c"]
    assert order_gpus(a, range(3), "hot") == [1, 0, 2]
    assert order_gpus(a, range(3), "idle") == [0, 1, 2]  # the lost GPU last, not "0 %"
    assert [next_sort(k) for k in (None, "trouble", "hot", "power", "pcie_rx")] == [
        "trouble",
        "hot",
        "busy",
        "enc",
        None,
    ]


def layout(width: int, mixed: bool = False) -> dict[str, int]:
    """The cells of each column the list shows at ``width`` (key -> cells)."""
    return {c.column.key: c.width for c in columns_at(width, mixed)}


def test_column_titles_line_up_with_the_rows() -> None:
    line = column_titles(120, "mem", compact=False)
    assert line.index("MEMORY↓") == 2 + 2 + 1 + 15  # index, util bar and % (no model column)
    assert line.index("UTIL") == 5
    # At every width the titles follow the row's layout: bars, sparkline and clock give way
    for width in (80, 100, 120, 200):
        lay = layout(width)
        bar = lay["util_gpu"] - 5
        line = column_titles(width, None, compact=False)
        # where the utilization field begins (narrow: no model column, it is in the header)
        start = 2 + 2 + 1 + (lay["model"] + 1 if "model" in lay else 0)
        at = start + bar + 7 if bar else start + 7 + 3  # MEMORY over its bar / figure
        assert line.index("MEMORY") == at, width
        assert ("SM CLK" in line) == ("sm_clock" in lay) and ("RECENT" in line) == ("recent" in lay)
        temp_end = start + bar + 7 + bar + 11 + 5  # TEMP ends where the figure does
        assert line.index("TEMP") + 4 == temp_end, width
    compact = column_titles(80, None, compact=True, per_gpu=8)  # nodes of 8 GPUs
    assert compact.index("STATE") == 14 and compact.index("TROUBLE") <= 67
    cells = compact_columns_at(8)  # the compact line's columns: the title after the last cell
    assert compact.index("TROUBLE") == sum(c.width + len(c.gap) for c in cells[:-1])
    assert gpu_bars([GpuSample(0, 0.0, util_gpu=0), GpuSample(1, 0.0, state="lost")]) == "▁✕"


def test_wide_lists_show_the_registrys_other_list_columns() -> None:
    """Fan and P-state from 160 columns, the video engines and PCIe from 190, each title
    right-aligned over its figure, after the SM clock; none below 160 (80 and 120 as before)."""
    readings = [m.key for m in metrics.flagged("list")]

    def extras(width: int) -> list[str]:
        shown = [k for k in layout(width) if k in readings]
        return shown[shown.index("sm_clock") + 1 :]

    assert extras(160) == ["fan", "pstate"]
    assert extras(200) == ["fan", "pstate", "enc", "dec", "pcie_tx", "pcie_rx"]
    assert "fan" not in layout(159) and "fan" not in layout(80)
    line = column_titles(200, None, compact=False)
    clock_end = line.index("SM CLK") + len("SM CLK")
    assert line[clock_end:].split("RECENT")[0].split() == [
        "FAN",
        "PST",
        "ENC",
        "DEC",
        "TX",
        "GB/s",
        "RX",
        "GB/s",
    ]
    assert "FAN" not in column_titles(120, None, compact=False)


def test_the_lists_columns_are_the_registrys_list_metrics_in_its_order() -> None:
    """Every reading flagged "list" is one column, in the registry's order, and the title of a
    column whose metric is flagged "sort" is the one that sort marks."""
    keys = [c.key for c in COLUMNS]
    readings = [k for k in keys if k in metrics.BY_KEY]
    assert readings == [m.key for m in metrics.flagged("list")]
    assert len(set(keys)) == len(keys)
    marked = {c.sort for c in COLUMNS if c.sort}
    assert marked == {column for _k, _t, column, _d in SORTS}


@pytest.mark.parametrize(
    ("width", "mixed"), [(76, False), (78, True), (80, True), (98, True), (119, False), (200, True)]
)
def test_the_last_title_fits_the_list(width: int, mixed: bool) -> None:
    """Every title fits the list, "OWNERS" last, whatever the sort (78 and 119 are the list's
    width on an 80- and a 120-column terminal, where "OWNERS" was cut: with a node of two
    models by 5 cells, at 120 by 8); spaced out where there is room for it."""
    spaced = "FLAGS · JOB · USER · BURN · OWNERS"
    for key in (None, *(k for k, _t, _c, _d in SORTS)):
        line = column_titles(width, key, compact=False, mixed=mixed)
        assert len(line) <= width and line.endswith("OWNERS"), (width, key, line)
        if width >= 200 or (width, mixed) == (76, False):
            assert line.replace("↓", "").replace("↑", "").endswith(spaced), (width, key, line)


@pytest.mark.parametrize("width", [80, 100, 120, 160, 200])
def test_a_marked_title_never_moves_the_next_column(width: int) -> None:
    """Each title stays over its cells whatever the sort: a right-aligned title moves left by
    its mark, and a mark wider than the title's cells ("TX GB/s↓" over 7) takes a cell of its
    gap: no other title moves (at 200 columns "RECENT" moved right by one under a PCIe sort)."""
    words = {"util": "UTIL", "mem": "MEMORY", "temp": "TEMP", "power": "POWER", "flags": "FLAGS"}
    words |= {"fan": "FAN", "pcie_tx": "TX GB/s", "pcie_rx": "RX GB/s", "recent": "RECENT"}
    plain = column_titles(width, None, compact=False)
    at = {c: plain.index(w) for c, w in words.items() if w in plain}
    for key, _title, column, descending in SORTS:
        line = column_titles(width, key, compact=False)
        moved = {c: line.index(w) - at[c] for c, w in words.items() if c in at}
        assert all(d == 0 for c, d in moved.items() if c != column), (width, key, moved)
        assert moved.get(column, 0) in (0, -1), (width, key, moved)
        shown = {c.column.sort for c in columns_at(width)}
        assert (("↓" if descending else "↑") in line) == (column in shown), (width, key)
