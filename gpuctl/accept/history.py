"""Every acceptance report kept in SQLite, and each node compared with its own past.

The database is ``accept.sqlite`` in gpuctl's state folder (``gpuctl.paths.state_dir()``,
``~/.local/state/gpuctl``). A report's figures (COMPUTE TFLOP/s per device
and dtype, MEMBW GB/s per device, all-reduce busbw per topology) are stored as rows keyed by
node and figure name. A new figure is compared with the same node's earlier *healthy* runs of the
same kind (device, quick): runs that passed and had no degradation, so a failing node never
lowers its own bar. Three findings are a ``Degradation`` even when the absolute floor passed:

- ``median``: the figure is more than the threshold below the median of the last
  ``REFERENCE_RUNS`` healthy values;
- ``falling``: it fell at every one of the last two or more healthy runs and now, and in all by
  more than the threshold (a node losing 3 % a run: 100, 97, 94, 91, 88 fails at 88, where the
  median of the window still trails it);
- ``missing``: a per-GPU figure the latest healthy run measured is absent although its section
  and dtype ran (a GPU that vanished from the node);
- ``vanished``: a GPU [ENV] listed in the latest healthy run is not listed now, named by its
  UUID (the survivors are renumbered, so ``gpu7`` missing may be the old ``gpu3``).

busbw depends on how many GPUs and nodes took part: its key names them (``ddp/busbw/8gpu-1node``)
so a run on 2 GPUs is never held to a run on 8.
"""

from __future__ import annotations

import json
import os
import sqlite3
import statistics
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuctl import paths

REFERENCE_RUNS = 5
DEFAULT_THRESHOLD = 0.10

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    node TEXT NOT NULL,
    t REAL NOT NULL,
    device TEXT NOT NULL,
    quick INTEGER NOT NULL,
    verdict TEXT NOT NULL,
    via TEXT,
    degradations TEXT NOT NULL DEFAULT '[]',
    report TEXT
);
CREATE TABLE IF NOT EXISTS figures (
    run INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    node TEXT NOT NULL,
    key TEXT NOT NULL,
    value REAL NOT NULL,
    unit TEXT NOT NULL,
    device TEXT NOT NULL,
    quick INTEGER NOT NULL,
    t REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS figures_by_node ON figures(node, key, device, quick, t);
CREATE INDEX IF NOT EXISTS runs_by_node ON runs(node, t);
"""


@dataclass(frozen=True, slots=True)
class Degradation:
    """A figure that fell more than the threshold below the node's own recent median."""

    node: str
    key: str
    value: float
    reference: float
    drop: float  # 0.3 = 30 % below the reference
    unit: str
    runs: int  # how many earlier healthy runs the reference comes from
    kind: str = "median"  # "median" | "falling" | "missing" | "vanished" (module docstring)
    detail: str = ""  # vanished: which GPUs, by their index then and UUID

    def describe(self) -> str:
        """One line for a person: the node, the figure (its key names the GPU) and why."""
        return f"{self.node} {self.reason()}"

    def reason(self) -> str:
        """``describe`` without the node: ``compute/gpu3/bf16: 88 TFLOP/s is 12% below ...``."""
        if self.kind == "vanished":
            return (
                f"{self.key}: {self.value:.0f} GPUs, {self.reference:.0f} in the last healthy "
                f"run; gone: {self.detail}"
            )
        if self.kind == "missing":
            return (
                f"{self.key}: no figure in this run (the GPU or its result is gone); "
                f"{self.reference:.4g} {self.unit} in the last {self.runs} healthy run(s)"
            )
        if self.kind == "falling":
            return (
                f"{self.key}: {self.value:.4g} {self.unit} is {100 * self.drop:.0f}% "
                f"below {self.reference:.4g} {self.runs} healthy runs ago, falling at every run"
            )
        return (
            f"{self.key}: {self.value:.4g} {self.unit} is {100 * self.drop:.0f}% "
            f"below its median of the last {self.runs} healthy run(s) ({self.reference:.4g})"
        )

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Degradation:
        """The inverse of ``to_dict`` (a report's ``degradations``)."""
        return cls(
            str(d["node"]),
            str(d["key"]),
            float(d["value"]),
            float(d["reference"]),
            float(d["drop"]),
            str(d["unit"]),
            int(d["runs"]),
            str(d.get("kind") or "median"),
            str(d.get("detail") or ""),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "key": self.key,
            "value": self.value,
            "reference": self.reference,
            "drop": self.drop,
            "unit": self.unit,
            "runs": self.runs,
            "kind": self.kind,
            "detail": self.detail,
        }


@dataclass(frozen=True, slots=True)
class RunRow:
    """One stored run of one node."""

    id: int
    node: str
    t: float
    device: str
    quick: bool
    verdict: str
    via: str | None
    degradations: tuple[dict[str, Any], ...]


def figures(report: Mapping[str, Any]) -> dict[str, tuple[float, str]]:
    """The comparable figures of a node report: ``{key: (value, unit)}``.

    Keys: ``compute/<device>/<dtype>`` (TFLOP/s), ``membw/<device>`` (GB/s), ``ddp/busbw``
    (GB/s). Missing or unmeasured figures are left out.
    """
    out: dict[str, tuple[float, str]] = {}
    sections = report.get("sections") or {}
    for d in (sections.get("compute") or {}).get("devices") or []:
        for r in d.get("results") or []:
            v = r.get("tflops")
            if isinstance(v, int | float) and v > 0:
                out[f"compute/{d.get('label')}/{r.get('dtype')}"] = (float(v), "TFLOP/s")
    for d in (sections.get("membw") or {}).get("devices") or []:
        v = d.get("gbps")
        if isinstance(v, int | float) and v > 0:
            out[f"membw/{d.get('label')}"] = (float(v), "GB/s")
    ar = sections.get("ddp_allreduce") or {}
    busbw = ar.get("busbw_gbps")
    if isinstance(busbw, int | float) and busbw > 0:
        out[busbw_key(ar)] = (float(busbw), "GB/s")
    return out


def busbw_key(allreduce: Mapping[str, Any]) -> str:
    """``ddp/busbw/<gpus>gpu-<nodes>node``: busbw is only comparable within one topology."""
    world, nnodes = allreduce.get("world_size"), allreduce.get("nnodes")
    if isinstance(world, int) and isinstance(nnodes, int):
        return f"ddp/busbw/{world}gpu-{nnodes}node"
    return "ddp/busbw"


def gpu_uuids(report: Mapping[str, Any]) -> dict[str, int]:
    """UUID -> index of the GPUs [ENV] listed (CUDA runs; {} when it listed none)."""
    env = (report.get("sections") or {}).get("env") or {}
    out: dict[str, int] = {}
    for g in env.get("gpus") or []:
        if isinstance(g, Mapping) and isinstance(g.get("uuid"), str) and g["uuid"]:
            out[g["uuid"]] = int(g.get("index") or 0)
    return out


def vanished(before: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """The GPUs of ``before`` that ``now`` lacks, each as ``gpu<index then> <UUID>`` (torch
    renumbers the survivors, so only the UUID names the GPU that went); [] when none or when
    either run listed no UUIDs."""
    old, new = gpu_uuids(before), gpu_uuids(now)
    if not old or not new:
        return []
    return [f"gpu{i} {u}" for u, i in sorted(old.items(), key=lambda x: x[1]) if u not in new]


def expected_keys(report: Mapping[str, Any], known: list[str]) -> list[str]:
    """Of the per-GPU figure keys ``known`` from earlier runs, those this report should hold:
    the section ran (not SKIP) and, for COMPUTE, the dtype was asked for."""
    sections = report.get("sections") or {}
    dtypes = (report.get("options") or {}).get("dtypes")
    out = []
    for key in known:
        parts = key.split("/")
        if parts[0] == "compute" and len(parts) == 3:
            sec = sections.get("compute") or {}
            ran = isinstance(dtypes, list) and parts[2] in dtypes
        elif parts[0] == "membw" and len(parts) == 2:
            sec, ran = sections.get("membw") or {}, True
        else:
            continue
        if ran and sec.get("verdict") not in (None, "SKIP"):
            out.append(key)
    return out


class HistoryStore:
    """The SQLite history. Cheap to open; each call uses its own short transaction."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path is not None else paths.state_dir() / paths.ACCEPT_DB
        paths.private_dir(self.path.parent)
        with self._db() as db:
            db.executescript(_SCHEMA)

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=10)
        try:
            db.execute("PRAGMA foreign_keys = ON")
            with db:
                yield db
        finally:
            db.close()

    def compare(
        self,
        node: str,
        report: Mapping[str, Any],
        threshold: float = DEFAULT_THRESHOLD,
        before: float | None = None,
    ) -> list[Degradation]:
        """Degradations of ``report`` against this node's earlier runs (nothing is stored)."""
        device = str(report.get("device"))
        quick = int(bool(report.get("quick")))
        t = before if before is not None else float(report.get("started") or time.time())
        found = []
        now = figures(report)
        with self._db() as db:

            def healthy(key: str) -> list[tuple[float, str]]:
                """The key's values in the last REFERENCE_RUNS healthy runs, newest first."""
                rows = db.execute(
                    "SELECT f.value, f.unit FROM figures f JOIN runs r ON r.id = f.run "
                    "WHERE f.node=? AND f.key=? AND f.device=? AND f.quick=? AND f.t<? "
                    "AND r.verdict='PASS' AND r.degradations='[]' ORDER BY f.t DESC LIMIT ?",
                    (node, key, device, quick, t, REFERENCE_RUNS),
                ).fetchall()
                return [(float(v), str(u)) for v, u in rows]

            for key, (value, unit) in sorted(now.items()):
                past = [v for v, _ in healthy(key)]
                if not past:
                    continue
                reference = statistics.median(past)
                drop = 1.0 - value / reference if reference > 0 else 0.0
                if drop > threshold:
                    found.append(Degradation(node, key, value, reference, drop, unit, len(past)))
                    continue
                chain = [value]  # the current value, then each earlier one while it was higher
                for v in past:
                    if v <= chain[-1]:
                        break
                    chain.append(v)
                fall = 1.0 - value / chain[-1]
                if len(chain) >= 3 and fall > threshold:
                    found.append(
                        Degradation(
                            node, key, value, chain[-1], fall, unit, len(chain) - 1, kind="falling"
                        )
                    )
            last = db.execute(  # the latest healthy run: what this node measured when well
                "SELECT id FROM runs WHERE node=? AND device=? AND quick=? AND t<? "
                "AND verdict='PASS' AND degradations='[]' ORDER BY t DESC, id DESC LIMIT 1",
                (node, device, quick, t),
            ).fetchone()
            known = (
                [r[0] for r in db.execute("SELECT key FROM figures WHERE run=?", (last[0],))]
                if last
                else []
            )
            before_report = (self.report(int(last[0])) or {}) if last else {}
            gone = vanished(before_report, report)
            if gone:
                had = len(gpu_uuids(before_report))
                found.append(
                    Degradation(
                        node,
                        "env/gpus",
                        float(had - len(gone)),
                        float(had),
                        len(gone) / had,
                        "GPUs",
                        1,
                        kind="vanished",
                        detail=", ".join(gone),
                    )
                )
            for key in sorted(set(expected_keys(report, known)) - set(now)):
                rows = healthy(key)
                if rows:
                    reference = statistics.median(v for v, _ in rows)
                    found.append(
                        Degradation(
                            node, key, 0.0, reference, 1.0, rows[0][1], len(rows), kind="missing"
                        )
                    )
        return found

    def record(
        self,
        node: str,
        report: Mapping[str, Any],
        *,
        threshold: float = DEFAULT_THRESHOLD,
        via: str | None = None,
    ) -> list[Degradation]:
        """Compare ``report`` with the node's history, store it, and return its degradations."""
        found = self.compare(node, report, threshold)
        t = float(report.get("started") or time.time())
        device = str(report.get("device"))
        quick = int(bool(report.get("quick")))
        with self._db() as db:
            cur = db.execute(
                "INSERT INTO runs (node, t, device, quick, verdict, via, degradations, report) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    node,
                    t,
                    device,
                    quick,
                    str(report.get("verdict")),
                    via,
                    json.dumps([d.to_dict() for d in found]),
                    json.dumps(report, default=str),
                ),
            )
            run = cur.lastrowid
            db.executemany(
                "INSERT INTO figures (run, node, key, value, unit, device, quick, t) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(run, node, k, v, u, device, quick, t) for k, (v, u) in figures(report).items()],
            )
        return found

    def nodes(self) -> list[str]:
        """Nodes with at least one stored run, sorted."""
        with self._db() as db:
            return [r[0] for r in db.execute("SELECT DISTINCT node FROM runs ORDER BY node")]

    def runs(self, node: str | None = None, limit: int = 50) -> list[RunRow]:
        """The latest runs (of one node, or all), newest first."""
        sql = "SELECT id, node, t, device, quick, verdict, via, degradations FROM runs"
        args: tuple[Any, ...] = ()
        if node is not None:
            sql += " WHERE node=?"
            args = (node,)
        sql += " ORDER BY t DESC, id DESC LIMIT ?"
        with self._db() as db:
            rows = db.execute(sql, (*args, limit)).fetchall()
        return [
            RunRow(r[0], r[1], r[2], r[3], bool(r[4]), r[5], r[6], tuple(json.loads(r[7])))
            for r in rows
        ]

    def report(self, run_id: int) -> dict[str, Any] | None:
        """The stored report of one run."""
        with self._db() as db:
            row = db.execute("SELECT report FROM runs WHERE id=?", (run_id,)).fetchone()
        if row is None or row[0] is None:
            return None
        value = json.loads(row[0])
        return value if isinstance(value, dict) else None

    def keys(self, node: str) -> list[str]:
        """Figure names recorded for ``node``, sorted."""
        with self._db() as db:
            return [
                r[0]
                for r in db.execute(
                    "SELECT DISTINCT key FROM figures WHERE node=? ORDER BY key", (node,)
                )
            ]

    def series(
        self, node: str, key: str, limit: int = 30, device: str | None = None
    ) -> list[tuple[float, float, str]]:
        """``(t, value, unit)`` of one figure of one node, oldest first (the last ``limit``)."""
        sql = "SELECT t, value, unit FROM figures WHERE node=? AND key=?"
        args: tuple[Any, ...] = (node, key)
        if device is not None:
            sql += " AND device=?"
            args += (device,)
        sql += " ORDER BY t DESC LIMIT ?"
        with self._db() as db:
            rows = db.execute(sql, (*args, limit)).fetchall()
        return [(float(t), float(v), str(u)) for t, v, u in reversed(rows)]


SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float]) -> str:
    """A unicode sparkline of ``values`` scaled between their min and max."""
    if not values:
        return ""
    lo, hi = min(values), max(values)
    if hi - lo <= 1e-12 * max(abs(hi), 1.0):
        return SPARKS[len(SPARKS) // 2] * len(values)
    return "".join(SPARKS[int((v - lo) / (hi - lo) * (len(SPARKS) - 1))] for v in values)
