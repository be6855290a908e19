"""Nodes read from the site's Prometheus (DCGM exporter's series), not from agents.

A site of tens of thousands of GPUs already runs NVIDIA's DCGM exporter on every node and a
Prometheus (or VictoriaMetrics, Thanos, Mimir: the same HTTP API) scraping them. ``PromSource``
reads that store every interval: first each host's newest sample time (one small query, a
series per host), then, for the hosts with a sample newer than the one held, one instant query
per metric for all of them at once (never one per GPU; by name unless every host moved), each
``max by`` the one host label in use and ``gpu`` so the answer carries only the labels used
(DCGM exporter also sets pci_bus_id, device, pod, instance, ...: bytes for the store to write
and gpuctl to decode for nothing). At a 5 s poll of a 15 s scrape a poll asks a third of the
GPUs. The answers are decoded by msgspec into typed structs, grouped per host and handed to
each host's ``PromLink`` as the protocol lines an agent would send (a hello, then samples), so
the fleet, the screen, ``status`` and ``export`` work unchanged. At 16,384 GPUs over a 15 s
scrape (``benchmarks/prom_scale.py --baseline``, alternated with the code that asked every
host each poll): answers 6.3 MB a poll on average (23 MB before), gpuctl's CPU 0.28 s a poll
(0.63 s), a poll 2.1 s median (4.0 s) on a shared 2-core machine where the store's own work
is most of it; figures in the README.

Where a poll's time goes (``prom_scale.py`` prints each phase; Prometheus's own time from its
``stats=all``): the stamp query, which every other query waits on, now reads GPU 0 of each
host (a series per host, not per GPU: 0.10 -> 0.02 s median); the slow counters (``SLOW``)
and the metrics the store has none of are asked only at each host's turn, every
``SLOW_EVERY``-th of its new samples (between, its last values stand); each answer is grouped
as it comes, while the others are out (after the last answer 0.12 -> 0.03 s median); and
each group of hosts is published as soon as every query that reads it has answered (the
hosts not at their turn, most of them, once the fast queries are in, while the slow ones are
out: ``poll``'s ``ready``), not after the poll's last answer: from the last answer to every
moved node on the screen 0.175 -> 0.111 s median, 0.44 -> 0.36 s p95 (``prom_scale.py --tui
--baseline``). The rest is the store's evaluation: on the shared 2-core machine, a poll of
768 moved hosts is 0.1-1 s of Prometheus's time asked one query at a time, and the slowest
polls are the ones it evaluates slowly (its ``execTotalTime`` summed over the queries 4-5 s
within 1.6 s). Asking the fast gauges in one query by ``__name__`` instead of one each saves
it nothing (``prom_scale.py --shapes``, two runs: 1.18 s against 0.47 s summed, then 0.47 s
against 0.50 s) for 1.5x the bytes; a query's cost is its series' (8 hosts by name: 0.4 ms).

Labels: the host is DCGM exporter's ``Hostname`` (before 3.3), ``hostname`` (since), gpuctl
export's ``node``, else ``instance``; the GPU is ``gpu``; ``UUID`` (or ``uuid``), ``modelName``
(or ``model``) and ``DCGM_FI_DRIVER_VERSION`` come from the utilisation query only. A GPU in
MIG mode is one row summing its instances (``GPU_I_ID``, ``GPU_I_PROFILE``; see ``MIG_ID``),
each instance in its sample's ``mig`` list (the detail screen shows them).

Time: a query's answer carries the evaluation time, not the sample's; the first query,
``timestamp()`` of the utilisation per host, gives each node's newest sample time, so a node
whose exporter stopped goes stale by the sample's age (a node is fed a sample only when that
time moved). Its hello's ``interval`` is the scrape period read from one series' raw samples
(``[5m]`` of one GPU), so staleness waits three scrapes, not three polls.

Events and jobs: DCGM exporter's ``XID_ERRORS`` is the last XID a GPU had, so a new value is
an ``xid`` event, and one a GPU already holds when gpuctl first reads it is told once (as an
agent tells the kernel log's). A site whose exporter runs with ``--hpc-job-mapping-dir`` has
each GPU's series once per Slurm job on it, labelled ``hpc_job``: that is the GPU's
``slurm_job`` annotation, what gpuctl's squeue watch sets for agents (no user: the exporter has
no label for it; a cluster with ``slurm = true`` has the squeue watch over the store's hosts
instead, users included). A host that appears in the store after the start becomes a node at
the next poll (``Fleet.add_node``; a cluster of the store's hosts only, not a mixed one), and
one whose newest sample is older than ``forget_after`` (``prometheus_forget_after``, 10 min by
default: twice Prometheus's own 5 min lookback) leaves the fleet (``Fleet.remove_node``): a
decommissioned node, an exporter gone for good, a host the selector no longer matches is
otherwise shown unreachable for ever. It is added again if it comes back. Older is counted
from the store's newest sample of any host, so a store that stops scraping (every node at
once) drops none; and never a mixed cluster's node (named in the config, reached by its agent:
that it is unreachable is news).

Its parts: the HTTP client (``promhttp``: aiohttp, bounded in bytes and time, TLS, credentials),
the answers' types and the client that decodes them (``promwire``: bounded in series), the
metrics read and the PromQL asked (``promquery``), MIG weighting (``prommig``); here the
grouping per host, the hosts found and forgotten, polling and publishing.

A node seen through Prometheus alone has no agent: its link answers pings and refuses every
other request, and it is read-only (``read_only_why`` says why to the keys that act). A mixed
node (the cluster also says how to reach it) opens its agent on the first request to act;
an XID both its agent and the store tell is told once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import re
import statistics
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from gpuctl.config import PrometheusConfig
from gpuctl.core.deadline import wait_for
from gpuctl.core.format import fmt_age
from gpuctl.core.model import GpuSample, NodeEvent
from gpuctl.core.wire import JsonObject
from gpuctl.fleet.gpu_history import history_sample
from gpuctl.fleet.links import STREAM_LIMIT, NodeLink
from gpuctl.fleet.promhttp import PromError as PromError  # the HTTP client's, said here too
from gpuctl.fleet.prommig import (
    MIB,
    MIG_UTIL,
    mig_instances,
    mig_util,
)
from gpuctl.fleet.prommig import mig_slices as mig_slices
from gpuctl.fleet.prommig import profile_slices as profile_slices
from gpuctl.fleet.promquery import (
    GAUGES,
    MIG,
    SLOW,
    UTIL,
    XID,
    Metric,
    _selector,
    mig_query,
    per_gpu,
)
from gpuctl.fleet.promquery import METRICS as METRICS  # tests and benchmarks name these here
from gpuctl.fleet.promquery import hosts_matcher as hosts_matcher
from gpuctl.fleet.promquery import queries as queries
from gpuctl.fleet.promquery import stamp_query as stamp_query
from gpuctl.fleet.promwire import _MATRIX as _MATRIX  # the benchmarks' (prom_scale.py)
from gpuctl.fleet.promwire import _VECTOR as _VECTOR
from gpuctl.fleet.promwire import (
    HOST_LABELS,
    MODEL_LABELS,
)
from gpuctl.fleet.promwire import Labels as Labels
from gpuctl.fleet.promwire import PromClient as PromClient
from gpuctl.fleet.promwire import RangeSeries as RangeSeries
from gpuctl.fleet.promwire import Series as Series
from gpuctl.fleet.session import AgentSession, LinkError, Sample
from gpuctl.node import protocol
from gpuctl.node.metrics import METRICS as REGISTRY

if TYPE_CHECKING:
    from gpuctl.fleet.fleet import Fleet
    from gpuctl.fleet.slurm import JobWatcher

log = logging.getLogger(__name__)

DEFAULT_PERIOD = 30.0  # the scrape period assumed until one series shows two samples
QUERIES_AT_ONCE = 8  # a poll's queries in flight together (27 at once overran a loaded store)
SLOW_EVERY = 4  # a host's slow metrics (``SLOW``) are asked at every 4th of its new samples
STAMP_EVERY = 12  # every 12th poll the stamp query reads every GPU, not only GPU 0 (see _stamp)
HISTORY_S = 4 * 3600.0  # the detail screen's history asked of the store (the fleet keeps 4 h)
HISTORY_STEP_S = 15.0  # one point per this many seconds at least ...
MAX_POINTS = 1000  # ... and at most this many per series (Prometheus refuses 11,000)
# The history's columns (``gpuctl.fleet.gpu_history.METRICS``, the registry's metrics with a
# history and a DCGM name) and the series they come from, with DCGM's value times ``scale`` in
# the history's unit (MiB -> GiB for memory).
HISTORY_METRICS = tuple(
    (m.name, m.dcgm, m.scale / m.dcgm_scale) for m in REGISTRY if m.history and m.dcgm
)
# the utilisation's history column and scale (a MIG GPU's comes from its instances)
HISTORY_UTIL = next((k, sc) for k, n, sc in HISTORY_METRICS if n == "DCGM_FI_DEV_GPU_UTIL")


# A node's lines (``PromLink._feed``) by msgspec: 768 hosts' 8-GPU samples (a poll's moved
# third at 16,384 GPUs) in 3.2 ms of CPU, where ``protocol.encode`` (json) took 23 ms. Their
# floats come from ``_number``, never NaN (which json refuses and msgspec writes as null).
_LINE = msgspec.json.Encoder()


# Where the store is and how to ask it: the config's own type (``[clusters.X] prometheus*``
# keys, or ``--prometheus``), one definition for both.
PromTarget = PrometheusConfig


# Odd host names: a label value holding a hostlist's brackets or comma, a space, a control
# character, a quote (the screen, ``status``'s reader lines and the hostlists gpuctl writes would
# read it as something else): skipped, said once. ``instance`` is ``host:port``.
_HOST_NAME = re.compile(r"[A-Za-z0-9_.:@%+-]{1,253}")


def _number(text: str) -> float | None:
    try:
        v = float(text)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


@dataclass(slots=True)
class NodeReading:
    """One host as one poll saw it: newest sample time, each GPU's values by ``Metric.key``
    (tables nested), its static labels, and the metrics that had a series for it."""

    t: float | None
    gpus: dict[int, dict[str, Any]]
    statics: dict[int, dict[str, Any]]
    driver: str | None
    seen: set[str]
    host_label: str = "Hostname"  # the label that named the host (for queries about it)
    jobs: dict[int, set[str]] = field(default_factory=dict)  # GPU -> its ``hpc_job`` labels
    # a MIG GPU -> its instances' (profile, GR_ENGINE_ACTIVE in %) by instance id
    mig: dict[int, dict[str, tuple[str, float | None]]] = field(default_factory=dict)
    # a MIG GPU -> its instances' memory (FB_USED, FB_FREE in MiB by ``Metric.key``) by id
    mig_memory: dict[int, dict[str, dict[str, float]]] = field(default_factory=dict)


_GPU_INDEX = {str(i): i for i in range(256)}  # a GPU's label text -> its index


def gpu_index(text: str) -> int | None:
    """A ``gpu`` label's index, or None: ASCII digits only, at most 4 (``str.isdigit`` takes
    "²" and "٣", which ``int`` refuses, and a label of 5,000 digits is past ``int``'s limit:
    both raised ValueError out of a poll)."""
    index = _GPU_INDEX.get(text)
    if index is None and text.isascii() and text.isdigit() and len(text) <= 4:
        index = int(text)
    return index


def group(
    answers: list[tuple[Metric | None, list[Series]]],
    nodes: dict[str, NodeReading] | None = None,
) -> dict[str, NodeReading]:
    """Per host, the readings of one poll's answers (see ``queries``), added to ``nodes``
    when given (a poll groups each answer as it comes, while the others are out)."""
    if nodes is None:
        nodes = {}
    for metric, series in answers:
        if metric is None:
            for s in series:
                host = s.metric.host()
                v = _number(s.value.text)
                if not host or v is None:
                    continue
                node = nodes.get(host)
                if node is None:
                    node = nodes[host] = NodeReading(None, {}, {}, None, set())
                node.t = v if node.t is None else max(node.t, v)
            continue
        # the loop runs once per GPU per metric (440,000 times a poll at 16,384 GPUs): what
        # does not change within it is read once, and a value's text is converted once a
        # metric (counters and gauges repeat a few values: "0", "1980"): grouping every host
        # of a poll 0.35 -> 0.26 s, the moved third 0.11 -> 0.06 s
        key, table, integer, label = metric.key, metric.table, metric.integer, metric.label
        identity, mig = metric is UTIL or metric is MIG, metric is MIG  # the GPU's labels
        converted: dict[str, float | int | None] = {}
        for s in series:
            labels = s.metric
            host = labels.Hostname or labels.host()
            gpu = gpu_index(labels.gpu)
            if gpu is None:
                continue
            if not host:
                continue
            node = nodes.get(host)
            if node is None:
                node = nodes[host] = NodeReading(None, {}, {}, None, set())
            node.seen.add(label)
            values = node.gpus.get(gpu)
            if values is None:
                values = node.gpus[gpu] = {}
            text = s.value.text
            if text in converted:
                v = converted[text]
            else:
                v = converted[text] = _number(text)
                if v is not None and integer:
                    v = converted[text] = int(v)
            if labels.GPU_I_ID and table is None:  # a MIG instance's memory: the GPU's sum
                if v is not None:
                    node.mig_memory.setdefault(gpu, {}).setdefault(labels.GPU_I_ID, {})[key] = v
                    values[key] = (values.get(key) or 0) + v
                else:
                    values.setdefault(key, None)
            elif table is None:
                values[key] = v
            else:
                values.setdefault(table, {})[key] = v
            if identity:
                node.host_label = labels.host_label()
                node.statics[gpu] = {
                    "index": gpu,
                    "uuid": labels.UUID or labels.uuid or None,
                    "name": labels.modelName or labels.model or None,
                }
                node.driver = node.driver or labels.DCGM_FI_DRIVER_VERSION or None
                if labels.hpc_job:  # one series per job on the GPU
                    node.jobs.setdefault(gpu, set()).add(labels.hpc_job)
                if mig:  # an instance: the GPU's utilisation from all of them
                    node.seen.add(UTIL.label)
                    node.mig.setdefault(gpu, {})[labels.GPU_I_ID] = (
                        labels.GPU_I_PROFILE,
                        _number(text),  # 100 x a ratio: not cut to an integer yet
                    )
    for node in nodes.values():
        for gpu, instances in node.mig.items():
            node.gpus[gpu][UTIL.key] = mig_util(instances, node.statics[gpu]["name"])
            node.gpus[gpu]["mig"] = mig_instances(instances, node.mig_memory.get(gpu, {}))
            node.statics[gpu]["mig_mode"] = True
    return nodes


def gpu_wire(index: int, values: dict[str, Any], uuid: str | None) -> JsonObject:
    """A sample's GPU dict (protocol v1) from one GPU's readings."""
    used, free, reserved = values.get("fb_used"), values.get("fb_free"), values.get("fb_reserved")
    total = None
    if used is not None and free is not None:
        total = int((used + free + (reserved or 0)) * MIB)
    mask = values.get("throttle")
    pstate = values.get("pstate")
    return {
        "index": index,
        "uuid": uuid,
        "state": "ok",
        **{key: values.get(key) for key in GAUGES},
        "mem_used": int(used * MIB) if used is not None else None,
        "mem_total": total,
        "pstate": f"P{pstate}" if isinstance(pstate, int) and 0 <= pstate < 32 else None,
        "throttle": protocol.decode_throttle(mask) if isinstance(mask, int) and mask >= 0 else None,
        "ecc": values.get("ecc"),
        "retired_pages": values.get("retired_pages"),
        "remapped_rows": values.get("remapped_rows"),
        "processes": [],
        "mig": values.get("mig"),
    }


def missing_text(seen: set[str]) -> str | None:
    """ "no series for X, Y" for the metrics a node has none of (its exporter collects fewer
    counters, DCGM exporter's defaults leave ECC out), else None."""
    gone = [m.label for m in METRICS if m.label not in seen]
    return f"no series for {', '.join(gone)}" if gone else None


class PromLink(NodeLink):
    """One host seen through ``source``: its session is fed the lines an agent would send.

    With ``agent`` (a cluster that also names how to reach its nodes: mixed), the samples still
    come from the store, and a request to act (stress, acceptance, a signal) opens the agent
    then, once, and goes to it; the agent's replies and events (burn progress, XIDs) come back
    on the same session, its own samples are dropped. A node nobody acts on costs no
    connection. Without ``agent`` the node is read-only and every request is refused, saying
    why.
    """

    kind = "prometheus"

    def __init__(self, source: PromSource, name: str, agent: NodeLink | None = None) -> None:
        self.source = source
        self.name = name
        self.agent = agent
        self.read_only = agent is None or agent.read_only
        self.node = agent.node if agent is not None else None  # its workload_python for burns
        self._reader: asyncio.StreamReader | None = None
        self._last_t: float | None = None
        self._statics: dict[int, JsonObject] = {}
        # each GPU's XID as last told to the fleet: kept across reopenings, so the XID a GPU
        # already had when the node was first read is told once, at the first open
        self._xids: dict[int, int] = {}
        # mixed: an XID the agent tells at once (NVML) and the store a scrape later is told
        # once, by whichever side is first; (gpu, xid) -> when each side last told it
        self._told_by_agent: dict[tuple[int, int], float] = {}
        self._told_by_store: dict[tuple[int, int], float] = {}
        self._agent_session: AgentSession | None = None
        self._opening: asyncio.Task[AgentSession] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def read_only_why(self) -> str | None:
        if self.agent is not None:
            return None
        return (
            f"{self.name} is seen through Prometheus ({self.source.client.base}), no agent runs "
            "there: name its cluster's nodes with via = ssh or srun to act on them"
        )

    def describe(self) -> str:
        acts = f", acting via {self.agent.describe()}" if self.agent is not None else ""
        return f"prometheus {self.source.client.base}{acts}"

    async def aclose(self) -> None:
        if self.agent is not None:
            await self.agent.aclose()

    async def history(self, end: float, seconds: float | None = None) -> list[GpuSample]:
        """The node's GPUs as the store kept them from ``end - seconds`` to ``end`` (one
        ``query_range`` per plotted metric, every ``HISTORY_STEP_S``), oldest first: the detail
        screen's plots then show the hours the store holds, not only what this process saw.
        Raises PromError."""
        span = self.source.history_seconds if seconds is None else seconds
        return await self.source.history(self.name, end - span, end)

    # -- the agent of a mixed node, opened on the first request to act ----------------------
    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _agent(self) -> AgentSession:
        if self._agent_session is not None:
            return self._agent_session
        if self._opening is None or self._opening.done():
            self._opening = asyncio.get_running_loop().create_task(self._open_agent())
        return await asyncio.shield(self._opening)

    async def _open_agent(self) -> AgentSession:
        assert self.agent is not None
        timeout = self.source.target.timeout * 6
        try:
            session = await wait_for(self.agent.open(), timeout)
            await session.handshake(timeout)
        except TimeoutError:
            raise LinkError("timeout", f"{self.name}'s agent: no answer in {timeout:g} s") from None
        self._agent_session = session
        self._spawn(self._relay(session))
        return session

    async def _relay(self, session: AgentSession) -> None:
        """The agent's replies and events onto the node's session (not its samples)."""
        try:
            async for msg in session.messages():
                if isinstance(msg, Sample):
                    continue  # the store's samples are the node's
                if isinstance(msg, NodeEvent):
                    xid = msg.detail.get("xid") if msg.kind == "xid" else None
                    if (
                        isinstance(xid, int)
                        and msg.gpu is not None
                        and self._told_by_other(
                            self._told_by_store, self._told_by_agent, msg.gpu, xid
                        )
                    ):
                        continue
                    self._feed(
                        {
                            "type": "event",
                            "t": msg.t,
                            "kind": msg.kind,
                            "gpu": msg.gpu,
                            "detail": dict(msg.detail),
                        }
                    )
                elif msg.get("type") != "bye":
                    self._feed(msg)
        except (LinkError, OSError):
            pass
        finally:
            if self._agent_session is session:
                self._agent_session = None

    async def _forward(self, msg: JsonObject) -> None:
        try:
            session = await self._agent()
            await session.send(msg)
        except (LinkError, OSError) as e:
            why = e.message if isinstance(e, LinkError) else str(e)
            if "id" in msg:
                self._feed(
                    {
                        "type": "error",
                        "id": msg["id"],
                        "code": "unreachable",
                        "message": f"cannot reach {self.name}'s agent to act: {why}",
                    }
                )

    async def _close_agent(self) -> None:
        session, self._agent_session = self._agent_session, None
        if session is not None:
            with contextlib.suppress(Exception):
                await wait_for(session.close(), 5.0)

    async def open(self) -> AgentSession:
        reading = self.source.latest.get(self.name)
        if reading is None or reading.t is None:
            error = self.source.error
            if error is not None:
                raise LinkError(error.reason, error.message)
            raise LinkError("no_data", f"Prometheus has no series of {self.name} now")
        age = self.source.clock() - reading.t
        if age > 10 * self.source.staleness_period:  # as long as the fleet waits on a link
            # its exporter stopped being scraped: say so rather than show its old sample live
            raise LinkError(
                "no_data", f"Prometheus's newest sample of {self.name} is {age:.0f} s old"
            )
        reader = asyncio.StreamReader(limit=STREAM_LIMIT)
        self._reader = reader
        self._last_t = None
        self._statics = {}
        self._feed(self._hello(reading))
        self.update(reading)

        async def close() -> None:
            if self._reader is reader:
                self._reader = None
            reader.feed_eof()
            await self._close_agent()

        return AgentSession(reader, _Answers(self, reader), close=close)

    def _hello(self, reading: NodeReading) -> JsonObject:
        self._statics = {i: dict(st) for i, st in sorted(reading.statics.items())}
        for i, st in self._statics.items():
            values = reading.gpus.get(i, {})
            total = gpu_wire(i, values, None)["mem_total"]
            st["mem_total"] = total
            st["power_limit"] = values.get("power_limit")
        return {
            "type": "hello",
            "protocol": protocol.PROTOCOL_VERSION,
            "agent": "prometheus",
            "hostname": self.name,
            "pid": 0,
            "python": None,
            "interval": self.source.staleness_period,
            "reader": "prometheus",
            "reader_error": missing_text(reading.seen),
            "driver": reading.driver,
            "cuda": None,
            "nvml": None,
            "features": ["ping"],
            "read_only": True,
            "gpus": list(self._statics.values()),
        }

    def _told_by_other(
        self,
        other: dict[tuple[int, int], float],
        mine: dict[tuple[int, int], float],
        gpu: int,
        xid: int,
    ) -> bool:
        """Whether the other side (agent or store) told ``xid`` on ``gpu`` lately: the same
        error, not to be told twice. Else notes that this side tells it now. Lately: within
        three scrape periods (the store's value comes a scrape and a poll after NVML's event)."""
        now = self.source.clock()
        told = other.get((gpu, xid))
        if told is not None and now - told <= 3 * self.source.staleness_period:
            return True
        mine[(gpu, xid)] = now
        return False

    def _feed(self, msg: JsonObject) -> None:
        if self._reader is not None:
            self._reader.feed_data(_LINE.encode(msg) + b"\n")

    def update(self, reading: NodeReading) -> None:
        """Send the node's newest sample (when its time moved), then an ``xid`` event for each
        GPU whose XID is not the one last told (DCGM exporter's XID_ERRORS is the last XID the
        GPU had, not a count: a new value is a new error; one held since before gpuctl looked
        is told once, at the first open, as an agent tells what the kernel log holds).
        Nothing while the node is not open: what changed meanwhile is told at the next open."""
        if self._reader is None or reading.t is None:
            return
        if self._last_t is None or reading.t > self._last_t:
            self._last_t = reading.t
            gpus = []
            for index in sorted({*self._statics, *reading.gpus}):
                values = reading.gpus.get(index)
                uuid = (self._statics.get(index) or reading.statics.get(index) or {}).get("uuid")
                if values is None:  # was there at the hello, has no series now
                    gpus.append({"index": index, "uuid": uuid, "state": "lost"})
                else:
                    gpus.append(gpu_wire(index, values, uuid))
            self._feed({"type": "sample", "t": reading.t, "seq": self.source.polls, "gpus": gpus})
        for index, values in sorted(reading.gpus.items()):
            xid = values.get("xid")
            if not isinstance(xid, int) or xid == self._xids.get(index, 0):
                continue
            self._xids[index] = xid
            if xid > 0 and not self._told_by_other(
                self._told_by_agent, self._told_by_store, index, xid
            ):
                self._feed(
                    {
                        "type": "event",
                        "t": reading.t,
                        "kind": "xid",
                        "gpu": index,
                        "detail": {"xid": xid, "source": XID.names[0]},
                    }
                )


class _Answers:
    """The request side of a Prometheus node: a ping is answered, anything else refused."""

    def __init__(self, link: PromLink, reader: asyncio.StreamReader) -> None:
        self.link = link
        self.reader = reader

    def write(self, data: bytes | str) -> None:
        try:
            msg = protocol.decode(data.encode() if isinstance(data, str) else data)
        except protocol.ProtocolError:
            return
        kind, req_id = msg.get("type"), msg.get("id")
        if kind == "shutdown" or self.reader.at_eof():
            return
        link = self.link
        if link.agent is not None and (kind != "ping" or link._agent_session is not None):
            link._spawn(link._forward(msg))  # a ping keeps an open agent alive
            return
        if kind == "ping":
            reply: JsonObject = {"type": "pong", "id": req_id, "t": time.time()}
        else:
            reply = {
                "type": "error",
                "id": req_id,
                "code": "read_only",
                "message": self.link.read_only_why or "",
            }
        self.reader.feed_data(protocol.encode(reply))


class PromSource:
    """Polls one store for every GPU it holds and feeds each host's ``PromLink``.

    ``discover()`` (blocking, before the fleet starts) makes the first poll: the nodes are the
    hosts it finds, and a store that cannot be read, or a selector that matches nothing, is one
    error line then. ``run()`` (a fleet service) polls every ``interval`` seconds after that.
    """

    def __init__(
        self,
        target: PromTarget,
        *,
        interval: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.target = target
        self.client = PromClient(target)
        self.interval = interval
        self.clock = clock
        self.stamp_query = stamp_query(target.matchers())  # the next poll's (see ``_stamp``)
        self.queries = queries(target.matchers())  # the last poll's (tests count them)
        # the metric queries' plan (``_plan``): the slow metrics (``SLOW``) and the ones the
        # store had no series of when last asked are asked for ``_slow_hosts`` only, the moved
        # hosts whose turn it is; each moved host's count of new samples picks its turn
        self._samples: dict[str, int] = {}
        self._read_fully: set[str] = set()  # hosts asked every metric once
        self._absent: set[Metric] = set()
        self._slow_hosts: set[str] = set()
        self._rare: tuple[Metric, ...] = ()
        self.latest: dict[str, NodeReading] = {}
        self.links: dict[str, PromLink] = {}
        self.error: PromError | None = None
        self.period = DEFAULT_PERIOD
        self.polls = 0
        self.poll_seconds = 0.0  # the last poll's wall time, queries and grouping
        self.history_step = HISTORY_STEP_S
        self.history_seconds = HISTORY_S
        # Set by the fleet's builder: where the jobs go and new hosts are added (``_take``).
        self.fleet: Fleet | None = None
        self.adds_hosts = False  # a cluster of every host the store holds (not mixed)
        self.jobs_from_squeue: set[str] = set()  # nodes whose jobs gpuctl's squeue watch tells
        # a cluster with ``slurm = true``: squeue tells each GPU's job and user (the hpc_job
        # label has no user); hosts added later join ``job_watcher``'s nodes
        self.squeue = False
        self.squeue_conf: str | None = None
        self.job_watcher: JobWatcher | None = None
        self.jobs_shown: dict[tuple[str, int], str] = {}
        self.odd_hosts: set[str] = set()  # host names left out (``_note_odd``)
        self.capped: str | None = None  # the line saying hosts were left out over the cap

    @property
    def forget_after(self) -> float:
        """Seconds after its newest sample that a host leaves the fleet (0: never); never
        before three sample periods, when it is barely stale."""
        bound = self.target.forget_after
        return max(bound, 3 * self.staleness_period) if bound > 0 else math.inf

    def _newest(self) -> float | None:
        """The store's newest sample of any host held: what a host's age is counted from
        to tell whether it left (``_drop_gone``)."""
        return max((r.t for r in self.latest.values() if r.t is not None), default=None)

    def present(self, hosts: list[str]) -> list[str]:
        """``hosts`` less those that left: whose newest sample is older than ``forget_after``
        counted from the store's newest (see ``_drop_gone``)."""
        newest, bound = self._newest(), self.forget_after
        if newest is None:
            return hosts
        return [h for h in hosts if newest - (self.latest[h].t or -math.inf) <= bound]

    @property
    def staleness_period(self) -> float:
        """The seconds between two samples of a node as seen here: a scrape, or a poll when
        polls are rarer (the hello's ``interval``: a node is stale after three)."""
        return max(self.interval, self.period)

    def _stamp(self) -> str:
        """The stamp query for the next poll: of GPU 0 only once every held host has a GPU 0
        (its time is the host's; at 16,384 GPUs Prometheus reads 2,048 series, not 16,384:
        the poll's first query, which every other waits on, 0.10 -> 0.02 s here), of every
        GPU at the first poll, every ``STAMP_EVERY``-th, and while a held host has no GPU 0
        (lost, or a site whose indexes start elsewhere): such a host would never move."""
        full = (
            not self.latest
            or self.polls % STAMP_EVERY == 0
            or any(0 not in r.gpus for r in self.latest.values())
        )
        return stamp_query(self.target.matchers(), first_gpu=not full)

    def _plan(self, stamped: list[Series]) -> tuple[set[str], list[tuple[Metric | None, str]]]:
        """From the stamp query's answer: the hosts with a sample newer than the one held
        (``moved``), and the queries for their readings. Only those are asked for: at a
        5 s poll over a 15 s scrape a poll's answers hold a third of the GPUs, not every
        one (the rest would be decoded, grouped and dropped as not new). The slow metrics
        (``SLOW``) and those the store had none of are asked only for the moved hosts whose
        turn it is (``_slow_hosts``: every ``SLOW_EVERY``-th new sample of a host, the turns
        spread over the hosts by a hash of the name; a host not yet read fully at once);
        ``_readings`` keeps the others' last values of them."""
        stamps: dict[str, float] = {}
        labels: set[str] = set()
        for s in stamped:
            host, t = s.metric.host(), _number(s.value.text)
            if host and t is not None and t > stamps.get(host, -math.inf):
                if host not in self.latest and not _HOST_NAME.fullmatch(host):
                    self._note_odd(host)
                    continue
                stamps[host] = t
                labels.add(s.metric.host_label())
        stamps = self._within_cap(stamps)
        moved = set()
        mine = self.links if self.links and not self.adds_hosts else None  # mixed: its nodes
        for host, t in stamps.items():
            held = self.latest.get(host)
            if (held is None or held.t is None or t > held.t) and (mine is None or host in mine):
                moved.add(host)
        self._slow_hosts = set()
        self._rare = ()
        if not moved:
            return moved, []
        slow_hosts = set()
        for host in moved:
            n = self._samples[host] = self._samples.get(host, -1) + 1
            if host not in self._read_fully or (n + zlib.crc32(host.encode())) % SLOW_EVERY == 0:
                slow_hosts.add(host)
        self._slow_hosts = slow_hosts
        by = tuple(label for label in HOST_LABELS if label in labels)
        everything = queries(self._matchers(moved, labels, len(stamps)), by)[1:]
        if slow_hosts == moved:
            return moved, everything
        rare = SLOW | self._absent
        self._rare = tuple(m for m in METRICS if m in rare)
        asked = [(m, q) for m, q in everything if m not in rare]
        if slow_hosts:
            some = queries(self._matchers(slow_hosts, labels, len(stamps)), by)[1:]
            asked += [(m, q) for m, q in some if m in rare]
        return moved, asked

    def _note_odd(self, host: str) -> None:
        """A host whose name gpuctl does not take (``_HOST_NAME``) is left out, said once."""
        if host in self.odd_hosts or len(self.odd_hosts) >= 100:
            return
        self.odd_hosts.add(host)
        log.warning(
            "Prometheus at %s: host %r left out: a node's name is letters, digits and _.:@%%+- "
            "(check the exporters' %s labels)",
            self.client.base,
            host[:80],
            "/".join(HOST_LABELS),
        )

    def _within_cap(self, stamps: dict[str, float]) -> dict[str, float]:
        """``stamps`` of at most ``max_hosts`` hosts (``prometheus_max_hosts``): the held ones
        first, then new ones by name; ``capped`` says, once, that some were left out."""
        cap = self.target.max_hosts
        if len(stamps) <= cap:
            return stamps
        held = [h for h in stamps if h in self.latest]
        kept = held[:cap] + sorted(h for h in stamps if h not in self.latest)[: cap - len(held)]
        line = (
            f"Prometheus at {self.client.base} holds GPUs of {len(stamps):,} hosts, over "
            f"prometheus_max_hosts ({cap:,}): "
            f"{len(stamps) - len(kept):,} left out; narrow "
            f"{self.target.name('prometheus_match')}, or raise that limit (a config key)"
        )
        if self.capped != line:
            log.warning("%s", line)
        self.capped = line
        return {h: stamps[h] for h in kept}

    def _matchers(self, hosts: set[str], labels: set[str], held: int) -> str:
        """The selector's matchers for ``hosts`` of the ``held`` the store has: by name
        (Prometheus reads only theirs: a set of names is looked up in its index; one metric at
        16,384 GPUs here: 0.27 s for every host, 0.08 s for a third of them by name, 0.17 s
        for 62%, 0.30 s for all 2,048 by name), when one label names them all."""
        matchers = self.target.matchers()
        if len(labels) == 1 and len(hosts) < held:
            names = hosts_matcher(next(iter(labels)), sorted(hosts))
            matchers = ", ".join(m for m in (matchers, names) if m)
        return matchers

    def _readings(
        self,
        stamped: list[Series],
        moved: set[str],
        asked: list[tuple[Metric | None, str]],
        answers: list[list[Series]],
    ) -> dict[str, NodeReading]:
        """The moved hosts' readings from the poll's answers, all in (``discover``)."""
        self.queries = [(None, self.stamp_query), *asked]
        pairs = list(zip(asked, answers, strict=True))
        nodes = group([(m, a) for (m, _q), a in pairs])
        group([(None, stamped)], nodes)
        self._note_absent(pairs)
        return self._complete({h: r for h, r in nodes.items() if h in moved})

    def _note_absent(self, pairs: list[tuple[tuple[Metric | None, str], list[Series]]]) -> None:
        """The metrics none of the hosts asked has (asked by turns from the next poll on)."""
        for (m, _q), a in pairs:
            if m is None:
                continue
            if a:
                self._absent.discard(m)
            elif m not in self._rare:
                self._absent.add(m)

    def _complete(self, readings: dict[str, NodeReading]) -> dict[str, NodeReading]:
        """``readings`` (moved hosts whose queries have all answered) made whole: the hosts not
        asked the rare metrics this poll keep their last values of them."""
        rare = self._rare
        if rare:
            tables = {m.table for m in rare if m.table is not None}
            keys = [m.key for m in rare if m.table is None]
            labels = {m.label for m in rare}
            for host, reading in readings.items():
                held = self.latest.get(host)
                if host in self._slow_hosts or held is None:
                    continue
                reading.seen |= held.seen & labels
                for index, values in reading.gpus.items():
                    old = held.gpus.get(index)
                    if old is None:
                        continue
                    for table in tables:  # each poll's tables are new dicts: shared, not copied
                        if table in old:
                            values[table] = old[table]
                    for key in keys:
                        if key in old:
                            values[key] = old[key]
        self._read_fully |= self._slow_hosts & readings.keys()
        return readings

    async def _poll_whole(self) -> dict[str, NodeReading]:
        """A poll whose readings are used once all are in (``discover``)."""
        deadline = time.monotonic() + self.target.timeout
        self.stamp_query = self._stamp()
        stamped = await self.client.query(self.stamp_query, deadline=deadline)
        moved, asked = self._plan(stamped)
        gate = asyncio.Semaphore(QUERIES_AT_ONCE)

        async def ask(promql: str) -> list[Series]:
            async with gate:
                return await self.client.query(promql, deadline=deadline)

        answers = list(await asyncio.gather(*(ask(q) for _m, q in asked)))
        return self._readings(stamped, moved, asked, answers)

    async def poll(
        self, ready: Callable[[dict[str, NodeReading]], None] | None = None
    ) -> dict[str, NodeReading]:
        """One poll: the hosts with a new sample (see ``_plan``), each metric's query for them
        at once (threads, ``QUERIES_AT_ONCE`` in flight), each answer grouped per host as it
        comes, while the others are still out (grouping them all after the last answer was
        0.1 s median, 0.27 s p95 of a poll at 16,384 GPUs here). Raises PromError.

        With ``ready``, each group of hosts is handed to it as soon as every query that reads
        them has answered (``_groups``: the hosts not at their slow metrics' turn once the
        fast queries are in, the others at the end), whole (``_complete``): publishing the
        moved nodes after the whole poll's last answer was 0.15 / 0.41 s median / p95 of a
        poll at 16,384 GPUs with the screen, on top of the queries; now that is done for most
        of them while the slow counters are out. A host is handed over once, all its GPUs
        read by the same answers: no row mixes a new value with a missing one. When a query
        fails, the groups it reads are not handed over (their hosts move again next poll),
        the others are as their queries answer, and the poll raises the error then."""
        deadline = time.monotonic() + self.target.timeout  # the whole poll's
        self.stamp_query = self._stamp()
        stamped = await self.client.query(self.stamp_query, deadline=deadline)
        moved, asked = self._plan(stamped)
        gate = asyncio.Semaphore(QUERIES_AT_ONCE)
        nodes = group([(None, stamped)])
        groups = self._groups(moved, asked)
        waiting = [len(needs) for _hosts, needs in groups]
        readings: dict[str, NodeReading] = {}

        def hand_over(index: int) -> None:
            hosts = groups[index][0]
            # taken out of ``nodes``: an answer that also holds other hosts' series (not
            # asked by name) must not change a reading already handed over
            done = self._complete({h: nodes.pop(h) for h in hosts if h in nodes})
            readings.update(done)
            if ready is not None and done:
                ready(done)

        async def ask(n: int, metric: Metric | None, promql: str) -> list[Series]:
            async with gate:
                series = await self.client.query(promql, deadline=deadline)
            group([(metric, series)], nodes)
            for index, (_hosts, needs) in enumerate(groups):
                if n in needs:
                    waiting[index] -= 1
                    if waiting[index] == 0:
                        hand_over(index)
            return series

        # every query awaited, failed or not: the groups whose queries all answered are
        # handed over even when another's failed (a poll cancelled cancels them all)
        got = await asyncio.gather(
            *(ask(n, m, q) for n, (m, q) in enumerate(asked)), return_exceptions=True
        )
        answers: list[list[Series]] = []
        for answer in got:
            if isinstance(answer, BaseException):
                raise answer
            answers.append(answer)
        for index, count in enumerate(waiting):  # a group no query reads (none moved)
            if count == 0 and groups[index][0] & nodes.keys():
                hand_over(index)
        self.queries = [(None, self.stamp_query), *asked]
        self._note_absent(list(zip(asked, answers, strict=True)))
        return readings

    def _groups(
        self, moved: set[str], asked: list[tuple[Metric | None, str]]
    ) -> list[tuple[set[str], set[int]]]:
        """The moved hosts in groups, each with the queries (indexes into ``asked``) that read
        them: the rare metrics' queries read only ``_slow_hosts`` (see ``_plan``), every other
        query every moved host. ``asked`` lists the fast queries first, so the larger group,
        the hosts not at their turn, is whole while the rare ones are still out."""
        every = {n for n, (m, _q) in enumerate(asked) if m not in self._rare}
        if not self._rare:
            return [(moved, every)]
        slow = moved & self._slow_hosts
        return [(moved - slow, every), (slow, set(range(len(asked))))]

    def discover(self) -> list[str]:
        """The hosts the store holds GPUs of now, sorted; makes the nodes' links. Raises
        PromError (one line), ``no_match`` when the selector matches no GPU."""
        return self.client.run_blocking(self._discover)

    async def _discover(self) -> list[str]:
        polled = await self._poll_whole()
        if self.capped is not None:
            raise PromError("too_large", self.capped)
        readings = {h: r for h, r in polled.items() if r.gpus and r.t is not None}
        if not readings:
            sel = _selector(UTIL.names, self.target.matchers())
            raise PromError(
                "no_match",
                f"Prometheus at {self.client.base} has no series {sel}: is DCGM exporter scraped"
                f" there? check {self.target.name('prometheus_match')}",
            )
        self.period = await self._scrape_period(readings)
        self._take(readings, publish=False)
        return sorted(readings)

    async def _scrape_period(self, readings: dict[str, NodeReading]) -> float:
        """The scrape period: the median gap between one GPU's raw samples over 5 minutes."""
        host = min(readings)
        gpu = min(readings[host].gpus)
        extra = self.target.matchers()
        # which label named the host is not kept: each is tried until one answers
        for label in HOST_LABELS:
            matchers = ", ".join(m for m in (f'{label}="{host}", gpu="{gpu}"', extra) if m)
            # a MIG GPU's instances have GR_ENGINE_ACTIVE, not GPU_UTIL: either's times
            sel = f"{_selector((*UTIL.names, MIG_UTIL), matchers)}[5m]"
            try:
                series = await self.client.query_matrix(sel)
            except PromError:
                return DEFAULT_PERIOD
            if series:
                times = sorted(t for t, _v in series[0].values)
                gaps = [b - a for a, b in itertools.pairwise(times) if b > a]
                return float(statistics.median(gaps)) if gaps else DEFAULT_PERIOD
        return DEFAULT_PERIOD

    def _take(self, readings: dict[str, NodeReading], *, publish: bool, fed: bool = False) -> None:
        """A poll's ``readings`` held (``latest``) and, with ``publish``, told: new hosts
        added, gone ones dropped, each host's link fed its sample (unless ``fed``: ``poll``
        handed them to ``_feed`` group by group already), the ``hpc_job`` labels."""
        self.polls += 1
        if not fed:
            self._hold(readings)
        if not publish:
            return
        if self.fleet is not None and self.adds_hosts:
            self._add_hosts(readings)
            self._drop_gone()
        if not fed:
            self._feed(readings)
        if self.fleet is not None:
            self._publish_jobs()

    def _hold(self, readings: dict[str, NodeReading]) -> None:
        for host, reading in readings.items():
            if reading.t is not None:
                self.latest[host] = reading

    def _feed(self, readings: dict[str, NodeReading]) -> None:
        """``readings`` held and fed to their hosts' links (a group of a poll: see ``poll``)."""
        self._hold(readings)
        for host, reading in readings.items():
            link = self.links.get(host)
            if link is not None:
                link.update(reading)

    async def poll_once(self) -> dict[str, NodeReading]:
        """A poll as ``run`` makes it: each group of hosts fed to the links as soon as its
        queries have answered, then the poll's end (new hosts, gone ones, jobs). Raises
        PromError (the groups fed before it stay fed)."""
        readings = await self.poll(ready=self._feed)
        self._take(readings, publish=True, fed=True)
        return readings

    def _add_hosts(self, readings: dict[str, NodeReading]) -> None:
        """Hosts the store holds GPUs of now and the fleet has no node for become nodes (a
        node booted, a rack added). Every poll's queries already cover every host the
        selector matches, so this is a set difference a poll, not a discovery query."""
        assert self.fleet is not None
        newest = self._newest()
        for host in sorted(set(readings) - set(self.links)):
            reading = readings[host]
            if not reading.gpus or reading.t is None or host in self.fleet.nodes:
                continue  # no GPU yet, or a node of another cluster by that name
            if newest is not None and newest - reading.t > self.forget_after:
                continue  # an old sample the store still answers with: not back
            link = self.links[host] = PromLink(self, host)
            self.fleet.add_node(host, link)
            if self.job_watcher is not None:
                self.job_watcher.nodes.add(host)
                self.jobs_from_squeue.add(host)

    def _drop_gone(self) -> None:
        """The hosts whose newest sample is older than ``forget_after`` leave the fleet (see
        the module's doc). Older than the store's newest sample of any host, not than the
        clock: when the store stops scraping, or every exporter stops at once, no host falls
        behind the others and none leaves. (Judged by the clock, with "unless no host is
        fresh" as the guard, the hosts whose last scrape came a second earlier left while the
        last scraped were still fresh: a test saw it.) A poll's readings are the hosts that
        moved: the others' newest sample is the one held in ``latest``."""
        fleet = self.fleet
        assert fleet is not None
        newest, bound, now = self._newest(), self.forget_after, self.clock()
        if newest is None:
            return
        for host, reading in list(self.latest.items()):
            if reading.t is None or newest - reading.t <= bound:
                continue
            age = now - reading.t
            del self.latest[host]
            self._samples.pop(host, None)  # back later: read fully again, its turns anew
            self._read_fully.discard(host)
            link = self.links.pop(host, None)
            if link is None:
                continue  # never a node (another cluster's name, an old sample)
            self.jobs_from_squeue.discard(host)
            if self.job_watcher is not None:
                self.job_watcher.nodes.discard(host)
            rt = fleet.nodes.get(host)
            if rt is not None and rt.link is link:
                fleet.remove_node(host, f"left the store (last sample {fmt_age(age)} ago)")

    def _publish_jobs(self) -> None:
        """Each GPU's Slurm job from the ``hpc_job`` labels, as the fleet's GPU annotation
        (``slurm_job``, what the squeue watch sets for agents; the label has no user); the
        nodes in ``jobs_from_squeue`` are left to that watch."""
        fleet = self.fleet
        assert fleet is not None
        holders: dict[tuple[str, int], str] = {}
        for host, reading in self.latest.items():  # a poll reads the moved hosts only
            if host in self.jobs_from_squeue or host not in self.links:
                continue
            for gpu, jobs in reading.jobs.items():
                holders[(host, gpu)] = ",".join(sorted(jobs, key=lambda j: (len(j), j)))
        for host, gpu in set(self.jobs_shown) - set(holders):
            if host in fleet.nodes:
                fleet.annotate(host, gpu, slurm_job=None)
        for (host, gpu), job in holders.items():
            if self.jobs_shown.get((host, gpu)) != job and host in fleet.nodes:
                fleet.annotate(host, gpu, slurm_job=job)
        self.jobs_shown = holders

    async def history(self, host: str, start: float, end: float) -> list[GpuSample]:
        """``host``'s GPUs from ``start`` to ``end`` (see ``PromLink.history``)."""
        reading = self.latest.get(host)
        label = reading.host_label if reading is not None else HOST_LABELS[0]
        extra = self.target.matchers()
        matchers = ", ".join(m for m in (f'{label}="{host}"', extra) if m)
        step = max(self.history_step, (end - start) / MAX_POINTS)
        asked = [
            (key, scale, per_gpu((name,), matchers, "gpu")) for key, name, scale in HISTORY_METRICS
        ]
        # MIG instances' utilisation, with the GPU's model (its slices: ``mig_util``)
        asked.append((*HISTORY_UTIL, mig_query(matchers, f"gpu, {', '.join(MODEL_LABELS)}")))
        deadline = time.monotonic() + self.target.timeout
        answers = await asyncio.gather(
            *(
                self.client.query_range(promql, start, end, step, deadline=deadline)
                for _key, _scale, promql in asked
            )
        )
        points: dict[tuple[float, int], dict[str, Any]] = {}
        # (t, gpu, key, scale) -> a MIG GPU's instances then
        mig: dict[tuple[float, int, str, float], dict[str, tuple[str, float | None]]] = {}
        models: dict[int, str] = {}  # a MIG GPU -> its model
        for (key, scale, _q), series in zip(asked, answers, strict=True):
            for rs in series:
                gpu = gpu_index(rs.metric.gpu)
                if gpu is None:
                    continue
                instance = rs.metric.GPU_I_ID
                if instance:
                    models[gpu] = rs.metric.modelName or rs.metric.model
                for t, text in rs.values:
                    value = _number(text)
                    if value is None:
                        continue
                    if instance:  # a MIG instance's utilisation: weighed below
                        mig.setdefault((t, gpu, key, scale), {})[instance] = (
                            rs.metric.GPU_I_PROFILE,
                            value,
                        )
                    else:  # e.g. FB_USED is MiB, the history's memory GiB
                        points.setdefault((t, gpu), {})[key] = value * scale
        for (t, gpu, key, scale), instances in mig.items():
            util = mig_util(instances, models.get(gpu))
            if util is not None:
                points.setdefault((t, gpu), {})[key] = util * scale
        return [history_sample(index, t, got) for (t, index), got in sorted(points.items())]

    async def run(self) -> None:
        """Poll every ``interval`` seconds until cancelled (a fleet service); cancelled, the
        poll's requests end with it and the connections are closed."""
        try:
            while True:
                started = time.monotonic()
                try:
                    await self.poll_once()
                except PromError as e:
                    self.error = e
                else:
                    self.error = None
                self.poll_seconds = time.monotonic() - started
                # a timer: the store is polled at a rate, not in answer to anything
                await asyncio.sleep(max(0.0, self.interval - self.poll_seconds))
        finally:
            await self.client.aclose()


def prometheus_links(
    target: PromTarget,
    *,
    interval: float = 5.0,
    agents: dict[str, NodeLink] | None = None,
) -> tuple[PromSource, dict[str, NodeLink]]:
    """A source for ``target``, discovered (blocking), and its links by node. Without
    ``agents``, a read-only link for every host the store holds; with ``agents`` (node ->
    its agent link: a mixed cluster), those nodes only, each watched through the store when it
    holds the node, through its agent alone when not. The fleet built over these links is
    given to ``source.fleet`` (new hosts, ``hpc_job`` labels). Raises PromError
    (``no_match`` also when the store holds none of ``agents``' nodes)."""
    source = PromSource(target, interval=interval)
    hosts = source.discover()
    if agents is None:
        source.links = {h: PromLink(source, h) for h in source.present(hosts)}
        source.adds_hosts = True  # hosts that appear later are nodes too, once a fleet runs
        return source, dict(source.links)
    held = set(hosts)
    source.links = {n: PromLink(source, n, agent) for n, agent in agents.items() if n in held}
    if not source.links and agents:
        shown = ", ".join(hosts[:3]) + (", ..." if len(hosts) > 3 else "")
        raise PromError(
            "no_match",
            f"Prometheus at {source.client.base} holds GPUs of {shown} but of none of the "
            f"cluster's nodes ({', '.join(list(agents)[:3])}{', ...' if len(agents) > 3 else ''})"
            f": check the names or {target.name('prometheus_match')}",
        )
    return source, {n: source.links.get(n) or agent for n, agent in agents.items()}
