"""One conversation with one running agent, whatever carries it (pipe, SSH channel, srun).

``AgentSession`` reads protocol lines from any byte stream with ``readline()``, checks the hello,
turns messages into ``gpuctl.core`` values and matches replies to requests by ``id``.

What an agent sends is data: samples and events become ``gpuctl.core`` values (``Sample``,
``NodeEvent``), the hello a checked ``Hello`` (``gpuctl.core.wire.parse``). A reply to a request
and any other message stay a ``JsonObject`` (decoded, unchecked) until the code that asked reads
it into the schema it expects (``refusal`` for an ``error`` reply, ``gpuctl.fleet.control`` for
stress replies).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypedDict

from gpuctl.core import wire
from gpuctl.core.model import GpuProcess, GpuSample, HostSample, NodeEvent, NodeInfo
from gpuctl.core.wire import JsonObject
from gpuctl.node import protocol

MAX_PARENTS = 256  # a sample's ``parents`` kept (an agent sends at most 64)


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


class LineReader(Protocol):
    async def readline(self) -> bytes | str: ...


class LineWriter(Protocol):
    # bytes, or str for a channel opened with an encoding (``AgentSession(text=True)``)
    def write(self, data: Any) -> Any: ...


@dataclass(frozen=True, slots=True)
class Sample:
    """A decoded ``sample`` message."""

    t: float
    seq: int
    gpus: tuple[GpuSample, ...]
    parents: tuple[GpuProcess, ...] = ()  # ancestors of the GPU processes (launchers)
    host: HostSample | None = None  # the node's CPU, memory, load and network


class Hello(TypedDict, total=False):
    """An agent's ``hello``, checked (``gpuctl/node/protocol.py`` has the schema): its protocol
    and agent versions, host, pid, Python, sampling ``interval`` (s), reader, the request types
    it understands (``features``), ``read_only``, ``liveness_timeout`` and ``max_duration`` (s).
    The GPUs' static facts are read into ``NodeInfo`` (``AgentSession.info``)."""

    type: str
    protocol: int
    agent: str
    hostname: str
    pid: int
    python: str
    interval: float
    reader: str | None
    reader_error: str | None
    driver: str | None
    cuda: str | None
    nvml: str | None
    features: list[str]
    read_only: bool
    liveness_timeout: float
    max_duration: float


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


# What ``AgentSession.messages()`` yields: a sample, an event, or any other message as decoded.
Message = Sample | NodeEvent | JsonObject


class AgentSession:
    """Protocol v1 over a pair of streams. Call ``handshake()`` first, then ``messages()``."""

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
        self.info: NodeInfo | None = None
        self.hello: Hello = {}
        self.hello_msg: JsonObject | None = None  # the hello as the agent sent it (decoded)
        self.stderr_tail: list[str] = []
        # Called with every message read, hello included, before it is interpreted (recording).
        self.tap: Callable[[JsonObject], None] | None = None

    async def _read_msg(self) -> JsonObject | None:
        line = await self._reader.readline()
        if not line:
            return None
        try:
            msg = protocol.decode(line, lenient=True)  # a broken field is None, not a stop
        except protocol.ProtocolError as e:
            raise LinkError("protocol", f"agent sent a bad line: {e.message}") from None
        if self.tap is not None:
            self.tap(msg)
        return msg

    async def handshake(self, timeout: float = 20.0) -> NodeInfo:
        """Wait for the hello; raises LinkError (timeout, agent_crashed, protocol)."""
        try:
            msg = await asyncio.wait_for(self._read_msg(), timeout)
        except TimeoutError:
            raise LinkError("timeout", f"agent sent no hello within {timeout:g} s") from None
        if msg is None:
            tail = " | ".join(self.stderr_tail[-3:])
            raise LinkError(
                "agent_crashed", "agent exited before its hello" + (f": {tail}" if tail else "")
            )
        if msg.get("type") != "hello":
            raise LinkError("protocol", f"expected hello, got {str(msg.get('type'))[:40]!r}")
        if msg.get("protocol") != protocol.PROTOCOL_VERSION:
            raise LinkError(
                "protocol",
                f"agent speaks protocol {msg.get('protocol')!r}, "
                f"gpuctl speaks {protocol.PROTOCOL_VERSION}",
            )
        self.hello = wire.parse(Hello, msg) or {}
        self.hello_msg = msg
        self.info = NodeInfo.from_hello(msg)
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
            return await asyncio.wait_for(waiter, timeout)
        except TimeoutError:
            raise LinkError("timeout", f"no reply to {msg.get('type')} in {timeout:g} s") from None
        finally:
            self._waiting.pop(req_id, None)

    async def messages(self) -> AsyncIterator[Message]:
        """Yield Sample, NodeEvent or other message dicts until the stream ends.

        Replies to ``request()`` are routed to their waiters (a snapshot reply is also yielded).
        """
        while True:
            msg = await self._read_msg()
            if msg is None:
                for pending in self._waiting.values():
                    if not pending.done():
                        pending.set_exception(LinkError("closed", "agent link closed"))
                return
            req_id = msg.get("id")
            fut: asyncio.Future[JsonObject] | None = (
                self._waiting.get(req_id) if isinstance(req_id, int) else None
            )
            if fut is not None and not fut.done():
                fut.set_result(msg)
            kind = msg.get("type")
            if kind == "sample":
                yield decode_sample(msg)
            elif kind == "event":
                t = msg.get("t")
                gpu = msg.get("gpu")
                detail = msg.get("detail")
                yield NodeEvent(
                    t=float(t) if isinstance(t, int | float) else 0.0,
                    kind=str(msg.get("kind")),
                    gpu=gpu if isinstance(gpu, int) else None,
                    detail=detail if isinstance(detail, dict) else {},
                )
            elif fut is None:
                yield msg

    async def close(self) -> None:
        """Ask the agent to stop, then close the transport."""
        with contextlib.suppress(OSError, TimeoutError, ConnectionError, RuntimeError):
            await asyncio.wait_for(self.send({"type": "shutdown"}), 2.0)
        if self._close is not None:
            await self._close()


def decode_sample(msg: JsonObject) -> Sample:
    """Turn a ``sample`` message into a Sample; never raises on bad fields."""
    t = msg.get("t")
    t = float(t) if isinstance(t, int | float) else 0.0
    seq = msg.get("seq")
    gpus = msg.get("gpus")
    parents = msg.get("parents")
    return Sample(
        t=t,
        seq=seq if isinstance(seq, int) else -1,
        gpus=tuple(GpuSample.from_wire(g, t, i) for i, g in enumerate(gpus))
        if isinstance(gpus, list)
        else (),
        parents=tuple(GpuProcess.from_wire(p) for p in parents[:MAX_PARENTS])
        if isinstance(parents, list)
        else (),
        host=HostSample.from_wire(msg.get("host")),
    )


def dumps(obj: object) -> str:
    """Compact JSON, as the CLI prints it."""
    return json.dumps(obj, separators=(",", ":"))
