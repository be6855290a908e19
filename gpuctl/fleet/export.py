"""The fleet as one Prometheus / OpenMetrics endpoint: ``gpuctl export``.

GPU metrics carry the labels ``node``, ``gpu``, ``uuid`` and ``model``; where DCGM exporter has a
metric for the same reading, the name and unit are DCGM exporter's (``DCGM_FI_DEV_GPU_UTIL`` in %,
``DCGM_FI_DEV_FB_USED`` in MiB, ...) so that dashboards made for it work; the rest are
``gpuctl_*``. ``METRICS`` is made from the metric registry (``gpuctl/node/metrics.py``: each
reading with a DCGM name) and what is derived from readings (free memory, throttle bits, ECC
counts); the README's metrics table is the registry's (``gpuctl.metrics_table``).

Why the exposition is written here and not by prometheus-client: its collector built a Sample
object per series at every scrape, 134k of them at 4,096 GPUs, and wrote each one's labels again:
a scrape took 2.3 s median (p99 7.2 s) and 1.29 s of CPU, near Prometheus's 10 s timeout.
``FleetExporter`` does the work once per change instead. A GPU's label sets are escaped once and
kept while its node's hello says the same (``_GpuLines``). A node's lines are formatted once per
snapshot: the fleet replaces a node's snapshot whole on every change, so ``is`` tells which nodes
changed since the last scrape, and the others' text is reused. The body is joined once per set
of snapshots and kept as bytes (and gzipped once, when a client asks for gzip); only the age of
each node's newest sample is written per scrape, as a separate piece (a separate gzip member,
which HTTP clients read as one stream). A node's METRICS families are one ``%`` of a template
holding its GPUs' line starts over each family's values (C calls, not a loop per line). At 4,096
GPUs (``benchmarks/export_scrape.py --against`` the old code, alternated runs on a 2-core test
machine): new snapshots of every node at each scrape, 84 ms median and 82 ms of CPU per scrape
(0.06x of prometheus-client's 1.33 s); the same samples scraped again, 6.5 ms of CPU.

Serving: one thread runs its own asyncio loop for every connection (``MetricsServer``), so another
local user holding hundreds of idle connections costs no thread: a request head must arrive
within ``read_timeout`` of the connection (then it is closed); an answer is written in slices, and
cut when the kernel has taken none of it for ``stall_timeout`` (a client that never reads holds
its slot 10 s, not the 60 s of ``write_timeout``). At most ``max_connections`` are open and at
most ``per_peer`` of them (a quarter) one peer's; a peer on loopback is a uid (``peer_of``: the
kernel's socket diagnostics name the owner of the other end), since every local user connects
from 127.0.0.1. A connection past either bound takes the slot of one that sent nothing yet, else
of an answer stalled for ``STALL_GRACE`` (1 s); it is refused only when every slot is an answer
that moves. 80 connections of one user that ask and never read left the old server's 64 slots
full for 60 s, and every scrape was reset. With a ``Credential`` (``--auth-file``) a request
without the secret gets 401 before anything renders.

XIDs: ``XidCounts`` counts an XID only for a GPU the node's hello named, only within 1..XID_MAX,
and at most XIDS_PER_GPU distinct XIDs per GPU; what it refuses is counted per node. An agent that
sent 100,000 made-up XIDs had made 100,000 series (8 MB per scrape).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import concurrent.futures
import gzip
import hmac
import logging
import os
import socket
import struct
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass, field
from itertools import chain
from operator import attrgetter
from typing import Any

from gpuctl.config.files import unsafe_secret
from gpuctl.core import deadline
from gpuctl.core.deadline import wait_for
from gpuctl.core.model import GpuSample, GpuStatic, NodeEvent, NodeSnapshot, NodeState
from gpuctl.core.text import printable
from gpuctl.fleet.fleet import Fleet
from gpuctl.node.metrics import METRICS as REGISTRY
from gpuctl.node.metrics import Metric
from gpuctl.node.protocol import THROTTLE_REASONS

log = logging.getLogger(__name__)

DEFAULT_LISTEN = "127.0.0.1:9400"  # DCGM exporter's port: the scrape config stays the same
GPU_LABELS = ("node", "gpu", "uuid", "model")
MIB = 1 << 20
XID_MAX = 255  # XIDs are small positive integers: NVIDIA's catalogue stays below 256
XIDS_PER_GPU = 32  # distinct XIDs counted per GPU (a failing GPU shows a handful)
TEXT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
GZIP_LEVEL = 1  # 18 MB of text at 4,096 GPUs: level 1 is ~5x faster than 9 for ~1.3x the bytes


@dataclass(frozen=True)
class GpuMetric:
    """One per-GPU gauge: its name, help, unit and how to read it from a sample."""

    name: str
    help: str
    read: Callable[[GpuSample], float | int | None]
    dcgm: bool = True  # the name is DCGM exporter's


def _mib(v: int | None) -> float | None:
    return None if v is None else v / MIB


def _free(g: GpuSample) -> float | None:
    if g.mem_total is None or g.mem_used is None:
        return None
    return (g.mem_total - g.mem_used) / MIB


def _count(table: str, key: str) -> Callable[[GpuSample], float | int | None]:
    get = attrgetter(table)

    def read(g: GpuSample) -> float | int | None:
        counts = get(g)
        if counts is None:
            return None
        v = counts.get(key)
        if type(v) is int or type(v) is float:  # what JSON gives: exact types are cheap
            return v
        if isinstance(v, bool):
            return int(v)
        return v if isinstance(v, (int, float)) else None

    return read


_THROTTLE_BITS = {name: bit for bit, name in THROTTLE_REASONS}


def _throttle_mask(g: GpuSample) -> int | None:
    reasons = g.throttle
    if reasons is None:
        return None
    if not reasons:
        return 0  # most samples
    return sum(_THROTTLE_BITS.get(name, 0) for name in set(reasons))


_PSTATES = {f"P{n}": n for n in range(16)}


def _pstate(g: GpuSample) -> int | None:
    p = g.pstate
    if p is None:
        return None
    n = _PSTATES.get(p)
    if n is not None or not p.startswith("P") or not p[1:].isdigit():
        return n
    return int(p[1:])


# Help and reading of a registry row whose DCGM value is not its wire value times a scale.
_SPECIAL: dict[str, tuple[str, Callable[[GpuSample], float | int | None]]] = {
    "pstate": ("Performance state, 0 = highest.", _pstate),
}


def _scaled(key: str, scale: float) -> Callable[[GpuSample], float | int | None]:
    get = attrgetter(key)
    if scale == 1.0:
        return get

    def read(g: GpuSample) -> float | None:
        v = get(g)
        return None if v is None else v * scale

    return read


def _from_registry(m: Metric) -> GpuMetric:
    """A registry row's gauge: DCGM exporter's name, in DCGM's unit (MiB for memory)."""
    assert m.dcgm is not None
    special = _SPECIAL.get(m.key)
    if special is not None:
        return GpuMetric(m.dcgm, special[0], special[1])
    unit = "MiB" if m.dcgm_scale == 1 / MIB else m.unit
    return GpuMetric(
        m.dcgm, f"{m.what[:1].upper()}{m.what[1:]} (in {unit}).", _scaled(m.key, m.dcgm_scale)
    )


# The registry's readings with a DCGM name (``gpuctl/node/metrics.py``), then what is derived.
METRICS: tuple[GpuMetric, ...] = (
    *(_from_registry(m) for m in REGISTRY if m.dcgm),
    GpuMetric("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", _free),
    GpuMetric(
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        "Active clock throttle reasons as NVML's bitmask.",
        _throttle_mask,
    ),
    GpuMetric(
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "Corrected (single-bit) volatile ECC errors.",
        _count("ecc", "volatile_corrected"),
    ),
    GpuMetric(
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "Uncorrected (double-bit) volatile ECC errors.",
        _count("ecc", "volatile_uncorrected"),
    ),
    GpuMetric(
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        "Corrected (single-bit) aggregate ECC errors.",
        _count("ecc", "aggregate_corrected"),
    ),
    GpuMetric(
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "Uncorrected (double-bit) aggregate ECC errors.",
        _count("ecc", "aggregate_uncorrected"),
    ),
    GpuMetric(
        "DCGM_FI_DEV_RETIRED_SBE",
        "Pages retired for single-bit errors.",
        _count("retired_pages", "single_bit"),
    ),
    GpuMetric(
        "DCGM_FI_DEV_RETIRED_DBE",
        "Pages retired for double-bit errors.",
        _count("retired_pages", "double_bit"),
    ),
    GpuMetric(
        "DCGM_FI_DEV_RETIRED_PENDING",
        "1 when pages are pending retirement.",
        _count("retired_pages", "pending"),
    ),
    GpuMetric(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "Rows remapped for correctable errors.",
        _count("remapped_rows", "correctable"),
    ),
    GpuMetric(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "Rows remapped for uncorrectable errors.",
        _count("remapped_rows", "uncorrectable"),
    ),
    GpuMetric(
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
        "1 when a row remapping is pending (reset the GPU).",
        _count("remapped_rows", "pending"),
    ),
    GpuMetric(
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "1 when row remapping has failed.",
        _count("remapped_rows", "failure"),
    ),
    GpuMetric("gpuctl_gpu_lost", "1 when the GPU fell off the bus.", lambda g: int(g.lost), False),
)


_READS = tuple(m.read for m in METRICS)


# -- XIDs ----------------------------------------------------------------------------------------
@dataclass
class _NodeXids:
    counts: dict[tuple[int, int], int] = field(default_factory=dict)  # (gpu, xid) -> count
    last: dict[int, int] = field(default_factory=dict)  # gpu -> last xid
    distinct: dict[int, int] = field(default_factory=dict)  # gpu -> distinct xids counted
    refused: int = 0
    version: int = 0


class XidCounts:
    """XIDs seen per (node, GPU) since gpuctl started, kept from the fleet's events.

    ``gpus_of(node)`` is the GPU indices the node's hello named: an XID for another index, one
    outside 1..XID_MAX, or a new one past XIDS_PER_GPU distinct on that GPU is refused (counted
    per node) so that the series stay bounded whatever an agent sends."""

    def __init__(self, gpus_of: Callable[[str], Container[int]] = lambda _node: ()) -> None:
        self._gpus_of = gpus_of
        self._lock = threading.Lock()
        self._nodes: dict[str, _NodeXids] = {}

    def on_event(self, node: str, event: NodeEvent) -> None:
        """A fleet event listener (``Fleet.on_event``): counts ``xid`` events."""
        if event.kind != "xid":
            return
        gpu, xid = event.gpu, event.detail.get("xid")
        with self._lock:
            n = self._nodes.setdefault(node, _NodeXids())
            n.version += 1
            if (
                type(gpu) is int
                and type(xid) is int
                and 1 <= xid <= XID_MAX
                and gpu in self._gpus_of(node)
                and ((gpu, xid) in n.counts or n.distinct.get(gpu, 0) < XIDS_PER_GPU)
            ):
                if (gpu, xid) not in n.counts:
                    n.distinct[gpu] = n.distinct.get(gpu, 0) + 1
                n.counts[gpu, xid] = n.counts.get((gpu, xid), 0) + 1
                n.last[gpu] = xid
            else:
                n.refused += 1

    def versions(self) -> dict[str, int]:
        """Per node, a number that changes with every XID event of the node."""
        with self._lock:
            return {name: n.version for name, n in self._nodes.items()}

    def of(self, node: str) -> tuple[dict[tuple[int, int], int], dict[int, int], int]:
        """The node's counts ((gpu, xid) -> n), last XID per GPU and refused events, as of now."""
        with self._lock:
            n = self._nodes.get(node)
            if n is None:
                return {}, {}, 0
            return dict(n.counts), dict(n.last), n.refused


# -- the text ------------------------------------------------------------------------------------
_EXACT = 1 << 53  # ints up to here are written as ints (exact for any float parser)
_BIG = 1 << 64  # a plain number for the templates: its digits are a float for any parser


def _num(v: object) -> str | None:
    """A value as both formats write it (None: no sample). Go's and Python's parsers read ints,
    Python's float repr, and ``NaN``/``+Inf``/``-Inf`` (the only spellings OpenMetrics allows)."""
    if type(v) is int:  # the readings: checked first
        if -_EXACT < v < _EXACT:
            return str(v)
    elif type(v) is float:
        if v - v == 0.0:  # finite
            return repr(v)
        return "NaN" if v != v else ("+Inf" if v > 0 else "-Inf")
    elif v is None:
        return None
    elif isinstance(v, bool):
        return "1" if v else "0"
    elif not isinstance(v, int | float):
        return None
    try:
        return _num(float(v))
    except OverflowError:  # an int past any float
        return "+Inf" if v > 0 else "-Inf"


def _plain(values: tuple[Any, ...]) -> bool:
    """Every value is a number that ``%s`` writes as both formats want: a finite float or an
    int of at most 64 bits, no None, no bool (C calls only: this runs per node and family)."""
    try:
        total = sum(values)  # TypeError: a None or not a number
        return (
            total - total == 0  # no NaN nor infinity
            and min(values) > -_BIG
            and max(values) < _BIG
            and bool not in map(type, values)
        )
    except TypeError:
        return False


def _escape(value: str) -> str:
    """A label value as the exposition writes it: first ``printable`` (what a node sent, such
    as a model or a host name, may hold terminal escapes and control bytes that the format
    would carry inside quotes to whoever reads the text: ``curl .../metrics | grep``), then
    backslash and double quote escaped, and what UTF-8 cannot carry (a lone surrogate, which
    JSON can) replaced, so that the body always encodes."""
    value = printable(value)  # no control character, no line break
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        value = value.encode("utf-8", "replace").decode("utf-8")
    return value.replace("\\", "\\\\").replace('"', '\\"')


@dataclass(frozen=True)
class _Family:
    name: str  # the OpenMetrics family name
    help: str
    kind: str  # gauge | counter | info | stateset

    def header(self, openmetrics: bool) -> str:
        """HELP and TYPE lines; Prometheus text names counters ``_total`` and info ``_info``,
        and has gauges where OpenMetrics has info and stateset (as prometheus-client wrote)."""
        name, kind = self.name, self.kind
        if not openmetrics:
            if kind == "counter":
                name += "_total"
            elif kind == "info":
                name, kind = name + "_info", "gauge"
            elif kind == "stateset":
                kind = "gauge"
        text = self.help.replace("\\", "\\\\").replace("\n", "\\n")
        return f"# HELP {name} {text}\n# TYPE {name} {kind}\n"


# A family's lines are kept under its name, never its position: FAMILIES alone says the order
# of the exposition, and a family put in between moves no line under another's header.
F_UP = "gpuctl_node_up"
F_STATE = "gpuctl_node_state"
F_AGE = "gpuctl_node_last_sample_age_seconds"  # written per scrape (FleetExporter._ages)
F_IDLE = "gpuctl_gpu_allocated_idle_seconds"  # per scrape too, beside the ages
PER_SCRAPE = (F_AGE, F_IDLE)  # written at each scrape (they change with time, not samples)
F_INFO = "gpuctl_node"
F_THROTTLE = "gpuctl_gpu_throttle_reason"
F_XID_LAST = "DCGM_FI_DEV_XID_ERRORS"
F_XID = "gpuctl_gpu_xid_errors"
F_BURNING = "gpuctl_gpu_burning"
F_SLURM = "gpuctl_gpu_slurm_job"
F_REFUSED = "gpuctl_node_xid_events_refused"
_NODE_FAMILIES = (
    _Family(F_UP, "1 while the node's link is live and its samples current.", "gauge"),
    _Family(F_STATE, "Where the node's link stands.", "stateset"),
    _Family(F_AGE, "Seconds since the node's newest sample.", "gauge"),
    _Family(
        F_IDLE,
        "Seconds a GPU of a running Slurm job (job, user) has been idle (utilization and memory "
        "traffic at or below [fleet] idle_below %); 0 while busy.",
        "gauge",
    ),
    _Family(F_INFO, "What the node's agent said in its hello.", "info"),
)
_GPU_FAMILIES = (
    *(_Family(m.name, m.help, "gauge") for m in METRICS),
    _Family(F_THROTTLE, "1 when a clock throttle reason is active, per reason.", "gauge"),
    _Family(
        F_XID_LAST, "Value of the last XID error seen (0: none since gpuctl started).", "gauge"
    ),
    _Family(F_XID, "XID errors seen since gpuctl started, per XID.", "counter"),
    _Family(F_BURNING, "1 while a gpuctl burn runs on the GPU.", "gauge"),
    _Family(F_SLURM, "The Slurm job that holds the GPU (job), and its user.", "info"),
    _Family(
        F_REFUSED,
        f"XID events not counted: for a GPU the hello did not name, outside 1..{XID_MAX}, or "
        f"past {XIDS_PER_GPU} distinct XIDs on one GPU.",
        "counter",
    ),
)
FAMILIES = (*_NODE_FAMILIES, *_GPU_FAMILIES)
_BY_NAME = {f.name: f for f in FAMILIES}  # names are unique (test_export holds it)
_STATES = tuple(NodeState)
_REASONS = tuple(name for _bit, name in THROTTLE_REASONS)


class _GpuLines:
    """One GPU's label sets, escaped once, as the start of each of its lines."""

    __slots__ = (
        "burning",
        "key",
        "last",
        "metrics",
        "slurm",
        "throttle",
        "throttled",
        "throttled_text",
        "xid",
    )

    def __init__(self, node: str, index: int, uuid: str, model: str) -> None:
        self.key = (uuid, model)
        inner = (
            f'node="{_escape(node)}",gpu="{index}",uuid="{_escape(uuid)}",model="{_escape(model)}"'
        )
        self.metrics = tuple(f"{m.name}{{{inner}}} " for m in METRICS)
        self.throttle = tuple(
            f'gpuctl_gpu_throttle_reason{{{inner},reason="{r}"}} ' for r in _REASONS
        )
        self.last = f"DCGM_FI_DEV_XID_ERRORS{{{inner}}} "
        self.burning = f"gpuctl_gpu_burning{{{inner}}} "
        self.xid = f'gpuctl_gpu_xid_errors_total{{{inner},xid="'
        self.slurm = f"gpuctl_gpu_slurm_job_info{{{inner},"
        self.throttled: tuple[str, ...] | None = None
        self.throttled_text = ""

    def throttle_text(self, reasons: tuple[str, ...]) -> str:
        """The GPU's throttle reason lines (no newline at the end), kept while they stay."""
        if reasons != self.throttled:
            active = set(reasons)
            self.throttled_text = "\n".join(
                f"{start}{int(r in active)}"
                for start, r in zip(self.throttle, _REASONS, strict=True)
            )
            self.throttled = reasons
        return self.throttled_text


class _NodeText:
    """One node's lines per family, for the snapshot (and XID count version) they show."""

    __slots__ = ("age", "frags", "gpus", "label", "layout", "snap", "templates", "xid_version")

    def __init__(self, name: str) -> None:
        self.label = f'node="{_escape(name)}"'
        self.age = f"gpuctl_node_last_sample_age_seconds{{{self.label}}} "
        self.snap: NodeSnapshot | None = None
        self.xid_version = -1
        # per family (by name; one with no line has none), encoded once: the body is one join
        self.frags: dict[str, bytes] = {}
        self.gpus: dict[int, _GpuLines] = {}
        self.layout: list[_GpuLines] = []  # the GPUs the templates are for
        self.templates: list[str] = []

    def render(self, s: NodeSnapshot, xids: XidCounts, version: int) -> None:
        """Format every line of ``s`` (and its XID counts) once."""
        cols: defaultdict[str, list[str]] = defaultdict(list)  # by family name
        node, live = self.label, s.state is NodeState.LIVE
        cols[F_UP].append(f'gpuctl_node_up{{{node},link="{_escape(s.link)}"}} {int(live)}')
        cols[F_STATE].extend(
            f'gpuctl_node_state{{{node},gpuctl_node_state="{st.value}"}} {int(s.state is st)}'
            for st in _STATES
        )
        if s.info is not None:
            i = s.info
            cols[F_INFO].append(
                f'gpuctl_node_info{{{node},hostname="{_escape(i.hostname or "")}",'
                f'driver="{_escape(i.driver or "")}",cuda="{_escape(i.cuda or "")}",'
                f'reader="{_escape(i.reader or "")}"}} 1'
            )
        counts, last, refused = xids.of(s.name)
        if refused:
            cols[F_REFUSED].append(f"gpuctl_node_xid_events_refused_total{{{node}}} {refused}")
        gpus: dict[int, _GpuLines] = {}
        frags: dict[str, str] = {}
        if live:  # no GPU values for a node whose values are not current
            statics = {st.index: st for st in s.info.gpus} if s.info is not None else {}
            shown: list[GpuSample] = []
            for g in s.gpus:
                if g.index in gpus:
                    continue  # an index twice in one sample: one series each, the first
                lines = gpus[g.index] = self._lines(s.name, g, statics.get(g.index))
                shown.append(g)
                if g.throttle is not None:
                    cols[F_THROTTLE].append(lines.throttle_text(g.throttle))
                cols[F_XID_LAST].append(f"{lines.last}{last.get(g.index, 0)}")
                cols[F_BURNING].append(f"{lines.burning}{int(s.burning(g.index))}")
                notes = s.annotations.get(g.index, {})
                job = notes.get("slurm_job")
                if job is not None:
                    user = notes.get("slurm_user") or ""
                    cols[F_SLURM].append(
                        f'{lines.slurm}job="{_escape(str(job))}",user="{_escape(str(user))}"}} 1'
                    )
            frags = self._metrics([gpus[g.index] for g in shown], shown)
            for (gpu, xid), n in sorted(counts.items()):
                st = statics.get(gpu)
                lines = gpus.get(gpu) or self._lines(s.name, None, st, gpu)
                cols[F_XID].append(f'{lines.xid}{xid}"}} {n}')
        self.gpus = gpus  # only the GPUs of this sample: an agent's made-up indices do not pile up
        for name, c in cols.items():
            frags[name] = "\n".join(c) + "\n"
        self.frags = {name: text.encode() for name, text in frags.items() if text}
        self.snap, self.xid_version = s, version

    def _metrics(self, layout: list[_GpuLines], shown: list[GpuSample]) -> dict[str, str]:
        """The METRICS families' text for the GPUs ``shown``: per family one ``%`` of a
        template that holds the GPUs' line starts, kept while they stay the same, over the
        family's values (what a loop over 100k lines cost at 4,096 GPUs is one C call per node
        and family); a family with a gap or a value that is not a plain number goes line by
        line."""
        if len(layout) != len(self.layout) or any(
            a is not b for a, b in zip(layout, self.layout, strict=False)
        ):
            self.layout = layout
            self.templates = [
                "".join(lines.metrics[i].replace("%", "%%") + "%s\n" for lines in layout)
                for i in range(len(METRICS))
            ]
        frags: dict[str, str] = {}
        if not shown:
            return frags
        n = len(shown)
        columns = [
            (i, values)
            for i, read in enumerate(_READS)
            # a reading no GPU of the node has (fan on SXM parts) has no line
            if (values := tuple(map(read, shown))).count(None) != n
        ]
        every = _plain(tuple(chain.from_iterable(values for _, values in columns)))
        for i, values in columns:
            if every or _plain(values):  # one check for the node, per family when it fails
                frags[METRICS[i].name] = self.templates[i] % values
                continue
            lines_of = [
                f"{lines.metrics[i]}{text}"
                for lines, v in zip(layout, values, strict=True)
                if (text := _num(v)) is not None
            ]
            frags[METRICS[i].name] = "\n".join(lines_of) + "\n" if lines_of else ""
        return frags

    def _lines(
        self, node: str, g: GpuSample | None, st: GpuStatic | None, index: int = -1
    ) -> _GpuLines:
        index = g.index if g is not None else index
        uuid = (g.uuid if g is not None else None) or (st.uuid if st is not None else None) or ""
        model = (st.name if st is not None else None) or ""
        lines = self.gpus.get(index)
        if lines is None or lines.key != (uuid, model):
            lines = _GpuLines(node, index, uuid, model)
        return lines


@dataclass
class _Body:
    """The exposition of one set of snapshots, less the age lines, in both pieces."""

    head: bytes  # the families before the age family
    tail: bytes  # the ones after it (and OpenMetrics's EOF)
    gzipped: tuple[bytes, bytes] | None = None


class FleetExporter:
    """The fleet's metrics as exposition text, formatted per change (see the module's doc).

    ``body()`` may be called from any thread; the HTTP server calls it from its own."""

    def __init__(self, fleet: Fleet, *, clock: Callable[[], float] = time.time) -> None:
        self.fleet = fleet
        self.clock = clock
        self.xids = XidCounts(self._hello_gpus)
        fleet.on_event(self.xids.on_event)
        self._lock = threading.Lock()
        self._nodes: dict[str, _NodeText] = {}
        self._bodies: dict[bool, _Body] = {}  # openmetrics -> body of the current texts
        self.renders = 0  # nodes formatted since the start (the tests read it)

    def _hello_gpus(self, node: str) -> Container[int]:
        try:
            info = self.fleet.snapshot(node).info
        except KeyError:
            return ()
        return {st.index for st in info.gpus} if info is not None else ()

    def body(self, *, openmetrics: bool = False, gzipped: bool = False) -> list[bytes]:
        """The exposition as pieces to send in order (gzip members when ``gzipped``)."""
        with self._lock:
            snaps = self.fleet.snapshots()
            versions = self.xids.versions()
            changed = len(snaps) != len(self._nodes)
            texts: dict[str, _NodeText] = {}
            for s in snaps:
                t = self._nodes.get(s.name) or _NodeText(s.name)
                v = versions.get(s.name, 0)
                if t.snap is not s or t.xid_version != v:
                    t.render(s, self.xids, v)
                    self.renders += 1
                    changed = True
                texts[s.name] = t
            self._nodes = texts
            if changed:
                self._bodies.clear()
            body = self._bodies.get(openmetrics)
            if body is None:
                body = self._bodies[openmetrics] = self._join(openmetrics)
            age = self._ages(snaps).encode()
            if not gzipped:
                return [body.head, age, body.tail]
            if body.gzipped is None:
                body.gzipped = (
                    gzip.compress(body.head, GZIP_LEVEL, mtime=0),
                    gzip.compress(body.tail, GZIP_LEVEL, mtime=0),
                )
            return [body.gzipped[0], gzip.compress(age, GZIP_LEVEL, mtime=0), body.gzipped[1]]

    def text(self, *, openmetrics: bool = False) -> str:
        """The whole exposition as one string (tests, debugging)."""
        return b"".join(self.body(openmetrics=openmetrics)).decode()

    def _join(self, openmetrics: bool) -> _Body:
        texts = list(self._nodes.values())
        pieces: list[list[bytes]] = [[], []]
        part = pieces[0]  # the families before the age family; after it, pieces[1]
        for family in FAMILIES:
            if family.name in PER_SCRAPE:
                part = pieces[1]
                continue  # per scrape (``_ages``): the families of PER_SCRAPE stand together
            part.append(family.header(openmetrics).encode())
            name = family.name
            part.extend([t.frags.get(name, b"") for t in texts])
        if openmetrics:
            pieces[1].append(b"# EOF\n")
        return _Body(b"".join(pieces[0]), b"".join(pieces[1]))

    def _ages(self, snaps: Iterable[NodeSnapshot]) -> str:
        """The families written per scrape (``PER_SCRAPE``, in FAMILIES' order): each node's
        sample age, and each GPU of a Slurm job's idle seconds (``Fleet.idle``)."""
        now = self.clock()
        lines: list[str] = []
        for family in FAMILIES:
            if family.name == F_AGE:
                lines.append(family.header(False))  # the same in both formats
                for s in snaps:
                    age = s.age(now)
                    if age is not None:
                        lines.append(f"{self._nodes[s.name].age}{_num(age)}\n")
            elif family.name == F_IDLE:
                lines.append(family.header(False))
                lines.extend(
                    f'{F_IDLE}{{node="{_escape(g.node)}",gpu="{g.gpu}",job="{_escape(g.job)}",'
                    f'user="{_escape(g.user)}"}} {_num(g.seconds)}\n'
                    for g in self.fleet.idle.in_jobs()
                )
        return "".join(lines)


def wants_openmetrics(accept: str) -> bool:
    """Content negotiation as prometheus-client did: OpenMetrics when the Accept header names
    ``application/openmetrics-text`` without a version or with version 1.0.0 or later."""
    for item in accept.split(","):
        kind, *params = (p.strip() for p in item.split(";"))
        if kind != "application/openmetrics-text":
            continue
        version = next((p[8:] for p in params if p.startswith("version=")), "")
        try:
            if not version or int(version.split(".")[0]) >= 1:
                return True
        except ValueError:
            continue
    return False


def wants_gzip(accept_encoding: str) -> bool:
    """The client reads gzip (Prometheus asks for it on every scrape)."""
    for item in accept_encoding.split(","):
        coding, *params = (p.strip() for p in item.split(";"))
        if coding.lower() == "gzip" and not any(
            p.replace(" ", "") in ("q=0", "q=0.0") for p in params
        ):
            return True
    return False


# -- who may read --------------------------------------------------------------------------------
class AuthFileError(Exception):
    """An ``--auth-file`` that cannot be used; the message is one line for the user."""


MIN_SECRET = 16


class Credential:
    """The secret of an ``--auth-file``: a request must carry it as ``Authorization: Bearer
    SECRET`` (Prometheus's ``authorization: {credentials_file: FILE}``) or as the password of
    HTTP basic auth with any user name (``basic_auth: {username: ..., password_file: FILE}``),
    so that Prometheus reads the same file. Compared in constant time."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    @classmethod
    def load(cls, path: str) -> Credential:
        """Read ``path``; AuthFileError when it is missing, unsafe or not one secret."""
        where = f"--auth-file {path}"
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            raise AuthFileError(
                f"{where}: no such file (make one: umask 077; "
                f"head -c 24 /dev/urandom | base64 > {path})"
            ) from None
        except OSError as e:
            raise AuthFileError(f"{where}: {e.strerror or e}") from None
        try:
            unsafe = unsafe_secret(os.fstat(fd), path)
            if unsafe is not None:
                raise AuthFileError(f"{where}: {unsafe}")
            data = os.read(fd, 4097)
        finally:
            os.close(fd)
        secret = data.strip()
        if len(data) > 4096 or len(secret) < MIN_SECRET or not all(33 <= b < 127 for b in secret):
            raise AuthFileError(
                f"{where}: must hold one secret of {MIN_SECRET} to 4096 printable characters, "
                "no spaces"
            )
        return cls(secret)

    def allows(self, authorization: str | None) -> bool:
        """``authorization`` (the header's value) carries the secret."""
        if not authorization:
            return False
        scheme, _, value = authorization.strip().partition(" ")
        given = value.strip().encode("latin-1", "replace")
        if scheme.lower() == "basic":
            try:
                given = base64.b64decode(given, validate=True).partition(b":")[2]
            except (binascii.Error, ValueError):
                return False
        elif scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(given, self._secret)


# -- HTTP ----------------------------------------------------------------------------------------
HEAD_LIMIT = 16 * 1024  # a request head longer than this is refused
SLICE = 256 * 1024  # a response is written this much at a time (bounded memory per connection)
CHALLENGE = 'Bearer realm="gpuctl export", Basic realm="gpuctl export"'
_REASON = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    405: "Method Not Allowed",
    500: "Internal Server Error",
}


READ_TIMEOUT = 10.0
"""Seconds a connection has to send its request head before it is closed (a scraper sends it at
once; an idle connection is closed after this)."""

STALL_TIMEOUT = 10.0
"""Seconds an answer may go without a byte taken by the kernel before its connection is cut (a
scraper reads as fast as the network allows; one that never reads is cut after this, not after
the whole ``write_timeout``)."""

STALL_GRACE = 1.0
"""Seconds without progress after which an answer counts as stalled: when every slot is taken, a
stalled one is cut to make room for a fresh scraper (one that makes progress is never cut)."""


def _proc_net_key(family: int, addr: str, port: int) -> str:
    """How ``/proc/net/tcp{,6}`` writes an address: each 32-bit word in host order, in hex."""
    packed = socket.inet_pton(family, addr)
    words = struct.unpack(f"={len(packed) // 4}I", packed)
    return "".join(f"{w:08X}" for w in words) + f":{port:04X}"


def _is_loopback(addr: str) -> bool:
    return addr.startswith("127.") or addr in ("::1", "localhost") or addr.startswith("::ffff:127.")


def local_uid(sock: socket.socket) -> int | None:
    """The uid of the local process at the other end of the TCP connection ``sock`` (the owner
    of the socket whose address is our peer's and whose peer is us), or None when the peer is
    not on this host (or cannot be found). SO_PEERCRED answers only for Unix sockets: the
    kernel's socket diagnostics (netlink, one exact lookup: 0.04 ms with 5,000 sockets open)
    say it, else its table ``/proc/net/tcp`` (``tcp6``; 17 ms to generate with 5,000)."""
    try:
        peer = sock.getpeername()
        me = sock.getsockname()
    except OSError:
        return None
    uid = _diag_uid(sock.family, peer, me)
    return uid if uid is not None else _table_uid(sock.family, peer, me)


SOCK_DIAG_BY_FAMILY = 20  # linux/sock_diag.h
NETLINK_SOCK_DIAG = 4
INET_DIAG_NOCOOKIE = 0xFFFFFFFF
_NLMSG = struct.Struct("=LHHLL")  # nlmsghdr: len, type, flags, seq, pid
_DIAG_REQ = struct.Struct("=BBBBI")  # inet_diag_req_v2: family, protocol, ext, pad, states


def _diag_uid(family: int, peer: tuple[Any, ...], me: tuple[Any, ...]) -> int | None:
    """``local_uid`` by netlink's sock_diag: the socket from ``peer`` to ``me``, looked up
    exactly (no dump of the table); None when the kernel does not answer it."""

    def addr(a: str) -> bytes:
        return socket.inet_pton(family, a).ljust(16, b"\0")

    sockid = (
        struct.pack("!HH", peer[1], me[1])
        + addr(peer[0])
        + addr(me[0])
        + struct.pack("=III", 0, INET_DIAG_NOCOOKIE, INET_DIAG_NOCOOKIE)
    )
    req = _DIAG_REQ.pack(family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + sockid
    msg = _NLMSG.pack(_NLMSG.size + len(req), SOCK_DIAG_BY_FAMILY, 1, 1, 0) + req  # REQUEST
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as nl:
            nl.settimeout(1.0)
            nl.sendto(msg, (0, 0))
            data = nl.recv(8192)
    except (OSError, AttributeError):  # AttributeError: no AF_NETLINK (not Linux)
        return None
    # inet_diag_msg after the header: family, state, timer, retrans, the 48-byte socket id,
    # expires, rqueue, wqueue, then the uid
    if len(data) < _NLMSG.size + 68 or _NLMSG.unpack_from(data)[1] != SOCK_DIAG_BY_FAMILY:
        return None
    return int(struct.unpack_from("=I", data, _NLMSG.size + 64)[0])


def _table_uid(family: int, peer: tuple[Any, ...], me: tuple[Any, ...]) -> int | None:
    """``local_uid`` by ``/proc/net/tcp`` (``tcp6``)."""
    want = (_proc_net_key(family, peer[0], peer[1]), _proc_net_key(family, me[0], me[1]))
    table = "/proc/net/tcp6" if family == socket.AF_INET6 else "/proc/net/tcp"
    try:
        with open(table, encoding="ascii") as f:
            text = f.read()
    except (OSError, ValueError):
        return None
    # One search in C over the table, not a split per line.
    at = text.find(f" {want[0]} {want[1]} ")
    if at < 0:
        return None
    fields = text[at : text.find("\n", at)].split()  # local remote st queues timer retr uid
    try:
        return int(fields[6])
    except (IndexError, ValueError):
        return None


def peer_of(sock: socket.socket) -> str:
    """Whom a connection counts against for the per-peer share: ``uid N`` for a loopback peer
    (every local user connects from 127.0.0.1, so the address alone would make them one peer),
    the peer's address otherwise (the port left out)."""
    try:
        addr = str(sock.getpeername()[0])
    except OSError:
        return "?"
    if _is_loopback(addr):
        uid = local_uid(sock)
        if uid is not None:
            return f"uid {uid}"
    return addr


@dataclass(eq=False)
class _Conn:
    """One open connection: who, whether its request came, and the progress of its answer."""

    writer: asyncio.StreamWriter
    peer: str
    at: float  # when it last made progress (opened, or the kernel took more of its answer)
    busy: bool = False  # its request came: it is being answered
    written: int = 0  # bytes handed to the transport
    sent: int = 0  # of those, taken by the kernel

    def progress(self, now: float) -> float:
        """Seconds since this answer last moved (bookkeeping the bytes the kernel took)."""
        sent = self.written - self.writer.transport.get_write_buffer_size()
        if sent > self.sent:
            self.sent, self.at = sent, now
        return now - self.at


class MetricsServer:
    """The HTTP endpoint (``/metrics``, any path in fact), served by one thread's event loop.

    Binds in the constructor (OSError when the address cannot be bound) and serves until
    ``close()``. ``connections`` is how many are open now.

    Slots: at most ``max_connections`` are open, at most ``per_peer`` of them one peer's
    (``peer_of``: a local user by uid, others by address). A new connection past either bound
    takes the slot of one that sent no request yet (the oldest), else of one whose answer has
    stalled (no byte taken for ``STALL_GRACE``, the longest stalled), from that peer's own when it
    is past its share; only when there is none is the new one refused. An answer that makes no
    progress for ``stall_timeout`` is cut, and any answer after ``write_timeout``."""

    def __init__(
        self,
        exporter: FleetExporter,
        host: str,
        port: int,
        *,
        credential: Credential | None = None,
        max_connections: int = 64,
        per_peer: int | None = None,
        read_timeout: float = READ_TIMEOUT,
        stall_timeout: float = STALL_TIMEOUT,
        write_timeout: float = 60.0,
    ) -> None:
        self.exporter = exporter
        self.host = host
        self.credential = credential
        self.max_connections = max_connections
        self.per_peer = per_peer if per_peer is not None else max(1, max_connections // 4)
        self.read_timeout = read_timeout
        self.stall_timeout = stall_timeout
        self.write_timeout = write_timeout
        self.refused = 0  # connections refused: every slot held by answers that move
        self.evicted = 0  # connections cut to make room (idle or stalled)
        self.stalled_cut = 0  # answers cut after stall_timeout without progress
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[
            0
        ][0]
        self._sock = socket.create_server((host, port), family=family, backlog=128)
        self._conns: dict[asyncio.StreamWriter, _Conn] = {}  # open ones, oldest first
        self._tasks: set[asyncio.Task[None]] = set()  # their handlers
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._watch: asyncio.Task[None] | None = None
        started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.thread = threading.Thread(
            target=self._run, args=(started,), name="gpuctl-export-http", daemon=True
        )
        self.thread.start()
        started.result()

    @property
    def port(self) -> int:
        """The bound port (the one the system chose for port 0)."""
        return int(self._sock.getsockname()[1])

    @property
    def connections(self) -> int:
        return len(self._conns)

    def stalled(self) -> int:
        """How many answers have not moved for ``STALL_GRACE`` (tests, debugging)."""

        async def count() -> int:
            now = time.monotonic()
            return sum(c.busy and c.progress(now) >= STALL_GRACE for c in self._conns.values())

        return deadline.result(asyncio.run_coroutine_threadsafe(count(), self._loop), 10)

    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving, close every connection and release the socket."""
        if self._loop.is_closed():
            return
        deadline.result(asyncio.run_coroutine_threadsafe(self._stop(), self._loop), 30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self.thread.join(timeout=30)
        self._loop.close()
        self._sock.close()

    def _run(self, started: concurrent.futures.Future[None]) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._connection, sock=self._sock, limit=HEAD_LIMIT)
            )
        except BaseException as e:
            started.set_exception(e)
            raise
        self._watch = self._loop.create_task(self._cut_stalled())
        started.set_result(None)
        self._loop.run_forever()

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._watch is not None:
            self._watch.cancel()
        for w in list(self._conns):
            w.transport.abort()
        if self._tasks:  # the handlers see their connections lost and end
            await asyncio.wait(self._tasks, timeout=10)

    async def _cut_stalled(self) -> None:
        """Cut every answer that has not moved for ``stall_timeout`` (checked a few times per
        timeout: a connection costs a subtraction per check)."""
        every = min(1.0, self.stall_timeout / 4)
        while True:
            await asyncio.sleep(every)
            now = time.monotonic()
            for c in list(self._conns.values()):
                if c.busy and c.progress(now) >= self.stall_timeout:
                    self.stalled_cut += 1
                    self._drop(c)

    def _drop(self, c: _Conn) -> None:
        c.writer.transport.abort()
        self._conns.pop(c.writer, None)

    def _victim(self, conns: Iterable[_Conn], now: float) -> _Conn | None:
        """The connection to cut for room: the oldest that sent no request, else the longest
        stalled answer (none when every answer moves)."""
        stalled: _Conn | None = None
        worst = STALL_GRACE
        for c in conns:
            if not c.busy:
                return c
            idle = c.progress(now)
            if idle >= worst:
                stalled, worst = c, idle
        return stalled

    def _admit(self, writer: asyncio.StreamWriter) -> _Conn | None:
        """A slot for a new connection (cutting an idle or stalled one to make room), or None."""
        sock = writer.get_extra_info("socket")
        peer = peer_of(sock) if sock is not None else "?"
        now = time.monotonic()
        for pool, bound in (
            ([c for c in self._conns.values() if c.peer == peer], self.per_peer),
            (list(self._conns.values()), self.max_connections),
        ):
            if len(pool) >= bound:
                victim = self._victim(pool, now)
                if victim is None:
                    return None
                self.evicted += 1
                self._drop(victim)
        conn = self._conns[writer] = _Conn(writer, peer, now)
        return conn

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._serve(reader, writer)
        finally:
            self._tasks.discard(task)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = self._admit(writer)
        if conn is None:  # every slot is an answer that moves: refuse this one
            self.refused += 1
            writer.transport.abort()
            return
        closed = False
        try:
            head = await wait_for(reader.readuntil(b"\r\n\r\n"), self.read_timeout)
            if writer not in self._conns:
                return  # evicted meanwhile
            conn.busy = True
            conn.at = time.monotonic()
            await wait_for(self._answer(head, conn), self.write_timeout)
            closed = True
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass
        finally:
            self._conns.pop(writer, None)
            if not closed:  # it timed out or failed. Not after a close that was waited for:
                # on 3.11 a transport whose buffer drained after close() is gone, and abort()
                # raised AttributeError (seen in benchmarks/export_scrape.py)
                writer.transport.abort()

    async def _answer(self, head: bytes, conn: _Conn) -> None:
        writer = conn.writer
        lines = head.decode("latin-1").split("\r\n")
        request = lines[0].split()
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        extra: list[tuple[str, str]] = []
        chunks: list[bytes] = []
        if len(request) != 3 or not request[2].startswith("HTTP/1."):
            status = 400
        elif self.credential is not None and not self.credential.allows(
            headers.get("authorization")
        ):
            status = 401
            extra = [("WWW-Authenticate", CHALLENGE)]
        elif request[0] not in ("GET", "HEAD"):
            status, extra = 405, [("Allow", "GET, HEAD")]
        else:
            status = 200
            om = wants_openmetrics(headers.get("accept", ""))
            gz = wants_gzip(headers.get("accept-encoding", ""))
            try:
                chunks = self.exporter.body(openmetrics=om, gzipped=gz)
            except Exception:  # a bug: the scraper sees a 500, the log says why
                log.exception("gpuctl export: rendering the metrics failed")
                status, chunks = 500, []
            else:
                extra = [("Content-Type", OPENMETRICS_TYPE if om else TEXT_TYPE)]
                if gz:
                    extra.append(("Content-Encoding", "gzip"))
        size = sum(map(len, chunks))
        text = "".join(f"{k}: {v}\r\n" for k, v in extra)
        start = (
            f"HTTP/1.1 {status} {_REASON[status]}\r\n{text}Content-Length: {size}\r\n"
            "Connection: close\r\n\r\n".encode()
        )
        writer.write(start)
        conn.written += len(start)
        if request and request[0] == "HEAD":
            chunks = []
        for chunk in chunks:
            view = memoryview(chunk)
            for at in range(0, len(view), SLICE):
                piece = view[at : at + SLICE]
                writer.write(piece)
                conn.written += len(piece)
                await writer.drain()
        writer.close()  # after what is buffered is sent: wait for that (within write_timeout)
        await writer.wait_closed()
