"""Files on a node: push one (temporary name, then rename, mode given), read one, and a few
folder operations, over SFTP when the subsystem works and through the shell when it does not.

A real cluster's sshd often starts the external ``sftp-server`` through the user's login shell;
a ``.bashrc`` that prints something then corrupts the SFTP protocol. ``RemoteFiles`` tries SFTP
once per connection and, when it is unusable, does the same through ``launch`` (``cat > tmp &&
mv``), whose start marker leaves any banner aside.

One rule for ``~``: a path ``~`` or ``~/...`` is the node's ``$HOME`` as its shell sees it
(``home()`` asks the shell once per connection); every other path is used as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
import uuid
import weakref
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import asyncssh

from gpuctl.core.deadline import wait_for
from gpuctl.reach import launch
from gpuctl.reach.errors import RemoteError

log = logging.getLogger(__name__)

SFTP_START_TIMEOUT = 15.0
_MISSING = 44  # exit status of a shell read whose file does not exist


def remote_path(path: str) -> str:
    """Shell text for a node-side path: ``~/x`` becomes ``"$HOME"/x``, the rest is quoted."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def _tmp_name(path: str) -> str:
    return f"{path}.tmp-{uuid.uuid4().hex[:8]}"


class RemoteWriter:
    """A file being written: ``write_at`` chunks (in order for the shell route), then
    ``commit()`` (renamed into place) or ``abort()`` (removed)."""

    async def write_at(self, data: bytes | memoryview, offset: int) -> None:
        raise NotImplementedError

    async def commit(self) -> None:
        raise NotImplementedError

    async def abort(self) -> None:
        raise NotImplementedError


class _SftpWriter(RemoteWriter):
    def __init__(self, files: RemoteFiles, f: Any, tmp: str, path: str) -> None:
        self.files = files
        self.f = f
        self.tmp = tmp
        self.path = path

    async def write_at(self, data: bytes | memoryview, offset: int) -> None:
        await self.f.write(data, offset)  # asyncssh copies what it sends: a view is fine

    async def commit(self) -> None:
        await self.f.close()
        await self.files._rename(self.tmp, self.path)

    async def abort(self) -> None:
        with contextlib.suppress(Exception):
            await self.f.close()
        with contextlib.suppress(Exception):
            sftp = await self.files.sftp()
            if sftp is not None:
                await sftp.remove(self.tmp)


class _ShellWriter(RemoteWriter):
    def __init__(
        self, files: RemoteFiles, proc: launch.LaunchedProcess, tmp: str, path: str, mode: int
    ) -> None:
        self.files = files
        self.proc = proc
        self.tmp = tmp
        self.path = path
        self.mode = mode
        self.pos = 0

    async def write_at(self, data: bytes | memoryview, offset: int) -> None:
        if offset != self.pos:
            raise RemoteError("file", f"{self.files.node}: out-of-order write to {self.path}")
        # the write happens before the first await: callers' writes keep their order
        self.proc.stdin.write(data)
        self.pos += len(data)
        await self.proc.stdin.drain()

    async def commit(self) -> None:
        self.proc.stdin.write_eof()
        await self.proc.proc.wait_closed()
        if self.proc.proc.exit_status != 0:
            err = await self.proc.stderr.read()
            raise RemoteError(
                "file", f"{self.files.node}: writing {self.path} failed: {_tail(err)}"
            )
        await self.files._shell(
            f"chmod {self.mode:o} {remote_path(self.tmp)} && "
            f"mv -f {remote_path(self.tmp)} {remote_path(self.path)}",
            f"renaming {self.tmp}",
        )

    async def abort(self) -> None:
        self.proc.close()
        with contextlib.suppress(Exception):
            await self.files._shell(f"rm -f {remote_path(self.tmp)}", "removing")


def _tail(err: bytes) -> str:
    lines = [ln for ln in err.decode(errors="replace").splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no message"


class RemoteFiles:
    """Files on one node over one connection (see the module doc). Methods raise RemoteError:
    "file" for a failed operation, "lost" when the connection broke."""

    def __init__(self, conn: asyncssh.SSHClientConnection, node: str) -> None:
        self.conn = conn
        self.node = node
        self._sftp: Any = None
        self._sftp_tried = False
        self._lock = asyncio.Lock()
        self._home: str | None = None
        self.sftp_problem: str | None = None  # why SFTP is not used, when it is not

    # -- SFTP or not ------------------------------------------------------------------------
    async def sftp(self) -> asyncssh.SFTPClient | None:
        """The SFTP client, or None when the subsystem is unusable (then the shell is used)."""
        if self._sftp_tried:
            return self._sftp  # type: ignore[no-any-return]
        async with self._lock:
            if not self._sftp_tried:
                try:
                    self._sftp = await wait_for(self.conn.start_sftp_client(), SFTP_START_TIMEOUT)
                except (asyncssh.Error, OSError, TimeoutError) as e:
                    if self.conn.is_closed():
                        raise RemoteError(
                            "lost", f"SSH connection to {self.node} lost: {e}"
                        ) from None
                    self.sftp_problem = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
                    log.warning(
                        "%s: SFTP is unusable (%s); files go through the shell",
                        self.node,
                        self.sftp_problem,
                    )
                self._sftp_tried = True
        return self._sftp  # type: ignore[no-any-return]

    async def _shell(
        self, script: str, what: str, stdin: bytes | None = None, ok: tuple[int, ...] = (0,)
    ) -> launch.RunResult:
        r = await launch.run(self.conn, script, node=self.node, stdin=stdin, timeout=None)
        if r.status not in ok:
            raise RemoteError("file", f"{self.node}: {what} failed: {_tail(r.stderr)}")
        return r

    def _sftp_error(self, e: BaseException, what: str) -> RemoteError:
        if self.conn.is_closed() or not isinstance(e, asyncssh.SFTPError):
            return RemoteError("lost", f"SSH connection to {self.node} lost: {e}")
        return RemoteError("file", f"{self.node}: {what} failed: {e.reason}")

    async def home(self) -> str:
        """The node's ``$HOME`` as its shell sees it (asked once per connection)."""
        if self._home is None:
            r = await self._shell('printf %s "$HOME"', "reading $HOME")
            self._home = r.stdout.decode(errors="replace")
            if not self._home.startswith("/"):
                raise RemoteError("file", f"{self.node}: $HOME is {self._home!r}, not a path")
        return self._home

    async def abspath(self, path: str) -> str:
        """``path`` with a leading ``~`` replaced by the node's ``$HOME``."""
        if path == "~" or path.startswith("~/"):
            return await self.home() + path[1:]
        return path

    async def _rename(self, tmp: str, path: str) -> None:
        sftp = await self.sftp()
        assert sftp is not None
        try:
            await sftp.posix_rename(tmp, path)
        except asyncssh.SFTPOpUnsupported:
            with contextlib.suppress(asyncssh.SFTPNoSuchFile):
                await sftp.remove(path)
            await sftp.rename(tmp, path)

    # -- operations -------------------------------------------------------------------------
    async def write(self, path: str, data: bytes, mode: int = 0o600) -> None:
        """Write ``data`` to ``path`` atomically (temporary name, then rename) with ``mode``."""
        path = await self.abspath(path)
        tmp = _tmp_name(path)
        sftp = await self.sftp()
        if sftp is None:
            await self._shell(
                f'umask 077; T={remote_path(tmp)}; cat > "$T" && chmod {mode:o} "$T" && '
                f'mv -f "$T" {remote_path(path)} || {{ rm -f "$T"; exit 1; }}',
                f"writing {path}",
                stdin=data,
            )
            return
        try:
            async with sftp.open(tmp, "wb", asyncssh.SFTPAttrs(permissions=mode)) as f:
                await f.write(data)
            await self._rename(tmp, path)
        except (asyncssh.Error, OSError) as e:
            raise self._sftp_error(e, f"writing {path}") from None

    async def put(self, local: str, path: str, mode: int = 0o600) -> None:
        """Copy the local file ``local`` to ``path`` (temporary name, then rename)."""
        path = await self.abspath(path)
        tmp = _tmp_name(path)
        sftp = await self.sftp()
        if sftp is None:
            writer = await self.open_atomic(path, mode)
            try:
                offset = 0
                src = await asyncio.to_thread(open, local, "rb")
                try:
                    while chunk := await asyncio.to_thread(src.read, 1 << 22):
                        await writer.write_at(chunk, offset)
                        offset += len(chunk)
                finally:
                    src.close()
                await writer.commit()
            except BaseException:
                await writer.abort()
                raise
            return
        try:
            await sftp.put(local, tmp, max_requests=128)
            await sftp.chmod(tmp, mode)
            await self._rename(tmp, path)
        except (asyncssh.Error, OSError) as e:
            raise self._sftp_error(e, f"copying {local} to {path}") from None

    async def open_atomic(self, path: str, mode: int = 0o600) -> RemoteWriter:
        """A writer for ``path`` (written under a temporary name, renamed on commit)."""
        path = await self.abspath(path)
        tmp = _tmp_name(path)
        sftp = await self.sftp()
        if sftp is None:
            proc = await launch.start(
                self.conn, f"umask 077; exec cat > {remote_path(tmp)}", node=self.node
            )
            return _ShellWriter(self, proc, tmp, path, mode)
        try:
            f = await sftp.open(tmp, "wb", asyncssh.SFTPAttrs(permissions=mode), max_requests=64)
        except (asyncssh.Error, OSError) as e:
            raise self._sftp_error(e, f"writing {path}") from None
        return _SftpWriter(self, f, tmp, path)

    async def read(self, path: str, offset: int = 0) -> bytes | None:
        """The bytes of ``path`` from ``offset``, or None when it does not exist."""
        path = await self.abspath(path)
        sftp = await self.sftp()
        if sftp is None:
            r = await self._shell(
                f'P={remote_path(path)}; [ -e "$P" ] || exit {_MISSING}; '
                f'exec tail -c +{offset + 1} "$P"',
                f"reading {path}",
                ok=(0, _MISSING),
            )
            return None if r.status == _MISSING else r.stdout
        try:
            async with sftp.open(path, "rb") as f:
                if offset:
                    await f.seek(offset)
                data = await f.read()
                return data if isinstance(data, bytes) else data.encode()
        except asyncssh.SFTPNoSuchFile:
            return None
        except (asyncssh.Error, OSError) as e:
            raise self._sftp_error(e, f"reading {path}") from None

    async def chunks(self, path: str, ahead: int = 64) -> AsyncIterator[bytes]:
        """The bytes of ``path``, in order, as they arrive: over SFTP, up to ``ahead`` reads of
        the server's largest read size in flight (the whole file is asked for, not a stream
        that could end early: a file shorter than its size at the start is an error); through
        the shell, ``cat``'s output. Raises RemoteError ("file" also when it does not exist);
        the stream never just stops short."""
        path = await self.abspath(path)
        sftp = await self.sftp()
        if sftp is None:
            proc = await launch.start(self.conn, f"exec cat {remote_path(path)}", node=self.node)
            try:
                while chunk := await proc.stdout.read(1 << 20):
                    yield chunk
                await proc.proc.wait_closed()
                if proc.proc.exit_status != 0:
                    err = await proc.stderr.read()
                    raise RemoteError("file", f"{self.node}: reading {path} failed: {_tail(err)}")
            except (asyncssh.Error, OSError) as e:
                raise RemoteError("lost", f"SSH connection to {self.node} lost: {e}") from None
            finally:
                proc.close()
            return
        pending: deque[asyncio.Future[bytes]] = deque()
        try:
            # block_size=0: each read below is one SFTP request, answered straight into bytes
            async with sftp.open(path, "rb", block_size=0) as f:
                try:
                    size = (await f.stat()).size or 0
                    block = sftp.limits.max_read_len
                    offset = 0
                    while pending or offset < size:
                        while offset < size and len(pending) < ahead:
                            n = min(block, size - offset)
                            read = self._read_block(f, path, offset, n)
                            pending.append(asyncio.ensure_future(read))
                            offset += n
                        yield await pending.popleft()
                finally:
                    for task in pending:  # the reader stopped early: no read outlives the file
                        task.cancel()
                    await asyncio.gather(*pending, return_exceptions=True)
        except (asyncssh.Error, OSError) as e:
            raise self._sftp_error(e, f"reading {path}") from None

    async def _read_block(self, f: Any, path: str, offset: int, n: int) -> bytes:
        data: bytes = await f.read(n, offset)
        while len(data) < n:  # SFTP allows a short read: ask for the rest
            more: bytes = await f.read(n - len(data), offset + len(data))
            if not more:
                raise RemoteError("file", f"{self.node}: {path} shrank while being read")
            data += more
        return data

    async def get(self, path: str, local: str) -> None:
        """Copy ``path`` to the local file ``local``."""
        path = await self.abspath(path)
        sftp = await self.sftp()
        if sftp is None:
            dst = await asyncio.to_thread(open, local, "wb")
            try:
                async for chunk in self.chunks(path):
                    await asyncio.to_thread(dst.write, chunk)
            finally:
                dst.close()
            return
        try:
            await sftp.get(path, local, max_requests=128)
        except (asyncssh.Error, OSError) as e:
            raise self._sftp_error(e, f"reading {path}") from None

    async def exists(self, path: str) -> bool:
        """True when ``path`` exists on the node."""
        path = await self.abspath(path)
        sftp = await self.sftp()
        if sftp is None:
            r = await self._shell(f"[ -e {remote_path(path)} ]", "looking", ok=(0, 1))
            return r.status == 0
        try:
            return bool(await sftp.exists(path))
        except (asyncssh.Error, OSError) as e:
            raise self._sftp_error(e, f"looking for {path}") from None

    async def mkdir(self, path: str, mode: int = 0o700) -> None:
        """Create ``path`` with ``mode``; parents it creates are 0700."""
        path = await self.abspath(path)
        sftp = await self.sftp()
        if sftp is None:
            await self._shell(
                f"umask 077; mkdir -p {remote_path(path)} && chmod {mode:o} {remote_path(path)}",
                f"creating {path}",
            )
            return
        try:
            private = asyncssh.SFTPAttrs(permissions=0o700)
            parent = os.path.dirname(path)
            if parent:
                await sftp.makedirs(parent, attrs=private, exist_ok=True)
            with contextlib.suppress(asyncssh.SFTPFailure):
                await sftp.mkdir(path, asyncssh.SFTPAttrs(permissions=mode))
            await sftp.chmod(path, mode)
        except (asyncssh.Error, OSError) as e:
            raise self._sftp_error(e, f"creating {path}") from None


_FILES: weakref.WeakKeyDictionary[asyncssh.SSHClientConnection, RemoteFiles] = (
    weakref.WeakKeyDictionary()
)


def files_for(conn: asyncssh.SSHClientConnection, node: str) -> RemoteFiles:
    """The ``RemoteFiles`` of a connection (one per connection: SFTP is tried once)."""
    found = _FILES.get(conn)
    if found is None:
        found = _FILES[conn] = RemoteFiles(conn, node)
    return found
