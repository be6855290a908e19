"""GPU history benchmark: a node whose samples keep lacking one GPU against the normal path.

A GPU that fell off the bus leaves the agent's samples (or comes back ``lost``); its node's
history then keeps it as missing at every sample (``NodeHistory.add``). This times ``add`` over
a simulated node's samples (``SimReader``, decoded as the fleet decodes them: data-centre GPUs,
no fan reading) whole, and with one GPU absent from each, alternating the two ``--rounds``
times in this process (on a shared machine only alternated runs compare). Prints the median
microseconds of CPU (``time.process_time``) per sample of each and missing/whole.

Usage: python benchmarks/history_missing_gpu.py [--gpus 8] [--samples 900] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpuctl.core.model import GpuSample
from gpuctl.fleet.gpu_history import NodeHistory
from gpuctl.fleet.session import decode_sample
from gpuctl.node.readers.sim import SimReader


def samples(gpus: int, n: int) -> list[tuple[float, tuple[GpuSample, ...]]]:
    now = [0.0]
    reader = SimReader.from_spec(f"{gpus}:H100", seed=1, clock=lambda: now[0])
    out = []
    for i in range(n):
        now[0] = float(i)
        msg = {"type": "sample", "t": float(i), "gpus": reader.sample(slow=False)}
        out.append((float(i), decode_sample(msg).gpus))
    return out


def per_sample_us(data: list[tuple[float, tuple[GpuSample, ...]]]) -> float:
    """Microseconds of CPU per ``add`` into a fresh node history (its lanes made by the first
    sample, whole, as a node's first sample makes them)."""
    history = NodeHistory()
    t0, first = data[0]
    history.add(t0 - 1, first)
    start = time.process_time()
    for t, gpus in data:
        history.add(t, gpus)
    return (time.process_time() - start) / len(data) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--samples", type=int, default=900)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    whole = samples(args.gpus, args.samples)
    gone = args.gpus // 2  # the GPU that fell off the bus
    full = whole[0][1]
    lacking = [(t, tuple(g for g in gpus if g.index != gone)) for t, gpus in whole]
    lacking[0] = (lacking[0][0], full)  # it was there at first
    runs: dict[str, list[float]] = {"whole": [], "missing": []}
    for _ in range(args.rounds):
        runs["whole"].append(per_sample_us(whole))
        runs["missing"].append(per_sample_us(lacking))
    med = {k: statistics.median(v) for k, v in runs.items()}
    print(f"{args.gpus} GPUs, {args.samples} samples, {args.rounds} alternated rounds")
    print(f"whole sample:          {med['whole']:.1f} us a sample")
    print(f"one GPU missing:       {med['missing']:.1f} us a sample")
    print(f"missing / whole:       {med['missing'] / med['whole']:.2f}x")


if __name__ == "__main__":
    main()
