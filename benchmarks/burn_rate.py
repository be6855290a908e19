"""The burner's GEMM rate against a bare matmul loop, its duty cycle, and (on a GPU) its
TFLOP/s as a fraction of the model's dense peak.

    python3 benchmarks/burn_rate.py [--device cpu|cuda] [--size N] [--dtype D] [--seconds S]
                                    [--rounds R] [--json]

In this one process, alternated ``--rounds`` times on the same device, size and dtype:
1. a bare loop ``torch.matmul(a, b, out=c)`` for S seconds (host clock around a synchronize);
2. the burner (``gpuctl.workloads.burn.Burner``: checked rounds, result slots, device events on
   CUDA) for S seconds; its rate is FLOPs over its measured span, and its duty is the share of
   that span spent inside GEMMs.
Prints each pair, the ratios of medians and of best rounds (target >= 0.95) and the median
duty (target >= 0.99).
On CUDA also the fraction of the dense peak of the GPU's model (shared/notes/gpu-peaks.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from gpuctl.workloads import burn  # noqa: E402

# Dense peaks, TFLOP/s: (fp64 tensor, fp32, tf32, bf16/fp16), from shared/notes/gpu-peaks.md.
PEAKS = (
    ("H100 PCIe", (51.0, 51.0, 378.0, 756.0)),
    ("H100", (67.0, 67.0, 494.5, 989.0)),
    ("H200", (67.0, 67.0, 494.5, 989.0)),
    ("A100", (19.5, 19.5, 156.0, 312.0)),
    ("L40S", (1.4, 91.6, 183.0, 362.0)),
    ("A6000", (1.2, 38.7, 77.4, 154.8)),
    ("4090", (1.3, 82.6, 82.6, 165.2)),
    ("V100", (7.8, 15.7, 15.7, 125.0)),
)
TORCH_DTYPES = {
    "fp64": torch.float64,
    "fp32": torch.float32,
    "tf32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}


def peak_for(name: str, dtype: str) -> float | None:
    for key, values in PEAKS:
        if key in name:
            return values[{"fp64": 0, "fp32": 1, "tf32": 2}.get(dtype, 3)]
    return None


def operands(kind: str, size: int, dtype: str, dev: Any) -> tuple[Any, Any]:
    """Two ``size`` x ``size`` operands of one kind, on ``dev`` in ``dtype``: ``rand`` (uniform in
    [0, 1)), ``randn`` (Gaussian) or ``burner`` (a Gaussian A times the burner's orthogonal Q, and
    Q: what every product of a burner's chain multiplies). At a GPU's power cap the kind sets the
    clock: on an H100 bf16 ``rand`` ran at 1,473 MHz and 729 TFLOP/s, ``burner`` at 1,368 MHz and
    680 TFLOP/s, both at ~665 W (docs/measurements/burn_operands-h100-2026-11-26.log)."""
    gen = torch.Generator(device="cpu").manual_seed(7)
    if kind == "rand":
        a, b = torch.rand(size, size, generator=gen), torch.rand(size, size, generator=gen)
    elif kind == "randn":
        a, b = torch.randn(size, size, generator=gen), torch.randn(size, size, generator=gen)
    else:  # the burner's: a chain's every operand is A@Q^k, its other operand Q
        q = burn.orthogonal(torch, size, 11, "cpu")
        a, b = torch.randn(size, size, generator=gen) @ q, q
    return a.to(dev).to(TORCH_DTYPES[dtype]), b.to(dev).to(TORCH_DTYPES[dtype])


def bare_loop(device: str, size: int, dtype: str, seconds: float, kind: str = "rand") -> float:
    """GFLOP/s of back-to-back ``torch.matmul(out=)`` on ``kind`` operands for about
    ``seconds``."""
    dev = torch.device("cuda:0" if device == "cuda" else "cpu")
    a, b = operands(kind, size, dtype, dev)
    c = torch.empty_like(a)

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    torch.matmul(a, b, out=c)  # warm-up
    sync()
    n, batch = 0, 1
    start = time.perf_counter()
    while True:
        for _ in range(batch):
            torch.matmul(a, b, out=c)
        n += batch
        if device == "cuda":
            sync()
        took = time.perf_counter() - start
        if took >= seconds:
            break
        batch = min(batch * 2, max(1, int(n * (seconds - took) / took)) if took > 0 else batch)
    return 2.0 * size**3 * n / took / 1e9


def burner_run(device: str, size: int, dtype: str, seconds: float) -> dict[str, Any]:
    args = argparse.Namespace(
        device=device,
        dtype=dtype,
        size=size,
        slots=None if device == "cuda" else 2,
        mem_budget=None,
        mem_fraction=0.5,
        gpu=None,
        gemms_per_round=None,
        inject_error=None,
    )
    b = burn.Burner(torch, args, lambda _msg: None)
    b.allocate()
    b.run(lambda: False, seconds)
    totals = b.totals()
    b._free()
    return totals


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default=None)
    p.add_argument("--size", type=int, help="default: cpu 1024, cuda 8192")
    p.add_argument("--dtype", choices=burn.DTYPES)
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    size = a.size or (8192 if device == "cuda" else 1024)
    dtype = a.dtype or burn.default_dtype(torch, device)
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    pairs = []
    for i in range(a.rounds):
        bare = bare_loop(device, size, dtype, a.seconds)
        b = burner_run(device, size, dtype, a.seconds)
        pairs.append((bare, b))
        if not a.json:
            print(
                f"round {i + 1}: bare {bare:9.1f} GFLOP/s   burner {b['gflops_mean']:9.1f} "
                f"GFLOP/s   ratio {b['gflops_mean'] / bare:.3f}   duty {b['duty']:.4f}   "
                f"errors {b['errors']}",
                flush=True,
            )
    bare_med = statistics.median(x for x, _ in pairs)
    burn_med = statistics.median(b["gflops_mean"] for _, b in pairs)
    duty_med = statistics.median(b["duty"] for _, b in pairs)
    # On a shared machine the best round of each is the steadier comparison of what the code
    # can do; the medians show what a crowded machine gives.
    bare_best = max(x for x, _ in pairs)
    burn_best = max(b["gflops_mean"] for _, b in pairs)
    result: dict[str, Any] = {
        "device": device,
        "name": name,
        "size": size,
        "dtype": dtype,
        "seconds": a.seconds,
        "threads": torch.get_num_threads(),
        "bare_gflops_median": round(bare_med, 2),
        "burner_gflops_median": round(burn_med, 2),
        "ratio": round(burn_med / bare_med, 4),
        "bare_gflops_best": round(bare_best, 2),
        "burner_gflops_best": round(burn_best, 2),
        "ratio_best": round(burn_best / bare_best, 4),
        "duty_median": duty_med,
        "errors": sum(b["errors"] for _, b in pairs),
        "rounds": [
            {"bare_gflops": round(x, 2), "burner_gflops": b["gflops_mean"], "duty": b["duty"]}
            for x, b in pairs
        ],
    }
    peak = peak_for(name, dtype) if device == "cuda" else None
    if peak:
        result["peak_tflops"] = peak
        result["fraction_of_peak"] = round(burn_med / 1000 / peak, 4)
        result["bare_fraction_of_peak"] = round(bare_med / 1000 / peak, 4)
    if a.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"{name} {size}x{size} {dtype}: burner/bare = {result['ratio']:.3f} of medians, "
            f"{result['ratio_best']:.3f} of best rounds (target >= 0.95); "
            f"duty {duty_med:.4f} (target >= 0.99)"
        )
        if peak:
            print(
                f"burner {burn_med / 1000:.1f} TFLOP/s = {result['fraction_of_peak']:.1%} of the "
                f"{peak:g} TFLOP/s dense peak (bare loop {result['bare_fraction_of_peak']:.1%})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
