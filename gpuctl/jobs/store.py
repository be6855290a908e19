"""The job store: one SQLite file in gpuctl's state folder, so jobs outlive the gpuctl process.

``jobs.sqlite`` under ``gpuctl.paths.state_dir()``. Each row keeps what is needed to find
the job again after a restart: the target, the backend description (kind, node, Slurm job id,
supervisor pid), the job folder on that host, and, once finished, the state and classification.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from gpuctl import paths
from gpuctl.core import wire
from gpuctl.jobs.records import BackendInfo, Heartbeat, ReportDict

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack from Python 3.11

# "preparing": the row is written, the job folder is being written (nothing runs yet);
# "unreachable": the node did not answer the last time gpuctl looked (the job may still run)
STATES = (
    "preparing",
    "submitted",
    "pending",
    "running",
    "unreachable",
    "done",
    "failed",
    "cancelled",
)
FINAL_STATES = ("done", "failed", "cancelled")
# Shown, never stored: a map's chunk that ran to its end with some of its items failed (its row:
# "done", kind "items_failed"). ``shown_state`` is the one place that says so, for the CLI and
# for ``Job.state``.
PARTIAL = "partial"
ITEMS_FAILED = "items_failed"


def shown_state(state: str, kind: str | None) -> str:
    """A row's (or a Job's) state as gpuctl shows it: ``PARTIAL`` for a done chunk with failed
    items, else ``state``."""
    return PARTIAL if state == "done" and kind == ITEMS_FAILED else state


# What a row's state may become: the one place it is enforced is ``JobStore.update`` (in the same
# transaction that reads the row). A final state is final: nothing brings a job that ended back
# to life, so a later look that knows less (a job that never started reads as "pending") cannot
# undo it; writing the same final state again (a fresher report) is allowed. Nothing goes back to
# "preparing", and a job seen running is not "submitted" again ("pending" is: Slurm requeued it).
_AHEAD = frozenset(FINAL_STATES)
TRANSITIONS: dict[str, frozenset[str]] = {
    "preparing": _AHEAD | {"submitted", "pending"},
    "submitted": _AHEAD | {"pending", "running", "unreachable"},
    "pending": _AHEAD | {"submitted", "running", "unreachable"},
    "running": _AHEAD | {"pending", "unreachable"},
    "unreachable": _AHEAD | {"submitted", "pending", "running"},
    "done": frozenset(),
    "failed": frozenset(),
    "cancelled": frozenset(),
}


def allowed(old: str, new: str) -> bool:
    """True when a row in state ``old`` may be written as ``new`` (the same state always may)."""
    return old == new or new in TRANSITIONS.get(old, frozenset())


_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    target TEXT NOT NULL,
    backend TEXT NOT NULL,
    jobdir TEXT NOT NULL,
    state TEXT NOT NULL,
    kind TEXT,
    summary TEXT,
    created_at REAL NOT NULL,
    started_at REAL,
    ended_at REAL,
    report TEXT,
    heartbeat TEXT,
    threads INTEGER
);
CREATE INDEX IF NOT EXISTS jobs_created ON jobs(created_at);
"""


_COLUMNS = (
    "state",
    "kind",
    "summary",
    "started_at",
    "ended_at",
    "report",
    "backend",
    "heartbeat",
    "threads",
)
_JSON_COLUMNS = ("report", "backend", "heartbeat")


class JobUpdate(TypedDict, total=False):
    """The columns ``JobStore.update`` sets (None clears one)."""

    state: str
    kind: str | None
    summary: str | None
    started_at: float | None
    ended_at: float | None
    report: ReportDict | None
    backend: BackendInfo
    heartbeat: Heartbeat | None
    threads: int | None


@dataclass
class JobRecord:
    """One stored job. ``backend`` is the JSON-able description used to reattach."""

    id: str
    name: str
    target: str
    backend: BackendInfo
    jobdir: str
    state: str
    created_at: float
    kind: str | None = None
    summary: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    report: ReportDict | None = field(default=None)
    # the supervisor's last heartbeat gpuctl read (t, elapsed_s, rss_kb): what a report can say
    # of a job whose node no longer answers, even from a gpuctl started after it went away
    heartbeat: Heartbeat | None = field(default=None)
    # the threads its math libraries started by default (OMP_NUM_THREADS, else its CPUs)
    threads: int | None = None

    @property
    def tasks(self) -> int:
        """How many tasks (ranks) the job runs: 1, or Slurm's nodes x tasks_per_node."""
        return int((self.backend.get("handle") or {}).get("tasks") or 1)

    @property
    def duration(self) -> float | None:
        """Seconds from start (or creation) to end, or to now while running."""
        start = self.started_at or self.created_at
        end = self.ended_at or (None if self.state in FINAL_STATES else time.time())
        return None if end is None else max(0.0, end - start)


class StoreError(Exception):
    """The job store cannot be read or written; the message is one line saying what to do."""


class JobNotFound(LookupError):
    """No job has this id or id prefix, or several do; ``str`` is one line that says which."""


def store_path(folder: Path | None = None) -> Path:
    """The job store's file in ``folder`` (None: ``gpuctl.paths.state_dir()``), the folder made
    (private) when it is not there; StoreError (one line) when it cannot be."""
    folder = paths.state_dir() if folder is None else folder
    try:
        return paths.private_dir(folder) / paths.JOBS_DB
    except OSError as e:
        raise StoreError(
            f"cannot make gpuctl's state folder {folder}: "
            f"{e.strerror or e} (set GPUCTL_STATE_DIR to a folder you can write)"
        ) from None


class JobStore:
    """SQLite-backed list of jobs; safe to share between threads of one process.

    Raises ``StoreError`` (one line: which file, what is wrong, what to do) when the file is not
    a job store or cannot be read or written; never a raw ``sqlite3`` error.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        """Open (make, or bring up to date) the store at ``path``, else ``store_path()``'s.
        A session opens it once: ``gpuctl.context.Context.job_store``."""
        self.path = Path(path) if path is not None else store_path()
        self._lock = threading.Lock()
        with self._db() as db:
            db.executescript(_SCHEMA)
            columns = {row[1] for row in db.execute("PRAGMA table_info(jobs)")}
            for name, sql_type in (("heartbeat", "TEXT"), ("threads", "INTEGER")):
                if name in columns:
                    continue
                try:  # a store written by an older gpuctl
                    db.execute(f"ALTER TABLE jobs ADD COLUMN {name} {sql_type}")
                except sqlite3.OperationalError as e:  # another gpuctl added it just now
                    if "duplicate column" not in str(e):
                        raise

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                db = sqlite3.connect(self.path, timeout=30)
                try:
                    with db:
                        yield db
                finally:
                    db.close()
            except sqlite3.DatabaseError as e:
                raise StoreError(self._why(e)) from None

    def _why(self, e: sqlite3.Error) -> str:
        text = str(e)
        if "readonly" in text or "read-only" in text:
            return (
                f"the job store {self.path} cannot be written ({text}): make it writable, or "
                "set GPUCTL_STATE_DIR to a folder you can write"
            )
        if "unable to open" in text:
            return f"the job store {self.path} cannot be opened ({text}): check its folder"
        return (
            f"the job store {self.path} is damaged ({text}): move it away "
            f"(mv {self.path} {self.path}.bad) and gpuctl starts a new one; jobs it listed "
            "keep running, their folders stay where they are"
        )

    def add(self, rec: JobRecord) -> None:
        with self._db() as db:
            db.execute(
                "INSERT INTO jobs (id, name, target, backend, jobdir, state, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    rec.id,
                    rec.name,
                    rec.target,
                    json.dumps(rec.backend),
                    rec.jobdir,
                    rec.state,
                    rec.created_at,
                ),
            )

    def delete(self, job_id: str) -> None:
        """Remove one job's row (a job that never came to exist)."""
        with self._db() as db:
            db.execute("DELETE FROM jobs WHERE id = ?", (job_id,))

    def update(
        self, job_id: str, *, only_from: Sequence[str] = STATES, **values: Unpack[JobUpdate]
    ) -> bool:
        """Set columns of one job (``backend``, ``report`` and ``heartbeat`` stored as JSON).

        An update that sets ``state`` is applied only when ``TRANSITIONS`` allows the row's
        state to become it, and the row is in one of ``only_from``; else none of it is (False):
        what ended stays as it ended. True when applied (also for a row that is not there)."""
        if not values:
            return True
        cols = []
        args: list[object] = []
        for k, v in values.items():
            if k not in _COLUMNS:
                raise ValueError(f"unknown column {k}")
            cols.append(f"{k} = ?")
            args.append(json.dumps(v) if k in _JSON_COLUMNS and v is not None else v)
        where: list[object] = [job_id]
        sql = f"UPDATE jobs SET {', '.join(cols)} WHERE id = ?"
        new = values.get("state")
        if new is not None:  # one statement: no other writer comes between the look and the write
            old = [s for s in STATES if s in only_from and allowed(s, new)]
            sql += f" AND state IN ({', '.join('?' * len(old))})"
            where += old
        with self._db() as db:
            if db.execute(sql, (*args, *where)).rowcount or new is None:
                return True
            return db.execute("SELECT 1 FROM jobs WHERE id = ?", (job_id,)).fetchone() is None

    def get(self, job_id: str) -> JobRecord | None:
        """The job with this id, or with this unique id prefix; None when there is none."""
        with self._db() as db:
            rows = db.execute(
                "SELECT * FROM jobs WHERE id = ? OR id LIKE ? LIMIT 2",
                (job_id, job_id.replace("%", "").replace("_", "") + "%"),
            ).fetchall()
            names = [d[0] for d in db.execute("SELECT * FROM jobs LIMIT 0").description]
        exact = [r for r in rows if r[0] == job_id]
        if exact:
            rows = exact
        if len(rows) != 1:
            return None
        return _record(dict(zip(names, rows[0], strict=True)))

    def find(self, job_id: str) -> JobRecord:
        """The job with this id or unique id prefix; ``JobNotFound`` (one line naming the
        candidates of an ambiguous prefix) otherwise."""
        rec = self.get(job_id) if job_id else None
        if rec is not None:
            return rec
        with self._db() as db:
            query = "FROM jobs WHERE substr(id, 1, ?) = ?"
            (count,) = db.execute(f"SELECT COUNT(*) {query}", (len(job_id), job_id)).fetchone()
            same = [
                r[0][:12]
                for r in db.execute(f"SELECT id {query} ORDER BY id LIMIT 4", (len(job_id), job_id))
            ]
        if count > 1:
            shown = ", ".join(same) + (", ..." if count > len(same) else "")
            raise JobNotFound(
                f"job id {job_id!r} is ambiguous ({count} jobs: {shown}): give more of it"
            )
        raise JobNotFound(f"no job {job_id!r}: see gpuctl jobs for the ids")

    def list(self, limit: int = 100) -> list[JobRecord]:
        """Newest first."""
        with self._db() as db:
            cur = db.execute("SELECT * FROM jobs ORDER BY created_at DESC LIMIT ?", (limit,))
            names = [d[0] for d in cur.description]
            rows = cur.fetchall()
        return [_record(dict(zip(names, r, strict=True))) for r in rows]


def _record(row: Mapping[str, Any]) -> JobRecord:
    """A row as a JobRecord; its JSON columns are read field by field (``gpuctl.jobs.records``):
    a heartbeat came from a node, and a row may be older than this gpuctl."""
    return JobRecord(
        id=row["id"],
        name=row["name"],
        target=row["target"],
        backend=wire.parse(BackendInfo, json.loads(row["backend"])) or {},
        jobdir=row["jobdir"],
        state=row["state"],
        created_at=row["created_at"],
        kind=row["kind"],
        summary=row["summary"],
        started_at=row["started_at"],
        ended_at=row["ended_at"],
        report=wire.parse(ReportDict, json.loads(row["report"])) if row["report"] else None,
        heartbeat=(
            wire.parse(Heartbeat, json.loads(row["heartbeat"])) if row.get("heartbeat") else None
        ),
        threads=row.get("threads"),
    )
