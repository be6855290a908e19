"""Screenshots of the main screens at 80x24, 120x40 and 200x60 over the replayed fleet: what
fits a small terminal (badges, the burn, the footer) and what a large one adds.

Update after a deliberate change with ``pytest gpuctl_tests/tui --snapshot-update`` and look at
the SVGs before committing them. The 120x40 ones (overview, heatmap, detail) are in the unit
lane too (``pytest.mark.unit``), so a screen's change shows before the full lane.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from gpuctl_tests.tui.conftest import replay_app
from gpuctl_tests.tui.test_snapshots import prepare

Compare = Callable[..., bool]
SIZES = [(80, 24), (120, 40), (200, 60)]
UNIT_AT_120 = [
    pytest.param(size, marks=pytest.mark.unit if size == (120, 40) else pytest.mark.slow)
    for size in SIZES
]


@pytest.mark.parametrize("size", UNIT_AT_120, ids=lambda s: f"{s[0]}x{s[1]}")
def test_overview(snap_compare: Compare, tmp_path: Path, size: tuple[int, int]) -> None:
    assert snap_compare(replay_app(tmp_path), terminal_size=size, run_before=prepare())


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_read_only_overview(snap_compare: Compare, tmp_path: Path, size: tuple[int, int]) -> None:
    """No stress or accept key in the footer."""
    app = replay_app(tmp_path, read_only=True)
    assert snap_compare(app, terminal_size=size, run_before=prepare())


@pytest.mark.parametrize("size", UNIT_AT_120, ids=lambda s: f"{s[0]}x{s[1]}")
def test_heatmap(snap_compare: Compare, tmp_path: Path, size: tuple[int, int]) -> None:
    app = replay_app(tmp_path)
    assert snap_compare(app, terminal_size=size, run_before=prepare("m", "right"))


@pytest.mark.parametrize("size", UNIT_AT_120, ids=lambda s: f"{s[0]}x{s[1]}")
def test_detail(snap_compare: Compare, tmp_path: Path, size: tuple[int, int]) -> None:
    app = replay_app(tmp_path)
    assert snap_compare(
        app, terminal_size=size, run_before=prepare("down", "down", "enter", view="rows")
    )


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_no_match(snap_compare: Compare, tmp_path: Path, size: tuple[int, int]) -> None:
    """A filter that hides every node says so, in the list and the header."""
    app = replay_app(tmp_path)
    keys = ("slash", *"nosuchnode", "enter")
    assert snap_compare(app, terminal_size=size, run_before=prepare(*keys))
