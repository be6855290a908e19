"""Does a GEMM's rate depend on its operands? A bare ``matmul(out=)`` loop on three kinds of
operands, alternated, with the GPU's power and SM clock while each runs.

    PYTHONPATH=$PWD python3 benchmarks/burn_operands.py [--dtype bf16 tf32] [--seconds 10]
                                                         [--rounds 2] [--size 8192]

Operands: ``rand`` (uniform in [0, 1): what benchmarks/burn_rate.py's bare loop uses), ``randn``
(Gaussian, zero mean) and ``burner`` (a Gaussian A times the burner's random orthogonal Q, what
``gpuctl.workloads.burn`` multiplies). On a GPU near its power limit, operands whose bits toggle
more draw more power per GEMM, the clock drops to stay under the cap, and the rate with it: a
burner that runs slower than a bare loop on ``rand`` may only be drawing more power. Prints, per
dtype and kind, TFLOP/s, mean power and SM clock (NVML, sampled every 0.1 s), and the rates as a
ratio of ``rand``'s. Needs CUDA; ``--device cpu`` runs the same loop (no power) as a check.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from benchmarks import burn_rate  # noqa: E402

DTYPES = burn_rate.TORCH_DTYPES


class PowerWatch:
    """Mean power (W) and SM clock (MHz) of GPU 0 while ``with`` runs (NVML; None without)."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml: Any = pynvml
            self._h = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:
            self._nvml = None

    def _run(self) -> None:
        n = self._nvml
        while not self._stop.wait(0.1):
            watts = n.nvmlDeviceGetPowerUsage(self._h) / 1000.0
            mhz = float(n.nvmlDeviceGetClockInfo(self._h, n.NVML_CLOCK_SM))
            self.samples.append((watts, mhz))

    def __enter__(self) -> PowerWatch:
        self.samples.clear()
        self._stop.clear()
        if self._nvml is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._nvml is not None:
            self._thread.join()

    def means(self) -> tuple[float | None, float | None]:
        if not self.samples:
            return None, None
        return (
            statistics.fmean(s[0] for s in self.samples),
            statistics.fmean(s[1] for s in self.samples),
        )


def run(kind: str, size: int, dtype: str, dev: Any, seconds: float, watch: PowerWatch) -> tuple:
    a, b = burn_rate.operands(kind, size, dtype, dev)
    c = torch.empty_like(a)
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    for _ in range(3):
        torch.matmul(a, b, out=c)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    n = 0
    with watch:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for _ in range(8):
                torch.matmul(a, b, out=c)
            n += 8
            if dev.type == "cuda":
                torch.cuda.synchronize()
        span = time.perf_counter() - t0
    del a, b, c
    tflops = 2.0 * size**3 * n / span / 1e12
    return (tflops, *watch.means())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", nargs="+", default=["bf16", "tf32"], choices=sorted(DTYPES))
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    dev = torch.device(args.device)
    watch = PowerWatch()
    kinds = ("rand", "randn", "burner")
    for dtype in args.dtype:
        got: dict[str, list[tuple]] = {k: [] for k in kinds}
        for r in range(args.rounds):
            for kind in kinds:
                tf, w, mhz = run(kind, args.size, dtype, dev, args.seconds, watch)
                got[kind].append((tf, w, mhz))
                power = f"{w:5.0f} W {mhz:5.0f} MHz" if w is not None else "(no NVML)"
                print(f"{dtype} #{r + 1} {kind:7s} {tf:9.2f} TFLOP/s  {power}", flush=True)
        base = statistics.median(x[0] for x in got["rand"])
        for kind in kinds:
            med = statistics.median(x[0] for x in got[kind])
            print(
                f"RESULT {dtype} {kind:7s} {med:9.2f} TFLOP/s = {med / base:.3f}x rand", flush=True
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
