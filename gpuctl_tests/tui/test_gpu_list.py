"""The GPU list's column titles, orders (``o``) and compact mode (``v``), over a replayed fleet."""

from __future__ import annotations

from pathlib import Path

from gpuctl.core.model import GpuSample, NodeSnapshot, NodeState
from gpuctl.tui.gpusort import next_sort, order_gpus, order_nodes
from gpuctl.tui.screens.detail import DetailScreen
from gpuctl.tui.widgets.overview import (
    GpuColumns,
    NodeList,
    column_titles,
    gpu_bars,
    row_layout,
)
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
        await pilot.press("o", "o", "o")  # memory, power, back to the fleet's order
        assert gpu_rows(nodes) == fleet_order
        assert "↓" not in titles(app) and "↑" not in titles(app)


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
    assert [next_sort(k) for k in (None, "trouble", "hot", "power")] == [
        "trouble",
        "hot",
        "busy",
        None,
    ]


def test_column_titles_line_up_with_the_rows() -> None:
    line = column_titles(120, "mem", compact=False)
    assert line.index("MEMORY↓") == 2 + 2 + 1 + 16 + 15  # index, model, util bar and %
    assert line.index("UTIL") == 21
    # At every width the titles follow the row's layout: bars, sparkline and clock give way
    for width in (80, 100, 120, 200):
        lay = row_layout(width)
        line = column_titles(width, None, compact=False)
        # where the utilization field begins (narrow: no model column, it is in the header)
        start = 2 + 2 + 1 + (lay.model + 1 if lay.model else 0)
        at = start + lay.bar + 7 if lay.bar else start + 7 + 3  # MEMORY over its bar / figure
        assert line.index("MEMORY") == at, width
        assert ("SM CLK" in line) == lay.clock and ("RECENT" in line) == bool(lay.spark)
        temp_end = start + lay.bar + 7 + lay.bar + 11 + 5  # TEMP ends where the figure does
        assert line.index("TEMP") + 4 == temp_end, width
    compact = column_titles(80, None, compact=True, per_gpu=8)  # nodes of 8 GPUs
    assert compact.index("STATE") == 14 and compact.index("TROUBLE") <= 67
    assert gpu_bars([GpuSample(0, 0.0, util_gpu=0), GpuSample(1, 0.0, state="lost")]) == "▁✕"


def test_wide_lists_show_the_registrys_other_list_columns() -> None:
    """Fan and P-state from 160 columns, the video engines and PCIe from 190, each title
    right-aligned over its figure, after the SM clock; none below 160 (80 and 120 as before)."""
    assert [m.key for m in row_layout(160).extras] == ["fan", "pstate"]
    assert [m.key for m in row_layout(200).extras] == [
        "fan",
        "pstate",
        "enc",
        "dec",
        "pcie_tx",
        "pcie_rx",
    ]
    assert row_layout(159).extras == () and row_layout(80).extras == ()
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
