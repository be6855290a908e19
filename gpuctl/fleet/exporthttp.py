"""``gpuctl export``'s HTTP endpoint: ``MetricsServer`` serves ``FleetExporter``'s text (the
format and encoding the request asks for: ``wants_openmetrics``, ``wants_gzip``), to whom an
``--auth-file`` allows (``Credential``).

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

"""

from __future__ import annotations

import asyncio
import base64
import binascii
import concurrent.futures
import hmac
import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpuctl.config.files import unsafe_secret
from gpuctl.core import deadline
from gpuctl.core.deadline import wait_for
from gpuctl.fleet.exporttext import FleetExporter

log = logging.getLogger(__name__)

TEXT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"


# -- what the request asks for -------------------------------------------------------------------
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
