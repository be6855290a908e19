"""The fleet's metrics as exposition text (``FleetExporter``), in Prometheus's text format or
OpenMetrics, gzipped when asked; the families are ``gpuctl.fleet.exportmetrics``'s.

Why the exposition is written here and not by prometheus-client: its collector built a Sample
object per series at every scrape, 134k of them at 4,096 GPUs, and wrote each one's labels again:
a scrape took 2.3 s median (p99 7.2 s) and 1.29 s of CPU, near Prometheus's 10 s timeout.
``FleetExporter`` does the work once per change instead. A GPU's label sets are escaped once and
kept while its node's hello says the same (``_GpuLines``). A node's lines are formatted once per
snapshot: the fleet replaces a node's snapshot whole on every change, so ``is`` tells which nodes
changed since the last scrape, and the others' text is reused; within a node that changed, a
family whose values are the last snapshot's keeps its bytes object too. Each family's lines are
joined into one block of bytes, kept while every node's text of it is the same object, and
gzipped in runs of at least ``MEMBER`` bytes (when a client asks for gzip), each run a gzip
member kept while its blocks are: totals, limits, error counts and throttle reasons, most of the
text, change seldom, so a scrape after every node's new sample gzips only the families of the
busy readings. Only the age of each node's newest sample is written per scrape, as a separate
piece (a separate gzip member; HTTP clients read the members as one stream).

A node's METRICS families are one ``%`` of a template holding its GPUs' line starts over each
family's values (C calls, not a loop per line). At 4,096 GPUs (``benchmarks/export_scrape.py
--against`` the old code, alternated runs on a 2-core test machine): new snapshots of every node
at each scrape, 84 ms median and 82 ms of CPU per scrape (0.06x of prometheus-client's 1.33 s);
the same samples scraped again, 6.5 ms of CPU. Gzipped, with every node's busy readings changed
since the last scrape (``--gzip --changing``): 77 ms of CPU where gzipping the whole text again
took 120; 19 to 21 us of CPU per GPU from 1,024 to 16,384 GPUs, 580 bytes per GPU.

XIDs: ``XidCounts`` counts an XID only for a GPU the node's hello named, only within 1..XID_MAX,
and at most XIDS_PER_GPU distinct XIDs per GPU; what it refuses is counted per node. An agent that
sent 100,000 made-up XIDs had made 100,000 series (8 MB per scrape).
"""

from __future__ import annotations

import gzip
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass, field
from itertools import chain
from operator import is_
from typing import Any

from gpuctl.core.model import GpuSample, GpuStatic, NodeEvent, NodeSnapshot, NodeState
from gpuctl.core.text import printable
from gpuctl.fleet.exportmetrics import (
    F_AGE,
    F_BURNING,
    F_IDLE,
    F_INFO,
    F_REFUSED,
    F_SLURM,
    F_STATE,
    F_THROTTLE,
    F_UP,
    F_XID,
    F_XID_LAST,
    FAMILIES,
    METRICS,
    PER_SCRAPE,
    XID_MAX,
    XIDS_PER_GPU,
)
from gpuctl.fleet.fleet import Fleet
from gpuctl.node.protocol import THROTTLE_REASONS

# 20.7 MB of text at 4,096 GPUs: level 2 writes 5 % fewer bytes than 1 (2.38 MB) for 2 % more CPU
# (51 ms for the whole text), level 3 6 % fewer for 19 % more, 6 17 % fewer for 2.5x the CPU
GZIP_LEVEL = 2
_READS = tuple(m.read for m in METRICS)
_BY_NAME = {f.name: f for f in FAMILIES}  # names are unique (test_export holds it)
_STATES = tuple(NodeState)
_REASONS = tuple(name for _bit, name in THROTTLE_REASONS)


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

    __slots__ = (
        "age",
        "frags",
        "gpus",
        "label",
        "layout",
        "snap",
        "templates",
        "values",
        "xid_version",
    )

    def __init__(self, name: str) -> None:
        self.label = f'node="{_escape(name)}"'
        self.age = f"gpuctl_node_last_sample_age_seconds{{{self.label}}} "
        self.snap: NodeSnapshot | None = None
        self.xid_version = -1
        # per family (by name; one with no line has none), encoded once: the body is one join.
        # A family whose text is the same as the last snapshot's keeps its bytes object, so
        # that ``is`` tells which families changed (``FleetExporter._blocks``).
        self.frags: dict[str, bytes] = {}
        self.gpus: dict[int, _GpuLines] = {}
        self.layout: list[_GpuLines] = []  # the GPUs the templates are for
        self.templates: list[str] = []
        self.values: dict[str, tuple[Any, ...]] = {}  # per METRICS family, what its frag shows

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
        old = self.frags
        frags: dict[str, bytes] = {}
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
            frags = self._metrics([gpus[g.index] for g in shown], shown, old)
            for (gpu, xid), n in sorted(counts.items()):
                st = statics.get(gpu)
                lines = gpus.get(gpu) or self._lines(s.name, None, st, gpu)
                cols[F_XID].append(f'{lines.xid}{xid}"}} {n}')
        self.gpus = gpus  # only the GPUs of this sample: an agent's made-up indices do not pile up
        for name, c in cols.items():
            data = ("\n".join(c) + "\n").encode()
            was = old.get(name)
            frags[name] = was if was == data else data
        self.frags = frags
        self.snap, self.xid_version = s, version

    def _metrics(
        self, layout: list[_GpuLines], shown: list[GpuSample], old: dict[str, bytes]
    ) -> dict[str, bytes]:
        """The METRICS families' text for the GPUs ``shown``: per family one ``%`` of a
        template that holds the GPUs' line starts, kept while they stay the same, over the
        family's values (what a loop over 100k lines cost at 4,096 GPUs is one C call per node
        and family); a family with a gap or a value that is not a plain number goes line by
        line. A family whose values are those of the last snapshot keeps its text (``old``):
        totals, limits and error counts, most of the body, change seldom."""
        if len(layout) != len(self.layout) or any(
            a is not b for a, b in zip(layout, self.layout, strict=False)
        ):
            self.layout = layout
            self.templates = [
                "".join(lines.metrics[i].replace("%", "%%") + "%s\n" for lines in layout)
                for i in range(len(METRICS))
            ]
            self.values = {}
        frags: dict[str, bytes] = {}
        if not shown:
            self.values = {}
            return frags
        n = len(shown)
        columns = [
            (i, values)
            for i, read in enumerate(_READS)
            # a reading no GPU of the node has (fan on SXM parts) has no line
            if (values := tuple(map(read, shown))).count(None) != n
        ]
        known, self.values = self.values, {}
        every: bool | None = None
        for i, values in columns:
            name = METRICS[i].name
            self.values[name] = values
            # equal values write the same numbers (0 and 0.0 are one value to every reader)
            if known.get(name) == values and name in old:
                frags[name] = old[name]
                continue
            if every is None:
                every = _plain(tuple(chain.from_iterable(values for _, values in columns)))
            if every or _plain(values):  # one check for the node, per family when it fails
                frags[name] = (self.templates[i] % values).encode()
                continue
            lines_of = [
                f"{lines.metrics[i]}{text}"
                for lines, v in zip(layout, values, strict=True)
                if (text := _num(v)) is not None
            ]
            if lines_of:
                frags[name] = ("\n".join(lines_of) + "\n").encode()
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


@dataclass(eq=False)
class _Block:
    """One family's lines for a set of snapshots, its header first, as bytes: the join of
    ``frags`` (the nodes' texts of the family: the same objects, the same text)."""

    frags: list[bytes]
    text: bytes


_EOF = _Block([], b"# EOF\n")  # OpenMetrics's last line
MEMBER = 64 * 1024
"""A gzip member holds a run of families' blocks of at least this much text (at 4,096 GPUs each
family its own: ~500 KB each), so that a run whose blocks are the last scrape's keeps its
compressed bytes. A member starts afresh, which costs nothing measurable at this size (1,024
GPUs: 0.99x the bytes of one stream, each family with its own statistics); a small fleet's text
is one run (8 GPUs: 45 KB, one member, where one per family would be 2.9x the bytes)."""


class FleetExporter:
    """The fleet's metrics as exposition text, formatted per change (see the module's doc).

    ``body()`` may be called from any thread; the HTTP server calls it from its own."""

    def __init__(
        self, fleet: Fleet, *, clock: Callable[[], float] = time.time, member: int = MEMBER
    ) -> None:
        self.fleet = fleet
        self.clock = clock
        self.member = member  # the least text of a gzip member (``MEMBER``)
        self.xids = XidCounts(self._hello_gpus)
        fleet.on_event(self.xids.on_event)
        self._lock = threading.Lock()
        self._nodes: dict[str, _NodeText] = {}
        # per format (openmetrics or not): the blocks before and after the age family, while
        # no snapshot changed; each family's last block; each run of blocks' gzip member
        self._bodies: dict[bool, tuple[list[_Block], list[_Block]]] = {}
        self._blocks: dict[tuple[bool, str], _Block] = {}
        self._members: dict[bool, dict[tuple[_Block, ...], bytes]] = {}
        self.renders = 0  # nodes formatted since the start (the tests read it)
        self.compressed = 0  # bytes of text gzipped since the start (the tests read it)

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
            head, tail = body
            age = self._ages(snaps).encode()
            if not gzipped:
                return [*(b.text for b in head), age, *(b.text for b in tail)]
            known = self._members.get(openmetrics, {})
            members: dict[tuple[_Block, ...], bytes] = {}
            out = self._gzip(head, known, members)
            out.append(gzip.compress(age, GZIP_LEVEL, mtime=0))
            out += self._gzip(tail, known, members)
            self._members[openmetrics] = members
            return out

    def text(self, *, openmetrics: bool = False) -> str:
        """The whole exposition as one string (tests, debugging)."""
        return b"".join(self.body(openmetrics=openmetrics)).decode()

    def _join(self, openmetrics: bool) -> tuple[list[_Block], list[_Block]]:
        """Each family's block for the current texts: the last one where every node's text of
        the family is the same object as then, else joined anew."""
        texts = list(self._nodes.values())
        head: list[_Block] = []
        tail: list[_Block] = []
        part = head  # the families before the age family; after it, tail
        for family in FAMILIES:
            name = family.name
            if name in PER_SCRAPE:
                part = tail
                continue  # per scrape (``_ages``): the families of PER_SCRAPE stand together
            frags = [t.frags.get(name, b"") for t in texts]
            block = self._blocks.get((openmetrics, name))
            if (
                block is None
                or len(block.frags) != len(frags)
                or not all(map(is_, block.frags, frags))
            ):
                text = b"".join([family.header(openmetrics).encode(), *frags])
                block = self._blocks[openmetrics, name] = _Block(frags, text)
            part.append(block)
        if openmetrics:
            tail.append(_EOF)
        return head, tail

    def _gzip(
        self,
        blocks: list[_Block],
        known: dict[tuple[_Block, ...], bytes],
        members: dict[tuple[_Block, ...], bytes],
    ) -> list[bytes]:
        """``blocks`` as gzip members of runs of at least ``MEMBER`` bytes of text: a run gzipped
        for the last scrape (``known``) is not gzipped again; ``members`` gets every run's."""
        out: list[bytes] = []
        run: list[_Block] = []
        size = 0
        for i, block in enumerate(blocks):
            run.append(block)
            size += len(block.text)
            if size < self.member and i < len(blocks) - 1:
                continue
            key = tuple(run)
            data = known.get(key)
            if data is None:
                text = run[0].text if len(run) == 1 else b"".join(b.text for b in run)
                data = gzip.compress(text, GZIP_LEVEL, mtime=0)
                self.compressed += len(text)
            members[key] = data
            out.append(data)
            run, size = [], 0
        return out

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
