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
    assert "below its median of the last 2 healthy run(s)" in found[0].describe()
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


def run_report(
    t: float,
    bf16: dict[str, float],
    *,
    verdict: str = "PASS",
    busbw: tuple[float, int, int] | None = None,
    dtypes: tuple[str, ...] = ("bf16",),
    uuids: tuple[str, ...] = (),
) -> dict[str, Any]:
    """A report with one bf16 figure per GPU label, busbw (GB/s, GPUs, nodes), and the GPUs
    [ENV] listed (their UUIDs, in index order)."""
    sections: dict[str, Any] = {
        "env": {"gpus": [{"index": i, "uuid": u} for i, u in enumerate(uuids)]},
        "compute": {
            "verdict": "PASS",
            "devices": [
                {"label": label, "results": [{"dtype": "bf16", "tflops": v}]}
                for label, v in bf16.items()
            ],
        },
    }
    if busbw is not None:
        sections["ddp_allreduce"] = {
            "busbw_gbps": busbw[0],
            "world_size": busbw[1],
            "nnodes": busbw[2],
        }
    return {
        "started": 1000.0 + t,
        "device": "cuda",
        "quick": False,
        "verdict": verdict,
        "options": {"dtypes": list(dtypes)},
        "sections": sections,
    }


def test_a_slowly_degrading_gpu_fails_naming_the_gpu_and_the_figure(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.sqlite")
    for t, v in enumerate((100.0, 97.0, 94.0, 91.0)):  # 3 % a run: each step is under 10 %
        assert store.record("gpu07", run_report(t, {"gpu0": 500.0, "gpu3": v})) == []
    (found,) = store.record("gpu07", run_report(4, {"gpu0": 500.0, "gpu3": 88.0}))
    assert (found.key, found.kind, found.reference) == ("compute/gpu3/bf16", "falling", 100.0)
    assert found.describe() == (
        "gpu07 compute/gpu3/bf16: 88 TFLOP/s is 12% below 100 4 healthy runs ago, "
        "falling at every run"
    )
    # The degraded run is not healthy: the bar stays where the healthy runs put it.
    (found,) = store.record("gpu07", run_report(5, {"gpu0": 500.0, "gpu3": 85.0}))
    assert (found.kind, found.reference) == ("median", 95.5)  # median of 100, 97, 94, 91
    assert "below its median of the last 4 healthy run(s) (95.5)" in found.describe()


def test_failed_runs_are_not_part_of_the_baseline(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.sqlite")
    store.record("n1", run_report(0, {"gpu0": 100.0}))
    store.record("n1", run_report(1, {"gpu0": 50.0}, verdict="FAIL"))
    store.record("n1", run_report(2, {"gpu0": 50.0}, verdict="FAIL"))
    (found,) = store.record("n1", run_report(3, {"gpu0": 85.0}))
    assert (found.reference, found.runs) == (100.0, 1)


def test_busbw_is_compared_within_one_topology(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.sqlite")
    store.record("n1", run_report(0, {}, busbw=(100.0, 8, 1)))
    assert store.record("n1", run_report(1, {}, busbw=(30.0, 2, 1))) == []  # 2 GPUs, not 8
    assert store.record("n1", run_report(2, {}, busbw=(60.0, 8, 2))) == []  # across 2 nodes
    (found,) = store.record("n1", run_report(3, {}, busbw=(80.0, 8, 1)))
    assert (found.key, found.reference) == ("ddp/busbw/8gpu-1node", 100.0)


def test_a_gpu_that_vanished_is_a_failure_not_a_gap(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.sqlite")
    eight = {f"gpu{i}": 700.0 for i in range(8)}
    store.record("gpu07", run_report(0, eight, uuids=tuple(f"GPU-{i}" for i in range(8))))
    # The GPU with index 3 fell off the bus: torch numbers the other seven 0-6.
    seven = {f"gpu{i}": 700.0 for i in range(7)}
    left = tuple(f"GPU-{i}" for i in (0, 1, 2, 4, 5, 6, 7))
    gone, missing = store.record("gpu07", run_report(1, seven, uuids=left))
    assert (gone.key, gone.kind, gone.value, gone.reference) == ("env/gpus", "vanished", 7, 8)
    assert gone.describe() == "gpu07 env/gpus: 7 GPUs, 8 in the last healthy run; gone: gpu3 GPU-3"
    assert (missing.key, missing.kind, missing.value) == ("compute/gpu7/bf16", "missing", 0.0)
    assert missing.describe() == (
        "gpu07 compute/gpu7/bf16: no figure in this run (the GPU or its result is gone); "
        "700 TFLOP/s in the last 1 healthy run(s)"
    )
    assert store.runs("gpu07")[0].degradations[0]["detail"] == "gpu3 GPU-3"
    # A dtype not asked for this time is not missing.
    assert store.record("n2", run_report(0, eight)) == []
    assert store.record("n2", run_report(1, {}, dtypes=("fp16",))) == []
