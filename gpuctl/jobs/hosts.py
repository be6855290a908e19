"""Where a job's files live and its commands run: this machine, or a node over SSH/SFTP.

A ``Host`` runs argv lists (never a shell string built from user data), writes files atomically
(temporary name, then rename) and reads them back. ``SshHost`` keeps one asyncssh connection on a
private event loop thread so that the synchronous job API can use it from any thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import subprocess
import threading
import uuid
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


class HostError(Exception):
    """A node cannot be reached or a file operation on it failed; the message says which."""


class Host:
    """Commands and files on the machine that holds job folders."""

    name = "host"

    def run(
        self, argv: Sequence[str], *, timeout: float = 120, stdin: bytes | None = None
    ) -> tuple[int, bytes, bytes]:
        """Run ``argv``; return ``(exit code, stdout, stderr)``. Raises HostError if unreachable."""
        raise NotImplementedError

    def start_detached(self, argv: Sequence[str], log: str) -> int | None:
        """Start ``argv`` in its own session, output to ``log``; return its pid when known."""
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

    def exists(self, path: str) -> bool:
        raise NotImplementedError

    def mkdir(self, path: str, mode: int = 0o700) -> None:
        """Create ``path`` and its parents; the last component gets ``mode``."""
        raise NotImplementedError

    def home(self) -> str:
        raise NotImplementedError

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

    def start_detached(self, argv: Sequence[str], log: str) -> int | None:
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
                close_fds=True,
            )
        _REAPER.add(proc)
        return proc.pid

    def write_bytes(self, path: str, data: bytes, mode: int = 0o600) -> None:
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)

    def open_atomic(self, path: str, mode: int = 0o600) -> AtomicWriter:
        return _LocalWriter(path, mode)

    def put_file(self, local: str, path: str, mode: int = 0o600) -> None:
        if os.path.abspath(local) == os.path.abspath(path):
            return
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        with open(local, "rb") as src:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
            with os.fdopen(fd, "wb") as dst:
                while chunk := src.read(1 << 22):
                    dst.write(chunk)
        os.replace(tmp, path)

    def read_bytes(self, path: str, offset: int = 0) -> bytes | None:
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                return f.read()
        except FileNotFoundError:
            return None

    def get_file(self, path: str, local: str) -> None:
        if os.path.abspath(local) != os.path.abspath(path):
            with open(path, "rb") as src, open(local, "wb") as dst:
                while chunk := src.read(1 << 22):
                    dst.write(chunk)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def mkdir(self, path: str, mode: int = 0o700) -> None:
        # Parents gpuctl creates are private too (os.makedirs gives them the umask's 0755).
        missing = []
        parent = os.path.dirname(os.path.abspath(path))
        while parent and not os.path.isdir(parent):
            missing.append(parent)
            parent = os.path.dirname(parent)
        for folder in reversed(missing):
            with contextlib.suppress(FileExistsError):
                os.mkdir(folder, 0o700)
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, mode)
        os.chmod(path, mode)

    def home(self) -> str:
        return str(Path.home())


class AtomicWriter:
    """``write`` bytes, then ``commit()`` (rename into place) or ``abort()`` (remove)."""

    def write(self, data: Any) -> int:
        raise NotImplementedError

    def commit(self) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        raise NotImplementedError


class _LocalWriter(AtomicWriter):
    def __init__(self, path: str, mode: int) -> None:
        self.path = path
        self.tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        self.f = os.fdopen(os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "wb")

    def write(self, data: Any) -> int:
        return self.f.write(data)

    def commit(self) -> None:
        self.f.close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        self.f.close()
        with contextlib.suppress(OSError):
            os.unlink(self.tmp)


class _SftpWriter(AtomicWriter):
    """Streams writes to an SFTP file: chunks of CHUNK bytes go out as parallel SFTP writes at
    explicit offsets while the caller (cloudpickle) keeps producing; at most AHEAD chunks are
    in flight, so memory stays bounded whatever the payload size."""

    CHUNK = 8 << 20
    AHEAD = 4

    def __init__(self, host: SshHost, path: str, mode: int) -> None:
        self.host = host
        self.path = path
        self.mode = mode
        self.tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        self.offset = 0
        self.buf = bytearray()
        self.pending: list[Any] = []

        async def open_file() -> Any:
            import asyncssh

            sftp = await host._sftp_client()
            return await sftp.open(
                self.tmp, "wb", asyncssh.SFTPAttrs(permissions=mode), max_requests=64
            )

        self.f = host._call(open_file())

    def _submit(self, chunk: bytes) -> None:
        fut = asyncio.run_coroutine_threadsafe(self.f.write(chunk, self.offset), self.host._lt.loop)
        self.offset += len(chunk)
        self.pending.append(fut)
        while len(self.pending) > self.AHEAD:
            self._result(self.pending.pop(0))

    def _result(self, fut: Any) -> None:
        try:
            fut.result()
        except Exception as e:
            self.host._drop()
            raise HostError(f"{self.host.name}: writing {self.path} failed: {e}") from e

    def write(self, data: Any) -> int:
        mv = memoryview(data).cast("B")
        n = len(mv)
        if n >= self.CHUNK:
            if self.buf:
                self._submit(bytes(self.buf))
                self.buf.clear()
            for i in range(0, n, self.CHUNK):
                self._submit(bytes(mv[i : i + self.CHUNK]))
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

        async def finish() -> None:
            await self.f.close()
            sftp = await self.host._sftp_client()
            await sftp.posix_rename(self.tmp, self.path)

        self.host._call(finish())

    def abort(self) -> None:
        for fut in self.pending:
            fut.cancel()

        async def drop() -> None:
            with contextlib.suppress(Exception):
                await self.f.close()
            with contextlib.suppress(Exception):
                sftp = await self.host._sftp_client()
                await sftp.remove(self.tmp)

        with contextlib.suppress(Exception):
            self.host._call(drop())


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
        return fut.result(timeout)


_CIPHERS = (
    "aes128-gcm@openssh.com",
    "aes256-gcm@openssh.com",
    "chacha20-poly1305@openssh.com",
    "aes128-ctr",
    "aes192-ctr",
    "aes256-ctr",
)


def _config_sets_ciphers(ssh_config: str | None) -> bool:
    """True when the user's ssh_config chooses ciphers itself (then we leave them alone)."""
    for path in (ssh_config, "~/.ssh/config"):
        if not path:
            continue
        try:
            text = Path(os.path.expanduser(path)).read_text(errors="replace")
        except OSError:
            continue
        if any(line.strip().lower().startswith("ciphers") for line in text.splitlines()):
            return True
    return False


class SshHost(Host):
    """A node over one asyncssh connection (options from an ssh_config file, host keys checked).

    ``python`` is the node's VENV1 (``python3`` by default).
    """

    @classmethod
    def for_node(cls, node: Any) -> SshHost:
        """The host of a configured node (a ``gpuctl.config.NodeConfig``)."""
        return cls(
            node.name,
            ssh_config=node.ssh_config,
            known_hosts=node.known_hosts,
            user=node.user,
            port=node.port,
            identity=node.identity,
            connect_timeout=node.connect_timeout,
        )

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
        connect_timeout: float = 15.0,
        keepalive_interval: float = 5.0,
    ) -> None:
        self.name = name
        self._host = host or name
        self._opts: dict[str, Any] = {"connect_timeout": connect_timeout}
        if keepalive_interval:
            self._opts["keepalive_interval"] = keepalive_interval
        if ssh_config:
            self._opts["config"] = [os.path.expanduser(ssh_config)]
        if not _config_sets_ciphers(ssh_config):
            # AES-GCM first: with AES-NI it moves payloads ~1.5x faster than asyncssh's default
            # chacha20-poly1305 (measured in benchmarks/jobs_roundtrip.py); all stay allowed.
            self._opts["encryption_algs"] = _CIPHERS
        if known_hosts:
            self._opts["known_hosts"] = os.path.expanduser(known_hosts)
        if user:
            self._opts["username"] = user
        if port:
            self._opts["port"] = port
        if identity:
            self._opts["client_keys"] = [os.path.expanduser(identity)]
        self._conn: Any = None
        self._sftp: Any = None
        self._home: str | None = None
        self._lt = _LoopThread.get()
        self._alock: asyncio.Lock | None = None

    async def _connection(self) -> Any:
        import asyncssh

        if self._alock is None:
            self._alock = asyncio.Lock()
        async with self._alock:
            if self._conn is None:
                try:
                    self._conn = await asyncssh.connect(self._host, **self._opts)
                except (OSError, asyncssh.Error) as e:
                    raise HostError(f"cannot reach {self.name}: {self._why(e)}") from None
                self._sftp = await self._conn.start_sftp_client()
            return self._conn

    def _why(self, e: BaseException) -> str:
        """What went wrong connecting, and what to do about it, in a few words."""
        import socket

        import asyncssh

        via = f"ssh -F {self._opts['config'][0]}" if "config" in self._opts else "ssh"
        if isinstance(e, asyncssh.HostKeyNotVerifiable):
            kh = self._opts.get("known_hosts", "~/.ssh/known_hosts")
            return (
                f"its host key is unknown or changed (known_hosts: {kh}); check the key with "
                f"`{via} {self.name}` and add it to {kh} if it is right"
            )
        if isinstance(e, asyncssh.PermissionDenied):
            return (
                "the server refused every key: check IdentityFile in the ssh config "
                "(or identity in the gpuctl config), or load a key with ssh-add"
            )
        if isinstance(e, socket.gaierror):
            return f"cannot resolve {self._host}: {e.strerror or e} (a HostName in the ssh config?)"
        if isinstance(e, TimeoutError | asyncio.TimeoutError):
            return f"no answer within {self._opts['connect_timeout']:g} s (node down? firewall?)"
        if isinstance(e, ConnectionRefusedError):
            return "the connection was refused (is sshd running there, on the configured port?)"
        if isinstance(e, FileNotFoundError):
            return f"cannot read {e.filename}: no such file (an IdentityFile or ssh config path?)"
        if isinstance(e, OSError):
            return e.strerror or str(e)
        if isinstance(e, asyncssh.DisconnectError):
            return f"the server disconnected: {e.reason}"
        return str(e) or type(e).__name__

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        try:
            return self._lt.call(coro, timeout)
        except HostError:
            raise
        except Exception as e:
            import asyncssh

            if isinstance(e, (asyncssh.Error, OSError)):
                self._drop()
                raise HostError(f"{self.name}: {e}") from e
            raise

    def _drop(self) -> None:
        conn, self._conn, self._sftp = self._conn, None, None
        if conn is not None:
            self._lt.loop.call_soon_threadsafe(conn.close)

    def run(
        self, argv: Sequence[str], *, timeout: float = 120, stdin: bytes | None = None
    ) -> tuple[int, bytes, bytes]:
        async def go() -> tuple[int, bytes, bytes]:
            conn = await self._connection()
            r = await conn.run(
                shlex.join(argv), input=stdin, encoding=None, check=False, timeout=timeout
            )
            return (
                int(r.exit_status if r.exit_status is not None else 255),
                bytes(r.stdout or b""),
                bytes(r.stderr or b""),
            )

        return self._call(go())

    def start_detached(self, argv: Sequence[str], log: str) -> int | None:
        # setsid: the supervisor outlives this SSH session (and gpuctl); echo $! gives its pid.
        # A missing interpreter would only show in the log after the job is "lost": say it now.
        check = f"command -v {shlex.quote(argv[0])} >/dev/null 2>&1 || exit 127"
        cmd = f"{check}; setsid {shlex.join(argv)} < /dev/null >> {shlex.quote(log)} 2>&1 & echo $!"
        rc, out, err = self.run(["/bin/sh", "-c", cmd], timeout=60)
        if rc == 127:
            raise HostError(
                f"{self.name}: no python at {argv[0]!r} for the job supervisor: set python = "
                '"/path/to/python3" for this node in the gpuctl config (or --supervisor-python)'
            )
        if rc != 0:
            raise HostError(f"{self.name}: starting the supervisor failed: {err.decode()[-500:]}")
        try:
            return int(out.decode().strip().splitlines()[-1])
        except (ValueError, IndexError):
            return None

    async def _sftp_client(self) -> Any:
        await self._connection()
        return self._sftp

    def write_bytes(self, path: str, data: bytes, mode: int = 0o600) -> None:
        async def go() -> None:
            sftp = await self._sftp_client()
            tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
            import asyncssh

            attrs = asyncssh.SFTPAttrs(permissions=mode)
            async with sftp.open(tmp, "wb", attrs) as f:
                await f.write(data)
            await sftp.posix_rename(tmp, path)

        self._call(go())

    def open_atomic(self, path: str, mode: int = 0o600) -> AtomicWriter:
        return _SftpWriter(self, path, mode)

    def put_file(self, local: str, path: str, mode: int = 0o600) -> None:
        async def go() -> None:
            sftp = await self._sftp_client()
            tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
            await sftp.put(local, tmp, max_requests=128)
            await sftp.chmod(tmp, mode)
            await sftp.posix_rename(tmp, path)

        self._call(go())

    def read_bytes(self, path: str, offset: int = 0) -> bytes | None:
        async def go() -> bytes | None:
            import asyncssh

            sftp = await self._sftp_client()
            try:
                async with sftp.open(path, "rb") as f:
                    if offset:
                        await f.seek(offset)
                    return bytes(await f.read())
            except asyncssh.SFTPNoSuchFile:
                return None

        return self._call(go())

    def get_file(self, path: str, local: str) -> None:
        async def go() -> None:
            sftp = await self._sftp_client()
            await sftp.get(path, local, max_requests=128)

        self._call(go())

    def exists(self, path: str) -> bool:
        async def go() -> bool:
            sftp = await self._sftp_client()
            return bool(await sftp.exists(path))

        return self._call(go())

    def mkdir(self, path: str, mode: int = 0o700) -> None:
        async def go() -> None:
            import asyncssh

            sftp = await self._sftp_client()
            private = asyncssh.SFTPAttrs(permissions=0o700)  # parents gpuctl creates, too
            await sftp.makedirs(os.path.dirname(path), attrs=private, exist_ok=True)
            with contextlib.suppress(asyncssh.SFTPFailure):
                await sftp.mkdir(path, asyncssh.SFTPAttrs(permissions=mode))
            await sftp.chmod(path, mode)

        self._call(go())

    def home(self) -> str:
        if self._home is None:

            async def go() -> str:
                sftp = await self._sftp_client()
                return str(await sftp.realpath("."))

            self._home = self._call(go())
        return self._home

    def close(self) -> None:
        self._drop()
