"""TUI load benchmark: the real app, headless, over N simulated nodes × G GPUs sampling at 1 Hz.

The GPUs are simulated in a separate feeder process (one process for all nodes, writing protocol
lines to one pipe per node, phases spread over the second), so this process does exactly what
gpuctl does on a login node: read lines, decode, keep history, update the screen. It prints

* the app process's CPU share (user + system time over wall time, 100% = one core), and
* the delay from a sample's arrival in the app to the paint of its node's lines (p50/p95/max),
  for the nodes on screen (the list shows a few; the heatmap shows them all).

Usage: python benchmarks/tui_load.py [--nodes 128] [--gpus 8] [--seconds 60] [--mode list|heatmap]
Without --nodes/--mode it runs the issue's set: 128×8 and 256×8, list and heatmap.
Targets (issue 4): < 25% of one core, p95 < 300 ms at 128×8.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


# -- feeder (child process) -----------------------------------------------------------------------
def feeder(fds: list[int], gpus: int, interval: float) -> None:
    """Write a hello, then one sample per node per interval, node i at phase i/N."""
    from gpuctl.fleet.replay import recorded_node
    from gpuctl.node import protocol
    from gpuctl.node.readers.sim import SimReader

    models = ("H100", "A100", "H200", "L40S")
    outs = [os.fdopen(fd, "wb", buffering=0) for fd in fds]
    readers = []
    for i, out in enumerate(outs):
        spec = f"{gpus}:{models[i % len(models)]}"
        hello = recorded_node(f"bench-{i:03d}", spec, samples=0)[0]
        out.write(protocol.encode(hello))
        readers.append(SimReader.from_spec(spec, seed=i))
    n = len(outs)
    start = time.monotonic()
    seq = 0
    while True:
        for i, (out, reader) in enumerate(zip(outs, readers, strict=True)):
            due = start + seq * interval + interval * i / n
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)  # the feeder's cadence: a simulated clock, not synchronisation
            msg = {"type": "sample", "t": time.time(), "seq": seq, "gpus": reader.sample()}
            try:
                out.write(protocol.encode(msg))
            except BrokenPipeError:
                return
        seq += 1


# -- app side -------------------------------------------------------------------------------------
def pipe_link(fd: int) -> Any:
    from gpuctl.fleet.links import STREAM_LIMIT, NodeLink
    from gpuctl.fleet.replay import _Discard
    from gpuctl.fleet.session import AgentSession

    class PipeLink(NodeLink):
        kind = "simulated"

        async def open(self) -> AgentSession:
            loop = asyncio.get_running_loop()
            reader = asyncio.StreamReader(limit=STREAM_LIMIT)
            transport, _ = await loop.connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0)
            )

            async def close() -> None:
                transport.close()

            return AgentSession(reader, _Discard(), close=close)

    return PipeLink()


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_once(nodes: int, gpus: int, seconds: float, mode: str) -> dict[str, Any]:
    """Start the feeder, measure the app over its pipes, stop the feeder."""
    pipes = [os.pipe() for _ in range(nodes)]
    child = subprocess.Popen(
        [sys.executable, __file__, "--feeder", json.dumps([w for _, w in pipes]), str(gpus)],
        pass_fds=[w for _, w in pipes],
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    for _, w in pipes:
        os.close(w)
    try:
        return asyncio.run(measure([r for r, _ in pipes], gpus, seconds, mode))
    finally:
        child.kill()
        child.wait()


async def measure(fds: list[int], gpus: int, seconds: float, mode: str) -> dict[str, Any]:
    from gpuctl.core.model import NodeState
    from gpuctl.fleet.fleet import Fleet
    from gpuctl.tui import make_app

    nodes = len(fds)
    fleet = Fleet({f"bench-{i:03d}": pipe_link(r) for i, r in enumerate(fds)})
    import tempfile

    app = make_app(fleet, simulated=True, state_dir=Path(tempfile.mkdtemp()))
    arrival_paint: list[float] = []
    sample_paint: list[float] = []
    flushes = [0]
    measuring = [False]

    def on_paint(node: str, arrived: float) -> None:
        if measuring[0]:
            arrival_paint.append(time.monotonic() - arrived)
            t = app.store.snaps[node].last_sample_t
            if t is not None:
                sample_paint.append(time.time() - t)

    def on_flush(_names: set[str], _arrivals: dict[str, float]) -> None:
        if measuring[0]:
            flushes[0] += 1

    task = asyncio.create_task(app.run_async(headless=True, size=(160, 48)))
    try:
        deadline = time.monotonic() + 60
        while not (
            app.is_running
            and app.overview.ready
            and all(s.state is NodeState.LIVE for s in app.store.snaps.values())
        ):
            if time.monotonic() > deadline or task.done():
                raise SystemExit("the benchmark fleet did not come up")
            await asyncio.sleep(0.1)
        if mode == "heatmap":
            app.overview.action_heatmap()
        app.overview.nodes.on_paint = on_paint
        app.overview.heatmap.on_paint = on_paint
        app.on_flush = on_flush
        await asyncio.sleep(3.0)  # warm up: layout, caches
        measuring[0] = True
        cpu0, wall0 = os.times(), time.monotonic()
        await asyncio.sleep(seconds)
        cpu1, wall1 = os.times(), time.monotonic()
        measuring[0] = False
    finally:
        app.exit(0)
        await asyncio.wait_for(task, 30)
    busy = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    wall = wall1 - wall0
    return {
        "nodes": nodes,
        "gpus": gpus,
        "mode": mode,
        "cpu_share": busy / wall,
        "paints": len(arrival_paint),
        "arrival_paint_p50_ms": 1000 * statistics.median(arrival_paint) if arrival_paint else None,
        "arrival_paint_p95_ms": 1000 * pct(arrival_paint, 0.95),
        "arrival_paint_max_ms": 1000 * max(arrival_paint, default=float("nan")),
        "sample_paint_p95_ms": 1000 * pct(sample_paint, 0.95),
        "flushes_per_s": flushes[0] / wall,
    }


def report(r: dict[str, Any]) -> str:
    return (
        f"{r['nodes']:>4}x{r['gpus']} {r['mode']:<8} CPU {100 * r['cpu_share']:5.1f}% of one core"
        f"  arrival->paint p50 {r['arrival_paint_p50_ms']:6.1f} ms  p95 "
        f"{r['arrival_paint_p95_ms']:6.1f} ms  max {r['arrival_paint_max_ms']:6.1f} ms"
        f" (n={r['paints']})  sample->paint p95 {r['sample_paint_p95_ms']:6.1f} ms"
        f"  flushes {r['flushes_per_s']:.1f}/s"
    )


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--feeder":
        feeder(json.loads(sys.argv[2]), int(sys.argv[3]), 1.0)
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--mode", choices=("list", "heatmap"))
    p.add_argument("--json", action="store_true", help="one JSON object per run")
    args = p.parse_args()
    sizes = [args.nodes] if args.nodes else [128, 256]
    modes = [args.mode] if args.mode else ["list", "heatmap"]
    for n in sizes:
        for mode in modes:
            r = run_once(n, args.gpus, args.seconds, mode)
            print(json.dumps(r) if args.json else report(r), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
