"""The process view's rows, computed from a snapshot: no Textual, no I/O, easy to test.

One row per GPU process (a process on two GPUs is one row: its GPUs listed, its GPU memory
summed, its SM % the larger); with ``tree`` the launchers above them (the sample's ``parents``)
come in too, every process under its parent, siblings in the sort order (a subtree sorts by its
best process). Node strings stay raw here: the screen turns them into text with
``gpuctl.tui.text``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpuctl.core.format import GIB
from gpuctl.core.model import GpuProcess, GpuSample, NodeSnapshot

# sort keys in the order ``o`` cycles them, with their column titles
SORTS: tuple[tuple[str, str], ...] = (
    ("mem", "GPU memory"),
    ("sm", "SM %"),
    ("cpu", "%CPU"),
    ("rss", "RSS"),
    ("time", "time"),
    ("pid", "PID"),
    ("user", "user"),
    ("gpu", "GPU"),
)
SORT_TITLES = dict(SORTS)
# Larger first for these (the busiest on top); the others read best from small to large.
DESCENDING = {"mem", "sm", "cpu", "rss", "time"}


@dataclass(frozen=True, slots=True)
class ProcRow:
    """One line of the process view. ``gpu_process`` False: a launcher above GPU processes."""

    pid: int | None
    gpus: tuple[int, ...]
    user: str | None
    mem: int | None
    sm: float | None
    cpu: float | None
    rss: int | None
    started: float | None
    command: str | None
    ppid: int | None
    gpu_process: bool = True
    prefix: str = ""  # the tree's branch drawing before the command

    @property
    def key(self) -> str:
        return f"{'g' if self.gpu_process else 'p'}{self.pid}"

    def cells(self, now: float) -> tuple[str, ...]:
        """GPU, PID, user, GPU memory, SM %, %CPU, RSS, time, command (node strings raw)."""
        return (
            ",".join(map(str, self.gpus)) or "-",
            "?" if self.pid is None else str(self.pid),
            self.user or "?",
            fmt_gib(self.mem),
            "-" if self.sm is None else f"{self.sm:.0f}",
            "-" if self.cpu is None else f"{self.cpu:.0f}",
            fmt_gib(self.rss),
            "-" if self.started is None else fmt_elapsed(now - self.started),
            self.prefix + (self.command or "?"),
        )


COLUMNS = ("GPU", "PID", "USER", "GPU MEM", "SM%", "%CPU", "RSS", "TIME", "COMMAND")
COLUMN_KEYS = ("gpu", "pid", "user", "mem", "sm", "cpu", "rss", "time", "command")


def fmt_gib(n: int | None) -> str:
    if n is None:
        return "-"
    return f"{n / GIB:.1f}G" if n >= GIB // 10 else f"{n / (1 << 20):.0f}M"


def fmt_elapsed(seconds: float) -> str:
    """Elapsed time as ps shows it: ``MM:SS``, ``HH:MM:SS``, ``D-HH:MM:SS``."""
    s = max(0, int(seconds))
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{s:02d}"
    if hours:
        return f"{hours:02d}:{minutes:02d}:{s:02d}"
    return f"{minutes:02d}:{s:02d}"


def gpu_processes(snap: NodeSnapshot, gpu: int | None = None) -> list[ProcRow]:
    """The node's GPU processes (those of GPU ``gpu`` only, unless None), one row per pid."""
    merged: dict[int | None, list[tuple[GpuSample, GpuProcess]]] = {}
    for g in snap.gpus:
        if gpu is not None and g.index != gpu:
            continue
        for p in g.processes:
            merged.setdefault(p.pid, []).append((g, p))
    rows = []
    for pid, seen in merged.items():
        first = seen[0][1]
        mems = [p.mem for _, p in seen if p.mem is not None]
        sms = [p.sm for _, p in seen if p.sm is not None]
        rows.append(
            ProcRow(
                pid=pid,
                gpus=tuple(sorted({g.index for g, _ in seen})),
                user=first.user,
                mem=sum(mems) if mems else None,
                sm=max(sms) if sms else None,
                cpu=first.cpu,
                rss=first.rss,
                started=first.started,
                command=first.command,
                ppid=first.ppid,
            )
        )
    return rows


def matches(row: ProcRow, text: str) -> bool:
    """Whether ``text`` (any case) is part of the row's user or command line: the process
    view's ``/`` filter; an empty ``text`` matches every row."""
    needle = text.strip().casefold()
    if not needle:
        return True
    return needle in (row.user or "").casefold() or needle in (row.command or "").casefold()


def _sort_value(row: ProcRow, key: str, now: float) -> tuple[int, float | str]:
    """(0, value) to sort by, (1, 0) for an unknown value: unknowns last either way."""
    v: float | str | None
    if key == "time":
        v = None if row.started is None else now - row.started
    elif key == "user":
        v = row.user
    elif key == "gpu":
        v = row.gpus[0] if row.gpus else None
    else:
        v = getattr(row, key)
    return (1, 0) if v is None else (0, v)


Rank = Callable[[ProcRow], "tuple[int, float | str]"]


def _ordered(rows: Iterable[ProcRow], rank: Rank, descending: bool) -> list[ProcRow]:
    """``rows`` by ``rank`` (unknown values last, ties by pid)."""
    rows = list(rows)
    known = [r for r in rows if rank(r)[0] == 0]
    unknown = sorted((r for r in rows if rank(r)[0] != 0), key=lambda r: r.pid or 0)
    known.sort(key=lambda r: (rank(r)[1], -(r.pid or 0) if descending else r.pid or 0))
    if descending:
        known.reverse()
    return known + unknown


def process_rows(
    snap: NodeSnapshot,
    gpu: int | None = None,
    *,
    sort: str = "mem",
    reverse: bool = False,
    tree: bool = False,
    now: float = 0.0,
    only: str = "",
) -> list[ProcRow]:
    """The rows of the process view of ``snap`` (GPU ``gpu`` only, unless None), sorted by
    ``sort`` (one of ``SORTS``; larger first for the amounts, ``reverse`` flips it), as a tree of
    parent and child processes with ``tree``; only the GPU processes whose user or command
    holds ``only`` (``matches``; in a tree, with their launchers)."""
    if sort not in SORT_TITLES:
        raise ValueError(f"unknown sort key {sort!r}")
    rows = [r for r in gpu_processes(snap, gpu) if matches(r, only)]
    descending = (sort in DESCENDING) != reverse
    if not tree:
        return _ordered(rows, lambda r: _sort_value(r, sort, now), descending)
    by_pid: dict[int, ProcRow] = {r.pid: r for r in rows if r.pid is not None}
    for p in snap.parents:
        if p.pid is not None and p.pid not in by_pid:
            by_pid[p.pid] = ProcRow(
                p.pid, (), p.user, None, None, p.cpu, p.rss, p.started, p.command, p.ppid, False
            )
    children: dict[int | None, list[ProcRow]] = {}
    for r in by_pid.values():
        parent = r.ppid if r.ppid in by_pid and r.ppid != r.pid else None
        children.setdefault(parent, []).append(r)
    children.setdefault(None, []).extend(r for r in rows if r.pid is None)
    # A subtree sorts by its best GPU process; a launcher with no GPU process below is dropped.
    best: dict[int | None, tuple[int, float | str] | None] = {}

    def subtree_best(r: ProcRow, depth: int = 0) -> tuple[int, float | str] | None:
        if r.pid in best:
            return best[r.pid]
        found = [_sort_value(r, sort, now)] if r.gpu_process else []
        if depth < 64:
            for c in children.get(r.pid, ()):
                b = subtree_best(c, depth + 1)
                if b is not None:
                    found.append(b)
        known = [f for f in found if f[0] == 0]
        pick = (max if descending else min)(known) if known else (found[0] if found else None)
        best[r.pid] = pick
        return pick

    out: list[ProcRow] = []
    placed: set[int | None] = set()

    def walk(parent: int | None, lead: str, depth: int) -> None:
        kids = [c for c in children.get(parent, ()) if subtree_best(c) is not None]
        kids = _ordered(kids, lambda r: subtree_best(r) or (1, 0), descending)
        for i, c in enumerate(kids):
            if c.pid in placed and c.pid is not None:
                continue  # a cycle in junk ppids
            placed.add(c.pid)
            last = i == len(kids) - 1
            branch = "" if parent is None else ("└─ " if last else "├─ ")
            out.append(_with_prefix(c, lead + branch))
            if c.pid is not None and depth < 64:
                walk(
                    c.pid, lead + ("" if parent is None else ("   " if last else "│  ")), depth + 1
                )

    walk(None, "", 0)
    # Processes in a cycle of ppids (junk from a node) have no root: list them at the top level.
    for r in _ordered(by_pid.values(), lambda r: _sort_value(r, sort, now), descending):
        if r.pid not in placed and r.gpu_process:
            placed.add(r.pid)
            out.append(r)
    return out


def _with_prefix(r: ProcRow, prefix: str) -> ProcRow:
    return ProcRow(
        r.pid,
        r.gpus,
        r.user,
        r.mem,
        r.sm,
        r.cpu,
        r.rss,
        r.started,
        r.command,
        r.ppid,
        r.gpu_process,
        prefix,
    )


def gpu_owners(g: GpuSample) -> str:
    """Who uses a GPU, for its row in the list: the user with the most GPU memory on it, and
    how many other users (``alice +1``); "" when no process is listed."""
    mem: dict[str, int] = {}
    for p in g.processes:
        user = p.user or "?"
        mem[user] = mem.get(user, 0) + (p.mem or 0)
    if not mem:
        return ""
    ranked = sorted(mem, key=lambda u: (-mem[u], u))
    return ranked[0] + (f" +{len(ranked) - 1}" if len(ranked) > 1 else "")
