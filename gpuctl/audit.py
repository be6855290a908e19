"""The audit log: every action that changes a node, one JSON line each (who, when, where, what,
and how it ended), appended and never rewritten; read back by ``gpuctl audit``.

What is written: stress started and stopped (from the screen, ``gpuctl stress`` or the Python
API), a GPU process signalled, an acceptance run launched, a Slurm node drained or resumed. An
action that read-only mode refused is written too (``refused``), as is one that failed.

Where: ``<state>/audit.jsonl`` (``gpuctl.paths.state_dir``), mode 0600, or the file the config's
top-level ``audit_log`` names, a place the site's admins share (``/shared/gpuctl/audit.jsonl``:
they create it with the mode they want; gpuctl only appends to it, and makes it 0644 if it
creates it). Each line is written with one ``write`` to a file opened ``O_APPEND``, at most
``LINE_LIMIT`` bytes, so lines of several sessions never mix (``gpuctl.appendlog``). gpuctl's
own file is bounded: past ``MAX_BYTES`` it moves to ``audit.jsonl.1`` (the one before is
dropped); a shared file is the site's to rotate.

Writing the log never stops an action: a write that fails is said once in gpuctl's own log.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ParamSpec, TypeVar

from gpuctl import appendlog, paths

log = logging.getLogger("gpuctl.audit")

AUDIT_FILE = "audit.jsonl"
MAX_BYTES = 8 * 1024 * 1024  # gpuctl's own file; then one rotated file beside it
LINE_LIMIT = appendlog.LINE_LIMIT  # one write is one line whatever else appends
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

_warned = False
_kept = True  # keep(False): this process writes no entries


def keep(on: bool) -> None:
    """Whether this process writes its entries to the log. ``gpuctl demo`` turns it off: what
    is done to a simulated cluster is no record of what was done to nodes, and others' screens
    would say it (``bob@login2 started a burn on sim-01 GPU 6``)."""
    global _kept
    _kept = on


@dataclass(frozen=True)
class Entry:
    """One action: ``at`` (Unix time), ``user`` and ``login`` (who, from which login host),
    ``session`` (that gpuctl's id, as burns carry it), ``action`` (one of ``ACTIONS``), ``node``,
    ``target`` (its GPUs, a pid, ...), ``outcome`` (``ok``, ``refused: ...``, ``failed: ...``,
    ``cancelled`` or ``interrupted``: stopped by its caller or Ctrl-C)."""

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
    if not _kept:
        return entry
    shared = configured_path()
    path = shared or paths.state_dir() / AUDIT_FILE
    try:
        own = shared is None
        if own:
            appendlog.rotate(path, MAX_BYTES)
        appendlog.append(path, entry.line(), own=own)
    except OSError as e:
        global _warned
        if not _warned:
            _warned = True
            log.warning("the audit log %s cannot be written: %s", path, e)
    return entry


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
    except (asyncio.CancelledError, KeyboardInterrupt) as e:
        # not a failure of the action: its caller stopped it (another pair failed, Ctrl-C)
        record(
            name,
            node,
            target,
            "cancelled" if isinstance(e, asyncio.CancelledError) else "interrupted",
        )
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
        for line in appendlog.read_lines(p) or ():
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


def follow(path: Path) -> appendlog.Follow[Entry]:
    """The entries others append to the log at ``path`` from now on (``appendlog.Follow``)."""
    return appendlog.Follow(path, Entry.parse)
