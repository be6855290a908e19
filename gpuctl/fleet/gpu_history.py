"""A GPU's history as numbers: fixed-size ring buffers per metric, older history as means.

The fleet keeps, per GPU, the last ``recent`` samples as they came (1 Hz: 15 minutes) and,
beyond them, the means of ``step``-second buckets (1 minute: 4 more hours). Each metric is one
``array.array`` of the narrowest type that holds it (utilization and temperature in a byte,
clocks in two, memory and power as float32: the registry's ``history`` typecode, see
``gpuctl/node/metrics.py``; the columns are named by its ``name`` and hold its ``shown`` unit),
allocated full when the GPU first reports, so a
GPU's history costs the same bytes after a minute as after a week: about
``(recent + older) * BYTES_PER_POINT``. A whole ``GpuSample`` per second (its tuples, its
process list) cost some 1.25 KB per GPU per sample: 1.6 GB at 1,024 GPUs after 19 minutes.

A value the GPU did not report, or could not have (a lost GPU, a negative temperature, a
reading too large for its column), is kept as missing and read back as None.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Mapping, Sequence

from gpuctl.core.model import GpuSample
from gpuctl.node.metrics import METRICS as REGISTRY

RECENT_KEPT = 900  # samples as they came: 15 min at 1 Hz
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


def _readings(g: GpuSample) -> tuple[float | None, ...]:
    """A sample's values in ``METRICS`` order (all missing for a lost GPU)."""
    if g.lost:
        return _LOST
    out: list[float | None] = []
    for m in _KEPT:
        v = getattr(g, m.key)
        out.append(v if v is None or m.scale == 1.0 else v * m.scale)
    return tuple(out)


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


_LOST: tuple[None, ...] = (None,) * len(COLUMNS)
# Per column: None for a float column, else the integer that stands for "missing".
_LIMITS = tuple(_MISSING.get(code) for code in COLUMNS.values())


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
        """Keep one point; integer columns take whole numbers (a reading) or are rounded."""
        i = self.head
        self.times[i] = t
        for column, limit, v in zip(self.columns, _LIMITS, values, strict=True):
            if v is None:
                column[i] = math.nan if limit is None else limit
            elif limit is None:  # float32: what it cannot hold is infinite
                column[i] = v if -3e38 < v < 3e38 or v != v else math.copysign(math.inf, v)
            else:
                n = v if type(v) is int else round(v)
                column[i] = n if 0 <= n < limit else limit
        self.head = i + 1 if i + 1 < self.capacity else 0
        if self.size < self.capacity:
            self.size += 1

    # push_gpu(self, t, g): ``push(t, _readings(g))`` written out per column, made from the
    # registry below (``_push_gpu_source``): the fleet keeps every GPU's sample (4,096 a second
    # at 512 nodes), and the tuple, the loop over the columns and the tests of each column's
    # kind cost more than the stores.
    push_gpu: Callable[[float, GpuSample], None]

    def last_values(self, column: int, n: int) -> list[float]:
        """The newest ``n`` raw values of a column (missing ones as stored), oldest first."""
        n = min(n, self.size)
        a = self.columns[column]
        start = self.head - n
        if start >= 0:
            return a[start : self.head].tolist()
        return a[start:].tolist() + a[: self.head].tolist()

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


def _push_gpu_source() -> str:
    """The source of ``_Ring.push_gpu``: one store per history column, as ``push`` keeps it
    (an integer column takes the reading as it came: the registry's test holds that such a
    reading needs no scale)."""
    lines = [
        "def push_gpu(self, t, g):",
        "    if g.lost:",
        "        self.push(t, _LOST)",
        "        return",
        "    i = self.head",
        "    self.times[i] = t",
        "    columns = self.columns",
    ]
    for n, m in enumerate(_KEPT):
        lines.append(f"    v = g.{m.key}")
        if m.history == "f":
            scaled = "v" if m.scale == 1.0 else f"v * {m.scale!r}"
            lines.append(f"    x = math.nan if v is None else {scaled}")
            lines.append(f"    columns[{n}][i] = x if -3e38 < x < 3e38 else _single(x)")
        else:
            limit = _MISSING[COLUMNS[m.name]]
            lines.append(
                f"    columns[{n}][i] = v if type(v) is int and 0 <= v < {limit} "
                f"else _whole(v, {limit})"
            )
    lines += [
        "    self.head = i + 1 if i + 1 < self.capacity else 0",
        "    if self.size < self.capacity:",
        "        self.size += 1",
    ]
    return "\n".join(lines) + "\n"


def _whole(v: float | None, limit: int) -> int:
    """An integer column's value for ``v`` as ``_Ring.push`` keeps it (``limit``: missing)."""
    if v is None:
        return limit
    n = v if type(v) is int else round(v)
    return n if 0 <= n < limit else limit


def _single(v: float) -> float:
    """A float column's value for ``v`` as ``_Ring.push`` keeps it: what float32 cannot hold
    is infinite, NaN stays NaN."""
    return v if v != v else math.copysign(math.inf, v)


def _empty(code: str) -> float:
    return math.nan if code == "f" else _MISSING[code]


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
        self._bucket: float | None = None  # start of the bucket the newest samples are in

    def add(self, g: GpuSample) -> None:
        """Keep one sample (a lost GPU's metrics are missing)."""
        if self._keep_older:
            bucket = (g.t // self.step) * self.step
            if bucket != self._bucket:
                if self._bucket is not None:
                    self._close_bucket(self._bucket)
                self._bucket = bucket
        self._recent.push_gpu(g.t, g)

    def _close_bucket(self, start: float) -> None:
        """Keep the means of the samples since ``start`` (all still among the recent ones
        when ``recent`` holds a bucket's worth: 900 samples, 60 s buckets at up to 15 Hz)."""
        recent = self._recent
        n = recent.count_since(start)
        if n == 0:
            return
        means: list[float | None] = []
        for column, limit in enumerate(_LIMITS):
            values = recent.last_values(column, n)
            if limit is None:
                kept = [v for v in values if v == v and abs(v) != math.inf]
            else:
                kept = [v for v in values if v != limit]
            means.append(sum(kept) / len(kept) if kept else None)
        self._older.push(start, means)

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
        return self._recent.nbytes + self._older.nbytes


EMPTY = GpuHistory(recent=1, older=0)  # what ``Fleet.history`` hands out for an unknown GPU


def _make_push_gpu() -> None:
    scope: dict[str, object] = {"math": math, "_LOST": _LOST, "_single": _single, "_whole": _whole}
    exec(compile(_push_gpu_source(), "<history push_gpu>", "exec"), scope)
    _Ring.push_gpu = scope["push_gpu"]  # type: ignore[assignment]


_make_push_gpu()
