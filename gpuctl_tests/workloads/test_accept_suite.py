"""The acceptance suite run directly (no agent), for real, on the CPU: failures and exit codes.

The whole passing suite is exercised through ``gpuctl accept --local`` in
``gpuctl_tests/accept/test_cli.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuctl_tests.helpers import need_torch, node_env

need_torch(module=True)


def run_suite(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuctl.workloads.accept_suite", *args],
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


@pytest.mark.slow
def test_a_straggler_rank_is_named_with_its_timing(tmp_path: Path) -> None:
    """Rank 1 does 40 more 256x256 matrix products a step (real work, #43.3): [DDP] training
    names it as the straggler, with its forward time against the other rank's."""
    skip = [
        a for s in ("compute", "membw", "memtest", "train", "pcie", "p2p") for a in ("--skip", s)
    ]
    r = run_suite(
        "--device", "cpu", "--quick", "--report-dir", str(tmp_path), "--test-slow-rank", "1", *skip
    )
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    train = only_report(tmp_path)["sections"]["ddp_train"]
    times = {x["rank"]: x["compute_ms"] for x in train["ranks"]}
    print(f"forward ms a step (median) by rank: {times}")  # a figure
    assert train["verdict"] == "FAIL" and len(train["stragglers"]) == 1
    assert train["stragglers"][0].startswith("rank 1 on ")
    assert "is a straggler" in train["stragglers"][0] and times[1] > 3 * times[0]
    assert "[DDP] rank: forward ms a step (median): 0 " in r.stdout
    assert train["ranks"][0]["ok"] and train["ranks"][1]["ok"]  # the loss still fell on both


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
