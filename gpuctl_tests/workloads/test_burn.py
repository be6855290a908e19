"""The torch burner on the CPU: real torch, real subprocesses, tiny matrices."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpuctl.bundle import write_bundle
from gpuctl.workloads import burn
from gpuctl_tests.helpers import REPO, need_torch, node_env

# real burners (or stops of every burner of this user here): these modules share one worker
pytestmark = pytest.mark.burners

torch = need_torch(module=True)

# One thread: the CI machine is small and shared, and tiny GEMMs only lose from threading.
ENV = node_env({"OMP_NUM_THREADS": "1"})


def run_burner(
    *args: str, timeout: float = 60, env: dict[str, str] | None = None, cwd: str | None = None
) -> tuple[int, list[dict[str, Any]], str]:
    proc = subprocess.run(
        [sys.executable, "-m", "gpuctl.workloads.burn", "--device", "cpu", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env or ENV,
        cwd=cwd,
    )
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    return proc.returncode, lines, proc.stderr


def of_type(lines: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [m for m in lines if m.get("type") == kind]


def test_duration_progress_and_ok_summary() -> None:
    t0 = time.monotonic()
    rc, lines, err = run_burner("--size", "96", "--duration", "1.2")
    assert time.monotonic() - t0 >= 1.2
    assert rc == 0, err
    progress = of_type(lines, "progress")
    assert progress, lines
    summary = lines[-1]
    assert summary["type"] == "summary"
    assert summary["verdict"] == "OK" and summary["errors"] == 0
    assert summary["size"] == 96 and summary["dtype"] == "fp32"
    assert summary["iterations"] > 0 and summary["tflops_mean"] > 0
    # The figures cover the checked rounds: the duration less the reference round.
    assert summary["elapsed"] > 0 and summary["iterations"] > 0
    assert 0.5 < summary["duty"] <= 1.0
    for p in progress:
        for key in ("iterations", "tflops", "tflops_mean", "errors", "elapsed", "size", "dtype"):
            assert key in p
    # Iteration counts only grow.
    counts = [p["iterations"] for p in progress]
    assert counts == sorted(counts)


def test_inject_error_is_caught_as_faulty() -> None:
    rc, lines, err = run_burner("--size", "64", "--duration", "0.8", "--inject-error", "1")
    summary = lines[-1]
    assert rc == 1, err
    assert summary["verdict"] == "FAULTY"
    assert summary["errors"] >= 1
    assert "differ bit for bit from the reference" in summary["reason"]


def test_out_of_memory_falls_back_to_a_smaller_size() -> None:
    # 512x512 fp32 with its buffers needs ~7.6 MB: a 3 MB budget forces two fallbacks.
    rc, lines, err = run_burner("--size", "512", "--mem-budget", "3M", "--duration", "0.5")
    assert rc == 0, err
    infos = [m["message"] for m in of_type(lines, "info")]
    assert any("out of memory at 512x512" in m for m in infos), infos
    summary = lines[-1]
    assert summary["oom_fallbacks"] >= 1
    assert summary["size"] < 512
    assert burn.buffer_bytes(summary["size"], summary["slots"], "fp32") <= 3 << 20
    assert summary["verdict"] == "OK"


def test_out_of_memory_at_every_size_dies_with_a_reason() -> None:
    rc, lines, _ = run_burner("--size", "256", "--mem-budget", "1K", "--duration", "0.5")
    assert rc == burn.EXIT_DIED
    assert lines[-1]["verdict"] == "DIED"
    assert "out of memory" in lines[-1]["reason"]


def test_sigterm_stops_with_a_summary() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuctl.workloads.burn", "--device", "cpu", "--size", "64"],
        stdout=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    try:
        assert proc.stdout is not None
        first = None
        for line in proc.stdout:
            msg = json.loads(line)
            if msg["type"] == "progress":
                first = msg
                break
        assert first is not None
        proc.send_signal(signal.SIGTERM)
        rest = [json.loads(line) for line in proc.stdout]
        assert proc.wait(10) == 0
    finally:
        proc.kill()
        proc.wait()
    assert rest[-1]["type"] == "summary"
    assert rest[-1]["stopped_by"] == "SIGTERM"
    assert rest[-1]["verdict"] == "OK"
    assert rest[-1]["iterations"] >= first["iterations"]


def test_cuda_without_a_gpu_dies_with_one_clear_reason() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    proc = subprocess.run(
        [sys.executable, "-m", "gpuctl.workloads.burn", "--device", "cuda", "--duration", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        env=ENV,
    )
    assert proc.returncode == burn.EXIT_DIED
    summary = json.loads(proc.stdout.splitlines()[-1])
    assert summary["verdict"] == "DIED" and "no CUDA device" in summary["reason"]
    assert "Traceback" not in proc.stderr


def test_bad_usage_is_one_line() -> None:
    rc, _, err = run_burner("--mem-fraction", "3")
    assert rc == 2
    assert "--mem-fraction" in err.strip().splitlines()[-1]
    assert "Traceback" not in err


def test_runs_from_the_node_bundle_through_zipimport(tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(bundle), OMP_NUM_THREADS="1")
    where = subprocess.run(
        [sys.executable, "-c", "import gpuctl.workloads.burn as b; print(b.__file__)"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=True,
    ).stdout.strip()
    assert where.startswith(str(bundle) + os.sep), where  # not the checkout
    rc, lines, err = run_burner("--size", "64", "--duration", "0.4", env=env, cwd=str(tmp_path))
    assert rc == 0, err
    assert lines[-1]["verdict"] == "OK"


# -- in-process: the check itself ---------------------------------------------------------
def make_burner(dtype: str, size: int = 64) -> burn.Burner:
    args = argparse.Namespace(
        device="cpu",
        dtype=dtype,
        size=size,
        slots=2,
        mem_budget=None,
        mem_fraction=0.9,
        gpu=None,
        gemms_per_round=3,
        inject_error=None,
    )
    b = burn.Burner(torch, args, lambda _msg: None)
    b.allocate()
    b.gemms(b.slots[0], 3)
    b.set_reference(b.slots[0], 3)
    return b


@pytest.mark.parametrize("dtype", burn.DTYPES)
def test_repeated_product_matches_and_corruption_does_not(dtype: str) -> None:
    b = make_burner(dtype)
    slot = b.slots[1]
    b.gemms(slot, 3)
    assert b.check(slot) == 0  # the same computation reproduces
    slot.view(-1)[5] = float("nan")
    slot.view(-1)[9] = float("inf")
    assert b.check(slot) == 2  # NaN and Inf fail the comparison
    assert b.nonfinite == 2
    b.gemms(slot, 3)
    assert b.check(slot) == 0
    slot.view(-1)[7] = b.ref.view(-1)[7] * 1.5 + 3
    assert b.check(slot) == 1


# The check before bits were compared: |S - R| <= rtol * (|R| + mean|R|) per element.
OLD_RTOL = {"fp64": 1e-9, "fp32": 1e-4, "tf32": 5e-3, "bf16": 3e-2, "fp16": 5e-3}


def old_tolerance_accepts(slot: Any, ref: Any, dtype: str) -> bool:
    thresh = (ref.abs() + ref.abs().mean(dtype=torch.float32)) * OLD_RTOL[dtype]
    return bool(((slot - ref).abs() <= thresh).all())


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_a_one_percent_error_is_found_that_a_tolerance_missed(dtype: str) -> None:
    b = make_burner(dtype)
    slot = b.slots[1]
    b.gemms(slot, 3)
    assert b.check(slot) == 0  # the same GEMMs on the same inputs: the same bits
    # 1 % off in one element (the smallest: a tolerance scaled by the values hides it best)
    flat = slot.view(-1)
    i = int(flat.abs().float().masked_fill(flat == 0, float("inf")).argmin())
    flat[i] = (flat[i].double() * 1.01).to(flat.dtype)
    assert old_tolerance_accepts(slot, b.ref, dtype)  # the old check would have missed it
    assert b.check(slot) == 1


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_the_burner_reports_a_one_percent_error_as_faulty(dtype: str) -> None:
    # The test-only seam: round 1's result, 1 % off in its element of smallest magnitude.
    rc, lines, err = run_burner(
        "--size", "64", "--duration", "0.8", "--dtype", dtype,
        "--inject-error", "1", "--inject-relative", "0.01",
    )  # fmt: skip
    summary = lines[-1]
    assert rc == 1 and summary["verdict"] == "FAULTY" and summary["errors"] == 1, (lines, err)
    assert summary["reason"] == (
        "cpu: 1 element(s) of its results differ bit for bit from the reference (64x64 per round)"
    )
    rc, lines, err = run_burner("--size", "64", "--duration", "0.8", "--dtype", dtype)
    assert rc == 0 and lines[-1]["verdict"] == "OK" and lines[-1]["errors"] == 0, (lines, err)


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_a_one_percent_error_in_any_product_of_a_round_reaches_the_checked_result(
    dtype: str,
) -> None:
    """Each product is the next one's input (written with beta=0, never accumulated): 1 % off
    in one element of any product of the chain, not only the last, changes the checked bits."""
    b = make_burner(dtype)
    slot = b.slots[1]
    for bad in range(3):  # make_burner's reference is a chain of 3

        def tamper(i: int, product: Any, bad: int = bad) -> None:
            if i == bad:
                flat = product.view(-1)
                j = flat.numel() // 2 + 3
                flat[j] = (flat[j].double() * 1.01).to(flat.dtype)

        b.gemms(slot, 3, tamper=tamper)
        assert b.check(slot) >= 1, bad
    b.gemms(slot, 3)
    assert b.check(slot) == 0  # untouched, the chain reproduces the reference


def test_the_first_gemm_comes_before_the_result_slots_are_all_allocated() -> None:
    rc, lines, err = run_burner("--size", "64", "--slots", "40", "--duration", "1")
    assert rc == 0, err
    infos = of_type(lines, "info")
    first = infos[0]["message"]
    assert "40 result slots (2 before the first GEMM, the rest as it burns)" in first
    startup = infos[1]["startup"]
    assert infos[1]["message"].startswith("first GEMM done ")
    assert 0 < startup["torch"] <= startup["device"] <= startup["buffers"] <= startup["first_gemm"]
    assert lines[-1]["slots"] == 40 and lines[-1]["verdict"] == "OK"


def test_a_gpus_fault_names_the_gpu() -> None:
    b = make_burner("fp32")
    assert b.where() == "cpu"
    b.cuda, b.name = True, "NVIDIA H100 80GB HBM3"  # the only GPU-dependent part: the label
    b.args.gpu = "GPU-5718a1c0-0000-4000-8000-000000000001"
    assert b.where() == "GPU GPU-5718a1c0-0000-4000-8000-000000000001 (NVIDIA H100 80GB HBM3)"


def test_plan_sizes_from_a_budget() -> None:
    size, slots = burn.plan(8192, 1 << 30, "bf16", None)
    assert burn.buffer_bytes(size, slots, "bf16") <= 1 << 30
    assert size == 8192 or burn.buffer_bytes(size, 1, "bf16") <= 1 << 30
    assert slots >= 1
    size, slots = burn.plan(8192, 64 << 20, "fp32", None)
    assert size < 8192 and burn.buffer_bytes(size, slots, "fp32") <= 64 << 20
    with pytest.raises(burn.OutOfMemory):
        burn.plan(8192, 1000, "fp32", None)
    assert burn.parse_bytes("2G") == 2 << 30
    assert burn.parse_bytes("512MiB") == 512 << 20
    assert burn.parse_bytes("4096") == 4096
    with pytest.raises(ValueError):
        burn.parse_bytes("lots")


def test_importing_the_burner_does_not_import_torch() -> None:
    # torch is imported in main(): `--help` and argument errors answer without its start-up.
    out = subprocess.run(
        [sys.executable, "-c", "import sys, gpuctl.workloads.burn; print('torch' in sys.modules)"],
        capture_output=True,
        text=True,
        env=node_env(),
        cwd=REPO,
        check=True,
    ).stdout.strip()
    assert out == "False"


class NeverReadyClock(burn.Clock):
    """Host timing that claims no round is finished until waited for, like CUDA events of a
    busy GPU: the burner must keep PIPELINE_DEPTH rounds queued and read errors late."""

    def __init__(self) -> None:
        self.waited = 0

    def ready(self, mark: Any) -> bool:
        return False

    def wait(self, mark: Any) -> None:
        self.waited += 1


def test_deferred_error_counting_as_on_cuda() -> None:
    args = argparse.Namespace(
        device="cpu",
        dtype="fp32",
        size=64,
        slots=3,
        mem_budget=None,
        mem_fraction=0.9,
        gpu=None,
        gemms_per_round=4,
        inject_error=3,
    )
    progress: list[dict[str, Any]] = []
    b = burn.Burner(torch, args, progress.append)
    b.deferred = True  # the CUDA path: counts on the device, copies back, reads when retired
    clock = b.clock = NeverReadyClock()
    b.allocate()
    calls: list[int] = []
    gemms = b.gemms

    def counted(out: Any, k: int, give_up: Any = None) -> int:
        calls.append(k)
        return gemms(out, k)

    b.gemms = counted  # type: ignore[method-assign]
    b.run(lambda: len(calls) >= 8, None)  # a warm-up call, then rounds 0..6
    assert b.errors == 1  # the one corrupted element of round 3, read back from err_host
    assert b.iterations == 4 * 6  # rounds 1..6 are counted, round 0 is the reference
    assert clock.waited == 1 + 7  # the first GEMM, then every round once, none skipped
    assert progress[-1]["errors"] == 1
