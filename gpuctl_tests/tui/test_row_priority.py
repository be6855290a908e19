"""Issue 39.3: the GPU row that matters lost its words at every width. A burning GPU that
throttles (THERM, PWRCAP) showed ``BURN 705 TF/s 0 err 58m left  bo`` at 200 columns (its owner
cut), ``THERM PWRCAP  BURN 696 TF/s`` at 120 (errors, time left and owner gone) and lost its
owner at 80, while the fan, P-state, video engine and PCIe columns, and a model column that
repeats the node header's one model on every row, took the room. The flags, the burn and the
owner are now the last to give way."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuctl.fleet.fixed_links import RECORDED_BURNER, ReplayLink, recorded_node
from gpuctl.fleet.fleet import Fleet
from gpuctl.tui import make_app
from gpuctl.tui.widgets.gpu_columns import columns_at
from gpuctl_tests.helpers import until
from gpuctl_tests.tui.conftest import NOW, T_LAST
from gpuctl_tests.tui.test_usability import row_text

SAMPLES = 60  # a minute of a GPU loaded as a burn loads it: hot enough to throttle (THERM)


def hot_fleet() -> Fleet:
    t0 = T_LAST - (SAMPLES - 1)  # the last sample is fresh at NOW
    node = recorded_node("gpu-a01", "4:H100", seed=3, t0=t0, samples=SAMPLES, load={2: 1.0})
    return Fleet({"gpu-a01": ReplayLink(node)}, clock=lambda: NOW, stale_after=1e9)


@pytest.mark.parametrize("size", [(80, 24), (120, 40), (200, 60)])
async def test_a_burning_throttled_gpu_keeps_its_flags_burn_and_owner(
    tmp_path: Path, size: tuple[int, int]
) -> None:
    app = make_app(hot_fleet(), clock=lambda: NOW, state_dir=tmp_path)
    async with app.run_test(size=size) as pilot:
        snaps = app.store.snaps
        await until(
            pilot,
            lambda: "gpu-a01" in snaps and snaps["gpu-a01"].last_sample_t == T_LAST,
            "the node's last sample",
        )
        burn = {"state": "running", "tflops": 705.0, "errors": 0, "ends_at": NOW + 58 * 60 + 5}
        app.fleet.annotate("gpu-a01", 2, burn=burn)
        await until(pilot, lambda: "BURN" in row_text(app, "gpu-a01", 2), "the burn on screen")
        row = row_text(app, "gpu-a01", 2)
        for words in ("THERM", "PWRCAP", "BURN", "0 err", "58m left", RECORDED_BURNER[1]):
            assert words in row, (words, row)
        # the node header names its one model; the rows do not repeat it
        assert "H100" not in row
        head = row_text(app, "gpu-a01", None)
        assert "H100" in head


def test_the_optional_columns_give_way_before_the_flags() -> None:
    """The fan, P-state, video engines and PCIe show only where the flags keep their room."""
    for width in range(80, 260):
        cells = columns_at(width)
        used = sum(c.width + len(c.gap) for c in cells[:-1])
        keys = {c.column.key for c in cells}
        if keys & {"fan", "pstate", "enc", "dec", "pcie_tx", "pcie_rx", "sm_clock", "recent"}:
            assert width - used >= 52, (width, keys)
