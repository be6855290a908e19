"""The interconnect stages run for real on the CPU: the all-reduce/all-gather size sweep over
torchrun and gloo (nccl-tests' table, floors per topology) and the pair bandwidth matrix."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from gpuctl_tests.helpers import need_torch
from gpuctl_tests.workloads.test_accept_suite import only_report, run_suite

need_torch(module=True)

ONLY_DDP = ("--skip", "compute", "--skip", "membw", "--skip", "train", "--skip", "ddp_train")
ONLY_P2P = (*ONLY_DDP, "--skip", "ddp_allreduce")
ROW = re.compile(r"^\[DDP\] +(\d+) +(\d+) +float +(sum|none) +[\d.]+ +[\d.]+ +[\d.]+ +(\d+)$")


def last_failures(stdout: str) -> list[str]:
    last = stdout.strip().splitlines()[-1]
    if last == "[RESULT] SUCCESS":
        return []
    failures: list[str] = json.loads(last.split(": ", 1)[1])
    return failures


@pytest.mark.slow
def test_the_size_sweep_prints_nccl_tests_rows_and_fails_below_its_topologys_floor(
    tmp_path: Path,
) -> None:
    r = run_suite(
        "--device", "cpu", "--quick", "--report-dir", str(tmp_path), "--sweep-max", "4K",
        "--busbw-floor", "2x1=1000,8x1=1", *ONLY_DDP,
    )  # fmt: skip
    ar: dict[str, Any] = only_report(tmp_path)["sections"]["ddp_allreduce"]
    assert ar["topology"] == "2x1" and ar["world_size"] == 2
    reduce, gather = ar["sweep"]["all_reduce"], ar["sweep"]["all_gather"]
    sizes = [8 << k for k in range(10)]  # 8 B ... 4 KiB
    assert [x["size"] for x in reduce] == sizes and [x["size"] for x in gather] == sizes
    assert [x["count"] for x in reduce] == [s // 4 for s in sizes]
    assert [x["count"] for x in gather] == [s // 8 for s in sizes]  # per rank, 2 ranks
    for x in reduce + gather:
        assert x["wrong"] == 0 and x["time_us"] > 0
        factor = 1.0 if x in reduce else 0.5  # 2(n-1)/n and (n-1)/n for n = 2
        assert x["busbw"] == pytest.approx(x["algbw"] * factor, rel=1e-9)
        assert x["algbw"] == pytest.approx(x["size"] / (x["time_us"] * 1e-6) / 1e9, rel=0.01)
    # the table as nccl-tests prints it, once per collective while [DDP] runs
    rows = [m.groups() for m in map(ROW.match, r.stdout.splitlines()) if m]
    assert [int(g[0]) for g in rows] == sizes + sizes
    assert "# all_gather: 2 ranks (2x1 = GPUs per node x nodes), gloo" in r.stdout
    # 2x1's floor applies (8x1's does not): 1000 GB/s is out of reach on a CPU
    assert ar["busbw_floor_gbps"] == 1000 and r.returncode == 1
    (failure,) = last_failures(r.stdout)
    assert failure == (
        f"all-reduce busbw {reduce[-1]['busbw']:.2f} GB/s at 4096 B over 2x1 (GPUs per node x "
        "nodes) is below its floor 1000 GB/s"
    )
    # and the report printed at the end repeats the table
    tail = r.stdout[r.stdout.index("SECTION ") :]
    assert "# all_reduce: 2 ranks (2x1 = GPUs per node x nodes), gloo" in tail
    assert re.search(r"^ +4096 +1024 +float +sum ", tail, re.M)


def test_every_size_is_checked_and_another_topologys_floor_does_not_apply(
    tmp_path: Path,
) -> None:
    """Rank 1 adds 1 to its middle element: every size's checked collective is off by one
    element (all-reduce: on both ranks; all-gather: rank 1's part, seen by both)."""
    r = run_suite(
        "--device", "cpu", "--quick", "--report-dir", str(tmp_path), "--sweep-max", "64",
        "--busbw-floor", "8x1=1000", "--test-break-rank", "1", *ONLY_DDP,
    )  # fmt: skip
    assert r.returncode == 1, r.stdout[-3000:]
    ar = only_report(tmp_path)["sections"]["ddp_allreduce"]
    assert ar["busbw_floor_gbps"] is None and len(ar["sweep"]["all_reduce"]) == 4
    assert [x["wrong"] for x in ar["sweep"]["all_reduce"]] == [2, 2, 2, 2]
    assert [x["wrong"] for x in ar["sweep"]["all_gather"]] == [2, 2, 2, 2]
    failures = last_failures(r.stdout)
    assert "all_reduce at 8 B: 2 wrong elements" in failures
    assert "all_gather at 64 B: 2 wrong elements" in failures
    assert not any("floor" in f for f in failures)


def test_one_rank_skips_the_all_reduce_and_still_trains(tmp_path: Path) -> None:
    """One rank has no one to all-reduce with: SKIP with the reason (no "busbw 0.000 GB/s"
    PASS, no table of a local copy's bandwidth); DDP training still runs on its one rank."""
    skip = ("--skip", "compute", "--skip", "membw", "--skip", "train")
    r = run_suite(
        "--device", "cpu", "--quick", "--report-dir", str(tmp_path), "--ddp-procs", "1",
        "--sweep-max", "64", *skip,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    sections = only_report(tmp_path)["sections"]
    ar = sections["ddp_allreduce"]
    assert ar["verdict"] == "SKIP" and ar["summary"] == (
        "1 rank: no all-reduce between ranks to check or time"
    )
    assert (ar["world_size"], ar["topology"], ar["busbw_gbps"], ar["sweep"]) == (
        1,
        "1x1",
        None,
        None,
    )
    assert "busbw" not in r.stdout and not any(map(ROW.match, r.stdout.splitlines()))
    train = sections["ddp_train"]
    assert train["verdict"] == "PASS" and train["world_size"] == 1


def test_a_bad_floor_is_one_line() -> None:
    r = run_suite("--device", "cpu", "--busbw-floor", "8 nodes=3", timeout=60)
    assert r.returncode == 2
    assert "--busbw-floor '8 nodes=3': a topology is GPUSxNODES, e.g. 8x2=180" in r.stderr


def test_the_pair_matrix_names_the_odd_pair_out(tmp_path: Path) -> None:
    """Three host buffers stand in for three GPUs; the pair dev2->dev0 copies 8x per step."""
    r = run_suite(
        "--device", "cpu", "--quick", "--report-dir", str(tmp_path / "slow"),
        "--test-p2p-devices", "3", "--test-slow-pair", "2,0", *ONLY_P2P,
    )  # fmt: skip
    p2p = only_report(tmp_path / "slow")["sections"]["p2p"]
    assert p2p["verdict"] == "FAIL" and r.returncode == 1
    pairs = {(p["src"], p["dst"]): p for p in p2p["pairs"]}
    assert len(pairs) == 6 and all(p["data_ok"] for p in pairs.values())
    slow = pairs[("dev2", "dev0")]
    assert slow["fraction"] < 0.3
    assert last_failures(r.stdout) == [
        f"p2p dev2->dev0: {slow['gbps']:.2f} GB/s is {slow['fraction']:.2f} of the median pair "
        f"({p2p['median_gbps']:.2f} GB/s; floor 0.70)"
    ]
    assert re.search(r"^\[P2P\] dev2 +[\d.]+! +[\d.]+ +-$", r.stdout, re.M)

    r = run_suite(
        "--device", "cpu", "--quick", "--report-dir", str(tmp_path / "even"),
        "--test-p2p-devices", "3", *ONLY_P2P,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:]
    assert only_report(tmp_path / "even")["sections"]["p2p"]["verdict"] == "PASS"
