"""Running a command on a node the same way whatever its login shell is.

sshd hands a command to the user's login shell (``$SHELL -c COMMAND``), which may be bash with a
chatty ``.bashrc``, tcsh (no newline inside single quotes, ``!`` history), zsh or fish. So the
text sshd gets is one safe line: ``exec /bin/sh -c '<decoder>' gpuctl <base64 chunks>``; only
base64 characters travel as arguments (chunks of a multiple of 4 characters: none starts with
``=``, which zsh would expand), and ``/bin/sh`` decodes and evals the script. The script first
prints a start marker with a per-launch nonce (``gpuctl-start:<nonce>``) on stdout and on
stderr; whatever came before it on a stream is the login shell's banner: kept (for ``gpuctl
doctor``), never parsed. ``run()`` returns the output after the marker; ``start()`` gives a
process whose streams begin after it; ``start_fed()`` hands what comes after it to feeds from
the channel's own callback (an agent's lines: no task woken a line).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import asyncssh

from gpuctl.core.deadline import wait_for
from gpuctl.reach.errors import RemoteError

MARKER_PREFIX = "gpuctl-start:"
CHUNK = 1000  # base64 characters per argument: a multiple of 4
MAX_SCRIPT = 64 * 1024  # sshd passes the command as one argument (128 KiB at most on Linux)
MAX_BANNER = 256 * 1024  # bytes before the marker kept; beyond that the shell is broken
DECODER = 'S=$(printf %s "$@" | base64 -d) || exit 127; eval "$S"'


@dataclass(frozen=True, slots=True)
class Launch:
    """One launch: the command line for sshd and the marker line its script prints first."""

    command: str
    marker: bytes  # b"gpuctl-start:<nonce>\n"


def launch(script: str) -> Launch:
    """Wrap the ``sh`` text ``script`` for any login shell (see the module doc).

    Raises RemoteError("config") for a script too long to travel as a command."""
    nonce = secrets.token_hex(8)
    marker = f"{MARKER_PREFIX}{nonce}"
    body = f"printf '%s\\n' {marker}; printf '%s\\n' {marker} >&2; set --\n{script}\n"
    if len(body) > MAX_SCRIPT:
        raise RemoteError(
            "config", f"a remote script of {len(body)} bytes is over {MAX_SCRIPT}: send a file"
        )
    data = base64.b64encode(body.encode()).decode()
    chunks = [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)]
    command = f"exec /bin/sh -c '{DECODER}' gpuctl {' '.join(chunks)}"
    return Launch(command, (marker + "\n").encode())


def split_banner(data: bytes, marker: bytes) -> tuple[bytes, bytes] | None:
    """``(banner, rest)`` of one stream's output, or None when the marker is not in it."""
    i = data.find(marker)
    if i < 0:
        return None
    return data[:i], data[i + len(marker) :]


@dataclass(frozen=True, slots=True)
class RunResult:
    """A finished remote command: exit status (255 when none came), output after the
    marker, and the login shell's banner from each stream."""

    status: int
    stdout: bytes
    stderr: bytes
    banner: bytes = b""
    stderr_banner: bytes = b""


def no_start_error(node: str, status: Any, stdout: bytes, stderr: bytes) -> RemoteError:
    """The one line for a launch whose ``/bin/sh`` never printed its marker."""
    tail = [ln for ln in stderr.decode(errors="replace").splitlines() if ln.strip()]
    if not tail:
        tail = [ln for ln in stdout.decode(errors="replace").splitlines() if ln.strip()]
    said = f": {tail[-1][:200]}" if tail else ""
    return RemoteError(
        "shell",
        f"{node}: the login shell did not run gpuctl's /bin/sh launcher (exit status "
        f"{status}){said}; check that /bin/sh and base64 exist there and that the shell's "
        "startup files do not exit",
    )


async def run(
    conn: asyncssh.SSHClientConnection,
    script: str,
    *,
    node: str,
    stdin: bytes | None = None,
    timeout: float | None = 120,
) -> RunResult:
    """Run the ``sh`` text ``script`` on the node to the end. Raises RemoteError: "shell" when
    the launcher did not start, "timeout", or "lost" when the connection broke."""
    wrapped = launch(script)
    try:
        r = await conn.run(
            wrapped.command, input=stdin, encoding=None, check=False, timeout=timeout
        )
    except asyncssh.TimeoutError:
        raise RemoteError("timeout", f"{node}: a command took more than {timeout:g} s") from None
    except asyncssh.ChannelOpenError as e:
        raise RemoteError("refused", f"{node} refused a session: {e.reason}") from None
    except (asyncssh.Error, OSError) as e:
        raise RemoteError("lost", f"SSH connection to {node} lost: {e}") from None
    out = r.stdout if isinstance(r.stdout, bytes) else b""
    err = r.stderr if isinstance(r.stderr, bytes) else b""
    status = r.exit_status if r.exit_status is not None else 255
    split_out = split_banner(out, wrapped.marker)
    if split_out is None:
        raise no_start_error(node, r.exit_signal[0] if r.exit_signal else status, out, err)
    split_err = split_banner(err, wrapped.marker) or (b"", err)
    return RunResult(int(status), split_out[1], split_err[1], split_out[0], split_err[0])


class MarkedReader:
    """One stream of a launched process, from just after the start marker.

    ``started()`` reads up to the marker (what came before is ``banner``); ``readline()`` and
    ``read()`` then return the process's own output. Works on an asyncssh ``SSHReader`` in
    bytes mode."""

    def __init__(self, stream: Any, marker: bytes) -> None:
        self._stream = stream
        self._marker = marker
        self._buf = b""
        self._found = False
        self.banner = b""

    async def started(self) -> bool:
        """Read to the marker; False when the stream ended (or grew too long) without it."""
        while not self._found:
            split = split_banner(self._buf, self._marker)
            if split is not None:
                self.banner, self._buf = split
                self._found = True
                break
            if len(self._buf) > MAX_BANNER:
                return False
            chunk: bytes = await self._stream.read(65536)
            if not chunk:
                return False
            self._buf += chunk
        return True

    @property
    def before_marker(self) -> bytes:
        """What was read while looking for a marker that did not come."""
        return self._buf if not self._found else b""

    async def readline(self) -> bytes:
        """The next line (b"" at the end), after the marker."""
        if not self._found and not await self.started():
            return b""
        if self._buf:
            i = self._buf.find(b"\n")
            if i >= 0:
                line, self._buf = self._buf[: i + 1], self._buf[i + 1 :]
                return line
            rest: bytes = await self._stream.readline()
            line, self._buf = self._buf + rest, b""
            return line
        got: bytes = await self._stream.readline()
        return got

    async def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes (all to the end for -1), after the marker."""
        if not self._found and not await self.started():
            return b""
        if self._buf:
            if n < 0:
                more: bytes = await self._stream.read()
                data, self._buf = self._buf + more, b""
                return data
            data, self._buf = self._buf[:n], self._buf[n:]
            return data
        chunk: bytes = await self._stream.read(n)
        return chunk


class LaunchedProcess:
    """A long-running remote ``sh`` script: ``stdout``/``stderr`` start after the marker."""

    def __init__(self, proc: Any, marker: bytes, node: str) -> None:
        self.proc = proc
        self.node = node
        self.stdin = proc.stdin
        self.stdout = MarkedReader(proc.stdout, marker)
        self.stderr = MarkedReader(proc.stderr, marker)

    @property
    def banner(self) -> bytes:
        """What the login shell printed on stdout before the script started."""
        return self.stdout.banner

    async def started(self) -> None:
        """Wait for the script's start; raises RemoteError("shell") when it never came."""
        try:
            ok = await self.stdout.started()
        except (asyncssh.Error, OSError) as e:
            self.proc.close()
            raise RemoteError("lost", f"SSH connection to {self.node} lost: {e}") from None
        except asyncio.CancelledError:
            self.proc.close()
            raise
        if ok:
            return
        err = b""
        with contextlib.suppress(Exception):
            err = await wait_for(self.proc.stderr.read(4096), 2.0)
        self.proc.close()
        with contextlib.suppress(Exception):
            await wait_for(self.proc.wait_closed(), 2.0)
        raise no_start_error(self.node, self.proc.exit_status, self.stdout.before_marker, err)

    def close(self) -> None:
        """Close the channel (a process reading its stdin sees the end of it)."""
        self.proc.close()


async def start(conn: asyncssh.SSHClientConnection, script: str, *, node: str) -> LaunchedProcess:
    """Start the ``sh`` text ``script`` on the node and wait for its start marker.

    Raises RemoteError: "refused" when the node refuses a session, "shell" when the launcher
    did not start, "closed"/"lost" when the connection broke."""
    wrapped = launch(script)
    try:
        proc = await conn.create_process(wrapped.command, encoding=None)
    except asyncssh.ChannelOpenError as e:
        raise RemoteError("refused", f"{node} refused a session: {e.reason}") from None
    except (asyncssh.Error, OSError) as e:
        raise RemoteError("closed", f"{node}: {e}") from None
    launched = LaunchedProcess(proc, wrapped.marker, node)
    await launched.started()
    return launched


class Feed(Protocol):
    """Where a stream's bytes go (``fleet.session.LineFeed``, ``asyncio.StreamReader``)."""

    def feed_data(self, data: bytes) -> None: ...
    def feed_eof(self) -> None: ...
    def set_exception(self, exc: BaseException) -> None: ...


class FedProcess(asyncssh.SSHClientSession[bytes]):
    """A long-running remote ``sh`` script whose stdout and stderr, from just after the start
    marker, go to two feeds from the channel's ``data_received`` (no reader task).

    ``banner``/``stderr_banner``: what the login shell printed before the marker (the last
    ``MAX_BANNER`` bytes kept). At the end (the channel closed: after the exit status came)
    ``ended(self, exc)`` says how the feeds end: ``exc`` is the connection's error when it was
    lost, None when the channel closed. A channel whose stdout ended without closing is taken as
    closed ``EOF_CLOSE_S`` later. The feeds hold what they hold: pausing the channel is theirs
    (``chan.pause_reading``)."""

    EOF_CLOSE_S = 2.0

    def __init__(
        self,
        marker: bytes,
        out: Feed,
        err: Feed,
        node: str,
        ended: Callable[[FedProcess, Exception | None], None],
    ) -> None:
        self._marker = marker
        self._ended = ended
        self.out, self.err, self.node = out, err, node
        self._before = [b"", b""]  # stdout, stderr: what came before the marker
        self._found = [False, False]
        self.banner = b""
        self.stderr_banner = b""
        self.chan: asyncssh.SSHClientChannel[bytes] | None = None
        self.started: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._eof_timer: asyncio.TimerHandle | None = None
        self._writable: asyncio.Future[None] | None = None
        self.closed = False

    # -- asyncssh's callbacks ---------------------------------------------------------------
    def connection_made(self, chan: asyncssh.SSHClientChannel[bytes]) -> None:
        self.chan = chan

    def data_received(self, data: bytes, datatype: asyncssh.DataType) -> None:
        which = 1 if datatype == asyncssh.EXTENDED_DATA_STDERR else 0
        feed = self.err if which else self.out
        if self._found[which]:
            feed.feed_data(data)
            return
        buf = self._before[which] + data
        split = split_banner(buf, self._marker)
        if split is None:
            self._before[which] = buf[-MAX_BANNER - len(self._marker) :]
            if not which and len(buf) > MAX_BANNER and not self.started.done():
                self.started.set_result(False)  # the shell is broken
            return
        self._before[which] = b""
        self._found[which] = True
        if which:
            self.stderr_banner = split[0]
        else:
            self.banner = split[0]
            if not self.started.done():
                self.started.set_result(True)
        if split[1]:
            feed.feed_data(split[1])

    def eof_received(self) -> bool:
        if self.started.done() and self.started.result():
            loop = asyncio.get_running_loop()
            self._eof_timer = loop.call_later(self.EOF_CLOSE_S, self._finish, None)
        return True  # half open: requests may still be written until the close

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.started.done():
            self.started.set_result(False)
        self._finish(exc)
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    def pause_writing(self) -> None:
        if self._writable is None or self._writable.done():
            self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    # -- the caller's -----------------------------------------------------------------------
    @property
    def exit_status(self) -> int | None:
        return self.chan.get_exit_status() if self.chan is not None else None

    @property
    def exit_signal(self) -> str | None:
        """The signal's name (``KILL``) when the process was killed by one."""
        got = self.chan.get_exit_signal() if self.chan is not None else None
        return got[0] if got else None

    @property
    def before_marker(self) -> tuple[bytes, bytes]:
        """What stdout and stderr said while the marker did not come."""
        return self._before[0], self._before[1]

    def write(self, data: bytes) -> None:
        """Write to the process's stdin."""
        if self.chan is None or self.closed:
            raise ConnectionError(f"the channel to {self.node} is closed")
        self.chan.write(data)

    async def drain(self) -> None:
        """Wait while the channel asks writers to pause."""
        if self._writable is not None and not self._writable.done():
            await self._writable

    def close(self) -> None:
        """EOF on the process's stdin, then close the channel."""
        if self.chan is not None:
            with contextlib.suppress(Exception):
                self.chan.write_eof()
            self.chan.close()

    async def wait_closed(self) -> None:
        if self.chan is not None:
            await self.chan.wait_closed()

    def _finish(self, exc: Exception | None) -> None:
        if self._eof_timer is not None:
            self._eof_timer.cancel()
            self._eof_timer = None
        if self.closed:
            return
        self.closed = True
        if self.started.done() and self.started.result():
            self._ended(self, exc)


async def start_fed(
    conn: asyncssh.SSHClientConnection,
    script: str,
    *,
    node: str,
    out: Feed,
    err: Feed,
    ended: Callable[[FedProcess, Exception | None], None],
) -> FedProcess:
    """Start the ``sh`` text ``script`` on the node, its stdout and stderr after the marker
    going to ``out`` and ``err`` from the channel's callback; wait for the marker. ``ended``
    says how the feeds end (see ``FedProcess``).

    Raises RemoteError as ``start()`` does."""
    wrapped = launch(script)

    def factory() -> FedProcess:
        return FedProcess(wrapped.marker, out, err, node, ended)

    try:
        _chan, session = await conn.create_session(factory, wrapped.command, encoding=None)
    except asyncssh.ChannelOpenError as e:
        raise RemoteError("refused", f"{node} refused a session: {e.reason}") from None
    except (asyncssh.Error, OSError) as e:
        raise RemoteError("closed", f"{node}: {e}") from None
    assert isinstance(session, FedProcess)
    fed_now = session
    try:
        ok = await fed_now.started
    except asyncio.CancelledError:
        fed_now.close()
        raise
    if ok:
        return fed_now
    fed_now.close()
    with contextlib.suppress(Exception):
        await wait_for(fed_now.wait_closed(), 2.0)
    said_out, said_err = fed_now.before_marker
    raise no_start_error(node, fed_now.exit_status, said_out, said_err)
