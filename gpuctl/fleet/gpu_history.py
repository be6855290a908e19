"""A node's GPU history as numbers: ring buffers per metric, older history as means.

The fleet keeps, per GPU, the last ``recent`` samples as they came and, beyond them, the means
of ``step``-second buckets (1 minute: 4 more hours); a node that samples faster than every 10 s
keeps 5 minutes as they came (1 Hz: 300 samples) and a middle tier of one sample each 10 s for
the 10 minutes before them, 15 minutes in all (``NodeHistory.sized``: 900 samples as they came
were 79% of a GPU's bytes, 467 MB of the screen's 683 at 16,384 GPUs; the detail screen's plot
drew every 3rd or 4th of them). Each metric is one
``array.array`` of the narrowest type that holds it (utilization and temperature in a byte,
clocks in two, memory and power as float32: the registry's ``history`` typecode, see
``gpuctl/node/metrics.py``; the columns are named by its ``name`` and hold its ``shown`` unit).
A ring grows as its points come, up to its size, then stays: a GPU's history costs about
``points * (BYTES_PER_POINT - 8)`` plus the times its node's GPUs share, at most (300 + 60 +
240) * 24 bytes = 14.4 KB at 1 Hz (28.5 KB with 900 samples as they came, allocated whole at a
GPU's first sample). A whole ``GpuSample`` per second (its tuples, its process list) cost
some 1.25 KB per GPU per sample: 1.6 GB at 1,024 GPUs after 19 minutes.

The history is kept per node (``NodeHistory``): its GPUs share the times, and the columns of
one typecode are one array, point by point (a point holds every GPU's values side by side), so
that a sample is one contiguous write per typecode (a slice, in C), not one per GPU and column:
the fleet keeps 4,096 GPU readings a second at 512 nodes, and writing them one by one
(``push_gpu``, code generated per column) was the screen's largest own time (0.89 s of ~10 s
busy in a 30 s profile). With each GPU's ring apart (a point's values ``capacity`` apart: an
extended slice) a sample touched some 100 cache lines of a node's 270 KB of history, cold by
the node's next sample: 19 us a sample at 512 nodes where one node's took 11.6 (measured), 27
us in the screen's run; point by point it touches three: 15-18 us at 512 nodes (alternated
with the old layout's 19, on a shared machine). Reading one GPU's series is the
strided slice instead (a sparkline's dozen values, a detail screen's). ``GpuHistory`` is one
GPU's view of it (what ``Fleet.history`` hands out).

A value the GPU did not report, or could not have (a lost GPU, a GPU missing from a sample, a
negative temperature, a reading too large for its column), is kept as missing and read back as
None. A float column keeps what float32 holds: beyond its range (3.4e38) is infinite.
"""

from __future__ import annotations

import functools
import math
from array import array
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import chain
from operator import attrgetter
from typing import Any

from gpuctl.core.model import GpuSample
from gpuctl.node.metrics import METRICS as REGISTRY

RECENT_KEPT = 900  # seconds of recent history: 15 min, every sample or one each MIDDLE_STEP_S
SAMPLED_S = 300  # of which every sample at a node sampling faster than MIDDLE_STEP_S: 5 min ...
MIDDLE_STEP_S = 10.0  # ... and before them the first sample of each 10 s (a middle tier) ...
OLDER_STEP_S = 60.0  # older history: the mean of each minute ...
OLDER_KEPT = 240  # ... for 4 hours before the recent samples

# The registry's metrics with a history: name -> array typecode. The unit is the registry's
# ``shown`` one: util %, mem_gib GiB, temp °C, power W, clocks MHz, enc/dec %, pcie GB/s.
_KEPT = tuple(m for m in REGISTRY if m.history)
COLUMNS: dict[str, str] = {m.name: m.history or "f" for m in _KEPT}
METRICS = tuple(COLUMNS)
# Integer columns keep their largest value as "missing"; float columns keep NaN.
_MISSING = {code: (1 << (8 * array(code).itemsize)) - 1 for code in ("B", "H")}
BYTES_PER_POINT = 8 + sum(array(code).itemsize for code in COLUMNS.values())  # + time (float64)

_CODES = tuple(COLUMNS.values())
# A column keeps the wire's value (bytes, bytes/s: float32 keeps 24 bits of either as well as
# of GiB) and is scaled to the shown unit when read: no multiplication per reading kept.
_SCALES = tuple(m.scale for m in _KEPT)
_LOST: tuple[None, ...] = (None,) * len(COLUMNS)
_INDEX = attrgetter("index")
_STATE = attrgetter("state")

# The columns of one typecode share one array (a "block"), point by point: at point i of a ring
# of L lanes (GPUs), lane j's column k of a block of K columns is at ``(i * L + j) * K + k``, so
# that a point's values for every GPU and column of a block are one slice, in the order that
# the GPUs' readings come in (GPU by GPU, column by column).
_BLOCK_CODES = tuple(dict.fromkeys(_CODES))
_BLOCK_COLUMNS = tuple(tuple(c for c, code in enumerate(_CODES) if code == b) for b in _BLOCK_CODES)
_BLOCK_LIMITS = tuple(_MISSING.get(code) for code in _BLOCK_CODES)
# Per column: its block, its place in the block, the block's width.
_PLACE = tuple(
    (b, cols.index(c), len(cols))
    for c in range(len(_CODES))
    for b, cols in enumerate(_BLOCK_COLUMNS)
    if c in cols
)
# One GPU's readings of a block's columns, in one call (C); a 1-column block's is the value.
_GETTERS: tuple[Callable[[GpuSample], Any], ...] = tuple(
    attrgetter(*(_KEPT[c].key for c in cols)) for cols in _BLOCK_COLUMNS
)


def _readings(g: GpuSample) -> tuple[float | None, ...]:
    """A sample's values in ``METRICS`` order, as the wire has them (all missing for a lost
    GPU)."""
    if g.lost:
        return _LOST
    return tuple(getattr(g, m.key) for m in _KEPT)


def history_sample(gpu: int, t: float, values: Mapping[str, float | None]) -> GpuSample:
    """A sample holding ``values`` by ``METRICS`` name in the history's units (the inverse of
    ``_readings``): what a store's history (``Fleet.backfill``) is kept from."""

    readings: dict[str, float | int | None] = {}
    for m in _KEPT:
        x = values.get(m.name)
        if x is not None and m.scale != 1.0:
            x = x / m.scale
        readings[m.key] = (
            x if x is None or m.kind != "int" else int(x) if m.scale != 1.0 else round(x)
        )
    return GpuSample(index=gpu, t=t, **readings)  # type: ignore[arg-type]


def _whole(v: float | None, limit: int) -> int:
    """An integer column's value for ``v``: whole numbers as they came, others rounded,
    ``limit`` (missing) for None and what the column cannot hold."""
    if v is None:
        return limit
    n = v if type(v) is int else round(v)
    return n if 0 <= n < limit else limit


def _single(v: float | None) -> float:
    """A float column's value for ``v`` before float32 takes it (NaN for None; an integer past
    a double's range is infinite, as float32 makes any number past its own)."""
    if v is None:
        return math.nan
    try:
        return float(v)
    except OverflowError:
        return math.inf if v > 0 else -math.inf


def _kept(code: str, limit: int | None, values: Sequence[float | None]) -> array[Any]:
    """One column's array for ``values`` (one per GPU), each as the column keeps it."""
    if limit is None:
        return array(code, [_single(v) for v in values])
    return array(code, [_whole(v, limit) for v in values])


def _empty(code: str) -> float:
    return math.nan if code == "f" else _MISSING[code]


# A missing value's bytes per typecode: a ring is made missing from them in one copy (from a
# list of 28,800 values it took ~1 ms a node).
_EMPTY_BYTES = {code: array(code, [_empty(code)]).tobytes() for code in _BLOCK_CODES}


def _loaded(column: int, values: Sequence[float]) -> list[float | None]:
    """A column's kept values as read: missing ones None, in the shown unit."""
    code = _CODES[column]
    if code == "f":
        scale = _SCALES[column]
        return [None if v != v else v * scale for v in values]
    missing = _MISSING[code]
    return [None if v == missing else float(v) for v in values]


class _Ring:
    """Up to ``capacity`` points of ``lanes`` GPUs: one time per point, shared, and per
    typecode one array (a block: see ``_BLOCK_COLUMNS``) of ``lanes * width`` values a point,
    point by point. The arrays grow a point at a time until ``capacity`` (a slot past the end
    is written by extending them: a ring costs what it holds), then the oldest point is
    overwritten."""

    __slots__ = ("blocks", "capacity", "grown", "head", "lanes", "size", "times")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.lanes = 0
        self.times = array("d")  # one per point so far: its length is the points allocated
        self.blocks: list[array[Any]] = [array(code) for code in _BLOCK_CODES]
        self.head = 0  # next slot to write
        self.size = 0
        self.grown = False  # full once: its arrays' room to grow let go

    def add_lanes(self, k: int) -> None:
        """Make room for ``k`` more GPUs, their values missing at the points kept so far (a
        copy, point by point)."""
        blocks = []
        for a, code, cols in zip(self.blocks, _BLOCK_CODES, _BLOCK_COLUMNS, strict=True):
            fill = _EMPTY_BYTES[code] * (k * len(cols))
            span = self.lanes * len(cols)
            b = array(code)
            more = array(code, fill)
            for i in range(len(self.times)):
                b += a[i * span : (i + 1) * span]
                b += more
            blocks.append(b)
        self.blocks = blocks
        self.lanes += k

    def reorder(self, order: Sequence[int]) -> None:
        """Lay the lanes out in ``order`` (old lane numbers, one each)."""
        blocks = []
        for a, cols in zip(self.blocks, _BLOCK_COLUMNS, strict=True):
            width = len(cols)
            span = self.lanes * width
            b = array(a.typecode)
            for i in range(len(self.times)):
                for j in order:
                    start = i * span + j * width
                    b += a[start : start + width]
            blocks.append(b)
        self.blocks = blocks

    def points(self, block: int, n: int, oldest: bool = False) -> array[Any]:
        """A block's newest ``n`` points (``oldest``: its oldest), oldest first (a copy,
        ``n * lanes * width`` values)."""
        a = self.blocks[block]
        span = self.lanes * len(_BLOCK_COLUMNS[block])
        full = self.size == self.capacity
        start = (self.head if full else 0) if oldest else self.head - n
        if start < 0:
            start += self.capacity
        end = start + n
        if end <= self.capacity:
            return a[start * span : end * span]
        return a[start * span :] + a[: (end - self.capacity) * span]

    def advance(self, t: float) -> int:
        """Take the next slot for a point at ``t``; returns it (write the values there, then
        nothing else: the slot is counted already)."""
        i = self.head
        if i < len(self.times):
            self.times[i] = t
            if not i and not self.grown:  # full: a grown array keeps up to 1/16 more room
                self.times = self.times[:]
                self.blocks = [block[:] for block in self.blocks]
                self.grown = True
        else:  # still growing: the blocks' slice at i extends them too
            self.times.append(t)
        self.head = i + 1 if i + 1 < self.capacity else 0
        if self.size < self.capacity:
            self.size += 1
        return i

    def push(self, t: float, rows: Sequence[Sequence[float | None]]) -> None:
        """Keep one point: ``rows`` holds each lane's values in ``METRICS`` order (integer
        columns take whole numbers, others rounded; see ``_kept``)."""
        i = self.advance(t)
        for block, code, limit, cols in zip(
            self.blocks, _BLOCK_CODES, _BLOCK_LIMITS, _BLOCK_COLUMNS, strict=True
        ):
            span = len(cols) * self.lanes
            kept = _kept(code, limit, [row[c] for row in rows for c in cols])
            if len(kept) != span:  # a plain slice would resize the block
                raise ValueError(f"{len(rows)} rows for {self.lanes} lanes")
            block[i * span : (i + 1) * span] = kept

    def last_values(self, column: int, lane: int, n: int) -> list[float]:
        """The newest ``n`` raw values of a lane's column (missing ones as stored), oldest
        first."""
        return self.last_array(column, lane, n).tolist()

    def last_array(self, column: int, lane: int, n: int) -> array[Any]:
        """``last_values`` as an array (a copy)."""
        n = min(n, self.size)
        b, k, width = _PLACE[column]
        a = self.blocks[b]
        span = self.lanes * width
        at = lane * width + k
        start = self.head - n
        if start >= 0:
            return a[start * span + at : self.head * span : span]
        older = a[(self.capacity + start) * span + at : self.capacity * span : span]
        return older + a[at : self.head * span : span]

    def count_since(self, t0: float) -> int:
        """How many of the newest points have a time at or after ``t0``."""
        n = 0
        i = self.head
        while n < self.size:
            i = i - 1 if i > 0 else self.capacity - 1
            if self.times[i] < t0:
                break
            n += 1
        return n

    def first_time(self) -> float:
        return self.times[0 if self.size < self.capacity else self.head]

    def times_list(self) -> list[float]:
        return self.last_times(self.size)

    def last_times(self, n: int) -> list[float]:
        start = self.head - n
        if start >= 0:
            return self.times[start : self.head].tolist()
        return self.times[start:].tolist() + self.times[: self.head].tolist()

    @property
    def nbytes(self) -> int:
        arrays: list[array[Any]] = [self.times, *self.blocks]
        return sum(a.itemsize * len(a) for a in arrays)


class NodeHistory:
    """One node's GPUs' histories, GPU by GPU (``get(index)``, ``items()``: ``GpuHistory``
    views): the recent samples as they came, older ones as ``step``-s means.

    Read it where it is handed out (the event loop's thread); the next sample changes it.
    """

    def __init__(
        self,
        recent: int = RECENT_KEPT,
        older: int = OLDER_KEPT,
        step: float = OLDER_STEP_S,
        middle: int = 0,
        middle_step: float = MIDDLE_STEP_S,
    ) -> None:
        """``recent`` samples as they came, before them ``middle`` samples, one each
        ``middle_step`` s (none: 0), before those ``older`` means of ``step`` s."""
        if recent < 1 or older < 0 or step <= 0 or middle < 0 or middle_step <= 0:
            raise ValueError("history sizes must be positive")
        self.step = step
        self._sizes = (recent, middle, older)
        self._steps = (middle_step, step)
        self.clear()

    @classmethod
    def sized(
        cls,
        seconds: float = RECENT_KEPT,
        interval: float = 1.0,
        older: int = OLDER_KEPT,
        step: float = OLDER_STEP_S,
    ) -> NodeHistory:
        """A node's history for samples every ``interval`` s: ``seconds`` of recent history,
        as the samples came (``seconds / interval`` of them: a 15 s store's 60) or, where more
        than SAMPLED_S and the node samples faster than MIDDLE_STEP_S, the last SAMPLED_S as
        they came and before them one sample each MIDDLE_STEP_S; then ``older`` means of
        ``step`` s.

        At 1 Hz that is 300 + 60 samples where it was 900: 600 points a GPU with the 240
        minutes, not 1,140 (24 bytes a point: 15 KB, not 28.5; at 16,384 GPUs 246 MB, not
        467). The detail screen's plot draws at most 240 points of the whole history, every
        n-th (``detail.MAX_POINTS``): of the 1,140 every 4th (a minute mean every 4 minutes,
        a sample every 4 s; 15 minutes in: every 3rd sample), of the 600 every 2nd (15
        minutes in: each of the last 300 samples, then one each 10 s)."""
        per_s = 1.0 / max(interval, 1.0)  # a node that samples faster keeps its seconds' worth
        if interval >= MIDDLE_STEP_S or seconds <= SAMPLED_S:
            return cls(max(1, math.ceil(seconds * per_s)), older, step)
        middle = math.ceil((seconds - SAMPLED_S) / MIDDLE_STEP_S)
        # a minute's samples at any rate (its mean is of them: 600 at 10 Hz)
        recent = max(math.ceil(SAMPLED_S * per_s), math.ceil(step / max(interval, 1e-3)))
        return cls(recent, older, step, middle, MIDDLE_STEP_S)

    def clear(self) -> None:
        """Forget every GPU and its samples (the buffers are freed)."""
        recent, middle, older = self._sizes
        self._recent = _Ring(recent)
        # The tiers, finer first: the middle keeps the first sample of each 10 s as the
        # recent ring lets it go (the newest SAMPLED_S seconds as they came, before them one
        # sample each 10 s); the older keeps each minute's means as it ends.
        middle_step, step = self._steps
        self._middle = _Tier(_Ring(middle), middle_step) if middle else None
        self._older = _Tier(_Ring(older), step) if older else None
        self._tiers = [tier for tier in (self._middle, self._older) if tier is not None]
        self.layout: tuple[int, ...] = ()  # lane -> GPU index
        self._lane: dict[int, int] = {}  # GPU index -> lane
        self._first: list[float] = []  # lane -> time of its GPU's first sample
        self._views: dict[int, GpuHistory] = {}

    # -- the GPUs, as a mapping of index -> GpuHistory ------------------------------------------
    def get(self, index: int, default: GpuHistory | None = None) -> GpuHistory | None:
        return self._views.get(index, default)

    def __getitem__(self, index: int) -> GpuHistory:
        return self._views[index]

    def __contains__(self, index: object) -> bool:
        return index in self._views

    def __iter__(self) -> Iterator[int]:
        return iter(self._views)

    def __len__(self) -> int:
        return len(self._views)

    def items(self) -> list[tuple[int, GpuHistory]]:
        return list(self._views.items())

    def values(self) -> list[GpuHistory]:
        return list(self._views.values())

    # -- writing -------------------------------------------------------------------------------
    def add(self, t: float, gpus: Sequence[GpuSample]) -> None:
        """Keep one sample of the node's GPUs at ``t`` (a lost GPU's metrics are missing, and
        so are those of a GPU seen before that the sample lacks)."""
        if not gpus:
            return
        self._tiers_before(t)
        if tuple(map(_INDEX, gpus)) != self.layout:
            self._add_any(t, gpus)
            return
        if "lost" in map(_STATE, gpus):
            self._add_any(t, gpus)
            return
        ring = self._recent
        i = ring.advance(t)
        lanes = len(gpus)  # the layout's: one value per lane and column (a plain slice)
        for block, code, getter, cols in zip(
            ring.blocks, _BLOCK_CODES, _GETTERS, _BLOCK_COLUMNS, strict=True
        ):
            span = len(cols) * lanes
            # array() takes a whole block in C when every value fits it (no None, no float in
            # an integer column, nothing past its range): the common case; else each value as
            # ``_kept`` keeps it.
            try:
                if len(cols) > 1:
                    values = list(chain.from_iterable(map(getter, gpus)))
                else:
                    values = list(map(getter, gpus))
                block[i * span : (i + 1) * span] = array(code, values)
            except (TypeError, OverflowError):
                readings = [r[c] for r in map(_readings, gpus) for c in cols]
                block[i * span : (i + 1) * span] = _kept(code, _MISSING.get(code), readings)

    def _tiers_before(self, t: float) -> None:
        """The tiers' part of a sample's write at ``t``, before the recent ring takes it: the
        oldest recent sample, about to go, kept in the middle tier when it is the first of its
        10 s; the older tier's minute closed (its means) when ``t`` begins another."""
        middle, older = self._middle, self._older
        if middle is not None and self._recent.size == self._recent.capacity:
            oldest = self._recent.times[self._recent.head]
            bucket = (oldest // middle.step) * middle.step
            if bucket != middle.bucket:
                middle.bucket = bucket
                self._keep_oldest(middle.ring, oldest)
        if older is not None:
            bucket = (t // older.step) * older.step
            if bucket != older.bucket:
                if older.bucket is not None:
                    self._close_bucket(older.ring, older.bucket)
                older.bucket = bucket

    def _add_any(self, t: float, gpus: Sequence[GpuSample]) -> None:
        """``add`` for any sample: GPUs new to the node get lanes, a GPU the sample lacks is
        missing, the lanes follow the sample's order when it names the same GPUs (the next
        samples take ``add``'s fast path)."""
        by_index = {g.index: g for g in gpus}
        new = [i for i in by_index if i not in self._lane]
        if not new and len(by_index) == len(gpus) < len(self.layout):
            # GPUs the sample lacks (one fell off the bus: every sample from then on) stand in
            # as missing readings, and the sample takes the write in C: 8 H100s with one
            # lacking, 14 us a sample against 11-12 whole (1.2x); value by value it was 24 us
            # (2.1x; ``benchmarks/history_missing_gpu.py``).
            self.add(t, [by_index.get(i) or _absent(i) for i in self.layout])
            return
        if new:
            for ring in self._rings():
                ring.add_lanes(len(new))
            for index in new:
                self._lane[index] = len(self.layout)
                self.layout += (index,)
                self._first.append(t)
                self._views[index] = GpuHistory._view(self, index)
        order = tuple(by_index)
        if order != self.layout and len(order) == len(self.layout) == len(gpus):
            lanes = [self._lane[i] for i in order]
            for ring in self._rings():
                ring.reorder(lanes)
            self._first = [self._first[j] for j in lanes]
            self.layout = order
            self._lane = {index: j for j, index in enumerate(order)}
        self._recent.push(t, [_gpu_readings(by_index.get(i)) for i in self.layout])

    def _rings(self) -> list[_Ring]:
        return [self._recent, *(tier.ring for tier in self._tiers)]

    def _keep_oldest(self, ring: _Ring, t: float) -> None:
        """Keep in ``ring`` the oldest recent point (at ``t``), as it came: a copy per block.
        (Its 10 s's means cost 28 us a node of 8 GPUs every 10 s: a sample's ``add`` took
        11.1 us where it took 8.6 at af2f7f2; with a copy 8.2-9.1, measured alternated.)"""
        recent = self._recent
        if not recent.lanes:
            return
        i = ring.advance(t)
        for b, block in enumerate(ring.blocks):
            span = len(_BLOCK_COLUMNS[b]) * recent.lanes
            block[i * span : (i + 1) * span] = recent.points(b, 1, oldest=True)

    def _close_bucket(self, ring: _Ring, start: float) -> None:
        """Keep in ``ring`` the means of the samples since ``start`` (all still among the
        recent ones when ``recent`` holds a bucket's worth: ``sized`` makes it so)."""
        recent = self._recent
        n = recent.count_since(start)
        if n == 0 or not recent.lanes:
            return
        # Block by block: one copy of its n points, summed in C. Every node closes its minute
        # at once: column by column and lane by lane it took 126 us a node of 8 GPUs, block
        # by block 83 us (measured alternated).
        i = ring.advance(start)
        for b, (block, code, limit, cols) in enumerate(
            zip(ring.blocks, _BLOCK_CODES, _BLOCK_LIMITS, _BLOCK_COLUMNS, strict=True)
        ):
            span = len(cols) * recent.lanes
            points = recent.points(b, n)
            # Each lane's column summed over the n points, in C (a strided slice); the means
            # written as the block keeps them at once when none was missing (the common
            # case), else each as ``_kept`` keeps it.
            sums = [sum(points[j::span]) for j in range(span)]
            if limit is None:
                total = sum(sums)
                if total - total == 0:  # finite: no NaN, no infinity among them
                    block[i * span : (i + 1) * span] = array(code, [x / n for x in sums])
                    continue
                means: list[float | None] = []
                for j, total in enumerate(sums):
                    if total - total == 0:
                        means.append(total / n)
                        continue
                    values = points[j::span]
                    kept = [v for v in values if v == v and abs(v) != math.inf]
                    means.append(sum(kept) / len(kept) if kept else None)
            elif limit in points:  # a missing value among them: counted out
                means = []
                for j, total in enumerate(sums):
                    missing = points[j::span].count(limit)
                    k = n - missing
                    means.append((total - missing * limit) / k if k else None)
            else:  # means of values the column holds: it holds them rounded
                block[i * span : (i + 1) * span] = array(code, [round(x / n) for x in sums])
                continue
            block[i * span : (i + 1) * span] = _kept(code, limit, means)

    # -- reading, one GPU (``GpuHistory``) -----------------------------------------------------
    def _recent_count(self, lane: int) -> int:
        """How many recent points are the GPU's (not from before its first sample)."""
        ring = self._recent
        if ring.size == 0 or self._first[lane] <= ring.first_time():
            return ring.size
        return ring.count_since(self._first[lane])

    def _tier_ranges(self, lane: int) -> list[tuple[int, int]]:
        """The points of each tier (``_tiers``' order) a GPU shows, as positions in its ring's
        ``times_list``: those wholly before the first recent sample and before the first point
        of the finer tier, from the GPU's first sample on (a mean: from its bucket on)."""
        if self._recent.size == 0:
            return [(0, 0)] * len(self._tiers)
        bound = self._recent.first_time()
        since = self._first[lane]
        ranges = []
        for tier in self._tiers:
            starts = tier.ring.times_list()
            if tier is self._middle:  # samples, each at its own time
                end = sum(1 for s in starts if s < bound)
                begin = sum(1 for s in starts[:end] if s < since)
            else:  # means, each of the ``step`` s from its time on
                end = sum(1 for s in starts if s + tier.step <= bound)
                begin = sum(1 for s in starts[:end] if s + tier.step <= since)
            ranges.append((begin, end))
            if end:
                bound = starts[0]
        return ranges

    def _len(self, lane: int) -> int:
        shown = sum(end - begin for begin, end in self._tier_ranges(lane))
        return shown + self._recent_count(lane)

    def _series(self, lane: int, metric: str) -> tuple[list[float], list[float | None]]:
        column = METRICS.index(metric)
        times: list[float] = []
        raw: list[float] = []
        tiers = zip(self._tiers, self._tier_ranges(lane), strict=True)
        for tier, (begin, end) in reversed(list(tiers)):  # the coarsest first
            ring, half = tier.ring, 0.0 if tier is self._middle else tier.step / 2
            times += [s + half for s in ring.times_list()[begin:end]]
            raw += ring.last_values(column, lane, ring.size)[begin:end]
        recent = self._recent
        n = self._recent_count(lane)
        raw += recent.last_values(column, lane, n)
        return times + recent.last_times(n), _loaded(column, raw)

    def _last(self, lane: int, metric: str, n: int) -> list[float | None]:
        column = METRICS.index(metric)
        n = min(max(n, 0), self._recent_count(lane))
        return _loaded(column, self._recent.last_values(column, lane, n))

    @property
    def nbytes(self) -> int:
        """Bytes of the buffers: they grow with the samples kept until the rings are full,
        then stay."""
        return sum(ring.nbytes for ring in self._rings())


class _Tier:
    """A ring of ``step``-s buckets' means (the older tier) or of a sample each (the middle
    tier), and the start of the bucket being filled (older) or of the last one kept
    (middle)."""

    __slots__ = ("bucket", "ring", "step")

    def __init__(self, ring: _Ring, step: float) -> None:
        self.ring = ring
        self.step = step
        self.bucket: float | None = None


@functools.lru_cache(maxsize=1024)
def _absent(index: int) -> GpuSample:
    """GPU ``index`` as a sample that lacks it is kept: every kept reading already what its
    column keeps as missing (NaN, an integer column's largest value), so ``add`` writes it as
    the others' readings, in C, and it reads back None (as ``_kept`` keeps a None)."""
    missing: dict[str, Any] = {m.key: _empty(code) for m, code in zip(_KEPT, _CODES, strict=True)}
    return GpuSample(index=index, **missing)


def _gpu_readings(g: GpuSample | None) -> tuple[float | None, ...]:
    return _LOST if g is None else _readings(g)


class GpuHistory:
    """One GPU's history (a view of its node's ``NodeHistory``): the recent samples as they
    came, older ones as ``step``-s means. Made alone (``GpuHistory(recent, older, step)``) it
    keeps one GPU's samples (``add``).

    Read it where it is handed out (the event loop's thread); the next sample changes it.
    """

    __slots__ = ("_index", "_node")

    def __init__(
        self, recent: int = RECENT_KEPT, older: int = OLDER_KEPT, step: float = OLDER_STEP_S
    ) -> None:
        self._node = NodeHistory(recent, older, step)
        self._index: int | None = None

    @classmethod
    def _view(cls, node: NodeHistory, index: int) -> GpuHistory:
        view = cls.__new__(cls)
        view._node = node
        view._index = index
        return view

    def add(self, g: GpuSample) -> None:
        """Keep one sample of this GPU (a lost GPU's metrics are missing)."""
        if self._index is None:
            self._index = g.index
        self._node.add(g.t, (g,))

    def _lane(self) -> int | None:
        return None if self._index is None else self._node._lane.get(self._index)

    def __len__(self) -> int:
        lane = self._lane()
        return 0 if lane is None else self._node._len(lane)

    def series(self, metric: str) -> tuple[list[float], list[float | None]]:
        """(times, values), oldest first: the older means (each at its minute's middle), then
        every recent sample. Raises KeyError for a metric not in ``METRICS``."""
        if metric not in COLUMNS:
            raise KeyError(metric)
        lane = self._lane()
        return ([], []) if lane is None else self._node._series(lane, metric)

    def recent(self, metric: str, n: int) -> list[float | None]:
        """The last ``n`` recent values of ``metric``, oldest first (fewer if fewer came)."""
        if metric not in COLUMNS:
            raise KeyError(metric)
        lane = self._lane()
        return [] if lane is None else self._node._last(lane, metric, n)

    @property
    def nbytes(self) -> int:
        """This GPU's share of its node's buffers (they grow until the rings are full)."""
        node = self._node
        return node.nbytes // max(1, len(node))


EMPTY = GpuHistory(recent=1, older=0)  # what ``Fleet.history`` hands out for an unknown GPU
