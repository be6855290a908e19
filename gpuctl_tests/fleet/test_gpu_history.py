"""The fleet's GPU history: fixed-size numeric buffers, older samples as means.

The samples come through the real path: a replayed agent's protocol lines, decoded by the
session, kept by the fleet. Memory is measured with tracemalloc: the bytes the history holds are
what is freed when the fleet drops it.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import math
import sys
import time
import tracemalloc
import types

import pytest

from gpuctl.core.model import NodeState
from gpuctl.fleet.fixed_links import ReplayLink, recorded_node
from gpuctl.fleet.fleet import Fleet
from gpuctl.fleet.gpu_history import COLUMNS as HISTORY_COLUMNS
from gpuctl.fleet.gpu_history import GpuHistory

T0 = 1_700_000_000.0


async def replayed(samples: int, spec: str = "4:H100", **kwargs: float) -> Fleet:
    """A fleet over one replayed node, once the fleet has kept all ``samples`` samples."""
    fleet = Fleet({"n": ReplayLink(recorded_node("n", spec, samples=samples, t0=T0))}, **kwargs)
    await fleet.start()
    last = T0 + samples - 1
    deadline = time.monotonic() + 60
    while fleet.snapshot("n").last_sample_t != last:
        if time.monotonic() > deadline:
            pytest.fail(f"the replay did not end: {fleet.snapshot('n')}")
        await asyncio.sleep(0.01)  # a poll with a deadline: the replay runs on this loop
    return fleet


async def history_bytes_per_gpu(samples: int, gpus: int, **kwargs: float) -> float:
    """Bytes per GPU the fleet's history holds after ``samples`` samples of ``gpus`` GPUs."""
    gc.collect()
    tracemalloc.start()
    try:
        fleet = await replayed(samples, f"{gpus}:H100", **kwargs)
        try:
            gc.collect()
            held = tracemalloc.get_traced_memory()[0]
            fleet.nodes["n"].history.clear()
            gc.collect()
            freed = held - tracemalloc.get_traced_memory()[0]
        finally:
            await fleet.stop()
    finally:
        tracemalloc.stop()
    return freed / gpus


def held_bytes(root: object) -> int:
    """The bytes of every object reachable from ``root`` that it alone holds: classes, modules
    and functions (shared by every instance) are not counted, nor anything seen twice."""
    seen: set[int] = set()
    todo = [root]
    total = 0
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, (type, types.ModuleType, types.FunctionType)):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        todo.extend(gc.get_referents(obj))
    return total


async def history_held_per_gpu(samples: int, gpus: int, **kwargs: float) -> float:
    """Bytes per GPU reachable from the fleet's history after ``samples`` samples."""
    fleet = await replayed(samples, f"{gpus}:H100", **kwargs)
    try:
        return held_bytes(fleet.nodes["n"].history) / gpus
    finally:
        await fleet.stop()


async def test_history_memory_per_gpu_is_constant_once_full() -> None:
    # Small buffers so that they fill fast: 50 recent samples, then 10 means of 5 s.
    small = {"history_len": 50, "history_older": 10, "history_step": 5.0}
    full = 50 + 10 * 5
    # What the history holds, object by object: anything kept per sample would add at least a
    # byte per GPU per sample. (Counted from the objects, not with tracemalloc: the process's
    # own caches come and go under tracemalloc, once 265 bytes per GPU on a CI machine.) The
    # one difference allowed is a number's object: an int past 256 is 28 bytes, 2 per GPU.
    sizes = [await history_held_per_gpu(n, 16, **small) for n in (full + 20, 3 * full, 6 * full)]
    assert max(sizes) - min(sizes) <= 8, sizes
    # ... and little more than its buffers' own bytes (one array header per column and ring,
    # 22 with the 10 columns of the metric registry, the rings, the dict: some 2.5 KB per GPU
    # beside 1.9 KB of numbers; 64 + 16 bytes per array a column adds).
    buffers = GpuHistory(50, 10, 5.0).nbytes
    headers = 2 * (len(HISTORY_COLUMNS) + 1) * 120
    assert buffers < sizes[0] < buffers + headers, (buffers, sizes)
    # tracemalloc agrees within Python's caches: what clear() frees is near the same figure.
    freed = await history_bytes_per_gpu(6 * full, 16, **small)
    assert buffers < freed < buffers + 3072, (buffers, freed)


async def test_history_memory_per_gpu_at_the_default_sizes() -> None:
    """15 minutes of samples and 4 hours of minute means cost a GPU under 40 KB (a whole
    sample object per second cost over a megabyte): 160 MB at 4,096 GPUs. 32 bytes a point
    (time, 10 columns): the video engines and PCIe throughput added 10 to the 22 of the first
    six columns (39.7 KB measured, 27 KB before)."""
    per_gpu = await history_bytes_per_gpu(900 + 240 * 60 + 100, 1)
    assert per_gpu < 40 * 1024, per_gpu


async def test_history_reads_recent_samples_and_older_means() -> None:
    fleet = await replayed(400, history_len=100, history_older=10, history_step=60.0)
    try:
        snap = fleet.snapshot("n")
        assert snap.state is NodeState.LIVE
        hist = fleet.history("n", 1)
        times, util = hist.series("util")
        # 100 samples as they came (t0+300 .. t0+399), before them the minute means that end
        # before the first of them: minutes starting at t0-20+60k ... (T0 is 20 s into a minute)
        first_recent = T0 + 300
        assert times[-100:] == [T0 + k for k in range(300, 400)]
        older = times[:-100]
        assert older and all(t + 30 <= first_recent for t in older)
        assert all(b - a == 60 for a, b in itertools.pairwise(older))
        assert len(hist) == len(times)
        # the recent values are the samples' own; the last one is the snapshot's
        gpu1 = next(g for g in snap.gpus if g.index == 1)
        assert util[-1] == gpu1.util_gpu and hist.recent("util", 1) == [gpu1.util_gpu]
        mem = hist.series("mem_gib")[1][-1]
        assert gpu1.mem_used is not None and mem is not None
        assert math.isclose(mem, gpu1.mem_used / 2**30, rel_tol=1e-6)
        assert hist.recent("temp", 5) == hist.series("temp")[1][-5:]
        assert len(hist.recent("util", 1000)) == 100
        # a minute's mean is the mean of that minute's samples (which the replay can repeat)
        messages = recorded_node("n", "4:H100", samples=400, t0=T0)[1:]
        start = older[-1] - 30
        minute = [
            g["util_gpu"]
            for m in messages
            if start <= m["t"] < start + 60
            for g in m["gpus"]
            if g["index"] == 1
        ]
        assert util[len(older) - 1] == round(sum(minute) / len(minute))
        # a GPU never seen has no history
        assert len(fleet.history("n", 99)) == 0 and fleet.history("n", 99).series("util") == (
            [],
            [],
        )
    finally:
        await fleet.stop()


async def test_missing_and_junk_readings_are_none() -> None:
    messages = recorded_node("n", "1:H100", samples=3, t0=T0)
    messages[1]["gpus"][0].update(util_gpu=None, temp=-5, sm_clock=10**9, power=1e308)
    messages[2]["gpus"][0]["state"] = "lost"
    fleet = Fleet({"n": ReplayLink(messages)})
    await fleet.start()
    try:
        deadline = time.monotonic() + 10
        while fleet.snapshot("n").last_sample_t != T0 + 2:
            assert time.monotonic() < deadline, fleet.snapshot("n")
            await asyncio.sleep(0.01)  # a poll with a deadline: the replay runs on this loop
        hist = fleet.history("n", 0)
        assert hist.series("util")[1][0] is None
        assert hist.series("temp")[1][0] is None
        assert hist.series("clock")[1][0] is None
        assert hist.series("power")[1][0] == math.inf
        assert all(hist.series(m)[1][1] is None for m in ("util", "mem_gib", "temp", "power"))
    finally:
        await fleet.stop()


def test_a_gpu_sample_is_kept_as_its_readings_are() -> None:
    """``_Ring.push_gpu`` (the fleet's path, written out per column) keeps what ``push`` keeps
    of ``_readings``: in range, at and past each column's edges, missing, NaN, infinite, a
    float where an integer belongs, a lost GPU."""
    from gpuctl.core.model import GpuSample
    from gpuctl.fleet.gpu_history import METRICS, _readings, _Ring

    edges: list[object] = [None, 0, 1, 254, 255, 256, 65534, 65535, 65536, -1, 10**30]
    edges += [True, 3.4, 3.6, 254.6, -0.4, -0.6, 7e4]
    floats: list[float | None] = [None, 0.0, 412.5, 3e38, -3e38, 2.9e38, 1e308, -1e308]
    floats += [math.inf, -math.inf, math.nan, 17]
    samples = []
    for i, v in enumerate(edges):
        f = floats[i % len(floats)]
        g = GpuSample(index=0, t=T0 + i, util_gpu=v, temp=v, sm_clock=v, mem_clock=v, power=f)
        samples.append(g)
    for i, f in enumerate(floats):
        mem = None if f is None or f != f or abs(f) == math.inf else int(f)
        samples.append(GpuSample(index=0, t=T0 + 100 + i, mem_used=mem, power=f))
    samples.append(GpuSample(index=0, t=T0 + 200, state="lost", util_gpu=50, power=300.0))
    written, looped = _Ring(len(samples)), _Ring(len(samples))
    for g in samples:
        written.push_gpu(g.t, g)
        looped.push(g.t, _readings(g))  # type: ignore[arg-type]
    assert written.times_list() == looped.times_list()
    for metric in METRICS:
        ours, theirs = written.values(metric), looped.values(metric)
        same = [a == b or (a != a and b != b) for a, b in zip(ours, theirs, strict=True)]
        assert all(same), (metric, ours, theirs)
