"""Acceptance history: figures kept in SQLite, each node compared with its own past."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuctl.accept.history import HistoryStore, figures, sparkline


def report(t: float, tflops: float, busbw: float = 10.0, device: str = "cuda") -> dict[str, Any]:
    return {
        "started": t,
        "device": device,
        "quick": True,
        "verdict": "PASS",
        "sections": {
            "compute": {
                "devices": [
                    {"label": "gpu0", "results": [{"dtype": "bf16", "tflops": tflops}]},
                    {"label": "gpu1", "results": [{"dtype": "bf16", "tflops": None}]},
                ]
            },
            "membw": {"devices": [{"label": "gpu0", "gbps": 3000.0}]},
            "ddp_allreduce": {"busbw_gbps": busbw},
        },
    }


def test_figures_keys_and_units() -> None:
    assert figures(report(1, 700.0)) == {
        "compute/gpu0/bf16": (700.0, "TFLOP/s"),
        "membw/gpu0": (3000.0, "GB/s"),
        "ddp/busbw": (10.0, "GB/s"),
    }


def test_a_drop_beyond_the_threshold_is_a_degradation(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.sqlite")
    assert store.record("n1", report(1, 700.0)) == []  # nothing to compare with yet
    assert store.record("n1", report(2, 690.0)) == []  # 1.4 % lower: noise
    found = store.record("n1", report(3, 560.0, busbw=8.5), threshold=0.10)
    assert [(d.key, round(d.drop, 3)) for d in found] == [
        ("compute/gpu0/bf16", round(1 - 560 / 695, 3)),  # median of 700 and 690
        ("ddp/busbw", 0.15),
    ]
    assert "below its median of the last 2 run(s)" in found[0].describe()
    # Another node, another device kind: compared only with their own kind.
    assert store.record("n2", report(4, 100.0)) == []
    assert store.record("n1", report(5, 0.1, device="cpu")) == []
    assert [r.t for r in store.runs("n1")] == [5, 3, 2, 1]
    assert store.runs("n1")[1].degradations[0]["key"] == "compute/gpu0/bf16"
    assert store.nodes() == ["n1", "n2"]
    series = store.series("n1", "compute/gpu0/bf16", device="cuda")
    assert [v for _, v, _ in series] == [700.0, 690.0, 560.0]


def test_history_lives_in_the_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUCTL_STATE_DIR", str(tmp_path / "st"))
    assert HistoryStore().path == tmp_path / "st" / "accept.sqlite"
    assert (tmp_path / "st").stat().st_mode & 0o777 == 0o700


def test_sparkline_scales_between_min_and_max() -> None:
    assert sparkline([1.0, 2.0, 3.0]) == "▁▄█"
    assert sparkline([5.0, 5.0]) == "▅▅"
    assert sparkline([]) == ""
