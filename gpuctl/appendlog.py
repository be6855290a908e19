"""An append-only file of JSON lines on the login side (the audit log, the trouble log): how a
line is written and how the file is read back, in one place.

A line is written with one ``write`` to a file opened ``O_APPEND`` (at most ``LINE_LIMIT``
bytes: below PIPE_BUF), so the lines of several gpuctl sessions never mix. A file of gpuctl's
own is created 0600 in a private folder (``paths.private_dir``). With ``lock`` the write holds
a shared ``flock`` on the file and writes to the file the path names when it has the lock: a
log that is compacted (rewritten under an exclusive lock, then renamed over the path) loses no
line appended meanwhile.

Reading takes at most ``MAX_READ`` bytes from the end of a file (a shared one can be large); a
line cut there is dropped. ``Follow`` reads what is appended while a session runs (the screen
says what other sessions did), across a rotation.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Generic, TypeVar

from gpuctl import paths

LINE_LIMIT = 4000  # bytes: below PIPE_BUF, so one write is one line whatever else appends
MAX_READ = 64 * 1024 * 1024  # bytes read from the end of a log
FOLLOW_READ = 1024 * 1024  # bytes a follower reads at one look; more was written: it skips ahead
T = TypeVar("T")


def append(path: Path, data: bytes, *, own: bool = True, lock: bool = False) -> None:
    """Append ``data`` (one line, cut at ``LINE_LIMIT``) to ``path``. ``own``: a file of
    gpuctl's own (its folder made private, the file 0600), else a shared one (0644 when
    gpuctl creates it). Raises OSError."""
    data = data[:LINE_LIMIT]
    if own:
        paths.private_dir(path.parent)
    for _ in range(8):  # a compaction renamed a new file in: write to that one
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600 if own else 0o644)
        try:
            if lock and _lock(fd, fcntl.LOCK_SH):
                try:
                    same = os.fstat(fd).st_ino == os.stat(path).st_ino
                except FileNotFoundError:
                    same = False
                if not same:
                    continue
            os.write(fd, data)
            return
        finally:
            os.close(fd)
    raise OSError(f"{path} kept being replaced while a line was written")


def _lock(fd: int, how: int) -> bool:
    """``flock``; False where the file system refuses locks (an NFS mount without them): the
    log is then written unlocked, a line appended during a compaction may be lost."""
    try:
        fcntl.flock(fd, how)
    except OSError as e:
        if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
            return False
        raise
    return True


def rotate(path: Path, max_bytes: int) -> None:
    """Move ``path`` to ``path.1`` (dropping the one before) once it holds ``max_bytes``."""
    with contextlib.suppress(OSError):
        if path.stat().st_size >= max_bytes:
            os.replace(path, path.with_name(path.name + ".1"))


def read_lines(path: Path) -> list[str] | None:
    """The lines of ``path`` (the last ``MAX_READ`` bytes of it), None when it does not exist.
    Raises OSError when it cannot be read."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - MAX_READ))
            data = f.read(MAX_READ)
    except FileNotFoundError:
        return None
    lines = data.decode(errors="replace").splitlines()
    if size > MAX_READ and lines:
        lines = lines[1:]  # the first line read is cut
    return lines


@contextlib.contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created 0600 when missing): no ``append`` with
    ``lock`` writes meanwhile. Yields nothing; raises OSError."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        _lock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def replace(path: Path, data: bytes) -> None:
    """Write ``data`` to a new file beside ``path`` (0600) and rename it over ``path``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


class Follow(Generic[T]):
    """What others append to a log while we look, each line through ``parse`` (lines it gives
    None for are skipped): each ``new()`` returns those written since the one before. The first
    call starts at the log's end (what was written before is for the log's reader, ``gpuctl
    audit``); a log made later is read from its start. When the log was rotated between two
    looks, the rest of the rotated file is read first. Raises nothing: a log that cannot be
    read has nothing new."""

    def __init__(self, path: Path, parse: Callable[[str], T | None]) -> None:
        self.path = path
        self.parse = parse
        self._file: tuple[int, int] | None = None  # (device, inode) of the file read
        self._offset: int | None = None  # None: not looked yet
        self._rest = b""  # a line still being written at the last look

    def new(self) -> list[T]:
        try:
            st = os.stat(self.path)
        except OSError:
            if self._offset is None:
                self._file, self._offset = None, 0
            return []
        key = (st.st_dev, st.st_ino)
        if self._offset is None:  # the first look: start at the end
            self._file, self._offset = key, st.st_size
            return []
        data = b""
        if key != self._file:
            if self._file is not None:  # rotated: the rest of the file we were reading
                data = self._rest + self._read(
                    self.path.with_name(self.path.name + ".1"), self._file
                )
                if data and not data.endswith(b"\n"):
                    data += b"\n"
            self._file, self._offset, self._rest = key, 0, b""
        elif st.st_size < self._offset:  # cut short by hand: start again
            self._offset, self._rest = 0, b""
        if st.st_size > self._offset:
            data += self._read(self.path, key)
        lines = (self._rest + data).split(b"\n")
        self._rest = lines.pop()
        out = []
        for raw in lines:
            item = self.parse(raw.decode(errors="replace"))
            if item is not None:
                out.append(item)
        return out

    def _read(self, path: Path, key: tuple[int, int]) -> bytes:
        """What ``path`` holds past the offset, when it is the file ``key`` names."""
        assert self._offset is not None
        try:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                if (st.st_dev, st.st_ino) != key:
                    return b""
                if st.st_size - self._offset > FOLLOW_READ:  # a flood: the newest only
                    self._offset, self._rest = st.st_size - FOLLOW_READ, b""
                    f.seek(self._offset)
                    f.readline()  # the first line read is cut
                else:
                    f.seek(self._offset)
                data = f.read(FOLLOW_READ)
                self._offset = f.tell()
                return data
        except OSError:
            return b""
