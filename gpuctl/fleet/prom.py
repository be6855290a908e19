"""Nodes read from the site's Prometheus (DCGM exporter's series), not from agents.

A site of tens of thousands of GPUs already runs NVIDIA's DCGM exporter on every node and a
Prometheus (or VictoriaMetrics, Thanos, Mimir: the same HTTP API) scraping them. ``PromSource``
reads that store every interval (``prompoll``: the polls, and what they publish) and hands each
host's ``PromLink`` the protocol lines an agent would send (a hello, then samples), so the
fleet, the screen, ``status`` and ``export`` work unchanged.

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
instead, users included). Hosts that appear later become nodes, and those
whose samples stop leave the fleet (``promhosts``).

Its parts: the HTTP client (``promhttp``: aiohttp, bounded in bytes and time, TLS, credentials),
the answers' types and the client that decodes them (``promwire``: bounded in series), the
metrics read and the PromQL asked (``promquery``), MIG weighting (``prommig``), the answers
grouped per host (``promgroup``), the hosts found and forgotten (``promhosts``), polling and
publishing (``prompoll``); here each node's link (its lines, its agent when mixed), the history
asked for the detail screen, and ``prometheus_links`` (the source discovered, its links).

A node seen through Prometheus alone has no agent: its link answers pings and refuses every
other request, and it is read-only (``read_only_why`` says why to the keys that act). A mixed
node (the cluster also says how to reach it) opens its agent on the first request to act;
an XID both its agent and the store tell is told once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import msgspec

from gpuctl.config import PrometheusConfig
from gpuctl.core.deadline import wait_for
from gpuctl.core.model import GpuSample, NodeEvent
from gpuctl.core.wire import JsonObject
from gpuctl.fleet.gpu_history import history_sample
from gpuctl.fleet.links import STREAM_LIMIT, NodeLink

# tests and benchmarks name these here (``prom_scale.py`` loads a tree's prom.py alone)
from gpuctl.fleet.promgroup import NodeReading as NodeReading
from gpuctl.fleet.promgroup import gpu_index as gpu_index
from gpuctl.fleet.promgroup import group as group
from gpuctl.fleet.promgroup import number
from gpuctl.fleet.promhosts import DEFAULT_PERIOD as DEFAULT_PERIOD
from gpuctl.fleet.promhttp import PromError as PromError  # the HTTP client's, said here too
from gpuctl.fleet.prommig import MIB, mig_util
from gpuctl.fleet.prommig import mig_slices as mig_slices
from gpuctl.fleet.prommig import profile_slices as profile_slices
from gpuctl.fleet.prompoll import QUERIES_AT_ONCE as QUERIES_AT_ONCE
from gpuctl.fleet.prompoll import SLOW_EVERY as SLOW_EVERY
from gpuctl.fleet.prompoll import STAMP_EVERY as STAMP_EVERY
from gpuctl.fleet.prompoll import PromPolling
from gpuctl.fleet.promquery import GAUGES, XID, mig_query, per_gpu
from gpuctl.fleet.promquery import METRICS as METRICS
from gpuctl.fleet.promquery import MIG as MIG
from gpuctl.fleet.promquery import SLOW as SLOW
from gpuctl.fleet.promquery import UTIL as UTIL
from gpuctl.fleet.promquery import Metric as Metric
from gpuctl.fleet.promquery import hosts_matcher as hosts_matcher
from gpuctl.fleet.promquery import queries as queries
from gpuctl.fleet.promquery import stamp_query as stamp_query
from gpuctl.fleet.promwire import _MATRIX as _MATRIX
from gpuctl.fleet.promwire import _VECTOR as _VECTOR
from gpuctl.fleet.promwire import HOST_LABELS, MODEL_LABELS
from gpuctl.fleet.promwire import Labels as Labels
from gpuctl.fleet.promwire import PromClient as PromClient
from gpuctl.fleet.promwire import RangeSeries as RangeSeries
from gpuctl.fleet.promwire import Series as Series
from gpuctl.fleet.session import AgentSession, LinkError, Sample
from gpuctl.node import protocol
from gpuctl.node.metrics import METRICS as REGISTRY

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
# floats come from ``number``, never NaN (which json refuses and msgspec writes as null).
_LINE = msgspec.json.Encoder()


# Where the store is and how to ask it: the config's own type (``[clusters.X] prometheus*``
# keys, or ``--prometheus``), one definition for both.
PromTarget = PrometheusConfig


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


class PromSource(PromPolling):
    """Polls one store for every GPU it holds and feeds each host's ``PromLink`` (the polls:
    ``prompoll``, the hosts found and forgotten: ``promhosts``), and reads a host's history."""

    history_step = HISTORY_STEP_S  # (a test's source asks a finer step)
    history_seconds = HISTORY_S

    def _new_link(self, host: str) -> PromLink:
        return PromLink(self, host)

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
                    value = number(text)
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
