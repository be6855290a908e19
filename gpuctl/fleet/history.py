"""A GPU's history as numbers: fixed-size ring buffers per metric, older history as means.

The fleet keeps, per GPU, the last ``recent`` samples as they came (1 Hz: 15 minutes) and,
beyond them, the means of ``step``-second buckets (1 minute: 4 more hours). Each metric is one
``array.array`` of the narrowest type that holds it (utilization and temperature in a byte,
clocks in two, memory and power as float32), allocated full when the GPU first reports, so a
GPU's history costs the same bytes after a minute as after a week: about
``(recent + older) * BYTES_PER_POINT``. A whole ``GpuSample`` per second (its tuples, its
process list) cost some 1.25 KB per GPU per sample: 1.6 GB at 1,024 GPUs after 19 minutes.

A value the GPU did not report, or could not have (a lost GPU, a negative temperature, a
reading too large for its column), is kept as missing and read back as None.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence

from gpuctl.core.format import GIB
from gpuctl.core.model import GpuSample

RECENT_KEPT = 900  # samples as they came: 15 min at 1 Hz
OLDER_STEP_S = 60.0  # older history: the mean of each minute ...
OLDER_KEPT = 240  # ... for 4 hours before the recent samples

# metric -> array typecode; the unit is the screen's: util %, mem GiB, temp °C, power W, MHz.
COLUMNS: dict[str, str] = {
    "util": "B",
    "temp": "B",
    "sm_clock": "H",
    "mem_clock": "H",
    "mem": "f",
    "power": "f",
}
METRICS = tuple(COLUMNS)
# Integer columns keep their largest value as "missing"; float columns keep NaN.
_MISSING = {code: (1 << (8 * array(code).itemsize)) - 1 for code in ("B", "H")}
BYTES_PER_POINT = 8 + sum(array(code).itemsize for code in COLUMNS.values())  # + time (float64)


def _reading(g: GpuSample, metric: str) -> float | None:
    if metric == "util":
        return g.util_gpu
    if metric == "temp":
        return g.temp
    if metric == "sm_clock":
        return g.sm_clock
    if metric == "mem_clock":
        return g.mem_clock
    if metric == "mem":
        return None if g.mem_used is None else g.mem_used / GIB
    return g.power


class _Ring:
    """``capacity`` points (a time and one value per metric); the oldest is overwritten."""

    __slots__ = ("capacity", "columns", "head", "size", "times")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.times = array("d", bytes(8 * capacity))
        self.columns = [array(code, [_empty(code)]) * capacity for code in COLUMNS.values()]
        self.head = 0  # next slot to write
        self.size = 0

    def push(self, t: float, values: Sequence[float | None]) -> None:
        i = self.head
        self.times[i] = t
        for column, code, v in zip(self.columns, COLUMNS.values(), values, strict=True):
            column[i] = _stored(code, v)
        self.head = (i + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def _ordered(self, a: array) -> array:  # type: ignore[type-arg]
        if self.size < self.capacity:
            return a[: self.size]
        return a[self.head :] + a[: self.head]

    def first_time(self) -> float:
        return self.times[0 if self.size < self.capacity else self.head]

    def times_list(self) -> list[float]:
        return self._ordered(self.times).tolist()

    def values(self, metric: str, last: int | None = None) -> list[float | None]:
        code = COLUMNS[metric]
        a = self._ordered(self.columns[METRICS.index(metric)])
        if last is not None:
            a = a[-last:] if last > 0 else a[:0]
        return [_loaded(code, v) for v in a]

    @property
    def nbytes(self) -> int:
        arrays = [self.times, *self.columns]
        return sum(a.itemsize * len(a) for a in arrays)


def _empty(code: str) -> float:
    return math.nan if code == "f" else _MISSING[code]


def _stored(code: str, v: float | None) -> float:
    if v is None or v != v:
        return _empty(code)
    if code == "f":
        return v if abs(v) < 3e38 else math.copysign(math.inf, v)  # float32's range
    n = round(v)
    return n if 0 <= n < _MISSING[code] else _MISSING[code]


def _loaded(code: str, v: float) -> float | None:
    if code == "f":
        return None if v != v else v
    return None if v == _MISSING[code] else float(v)


class GpuHistory:
    """One GPU's history: the recent samples as they came, older ones as ``step``-s means.

    Read it where it is handed out (the event loop's thread); the next sample changes it.
    """

    def __init__(
        self, recent: int = RECENT_KEPT, older: int = OLDER_KEPT, step: float = OLDER_STEP_S
    ) -> None:
        if recent < 1 or older < 0 or step <= 0:
            raise ValueError("history sizes must be positive")
        self.step = step
        self._recent = _Ring(recent)
        self._older = _Ring(max(older, 1))
        self._keep_older = older > 0
        # The bucket being averaged: its start, and per metric a sum and a count.
        self._bucket: float | None = None
        self._sums = array("d", bytes(8 * len(COLUMNS)))
        self._counts = array("L", bytes(array("L").itemsize * len(COLUMNS)))

    def add(self, g: GpuSample) -> None:
        """Keep one sample (a lost GPU's metrics are missing)."""
        values = [None if g.lost else _reading(g, m) for m in METRICS]
        self._recent.push(g.t, values)
        if not self._keep_older:
            return
        bucket = math.floor(g.t / self.step) * self.step
        if self._bucket is not None and bucket != self._bucket:
            self._close_bucket()
        self._bucket = bucket
        for i, v in enumerate(values):
            if v is not None and math.isfinite(v):
                self._sums[i] += v
                self._counts[i] += 1

    def _close_bucket(self) -> None:
        assert self._bucket is not None
        means = [s / n if n else None for s, n in zip(self._sums, self._counts, strict=True)]
        self._older.push(self._bucket, means)
        for i in range(len(self._sums)):
            self._sums[i] = 0.0
            self._counts[i] = 0

    def _older_count(self) -> int:
        """How many older means lie wholly before the first recent sample."""
        if not self._keep_older or self._recent.size == 0:
            return 0
        first = self._recent.first_time()
        starts = self._older.times_list()
        return sum(1 for s in starts if s + self.step <= first)

    def __len__(self) -> int:
        return self._older_count() + self._recent.size

    def series(self, metric: str) -> tuple[list[float], list[float | None]]:
        """(times, values), oldest first: the older means (each at its minute's middle), then
        every recent sample. Raises KeyError for a metric not in ``METRICS``."""
        if metric not in COLUMNS:
            raise KeyError(metric)
        n = self._older_count()
        times = [s + self.step / 2 for s in self._older.times_list()[:n]]
        values = self._older.values(metric)[:n]
        return times + self._recent.times_list(), values + self._recent.values(metric)

    def recent(self, metric: str, n: int) -> list[float | None]:
        """The last ``n`` recent values of ``metric``, oldest first (fewer if fewer came)."""
        return self._recent.values(metric, n)

    @property
    def nbytes(self) -> int:
        """Bytes of the buffers: fixed from the first sample on."""
        sums = self._sums.itemsize * len(self._sums) + self._counts.itemsize * len(self._counts)
        return self._recent.nbytes + self._older.nbytes + sums


EMPTY = GpuHistory(recent=1, older=0)  # what ``Fleet.history`` hands out for an unknown GPU
