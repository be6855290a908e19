"""Screenshots of each screen and theme over a replayed fleet: clocks frozen, data fixed.

Update after a deliberate change with ``pytest gpuctl_tests/tui --snapshot-update`` and look at
the SVGs before committing them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

from gpuctl_tests.tui.conftest import replay_app, settle

SIZE = (120, 36)
Compare = Callable[..., bool]


def prepare(*keys: str) -> Callable[[Pilot[Any]], Awaitable[None]]:
    async def run_before(pilot: Pilot[Any]) -> None:
        await settle(pilot)
        await pilot.press(*keys)
        await pilot.pause()

    return run_before


@pytest.mark.slow
@pytest.mark.parametrize("theme", ["dark", "light", "high-contrast"])
def test_overview_in_each_theme(snap_compare: Compare, tmp_path: Path, theme: str) -> None:
    """Live, stale and unreachable nodes; throttling, XID, Slurm job and burn badges."""
    app = replay_app(tmp_path, config_tui={"theme": theme})
    assert snap_compare(app, terminal_size=SIZE, run_before=prepare())


@pytest.mark.slow
def test_heatmap(snap_compare: Compare, tmp_path: Path) -> None:
    app = replay_app(tmp_path)
    assert snap_compare(app, terminal_size=SIZE, run_before=prepare("m", "right", "right"))


@pytest.mark.slow
def test_detail(snap_compare: Compare, tmp_path: Path) -> None:
    app = replay_app(tmp_path)
    assert snap_compare(app, terminal_size=SIZE, run_before=prepare("down", "down", "enter"))


@pytest.mark.slow
def test_help(snap_compare: Compare, tmp_path: Path) -> None:
    app = replay_app(tmp_path, read_only=True)
    assert snap_compare(app, terminal_size=SIZE, run_before=prepare("question_mark"))
