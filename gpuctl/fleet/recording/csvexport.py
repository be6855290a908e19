"""``gpuctl replay --export-csv``: a recording as one row per node x GPU x sample."""

from __future__ import annotations

import csv
import time
from typing import IO

from gpuctl.core import wire
from gpuctl.core.model import NodeInfo
from gpuctl.fleet.recording.format import read_slurm_jobs
from gpuctl.fleet.recording.reader import RecordingReader
from gpuctl.fleet.session import Statics, decode_sample, statics
from gpuctl.node.metrics import METRICS as REGISTRY

# Who and when, the registry's readings flagged "csv" (named by their wire key, in the
# registry's order: ``gpuctl/node/metrics.py``), then the structured fields and the job.
CSV_HEAD = ("time", "t", "node", "gpu", "uuid", "model", "state")
CSV_READINGS = tuple(m.key for m in REGISTRY if "csv" in m.flags)
CSV_TAIL = (
    "throttle",
    "ecc_volatile_corrected",
    "ecc_volatile_uncorrected",
    "ecc_aggregate_corrected",
    "ecc_aggregate_uncorrected",
    "remapped_correctable",
    "remapped_uncorrectable",
    "processes",
    "slurm_job",
    "slurm_user",
)
CSV_COLUMNS = CSV_HEAD + CSV_READINGS + CSV_TAIL


def _cell(value: object) -> object:
    """A cell as a spreadsheet should take it: a node's text never becomes a formula."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return "" if value is None else value


def _iso(t: float) -> str:
    """``t`` as an ISO date in UTC; empty for a time no date can hold (a sample's own time is
    what its agent said, never checked)."""
    try:
        ms = round(t * 1000)
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"
    except (OverflowError, ValueError, OSError):
        return ""


def export_csv(reader: RecordingReader, out: IO[str], *, start: float | None = None) -> int:
    """Write one row per node x GPU x sample (from ``start`` on) to ``out``; returns the rows."""
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    models: dict[str, dict[int, str]] = {}
    hellos: dict[str, Statics | None] = {}  # what each node's samples leave to its hello
    jobs: dict[str, dict[int, tuple[str | None, str | None]]] = {}
    rows = 0
    first = reader.frame_index(start) if start is not None else 0
    nodes = {name for name, _kind in reader.nodes}
    for _i, rec in reader.records(first):
        msg = rec.get("m")
        node = rec["n"]
        if node not in nodes:
            # a node joined after the header (its join, hello or failure) comes in, as in a
            # replay; any other record of a node not in is kept nowhere (unbounded)
            if reader.admit(len(nodes), rec) is None:
                continue
            nodes.add(node)
        if "slurm" in rec:
            jobs[node] = read_slurm_jobs(rec["slurm"])
        if not isinstance(msg, dict):
            continue
        if msg.get("type") == "hello":
            hellos[node] = statics(wire.lenient(NodeInfo, msg) or NodeInfo())
            gpus = msg.get("gpus")
            models[node] = {
                g["index"]: g["name"]
                for g in (gpus if isinstance(gpus, list) else [])
                if isinstance(g, dict)
                and isinstance(g.get("index"), int)
                and isinstance(g.get("name"), str)
            }
            continue
        if rec.get("k") or msg.get("type") != "sample":
            continue
        sample = decode_sample(msg, hellos.get(node))
        if start is not None and rec["t"] < start:
            continue
        for g in sample.gpus:
            ecc = g.ecc or {}
            rows_ = g.remapped_rows or {}
            job, user = jobs.get(node, {}).get(g.index, (None, None))
            row = {
                "time": _iso(g.t),
                "t": f"{g.t:.3f}",
                "node": node,
                "gpu": g.index,
                "uuid": g.uuid,
                "model": models.get(node, {}).get(g.index),
                "state": "lost" if g.lost else "ok",
                **{key: getattr(g, key) for key in CSV_READINGS},
                "throttle": "|".join(g.throttle) if g.throttle is not None else None,
                "ecc_volatile_corrected": ecc.get("volatile_corrected"),
                "ecc_volatile_uncorrected": ecc.get("volatile_uncorrected"),
                "ecc_aggregate_corrected": ecc.get("aggregate_corrected"),
                "ecc_aggregate_uncorrected": ecc.get("aggregate_uncorrected"),
                "remapped_correctable": rows_.get("correctable"),
                "remapped_uncorrectable": rows_.get("uncorrectable"),
                "processes": len(g.processes),
                "slurm_job": job,
                "slurm_user": user,
            }
            writer.writerow([_cell(row[c]) for c in CSV_COLUMNS])  # by name: no column drifts
            rows += 1
    return rows
