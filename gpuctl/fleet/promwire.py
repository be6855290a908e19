"""The Prometheus reader's answers (``gpuctl.fleet.prom``): the labels gpuctl reads, the HTTP
API's instant and range answers typed for msgspec, and ``PromClient``, which asks a query
through the HTTP client (``gpuctl.fleet.promhttp``: bounded in bytes and time) and decodes its
answer, bounded in series (``prometheus_max_series``): the series are counted in the bytes
before they are decoded, so that an answer of too many never becomes objects, and JSON nested
too deep (msgspec's skipping of a label gpuctl does not read recursed into ``RecursionError``)
is one line like any answer that is not the API's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec

from gpuctl.config import PrometheusConfig as PromTarget
from gpuctl.fleet.promhttp import PromError, PromHttp

T = TypeVar("T")

HOST_LABELS = ("Hostname", "hostname", "node", "instance")  # the first one present names it
UUID_LABELS = ("UUID", "uuid")
MODEL_LABELS = ("modelName", "model")
DRIVER_LABEL = "DCGM_FI_DRIVER_VERSION"
# The Slurm (HPC) job on a GPU: DCGM exporter started with --hpc-job-mapping-dir (or
# DCGM_HPC_JOB_MAPPING_DIR) reads one file per GPU there, a job id a line, and copies each
# series once per job with this label (internal/pkg/transformation/hpc.go). It has no label
# for the job's user.
JOB_LABEL = "hpc_job"


# -- the HTTP API's answers, typed (msgspec decodes them without a dict per series) ----------
# gc=False: a poll's answers are hundreds of thousands of these, and the process holds millions
# of objects (the fleet's 4-hour history): each allocation of tracked objects counts towards a
# collection of that whole heap. Decoding 26 answers of 5,464 series with 2 million dicts
# alive took 0.28 s tracked, 0.047 s untracked. They hold strings and floats: no cycle.
class Labels(msgspec.Struct, gc=False):
    """The labels gpuctl reads (``HOST_LABELS``, ``gpu``, ``UUID_LABELS``, ``MODEL_LABELS``,
    ``DRIVER_LABEL``); any other is skipped while decoding. A poll's answers for 16,384 GPUs
    hold 440,000 label sets: decoding them costs ~0.6 s of CPU here (``json.loads`` into
    dicts 3.7x that) and grouping them ~0.26 s (``benchmarks/prom_scale.py --decode-only``)."""

    Hostname: str = ""
    hostname: str = ""
    node: str = ""
    instance: str = ""
    gpu: str = ""
    UUID: str = ""
    uuid: str = ""
    modelName: str = ""
    model: str = ""
    DCGM_FI_DRIVER_VERSION: str = ""
    hpc_job: str = ""
    GPU_I_ID: str = ""
    GPU_I_PROFILE: str = ""

    def host(self) -> str:
        """The host's name: the first of ``HOST_LABELS`` set ("" when none is)."""
        return self.Hostname or self.hostname or self.node or self.instance

    def host_label(self) -> str:
        for key in HOST_LABELS:
            if getattr(self, key):
                return key
        return HOST_LABELS[0]


class Value(msgspec.Struct, array_like=True, gc=False):
    """An instant vector's ``[time, "value"]``: a struct, not a tuple, as tuples are tracked
    by the GC (decoding 26 answers of 16,384 series with 2 million objects alive: 0.15 s,
    0.17 s with tuples)."""

    t: float
    text: str


class Series(msgspec.Struct, gc=False):
    metric: Labels
    value: Value


class RangeSeries(msgspec.Struct, gc=False):
    metric: Labels
    values: list[tuple[float, str]]


class VectorData(msgspec.Struct):
    resultType: str
    result: list[Series]


class MatrixData(msgspec.Struct):
    resultType: str
    result: list[RangeSeries]


class VectorReply(msgspec.Struct):
    status: str
    data: VectorData | None = None


class MatrixReply(msgspec.Struct):
    status: str
    data: MatrixData | None = None


_VECTOR = msgspec.json.Decoder(VectorReply)
_MATRIX = msgspec.json.Decoder(MatrixReply)


# A series in an answer (Prometheus writes its JSON compact): counted in the bytes before they
# are decoded, so that an answer of more than ``max_series`` is refused before its objects are
# made (a label value holding this text only makes the count larger: refused sooner).
_SERIES_KEY = b'"metric":'


class PromClient:
    """Queries to one store's HTTP API, their answers decoded (``promhttp.PromHttp`` asks,
    bounded in bytes and time; here, series): coroutines on the fleet's event loop, and
    ``run_blocking`` for ``discover``."""

    def __init__(self, target: PromTarget) -> None:
        self.target = target
        self.http = PromHttp(target)
        self.base = self.http.base
        self.headers = self.http.headers

    def run_blocking(self, work: Callable[[], Awaitable[T]]) -> T:
        return self.http.run_blocking(work)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def _ask(
        self, path: str, form: dict[str, str], decoder: Any, deadline: float | None
    ) -> Any:
        """The ``data.result`` of an answer, decoded by ``decoder`` (vector or matrix), both
        on the HTTP client's I/O thread (``PromHttp.call``)."""
        return await self.http.call(self._fetch(path, form, decoder, deadline))

    async def _fetch(
        self, path: str, form: dict[str, str], decoder: Any, deadline: float | None
    ) -> Any:
        body = await self.http.post(path, form, deadline=deadline)
        cap = self.target.max_series
        if body.count(_SERIES_KEY) > cap:
            raise self._too_many(form["query"], body.count(_SERIES_KEY))
        try:
            reply = decoder.decode(body)
        except (msgspec.DecodeError, RecursionError, UnicodeDecodeError) as e:  # bad UTF-8 too
            why = "nested too deep" if isinstance(e, RecursionError) else str(e)
            raise PromError(
                "protocol",
                f"Prometheus at {self.base}: unexpected answer to {form['query'][:80]!r}: "
                f"{why[:200]}",
            ) from None
        result = reply.data.result if reply.data is not None else []
        if len(result) > cap:
            raise self._too_many(form["query"], len(result))
        return result

    def _too_many(self, query: str, count: int) -> PromError:
        return PromError(
            "too_large",
            f"Prometheus at {self.base}: the answer to {query[:80]!r} holds {count:,} series, "
            f"over prometheus_max_series ({self.target.max_series:,}): "
            f"narrow {self.target.name('prometheus_match')}, or raise that limit (a config key)",
        )

    async def query(self, promql: str, *, deadline: float | None = None) -> list[Series]:
        """The instant vector ``promql`` evaluates to now. Raises PromError."""
        result: list[Series] = await self._ask(
            "/api/v1/query", {"query": promql}, _VECTOR, deadline
        )
        return result

    async def query_range(
        self, promql: str, start: float, end: float, step: float, *, deadline: float | None = None
    ) -> list[RangeSeries]:
        """``promql`` from ``start`` to ``end`` every ``step`` s (``/api/v1/query_range``).
        Raises PromError."""
        form = {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        result: list[RangeSeries] = await self._ask("/api/v1/query_range", form, _MATRIX, deadline)
        return result

    async def query_matrix(
        self, promql: str, *, deadline: float | None = None
    ) -> list[RangeSeries]:
        """The raw samples of a range selector (``x[5m]``) now. Raises PromError."""
        result: list[RangeSeries] = await self._ask(
            "/api/v1/query", {"query": promql}, _MATRIX, deadline
        )
        return result
