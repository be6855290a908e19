"""Agent-side cost of protocol 2's sample shape: CPU to encode one sample line, and its bytes.

Runs on the node's Python (standard library only, like the agent):
``~/.pyenv/versions/3.6.15/bin/python -S benchmarks/agent_encode.py``. Reads ``--samples``
samples of ``--gpus`` simulated GPUs (with ``--nvml``: of this machine's GPUs, through the
reader the agent would open; run it from a bundle, or with pynvml importable, on a GPU node)
and prints the bytes per GPU-sample of each line as protocol 1 sent it and as protocol 2 does
(``compact_gpus`` and ``compact_records``, as ``Agent.sample``); then times, alternated
``--rounds`` times, ``protocol.encode`` of the last sample both ways (protocol 2's including the
compaction) and prints the median microseconds of CPU per line.

Usage: python benchmarks/agent_encode.py [--gpus 8] [--nvml] [--samples 12] [--rounds 7]
           [--n 2000]
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gpuctl.node import protocol
from gpuctl.node.readers import open_reader
from gpuctl.node.readers.sim import SimReader


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--nvml", action="store_true", help="this machine's GPUs, not simulated ones")
    ap.add_argument("--samples", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--n", type=int, default=2000)
    args = ap.parse_args()
    if args.nvml:
        reader, note = open_reader()
        if reader is None:
            sys.exit(f"no GPU reader: {note}")
    else:
        reader = SimReader.from_spec(f"{args.gpus}:H100", seed=3)
        for _ in range(5):
            reader.sample()
    statics = reader.static()
    msgs = {1: {}, 2: {}}  # type: dict
    size = {1: 0, 2: 0}
    gpu_samples = 0
    for k in range(args.samples):
        gpus = reader.sample(slow=k % protocol.SLOW_EVERY == 0)
        parents, host = reader.parents(), reader.host()
        msgs[1] = {"type": "sample", "t": time.time(), "seq": k, "gpus": gpus}
        msgs[1].update(parents=parents, host=host)
        msgs[2] = dict(msgs[1], gpus=protocol.compact_gpus(gpus, statics))
        msgs[2]["parents"] = protocol.compact_records(parents)
        for v in (1, 2):
            size[v] += len(protocol.encode(msgs[v]))
        gpu_samples += len(gpus)
        if args.nvml:
            time.sleep(0.1)  # a little time between readings, as between an agent's samples

    def protocol1() -> bytes:
        return protocol.encode(msgs[1])

    def protocol2() -> bytes:
        m = dict(msgs[1], gpus=protocol.compact_gpus(msgs[1]["gpus"], statics))
        m["parents"] = protocol.compact_records(msgs[1]["parents"])
        return protocol.encode(m)

    cases = (("protocol 1", protocol1), ("protocol 2", protocol2))
    times = {name: [] for name, _ in cases}  # type: dict
    for _ in range(args.rounds):
        for name, encode in cases:
            start = time.process_time()
            for _ in range(args.n):
                encode()
            times[name].append((time.process_time() - start) / args.n * 1e6)
    print(
        f"Python {sys.version.split()[0]}, reader {reader.name}, {gpu_samples // args.samples} "
        f"GPUs, {args.samples} samples; {args.rounds} alternated rounds of {args.n} encodings of "
        "the last one, us of CPU per line (median)"
    )
    for v, (name, _) in enumerate(cases, start=1):
        ts = sorted(times[name])
        print(
            f"  {name}: {size[v] / gpu_samples:6.1f} bytes per GPU-sample, encode "
            f"{ts[len(ts) // 2]:6.1f} us"
        )
    print(f"  protocol 2 / 1: bytes {size[2] / size[1]:.2f}x")
    print("  a GPU in protocol 2:", protocol.encode(msgs[2]["gpus"][0]).decode().strip())


if __name__ == "__main__":
    main()
