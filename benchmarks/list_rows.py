"""GPU list row benchmark: CPU per painted GPU row, this checkout against another tree.

The GPU list paints only the rows on screen, but it paints them at every flush of a changed
node: with 4,096 GPUs at 1 Hz the rows on screen are painted about as often as there are
flushes (8/s, ``tui_load.py``), so a row's cost is the list's share of the screen's CPU. This
times ``NodeList.render_line`` over the GPU rows of the tests' replayed fleet (busy H100s with a
burn and an XID, a stale A100 node: every kind of cell) at each ``--widths`` (80 columns: no
bars; 200: every column), in a child process per tree (each tree's own gpuctl and test
fixtures), alternating the two trees ``--rounds`` times: on a shared machine the CPU a run
takes drifts by several percent within a minute, only alternated runs compare. Prints the
median microseconds of CPU (``time.process_time``) per row of each and old/new.

Usage: python benchmarks/list_rows.py --old /tmp/old [--rounds 3] [--reps 300]
       (``git worktree add /tmp/old 59ef707``: the list before its column model)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WIDTHS = (80, 120, 160, 200)


async def _rows(width: int, reps: int) -> float:
    """Best of 5 runs: microseconds of CPU per GPU row painted at ``width`` columns."""
    from gpuctl_tests.tui.conftest import replay_app, settle

    with tempfile.TemporaryDirectory() as d:
        app = replay_app(Path(d))
        async with app.run_test(size=(width, 48)) as pilot:
            await settle(pilot)
            nodes = app.overview.nodes
            ys = [y for y, line in enumerate(nodes.lines) if line.kind == "gpu"]
            best = []
            for _ in range(5):
                t = time.process_time()
                for _ in range(reps):
                    for y in ys:
                        nodes.render_line(y)
                best.append((time.process_time() - t) / (reps * len(ys)) * 1e6)
            return min(best)


def child(tree: Path, widths: list[int], reps: int) -> None:
    sys.path.insert(0, str(tree))
    print(json.dumps({w: asyncio.run(_rows(w, reps)) for w in widths}))


def run(tree: Path, widths: list[int], reps: int) -> dict[int, float]:
    cmd = [sys.executable, __file__, "--child", str(tree), "--reps", str(reps)]
    cmd += ["--widths", *map(str, widths)]
    out = subprocess.run(cmd, cwd=tree, capture_output=True, text=True, check=True).stdout
    return {int(w): float(us) for w, us in json.loads(out.splitlines()[-1]).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--old", type=Path, help="the older tree to compare")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=300, help="paints of every row per run")
    parser.add_argument("--widths", type=int, nargs="+", default=list(WIDTHS))
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child, args.widths, args.reps)
        return
    trees = {"new": REPO} | ({"old": args.old.resolve()} if args.old else {})
    runs: dict[str, list[dict[int, float]]] = {name: [] for name in trees}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            runs[name].append(run(tree, args.widths, args.reps))
    print("\n".join(f"{name}: {tree}" for name, tree in trees.items()))
    for w in args.widths:
        med = {name: statistics.median(r[w] for r in rs) for name, rs in runs.items()}
        line = "  ".join(f"{name} {us:6.1f} us" for name, us in med.items())
        each = "; ".join(
            f"{name} " + ", ".join(f"{r[w]:.1f}" for r in rs) for name, rs in runs.items()
        )
        ratio = f"  old/new {med['old'] / med['new']:.2f}x" if "old" in med else ""
        print(f"{w:>4} columns: {line} per GPU row (median){ratio}   runs: {each}")


if __name__ == "__main__":
    main()
