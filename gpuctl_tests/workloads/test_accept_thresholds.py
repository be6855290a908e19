"""Floors per GPU model and dtype: shipped defaults, overrides, and a WARN for unknown models."""

from __future__ import annotations

from typing import Any

import pytest

from gpuctl.workloads.accept_suite import peaks
from gpuctl.workloads.accept_suite.sections import compute
from gpuctl.workloads.accept_suite.suite import parse_args


def measured(dtype: str, tflops: float) -> dict[str, Any]:
    return {"dtype": dtype, "tflops": tflops, "peak_tflops": None, "fraction": None}


@pytest.mark.parametrize(
    ("name", "key", "bf16", "membw"),
    [
        ("NVIDIA GH200 480GB", "GH200", 989.0, 4000.0),
        ("NVIDIA GH200 144G HBM3e", "GH200-144", 989.0, 4900.0),
        ("NVIDIA H200 NVL", "H200-NVL", 835.5, 4800.0),
        ("NVIDIA H200", "H200-SXM", 989.0, 4800.0),
    ],
)
def test_gh200_and_h200_nvl_have_their_own_reference(
    name: str, key: str, bf16: float, membw: float
) -> None:
    assert peaks.model_key(name) == key
    assert peaks.peak_tflops(name, "bf16") == bf16
    assert peaks.peak_membw(name) == membw


def test_a_healthy_l40s_passes_with_the_shipped_floors() -> None:
    # An L40S SGEMM reaches about half of the 91.6 dual-issue FP32 figure, bf16 ~0.75 of 362.
    args = parse_args(["--device", "cuda"])
    fp32 = compute.judge_peak(measured("fp32", 45.0), "NVIDIA L40S", args.floors, args.floor)
    bf16 = compute.judge_peak(measured("bf16", 270.0), "NVIDIA L40S", args.floors, args.floor)
    assert (fp32["verdict"], fp32["floor"], fp32["floor_source"]) == (
        "PASS",
        0.35,
        "shipped default",
    )
    assert bf16["verdict"] == "PASS" and bf16["fraction"] == pytest.approx(270 / 362)
    # ... and a sick one still fails, the reason naming the model, the figure and the floor.
    slow = compute.judge_peak(measured("bf16", 150.0), "NVIDIA L40S", args.floors, args.floor)
    assert slow["verdict"] == "FAIL"
    assert "150.0 TFLOP/s is 0.41 of the L40S bf16 peak 362 (floor 0.60" in slow["reason"]


def test_floors_per_model_win_over_one_floor_for_all() -> None:
    args = parse_args(["--device", "cuda", "--floor", "0.3", "--floors", "H100-SXM:bf16=0.8"])
    assert args.floors == {"H100-SXM": {"bf16": 0.8}}
    h100 = "NVIDIA H100 80GB HBM3"
    r = compute.judge_peak(measured("bf16", 700.0), h100, args.floors, args.floor)
    assert r["verdict"] == "FAIL" and r["floor_source"] == "[accept.floors.H100-SXM] bf16"
    r = compute.judge_peak(measured("tf32", 200.0), h100, args.floors, args.floor)
    assert r["verdict"] == "PASS" and (r["floor"], r["floor_source"]) == (0.3, "--floor")


def test_an_unknown_model_is_a_warning_carrying_its_figure() -> None:
    args = parse_args(["--device", "cuda"])
    r = compute.judge_peak(measured("bf16", 123.4), "NVIDIA B200", args.floors, args.floor)
    assert r["verdict"] == "WARN"
    assert "NVIDIA B200: measured 123.4 TFLOP/s, not judged" in r["reason"]


def test_bad_floors_are_one_line_errors(capsys: pytest.CaptureFixture[str]) -> None:
    for spec, why in (
        ("B200:bf16=0.5", "unknown GPU model 'B200'"),
        ("L40S:int4=0.5", "unknown dtype 'int4'"),
        ("L40S:bf16=1.5", "within (0, 1]"),
        ("L40S:bf16=x", "not a fraction"),
    ):
        with pytest.raises(SystemExit) as e:
            parse_args(["--floors", spec])
        assert e.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert "--floors" in err and why in err, err
    assert peaks.parse_floors(peaks.format_floors({"L40S": {"fp32": 0.4}})) == {
        "L40S": {"fp32": 0.4}
    }
