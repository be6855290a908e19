"""Agent-side cost of protocol 2's sample shape: CPU to encode one sample line, both shapes.

Runs on the node's Python (standard library only, like the agent):
``~/.pyenv/versions/3.6.15/bin/python -S benchmarks/agent_encode.py``. Builds a sample of
``--gpus`` simulated GPUs (a few samples in: processes, parents, host) and times, alternated
``--rounds`` times, ``protocol.encode`` of it as protocol 1 sent it and as protocol 2 does
(``compact_gpus`` and ``compact_records`` first, as ``Agent.sample``). Prints the median
microseconds of CPU per line and the line lengths.

Usage: python benchmarks/agent_encode.py [--gpus 8] [--rounds 7] [--n 2000]
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gpuctl.node import protocol
from gpuctl.node.readers.sim import SimReader


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--n", type=int, default=2000)
    args = ap.parse_args()
    reader = SimReader.from_spec(f"{args.gpus}:H100", seed=3)
    for _ in range(5):
        reader.sample()
    statics, gpus, parents, host = reader.static(), reader.sample(), reader.parents(), reader.host()

    def protocol1() -> bytes:
        msg = {"type": "sample", "t": 1.0, "seq": 5, "gpus": gpus, "parents": parents, "host": host}
        return protocol.encode(msg)

    def protocol2() -> bytes:
        msg = {
            "type": "sample",
            "t": 1.0,
            "seq": 5,
            "gpus": protocol.compact_gpus(gpus, statics),
            "parents": protocol.compact_records(parents),
            "host": host,
        }
        return protocol.encode(msg)

    cases = (("protocol 1", protocol1), ("protocol 2", protocol2))
    times = {name: [] for name, _ in cases}  # type: dict
    for _ in range(args.rounds):
        for name, encode in cases:
            start = time.process_time()
            for _ in range(args.n):
                encode()
            times[name].append((time.process_time() - start) / args.n * 1e6)
    print(
        f"Python {sys.version.split()[0]}, {args.gpus} GPUs, {args.rounds} alternated rounds of "
        f"{args.n} lines, us of CPU per line (median)"
    )
    for name, encode in cases:
        ts = sorted(times[name])
        print(f"  {name}: {ts[len(ts) // 2]:6.1f} us, {len(encode())} bytes")


if __name__ == "__main__":
    main()
