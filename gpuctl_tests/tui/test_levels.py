"""Issue 39.11b: where a temperature and a GPU's memory turn warm and hot on the screen is the
config's (``[tui]`` temp_warn, temp_critical, mem_warn, mem_critical); it was fixed at 75/85 °C
and 80 % (memory never red). Issue 39.10: a burn's colour says whether it still runs."""

from __future__ import annotations

from pathlib import Path

from rich.style import Style

from gpuctl.config import TuiSettings
from gpuctl.tui import GpuctlApp
from gpuctl_tests.helpers import until
from gpuctl_tests.tui.conftest import replay_app, rows_view, settle


def style_of(app: GpuctlApp, node: str, gpu: int, text: str) -> Style:
    """The style the GPU row paints ``text`` in (the segment holding it)."""
    nodes = app.overview.nodes
    y = next(i for i, ln in enumerate(nodes.lines) if (ln.node, ln.gpu) == (node, gpu))
    nodes.scroll_to(y=y, animate=False, immediate=True)
    strip = nodes.render_line(y - int(nodes.scroll_offset.y))
    return next(seg.style for seg in strip if text in seg.text and seg.style is not None)


async def colours(tmp_path: Path, tui: TuiSettings | None) -> tuple[str, str]:
    """The level classes of GPU 0's temperature (37 °C) and memory (12 of 80 GiB: 15 %)."""
    app = replay_app(tmp_path, tui=tui)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await rows_view(pilot)
        nodes = app.overview.nodes
        by_colour = {
            nodes._style(c).color: c for c in ("nodelist--ok", "nodelist--warm", "nodelist--hot")
        }
        temp = style_of(app, "gpu-a01", 0, "37°C")
        mem = style_of(app, "gpu-a01", 0, "12/80G")
        return by_colour[temp.color], by_colour[mem.color]


async def test_the_config_sets_where_temperature_and_memory_turn_warm_and_hot(
    tmp_path: Path,
) -> None:
    assert await colours(tmp_path / "a", None) == ("nodelist--ok", "nodelist--ok")
    warm = TuiSettings(temp_warn=35, temp_critical=50, mem_warn=10)
    assert await colours(tmp_path / "b", warm) == ("nodelist--warm", "nodelist--warm")
    hot = TuiSettings(temp_warn=30, temp_critical=36, mem_warn=10, mem_critical=14)
    assert await colours(tmp_path / "c", hot) == ("nodelist--hot", "nodelist--hot")


async def test_a_finished_burn_is_dimmed_and_a_failed_one_red(tmp_path: Path) -> None:
    """Issue 39.10: a finished burn kept the running burn's colour for the minute its verdict
    stays on the row; it reads as still burning."""
    app = replay_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)  # GPU 2 of gpu-a01 burning
        await rows_view(pilot)
        nodes = app.overview.nodes
        running = style_of(app, "gpu-a01", 2, "BURN")
        assert running.color == nodes._style("nodelist--burn").color
        for state, verdict, cls in (
            ("done", "OK", "nodelist--burn-ended"),
            ("failed", "FAULTY", "nodelist--badge"),
        ):
            burn = {"state": state, "engine": "torch", "errors": 0, "verdict": verdict}
            app.fleet.annotate("gpu-a01", 2, burn=burn)
            await until(pilot, lambda: not app.store.pending and not app._flush_scheduled)
            await pilot.pause()
            ended = style_of(app, "gpu-a01", 2, f"BURN {state}")
            assert ended.color != running.color, state
            assert ended.color == nodes._style(cls).color, state
