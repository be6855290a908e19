"""One conversation with one running agent, whatever carries it (pipe, SSH channel, srun).

``AgentSession`` reads protocol lines from any byte stream with ``readline()``, checks the hello,
turns messages into ``gpuctl.core`` values and matches replies to requests by ``id``.

What an agent sends is data: samples and events are decoded straight into ``gpuctl.core.model``'s
msgspec Structs (``Sample``, ``NodeEvent``: the schema), the hello into ``NodeInfo``. A valid line
is decoded whole in C (``decode_line``: ~7 us for a sample of 8 GPUs, where json.loads and
reading its dicts field by field took ~90 us; ``benchmarks/decode.py``); a sample or event the
typed decoder refuses for a value (of the wrong type, out of its bounds) is read in one more pass
over its text, field by field where a field is refused (``core.wire.lenient_fields``: ~25 us
for 8 GPUs with one bad field); a line that is no plain JSON (NaN, a 400-digit number, bad
UTF-8) is parsed again by the protocol's guarded parser and read leniently
(``core.wire.lenient``). Either way the bad fields are blanked, the rest kept. A reply to a
request and any other message stay a ``JsonObject`` (decoded, unchecked) until the code that
asked reads it into the schema it expects
(``refusal`` for an ``error`` reply, ``gpuctl.fleet.control`` for stress replies).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypedDict

import msgspec

from gpuctl.core import wire
from gpuctl.core.deadline import wait_for
from gpuctl.core.model import MAX_PARENTS, GpuStatic, NodeEvent, NodeInfo, Sample
from gpuctl.core.wire import JsonObject
from gpuctl.node import protocol

__all__ = ["MAX_PARENTS", "Sample"]  # where the fleet and the tests have always found them


class LinkError(Exception):
    """A node could not be reached or its agent misbehaved; ``reason`` is a short token.

    Reasons: refused, timeout, dns, auth, host_key, no_python, agent_crashed, protocol, closed;
    network (other socket errors), config (bad SSH settings), deploy (bundle upload failed),
    lost (the connection of a streaming node broke: the fleet shows it stale while it
    reconnects), and for Slurm: no_job, down, slurm (a client failed).
    The message is one line for a person and says what to do where it can.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class LineTooLong(LinkError, ValueError):
    """A line longer than a ``LineFeed``'s limit: the stream ends, as asyncio's reader ends it
    (a ValueError), and the fleet reads it as a link that misbehaved (``protocol``), not as an
    error that ends the node's task."""

    def __init__(self, limit: int) -> None:
        super().__init__("protocol", f"agent sent a bad line: a line over {limit} bytes")


class LineReader(Protocol):
    async def readline(self) -> bytes | str: ...


class LineWriter(Protocol):
    # bytes, or str for a channel opened with an encoding (``AgentSession(text=True)``)
    def write(self, data: Any) -> Any: ...


class AgentError(TypedDict, total=False):
    """An ``error`` message: ``code`` (a short token) and ``message`` (one line for a person)."""

    type: str
    code: str
    message: str


def refusal(reply: JsonObject) -> AgentError | None:
    """The agent's ``error`` when ``reply`` is one (its fields checked), else None."""
    if reply.get("type") != "error":
        return None
    return wire.parse(AgentError, reply) or {}


# The protocol versions this gpuctl reads: 2 (``protocol.PROTOCOL_VERSION``, what its agent
# speaks) and 1 (an agent bundle an older gpuctl deployed, a recording made by one), whose
# samples carry every field in every sample.
READS = (1, 2)

# A node's GPUs' static facts by index, where its samples leave out what the hello holds
# (``protocol.FROM_HELLO``, protocol 2): ``statics`` makes it from the hello, ``decode_line``
# and ``decode_sample`` fill the samples' GPUs from it. None: nothing to fill (protocol 1).
Statics = dict[int, GpuStatic]


def statics(info: NodeInfo) -> Statics | None:
    """What the samples of the agent that said ``info`` leave to its hello, by GPU index; None
    for a protocol 1 agent (its samples leave nothing out)."""
    if info.protocol == 1:
        return None
    return {st.index: st for st in info.gpus}


# What ``AgentSession.messages()`` yields: a sample, an event, or any other message as decoded.
Message = Sample | NodeEvent | JsonObject

# The typed decoder of the messages that come by the thousand: a sample or an event, told apart
# by their ``type`` (msgspec's tagged union); any other type is refused and read as a dict.
_DECODER: msgspec.json.Decoder[Sample | NodeEvent] = msgspec.json.Decoder(Sample | NodeEvent)


def decode_line(line: bytes | str, hello: Statics | None = None) -> Message:
    """One line from an agent as a Sample, a NodeEvent or (any other message) a decoded dict;
    a sample's GPUs take what it left to the hello from ``hello`` (``statics``).

    The fast path decodes a valid sample or event whole; one it refuses for a value is read
    again from its text, field by field where a field is refused (``_reread``), and any other
    line it refuses is parsed again (``_parse``) and read field by field (``decode_message``),
    so one broken field never hides the rest. Raises ProtocolError (bad_json, bad_message,
    line_too_long) for a line that is no message at all.
    """
    if len(line) > protocol.MAX_LINE:
        return decode_message(protocol.decode(line, lenient=True), hello)  # line_too_long
    try:
        msg: Sample | NodeEvent = _DECODER.decode(line)
    except msgspec.ValidationError as e:  # JSON, with a value of the wrong type (or no sample)
        try:
            again = _reread(line, e)
        except (msgspec.MsgspecError, RecursionError, UnicodeDecodeError):
            again = None
        if again is None:
            return decode_message(_parse(line), hello)
        msg = again
    except (msgspec.MsgspecError, RecursionError, UnicodeDecodeError):
        # RecursionError: nested too deeply; UnicodeDecodeError: bad UTF-8 (msgspec raises it
        # as it is, not as a DecodeError: it escaped the session and ended the node's task)
        return decode_message(_parse(line), hello)
    if type(msg) is Sample:
        _stamp(msg, hello)
    return msg


def _reread(line: bytes | str, refused: msgspec.ValidationError) -> Sample | NodeEvent | None:
    """A sample or event line the typed decoder ``refused`` for a value, read in one pass that
    keeps the good fields (``wire.lenient_fields``: each field's text decoded into its type, a
    refused one field by field, starting where ``refused`` says): ~25 us for a sample of 8 GPUs
    with one bad field, where parsing the line again and reading its dicts took 125
    (``benchmarks/decode.py``). None for any other line; raises msgspec's errors where the line
    needs ``_parse`` (not JSON, a number out of range, bad UTF-8)."""
    where = wire.refused_at(refused)
    fields = wire.json_fields(line)
    kind = fields.get("type")
    if kind is None:
        return None
    kind_text = bytes(kind)
    if kind_text == b'"sample"':
        return wire.lenient_fields(Sample, fields, where) or Sample()
    if kind_text == b'"event"':
        return wire.lenient_fields(NodeEvent, fields, where) or NodeEvent()
    return None  # another message (or its type written with escapes): _parse reads it


def _parse(line: bytes | str) -> JsonObject:
    """A line the typed decoder refused, as a message dict: by msgspec's untyped decoder
    (17 us for an 8-GPU sample, where the guarded json.loads takes 68), or where it refuses
    too (NaN, Infinity, 1e999, an integer of thousands of digits, bad UTF-8, deep nesting, no
    object with a ``type``) by ``protocol.decode``, lenient: a broken number becomes None; what
    is no message at all raises its ProtocolError. An integer too wide for its field is blanked
    by the schema."""
    try:
        msg = msgspec.json.decode(line)
    except (msgspec.MsgspecError, RecursionError, UnicodeDecodeError):
        msg = None
    if isinstance(msg, dict) and isinstance(msg.get("type"), str) and msg["type"]:
        return msg
    return protocol.decode(line, lenient=True)


def decode_message(msg: JsonObject, hello: Statics | None = None) -> Message:
    """A decoded message (a dict) as ``decode_line`` returns it: samples and events read
    leniently into their Structs, anything else as it is. Never raises."""
    kind = msg.get("type")
    if kind == "sample":
        return decode_sample(msg, hello)
    if kind == "event":
        return wire.lenient(NodeEvent, msg) or NodeEvent()
    return msg


def decode_sample(msg: JsonObject, hello: Statics | None = None) -> Sample:
    """A ``sample`` message (decoded, e.g. from a recording) as a Sample, its GPUs filled from
    ``hello`` (``statics``); a bad field is blanked, never an exception."""
    sample = wire.lenient(Sample, msg) or Sample()
    _stamp(sample, hello)
    return sample


def _stamp(sample: Sample, hello: Statics | None) -> None:
    """Give each GPU reading the sample's time (the wire carries it once per sample) and, from
    ``hello``, what the sample left to the hello (``protocol.FROM_HELLO``: a uuid, and an "ok"
    GPU's mem_total and power_limit, that are absent or null; a lost GPU's readings stay
    null). The GpuSamples were made a moment ago and nobody else holds them: setting a field
    of these frozen values is how they are built, not a change anyone sees."""
    t = sample.t
    put = msgspec.structs.force_setattr
    for g in sample.gpus:
        put(g, "t", t)
        if hello is None:
            continue
        st = hello.get(g.index)
        if st is None:
            continue
        if g.uuid is None:
            put(g, "uuid", st.uuid)
        if g.state == "ok":
            if g.mem_total is None:
                put(g, "mem_total", st.mem_total)
            if g.power_limit is None:
                put(g, "power_limit", st.power_limit)


class LineFeed:
    """An agent's lines as its transport delivers them (``feed_data``, ``feed_eof``,
    ``set_exception``: what ``asyncio.StreamReader`` takes, and ``LineFeedProtocol`` calls for a
    pipe), read with ``readline()`` (the hello) until ``push_to`` names a sink: from then on each
    complete line goes to the sink inside the transport's own callback (the one the event loop
    runs when the pipe is readable), the lines already in first, so that a node's line wakes no
    task. ``AgentSession.stream`` pushes where its reader is one.

    A task per node awaiting ``StreamReader.readline()`` cost the loop ~20-40 us a line more
    than lines handed on from the transport's callback (``benchmarks/line_readers.py``: 512
    nodes, one line a second each). Every link reads through one: a pipe of this process or
    lines gpuctl feeds itself (a simulated, replayed or recorded node), an SSH channel
    (``reach.launch.start_fed``) and srun's pipes (``fleet.slurm.start_srun``).

    What it holds is bounded: a line begun by ``limit`` (longer ends the stream, as asyncio's
    reader has it) and, before ``push_to``, the lines not yet read: past twice ``limit`` the
    ``transport`` (anything with ``pause_reading``/``resume_reading``: a pipe's transport, an SSH
    channel) is paused until ``readline`` has taken them down to ``limit``, as asyncio's reader
    does. Once pushed nothing is held: each line is handled inside the callback that read it."""

    __slots__ = (
        "_end",
        "_eof",
        "_error",
        "_held",
        "_limit",
        "_lines",
        "_paused",
        "_rest",
        "_sink",
        "_waiter",
        "transport",
    )

    def __init__(self, limit: int = 2**16) -> None:
        self._limit = limit  # a line longer than this ends the stream, as asyncio's reader has it
        # read, not yet taken (the hello, and what came with it): a list, not a deque (a deque
        # keeps a block of 64 slots however short, for every node)
        self._lines: list[bytes] = []
        self._held = 0  # their bytes
        self._paused = False
        self.transport: Any = None  # paused while too much is held unread (``pause_reading``)
        self._rest = b""  # a line begun, its newline not yet come
        self._eof = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._sink: Callable[[bytes], None] | None = None
        self._end: Callable[[BaseException | None], None] | None = None

    async def readline(self) -> bytes:
        """The next line, newline included; at the end what is left (b"" when nothing is)."""
        await self._ready()
        if not self._lines:
            if self._error is not None:
                raise self._error
            rest, self._rest = self._rest, b""
            return rest
        line = self._lines.pop(0)
        self._held -= len(line)
        if self._paused and self._held <= self._limit:
            self._resume()
        return line

    async def peek(self) -> bytes:
        """The line ``readline`` returns next, left for it (raises what it would raise)."""
        await self._ready()
        if not self._lines and self._error is not None:
            raise self._error
        return self._lines[0] if self._lines else self._rest

    async def _ready(self) -> None:
        """Wait for a line, the end or an error."""
        while not self._lines and self._error is None and not self._eof:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def push_to(
        self, sink: Callable[[bytes], None], end: Callable[[BaseException | None], None]
    ) -> None:
        """Hand every line from now on to ``sink``, those not read yet first; ``end(None)`` at
        the end of the stream (after its last line, newline or not, as ``readline`` reads it),
        ``end(error)`` where ``readline`` would raise it."""
        self._sink, self._end = sink, end
        lines, self._lines = self._lines, []
        self._held = 0
        if self._paused:
            self._resume()
        for line in lines:
            sink(line)
        if self._error is not None:
            end(self._error)
        elif self._eof:
            self._finish()

    def feed_data(self, data: bytes) -> None:
        if not data or self._eof or self._error is not None:
            return  # after the end nothing more is held
        buf = self._rest + data if self._rest else data
        sink = self._sink
        start = 0
        while (i := buf.find(b"\n", start)) >= 0:
            if sink is None:
                self._lines.append(buf[start : i + 1])
                self._held += i + 1 - start
            else:
                sink(buf[start : i + 1])
            start = i + 1
        self._rest = buf[start:] if start else buf
        if len(self._rest) > self._limit:
            self._rest = b""
            self.set_exception(LineTooLong(self._limit))
        elif (
            sink is None
            and self._held > 2 * self._limit
            and self.transport is not None
            and not self._paused
        ):
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def feed_eof(self) -> None:
        if self._eof or self._error is not None:
            return
        self._eof = True
        if self._sink is not None:
            self._finish()
        self._wake()

    def set_exception(self, exc: BaseException) -> None:
        self._error = exc
        if self._end is not None:
            self._end(exc)
        self._wake()

    def _finish(self) -> None:
        rest, self._rest = self._rest, b""
        if rest and self._sink is not None:
            self._sink(rest)
        if self._end is not None:
            self._end(None)

    def _resume(self) -> None:
        self._paused = False
        with contextlib.suppress(Exception):  # closed meanwhile
            self.transport.resume_reading()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


STDERR_KEPT = 20  # an agent's last stderr lines kept for the reason its link ended


def keep_stderr(tail: list[str], line: bytes) -> None:
    """A line of an agent's stderr into ``tail`` (``AgentSession.stderr_tail``): its last
    ``STDERR_KEPT``, each cut at ``protocol.MAX_LINE``; ``LineFeed.push_to``'s sink."""
    tail.append(line.decode(errors="replace").rstrip()[: protocol.MAX_LINE])
    del tail[:-STDERR_KEPT]


def stderr_ended(_error: BaseException | None) -> None:
    """A stderr's end (``LineFeed.push_to``'s ``end``): how the link ended is its stdout's."""


class LineFeedProtocol(asyncio.Protocol):
    """A pipe read into a ``LineFeed`` (``loop.connect_read_pipe``)."""

    def __init__(self, feed: LineFeed) -> None:
        self.feed = feed

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.feed.transport = transport

    def data_received(self, data: bytes) -> None:
        self.feed.feed_data(data)

    def eof_received(self) -> bool | None:
        self.feed.feed_eof()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is None:
            self.feed.feed_eof()
        else:
            self.feed.set_exception(exc)


def settle(end: asyncio.Future[None], error: BaseException | None) -> None:
    """A feed's end (``LineFeed.push_to``'s ``end``) onto a future: how it ended, once."""
    if end.done():
        return
    if error is None:
        end.set_result(None)
    else:
        end.set_exception(error)


class _PipedProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """A child's stdout and stderr read into ``LineFeed``s (lines handed on from the pipes'
    callbacks, no task woken a line) instead of asyncio's readers; its stdin, exit and ``wait``
    are asyncio's. A feed holding too many unread lines pauses its pipe."""

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int) -> None:
        super().__init__(limit=limit, loop=loop)
        self.out = LineFeed(limit=limit)
        self.err = LineFeed(limit=limit)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.stdout = self.stderr = None  # read by the feeds
        assert isinstance(transport, asyncio.SubprocessTransport)
        self.out.transport = transport.get_pipe_transport(1)
        self.err.transport = transport.get_pipe_transport(2)

    def pipe_data_received(self, fd: int, data: bytes | str) -> None:
        assert isinstance(data, bytes)
        if fd == 1:
            self.out.feed_data(data)
        elif fd == 2:
            self.err.feed_data(data)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        feed = self.out if fd == 1 else self.err if fd == 2 else None
        if feed is not None:
            if exc is None:
                feed.feed_eof()
            else:
                feed.set_exception(exc)
        super().pipe_connection_lost(fd, exc)


@dataclass(frozen=True, slots=True)
class Piped:
    """A running child (an agent, srun): the process (stdin, ``wait``, signals) and its stdout
    and stderr as ``LineFeed``s."""

    proc: asyncio.subprocess.Process
    out: LineFeed
    err: LineFeed


async def start_piped(
    argv: list[str], env: Mapping[str, str], *, limit: int, start_new_session: bool = False
) -> Piped:
    """Start ``argv`` with pipes on all three streams, its output read into feeds of ``limit``
    (the local agent, srun). Raises FileNotFoundError when the program is not there."""
    loop = asyncio.get_running_loop()
    transport, pipes = await loop.subprocess_exec(
        lambda: _PipedProtocol(loop, limit),
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=dict(env),
        start_new_session=start_new_session,
    )
    return Piped(asyncio.subprocess.Process(transport, pipes, loop), pipes.out, pipes.err)


class AgentSession:
    """Protocol v2 (or v1: ``READS``) over a pair of streams. Call ``handshake()`` first, then
    ``messages()`` or ``stream()``."""

    def __init__(
        self,
        reader: LineReader,
        writer: LineWriter,
        *,
        close: Callable[[], Awaitable[None]] | None = None,
        text: bool = False,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._close = close
        self._text = text  # asyncssh channels opened with an encoding speak str, not bytes
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[JsonObject]] = {}
        self.info: NodeInfo | None = None  # the hello, read (``handshake``)
        self._statics: Statics | None = None  # what the samples leave to the hello
        self.hello_msg: JsonObject | None = None  # the hello as the agent sent it (decoded)
        self.stderr_tail: list[str] = []
        # Called with every line read, hello included, before it is decoded (recording: the
        # fleet decodes it into a dict only while someone listens, ``Fleet.on_wire``).
        self.tap: Callable[[bytes | str], None] | None = None

    async def _read_line(self) -> bytes | str | None:
        line = await self._reader.readline()
        if not line:
            return None
        if self.tap is not None:
            self.tap(line)
        return line

    async def _read_msg(self) -> JsonObject | None:
        """The next line as a dict (the hello, read once)."""
        line = await self._read_line()
        if line is None:
            return None
        try:
            return protocol.decode(line, lenient=True)  # a broken field is None, not a stop
        except protocol.ProtocolError as e:
            raise LinkError("protocol", f"agent sent a bad line: {e.message}") from None

    async def handshake(self, timeout: float = 20.0) -> NodeInfo:
        """Wait for the hello; raises LinkError (timeout, agent_crashed, protocol)."""
        try:
            msg = await wait_for(self._read_msg(), timeout)
        except TimeoutError:
            raise LinkError("timeout", f"agent sent no hello within {timeout:g} s") from None
        if msg is None:
            tail = " | ".join(self.stderr_tail[-3:])
            raise LinkError(
                "agent_crashed", "agent exited before its hello" + (f": {tail}" if tail else "")
            )
        if msg.get("type") != "hello":
            raise LinkError("protocol", f"expected hello, got {str(msg.get('type'))[:40]!r}")
        version = msg.get("protocol")
        if type(version) is not int or version not in READS:
            raise LinkError(
                "protocol",
                f"agent speaks protocol {str(version)[:40]}, "
                f"gpuctl reads {' and '.join(map(str, READS))}",
            )
        self.hello_msg = msg
        self.info = wire.lenient(NodeInfo, msg) or NodeInfo()
        self._statics = statics(self.info)
        return self.info

    async def send(self, msg: JsonObject) -> None:
        """Write one request line."""
        data = protocol.encode(msg)
        self._writer.write(data.decode() if self._text else data)
        drain = getattr(self._writer, "drain", None)
        if drain is not None:
            await drain()

    async def request(self, msg: JsonObject, timeout: float = 10.0) -> JsonObject:
        """Send a request and return its reply as decoded, unchecked (an ``error`` reply is
        returned, not raised: ``refusal`` reads it).

        Needs ``messages()`` to be running in another task. Raises LinkError on timeout.
        """
        req_id = next(self._ids)
        waiter: asyncio.Future[JsonObject] = asyncio.get_running_loop().create_future()
        self._waiting[req_id] = waiter
        try:
            await self.send({**msg, "id": req_id})
            return await wait_for(waiter, timeout)
        except TimeoutError:
            raise LinkError("timeout", f"no reply to {msg.get('type')} in {timeout:g} s") from None
        finally:
            self._waiting.pop(req_id, None)

    async def messages(self) -> AsyncIterator[Message]:
        """Yield Sample, NodeEvent or other message dicts until the stream ends.

        Replies to ``request()`` are routed to their waiters (a snapshot reply is also yielded).
        """
        while True:
            line = await self._read_line()
            if line is None:
                self._closed()
                return
            msg = self._take(line)
            if msg is not None:
                yield msg

    async def stream(self, handle: Callable[[Message], None]) -> None:
        """Call ``handle`` with each message ``messages()`` would yield, until the stream ends;
        raises what ``messages()`` or ``handle`` raised. On a ``LineFeed`` the lines come from
        the transport's callback (no task woken per line), else from ``messages()``."""
        reader = self._reader
        if not isinstance(reader, LineFeed):
            async for msg in self.messages():
                handle(msg)
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        end = functools.partial(settle, done)

        def sink(line: bytes) -> None:
            if done.done():
                return  # the stream ended with an error: the rest is not read, as by messages()
            try:
                if self.tap is not None:
                    self.tap(line)
                msg = self._take(line)
                if msg is not None:
                    handle(msg)
            except Exception as e:  # ends the stream: ``stream`` raises it
                end(e)

        reader.push_to(sink, end)
        try:
            await done
        finally:
            done.cancel()  # cancelled (the node stopped): the lines after it are not read
        self._closed()

    def _take(self, line: bytes | str) -> Message | None:
        """A line as ``messages()`` yields it, or None: a reply, handed to its ``request()``."""
        try:
            msg = decode_line(line, self._statics)
        except protocol.ProtocolError as e:
            raise LinkError("protocol", f"agent sent a bad line: {e.message}") from None
        if isinstance(msg, Sample | NodeEvent):
            return msg  # never a reply: gpuctl asks for no ``snapshot``
        req_id = msg.get("id")
        fut: asyncio.Future[JsonObject] | None = (
            self._waiting.get(req_id) if isinstance(req_id, int) else None
        )
        if fut is not None and not fut.done():
            fut.set_result(msg)
        elif fut is None:
            return msg
        return None

    def _closed(self) -> None:
        for pending in self._waiting.values():
            if not pending.done():
                pending.set_exception(LinkError("closed", "agent link closed"))

    async def close(self) -> None:
        """Ask the agent to stop, then close the transport."""
        with contextlib.suppress(OSError, TimeoutError, ConnectionError, RuntimeError):
            await wait_for(self.send({"type": "shutdown"}), 2.0)
        if self._close is not None:
            await self._close()


def dumps(obj: object) -> str:
    """Compact JSON, as the CLI prints it."""
    return json.dumps(obj, separators=(",", ":"))
