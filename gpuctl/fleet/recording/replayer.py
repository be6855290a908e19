"""Replaying a recording: ``Replayer`` plays it into a fleet of ``RecordedLink`` nodes."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

from gpuctl.core.deadline import wait_for
from gpuctl.core.wire import JsonObject
from gpuctl.fleet.fleet import Fleet
from gpuctl.fleet.links import STREAM_LIMIT, NodeLink
from gpuctl.fleet.recording.format import Record, read_slurm_jobs
from gpuctl.fleet.recording.reader import RecordingReader, joins
from gpuctl.fleet.session import AgentSession, LineFeed, LinkError
from gpuctl.node import protocol

BACKLOG = 600  # messages kept for a node whose session is opening (a fast replay)


class RecordedLink(NodeLink):
    """A replayed node: its agent's messages come from the recording, as the replay plays."""

    holds_files = False  # no process, no connection: no `ulimit -n` advice for a replay

    def __init__(self, replayer: Replayer, name: str, kind: str) -> None:
        self.replayer = replayer
        self.name = name
        self.kind = kind

    async def open(self) -> AgentSession:
        return await self.replayer.open_session(self.name)

    def describe(self) -> str:
        return f"recorded {self.kind}"


class _Discard:
    """The request side of a replayed node: requests go nowhere."""

    def write(self, data: bytes | str) -> None:
        pass


class Replayer:
    """Plays a recording into a fleet of ``RecordedLink`` nodes on a clock of recorded time.

    ``now()`` is the recorded time shown: it runs ``speed`` times as fast as the wall clock,
    stops at the end and while paused. ``seek(t)`` jumps: every node reconnects with its hello
    and its last sample as of ``t``. Call ``fleet()`` once, then run ``play()`` as a task.

    The nodes are the header's, and those that joined the fleet while it was recorded (a
    ``join`` record, see ``reader.joins``): the fleet gains one when the replay reaches it and
    drops one when it reaches its ``leave`` (``Fleet.remove_node``: a host gone from the
    site's Prometheus). A seek makes the fleet's nodes those of the recording at the new
    position: a node that had not arrived yet, or had left, is not on the screen.
    """

    def __init__(
        self,
        reader: RecordingReader,
        *,
        speed: float = 1.0,
        start: float | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.reader = reader
        self.speed = speed
        self.monotonic = monotonic
        self.paused = False
        self.links = {n: RecordedLink(self, n, kind) for n, kind in reader.nodes}
        # The nodes in the recording at the position: the header's, and those joined by then.
        self.present: set[str] = set(self.links)
        self.left: dict[str, str] = {}  # node -> why, for those that left by the position
        self.hellos: dict[str, JsonObject] = {}
        self.down: dict[str, str] = {}
        self.last_sample: dict[str, JsonObject] = {}
        self.slurm: dict[str, dict[int, tuple[str | None, str | None]]] = {}
        self.readers: dict[str, LineFeed] = {}
        self.samples_played = 0
        self._fleet: Fleet | None = None
        self._reconnecting: set[str] = set()
        self._arrived: dict[str, asyncio.Event] = {}
        # What a node's agent said after its hello while its session was being opened.
        self._backlog: dict[str, list[JsonObject]] = {}
        self._again: set[str] = set()
        self._changed = asyncio.Event()
        self._base_t = reader.start
        self._base_mono = monotonic()
        self._pending: list[Record] = []
        self._records: Iterator[tuple[int, Record]] = iter(())
        self._position(reader.start if start is None else start)

    # -- the clock --------------------------------------------------------------------------
    def now(self) -> float:
        """The recorded time the replay stands at."""
        if self.paused:
            return self._base_t
        t = self._base_t + (self.monotonic() - self._base_mono) * self.speed
        return min(t, self.reader.end)

    @property
    def ended(self) -> bool:
        return self.now() >= self.reader.end and not self._pending

    def set_speed(self, speed: float) -> None:
        self._rebase()
        self.speed = max(0.01, min(speed, 1e6))
        self._changed.set()

    def toggle_pause(self) -> None:
        self._rebase()
        self.paused = not self.paused
        self._changed.set()

    def _rebase(self) -> None:
        self._base_t = self.now()
        self._base_mono = self.monotonic()

    # -- the fleet --------------------------------------------------------------------------
    def fleet(self, **kwargs: Any) -> Fleet:
        """The fleet of replayed nodes, on the replay's clock (no pings: nobody answers)."""
        kwargs.setdefault("backoff_base", 0.5)
        kwargs.setdefault("connect_timeout", 1e9)  # a node not yet seen waits for its hello
        kwargs.setdefault("backoff_max", 2.0)
        here = {n: link for n, link in self.links.items() if n in self.present}
        self._fleet = Fleet(here, clock=self.now, liveness_timeout=0, **kwargs)
        for name in here:
            self._annotate(name)
        return self._fleet

    def _annotate(self, name: str) -> None:
        """Give node ``name``'s GPUs the Slurm jobs the recording has for them now."""
        fleet = self._fleet
        if fleet is None:
            return
        want = self.slurm.get(name, {})
        have = fleet.snapshot(name).annotations
        held = {g for g, notes in have.items() if "slurm_job" in notes or "slurm_user" in notes}
        for gpu in sorted(set(want) | held):
            job, user = want.get(gpu, (None, None))
            fleet.annotate(name, gpu, slurm_job=job, slurm_user=user)

    async def open_session(self, name: str) -> AgentSession:
        """A session for node ``name`` as the recording has it now (a hello, its last sample).

        Raises LinkError with the recorded reason when the node was down then. A node the
        recording has not reached yet stays connecting: its hello (or a seek) reconnects it.
        """
        while (hello := self.hellos.get(name)) is None:
            why = self.down.get(name)
            if why is not None:
                reason, _, message = why.partition(": ")
                raise LinkError(reason, message or reason)
            await self._arrived.setdefault(name, asyncio.Event()).wait()
        reader = LineFeed(limit=STREAM_LIMIT)
        self._feed(reader, hello)
        for msg in self._backlog.pop(name, ()):
            self._feed(reader, msg)
        old = self.readers.get(name)
        if old is not None:
            old.feed_eof()
        self.readers[name] = reader

        async def close() -> None:
            reader.feed_eof()
            if self.readers.get(name) is reader:
                del self.readers[name]

        return AgentSession(reader, _Discard(), close=close)

    @staticmethod
    def _feed(reader: LineFeed, msg: JsonObject) -> None:
        with contextlib.suppress(ValueError, TypeError):  # junk in a file: skip the line
            reader.feed_data(protocol.encode(msg))

    # -- position ---------------------------------------------------------------------------
    def _position(self, t: float) -> None:
        """Stand at time ``t``: the state of every node then, records after it pending."""
        t = max(self.reader.start, min(t, self.reader.end))
        self.present = {n for n, _kind in self.reader.nodes}
        self.left.clear()
        self.hellos.clear()
        self.down.clear()
        self.last_sample.clear()
        self.slurm.clear()
        first = self.reader.frame_index(t)
        self._records = self.reader.records(first)
        self._pending = []
        for i, rec in self._records:
            if rec.get("k"):  # the state at a frame's start: only the first frame's is ours
                if i == first:
                    self._apply_state(rec)
                continue
            if rec["t"] > t:
                self._pending = [rec]
                break
            self._apply_state(rec)
        self._backlog = {n: [m] for n, m in self.last_sample.items()}
        self._base_t = t
        self._base_mono = self.monotonic()

    def _take_in(self, rec: Record) -> bool:
        """Whether ``rec``'s node is in the replay at the record's time. A record that brings
        in a node (``reader.joins``) makes it so, up to ``MAX_NODES`` nodes in all: the fleet
        gains a node the first time. Any other record of a node not in is kept nowhere
        (what a file names is unbounded)."""
        node = rec["n"]
        if node in self.present:
            return True
        if node in self.links:  # joined (or left) before, a seek went back, or it comes back
            if joins(rec) is None:
                return False
            self.left.pop(node, None)
            if self._fleet is not None and node not in self._fleet.nodes:
                self._fleet.add_node(node, self.links[node])
        else:
            kind = self.reader.admit(len(self.links), rec)
            if kind is None:
                return False
            link = self.links[node] = RecordedLink(self, node, kind)
            if self._fleet is not None:
                self._fleet.add_node(node, link)
        self.present.add(node)
        return True

    def _apply_state(self, rec: Record) -> None:
        """Keep what a record says about its node, without feeding any session."""
        node = rec["n"]
        if not self._take_in(rec):
            return
        arrived = self._arrived.pop(node, None)
        if arrived is not None:
            arrived.set()  # a node waiting in open_session: its hello (or its failure) is here
        msg = rec.get("m")
        if isinstance(msg, dict):
            kind = msg.get("type")
            if kind == "hello":
                self.hellos[node] = msg
                self.down.pop(node, None)
                self.last_sample.pop(node, None)
            elif kind == "sample":
                self.last_sample[node] = msg
        elif "slurm" in rec:
            self.slurm[node] = read_slurm_jobs(rec["slurm"])
        elif isinstance(rec.get("join"), str):
            return  # in the replay from now on (``_take_in``): connecting until its hello
        elif isinstance(rec.get("leave"), str):
            self.present.discard(node)
            self.left[node] = rec["leave"]
            for state in (self.hellos, self.down, self.last_sample, self.slurm):
                state.pop(node, None)
        else:
            self.down[node] = str(rec.get("down"))
            self.hellos.pop(node, None)
            self.last_sample.pop(node, None)

    def seek(self, t: float) -> None:
        """Jump to recorded time ``t`` (clamped to the recording): each node reconnects as it
        stood then, with its history dropped."""
        before = dict(self.hellos)
        self._position(t)
        fleet = self._fleet
        if fleet is not None:
            for name, link in self.links.items():  # the nodes of the recording at ``t``
                if name in self.present and name not in fleet.nodes:
                    fleet.add_node(name, link)
                elif name not in self.present and name in fleet.nodes:
                    self._drop(name, self.left.get(name, "not in the recording at this time"))
            for name in [n for n in self.links if n in fleet.nodes]:
                fleet.forget_history(name)
                self._annotate(name)
                reader = self.readers.get(name)
                hello = self.hellos.get(name)
                if reader is not None and hello is not None and hello == before.get(name):
                    # the same agent then as now: its stream goes on from the sample at ``t``
                    sample = self.last_sample.get(name)
                    if sample is not None:
                        self._feed(reader, sample)
                elif reader is not None:
                    self._reconnect(name)  # another agent then (or none): a new session
                else:
                    # Waiting for a hello (woken by ``_position`` when it has one) or backing
                    # off after a failure: cut that short. Never a cancel here: asyncio's
                    # wait_for can lose a cancellation that meets its inner task's end.
                    fleet.nodes[name].wake.set()
        self._changed.set()

    def _drop(self, name: str, why: str) -> None:
        """Take node ``name`` out of the fleet (it left, or a seek went back past its
        arrival): its stream ends, the fleet forgets it (``Fleet.remove_node``)."""
        self._backlog.pop(name, None)
        reader = self.readers.pop(name, None)
        if reader is not None:
            reader.feed_eof()
        if self._fleet is not None and name in self._fleet.nodes:
            self._fleet.remove_node(name, why)

    def _reconnect(self, name: str) -> None:
        """Have the fleet open node ``name`` again, one reconnect at a time (a burst of seeks
        must not leave two tasks streaming one node)."""
        if name in self._reconnecting:
            self._again.add(name)
            return
        self._reconnecting.add(name)
        task = asyncio.get_running_loop().create_task(self._reconnect_loop(name))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _reconnect_loop(self, name: str) -> None:
        try:
            while self._fleet is not None:
                self._again.discard(name)
                await self._fleet.reconnect(name)
                if name not in self._again:
                    return
        finally:
            self._reconnecting.discard(name)

    # -- playing ----------------------------------------------------------------------------
    async def play(self) -> None:
        """Feed the records to the nodes as the clock reaches them; runs until cancelled."""
        played = 0
        while True:
            rec = self._next()
            if rec is None:
                await self._wait(None)  # the end: wait for a seek
                continue
            wait = rec["t"] - self.now()
            if wait > 0:
                self._pending.insert(0, rec)
                # a timer on the replay's clock; a seek, pause or new speed cuts it short
                await self._wait(None if self.paused else wait / self.speed)
                continue
            self._play(rec)
            played += 1
            if played % 256 == 0:
                await asyncio.sleep(0)  # let the fleet read what was fed at a high speed

    def _next(self) -> Record | None:
        if self._pending:
            return self._pending.pop(0)
        for _i, rec in self._records:
            if not rec.get("k"):
                return rec
        return None

    async def _wait(self, timeout: float | None) -> None:
        self._changed.clear()
        with contextlib.suppress(TimeoutError):
            await wait_for(self._changed.wait(), timeout)

    def _play(self, rec: Record) -> None:
        node = rec["n"]
        if not self._take_in(rec):
            return
        msg = rec.get("m")
        was_up = node in self.hellos
        self._apply_state(rec)
        fleet = self._fleet
        if isinstance(msg, dict) and msg.get("type") == "hello":
            self._backlog[node] = []
            streaming = self.readers.pop(node, None) is not None
            if fleet is not None and streaming:  # a new agent on a streaming node: reconnect
                self._reconnect(node)
            elif fleet is not None:  # a node that was down: cut its backoff short
                fleet.nodes[node].wake.set()
            return
        if "slurm" in rec:
            self._annotate(node)
            return
        if not isinstance(msg, dict) and isinstance(rec.get("join"), str):
            return  # joined: the fleet has it (``_take_in``), waiting for its hello
        if isinstance(rec.get("leave"), str):
            self._drop(node, rec["leave"])
            return
        if not isinstance(msg, dict):  # the link failed: end the node's stream
            self._backlog.pop(node, None)
            reader = self.readers.pop(node, None)
            if reader is not None and was_up:
                reader.feed_eof()
            return
        reader = self.readers.get(node)
        if reader is not None:
            self._feed(reader, msg)
        elif node in self.hellos:  # its session is opening: it gets these first
            backlog = self._backlog.setdefault(node, [])
            backlog.append(msg)
            del backlog[:-BACKLOG]
        if msg.get("type") == "sample":
            self.samples_played += 1
