"""The trouble log: what went wrong on the fleet kept as a log, not only as the state of now.

Every XID, thermal or hardware throttle (its start and its end), new uncorrected ECC errors or
row remapping, a rise of corrected ECC counts (``_corrected_seen``: not a fault, kept quiet),
lost GPU, unreachable node and failed acceptance run becomes a ``Trouble``: its
node and GPU, its kind (``KINDS``) and subject (the XID number, the throttle reason), when it
was first and last seen, how many times it happened, whether it is still going (``active``,
``ended``), the facts that name it (``detail``) and its evidence: the GPU's readings at its
first and at its latest occurrence, with the range of temperature, power and SM clock over the
last samples before it. The power cap is left out: at full load it comes and goes every few
seconds (the weather, as the detail screen folds it, not news).

Folding: an occurrence of the same kind and subject on the same GPU (or node) within
``FOLD_WINDOW_S`` of the last one, while that one is not acknowledged, updates its last seen and
count instead of adding a row; one that goes on (a throttle still on, a node still down, the
same ECC counts seen again after a restart) only moves last seen. An operator acknowledges a
row with a note (``ack``); the next occurrence after that is a new row.

The file: ``<state>/events.jsonl`` (``paths.EVENTS``), JSON lines appended through
``gpuctl.appendlog`` (one write a line, 0600): a row as it stands (``{"row": ...}``, written
when it starts and at most every ``FLUSH_S`` while it changes) or an acknowledgement
(``{"ack": id, ...}``, written at once: ``gpuctl events ack`` in another process included).
Read back, the last line of a row wins and an acknowledgement is never undone. Bounded: past
``MAX_BYTES`` the file is compacted (rewritten under an exclusive lock, one line a row), rows
not seen for ``MAX_AGE_S`` dropped and at most ``MAX_ROWS`` of the newest kept. Two sessions
watching the same nodes keep a row each.

Who feeds it: ``watch(fleet)``, the fleet's events (its throttle starts and ends among them) and
snapshots. The words of each row are the screen's (``gpuctl.tui.view.trouble_event``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuctl import appendlog, paths
from gpuctl.core.format import QUIET_THROTTLE, THROTTLE_BADGES
from gpuctl.core.model import GpuSample, NodeEvent, NodeSnapshot, NodeState

if TYPE_CHECKING:
    from gpuctl.fleet.fleet import Fleet

log = logging.getLogger(__name__)

KINDS = ("xid", "gpu_lost", "throttle", "ecc", "ecc_corrected", "remap", "unreachable", "accept")
# a row's states (``Trouble.state``) and ``unacked`` (any but acked): what ``gpuctl events
# --state`` takes
STATES = ("active", "ended", "open", "acked", "unacked")
FOLD_WINDOW_S = 24 * 3600.0
FLUSH_S = 10.0  # a changing row is written at most this often (a new one at once)
MAX_BYTES = 2 * 1024 * 1024
MAX_ROWS = 2000
MAX_AGE_S = 30 * 86400.0
TEXT_LIMIT = 300  # characters of a node's text kept in a row (a reason, a failure)
EVIDENCE_SAMPLES = 30  # the samples before an occurrence whose range the evidence keeps
READINGS = (
    "temp",
    "power",
    "power_limit",
    "sm_clock",
    "mem_clock",
    "util_gpu",
    "util_mem",
    "mem_used",
    "mem_total",
    "fan",
    "pstate",
)
RANGES = {"temp": "temp", "power": "power", "sm_clock": "clock"}  # reading: history column
# Kinds that go on until they end: while one is active, its starting again only moves last seen.
LASTING = ("throttle", "gpu_lost", "unreachable")
ACCEPT_FAILED = ("FAIL", "ERROR")
ECC_COUNTS = ("volatile_uncorrected", "aggregate_uncorrected")
CORRECTED_COUNTS = ("volatile_corrected", "aggregate_corrected")
_NO_CORRECTED = (None, None)  # neither of ``CORRECTED_COUNTS`` reported
REMAP_COUNTS = ("pending", "failure", "uncorrectable", "correctable")


@dataclass
class Trouble:
    """One row of the trouble log (see the module's docstring)."""

    id: str
    node: str
    gpu: int | None
    kind: str
    subject: str
    first: float
    last: float
    count: int = 1
    active: bool = False
    ended: float | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    evidence: dict[str, Any] = field(default_factory=dict)
    first_evidence: dict[str, Any] = field(default_factory=dict)
    acked: float | None = None
    ack_by: str = ""
    ack_note: str = ""
    rev: int = 0  # changes of the row by the session that keeps it: the newest line wins

    @property
    def key(self) -> tuple[str, int | None, str, str]:
        return (self.node, self.gpu, self.kind, self.subject)

    @property
    def state(self) -> str:
        """``acked``, ``active`` (still going), ``ended`` or ``open`` (over, its end unknown)."""
        if self.acked is not None:
            return "acked"
        if self.active:
            return "active"
        return "ended" if self.ended is not None else "open"

    def in_state(self, name: str) -> bool:
        """Whether the row is in state ``name`` (one of ``STATES``): its ``state``, or
        ``unacked`` for any of active, ended and open."""
        return self.acked is None if name == "unacked" else self.state == name

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def parse(cls, d: object) -> Trouble | None:
        """A row as the file holds it, None for anything else (a broken line, a field of
        another type)."""
        if not isinstance(d, dict):
            return None
        try:
            row = cls(
                id=_str(d["id"]),
                node=_str(d["node"]),
                gpu=None if d.get("gpu") is None else _int(d["gpu"]),
                kind=_str(d["kind"]),
                subject=_str(d.get("subject", "")),
                first=_num(d["first"]),
                last=_num(d["last"]),
                count=_int(d.get("count", 1)),
                active=bool(d.get("active", False)),
                ended=None if d.get("ended") is None else _num(d["ended"]),
                detail=_dict(d.get("detail", {})),
                evidence=_dict(d.get("evidence", {})),
                first_evidence=_dict(d.get("first_evidence", {})),
                acked=None if d.get("acked") is None else _num(d["acked"]),
                ack_by=_str(d.get("ack_by", "")),
                ack_note=_str(d.get("ack_note", "")),
                rev=_int(d.get("rev", 0)),
            )
        except (KeyError, TypeError, ValueError):
            return None
        return row if row.id and row.kind in KINDS else None


def _str(v: object) -> str:
    if not isinstance(v, str):
        raise TypeError
    return v


def _int(v: object) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise TypeError
    return v


def _num(v: object) -> float:
    if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v):
        raise TypeError
    return float(v)


def _dict(v: object) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise TypeError
    return v


def _cut(text: object) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= TEXT_LIMIT else text[: TEXT_LIMIT - 1] + "…"


def log_path() -> Path:
    """Where the trouble log lives: ``<state>/events.jsonl``."""
    return paths.state_dir() / paths.EVENTS


class TroubleLog:
    """The rows, in memory and (with a ``path``) in the file. ``path`` None: kept in memory
    only (the demo's simulated cluster)."""

    def __init__(
        self,
        path: Path | None,
        *,
        clock: Callable[[], float] = time.time,
        max_bytes: int = MAX_BYTES,
        max_rows: int = MAX_ROWS,
        max_age: float = MAX_AGE_S,
    ) -> None:
        self.path = path
        self.clock = clock
        self.max_bytes = max_bytes
        self.max_rows = max_rows
        self.max_age = max_age
        self.rows: dict[str, Trouble] = {}
        self.skipped = 0  # lines of the file that were not rows or acknowledgements
        self.version = 0  # moves on at every change (a screen repaints)
        self._latest: dict[tuple[str, int | None, str, str], str] = {}
        self._dirty: dict[str, float] = {}  # row id -> when it first changed unwritten
        self._read_at: tuple[int, int] = (0, 0)  # (inode, bytes) of the file read so far
        self._states: dict[str, NodeState] = {}
        self._counts: dict[tuple[str, int], tuple[object, ...]] = {}
        # the corrected ECC counts last seen per GPU: the first sight is the baseline, a rise
        # from it an occurrence (``_corrected_seen``)
        self._corrected: dict[tuple[str, int], tuple[object, ...]] = {}
        # rows whose evidence comes from the node's next snapshot (``_fill``), per node
        self._wanting: dict[str, set[str]] = {}
        self._settled: set[str] = set()  # nodes whose rows of earlier sessions were checked
        self._lost: dict[str, set[int]] = {}  # the GPUs lost now, per node
        self._fleet: Fleet | None = None
        self._warned = False
        self.error: OSError | None = None  # the last read or write that failed
        self.listeners: list[Callable[[Trouble], None]] = []

    # -- the file ---------------------------------------------------------------------------
    @classmethod
    def open(cls, path: Path | None = None, **kwargs: Any) -> TroubleLog:
        """The log of ``path`` (default ``log_path()``), read. Raises OSError when it cannot be
        read; a file that does not exist yet holds no rows."""
        found = cls(path or log_path(), **kwargs)
        found.load()
        return found

    def load(self) -> None:
        """Read the whole file again (what another session wrote included): a row read that
        is newer than the one kept (seen later, or more often) replaces it; an
        acknowledgement is never undone."""
        if self.path is None:
            return
        self.skipped = 0
        self._read_at = (0, 0)
        self._read_new()
        self._prune()
        self.version += 1

    def refresh(self) -> bool:
        """Read what other sessions appended since the last read (an acknowledgement from
        ``gpuctl events ack``); the whole file again after a compaction. True when something
        changed. A file that cannot be read is said once in gpuctl's log."""
        if self.path is None:
            return False
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        except OSError as e:
            self._warn("read", e)
            return False
        inode, done = self._read_at
        if st.st_ino == inode and st.st_size == done:
            return False
        before = self.version
        try:
            if st.st_ino != inode or st.st_size < done:
                self.load()
            else:
                self._read_new()
        except OSError as e:
            self._warn("read", e)
        return self.version != before

    def _read_new(self) -> None:
        assert self.path is not None
        inode, done = self._read_at
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                if st.st_ino != inode:
                    done = 0
                f.seek(done)
                data = f.read(appendlog.MAX_READ)
        except FileNotFoundError:
            return
        end = data.rfind(b"\n") + 1  # a line being written stays for the next read
        self._read_at = (st.st_ino, done + end)
        changed = False
        for line in data[:end].decode(errors="replace").splitlines():
            if line.strip():
                changed |= self._apply(line)
        if changed:
            self.version += 1

    def _apply(self, line: str) -> bool:
        try:
            d = json.loads(line)
        except ValueError:
            self.skipped += 1
            return False
        if not isinstance(d, dict):
            self.skipped += 1
            return False
        if "ack" in d:
            row = self.rows.get(d["ack"]) if isinstance(d["ack"], str) else None
            if row is None or row.acked is not None:
                return False
            try:
                row.acked = _num(d["at"])
                row.ack_by = _cut(_str(d.get("by", "")))
                row.ack_note = _cut(_str(d.get("note", "")))
            except (KeyError, TypeError):
                self.skipped += 1
                return False
            return True
        row = Trouble.parse(d.get("row"))
        if row is None:
            self.skipped += 1
            return False
        kept = self.rows.get(row.id)
        if kept is not None:
            acked_now = kept.acked is None and row.acked is not None
            if acked_now:
                kept.acked, kept.ack_by, kept.ack_note = row.acked, row.ack_by, row.ack_note
            if row.rev <= kept.rev:
                return acked_now  # as this session wrote it, or older: memory has it since
            if row.acked is None:
                row.acked, row.ack_by, row.ack_note = kept.acked, kept.ack_by, kept.ack_note
        self.rows[row.id] = row
        newest = self.rows.get(self._latest.get(row.key, ""))
        if newest is None or newest.first <= row.first:
            self._latest[row.key] = row.id
        return True

    def _append(self, data: bytes) -> None:
        if self.path is None:
            return
        try:
            appendlog.append(self.path, data, lock=True)
            if os.stat(self.path).st_size >= self.max_bytes:
                self.compact()
        except OSError as e:
            self._warn("written", e)

    def _warn(self, what: str, e: OSError) -> None:
        self.error = e
        if not self._warned:
            self._warned = True
            log.warning("the trouble log %s cannot be %s: %s", self.path, what, e)

    def compact(self) -> None:
        """Rewrite the file as one line a row (read afresh under the lock: other sessions'
        lines kept), the rows past ``max_age`` dropped and ``max_rows`` kept. Raises OSError."""
        if self.path is None:
            return
        with appendlog.exclusive(self.path):
            self.refresh()
            self._prune()
            rows = sorted(self.rows.values(), key=lambda r: r.last)
            lines = [self._line(r) for r in rows]
            while lines and sum(map(len, lines)) > self.max_bytes // 2:
                lines = lines[len(lines) // 4 + 1 :]  # the oldest quarter goes
            dropped = rows[: len(rows) - len(lines)]
            for r in dropped:
                self._forget(r)
            appendlog.replace(self.path, b"".join(lines))
            st = os.stat(self.path)
            self._read_at = (st.st_ino, st.st_size)
        self._dirty.clear()
        self.version += 1

    @staticmethod
    def _line(row: Trouble) -> bytes:
        """The row as one line of the file, within ``appendlog.LINE_LIMIT`` (a line cut there
        would be no row): the first evidence, then the evidence, then the detail's failures
        are left out of a row too long (a node's long failure words)."""
        d = row.to_json()
        for drop in (None, "first_evidence", "evidence", "detail"):
            if drop is not None:
                d[drop] = {"verdict": d["detail"].get("verdict")} if drop == "detail" else {}
            data = (_dumps({"row": d}) + "\n").encode()
            if len(data) <= appendlog.LINE_LIMIT:
                return data
        return data

    def _prune(self) -> None:
        now = self.clock()
        rows = sorted(self.rows.values(), key=lambda r: r.last, reverse=True)
        for i, r in enumerate(rows):
            if i >= self.max_rows or now - r.last > self.max_age:
                self._forget(r)

    def _forget(self, row: Trouble) -> None:
        self.rows.pop(row.id, None)
        self._dirty.pop(row.id, None)
        if self._latest.get(row.key) == row.id:
            del self._latest[row.key]

    def flush(self, *, force: bool = False) -> None:
        """Write the rows that changed (those waiting ``FLUSH_S`` at least, or all)."""
        now = time.monotonic()
        due = [i for i, at in self._dirty.items() if force or now - at >= FLUSH_S]
        for i in due:
            del self._dirty[i]
            row = self.rows.get(i)
            if row is not None and self.path is not None:
                try:
                    appendlog.append(self.path, self._line(row), lock=True)
                except OSError as e:
                    self._warn("written", e)
        if due and self.path is not None:
            try:
                if os.stat(self.path).st_size >= self.max_bytes:
                    self.compact()
            except OSError as e:
                self._warn("written", e)

    def tick(self) -> bool:
        """Once a second or so, from whoever runs the log (the screen): others' lines read,
        changed rows written when due. True when a row changed."""
        before = self.version
        self.refresh()
        self.flush()
        return self.version != before

    def close(self) -> None:
        """Write every changed row now; stop watching the fleet."""
        if self._fleet is not None:
            self._fleet.unsubscribe(self._on_event)
            self._fleet.unsubscribe(self._on_snapshot)
            self._fleet = None
        self.flush(force=True)

    # -- rows -------------------------------------------------------------------------------
    def note(
        self,
        node: str,
        gpu: int | None,
        kind: str,
        subject: str = "",
        *,
        t: float | None = None,
        detail: dict[str, Any] | None = None,
        evidence: dict[str, Any] | None = None,
        active: bool = False,
    ) -> Trouble:
        """An occurrence of trouble: a new row, or folded into the newest of its kind
        (see the module's docstring). Returns the row."""
        t = self.clock() if t is None else t
        detail = dict(detail or {})
        evidence = dict(evidence or {})
        key = (node, gpu, kind, subject)
        row = self.rows.get(self._latest.get(key, ""))
        if row is not None and row.acked is None and t - row.last <= FOLD_WINDOW_S:
            going = row.active and kind in LASTING
            same = kind in ("ecc", "remap") and detail == row.detail
            if not (going or same):
                row.count += 1
                row.evidence = evidence or row.evidence
            row.last = max(row.last, t)
            row.detail = detail or row.detail
            row.active = active
            if active:
                row.ended = None
            self._changed(row)
            return row
        row = Trouble(
            id=os.urandom(4).hex(),
            node=node,
            gpu=gpu,
            kind=kind,
            subject=subject,
            first=t,
            last=t,
            active=active,
            detail=detail,
            evidence=evidence,
            first_evidence=evidence,
        )
        self.rows[row.id] = row
        self._latest[key] = row.id
        if not evidence and gpu is not None and self._fleet is not None:
            self._wanting.setdefault(node, set()).add(row.id)  # no sample yet: the next one
        if len(self.rows) > self.max_rows:
            self._prune()
        self.version += 1
        self._append(self._line(row))
        for listener in self.listeners:
            listener(row)
        return row

    def end(self, node: str, gpu: int | None, kind: str, subject: str = "", t: float = 0.0) -> None:
        """The trouble of this kind that was going on there ended at ``t``."""
        row = self.rows.get(self._latest.get((node, gpu, kind, subject), ""))
        if row is not None and row.active:
            row.active = False
            row.ended = t or self.clock()
            row.last = max(row.last, row.ended)
            self._changed(row)

    def _changed(self, row: Trouble) -> None:
        row.rev += 1
        self._dirty.setdefault(row.id, time.monotonic())
        self.version += 1

    def find(self, ident: str) -> Trouble:
        """The row whose id is ``ident`` or starts with it. Raises KeyError (none) or
        ValueError (several)."""
        if ident in self.rows:
            return self.rows[ident]
        found = [r for i, r in self.rows.items() if ident and i.startswith(ident)]
        if not found:
            raise KeyError(ident)
        if len(found) > 1:
            raise ValueError(f"{ident!r} names {len(found)} events: give more of the id")
        return found[0]

    def ack(self, ident: str, note: str = "", by: str = "") -> Trouble:
        """Acknowledge a row (``find``'s ``ident``) with a note, written at once. Raises
        KeyError, ValueError (see ``find``)."""
        row = self.find(ident)
        self.error = None
        if row.acked is None:
            row.acked = self.clock()
            row.ack_by = _cut(by)
            row.ack_note = _cut(note)
            self.version += 1
            ack = {"ack": row.id, "at": row.acked, "by": row.ack_by, "note": row.ack_note}
            self._append((_dumps(ack) + "\n").encode())
        return row

    def newest(
        self,
        *,
        node: str | None = None,
        gpu: int | None = None,
        kind: str | None = None,
        acked: bool | None = None,
        since: float | None = None,
    ) -> list[Trouble]:
        """The rows, newest (last seen) first, those of ``node``, ``gpu``, ``kind``,
        acknowledged or not, seen since ``since`` (None: any)."""
        out = [
            r
            for r in self.rows.values()
            if (node is None or r.node == node)
            and (gpu is None or r.gpu == gpu)
            and (kind is None or r.kind == kind)
            and (acked is None or (r.acked is not None) == acked)
            and (since is None or r.last >= since)
        ]
        return sorted(out, key=lambda r: (r.last, r.first), reverse=True)

    def unacked(self) -> list[Trouble]:
        return self.newest(acked=False)

    # -- fed by a fleet ---------------------------------------------------------------------
    def watch(self, fleet: Fleet) -> None:
        """Keep the trouble of ``fleet`` from now on (its events and snapshots)."""
        self._fleet = fleet
        fleet.on_event(self._on_event)
        fleet.subscribe(self._on_snapshot)

    def _evidence(self, node: str, gpu: int | None) -> dict[str, Any]:
        """A GPU's readings now (its latest sample) and their range over the samples before."""
        fleet = self._fleet
        rt = None if fleet is None else fleet.nodes.get(node)
        if fleet is None or rt is None or gpu is None:
            return {}
        g = next((x for x in rt.snapshot.gpus if x.index == gpu), None)
        if g is None:
            return {}
        out = gpu_readings(g)
        history = fleet.history(node, gpu)
        for metric, column in RANGES.items():
            values = [
                v
                for v in history.recent(column, EVIDENCE_SAMPLES)
                if v is not None and math.isfinite(v)
            ]
            if values:
                out[f"{metric}_range"] = [min(values), max(values)]
        return out

    def _on_event(self, node: str, e: NodeEvent) -> None:
        try:
            self._event(node, e)
        except Exception:  # the log never stops a node's stream; its log says why
            log.exception("the trouble log could not keep %s's %s event", node, e.kind)

    def _on_snapshot(self, snap: NodeSnapshot) -> None:
        try:
            self._snapshot(snap)
        except Exception:  # the log never stops a node's stream; its log says why
            log.exception("the trouble log could not read %s's snapshot", snap.name)

    def _event(self, node: str, e: NodeEvent) -> None:
        d = e.detail
        t = e.t or self.clock()
        if e.kind == "xid":
            xid = d.get("xid")
            subject = str(xid) if isinstance(xid, int) and not isinstance(xid, bool) else "?"
            self.note(node, e.gpu, "xid", subject, t=t, evidence=self._evidence(node, e.gpu))
        elif e.kind == "gpu_lost":
            why = {"reason": _cut(d["reason"])} if d.get("reason") else {}
            self._gpu_lost(node, e.gpu, t, why)
        elif e.kind == "throttle":
            for r in _listed(d.get("started")):
                if r not in QUIET_THROTTLE and THROTTLE_BADGES.get(r) not in ("PWRCAP", "SYNC"):
                    row = self.note(node, e.gpu, "throttle", r, t=t, active=True)
                    # read from the sample the fleet publishes next: its readings are the
                    # evidence (the snapshot now is the sample before)
                    self._wanting.setdefault(node, set()).add(row.id)
            for r in _listed(d.get("ended")):
                self.end(node, e.gpu, "throttle", r, t)
        elif e.kind == "accept":
            self._accept(node, e, t)

    def _accept(self, node: str, e: NodeEvent, t: float) -> None:
        d = e.detail
        what = d.get("event")
        if what == "result" and d.get("verdict") in ACCEPT_FAILED:
            failures = [_cut(f) for f in _listed(d.get("failures"))[:5]]
            detail = {"verdict": d["verdict"], "failures": failures, "run": _cut(d.get("run", ""))}
            self.note(node, e.gpu, "accept", t=t, detail=detail)
        elif what == "exit" and d.get("rc") not in (0, None) and d.get("report") is None:
            why = _cut(d.get("reason") or f"exit code {d.get('rc')}")
            detail = {"verdict": "ERROR", "failures": [why], "run": _cut(d.get("run", ""))}
            self.note(node, e.gpu, "accept", t=t, detail=detail)

    def _snapshot(self, snap: NodeSnapshot) -> None:
        name = snap.name
        if name in self._wanting and snap.gpus:
            self._fill(snap)
        state = snap.state
        before = self._states.get(name)
        if state is not before:
            self._states[name] = state
            self._state_changed(snap, before)
        if name not in self._settled and snap.gpus and state is NodeState.LIVE:
            self._settle(snap)  # its first sample in this session
        lost = self._lost.get(name)
        corrected = self._corrected
        for g in snap.gpus:
            if g.state == "lost":  # ``g.lost`` written out: every GPU of every sample
                if lost is None or g.index not in lost:  # a source without events (Prometheus)
                    lost = self._lost.setdefault(name, set())
                    self._gpu_lost(name, g.index, snap.last_sample_t or self.clock(), {})
                continue
            if lost and g.index in lost:  # back on the bus (a reset, a reboot)
                lost.discard(g.index)
                self.end(name, g.index, "gpu_lost", t=snap.last_sample_t or self.clock())
            ecc = g.ecc
            rr = g.remapped_rows
            if (ecc and (ecc.get("volatile_uncorrected") or ecc.get("aggregate_uncorrected"))) or (
                rr and (rr.get("pending") or rr.get("failure"))
            ):
                self._counts_seen(snap, g)
            if ecc:
                # ``CORRECTED_COUNTS`` read here, and the call made only where they moved (or
                # are seen first): every GPU of every sample has them, and they seldom move
                counts = (ecc.get("volatile_corrected"), ecc.get("aggregate_corrected"))
                if counts != _NO_CORRECTED and corrected.get((name, g.index)) != counts:
                    self._corrected_seen(snap, g, counts)

    def _gpu_lost(self, node: str, gpu: int | None, t: float, detail: dict[str, Any]) -> None:
        """A GPU that fell off the bus: the agent's event, or a sample that says so first."""
        if gpu is not None:
            self._lost.setdefault(node, set()).add(gpu)
        evidence = self._evidence(node, gpu)
        self.note(node, gpu, "gpu_lost", t=t, detail=detail, evidence=evidence, active=True)

    def _fill(self, snap: NodeSnapshot) -> None:
        """The evidence of rows that wait for this sample (``_wanting``)."""
        for i in self._wanting.pop(snap.name):
            row = self.rows.get(i)
            if row is None or row.gpu is None:
                continue
            row.evidence = self._evidence(snap.name, row.gpu)
            if row.count == 1 or not row.first_evidence:
                row.first_evidence = row.evidence
            self._changed(row)

    def _state_changed(self, snap: NodeSnapshot, before: NodeState | None) -> None:
        name = snap.name
        fleet = self._fleet
        if snap.state is NodeState.UNREACHABLE:
            if fleet is not None and fleet.leaving == name:
                return  # it left the fleet: no failure of its link
            detail = {"reason": _cut(snap.reason)} if snap.reason else {}
            evidence = {"last_sample_t": snap.last_sample_t} if snap.last_sample_t else {}
            self.note(name, None, "unreachable", detail=detail, evidence=evidence, active=True)
        elif snap.state is NodeState.LIVE:
            self.end(name, None, "unreachable", t=self.clock())

    def _settle(self, snap: NodeSnapshot) -> None:
        """A node live for the first time in this session: the rows of earlier sessions that
        were still going end when its sample says they are over."""
        self._settled.add(snap.name)
        gpus = {g.index: g for g in snap.gpus}
        for row in list(self.rows.values()):
            if row.node != snap.name or not row.active or row.gpu is None:
                continue
            g = gpus.get(row.gpu)
            if g is None:
                continue
            over = (row.kind == "gpu_lost" and not g.lost) or (
                row.kind == "throttle" and row.subject not in (g.throttle or ())
            )
            if over:
                self.end(row.node, row.gpu, row.kind, row.subject, snap.last_sample_t or 0.0)

    def _counts_seen(self, snap: NodeSnapshot, g: GpuSample) -> None:
        ecc = g.ecc or {}
        rr = g.remapped_rows or {}
        counts = (
            ecc.get("volatile_uncorrected"),
            ecc.get("aggregate_uncorrected"),
            rr.get("pending"),
            rr.get("failure"),
            rr.get("uncorrectable"),
        )
        key = (snap.name, g.index)
        if self._counts.get(key) == counts:
            return
        self._counts[key] = counts
        t = snap.last_sample_t or self.clock()
        evidence = self._evidence(snap.name, g.index)
        if counts[0] or counts[1]:
            detail = {k: ecc[k] for k in ECC_COUNTS if k in ecc}
            self.note(snap.name, g.index, "ecc", t=t, detail=detail, evidence=evidence)
        if counts[2] or counts[3]:
            detail = {k: rr[k] for k in REMAP_COUNTS if k in rr}
            self.note(snap.name, g.index, "remap", t=t, detail=detail, evidence=evidence)

    def _corrected_seen(
        self, snap: NodeSnapshot, g: GpuSample, counts: tuple[object, object]
    ) -> None:
        """Corrected ECC counts that rose since the GPU's last sample: an ``ecc_corrected``
        occurrence (no fault: the hardware corrected them, but a rising count is how a memory
        going bad shows first). It does not flood: the first sight in a session is only the
        baseline (a GPU's years-old aggregate count is no news, and a restart adds no row), a
        fall (a driver reload clears the volatile count) only a new baseline, and the rises of
        a GPU fold into one row, as every kind's repeats do, until it is acknowledged."""
        key = (snap.name, g.index)
        before = self._corrected.get(key)
        if before == counts:
            return
        self._corrected[key] = counts
        if before is None or not any(
            isinstance(now, int | float) and isinstance(then, int | float) and now > then
            for now, then in zip(counts, before, strict=True)
        ):
            return
        detail = {k: n for k, n in zip(CORRECTED_COUNTS, counts, strict=True) if n is not None}
        evidence = self._evidence(snap.name, g.index)
        t = snap.last_sample_t or self.clock()
        self.note(snap.name, g.index, "ecc_corrected", t=t, detail=detail, evidence=evidence)


def _dumps(record: dict[str, Any]) -> str:
    return json.dumps(record, ensure_ascii=True, separators=(",", ":"))


def _listed(v: object) -> list[str]:
    return [str(x) for x in v] if isinstance(v, list | tuple) else []


def gpu_readings(g: GpuSample) -> dict[str, Any]:
    """The readings of a sample an event keeps as its evidence (those it has)."""
    out: dict[str, Any] = {"t": g.t}
    for name in READINGS:
        value = getattr(g, name)
        if value is not None:
            out[name] = value
    if g.throttle:
        out["throttle"] = list(g.throttle)
    if g.lost:
        out["state"] = "lost"
    return out
