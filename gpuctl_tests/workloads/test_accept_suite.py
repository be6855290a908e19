"""The whole acceptance suite, for real, on the CPU: torch, torchrun with gloo, the report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuctl.workloads.accept.schema import MARKERS, SCHEMA, SCHEMA_VERSION, SECTIONS
from gpuctl_tests.helpers import node_env

pytest.importorskip("torch")


def run_suite(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuctl.workloads.accept", *args],
        capture_output=True,
        text=True,
        env=node_env(),
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def only_report(folder: Path) -> dict[str, Any]:
    files = list(folder.glob("*.json"))
    assert len(files) == 1, files
    report: dict[str, Any] = json.loads(files[0].read_text())
    return report


@pytest.mark.slow
def test_quick_cpu_suite_passes_with_every_section_and_figure(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    r = run_suite(
        "--device", "cpu", "--quick", "--report-dir", str(tmp_path / "r"), "--events", str(events)
    )
    lines = r.stdout.strip().splitlines()
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert lines[-1] == "[RESULT] SUCCESS"
    for marker in set(MARKERS.values()):
        assert any(ln.startswith(f"[{marker}]") for ln in lines), marker
    assert any(ln.startswith("[PCIE] SKIP") for ln in lines)  # clearly a SKIP on the CPU

    report = only_report(tmp_path / "r")
    assert (report["schema"], report["schema_version"]) == (SCHEMA, SCHEMA_VERSION)
    assert report["verdict"] == "PASS" and report["failures"] == []
    assert set(report["sections"]) == set(SECTIONS)
    for name, section in report["sections"].items():
        assert section["verdict"] in ("PASS", "SKIP"), (name, section)
    secs = report["sections"]
    fp32 = secs["compute"]["devices"][0]["results"][0]
    assert fp32["dtype"] == "fp32" and fp32["tflops"] > 0 and fp32["check"] is None
    assert secs["membw"]["devices"][0]["gbps"] > 0
    assert secs["train"]["devices"][0]["drop"] >= 0.5
    ar = secs["ddp_allreduce"]
    n = ar["world_size"]
    assert n == 2 and ar["backend"] == "gloo"
    assert ar["algbw_gbps"] > 0
    assert ar["busbw_gbps"] == pytest.approx(ar["algbw_gbps"] * 2 * (n - 1) / n)
    assert [x["mismatches"] for x in ar["ranks"]] == [0, 0]
    assert ar["iters"] > 2  # several refilled collectives, the first one untimed
    dt = secs["ddp_train"]
    assert dt["params_identical"] is True
    assert all(x["drop"] >= 0.5 for x in dt["ranks"]) and len(dt["ranks"]) == 2
    assert secs["health"]["verdict"] == "SKIP"

    progress = [json.loads(ln) for ln in events.read_text().splitlines()]
    ends = {e["section"]: e["verdict"] for e in progress if e.get("state") == "end"}
    assert ends == {name: s["verdict"] for name, s in report["sections"].items()}
    assert progress[-1]["event"] == "result" and progress[-1]["verdict"] == "PASS"


@pytest.mark.slow
def test_a_broken_rank_fails_the_all_reduce_and_the_suite(tmp_path: Path) -> None:
    skip = ["--skip", "compute", "--skip", "membw", "--skip", "train"]
    r = run_suite(
        "--device", "cpu", "--quick", "--report-dir", str(tmp_path), "--test-break-rank", "1", *skip
    )
    last = r.stdout.strip().splitlines()[-1]
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    assert last.startswith("[RESULT] FAILURE: [")
    failures = json.loads(last.split(": ", 1)[1])
    assert any("all-reduce rank 0" in f for f in failures)
    ar = only_report(tmp_path)["sections"]["ddp_allreduce"]
    assert ar["verdict"] == "FAIL"
    # Every rank receives the wrong sum, in every iteration, at the corrupted element only.
    assert [x["mismatches"] for x in ar["ranks"]] == [ar["iters"], ar["iters"]]
    assert ar["ranks"][0]["first_bad"]["index"] == ar["numel"] // 2


def test_no_gpu_fails_unless_allowed(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    r = run_suite("--quick", "--report-dir", str(tmp_path / "a"))
    assert r.returncode == 1
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("[RESULT] FAILURE") and "no GPU found" in last
    assert only_report(tmp_path / "a")["sections"]["env"]["verdict"] == "FAIL"

    r = run_suite("--quick", "--allow-no-gpu", "--report-dir", str(tmp_path / "b"))
    assert r.returncode == 0
    assert "[ENV] SKIP" in r.stdout
    assert r.stdout.strip().splitlines()[-1] == "[RESULT] SUCCESS"
    sections = only_report(tmp_path / "b")["sections"]
    assert {s["verdict"] for s in sections.values()} == {"SKIP"}
