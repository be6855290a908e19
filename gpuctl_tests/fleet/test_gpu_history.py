"""The fleet's GPU history: fixed-size numeric buffers, older samples as means.

The samples come through the real path: a replayed agent's protocol lines, decoded by the
session, kept by the fleet. Memory is measured with tracemalloc: the bytes the history holds are
what is freed when the fleet drops it.
"""

from __future__ import annotations

import gc
import itertools
import math
import sys
import tracemalloc
import types

import pytest

from gpuctl.core.model import GpuSample as Reading
from gpuctl.core.model import NodeState
from gpuctl.core.wire import JsonObject
from gpuctl.fleet.fixed_links import ReplayLink, recorded_node
from gpuctl.fleet.fleet import Fleet
from gpuctl.fleet.gpu_history import BYTES_PER_POINT, METRICS, NodeHistory, _readings
from gpuctl_tests.helpers import wait_until_async

T0 = 1_700_000_000.0


async def replayed(samples: int, spec: str = "4:H100", **kwargs: float) -> Fleet:
    """A fleet over one replayed node, once the fleet has kept all ``samples`` samples."""
    return await replaying(recorded_node("n", spec, samples=samples, t0=T0), **kwargs)


async def replaying(messages: list[JsonObject], **kwargs: float) -> Fleet:
    """A fleet over one node replaying ``messages``, once it has kept the last sample."""
    fleet = Fleet({"n": ReplayLink(messages)}, **kwargs)
    await fleet.start()
    last = messages[-1]["t"]
    try:
        await wait_until_async(
            lambda: fleet.snapshot("n").last_sample_t == last,
            60,
            "the replay to end",
            now=lambda: fleet.snapshot("n"),
        )
    except BaseException:
        await fleet.stop()
        raise
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
    # ... and little more than its buffers' own bytes: the numbers (the times shared by the
    # node's 16 GPUs) and, per node, one array header per column and ring (22 with the 10
    # columns of the metric registry), the rings and, per GPU, its view and first time: 343
    # bytes per GPU beside 1,470 of numbers. Kept per GPU (22 arrays each) it was some 2.5 KB.
    numbers = (50 + 10) * (BYTES_PER_POINT - 8) + (50 + 10) * 8 / 16
    assert numbers < sizes[0] < numbers + 512, (numbers, sizes)
    # tracemalloc agrees within Python's caches: what clear() frees is near the same figure.
    freed = await history_bytes_per_gpu(6 * full, 16, **small)
    assert numbers < freed < numbers + 3072, (numbers, freed)


# A GPU's history at the default sizes stays under this; the docs say it (test_doc_figures.py):
# 5 of its 15 recent minutes kept as sampled at 1 Hz, the 10 before them one sample each 10 s,
# 600 points, not 1,140 (29.6 KB before).
HISTORY_BUDGET_KB = 22


async def test_history_memory_per_gpu_at_the_default_sizes() -> None:
    """15 minutes of samples and 4 hours of minute means cost a GPU under 22 KB (a whole
    sample object per second cost over a megabyte): 90 MB at 4,096 GPUs. 32 bytes a point
    (time, 10 columns) alone on its node: 300 samples, 60 (one each 10 s), 240 minute means:
    19.7 KB measured here (15.2 KB a GPU of 8); with 900 samples as they came 29.6 KB (29.2 of
    8; the times of the rings that clear() makes again are not counted)."""
    per_gpu = await history_bytes_per_gpu(900 + 240 * 60 + 100, 1)
    assert per_gpu < HISTORY_BUDGET_KB * 1024, per_gpu


async def test_a_young_history_holds_what_came_not_its_full_size() -> None:
    """A minute of samples holds a minute's points: the rings grow as points come (allocated
    whole at a GPU's first sample, a minute cost 28.5 KB a GPU of 8, as 4 hours did)."""
    points = 60 * (BYTES_PER_POINT - 8 + 8 / 8)  # its values, its share of the times
    per_gpu = await history_bytes_per_gpu(60, 8)
    assert per_gpu < points + 2048, (points, per_gpu)


async def test_a_1_hz_node_keeps_5_minutes_as_sampled_then_one_each_10_s() -> None:
    """At 1 Hz a GPU's last 300 samples are kept as they came; for the 10 minutes before them
    the first sample of each 10 s, before those the minute means: the plot's 15 minutes from
    360 points, not 900 (it drew every 3rd of them). Each is a sample the agent sent."""
    messages = recorded_node("n", "2:H100", samples=1500, t0=T0)
    fleet = await replaying(messages)
    try:
        hist = fleet.history("n", 1)
        sent = {
            m["t"]: next(g for g in m["gpus"] if g["index"] == 1)
            for m in messages
            if m["type"] == "sample"
        }
        last = T0 + 1499
        times, util = hist.series("util")
        assert hist.recent("util", 1000) == util[-300:]
        assert times[-300:] == [last - 299 + k for k in range(300)]
        # the 10 minutes before them: 60 samples, the first of each 10 s, as they came
        middle = times[-360:-300]
        assert middle == [times[-300] - 600 + 10 * k for k in range(60)]
        assert all(t % 10 == T0 % 10 for t in middle)
        mem = hist.series("mem_gib")[1]
        power = hist.series("power")[1]
        for i in range(-360, 0):
            g = sent[times[i]]
            assert util[i] == g["util_gpu"]
            assert mem[i] is not None and math.isclose(mem[i], g["mem_used"] / 2**30, rel_tol=1e-6)
            assert power[i] is not None and math.isclose(power[i], g["power"], rel_tol=1e-6)
        # before them the minute means, each wholly before the first of those
        older = times[:-360]
        assert older and all(b - a == 60 for a, b in itertools.pairwise(older))
        assert older[-1] + 30 <= middle[0]
        assert len(hist) == len(times)
    finally:
        await fleet.stop()


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


async def test_a_node_sampled_every_15_s_keeps_the_same_minutes_in_fewer_samples() -> None:
    """A node whose hello says it samples every 15 s (a Prometheus node: the scrape period)
    keeps ``history_len`` seconds of samples as they came, 60 of them, not 900 (3.75 hours:
    455 MB of the screen's 710 at 16,384 GPUs), and the minute means before them."""
    messages = recorded_node("n", "2:H100", samples=100, t0=T0, interval=15.0)
    fleet = await replaying(messages)
    try:
        hist = fleet.history("n", 0)
        recent = hist.recent("util", 1000)
        assert len(recent) == 60  # 900 s
        times, util = hist.series("util")
        assert times[-60:] == [T0 + 15 * k for k in range(40, 100)]
        older = times[:-60]  # the 40 samples before: their minutes' means
        assert older and all(b - a == 60 for a, b in itertools.pairwise(older))
        assert util[-60:] == recent
        # a node at 1 s keeps its last 300 as they came (one each 10 s before them:
        # test_a_1_hz_node_keeps_5_minutes_as_sampled_then_one_each_10_s)
        fast = await replayed(950, "1:H100")
        try:
            assert len(fast.history("n", 0).recent("util", 1000)) == 300
        finally:
            await fast.stop()
    finally:
        await fleet.stop()


async def test_missing_and_junk_readings_are_none() -> None:
    messages = recorded_node("n", "1:H100", samples=3, t0=T0)
    messages[1]["gpus"][0].update(util_gpu=None, temp=-5, sm_clock=10**9, power=1e308)
    messages[2]["gpus"][0]["state"] = "lost"
    fleet = await replaying(messages)
    try:
        hist = fleet.history("n", 0)
        assert hist.series("util")[1][0] is None
        assert hist.series("temp")[1][0] is None
        assert hist.series("clock")[1][0] is None
        assert hist.series("power")[1][0] == math.inf
        assert all(hist.series(m)[1][1] is None for m in ("util", "mem_gib", "temp", "power"))
    finally:
        await fleet.stop()


def junk_samples() -> list[list[Reading]]:
    """Samples of a 3-GPU node with readings in range, at and past each column's edges,
    missing, NaN, infinite, a float where an integer belongs, and a lost GPU: GPU 1 carries
    the edges, 0 and 2 plain readings (so that most samples mix the two in one column)."""
    edges: list[object] = [None, 0, 1, 254, 255, 256, 65534, 65535, 65536, -1, 10**30]
    edges += [True, 3.4, 3.6, 254.6, -0.4, -0.6, 7e4]
    floats: list[float | None] = [None, 0.0, 412.5, 3e38, -3e38, 2.9e38, 1e308, -1e308]
    floats += [math.inf, -math.inf, math.nan, 17, 3.5e38]
    plain = {"util_gpu": 50, "temp": 60, "sm_clock": 1980, "mem_clock": 2619, "power": 412.5}

    def node(t: float, **odd: object) -> list[Reading]:
        return [Reading(index=i, t=t, **(odd if i == 1 else plain)) for i in range(3)]  # type: ignore[arg-type]

    samples = [node(T0 + 1000)]  # the first: every column fits (the fast path's own)
    for i, v in enumerate(edges):
        f = floats[i % len(floats)]
        samples.append(node(T0 + i, util_gpu=v, temp=v, sm_clock=v, mem_clock=v, power=f))
    for i, f in enumerate(floats):
        mem = None if f is None or f != f or abs(f) == math.inf else int(f)
        samples.append(node(T0 + 100 + i, mem_used=mem, power=f, pcie_tx=mem))
    samples.append(node(T0 + 200, state="lost", util_gpu=50, power=300.0))
    samples.append(node(T0 + 201, util_gpu=50))
    return samples


def test_a_node_sample_is_kept_as_its_readings_are() -> None:
    """``NodeHistory.add`` (the fleet's path: a node's sample one array write per column,
    each value kept as ``_kept`` keeps it where a column's values do not all fit) keeps what
    the ring's per-value path keeps of each GPU's ``_readings``."""
    from gpuctl.fleet.gpu_history import NodeHistory, _Ring

    samples = junk_samples()
    node = NodeHistory(len(samples), 0)
    looped = _Ring(len(samples))
    looped.add_lanes(3)
    for gpus in samples:
        node.add(gpus[0].t, gpus)
        looped.push(gpus[0].t, [_readings(g) for g in gpus])
    for lane in range(3):
        view = node[lane]
        assert view.series("util")[0] == looped.times_list()
        for c, metric in enumerate(METRICS):
            ours = view.series(metric)[1]
            assert len(ours) == len(samples), metric
            raw = looped.last_values(c, lane, looped.size)
            kept = node._recent.last_values(c, lane, len(samples))
            same = [a == b or (a != a and b != b) for a, b in zip(kept, raw, strict=True)]
            assert all(same), (metric, lane, kept, raw)
    # what the edges became, as read back: junk is None, float32's range ends in infinity
    gpu1 = node[1]
    util = gpu1.series("util")[1]
    assert util[1:8] == [None, 0, 1, 254, None, None, None]
    assert gpu1.series("clock")[1][5:9] == [255, 256, 65534, None]
    assert gpu1.series("power")[1][1:5] == [None, 0.0, 412.5, pytest.approx(3e38, rel=1e-6)]
    assert gpu1.series("power")[1][7:9] == [math.inf, -math.inf]
    assert all(v is None for v in [m[-2] for m in (gpu1.series(x)[1] for x in METRICS)])
    assert node[0].series("util")[1][-2] == 50 and gpu1.series("util")[1][-1] == 50


def test_a_gpu_the_samples_lack_is_kept_missing_as_the_rings_path_keeps_it() -> None:
    """A GPU a node's samples lack (it fell off the bus) stands in as missing readings so that
    the sample takes ``add``'s write in C: the history holds what the ring's per-value path
    keeps of a sample that lacks it (each GPU's ``_readings``, the absent one's all missing),
    whether the others' readings fit their columns or not, in the layout's order or not, with
    a lost GPU among them, and whichever GPU is absent (the last and first too)."""
    from gpuctl.fleet.gpu_history import NodeHistory, _gpu_readings, _Ring

    samples = junk_samples()
    lacking = [samples[0]]  # every GPU at first: the lanes
    for k, gpus in enumerate(samples[1:]):
        gone = k % 3 if k % 5 else None  # none absent now and then
        kept = [g for g in gpus if g.index != gone]
        lacking.append(kept[::-1] if k % 4 == 1 else kept)
    node = NodeHistory(len(lacking), 0)
    looped = _Ring(len(lacking))
    looped.add_lanes(3)
    for gpus in lacking:
        node.add(gpus[0].t, gpus)
        by_index = {g.index: g for g in gpus}
        looped.push(gpus[0].t, [_gpu_readings(by_index.get(i)) for i in range(3)])
    assert node.layout == (0, 1, 2)
    for lane in range(3):
        assert node[lane].series("util")[0] == looped.times_list()
        for c, metric in enumerate(METRICS):
            raw = looped.last_values(c, lane, looped.size)
            kept = node._recent.last_values(c, lane, len(lacking))
            same = [a == b or (a != a and b != b) for a, b in zip(kept, raw, strict=True)]
            assert all(same), (metric, lane, kept, raw)
    util = [node[i].series("util")[1] for i in range(3)]
    assert util[1][2] is None and util[2][3] is None and util[0][4] is None  # absent: None
    assert util[0][2] == 50 and util[0][3] == 50 and util[2][4] == 50  # the others': theirs


async def test_gpus_that_come_go_and_move() -> None:
    """A node's GPUs as its samples name them: a GPU that joins later has its history from its
    first sample on (no points, no minute means from before it), a GPU a sample lacks is
    missing at that time, samples that list the GPUs in another order keep each reading with
    its GPU."""
    messages = recorded_node("n", "3:H100", samples=150, t0=T0)
    samples = messages[1:]
    for k, m in enumerate(samples):
        for g in m["gpus"]:
            g["util_gpu"] = 10 * g["index"] + k % 7  # GPU i reads 10 i + (k mod 7)
        if k < 100:  # GPU 2 joins with the 101st sample
            m["gpus"] = [g for g in m["gpus"] if g["index"] != 2]
        if k == 120:  # GPU 1 is not in this one
            m["gpus"] = [g for g in m["gpus"] if g["index"] != 1]
        if k >= 130:  # from here the agent lists them backwards
            m["gpus"].reverse()
    fleet = await replaying(messages, history_len=100, history_older=10)
    try:
        times0, util0 = fleet.history("n", 0).series("util")
        times1, util1 = fleet.history("n", 1).series("util")
        times2, util2 = fleet.history("n", 2).series("util")
        recent = [T0 + k for k in range(50, 150)]
        assert times0[-100:] == recent and times1 == times0
        assert util0[-100:] == [k % 7 for k in range(50, 150)]
        # GPU 1: missing in sample 120, its own readings before and after (reversed order too)
        assert util1[-100:] == [None if k == 120 else 10 + k % 7 for k in range(50, 150)]
        # GPU 2: from its first sample on, nothing before (no minute mean of a time it was not
        # there: its first bucket is the one holding its first sample, after the recent ones
        # begin)
        assert times2 == [T0 + k for k in range(100, 150)]
        assert util2 == [20 + k % 7 for k in range(100, 150)]
        assert len(fleet.history("n", 2)) == 50 and len(fleet.history("n", 0)) == len(times0)
        assert fleet.history("n", 2).recent("util", 3) == [20 + k % 7 for k in (147, 148, 149)]
        assert fleet.history("n", 2).recent("util", 80) == util2
        # the older means: GPU 0's from before the recent samples, whole minutes
        assert len(times0) > 100 and all(t <= T0 + 50 for t in times0[:-100])
    finally:
        await fleet.stop()


def test_minute_means_leave_out_what_is_missing() -> None:
    """An older point is the mean of its bucket's readings, what is missing left out (None, a
    value past the column, NaN, an infinite power), None when nothing is left. (Summed in C
    over the arrays since the history is kept per node; the same means as the lists before.)"""
    from gpuctl.core.model import GpuSample
    from gpuctl.fleet.gpu_history import GpuHistory

    hist = GpuHistory(recent=12, older=5, step=10.0)
    utils = [10, None, 30, 300, 50, 60, 70, 80, 90, 100] + [None] * 10 + list(range(10))
    powers = [100.0, None, math.nan, 1e308, 200.0, -1e308, 300.0, 400.0, 500.0, 600.0]
    powers += [None] * 10 + [7.5] * 10
    for k, (u, p) in enumerate(zip(utils, powers, strict=True)):
        hist.add(GpuSample(index=3, t=T0 - 20 + k, util_gpu=u, power=p, mem_used=k * 2**30))
    for k in range(30, 42):  # 12 more: the recent ones, after the three buckets
        hist.add(GpuSample(index=3, t=T0 - 20 + k, util_gpu=1, power=1.0))
    times, util = hist.series("util")
    power = hist.series("power")[1]
    mem = hist.series("mem_gib")[1]
    assert times[:3] == [T0 - 15, T0 - 5, T0 + 5]  # T0 - 20 starts a bucket; each at its middle
    # (an integer column keeps its mean rounded: 61.25, 4.5)
    assert util[:3] == [61, None, 4]
    assert power[:3] == [(100.0 + 200.0 + 300.0 + 400.0 + 500.0 + 600.0) / 6, None, 7.5]
    assert mem[:3] == [4.5, 14.5, 24.5]
    assert util[3:] == [1] * 12 and len(hist) == 15


def test_a_node_sampled_at_10_hz_keeps_whole_minutes_in_its_means() -> None:
    """An agent may sample every 0.1 s: its recent samples hold a minute at least, so that a
    minute's mean is of all its 600 samples (with 300 kept it was of the minute's last 30 s)."""
    node = NodeHistory.sized(interval=0.1)
    t0 = 1_700_000_040.0  # a minute's start
    for k in range(13 * 600 + 1):  # the 10 s samples cover 10 minutes before the last one
        busy = 100 if k % 600 >= 300 else 0  # idle the first half of each minute
        node.add(t0 + k / 10, [Reading(index=0, util_gpu=busy, temp=40)])
    times, util = node[0].series("util")
    assert times[0] == t0 + 30 and util[0] == 50
