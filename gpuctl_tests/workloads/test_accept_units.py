"""Pure parts of the acceptance suite: the peak table, the same-model rule, the summary."""

from __future__ import annotations

from typing import Any

import pytest

from gpuctl.workloads.accept_suite import peaks
from gpuctl.workloads.accept_suite.render import summary_table
from gpuctl.workloads.accept_suite.schema import SECTIONS
from gpuctl.workloads.accept_suite.sections import compute
from gpuctl.workloads.accept_suite.suite import parse_args


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("NVIDIA H100 80GB HBM3", "H100-SXM"),
        ("NVIDIA H100 PCIe", "H100-PCIE"),
        ("NVIDIA H200", "H200-SXM"),
        ("NVIDIA A100-SXM4-80GB", "A100-SXM-80"),
        ("NVIDIA A100-SXM4-40GB", "A100-SXM-40"),
        ("NVIDIA A100-PCIE-40GB", "A100-PCIE-40"),
        ("NVIDIA A100 80GB PCIe", "A100-PCIE-80"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA RTX A6000", "RTX-A6000"),
        ("NVIDIA GeForce RTX 4090", "RTX-4090"),
        ("Tesla V100-SXM2-32GB", "V100-SXM2"),
        ("Tesla V100-PCIE-16GB", "V100-PCIE"),
        ("NVIDIA GeForce GTX 1080", None),
    ],
)
def test_model_names_map_to_the_table(name: str, key: str | None) -> None:
    assert peaks.model_key(name) == key


def test_peaks_are_dense_datasheet_figures() -> None:
    assert peaks.peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 989.0  # not the 1979 sparse
    assert peaks.peak_tflops("NVIDIA A100-SXM4-80GB", "tf32") == 156.0
    assert peaks.peak_membw("NVIDIA H200") == 4800.0
    assert peaks.peak_tflops("Tesla V100-SXM2-32GB", "tf32") is None
    assert not peaks.has_unit("Tesla V100-SXM2-32GB", "bf16")
    assert peaks.has_unit("NVIDIA L40S", "bf16")
    assert peaks.pcie_peak(4, 16) == pytest.approx(31.5)
    assert peaks.pcie_peak(None, 16) is None


def _device(label: str, name: str, tflops: float) -> dict[str, Any]:
    return {
        "label": label,
        "name": name,
        "results": [{"dtype": "bf16", "tflops": tflops, "verdict": "PASS", "reason": None}],
    }


def test_a_gpu_ten_percent_below_its_siblings_fails() -> None:
    devices = [
        _device("gpu0", "NVIDIA H100 80GB HBM3", 780.0),
        _device("gpu1", "NVIDIA H100 80GB HBM3", 700.0),  # 10.3 % below gpu0
        _device("gpu2", "NVIDIA H100 80GB HBM3", 705.0),  # 9.6 % below: passes
        _device("gpu3", "NVIDIA L40S", 250.0),  # another model: not compared with the H100s
    ]
    compute.judge_same_model(devices, parse_args(["--device", "cuda"]).same_model_tolerance)
    verdicts = [d["results"][0]["verdict"] for d in devices]
    assert verdicts == ["PASS", "FAIL", "PASS", "PASS"]
    assert "below the best" in devices[1]["results"][0]["reason"]


def test_bad_options_are_one_line_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        parse_args(["--dtypes", "fp32,int4"])
    assert e.value.code == 2
    assert "unknown int4" in capsys.readouterr().err


def test_summary_lists_every_section() -> None:
    report = {"sections": {s: {"verdict": "PASS", "seconds": 1.0, "summary": s} for s in SECTIONS}}
    lines = summary_table(report)
    assert lines[0].split()[:2] == ["SECTION", "VERDICT"]
    assert [ln.split()[0] for ln in lines[1:]] == list(SECTIONS)
