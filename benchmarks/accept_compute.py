"""Acceptance COMPUTE figure against a bare matmul loop, and the quick suite's wall time.

    python3 benchmarks/accept_compute.py [--device cpu|cuda] [--rounds 5] [--n N] [--skip-suite]

1. The suite's ``Suite.measure_gemm`` (the code COMPUTE runs: preallocated matrices, warm-up,
   device-event timing on CUDA) and a bare ``torch.mm(a, b, out=c)`` loop timed with the host
   clock around a synchronize, alternated ``--rounds`` times on the same device, dtype and size
   in this one process. Prints each pair, the ratio of medians and of the best rounds
   (target: within 5 %).
2. The wall time of ``python -m gpuctl.workloads.accept_suite --device cpu --quick`` as a user sees
   it (a fresh process: torch import, torchrun with 2 gloo ranks included) and its sections' times.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from gpuctl.workloads.accept_suite.suite import Suite, parse_args  # noqa: E402


def bare_loop(device: torch.device, dtype: torch.dtype, n: int, seconds: float) -> float:
    """TFLOP/s of back-to-back products, host clock around a synchronize."""
    a = torch.rand(n, n, device=device, dtype=torch.float32).sub_(0.5).to(dtype)
    b = torch.rand(n, n, device=device, dtype=torch.float32).sub_(0.5).to(dtype)
    c = torch.empty(n, n, device=device, dtype=dtype)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(2):
        torch.mm(a, b, out=c)
    sync()
    t0 = time.perf_counter()
    torch.mm(a, b, out=c)
    sync()
    iters = max(3, int(seconds / max(time.perf_counter() - t0, 1e-6)))
    t0 = time.perf_counter()
    for _ in range(iters):
        torch.mm(a, b, out=c)
    sync()
    return 2.0 * n**3 * iters / (time.perf_counter() - t0) / 1e12


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--n", type=int, help="matrix size (default: what the quick suite uses)")
    p.add_argument("--seconds", type=float, default=1.0, help="timed seconds per measurement")
    p.add_argument("--skip-suite", action="store_true", help="only the COMPUTE comparison")
    p.add_argument("--threads", type=int, help="torch CPU threads (1 is steadier on a busy box)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    suite = Suite(parse_args(["--device", args.device, "--quick"]), None, torch)
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    n = args.n or suite.gemm_size()
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    print(
        f"COMPUTE vs bare loop: {args.device} {args.dtype} n={n}, {torch.get_num_threads()} "
        f"threads, {args.rounds} rounds of {args.seconds:g} s each"
    )
    ours, bare = [], []
    for i in range(args.rounds):
        r = suite.measure_gemm(device, args.dtype, n, args.seconds)
        assert r["check"] is None, r["check"]
        ours.append(r["tflops"])
        bare.append(bare_loop(device, dtype, n, args.seconds))
        print(
            f"  round {i + 1}: suite {1000 * ours[-1]:9.2f} GFLOP/s   "
            f"bare {1000 * bare[-1]:9.2f} GFLOP/s"
        )
    mo, mb = statistics.median(ours), statistics.median(bare)
    print(
        f"median: suite {1000 * mo:.2f} GFLOP/s, bare {1000 * mb:.2f} GFLOP/s, "
        f"suite/bare = {mo / mb:.3f} (target 0.95..1.05)"
    )
    # On a shared machine other work only ever slows a round down: the best round of each is
    # the least disturbed estimate of what the code itself reaches.
    bo, bb = max(ours), max(bare)
    print(
        f"best:   suite {1000 * bo:.2f} GFLOP/s, bare {1000 * bb:.2f} GFLOP/s, "
        f"suite/bare = {bo / bb:.3f}"
    )

    if not args.skip_suite:
        with tempfile.TemporaryDirectory() as d:
            t0 = time.perf_counter()
            proc = subprocess.run(
                [sys.executable, "-m", "gpuctl.workloads.accept_suite", "--device", "cpu",
                 "--quick", "--report-dir", d, "--report-name", "r.json"],
                capture_output=True, text=True, cwd=REPO,
            )  # fmt: skip
            wall = time.perf_counter() - t0
            last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "(no output)"
            report = json.loads((Path(d) / "r.json").read_text())
        secs = ", ".join(f"{k} {v['seconds']:.1f}" for k, v in report["sections"].items())
        print(f"quick CPU suite: {wall:.1f} s wall, exit {proc.returncode}, {last}")
        print(f"  sections (s): {secs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
