"""Where a job's files live and its commands run: this machine, or a node over SSH.

A ``Host`` runs argv lists (never a shell string built from user data), writes files atomically
(temporary name, then rename) and reads them back. ``SshHost`` is a thin user of the connection
layer (``gpuctl.reach``) on a private event loop thread, so that the synchronous job API can
use it from any thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import shlex
import subprocess
import threading
import uuid
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from gpuctl.core import deadline
from gpuctl.reach import launch
from gpuctl.reach.errors import RemoteError
from gpuctl.reach.files import RemoteFiles, RemoteWriter, files_for
from gpuctl.reach.options import SshSettings, SshTarget, resolve
from gpuctl.reach.pool import pool

if TYPE_CHECKING:
    from gpuctl.config import NodeConfig

T = TypeVar("T")


class HostError(Exception):
    """A node cannot be reached or a file operation on it failed; the message says which."""


def no_supervisor_python(host: str, python: str) -> HostError:
    """The error of a job supervisor whose VENV1 ``python`` is not on ``host`` (every host)."""
    return HostError(
        f"{host}: no python at {python!r} for the job supervisor: set python = "
        '"/path/to/python3" for this node in the gpuctl config (or --supervisor-python)'
    )


@contextlib.contextmanager
def _local_errors(what: str) -> Iterator[None]:
    """An OSError of this machine's files as the HostError an SSH node gives for the same
    failure (``local: writing PATH failed: No space left on device``): one line, typed."""
    try:
        yield
    except OSError as e:
        why = e.strerror or str(e)
        hint = _LOCAL_HINTS.get(e.errno or 0, "")
        raise HostError(f"local: {what} failed: {why}{hint}") from e


_LOCAL_HINTS = {
    errno.ENOSPC: " (free space there, or point the job root elsewhere: job_root=, [jobs] dir)",
    errno.EDQUOT: " (free space there, or point the job root elsewhere: job_root=, [jobs] dir)",
    errno.EROFS: " (point the job root at a writable folder: job_root=, [jobs] dir)",
    errno.EACCES: " (point the job root at a folder of yours: job_root=, [jobs] dir)",
}


class Host:
    """Commands and files on the machine that holds job folders."""

    name = "host"

    def run(
        self, argv: Sequence[str], *, timeout: float = 120, stdin: bytes | None = None
    ) -> tuple[int, bytes, bytes]:
        """Run ``argv``; return ``(exit code, stdout, stderr)``. Raises HostError if unreachable."""
        raise NotImplementedError

    def start_detached(
        self, argv: Sequence[str], log: str, env: Mapping[str, str] | None = None
    ) -> int | None:
        """Start ``argv`` in its own session, output to ``log``; return its pid when known.
        ``env``: its whole environment (None: the one a command gets there)."""
        raise NotImplementedError

    def write_bytes(self, path: str, data: bytes, mode: int = 0o600) -> None:
        raise NotImplementedError

    def put_file(self, local: str, path: str, mode: int = 0o600) -> None:
        """Copy a local file to ``path`` through a temporary name and a rename."""
        raise NotImplementedError

    def read_bytes(self, path: str, offset: int = 0) -> bytes | None:
        """The file's bytes from ``offset``, or None when it does not exist."""
        raise NotImplementedError

    def open_atomic(self, path: str, mode: int = 0o600) -> AtomicWriter:
        """A binary writer for ``path``: written under a temporary name, renamed on ``commit``."""
        raise NotImplementedError

    def get_file(self, path: str, local: str) -> None:
        raise NotImplementedError

    def open_read(self, path: str) -> BinaryReader:
        """A binary reader of ``path`` (``read``, ``readinto``, ``readline``, ``close``; a
        context manager). Raises HostError when it cannot be read."""
        raise NotImplementedError

    def exists(self, path: str) -> bool:
        raise NotImplementedError

    def touch(self, path: str, when: str | None = None) -> bool:
        """True when ``when`` (default ``path`` itself) exists, ``path``'s modification time
        then set to now: a content-addressed cache (``code-*``, ``runner-*``, ``shared/*.pkl``)
        found complete (``when``: its completion mark) and reused is marked used, so that
        ``gpuctl jobs purge`` removes only what no job used for its age. One round trip: the
        check and the mark together (a reuse was an ``exists`` and then a ``touch``)."""
        script = '[ -e "$2" ] && touch -c "$1"'
        rc, _, _ = self.run(["sh", "-c", script, "sh", path, when or path], timeout=60)
        return rc == 0

    def mkdir(self, path: str, mode: int = 0o700) -> None:
        """Create ``path`` and its parents; the last component gets ``mode``."""
        raise NotImplementedError

    def remove_tree(self, path: str, timeout: float = 120) -> None:
        """Remove ``path`` and everything under it (nothing there: nothing to do). Raises
        HostError when it stays."""
        rc, _, err = self.run(["rm", "-rf", "--", path], timeout=timeout)
        if rc != 0:
            why = err.decode("utf-8", "replace").strip() or f"rm exited {rc}"
            raise HostError(f"{self.name}: removing {path} failed: {why}")

    def home(self) -> str:
        raise NotImplementedError

    def expand(self, path: str) -> str:
        """``path`` with a leading ``~`` replaced by this host's home (as its shell sees it)."""
        if path.startswith("~/") or path == "~":
            return self.home() + path[1:]
        return path

    def close(self) -> None:
        pass


class LocalHost(Host):
    """This machine."""

    name = "local"

    def run(
        self, argv: Sequence[str], *, timeout: float = 120, stdin: bytes | None = None
    ) -> tuple[int, bytes, bytes]:
        try:
            p = subprocess.run(
                list(argv),
                input=stdin,
                capture_output=True,
                timeout=timeout,
                stdin=None if stdin is not None else subprocess.DEVNULL,
            )
        except FileNotFoundError as e:
            return 127, b"", str(e).encode()
        except subprocess.TimeoutExpired as e:
            raise HostError(f"{argv[0]} took more than {timeout:g} s") from e
        return p.returncode, p.stdout, p.stderr

    def start_detached(
        self, argv: Sequence[str], log: str, env: Mapping[str, str] | None = None
    ) -> int | None:
        with _local_errors(f"writing {log}"):
            out = open(log, "ab")  # noqa: SIM115 - closed below, once the child holds it
        try:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
                close_fds=True,
                env=None if env is None else dict(env),
            )
        except FileNotFoundError:
            raise no_supervisor_python(self.name, argv[0]) from None
        except OSError as e:
            raise HostError(
                f"{self.name}: starting the supervisor ({argv[0]}) failed: {e.strerror or e}"
            ) from e
        finally:
            out.close()
        _REAPER.add(proc)
        return proc.pid

    def write_bytes(self, path: str, data: bytes, mode: int = 0o600) -> None:
        writer = self.open_atomic(path, mode)
        try:
            writer.write(data)
        except BaseException:
            writer.abort()
            raise
        writer.commit()

    def open_atomic(self, path: str, mode: int = 0o600) -> AtomicWriter:
        return _LocalWriter(path, mode)

    def put_file(self, local: str, path: str, mode: int = 0o600) -> None:
        if os.path.abspath(local) == os.path.abspath(path):
            return
        writer = self.open_atomic(path, mode)
        try:
            with open(local, "rb") as src:
                while chunk := src.read(1 << 22):
                    writer.write(chunk)
        except BaseException:
            writer.abort()
            raise
        writer.commit()

    def read_bytes(self, path: str, offset: int = 0) -> bytes | None:
        try:
            with _local_errors(f"reading {path}"), open(path, "rb") as f:
                f.seek(offset)
                return f.read()
        except HostError as e:
            if isinstance(e.__cause__, FileNotFoundError):
                return None
            raise

    def get_file(self, path: str, local: str) -> None:
        if os.path.abspath(local) == os.path.abspath(path):
            return
        # The job's file is the host's (HostError); ``local`` is the caller's own file: its
        # OSError (a folder that is not there) is the caller's to word, as over SSH.
        with _local_errors(f"copying {path} to {local}"):
            src = open(path, "rb")  # noqa: SIM115 - closed below
        with src, open(local, "wb") as dst:
            while True:
                with _local_errors(f"copying {path} to {local}"):
                    chunk = src.read(1 << 22)
                if not chunk:
                    break
                dst.write(chunk)  # an OSError here is the destination's: the caller's

    def open_read(self, path: str) -> BinaryReader:
        with _local_errors(f"reading {path}"):
            return open(path, "rb")

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def touch(self, path: str, when: str | None = None) -> bool:
        if when is not None and not os.path.exists(when):
            return False
        try:
            os.utime(path)
        except OSError:
            return False
        return True

    def mkdir(self, path: str, mode: int = 0o700) -> None:
        # Parents gpuctl creates are private too (os.makedirs gives them the umask's 0755).
        missing = []
        parent = os.path.dirname(os.path.abspath(path))
        while parent and not os.path.isdir(parent):
            missing.append(parent)
            parent = os.path.dirname(parent)
        with _local_errors(f"creating {path}"):
            for folder in reversed(missing):
                with contextlib.suppress(FileExistsError):
                    os.mkdir(folder, 0o700)
            with contextlib.suppress(FileExistsError):
                os.mkdir(path, mode)
            os.chmod(path, mode)

    def home(self) -> str:
        return str(Path.home())


# what ``Host.open_read`` returns: a file opened "rb", or a ``_StreamReader`` (``read``,
# ``readinto``, ``readline``, ``close``, a context manager)
BinaryReader = Any


class AtomicWriter:
    """``write`` bytes, then ``commit()`` (rename into place) or ``abort()`` (remove)."""

    def write(self, data: Any) -> int:
        raise NotImplementedError

    def commit(self) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        raise NotImplementedError


class _LocalWriter(AtomicWriter):
    """A file of this machine; its OSErrors are HostErrors, as a node's are."""

    def __init__(self, path: str, mode: int) -> None:
        self.path = path
        self.tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        with _local_errors(f"writing {path}"):
            fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        self.f = os.fdopen(fd, "wb")

    def write(self, data: Any) -> int:
        with _local_errors(f"writing {self.path}"):
            return self.f.write(data)

    def commit(self) -> None:
        try:
            with _local_errors(f"writing {self.path}"):
                self.f.close()  # buffered bytes meet a full disk here
                os.replace(self.tmp, self.path)
        except HostError:
            self.abort()
            raise

    def abort(self) -> None:
        self.f.close()
        with contextlib.suppress(OSError):
            os.unlink(self.tmp)


class _StreamWriter(AtomicWriter):
    """Streams writes to a node's file (SFTP, or the shell when SFTP is unusable): chunks of
    CHUNK bytes go out as parallel writes at explicit offsets while the caller (cloudpickle)
    keeps producing; at most AHEAD chunks are in flight, so memory stays bounded whatever the
    payload size. Small writes are gathered into a chunk (copied); a write of a chunk or more
    is sent from the caller's buffer itself (cloudpickle hands over the argument's own bytes):
    no copy, and ``write`` returns only once all but AHEAD chunks of it are sent, ``commit``
    and ``abort`` once all are, so the buffer must stay unchanged until then (it does: the
    pickling caller is waiting)."""

    CHUNK = 8 << 20
    AHEAD = 4

    def __init__(self, host: SshHost, path: str, mode: int) -> None:
        self.host = host
        self.path = path
        self.offset = 0
        self.buf = bytearray()
        self.pending: list[Any] = []

        async def open_file() -> RemoteWriter:
            files = await host._files()
            return await files.open_atomic(path, mode)

        self.f = host._call(open_file())

    def _submit(self, chunk: bytes | memoryview) -> None:
        fut = asyncio.run_coroutine_threadsafe(
            self.f.write_at(chunk, self.offset), self.host._lt.loop
        )
        self.offset += len(chunk)
        self.pending.append(fut)
        while len(self.pending) > self.AHEAD:
            self._result(self.pending.pop(0))

    def _result(self, fut: Any) -> None:
        try:
            fut.result()
        except Exception as e:
            self.host._drop()
            why = e.message if isinstance(e, RemoteError) else str(e)
            raise HostError(f"{self.host.name}: writing {self.path} failed: {why}") from e

    def write(self, data: Any) -> int:
        mv = memoryview(data).cast("B")
        n = len(mv)
        if n >= self.CHUNK:
            if self.buf:
                self._submit(bytes(self.buf))
                self.buf.clear()
            for i in range(0, n, self.CHUNK):
                self._submit(mv[i : i + self.CHUNK])
            return n
        self.buf += mv
        if len(self.buf) >= self.CHUNK:
            self._submit(bytes(self.buf))
            self.buf.clear()
        return n

    def commit(self) -> None:
        if self.buf:
            self._submit(bytes(self.buf))
            self.buf.clear()
        while self.pending:
            self._result(self.pending.pop(0))
        self.host._call(self.f.commit())

    def abort(self) -> None:
        for fut in self.pending:
            fut.cancel()
        with contextlib.suppress(Exception):
            self.host._call(self.f.abort())


class _StreamReader:
    """Reads a node's file as it arrives (``RemoteFiles.chunks`` on the loop thread, feeding
    this thread through a pipe): the reader (cloudpickle) works on the first bytes while the
    rest are on the wire, and its ``readinto`` has the kernel fill the caller's buffer with the
    GIL released, so the loop thread (the transfer) is not held up by the copy, and a large
    result needs no local file. At most the pipe and the loop's write buffer wait here: the
    download pauses until the reader catches up. A transfer that fails raises HostError from
    the read that meets it; it never looks like the end of the file."""

    PIPE = 1 << 20  # the pipe's size, where the kernel allows it

    def __init__(self, host: SshHost, path: str) -> None:
        self.host = host
        self.path = path
        rfd, wfd = os.pipe()
        with contextlib.suppress(OSError, AttributeError, ImportError):  # Linux only
            import fcntl

            fcntl.fcntl(wfd, fcntl.F_SETPIPE_SZ, self.PIPE)
        self._r = open(rfd, "rb", buffering=0)  # noqa: SIM115 (closed by close())
        w = open(wfd, "wb", buffering=0)  # noqa: SIM115 (the loop's pipe transport closes it)
        self._done = False
        self._error: BaseException | None = None
        self._task: asyncio.Task[None] | None = None

        async def begin() -> None:
            self._task = asyncio.ensure_future(self._pump(w))

        try:
            host._call(begin())
        except BaseException:
            w.close()
            self._r.close()
            raise

    async def _pump(self, w: Any) -> None:
        try:
            loop = asyncio.get_running_loop()
            transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, w)
        except BaseException as e:
            w.close()
            self._error = e
            raise
        writer = asyncio.StreamWriter(transport, protocol, None, loop)
        try:
            files = await self.host._files()
            async for chunk in files.chunks(self.path):
                writer.write(chunk)
                await writer.drain()
            self._done = True  # before the close: the reader's end of file is then the file's
            transport.close()  # after what is still buffered
        except BaseException as e:
            self._error = e
            transport.abort()  # the reader sees the end of the pipe, then the error
            if isinstance(e, asyncio.CancelledError):
                raise

    def _fail(self, e: BaseException) -> HostError:
        if isinstance(e, RemoteError):
            if e.reason in ("lost", "closed"):
                self.host._drop()
            return HostError(e.message)
        if isinstance(e, HostError):
            return e
        self.host._drop()
        return HostError(f"{self.host.name}: reading {self.path} failed: {e}")

    def readinto(self, buf: Any) -> int:
        """Fill ``buf`` (all of it, unless the file ends first); return the count."""
        out = memoryview(buf).cast("B")
        n = 0
        while n < len(out):
            got = self._r.readinto(out[n:])
            if not got:
                if not self._done:
                    raise self._fail(self._error or EOFError("the transfer ended early"))
                break
            n += got
        return n

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes (fewer only at the end of the file); all the rest for -1."""
        if size is None or size < 0:
            parts = []
            while part := self.read(1 << 20):
                parts.append(part)
            return b"".join(parts)
        buf = bytearray(size)
        n = self.readinto(buf)
        del buf[n:]
        return bytes(buf)

    def readline(self, size: int = -1) -> bytes:
        line = bytearray()
        while size < 0 or len(line) < size:
            c = self.read(1)
            if not c:
                break
            line += c
            if c == b"\n":
                break
        return bytes(line)

    def close(self) -> None:
        """Stop the transfer (when not finished)."""
        task = self._task
        self._task = None
        if task is not None and not task.done():

            async def stop() -> None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

            with contextlib.suppress(Exception):
                self.host._call(stop(), timeout=30)
        self._r.close()

    def __enter__(self) -> _StreamReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Reaper:
    """Collects exited detached children so they do not linger as zombies."""

    def __init__(self) -> None:
        self._procs: list[subprocess.Popen[bytes]] = []
        self._lock = threading.Lock()

    def add(self, proc: subprocess.Popen[bytes]) -> None:
        with self._lock:
            self._procs = [p for p in self._procs if p.poll() is None]
            self._procs.append(proc)

    def poll(self) -> None:
        with self._lock:
            self._procs = [p for p in self._procs if p.poll() is None]

    def wait(self, pid: int, timeout: float | None) -> bool:
        """Wait for our child ``pid`` to exit; False at the timeout or if it is not ours."""
        with self._lock:
            proc = next((p for p in self._procs if p.pid == pid), None)
        if proc is None:
            return False
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True


_REAPER = _Reaper()


class _LoopThread:
    """One asyncio loop in a daemon thread, shared by every SshHost of this process."""

    _instance: _LoopThread | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="gpuctl-jobs-ssh", daemon=True
        )
        self.thread.start()

    @classmethod
    def get(cls) -> _LoopThread:
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return deadline.result(fut, timeout)


class SshHost(Host):
    """A node reached through the connection layer (``gpuctl.reach``): options as ``ssh -G``
    resolves them, host keys checked, jump hosts hop by hop, one pooled connection per node on
    the jobs' private loop thread; commands run through ``/bin/sh`` whatever the login shell
    (its banner left aside), files over SFTP or, when that is unusable, through the shell.
    """

    @classmethod
    def for_node(cls, node: NodeConfig) -> SshHost:
        """The host of a configured node."""
        return cls(node.name, settings=SshSettings.from_node(node))

    def __init__(
        self,
        name: str,
        *,
        host: str | None = None,
        ssh_config: str | None = None,
        known_hosts: str | None = None,
        user: str | None = None,
        port: int | None = None,
        identity: str | None = None,
        connect_timeout: float | None = None,
        keepalive_interval: float | None = None,
        settings: SshSettings | None = None,
    ) -> None:
        self.name = name
        self._host = host or name
        self.settings = settings or SshSettings(
            ssh_config=ssh_config,
            known_hosts=known_hosts,
            user=user,
            port=port,
            identity=identity,
            connect_timeout=connect_timeout,
            keepalive_interval=keepalive_interval,
        )
        self._lt = _LoopThread.get()
        self._target: SshTarget | None = None
        self._conn: Any = None
        self.banner = b""  # what the node's login shell printed before a command (doctor)

    async def _connection(self) -> Any:
        try:
            target = await asyncio.to_thread(resolve, self._host, self.settings)
            p = pool()
            if self._target is not None and self._target != target:
                p.release(self._target, self)  # the ssh config changed under us
            self._target = target
            self._conn = await p.connect(target, self)
        except RemoteError as e:
            msg = e.for_node(self.name).message
            msg = msg[len(self.name) + 2 :] if msg.startswith(f"{self.name}: ") else msg
            raise HostError(f"cannot reach {self.name}: {msg}") from None
        return self._conn

    async def _files(self) -> RemoteFiles:
        return files_for(await self._connection(), self.name)

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        try:
            return self._lt.call(coro, timeout)
        except HostError:
            raise
        except RemoteError as e:
            if e.reason in ("lost", "closed"):
                self._drop()
            raise HostError(e.message) from None
        except Exception as e:
            import asyncssh

            if isinstance(e, (asyncssh.Error, OSError)):
                self._drop()
                raise HostError(f"{self.name}: {e}") from e
            raise

    def _drop(self) -> None:
        """The connection broke: the next call opens a new one."""
        target, conn = self._target, self._conn
        if target is None or conn is None:
            return

        async def invalidate() -> None:
            pool().invalidate(target, conn)

        asyncio.run_coroutine_threadsafe(invalidate(), self._lt.loop)

    def _script(
        self, script: str, *, timeout: float | None = 120, stdin: bytes | None = None
    ) -> tuple[int, bytes, bytes]:
        async def go() -> tuple[int, bytes, bytes]:
            conn = await self._connection()
            r = await launch.run(conn, script, node=self.name, stdin=stdin, timeout=timeout)
            if r.banner:
                self.banner = r.banner
            return r.status, r.stdout, r.stderr

        return self._call(go())

    def run(
        self, argv: Sequence[str], *, timeout: float = 120, stdin: bytes | None = None
    ) -> tuple[int, bytes, bytes]:
        return self._script(shlex.join(argv), timeout=timeout, stdin=stdin)

    def start_detached(
        self, argv: Sequence[str], log: str, env: Mapping[str, str] | None = None
    ) -> int | None:
        # ``env`` is not sent: a job on a node starts from sshd's session there (BASE_ENV).
        # setsid: the supervisor outlives this SSH session (and gpuctl); echo $! gives its pid.
        # A missing interpreter would only show in the log after the job is "lost": say it now.
        check = f"command -v {shlex.quote(argv[0])} >/dev/null 2>&1 || exit 127"
        cmd = f"{check}; setsid {shlex.join(argv)} < /dev/null >> {shlex.quote(log)} 2>&1 & echo $!"
        rc, out, err = self._script(cmd, timeout=60)
        if rc == 127:
            raise no_supervisor_python(self.name, argv[0])
        if rc != 0:
            raise HostError(f"{self.name}: starting the supervisor failed: {err.decode()[-500:]}")
        try:
            return int(out.decode().strip().splitlines()[-1])
        except (ValueError, IndexError):
            return None

    def write_bytes(self, path: str, data: bytes, mode: int = 0o600) -> None:
        async def go() -> None:
            await (await self._files()).write(path, data, mode)

        self._call(go())

    def open_atomic(self, path: str, mode: int = 0o600) -> AtomicWriter:
        return _StreamWriter(self, path, mode)

    def put_file(self, local: str, path: str, mode: int = 0o600) -> None:
        async def go() -> None:
            await (await self._files()).put(local, path, mode)

        self._call(go())

    def read_bytes(self, path: str, offset: int = 0) -> bytes | None:
        async def go() -> bytes | None:
            return await (await self._files()).read(path, offset)

        return self._call(go())

    def get_file(self, path: str, local: str) -> None:
        async def go() -> None:
            await (await self._files()).get(path, local)

        self._call(go())

    def open_read(self, path: str) -> BinaryReader:
        return _StreamReader(self, path)

    def exists(self, path: str) -> bool:
        async def go() -> bool:
            return await (await self._files()).exists(path)

        return self._call(go())

    def mkdir(self, path: str, mode: int = 0o700) -> None:
        async def go() -> None:
            await (await self._files()).mkdir(path, mode)

        self._call(go())

    def home(self) -> str:
        """The node's ``$HOME`` as its shell sees it (the rule for ``~`` on a node)."""

        async def go() -> str:
            return await (await self._files()).home()

        return self._call(go())

    def close(self) -> None:
        """Give the connection back to the pool (closed when no other host holds it)."""
        target = self._target
        self._target = self._conn = None
        if target is None:
            return

        async def release() -> None:
            pool().release(target, self)

        with contextlib.suppress(Exception):
            deadline.result(asyncio.run_coroutine_threadsafe(release(), self._lt.loop), 10)
