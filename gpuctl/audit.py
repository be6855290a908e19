"""The audit log: every action that changes a node, one JSON line each (who, when, where, what,
and how it ended), appended and never rewritten; read back by ``gpuctl audit``.

What is written: stress started and stopped (from the screen, ``gpuctl stress`` or the Python
API), a GPU process signalled, an acceptance run launched, a Slurm node drained or resumed. An
action that read-only mode refused is written too (``refused``), as is one that failed.

Where: ``<state>/audit.jsonl`` (``gpuctl.paths.state_dir``), mode 0600, or the file the config's
top-level ``audit_log`` names, a place the site's admins share (``/shared/gpuctl/audit.jsonl``:
they create it with the mode they want; gpuctl only appends to it, and makes it 0644 if it
creates it). Each line is written with one ``write`` to a file opened ``O_APPEND``, at most
``LINE_LIMIT`` bytes, so lines of several sessions never mix. gpuctl's own file is bounded: past
``MAX_BYTES`` it moves to ``audit.jsonl.1`` (the one before is dropped); a shared file is the
site's to rotate.

Writing the log never stops an action: a write that fails is said once in gpuctl's own log.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ParamSpec, TypeVar

from gpuctl import paths

log = logging.getLogger("gpuctl.audit")

AUDIT_FILE = "audit.jsonl"
MAX_BYTES = 8 * 1024 * 1024  # gpuctl's own file; then one rotated file beside it
LINE_LIMIT = 4000  # bytes: below PIPE_BUF, so one write is one line whatever else appends
FIELD_LIMIT = 500  # characters of a target or an outcome's words

ACTIONS = (
    "stress_start",
    "stress_stop",
    "signal",
    "accept",
    "drain",
    "resume",
)

WORDS = {
    "stress_start": "started a burn on",
    "stress_stop": "stopped the burns on",
    "signal": "signalled a process on",
    "accept": "launched acceptance on",
    "drain": "drained",
    "resume": "resumed",
}

MAX_READ = 64 * 1024 * 1024  # bytes read from the end of a log (a shared one can be large)
FOLLOW_READ = 1024 * 1024  # bytes a follower reads at one look; more was written: it skips ahead
_warned = False


@dataclass(frozen=True)
class Entry:
    """One action: ``at`` (Unix time), ``user`` and ``login`` (who, from which login host),
    ``session`` (that gpuctl's id, as burns carry it), ``action`` (one of ``ACTIONS``), ``node``,
    ``target`` (its GPUs, a pid, ...), ``outcome`` (``ok``, ``refused: ...``, ``failed: ...``)."""

    at: float
    user: str
    login: str
    session: str
    action: str
    node: str
    target: str
    outcome: str

    def words(self) -> str:
        """One sentence for a person: ``bob@login2 started a burn on node3 GPU 0,1`` (and how
        it ended when it did not end well)."""
        verb = WORDS.get(self.action, self.action)
        text = f"{self.user}@{self.login} {verb} {self.node}"
        if self.target:
            text += f" {self.target}" if self.action != "drain" else f" ({self.target})"
        if self.outcome != "ok":
            text += f": {self.outcome}"
        return text

    def line(self) -> bytes:
        data = json.dumps(asdict(self), ensure_ascii=True, separators=(",", ":")) + "\n"
        return data.encode()

    @classmethod
    def parse(cls, line: str) -> Entry | None:
        """One line of the log, or None for anything that is not an entry."""
        try:
            d = json.loads(line)
        except ValueError:
            return None
        if not isinstance(d, dict):
            return None
        try:
            at = float(d["at"])
            fields = {k: d[k] for k in cls.__dataclass_fields__ if k != "at"}
        except (KeyError, TypeError, ValueError):
            return None
        if not all(isinstance(v, str) for v in fields.values()):
            return None
        return cls(at=at, **fields)


def configured_path() -> Path | None:
    """The session's config's ``audit_log`` (a shared file), or None."""
    from gpuctl.config import ConfigError
    from gpuctl.context import current

    try:
        configured = current().config.audit_log
    except ConfigError:  # said where the config is used; the log falls back to the state folder
        return None
    return paths.expand(configured) if configured else None


def log_path() -> Path:
    """Where this session appends: the config's ``audit_log``, else ``<state>/audit.jsonl``."""
    return configured_path() or paths.state_dir() / AUDIT_FILE


def _cut(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= FIELD_LIMIT else text[: FIELD_LIMIT - 1] + "…"


def record(action: str, node: str, target: str, outcome: str = "ok") -> Entry:
    """Append one entry for ``action`` on ``node`` and return it (written or not)."""
    from gpuctl import service

    me = service.me()
    entry = Entry(
        at=round(time.time(), 6),
        user=me.user,
        login=me.host,
        session=me.session,
        action=action,
        node=_cut(node),
        target=_cut(target),
        outcome=_cut(outcome),
    )
    data = entry.line()[:LINE_LIMIT]
    shared = configured_path()
    path = shared or paths.state_dir() / AUDIT_FILE
    try:
        own = shared is None
        if own:
            paths.private_dir(path.parent)
            _rotate(path)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600 if own else 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    except OSError as e:
        global _warned
        if not _warned:
            _warned = True
            log.warning("the audit log %s cannot be written: %s", path, e)
    return entry


def _rotate(path: Path) -> None:
    with contextlib.suppress(OSError):
        if path.stat().st_size >= MAX_BYTES:
            os.replace(path, path.with_name(path.name + ".1"))


@contextlib.contextmanager
def action(name: str, node: str, target: str) -> Iterator[None]:
    """Around an action: its entry says ``ok``, ``refused: <why>`` (read-only mode) or
    ``failed: <the error's line>``; the error goes on to the caller."""
    from gpuctl.service import ReadOnlyError

    try:
        yield
    except ReadOnlyError as e:
        record(name, node, target, f"refused: {e}")
        raise
    except BaseException as e:
        words = str(e).splitlines()[0] if str(e) else type(e).__name__
        record(name, node, target, f"failed: {words}")
        raise
    record(name, node, target, "ok")


P = ParamSpec("P")
R = TypeVar("R")
# What an audited call is: (action, node, target) from the call's arguments by name.
Describe = Callable[[inspect.BoundArguments], tuple[str, str, str]]


def _described(
    fn: Callable[..., object], describe: Describe
) -> Callable[..., tuple[str, str, str]]:
    sig = inspect.signature(fn)

    def what(*args: object, **kwargs: object) -> tuple[str, str, str]:
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        return describe(bound)

    return what


def audited(describe: Describe) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """A function that changes nodes writes its entry (``action`` around its call)."""

    def wrap(fn: Callable[P, R]) -> Callable[P, R]:
        what = _described(fn, describe)

        @functools.wraps(fn)
        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            with action(*what(*args, **kwargs)):
                return fn(*args, **kwargs)

        return call

    return wrap


def audited_async(
    describe: Describe,
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """``audited`` for a coroutine function: the entry is written when its call ends."""

    def wrap(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        what = _described(fn, describe)

        @functools.wraps(fn)
        async def call(*args: P.args, **kwargs: P.kwargs) -> R:
            with action(*what(*args, **kwargs)):
                return await fn(*args, **kwargs)

        return call

    return wrap


def gpus_text(gpus: object) -> str:
    """``GPU 0,3`` or ``all GPUs`` for a list of GPU indices (None: all)."""
    if gpus is None or gpus == "all":
        return "all GPUs"
    if isinstance(gpus, list | tuple):
        return "GPU " + ",".join(str(g) for g in gpus)
    return f"GPU {gpus}"


def nodes_text(nodes: object) -> str:
    """A hostlist of node names (or the one name given)."""
    if isinstance(nodes, str):
        return nodes
    try:
        import hostlist

        return str(hostlist.collect_hostlist([str(n) for n in nodes]))  # type: ignore[attr-defined]
    except Exception:
        return ",".join(str(n) for n in nodes) if isinstance(nodes, list | tuple) else str(nodes)


def read(
    path: Path | None = None, *, since: float | None = None, limit: int | None = None
) -> tuple[list[Entry], int]:
    """The entries of the log (and its rotated file), newest first: ``since`` (Unix time)
    keeps the later ones, ``limit`` the newest that many. Returns ``(entries, skipped)``, the
    count of lines that were not entries. Raises OSError when the log cannot be read; a log
    that does not exist yet has no entries."""
    path = path or log_path()
    entries: list[Entry] = []
    skipped = 0
    for p in (path.with_name(path.name + ".1"), path):
        try:
            with open(p, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                f.seek(max(0, size - MAX_READ))
                data = f.read(MAX_READ)
        except FileNotFoundError:
            continue
        lines = data.decode(errors="replace").splitlines()
        if size > MAX_READ and lines:
            lines = lines[1:]  # the first line read is cut
        for line in lines:
            if not line.strip():
                continue
            entry = Entry.parse(line)
            if entry is None:
                skipped += 1
            elif since is None or entry.at >= since:
                entries.append(entry)
    entries.sort(key=lambda e: e.at)  # stable: entries of the same instant keep the file's order
    entries.reverse()
    return (entries[:limit] if limit is not None else entries), skipped


class Follow:
    """The entries others append to the log while we look: each ``new()`` returns those written
    since the one before. The first call starts at the log's end (what was done before is for
    ``gpuctl audit``); a log made later is read from its start. When the log was rotated between
    two looks, the rest of the rotated file is read first. Raises nothing: a log that cannot be
    read has no new entries."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: tuple[int, int] | None = None  # (device, inode) of the file read
        self._offset: int | None = None  # None: not looked yet
        self._rest = b""  # a line still being written at the last look

    def new(self) -> list[Entry]:
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
            entry = Entry.parse(raw.decode(errors="replace"))
            if entry is not None:
                out.append(entry)
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
