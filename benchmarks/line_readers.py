"""Line readers benchmark: the event loop's CPU per agent line, a task per node against one reader.

What the screen pays per line before it decodes it (issue 42's first step: "one reader for many
nodes' lines per loop pass instead of a task per node"). ``--nodes`` pipes, each written one line
of ~4.5 KB (an 8-GPU sample's size) a second by a thread of this process, phases spread over the
second, read on gpuctl's event loop (``gpuctl.fleet.eventloop``) in one of two ways:

* task: a task per pipe awaiting ``asyncio.StreamReader.readline`` (what each node's task does
  under ``AgentSession.messages``, without the session's own frames),
* one: a protocol per pipe whose ``data_received`` cuts the complete lines off and adds them to
  one list, which one callback per loop pass takes (a loop pass takes ~10 nodes' lines: the loop
  gathers I/O for 20 ms).

Each handler only counts the line. Prints the loop thread's CPU (``time.thread_time``: the
writing thread is left out) per line and as a share of one core, alternating the two
``--rounds`` times, and the medians.

Usage: python benchmarks/line_readers.py [--nodes 512] [--seconds 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpuctl.fleet.eventloop import run

LINE = b'{"type":"sample","t":1,"gpus":[' + b"0" * 4400 + b"]}\n"


def feeder(fds: list[int], stop: threading.Event) -> None:
    """One line a second on each pipe, pipe i at phase i/N."""
    n = len(fds)
    start = time.monotonic()
    seq = 0
    while not stop.is_set():
        for i, fd in enumerate(fds):
            delay = start + seq + i / n - time.monotonic()
            if delay > 0:
                time.sleep(delay)  # the feeder's cadence: a simulated clock
            if stop.is_set():
                return
            os.write(fd, LINE)
        seq += 1


async def task_per_pipe(fds: list[int], count: list[int]) -> list[asyncio.Task[None]]:
    loop = asyncio.get_running_loop()

    async def node(fd: int) -> None:
        reader = asyncio.StreamReader(limit=1 << 22)
        await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0)
        )
        while await reader.readline():
            count[0] += 1

    return [asyncio.create_task(node(fd)) for fd in fds]


class Batch:
    """The lines of every pipe that came in one loop pass, taken by one callback."""

    def __init__(self, loop: asyncio.AbstractEventLoop, count: list[int]) -> None:
        self.loop = loop
        self.items: list[tuple[object, bytes]] = []
        self.count = count

    def put(self, source: object, chunk: bytes) -> None:
        if not self.items:
            self.loop.call_soon(self.take)
        self.items.append((source, chunk))

    def take(self) -> None:
        items, self.items = self.items, []
        for _source, chunk in items:
            for _line in chunk.splitlines():
                self.count[0] += 1


class Lines(asyncio.Protocol):
    def __init__(self, batch: Batch) -> None:
        self.rest = b""
        self.batch = batch

    def data_received(self, data: bytes) -> None:
        buf = self.rest + data if self.rest else data
        end = buf.rfind(b"\n")
        if end < 0:
            self.rest = buf
            return
        self.rest = buf[end + 1 :]
        self.batch.put(self, buf[: end + 1])


async def one_reader(fds: list[int], count: list[int]) -> list[asyncio.Task[None]]:
    loop = asyncio.get_running_loop()
    batch = Batch(loop, count)
    for fd in fds:
        await loop.connect_read_pipe(lambda: Lines(batch), os.fdopen(fd, "rb", buffering=0))
    return []


async def measure(kind: str, nodes: int, seconds: float) -> tuple[float, float]:
    pipes = [os.pipe() for _ in range(nodes)]
    count = [0]
    start = task_per_pipe if kind == "task" else one_reader
    tasks = await start([r for r, _ in pipes], count)
    stop = threading.Event()
    writer = threading.Thread(target=feeder, args=([w for _, w in pipes], stop), daemon=True)
    writer.start()
    await asyncio.sleep(2.0)  # warm up: every pipe has sent a line
    cpu0, n0 = time.thread_time(), count[0]
    await asyncio.sleep(seconds)  # the measured time
    cpu1, n1 = time.thread_time(), count[0]
    stop.set()
    writer.join()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for _, w in pipes:
        os.close(w)
    return 1e6 * (cpu1 - cpu0) / max(1, n1 - n0), (cpu1 - cpu0) / seconds


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=512)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4 * args.nodes + 256
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
    results: dict[str, list[float]] = {"task": [], "one": []}
    for _ in range(args.rounds):
        for kind in results:
            us, share = run(measure(kind, args.nodes, args.seconds))
            results[kind].append(us)
            print(
                f"{kind:>4}: {us:5.1f} us of the loop's CPU a line ({100 * share:.2f}% of a core)",
                flush=True,
            )
    med: dict[str, Any] = {k: statistics.median(v) for k, v in results.items()}
    print(
        f"medians: a task per pipe {med['task']:.1f} us a line, one reader {med['one']:.1f} us"
        f" ({med['task'] / med['one']:.1f}x); at {args.nodes} lines a second that is "
        f"{0.1 * args.nodes * (med['task'] - med['one']) / 1000:.2f}% of a core"
    )


if __name__ == "__main__":
    main()
