"""Running a command on a node the same way whatever its login shell is.

sshd hands a command to the user's login shell (``$SHELL -c COMMAND``), which may be bash with a
chatty ``.bashrc``, tcsh (no newline inside single quotes, ``!`` history), zsh or fish. So the
text sshd gets is one safe line: ``exec /bin/sh -c '<decoder>' gpuctl <base64 chunks>``; only
base64 characters travel as arguments (chunks of a multiple of 4 characters: none starts with
``=``, which zsh would expand), and ``/bin/sh`` decodes and evals the script. The script first
prints a start marker with a per-launch nonce (``gpuctl-start:<nonce>``) on stdout and on
stderr; whatever came before it on a stream is the login shell's banner: kept (for ``gpuctl
doctor``), never parsed. ``run()`` returns the output after the marker; ``start()`` gives a
process whose streams begin after it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import secrets
from dataclasses import dataclass
from typing import Any

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
