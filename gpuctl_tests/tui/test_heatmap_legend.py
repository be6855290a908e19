"""The heatmap's legend, its monotone colour scale in every theme, and its marks for states."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from textual.color import Color
from textual.content import Content
from textual.style import Style as ContentStyle
from textual.widgets import Static

from gpuctl.core.model import GpuSample
from gpuctl.fleet.fixed_links import ReplayLink, recorded_node
from gpuctl.fleet.fleet import Fleet
from gpuctl.fleet.links import NodeLink
from gpuctl.node import metrics
from gpuctl.tui import make_app
from gpuctl.tui.screens.detail import DetailScreen, Facts
from gpuctl.tui.view import (
    HEAT_LEVELS,
    METRIC_TITLES,
    heat_scale,
    metric_fraction,
    screen_word,
)
from gpuctl.tui.widgets.heatmap import CELL, HeatLegend, heat_mark
from gpuctl_tests.helpers import until
from gpuctl_tests.tui.conftest import acknowledge_all, replay_app, settle
from gpuctl_tests.tui.test_trouble import fg, near, theme_colour

SIZE = (160, 30)


def cell_texts(app: object) -> list[str]:
    heat = app.overview.heatmap  # type: ignore[attr-defined]
    return [seg.text for seg in heat.render_line(0)]


@pytest.mark.parametrize("theme", ["gpuctl-dark", "gpuctl-light", "gpuctl-high-contrast"])
async def test_each_step_of_the_scale_stands_further_from_the_background(
    tmp_path: Path, theme: str
) -> None:
    app = replay_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        app.theme = theme
        await pilot.press("m")
        heat = app.overview.heatmap
        ground = Color.from_rich_color(heat.rich_style.bgcolor)
        steps = [
            Color.from_rich_color(heat.get_component_rich_style(f"heatmap--heat-{i}").bgcolor)
            for i in range(HEAT_LEVELS)
        ]
        distance = [_distance(ground, c) for c in steps]
        assert distance == sorted(distance) and len(set(distance)) == HEAT_LEVELS, distance


def _distance(a: Color, b: Color) -> float:
    """How far apart two colours are (RGB): a blend towards one hue moves steadily away."""
    return float(((a.r - b.r) ** 2 + (a.g - b.g) ** 2 + (a.b - b.b) ** 2) ** 0.5)


async def test_the_legend_names_the_scale_and_every_mark(tmp_path: Path) -> None:
    app = replay_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        legend = app.overview.query_one(HeatLegend)
        assert not legend.display
        await pilot.press("m")
        assert legend.display
        text = legend.render().plain
        assert text.startswith(" utilization 0% ") and "100%" in text
        for word in ("lost", "XID", "ECC", "burning", "slowdown", "power cap", "stale", "no data"):
            assert word in text
        await pilot.press("m", "m")
        assert legend.render().plain.startswith(" temperature 30°C ")
        # the cells: GPU 1 had an XID, GPU 2 burns (under the cursor once it moves on)
        await pilot.press("right", "right", "right")
        row = "".join(cell_texts(app))
        assert "X " in row and "B " in row and "·" in row  # gpu-b02 is stale
        await pilot.press("escape")
        assert not legend.display


def test_marks_most_urgent_first() -> None:
    def mark(g: GpuSample, **kw: bool) -> tuple[str, str]:
        args = {"xid": False, "burning": False, "stale": False, "reading": True, **kw}
        return heat_mark(g, **args)

    ok = GpuSample(0, 0.0, util_gpu=50, throttle=("gpu_idle",))
    assert mark(ok) == (CELL, "mark")
    assert mark(ok, stale=True) == (" ·", "mark")
    hot = GpuSample(0, 0.0, throttle=("sw_thermal",))
    assert mark(hot) == ("T ", "mark")
    assert mark(hot, burning=True) == ("B ", "mark")
    ecc = GpuSample(0, 0.0, ecc={"volatile_uncorrected": 2}, throttle=("sw_thermal",))
    assert mark(ecc, burning=True) == ("E ", "alarm")
    assert mark(ecc, xid=True) == ("X ", "alarm")
    assert mark(GpuSample(0, 0.0, state="lost"), xid=True, stale=True) == ("✕·", "alarm")
    assert mark(GpuSample(0, 0.0), reading=False) == ("? ", "mark")


def test_power_cap_is_its_own_quiet_mark_and_slowdown_outranks_it() -> None:
    """At full load a GPU at its power cap is normal: ``P``, drawn quietly, not the ``T`` of a
    thermal or hardware slowdown (issue 26: 150 ``T`` marks hid the one XID)."""
    args = {"xid": False, "burning": False, "stale": False, "reading": True}
    capped = GpuSample(0, 0.0, util_gpu=100, throttle=("sw_power_cap",))
    assert heat_mark(capped, **args) == ("P ", "minor")
    both = GpuSample(0, 0.0, util_gpu=100, throttle=("sw_power_cap", "hw_slowdown"))
    assert heat_mark(both, **args) == ("T ", "mark")


async def test_m_cycles_every_heatmap_metric_of_the_registry(tmp_path: Path) -> None:
    """``m`` goes through each metric the registry flags "heatmap" (NVENC, NVDEC and PCIe TX/RX
    were missing: the cycle stopped at power), each with its scale in the legend and cells
    coloured by it, then back to the list."""
    words = [screen_word(m) for m in metrics.flagged("heatmap")]
    assert {"enc", "dec", "pcie_tx", "pcie_rx"} <= set(words)
    app = replay_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        legend = app.overview.query_one(HeatLegend)
        seen = []
        for word in words:
            await pilot.press("m")
            seen.append(app.overview.mode)
            text = legend.render().plain
            assert text.startswith(f" {METRIC_TITLES[word]} {heat_scale(word)[0]} "), text
            status = str(app.overview.query_one("#heat-status").render())
            assert METRIC_TITLES[word] in status, status
        assert seen == words
        assert legend.render().plain.startswith(" PCIe receive throughput 0GB/s ")
        await pilot.press("m")
        assert app.overview.mode == "list" and not legend.display


def test_a_registry_metric_heats_on_its_scale() -> None:
    """PCIe on 0..64 GB/s, the video engines on 0..100 %, temperature on 30..90 °C, memory and
    power as their share of the total and the limit."""
    g = GpuSample(
        0,
        0.0,
        enc=25,
        pcie_tx=32_000_000_000,
        temp=60,
        mem_used=20 << 30,
        mem_total=80 << 30,
        power=350.0,
        power_limit=700.0,
    )
    fractions = {w: metric_fraction(g, w) for w in ("enc", "pcie_tx", "temp", "mem", "power")}
    assert fractions == {"enc": 0.25, "pcie_tx": 0.5, "temp": 0.5, "mem": 0.25, "power": 0.5}
    assert metric_fraction(g, "dec") is None and metric_fraction(g, "pcie_rx") is None
    assert heat_scale("pcie_rx") == ("0GB/s", "64GB/s") and heat_scale("enc") == ("0%", "100%")
    with pytest.raises(ValueError, match="unknown metric"):
        metric_fraction(g, "fan")  # no heatmap metric


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_the_cursor_keeps_the_cells_mark_and_the_status_line_names_the_trouble(
    tmp_path: Path, size: tuple[int, int]
) -> None:
    """Issue 39.2: ``n`` landed on the XID GPU and its cell showed the cursor's ``◀▶``, not
    the red X, and the status line gave its watts, not the XID. The mark stays beside the
    cursor, in its colour; the status line names the trouble in the detail screen's words,
    whole, in the terminal's width."""
    app = replay_app(tmp_path)
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        acknowledge_all(app)  # n walks the trouble of now (unacknowledged events first: 43.1)
        await pilot.press("m", "n")
        heat = app.overview.heatmap
        assert heat.selected() == ("gpu-a01", 1)
        segs = list(heat.render_line(0))
        assert "X◀" in "".join(s.text for s in segs)
        mark = next(s for s in segs if s.text == "X")
        assert near(fg(mark), theme_colour(app, "error"))
        status = app.overview.query_one("#heat-status", Static)
        line = status.render()
        assert isinstance(line, Content)
        words = "XID 79: GPU has fallen off the bus: drain and reset the node"
        assert line.plain.startswith(" gpu-a01 GPU 1") and words in line.plain
        assert line.cell_length <= size[0]
        at = line.plain.index(words)
        (style,) = [
            span.style for span in line.spans if span.start <= at < span.end
        ]  # in the error colour, bold
        assert isinstance(style, ContentStyle) and style.bold and style.foreground is not None
        assert near(style.foreground.rgb, theme_colour(app, "error"))
        # ... the words the detail screen shows for it
        await pilot.press("enter")
        assert isinstance(app.screen, DetailScreen)
        await pilot.pause()
        assert words in app.screen.query_one("#detail-now", Facts).text().plain.replace("\n", " ")
        await pilot.press("escape", "right")  # GPU 2 burns: its B beside the cursor
        assert "B◀" in "".join(s.text for s in heat.render_line(0))


async def test_a_resize_keeps_the_cursors_gpu_on_screen(tmp_path: Path) -> None:
    """Issue 39.2: at 80x24 with 512 nodes the cursor's GPU was off screen after a resize
    (the rows of a narrower map are more, the scroll stayed where it was)."""
    hello = recorded_node("x", "8:H100", samples=1, t0=time.time())
    links: dict[str, NodeLink] = {f"gpu-{i:03d}": ReplayLink(hello) for i in range(512)}
    app = make_app(Fleet(links), state_dir=tmp_path)
    async with app.run_test(size=(200, 60)) as pilot:
        await until(
            pilot,
            lambda: (
                len(app.store.snaps) == 512
                and all(s.gpus for s in app.store.snaps.values())
                and not app.store.pending
            ),
            "512 nodes",
            timeout=60,
        )
        await pilot.press("m")
        heat = app.overview.heatmap
        heat.select("gpu-500", 3)
        await pilot.pause()

        def on_screen() -> bool:
            row = heat.cursor[0] // heat.per_line
            top = int(heat.scroll_offset.y)
            return top <= row < top + heat.size.height

        assert on_screen()
        for size in ((80, 24), (200, 60), (120, 40)):
            await pilot.resize_terminal(*size)
            await pilot.pause()
            await pilot.pause()
            assert heat.selected() == ("gpu-500", 3)
            assert on_screen(), (size, heat.cursor, heat.per_line, heat.scroll_offset)
