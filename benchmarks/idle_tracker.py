"""What the allocated-but-idle tracker (``gpuctl.fleet.idle``) costs on the fleet's sample path.

Every snapshot of every node goes through ``IdleTracker.observe`` (a fleet listener). This
times it over 512 nodes of 8 GPUs, as a node with no Slurm job (most nodes of a cluster without
Slurm: one look-up) and with all 8 GPUs in a job, against a listener that does nothing (the
floor of a call), the three alternated, medians of the rounds. It also times export's per-scrape
lines (``in_jobs``) and the header's count at 4,096 GPUs in jobs. Prints figures; asserts
nothing.

    python benchmarks/idle_tracker.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpuctl.core.model import GpuNotes, GpuSample, NodeSnapshot, NodeState
from gpuctl.fleet.idle import IdleTracker

NODES, GPUS, ROUNDS = 512, 8, 15


def snaps(jobs: bool) -> list[NodeSnapshot]:
    out = []
    for n in range(NODES):
        gpus = tuple(GpuSample(index=i, t=1.0, util_gpu=i % 3, util_mem=0) for i in range(GPUS))
        notes = {i: GpuNotes(slurm_job=str(n), slurm_user="alice") for i in range(GPUS)}
        out.append(
            NodeSnapshot(
                name=f"n{n:04d}",
                state=NodeState.LIVE,
                gpus=gpus,
                last_sample_t=1.0,
                annotations=notes if jobs else {},
            )
        )
    return out


def timed(fn, items: list[NodeSnapshot]) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    for s in items:
        fn(s)
    return (time.perf_counter() - t0) / len(items) * 1e6  # us per snapshot


def main() -> None:
    none, held = snaps(False), snaps(True)
    floor: list[float] = []
    free: list[float] = []
    busy: list[float] = []
    clear, tracker = IdleTracker(), IdleTracker(after=0.0)  # after 0: every idle GPU counts
    for _ in range(ROUNDS):
        floor.append(timed(lambda _s: None, none))
        free.append(timed(clear.observe, none))
        busy.append(timed(tracker.observe, held))
    med = statistics.median
    print(f"observe, per node snapshot (median of {ROUNDS} rounds of {NODES} nodes):")
    print(f"  a listener that does nothing   {med(floor):6.2f} us")
    print(f"  a node in no job               {med(free):6.2f} us ({med(free) / med(floor):.1f}x)")
    ratio = med(busy) / med(floor)
    print(f"  a node of {GPUS} GPUs in a job     {med(busy):6.2f} us ({ratio:.1f}x)")
    t0 = time.perf_counter()
    lines = tracker.in_jobs()
    t1 = time.perf_counter()
    count = tracker.count()
    t2 = time.perf_counter()
    print(f"in_jobs (export, per scrape), {len(lines)} GPUs: {(t1 - t0) * 1e3:.2f} ms")
    print(f"count (the header, per flush), {len(lines)} GPUs: {(t2 - t1) * 1e3:.2f} ms ({count})")


if __name__ == "__main__":
    main()
