"""The fleet: one supervised link per node, a state per node, history, and commands to agents.

Every node runs in its own task: connect (bounded concurrency, a deadline), handshake, stream,
and on any failure record the reason and retry with exponential backoff plus jitter. One slow
or dead node never delays the others. Listeners get a ``NodeSnapshot`` whenever a node changes;
they run on the event loop and must be quick (the TUI posts a message and returns).

Liveness: right after the handshake the fleet sends the agent its options (``configure``:
``liveness_timeout``, and ``max_duration`` once ``configure_agents`` set it from the config), then
pings it every ``liveness_timeout / 3`` seconds. An agent that hears nothing for
``liveness_timeout`` stops its burners and suites and exits: a frozen gpuctl or a partitioned
network does not leave GPUs burning (the kernel reports neither).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import heapq
import logging
import math
import random
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any, Literal

from gpuctl.core.deadline import wait_for
from gpuctl.core.format import QUIET_THROTTLE
from gpuctl.core.model import BurnState, GpuNotes, GpuSample, NodeEvent, NodeSnapshot, NodeState
from gpuctl.core.wire import JsonObject
from gpuctl.fleet.gpu_history import (
    EMPTY,
    OLDER_KEPT,
    OLDER_STEP_S,
    RECENT_KEPT,
    GpuHistory,
    NodeHistory,
    history_sample,
)
from gpuctl.fleet.gpu_history import METRICS as HISTORY_COLUMNS
from gpuctl.fleet.idle import IDLE_AFTER_S, IDLE_BELOW, IdleTracker
from gpuctl.fleet.links import NodeLink
from gpuctl.fleet.session import AgentSession, LinkError, Message, Sample
from gpuctl.node import protocol

log = logging.getLogger(__name__)

# File descriptors a node may hold on the login side (an SSH socket; a simulated node's pipes)
# and what the rest of the process needs: see ``fd_room``.
FDS_PER_NODE = 4
FDS_SPARE = 256

Listener = Callable[[NodeSnapshot], None]
EventListener = Callable[[str, NodeEvent], None]  # (node, event)
MessageListener = Callable[[str, JsonObject], None]  # (node, message as decoded, unchecked)
WireListener = Callable[[str, JsonObject], None]  # (node, any message read, hello included)
RemovalListener = Callable[[str, str], None]  # (node, why it left)


class _Keep(enum.Enum):
    KEEP = "keep"  # ``annotate``: leave this annotation as it is


KEEP = _Keep.KEEP

# The longest wait between two connection attempts to a node that is down. A node that comes back
# shows within this plus one connect (about a second over SSH): at 30 s (the old cap) a node
# whose sshd was back took 29 s to show; at 8 s it shows within ~10 s, and a down node costs one
# SSH attempt per 4-8 s (jittered), which 4,096 down nodes at 32 connects at once can afford.
BACKOFF_MAX_S = 8.0
HISTORY_SECONDS = RECENT_KEPT  # samples kept as they came per GPU (see gpuctl.fleet.gpu_history)
EVENTS_KEPT = 200


class NodeRuntime:
    """Mutable per-node state owned by the fleet's task for that node."""

    def __init__(self, name: str, link: NodeLink, history: NodeHistory | None = None) -> None:
        self.name = name
        self.link = link
        self.snapshot = NodeSnapshot(name=name, state=NodeState.CONNECTING, link=link.kind)
        self.session: AgentSession | None = None
        self.task: asyncio.Task[None] | None = None
        self.history = NodeHistory() if history is None else history  # its GPUs' samples
        self.events: deque[NodeEvent] = deque(maxlen=EVENTS_KEPT)
        # Throttle starts and ends, derived from the samples (``throttle_event``): kept apart,
        # so that a power cap flapping at full load never pushes an XID out of ``events``.
        self.throttle_events: deque[NodeEvent] = deque(maxlen=EVENTS_KEPT)
        self.throttle: dict[int, Throttling] = {}
        self.failures = 0
        self.wake = asyncio.Event()  # set to cut a backoff short (reconnect key)
        self.retry_at: float | None = None  # fleet.clock() time of the next connect attempt
        self.interval = 1.0
        self.live_since = 0.0  # time.monotonic() of the last handshake
        self.dropped: str | None = None  # why the watchdog dropped a silent link


class Fleet:
    """Keeps every node's agent running and its latest state at hand."""

    def __init__(
        self,
        links: Mapping[str, NodeLink],
        *,
        concurrency: int = 32,
        connect_timeout: float = 20.0,
        stale_after: float = 3.0,
        backoff_base: float = 1.0,
        backoff_max: float = BACKOFF_MAX_S,
        history_len: int = HISTORY_SECONDS,
        history_older: int = OLDER_KEPT,
        history_step: float = OLDER_STEP_S,
        clock: Callable[[], float] = time.time,
        liveness_timeout: float = protocol.DEFAULT_LIVENESS_S,
        rng: random.Random | None = None,
        idle_after: float = IDLE_AFTER_S,
        idle_below: float = IDLE_BELOW,
        idle_clock: Callable[[], float] = time.time,
    ) -> None:
        """``rng`` draws the backoff's jitter (a seeded one: the same waits every run);
        ``idle_*`` set ``idle``, the GPUs allocated but idle (``gpuctl.fleet.idle``)."""
        self.history_len = history_len
        self.history_older = history_older
        self.history_step = history_step
        self.nodes = {
            name: NodeRuntime(name, link, self._new_history()) for name, link in links.items()
        }
        # Sent to every agent at each handshake (``configure``); see the module docstring.
        self.agent_options: dict[str, float] = {}
        self.configure_agents(liveness_timeout=liveness_timeout)
        self._sem = asyncio.Semaphore(concurrency)
        self.connect_timeout = connect_timeout
        self.stale_after = stale_after
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.clock = clock
        self._listeners: list[Listener] = []
        self._event_listeners: list[EventListener] = []
        self._message_listeners: list[MessageListener] = []
        self._wire_listeners: list[WireListener] = []
        self._removal_listeners: list[RemovalListener] = []
        self._removals: set[asyncio.Task[None]] = set()  # removed nodes' tasks being ended
        # The node ``remove_node`` is publishing the last snapshot of (else None): a listener
        # that keeps what happened (a recording) tells a node that left from one that went down.
        self.leaving: str | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._rng = rng or random.Random()
        self._backfilled: set[str] = set()
        self._running = False  # between start() and stop(): a node added then starts at once
        # Stress state of this fleet (``gpuctl.fleet.control``): the [stress] fields every
        # stress_start carries, and whether burn events already become annotations.
        self.stress_defaults: dict[str, Any] = {}
        self.burns_tracked = False
        self.idle = IdleTracker(after=idle_after, below=idle_below, clock=idle_clock)
        self.subscribe(self.idle.observe)
        self.on_removed(self.idle.forget)

    # -- subscription -----------------------------------------------------------------------
    def subscribe(self, listener: Listener) -> None:
        """Call ``listener(snapshot)`` on every change of any node."""
        self._listeners.append(listener)

    def on_event(self, listener: EventListener) -> None:
        """Call ``listener(node, event)`` for every agent event (XID, lost GPU, burn progress)
        and every throttle start and end the fleet reads from the samples (``throttle``)."""
        self._event_listeners.append(listener)

    def on_message(self, listener: MessageListener) -> None:
        """Call ``listener(node, msg)`` for agent messages that are not samples or events."""
        self._message_listeners.append(listener)

    def on_wire(self, listener: WireListener) -> None:
        """Call ``listener(node, msg)`` for every message an agent sends, hello included, as
        decoded and unchecked, before the fleet reads it (``gpuctl.fleet.recording.writer``)."""
        self._wire_listeners.append(listener)

    def on_removed(self, listener: RemovalListener) -> None:
        """Call ``listener(node, why)`` when a node leaves the fleet (``remove_node``), after
        its last snapshot was published and it is no longer in ``nodes``."""
        self._removal_listeners.append(listener)

    def unsubscribe(self, listener: Callable[..., None]) -> None:
        """Stop calling ``listener`` (given to ``subscribe``, ``on_event``, ``on_message``,
        ``on_wire`` or ``on_removed``)."""
        for listeners in (
            self._listeners,
            self._event_listeners,
            self._message_listeners,
            self._wire_listeners,
            self._removal_listeners,
        ):
            while listener in listeners:
                listeners.remove(listener)

    def _on_wire(self, name: str, line: bytes | str) -> None:
        """A line an agent sent, decoded into a dict for the wire listeners only while there
        are some (the links decode samples straight into typed values)."""
        if not self._wire_listeners:
            return
        try:
            msg = protocol.decode(line, lenient=True)
        except protocol.ProtocolError:
            return  # the session refuses it too, and says why
        for listener in self._wire_listeners:
            listener(name, msg)

    def forget_history(self, name: str) -> None:
        """Drop a node's kept samples, its latest one too, and its events, and publish (a
        replay that jumped in time: what it showed is not what the node said then)."""
        rt = self.nodes[name]
        rt.history.clear()
        rt.events.clear()
        rt.throttle_events.clear()
        rt.throttle.clear()
        self._publish(rt, gpus=(), last_sample_t=None)

    def _publish(self, rt: NodeRuntime, **changes: Any) -> None:
        if self.nodes.get(rt.name) is not rt:
            return  # removed (``remove_node``): a task that outlived it says nothing more
        rt.snapshot = replace(rt.snapshot, **changes)
        for listener in self._listeners:
            listener(rt.snapshot)

    # -- agent options ----------------------------------------------------------------------
    @property
    def liveness_timeout(self) -> float:
        """Seconds an agent may hear nothing before it stops everything (0: never)."""
        return self.agent_options["liveness_timeout"]

    def configure_agents(
        self, *, liveness_timeout: float | None = None, max_duration: float | None = None
    ) -> None:
        """Set the options every agent gets (now for live ones, and at each handshake):
        ``liveness_timeout`` (s, 0: off) and ``max_duration`` (s: the longest burn an agent
        starts). Raises ValueError for a value an agent would refuse."""
        options: dict[str, float] = {}
        if liveness_timeout is not None:
            if not (liveness_timeout == 0 or 1 <= liveness_timeout <= protocol.MAX_LIVENESS_S):
                raise ValueError(
                    f"liveness_timeout must be 0 (off) or within 1..{protocol.MAX_LIVENESS_S:g} s"
                )
            options["liveness_timeout"] = float(liveness_timeout)
        if max_duration is not None:
            if not 1 <= max_duration <= protocol.MAX_DURATION_CEILING:
                raise ValueError(
                    f"max_duration must be within 1..{protocol.MAX_DURATION_CEILING:g} s"
                )
            options["max_duration"] = float(max_duration)
        self.agent_options.update(options)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop, no live session: the options go out at the next handshakes
        for rt in self.nodes.values():
            session = rt.session
            if session is not None and session.info and "configure" in session.info.features:
                task = loop.create_task(self._configure(session))
                task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _configure(self, session: AgentSession) -> None:
        """Send the agent options; the agent handles requests in order, so whatever is sent
        after this call is judged by them."""
        await session.send({"type": "configure", **self.agent_options})

    async def _keep_alive(self, rt: NodeRuntime, session: AgentSession) -> None:
        """Ping the agent every ``liveness_timeout / 3`` seconds (see the module docstring),
        while ``session`` is the node's (a pinger whose cancel was lost ends by itself)."""
        while self.liveness_timeout > 0 and rt.session is session:
            period = self.liveness_timeout / 3
            await asyncio.sleep(period)  # a timer: the agent's liveness rule is about time
            # Any failure here is the link's: the message loop sees it end and this task goes.
            with contextlib.suppress(Exception):
                await session.request({"type": "ping"}, timeout=period)

    # -- queries ------------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return list(self.nodes)

    def snapshot(self, name: str) -> NodeSnapshot:
        return self.nodes[name].snapshot

    def snapshots(self) -> list[NodeSnapshot]:
        return [rt.snapshot for rt in self.nodes.values()]

    def history(self, name: str, gpu: int) -> GpuHistory:
        """One GPU's kept history (``series``, ``recent``; empty for a GPU never seen). It is
        the fleet's own, changed by the next sample: read it, do not keep it. Empty too for a
        node removed since the caller saw it (a screen repaints it until its next flush)."""
        rt = self.nodes.get(name)
        found = None if rt is None else rt.history.get(gpu)
        return EMPTY if found is None else found

    def _new_history(self, interval: float = 1.0) -> NodeHistory:
        """A node's history: ``history_len`` seconds of its samples as they came, so that a
        node whose samples come every ``interval`` > 1 s (its hello's: a Prometheus node's is
        the scrape period) keeps fewer of them, the same minutes. At 16,384 GPUs read from a
        store every 15 s, 900 samples a GPU (3.75 h) were 455 MiB of the 595 MiB the process
        held with the screen (tracemalloc); 60 of them (15 min): peak RSS 727 -> 367 MB
        (``benchmarks/prom_scale.py --tui --trees``, docs/notes/perfprom.md). A node sampling
        faster than every 10 s keeps the last 5 minutes as they came and one sample each 10 s
        before them (``NodeHistory.sized``)."""
        return NodeHistory.sized(self.history_len, interval, self.history_older, self.history_step)

    async def backfill(self, name: str) -> bool:
        """Fill a node's kept history with what its link's store kept before this process saw
        it (``NodeLink.history``: a node seen through Prometheus has one), once per node; True
        when it did. The detail screen calls it when it opens; a failure is logged, not raised."""
        rt = self.nodes[name]
        if name in self._backfilled:
            return False
        self._backfilled.add(name)
        firsts = [h.series("util")[0][:1] for h in rt.history.values()]
        end = min((f[0] for f in firsts if f), default=self.clock())
        try:
            past = await rt.link.history(end - 1e-3)
        except Exception as e:  # the store's one line; the screen keeps what it has
            log.warning("%s: no history from its store: %s", name, e)
            return False
        if past is None:  # no store behind this link
            return False
        # The store's samples, then what this process kept, as samples of the node by time
        # (the history keeps a node's GPUs side by side, at shared times).
        at: dict[float, dict[int, GpuSample]] = {}
        for g in past:
            at.setdefault(g.t, {})[g.index] = g
        for gpu, kept in rt.history.items():
            times = kept.series("util")[0]
            columns = {m: kept.series(m)[1] for m in HISTORY_COLUMNS}
            for i, t in enumerate(times):
                values = {m: columns[m][i] for m in columns}
                at.setdefault(t, {})[gpu] = history_sample(gpu, t, values)
        fresh = self._new_history(rt.interval)
        for t in sorted(at):
            fresh.add(t, [at[t][gpu] for gpu in sorted(at[t])])
        rt.history = fresh
        self._publish(rt)
        return True

    def events(self, name: str) -> list[NodeEvent]:
        """A node's kept events, oldest first: the agent's, and the throttle starts and ends
        read from its samples (none for a node removed since the caller saw it)."""
        rt = self.nodes.get(name)
        if rt is None:
            return []
        if not rt.throttle_events:
            return list(rt.events)
        return list(heapq.merge(rt.events, rt.throttle_events, key=lambda e: e.t))

    def retry_at(self, name: str) -> float | None:
        """When (``clock`` time) the fleet next tries to connect to a node that is down, or
        None when it is not waiting to (connected, or trying now, or removed)."""
        rt = self.nodes.get(name)
        return None if rt is None else rt.retry_at

    def add_node(self, name: str, link: NodeLink) -> None:
        """A node found after the fleet was made (a host that appeared in the site's
        Prometheus): kept as the others are, its snapshot published (the screen adds its row)
        and, while the fleet runs, its task started. Raises ValueError for a name it has."""
        if name in self.nodes:
            raise ValueError(f"the fleet already has a node {name}")
        rt = self.nodes[name] = NodeRuntime(name, link, self._new_history())
        self._publish(rt)
        if self._running:
            rt.task = asyncio.create_task(self._run_node(rt), name=f"node:{rt.name}")

    def remove_node(self, name: str, why: str) -> None:
        """A node that left (a host the site's Prometheus no longer holds samples of,
        ``gpuctl.fleet.prom``): its last snapshot is published as unreachable with ``why``
        (what listeners of snapshots alone see: a stress or acceptance run waiting on it stops
        waiting; ``leaving`` names it meanwhile, so a recording does not write it as a ``down``:
        the node left, its link did not fail), then it is dropped with its history and events,
        ``why`` is logged and told to the ``on_removed`` listeners (the screen drops its rows; a
        recording writes the ``leave``), and its task is ended and its link closed in the
        background (``stop`` waits for them). The same name may be added again (``add_node``):
        a new node. Raises KeyError for a name it does not have."""
        rt = self.nodes[name]
        self.leaving = name
        try:
            self._publish(rt, state=NodeState.UNREACHABLE, reason=why)
        finally:
            self.leaving = None
        del self.nodes[name]
        self._backfilled.discard(name)
        log.info("%s %s", name, why)
        for listener in list(self._removal_listeners):
            listener(name, why)
        task, rt.task = rt.task, None
        try:
            ending = asyncio.get_running_loop().create_task(self._end_removed(rt, task))
        except RuntimeError:  # no loop: the fleet never started, nothing runs for the node
            return
        self._removals.add(ending)
        ending.add_done_callback(self._removals.discard)

    async def _end_removed(self, rt: NodeRuntime, task: asyncio.Task[None] | None) -> None:
        if task is not None:
            await end_tasks([task])
        await self._close_session(rt)
        with contextlib.suppress(Exception):
            await rt.link.aclose()

    # -- life cycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Start one task per node and the stale watchdog; returns at once."""
        self._running = True
        short = fd_room(sum(rt.link.holds_files for rt in self.nodes.values()))
        if short:
            log.warning("%s", short)
        for rt in self.nodes.values():
            if rt.task is None:
                rt.task = asyncio.create_task(self._run_node(rt), name=f"node:{rt.name}")
        if self._watchdog is None:
            self._watchdog = asyncio.create_task(self._watch_stale(), name="fleet-watchdog")

    async def wait_settled(self, timeout: float) -> None:
        """Wait until no node is CONNECTING (or ``timeout`` passes)."""
        deadline = time.monotonic() + timeout
        while any(rt.snapshot.state is NodeState.CONNECTING for rt in self.nodes.values()):
            if time.monotonic() >= deadline:
                return
            changed = asyncio.Event()

            def wake(_s: NodeSnapshot, ev: asyncio.Event = changed) -> None:
                ev.set()

            self._listeners.append(wake)
            try:
                await wait_for(changed.wait(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                return
            finally:
                self._listeners.remove(wake)

    async def stop(self) -> None:
        """Close every agent (which stops its burners) and end all tasks."""
        self._running = False
        if self._watchdog is not None:
            self._watchdog.cancel()
        await end_tasks([rt.task for rt in self.nodes.values() if rt.task is not None])
        if self._removals:
            await asyncio.gather(*self._removals, return_exceptions=True)
        await asyncio.gather(
            *(self._close_session(rt) for rt in self.nodes.values()), return_exceptions=True
        )
        await asyncio.gather(
            *(rt.link.aclose() for rt in self.nodes.values()), return_exceptions=True
        )
        for rt in self.nodes.values():
            rt.task = None

    async def reconnect(self, name: str) -> None:
        """Drop the node's link and connect again now, without waiting out a backoff."""
        rt = self.nodes[name]
        if rt.task is not None:
            rt.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await rt.task
        await self._close_session(rt)
        rt.failures = 0
        rt.task = asyncio.create_task(self._run_node(rt), name=f"node:{rt.name}")

    async def _close_session(self, rt: NodeRuntime) -> None:
        session, rt.session = rt.session, None
        if session is not None:
            with contextlib.suppress(Exception):
                await wait_for(session.close(), 5.0)

    # -- commands -----------------------------------------------------------------------------
    async def request(self, name: str, msg: JsonObject, timeout: float = 10.0) -> JsonObject:
        """Send a request to a node's agent and return its reply as decoded, unchecked (the
        caller reads it into the schema it expects; ``session.refusal`` reads an error).

        Raises LinkError("closed") when the node is not live.
        """
        session = self.nodes[name].session
        if session is None:
            raise LinkError("closed", f"{name} is not connected")
        return await session.request(msg, timeout)

    def annotate(
        self,
        name: str,
        gpu: int,
        *,
        burn: BurnState | Literal[_Keep.KEEP] | None = KEEP,
        slurm_job: str | Literal[_Keep.KEEP] | None = KEEP,
        slurm_user: str | Literal[_Keep.KEEP] | None = KEEP,
    ) -> None:
        """Set a GPU's annotations (burn state, Slurm job) and publish; None removes one, and
        one not given stays as it is. Nothing for a node removed meanwhile (a Slurm watch's
        poll that was under way when the node left the store)."""
        rt = self.nodes.get(name)
        if rt is None:
            return
        ann = dict(rt.snapshot.annotations)
        notes = GpuNotes(**ann.get(gpu, {}))
        if burn is None:
            notes.pop("burn", None)
        elif burn is not KEEP:
            notes["burn"] = burn
        if slurm_job is None:
            notes.pop("slurm_job", None)
        elif slurm_job is not KEEP:
            notes["slurm_job"] = slurm_job
        if slurm_user is None:
            notes.pop("slurm_user", None)
        elif slurm_user is not KEEP:
            notes["slurm_user"] = slurm_user
        ann[gpu] = notes
        self._publish(rt, annotations=ann)

    # -- per-node task ------------------------------------------------------------------------
    async def _run_node(self, rt: NodeRuntime) -> None:
        while True:
            try:
                await self._connect_and_stream(rt)
                reason, message = "closed", "agent link closed"
            except LinkError as e:
                reason, message = e.reason, e.message
                if e.reason == "protocol":
                    rt.link.forget_deploy()  # the next open() deploys the agent afresh
            except (OSError, asyncio.IncompleteReadError, EOFError) as e:
                reason, message = "closed", f"link lost: {e}"
            if rt.dropped is not None:
                reason, message, rt.dropped = "lost", rt.dropped, None
            await self._close_session(rt)
            rt.failures += 1
            delay = min(self.backoff_max, self.backoff_base * 2 ** min(rt.failures - 1, 10))
            delay *= self._rng.uniform(0.5, 1.0)  # jitter: a cluster-wide blip must not sync
            streaming = rt.snapshot.state in (NodeState.LIVE, NodeState.STALE)
            if reason == "lost" and rt.failures == 1 and streaming:
                # The connection to a streaming node broke (not its agent: that is "closed" or
                # "agent_crashed"): its last data stays on screen as stale while it reconnects
                # (at once if it had streamed a while); only a failed reconnect makes it
                # unreachable.
                self._publish(rt, state=NodeState.STALE, reason=f"reconnecting: {message}")
                if time.monotonic() - rt.live_since > 10 * max(rt.interval, 1.0):
                    delay = 0.0
            else:
                self._publish(rt, state=NodeState.UNREACHABLE, reason=f"{reason}: {message}")
            rt.wake.clear()
            rt.retry_at = self.clock() + delay
            try:
                with contextlib.suppress(TimeoutError):
                    await wait_for(rt.wake.wait(), delay)
            finally:
                rt.retry_at = None

    async def _connect_and_stream(self, rt: NodeRuntime) -> None:
        if rt.snapshot.state not in (NodeState.UNREACHABLE, NodeState.STALE):
            self._publish(rt, state=NodeState.CONNECTING, reason=None)
        async with self._sem:
            try:
                session = await wait_for(rt.link.open(), self.connect_timeout)
                rt.session = session
                session.tap = functools.partial(self._on_wire, rt.name)
                info = await session.handshake(self.connect_timeout)
            except TimeoutError:
                raise LinkError("timeout", f"no answer within {self.connect_timeout:g} s") from None
        if info.interval is not None and info.interval > 0:
            rt.interval = info.interval
            if not len(rt.history):  # no GPU kept yet: sized by the node's interval
                rt.history = self._new_history(rt.interval)
        if "configure" in info.features:
            await self._configure(session)  # before any request the listeners may send
        rt.failures = 0
        rt.live_since = time.monotonic()
        self._publish(rt, state=NodeState.LIVE, info=info, reason=None)
        pinger = asyncio.create_task(self._keep_alive(rt, session), name=f"ping:{rt.name}")

        def handle(msg: Message) -> None:
            if isinstance(msg, Sample):
                self._on_sample(rt, msg)
            elif isinstance(msg, NodeEvent):
                if not is_progress(msg):
                    rt.events.append(msg)
                for elistener in self._event_listeners:
                    elistener(rt.name, msg)
            elif msg.get("request") == "configure" and "id" not in msg:
                return  # the answer to our own configure
            else:
                for mlistener in self._message_listeners:
                    mlistener(rt.name, msg)

        try:
            await session.stream(handle)  # a simulated or replayed node's: no task woken a line
        finally:
            pinger.cancel()

    def _throttle(self, rt: NodeRuntime, t: float, g: GpuSample) -> None:
        watch = rt.throttle.get(g.index)
        if watch is None:
            watch = rt.throttle[g.index] = Throttling()
        event = watch.update(t, g.index, None if g.lost else g.throttle)
        if event is not None:
            rt.throttle_events.append(event)
            for listener in self._event_listeners:
                listener(rt.name, event)  # the trouble log keeps its starts and ends

    def _on_sample(self, rt: NodeRuntime, sample: Sample) -> None:
        for g in sample.gpus:
            watch = rt.throttle.get(g.index)
            reasons = g.throttle
            if (
                watch is None
                or (reasons != watch.raw and reasons != watch.alt)
                or sample.t >= watch.due
                or g.state == "lost"  # ``g.lost`` written out: a call per GPU
            ):
                self._throttle(rt, sample.t, g)  # inline above: at 4,096 GPUs a call costs
        rt.history.add(sample.t, sample.gpus)  # one write per history column for the node
        # ``_publish`` written out: ``dataclasses.replace`` reads every field's definition at
        # each call (~4 us), 512 times a second at 512 nodes.
        snap = rt.snapshot
        rt.snapshot = snap = NodeSnapshot(
            name=snap.name,
            state=NodeState.LIVE,
            link=snap.link,
            info=snap.info,
            gpus=sample.gpus,
            last_sample_t=sample.t,
            reason=None,
            annotations=snap.annotations,
            parents=sample.parents,
            host=sample.host,
        )
        for listener in self._listeners:
            listener(snap)

    async def _watch_stale(self) -> None:
        while True:
            await asyncio.sleep(0.5)  # a timer, not synchronisation: staleness is time-based
            now = self.clock()
            for rt in self.nodes.values():
                snap = rt.snapshot
                if snap.state is NodeState.LIVE and snap.last_sample_t is not None:
                    limit = max(self.stale_after, 3 * rt.interval)
                    if now - snap.last_sample_t > limit:
                        self._publish(rt, state=NodeState.STALE)
                elif (
                    snap.state is NodeState.STALE
                    and rt.session is not None
                    and snap.last_sample_t is not None
                    and now - snap.last_sample_t > max(4 * self.stale_after, 10 * rt.interval)
                ):
                    # Silent for long on an open link (a hung node or network): drop the link so
                    # the node's task reconnects instead of waiting for TCP or SSH keepalives.
                    age = now - snap.last_sample_t
                    rt.dropped = f"no sample for {age:.0f} s on an open link; dropped it"
                    session, rt.session = rt.session, None
                    task = asyncio.create_task(session.close())
                    task.add_done_callback(lambda t: t.cancelled() or t.exception())


async def end_tasks(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel ``tasks`` and wait until they are done, cancelling again those still running: on
    Python 3.11 ``asyncio.wait_for`` loses a cancel that comes as its inner await finishes (fixed
    in 3.12), and a node task that lost one would go on (reconnect) and keep ``stop`` waiting
    for ever. Seen with 256 and 512 nodes on a loaded machine, and with the demo's story in
    ``gpuctl export --demo`` (a request's ``wait_for``: the command never exited)."""
    pending = {t for t in tasks if not t.done()}
    while pending:
        for t in pending:
            t.cancel()
        _, pending = await asyncio.wait(pending, timeout=1.0)


def fd_room(nodes: int) -> str | None:
    """Make room for ``nodes`` links in this process's open-file limit: raise the soft limit
    (``ulimit -n``, often 1024) up to the hard one when it is below ``FDS_PER_NODE`` per node
    plus ``FDS_SPARE``, as far as the hard limit allows. Returns None when there is room, else
    one line saying what to set (the nodes beyond the limit would fail with "too many open
    files")."""
    try:
        import resource
    except ImportError:  # not on POSIX: nothing to raise
        return None
    need = FDS_PER_NODE * nodes + FDS_SPARE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return None
    new = need if hard == resource.RLIM_INFINITY else min(need, hard)
    if new > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            soft = new
    if soft >= need:
        return None
    return (
        f"the open-file limit ({soft}) is short for {nodes} nodes (about {need} needed): "
        f"run `ulimit -n {need}` before gpuctl, or raise nofile in /etc/security/limits.conf"
    )


THROTTLE_HOLD_S = 10.0
# A reason that starts again within THROTTLE_FLAP_S of its end is flapping: its next end waits
# twice as long (up to THROTTLE_HOLD_MAX_S), so a power cap that comes and goes every 20 s is
# one episode, not a started/ended pair every 20 s; a start after a quiet THROTTLE_FLAP_S
# waits THROTTLE_HOLD_S again.
THROTTLE_FLAP_S = 60.0
THROTTLE_HOLD_MAX_S = 160.0
NEVER = ("never sent",)  # ``Throttling.alt`` when it stands for no state


class Throttling:
    """One GPU's throttle reasons as events: a reason that starts is a ``throttle`` event
    (``detail``: the reasons that ``started`` and ``ended``); one that stops ends only after
    its hold without it (THROTTLE_HOLD_S, doubled each time it starts again within
    THROTTLE_FLAP_S of its end). The agent reports reasons, not their changes: the detail
    screen said "no events" on a GPU at 88 C with THERM and PWRCAP; and a power cap at full
    load comes and goes every second or two (the demo's GPUs: 40 events a minute, without the
    hold; a pair every ~20 s with a fixed hold of 10 s)."""

    __slots__ = ("active", "alt", "due", "ended_at", "gone", "hold", "raw")

    def __init__(self) -> None:
        self.raw: tuple[str, ...] | None = None  # the last sample's reasons, as sent
        self.active: set[str] = set()  # the reasons that started and have not ended
        self.gone: dict[str, float] = {}  # an active reason missing since (sample time)
        self.due = math.inf  # when the first of ``gone`` ends
        self.hold: dict[str, float] = {}  # a reason's hold, when longer than THROTTLE_HOLD_S
        self.ended_at: dict[str, float] = {}  # when a reason last ended
        # The other of two quiet states an idle GPU alternates between (() and ("gpu_idle",):
        # 30% of the simulator's samples) while nothing is active, else a tuple never sent.
        self.alt: tuple[str, ...] | None = NEVER

    def update(self, t: float, gpu: int, reasons: tuple[str, ...] | None) -> NodeEvent | None:
        """The event of the GPU's reasons now (None: a lost GPU's, or none known)."""
        if (reasons == self.raw or reasons == self.alt) and t < self.due:
            return None  # the common case at 4,096 GPUs (``Fleet._on_sample`` inlines it)
        before, self.raw = self.raw, reasons
        if not self.active and (not reasons or all(r in QUIET_THROTTLE for r in reasons)):
            self.alt = before  # quiet too: with nothing active, every reason was quiet
            return None
        self.alt = NEVER
        now = {r for r in reasons or () if r not in QUIET_THROTTLE}
        started = sorted(now - self.active)
        for r in started:
            last = self.ended_at.get(r)
            if last is not None and t - last < THROTTLE_FLAP_S:  # flapping: hold it longer
                self.hold[r] = min(2 * self.hold.get(r, THROTTLE_HOLD_S), THROTTLE_HOLD_MAX_S)
            else:
                self.hold.pop(r, None)
        self.active |= now
        for r in now:
            self.gone.pop(r, None)
        for r in self.active - now:
            self.gone.setdefault(r, t)
        hold = self.hold
        ended = sorted(
            r for r, since in self.gone.items() if t - since >= hold.get(r, THROTTLE_HOLD_S)
        )
        for r in ended:
            del self.gone[r]
            self.active.discard(r)
            self.ended_at[r] = t
        self.due = min(
            (since + hold.get(r, THROTTLE_HOLD_S) for r, since in self.gone.items()),
            default=math.inf,
        )
        if not started and not ended:
            return None
        return NodeEvent(t, "throttle", gpu, {"started": started, "ended": ended})


def is_progress(event: NodeEvent) -> bool:
    """True for a once-a-second progress update (a burn running, a suite printing a line).

    Listeners get every event, but the kept event list holds only the notable ones: a
    30-minute burn on 8 GPUs would otherwise push an XID out of it within half a minute.
    """
    if event.kind == "burn":
        return event.detail.get("state") == "running"
    if event.kind == "accept":
        return event.detail.get("event") not in ("start", "exit")
    return False


def simulated_fleet(
    nodes: Iterable[tuple[str, str]],
    *,
    interval: float = 1.0,
    read_only: bool = False,
    **kwargs: Any,
) -> Fleet:
    """A fleet of in-process simulated nodes: ``nodes`` is (name, simulate spec) pairs; with
    ``read_only`` their agents refuse stress and acceptance requests."""
    from gpuctl.fleet.links import ThreadSimLink

    links: dict[str, NodeLink] = {
        name: ThreadSimLink(spec, seed=i, interval=interval, read_only=read_only)
        for i, (name, spec) in enumerate(nodes)
    }
    return Fleet(links, **kwargs)
