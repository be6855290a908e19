"""The whole terminal (issue 26 §3): node headers whose driver and CUDA show at 120 columns,
rows that grow on a wide terminal, and a narrow one that drops the repeated model first."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuctl.tui.view import BAR_FULL
from gpuctl.tui.widgets.overview import GpuColumns
from gpuctl_tests.tui.conftest import replay_app, settle
from gpuctl_tests.tui.test_usability import row_text


def head_text(app: object, node: str) -> str:
    """A node's header as painted: one line, or two joined."""
    nodes = app.overview.nodes  # type: ignore[attr-defined]
    ys = [i for i, ln in enumerate(nodes.lines) if ln.node == node and ln.kind.startswith("head")]
    nodes.scroll_to(y=ys[0], animate=False, immediate=True)
    top = int(nodes.scroll_offset.y)
    return "\n".join(nodes.render_line(y - top).text.rstrip() for y in ys)


@pytest.mark.parametrize("size", [(80, 24), (120, 40), (200, 60)])
async def test_every_header_shows_driver_and_cuda(tmp_path: Path, size: tuple[int, int]) -> None:
    """At 120 columns one header line was cut before the driver on every node."""
    app = replay_app(tmp_path)
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        for node in ("gpu-a01", "gpu-b02"):
            head = head_text(app, node)
            assert "driver 550.54.15" in head and "CUDA 12.4" in head, head
            assert "4× H100 80GB HBM3" in head or "2× A100" in head, head  # the model, once
            if size[0] >= 120:  # the host's load shows whole too
                assert "net ↓" in head and "↑" in head.split("net ↓")[1], head
        assert len(head_text(app, "gpu-a01").splitlines()) == (1 if size[0] >= 190 else 2)
        assert len(head_text(app, "gpu-c03").splitlines()) == 1  # nothing to say on a second


async def test_a_wide_terminal_grows_the_bars_and_the_headers_unfold(tmp_path: Path) -> None:
    """At 200 columns the bars stayed 8 cells wide and ~45% of the screen was empty."""
    app = replay_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        narrow = row_text(app, "gpu-a01", 2)  # 100% busy: its utilization bar is full
        assert narrow.split("100%")[0].count(BAR_FULL) == 8
        await pilot.resize_terminal(200, 60)
        await pilot.pause()
        wide = row_text(app, "gpu-a01", 2)
        assert wide.split("100%")[0].count(BAR_FULL) >= 16, wide
        assert len(wide.rstrip()) > 0.75 * 200, wide
        assert len(head_text(app, "gpu-a01").splitlines()) == 1
        titles = str(app.overview.query_one(GpuColumns).render())
        assert titles.index("MEMORY") - titles.index("UTIL") >= 16 + 7, titles
        await pilot.resize_terminal(120, 40)
        await pilot.pause()
        assert len(head_text(app, "gpu-a01").splitlines()) == 2


async def test_80_columns_drop_the_repeated_model_before_the_user(tmp_path: Path) -> None:
    app = replay_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        row = row_text(app, "gpu-a01", 0)
        assert "H100" not in row and "job 48213 alice" in row, row
        titles = str(app.overview.query_one(GpuColumns).render())
        assert "MODEL" not in titles and "UTIL" in titles
        assert "H100" in head_text(app, "gpu-a01")
