"""Trouble log benchmark: what watching a fleet costs each sample it publishes.

The trouble log (``gpuctl.fleet.troublelog``) listens to every snapshot the fleet publishes (a
node's state, its GPUs' ECC and remap counts) and to its events. This times the fleet's own
sample path (``Fleet._on_sample``: throttle reasons, history, the snapshot and its listeners)
over a simulated node's samples with their slow readings (``SimReader``, decoded as the fleet
decodes them), without and with a ``TroubleLog`` watching, alternating the two ``--rounds``
times in this process (on a shared machine only alternated runs compare). Prints the median
microseconds of CPU (``time.process_time``) per sample of each and with/without.

Usage: python benchmarks/troublelog_cost.py [--gpus 8] [--samples 900] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpuctl.fleet.fleet import Fleet
from gpuctl.fleet.links import ThreadSimLink
from gpuctl.fleet.session import Sample, decode_sample
from gpuctl.fleet.troublelog import TroubleLog
from gpuctl.node.readers.sim import SimReader


def samples(gpus: int, n: int) -> list[Sample]:
    now = [0.0]
    reader = SimReader.from_spec(f"{gpus}:H100", seed=1, clock=lambda: now[0])
    out = []
    for i in range(n):
        now[0] = float(i)
        msg = {"type": "sample", "t": float(i), "gpus": reader.sample(slow=True)}
        out.append(decode_sample(msg))
    return out


def per_sample_us(data: list[Sample], watched: bool) -> float:
    fleet = Fleet({"n": ThreadSimLink("1")})
    if watched:
        TroubleLog(None).watch(fleet)
    rt = fleet.nodes["n"]
    start = time.process_time()
    for sample in data:
        fleet._on_sample(rt, sample)
    return (time.process_time() - start) / len(data) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--samples", type=int, default=900)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    data = samples(args.gpus, args.samples)
    without: list[float] = []
    with_log: list[float] = []
    for _ in range(args.rounds):
        without.append(per_sample_us(data, False))
        with_log.append(per_sample_us(data, True))
    a, b = statistics.median(without), statistics.median(with_log)
    print(f"{args.gpus} GPUs, {args.samples} samples, {args.rounds} rounds alternated")
    print(f"without the trouble log: {a:.1f} us per sample (median)")
    print(f"with the trouble log:    {b:.1f} us per sample (median)")
    print(f"with/without: {b / a:.3f}")


if __name__ == "__main__":
    main()
