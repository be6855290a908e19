"""``decode_line`` of two trees on the same sample line: is a tree's decoding slower, or only
its line longer? CPU per line (``time.process_time``), median of 5 runs of ``--n`` lines.

Run it once per tree, alternated (the machine's speed drifts); ``--line FILE`` decodes a line
saved by an earlier run (``--save FILE``), so both trees decode the same bytes:

    python benchmarks/decode_trees.py --tree . --save /tmp/line.json
    for i in 1 2 3; do for t in /tmp/old .; do
        python benchmarks/decode_trees.py --tree $t --line /tmp/line.json; done; done

The line: 8 simulated H100s of the tree's own simulated reader, three samples in, with
processes and parents, as an agent writes it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree", required=True, help="the checkout whose gpuctl decodes")
    ap.add_argument("--line", help="decode this saved line instead of the tree's own")
    ap.add_argument("--save", help="save the tree's own line here")
    ap.add_argument("--n", type=int, default=3000)
    args = ap.parse_args()
    sys.path.insert(0, args.tree)
    from gpuctl.fleet.session import decode_line
    from gpuctl.node import protocol
    from gpuctl.node.readers.sim import SimReader

    r = SimReader.from_spec("8:H100", seed=3)
    for _ in range(3):
        gpus = r.sample()
    msg = {"type": "sample", "t": 1.7e9, "seq": 5, "gpus": gpus, "parents": r.parents()}
    line = protocol.encode(msg)
    if args.save:
        with open(args.save, "wb") as f:
            f.write(line)
    if args.line:
        with open(args.line, "rb") as f:
            line = f.read()
    runs = []
    for _ in range(5):
        t0 = time.process_time()
        for _ in range(args.n):
            decode_line(line)
        runs.append((time.process_time() - t0) / args.n * 1e6)
    print(f"{args.tree}: {len(line)} bytes, {statistics.median(runs):.2f} us of CPU per line")


if __name__ == "__main__":
    main()
