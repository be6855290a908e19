"""Columnar samples, measured before they are built: the login side's per-sample CPU today against
a prototype of a sample kept as columns (issue 42's named next step).

Today a sample line is decoded into a ``Sample`` of ``GpuSample`` Structs, and for every sample
of every node the fleet and the screen's store read its GPUs one by one: the throttle watch, the
history's write (``NodeHistory.add``), a ``NodeSnapshot``, the header's trouble counts and totals
(``trouble_counts``, ``node_totals``); the snapshot it replaces is freed. The prototype has the
agent send one list per reading instead (``index``, ``util_gpu``, ... ``ecc_volatile_uncorrected``,
a GPU column for the processes), decoded by msgspec into one Struct of tuples, and does the same
work on the columns: the throttle watch as one comparison of the throttle column, the history's
blocks written from the columns (each block's columns interleaved by slice assignment, in C), the
counts and totals over whole columns (``sum``, ``any``, a set of the throttle tuples), the same
``NodeSnapshot`` without GPUs (``GpuSample`` objects would be built for rows on screen only).
Where a column holds what the fast path cannot take (a None, a lost GPU, a throttle that is a
problem), the prototype builds the node's ``GpuSample`` Structs and takes today's functions: the
same fallback frequency for both (the lines are the simulated fleet's: a few GPUs throttle).

Both paths run over ``--nodes`` distinct nodes (each its own simulated GPUs and history, a few
samples each, cycled: a node's previous sample is cold in the cache when its next comes, as in the
app), alternated ``--rounds`` times; printed: median microseconds of CPU a sample for the decode
alone (and today's decode of the same lines without the GPUs' ECC, remap and retired-page dicts:
how much of the decode's gain a smaller step would take) and for decode plus the bookkeeping, and
what that is of a core at 1 Hz. Left out of both:
the trouble log and the idle tracker (~7.6 us a sample today, ``tui_load --parts``), reading the
pipes and the screen's flushes and paints.

Usage: python benchmarks/columnar.py [--nodes 512] [--gpus 8] [--rounds 5] [--passes 4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpuctl.core.model import (  # noqa: E402
    GpuProcess,
    GpuSample,
    GpuStatic,
    HostSample,
    NodeInfo,
    NodeSnapshot,
    NodeState,
)
from gpuctl.fleet import gpu_history  # noqa: E402
from gpuctl.fleet.gpu_history import NodeHistory  # noqa: E402
from gpuctl.fleet.session import decode_line, statics  # noqa: E402
from gpuctl.node import protocol  # noqa: E402
from gpuctl.node.readers.sim import SimReader  # noqa: E402
from gpuctl.tui import view  # noqa: E402

COUNTS = {"ecc": "ecc", "remapped_rows": "remap", "retired_pages": "retired"}
FROM_HELLO = ("uuid", "mem_total", "power_limit")
PER_GPU = tuple(
    f
    for f in msgspec.structs.fields(GpuSample)
    if f.name not in ("t", "processes", "mig", *FROM_HELLO, *COUNTS)
)
COUNT_KEYS = {
    "ecc": (
        "volatile_corrected",
        "volatile_uncorrected",
        "aggregate_corrected",
        "aggregate_uncorrected",
    ),
    "remapped_rows": ("correctable", "uncorrectable", "pending", "failure"),
    "retired_pages": ("single_bit", "double_bit", "pending"),
}
Count = int | bool | None


def _col_fields() -> list[tuple[str, Any, Any]]:
    fields: list[tuple[str, Any, Any]] = [("t", float, 0.0), ("seq", int, -1)]
    for f in PER_GPU:
        fields.append((f.name, tuple[f.type, ...] | None, None))  # type: ignore[name-defined]
    for name, keys in COUNT_KEYS.items():
        for k in keys:
            fields.append((f"{COUNTS[name]}_{k}", tuple[Count, ...] | None, None))
    fields += [
        ("processes", tuple[GpuProcess, ...], ()),
        ("process_gpu", tuple[int, ...], ()),
        ("parents", tuple[GpuProcess, ...], ()),
        ("host", HostSample | None, None),
    ]
    return fields


ColSample: Any = msgspec.defstruct(
    "ColSample", _col_fields(), frozen=True, gc=False, tag_field="type", tag="colsample"
)
COL_DECODER = msgspec.json.Decoder(ColSample)
ENCODER = msgspec.json.Encoder()


def columnar_line(s: Any) -> bytes:
    """The prototype's wire line for the decoded sample ``s``: one list per reading, a list
    that would hold only nulls left out (as protocol 2 leaves a null out)."""
    gpus = s.gpus
    msg: dict[str, Any] = {"type": "colsample", "t": s.t, "seq": s.seq}
    for f in PER_GPU:
        col = [getattr(g, f.name) for g in gpus]
        if f.name == "state" and all(v == "ok" for v in col):
            continue
        if any(v is not None for v in col):
            msg[f.name] = col
    for name, keys in COUNT_KEYS.items():
        for k in keys:
            col = [(getattr(g, name) or {}).get(k) for g in gpus]
            if any(v is not None for v in col):
                msg[f"{COUNTS[name]}_{k}"] = col
    msg["processes"] = [p for g in gpus for p in g.processes]
    msg["process_gpu"] = [g.index for g in gpus for _ in g.processes]
    msg["parents"] = s.parents
    msg["host"] = s.host
    return ENCODER.encode(msg)


def gpus_of(c: Any, hello: dict[int, GpuStatic], t: float | None = None) -> tuple[GpuSample, ...]:
    """The columns' GPUs as today's Structs (what a row on screen, or the fallback, reads)."""
    out = []
    for j, index in enumerate(c.index):
        kw = {f.name: getattr(c, f.name)[j] for f in PER_GPU if getattr(c, f.name) is not None}
        for name, keys in COUNT_KEYS.items():
            d = {
                k: getattr(c, f"{COUNTS[name]}_{k}")[j]
                for k in keys
                if getattr(c, f"{COUNTS[name]}_{k}") is not None
            }
            if d:
                kw[name] = d
        st = hello.get(index)
        if st is not None:
            kw.update(uuid=st.uuid, mem_total=st.mem_total, power_limit=st.power_limit)
        procs = tuple(p for p, g in zip(c.processes, c.process_gpu, strict=True) if g == index)
        out.append(GpuSample(t=c.t if t is None else t, processes=procs, **kw))
    return tuple(out)


_BLOCK_KEYS = tuple(
    tuple(gpu_history._KEPT[c].key for c in cols) for cols in gpu_history._BLOCK_COLUMNS
)


def add_columns(h: NodeHistory, t: float, c: Any, hello: dict[int, GpuStatic]) -> None:
    """``NodeHistory.add`` at ``t`` from columns: its fast path with each block's values from
    the columns (interleaved by slice assignment), else today's add of the Structs."""
    index = c.index
    if index != h.layout or c.state is not None:
        h.add(t, gpus_of(c, hello, t))
        return
    lanes = len(index)
    arrays = []
    try:
        for code, keys in zip(gpu_history._BLOCK_CODES, _BLOCK_KEYS, strict=True):
            width = len(keys)
            values: Any
            if width == 1:
                values = getattr(c, keys[0])
            else:
                values = [None] * (width * lanes)
                for k, key in enumerate(keys):
                    values[k::width] = getattr(c, key)
            arrays.append(array(code, values))
    except (TypeError, OverflowError):  # a None or a value out of range: as today
        h.add(t, gpus_of(c, hello, t))
        return
    h._tiers_before(t)
    ring = h._recent
    i = ring.advance(t)
    for block, values in zip(ring.blocks, arrays, strict=True):
        span = len(values)
        block[i * span : (i + 1) * span] = values


def _quiet(reasons: tuple[str, ...] | None) -> bool:
    return not reasons or bool(view._QUIET_REASONS.get(reasons)) or view._quiet_reasons(reasons)


def counts_and_totals(
    snap: NodeSnapshot, c: Any, hello: dict[int, GpuStatic]
) -> tuple[dict[str, int], view.NodeTotals]:
    """The header's parts from the columns; a node with any trouble, a lost GPU or a missing
    reading takes today's functions on its Structs."""
    clean = (
        c.state is None
        and all(map(_quiet, set(c.throttle or ())))
        and not any(c.ecc_volatile_uncorrected or ())
        and not any(c.ecc_aggregate_uncorrected or ())
        and not any(c.remap_pending or ())
        and not any(c.remap_failure or ())
    )
    if clean:
        try:
            util = sum(c.util_gpu)
            power = float(sum(c.power))
        except TypeError:  # a None among them
            clean = False
    if not clean:
        full = NodeSnapshot(name=snap.name, state=snap.state, gpus=gpus_of(c, hello))
        return view.trouble_counts(full, set()), view.node_totals(full)
    n = len(c.index)
    return dict.fromkeys(view.SNAPSHOT_PROBLEMS, 0), view.NodeTotals(n, float(util), n, power)


class Node:
    def __init__(self, k: int, gpus: int, samples: int) -> None:
        reader = SimReader.from_spec(f"{gpus}:H100", seed=k)
        static = reader.static()
        info = NodeInfo(protocol=2, gpus=tuple(msgspec.convert(st, GpuStatic) for st in static))
        self.hello = statics(info) or {}
        self.name = f"node{k:05d}"
        self.lines: list[bytes] = []
        self.lean_lines: list[bytes] = []  # today's, without the ECC, remap and retired dicts
        for j in range(5 + samples):
            gs = reader.sample()
            if j < 5:
                continue
            msg = {
                "type": "sample",
                "t": 1.8e9 + j,
                "seq": j,
                "gpus": protocol.compact_gpus(gs, static),
                "parents": protocol.compact_records(reader.parents()),
                "host": reader.host(),
            }
            self.lines.append(protocol.encode(msg))
            lean = [{k: v for k, v in g.items() if k not in COUNTS} for g in msg["gpus"]]
            self.lean_lines.append(protocol.encode({**msg, "gpus": lean}))
        decoded = [decode_line(line, self.hello) for line in self.lines]
        self.col_lines = [columnar_line(s) for s in decoded]
        for s, cl in zip(decoded, self.col_lines, strict=True):  # the same readings
            assert gpus_of(COL_DECODER.decode(cl), self.hello) == s.gpus, self.name
        self.history = NodeHistory.sized(interval=1.0)
        self.col_history = NodeHistory.sized(interval=1.0)
        self.history.add(decoded[0].t - 10, decoded[0].gpus)  # the layout set
        self.col_history.add(decoded[0].t - 10, decoded[0].gpus)
        self.watch: dict[int, Any] = {}
        self.col_watch: Any = None
        self.kept: Any = None
        self.col_kept: Any = None
        self.t0 = decoded[-1].t  # samples written after the lines' own times
        self.t = 0.0


def today(node: Node, line: bytes) -> None:
    s = decode_line(line, node.hello)
    node.t += 1.0
    t = node.t0 + node.t  # the lines repeat: each pass writes them at later times
    watch = node.watch
    for g in s.gpus:  # the fleet's throttle watch (``Fleet._on_sample``), its common case
        if watch.get(g.index) != g.throttle or g.state == "lost":
            watch[g.index] = g.throttle
    node.history.add(t, s.gpus)
    snap = NodeSnapshot(
        name=node.name,
        state=NodeState.LIVE,
        gpus=s.gpus,
        last_sample_t=t,
        parents=s.parents,
        host=s.host,
    )
    node.kept = (snap, view.trouble_counts(snap, set()), view.node_totals(snap))


def columns(node: Node, line: bytes) -> None:
    c = COL_DECODER.decode(line)
    node.t += 1.0
    t = node.t0 + node.t
    if c.throttle != node.col_watch or c.state is not None:  # the watch: one comparison
        node.col_watch = c.throttle
    add_columns(node.col_history, t, c, node.hello)
    snap = NodeSnapshot(
        name=node.name, state=NodeState.LIVE, last_sample_t=t, parents=c.parents, host=c.host
    )
    node.col_kept = (snap, c, *counts_and_totals(snap, c, node.hello))


def per_sample_us(
    nodes: list[Node], step: Callable[[Node, bytes], None], which: str, passes: int
) -> float:
    n = 0
    start = time.process_time()
    for p in range(passes):
        for node in nodes:
            lines = getattr(node, which)
            step(node, lines[p % len(lines)])
            n += 1
    return (time.process_time() - start) / n * 1e6


def decode_only(node: Node, line: bytes) -> None:
    node.kept = decode_line(line, node.hello)


def col_decode_only(node: Node, line: bytes) -> None:
    node.col_kept = COL_DECODER.decode(line)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=512)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--passes", type=int, default=4, help="samples of each node per timed run")
    args = p.parse_args()
    nodes = [Node(k, args.gpus, 4) for k in range(args.nodes)]
    line, col = nodes[0].lines[0], nodes[0].col_lines[0]
    cases: dict[str, tuple[Callable[[Node, bytes], None], str]] = {
        "today: decode": (decode_only, "lines"),
        "today without count dicts: decode": (decode_only, "lean_lines"),
        "columns: decode": (col_decode_only, "col_lines"),
        "today: decode + bookkeeping": (today, "lines"),
        "columns: decode + bookkeeping": (columns, "col_lines"),
    }
    for step, which in cases.values():  # warm: each node's history has its rings
        per_sample_us(nodes, step, which, 2)
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, (step, which) in cases.items():
            times[name].append(per_sample_us(nodes, step, which, args.passes))
    # the histories the two paths wrote hold the same readings
    for node in nodes[:8]:
        for m in gpu_history.METRICS:
            a = node.history[0].recent(m, 20)
            b = node.col_history[0].recent(m, 20)
            assert a == b, (node.name, m, a[-3:], b[-3:])
    print(
        f"{args.nodes} nodes x {args.gpus} GPUs; a line {len(line)} bytes today, {len(col)} as "
        f"columns; {args.rounds} alternated rounds of {args.passes} samples a node; us of CPU a "
        "sample (median), and % of a core at 1 Hz"
    )
    med = {name: statistics.median(ts) for name, ts in times.items()}
    for name, us in med.items():
        rounds = ", ".join(f"{t:.1f}" for t in times[name])
        core = us * args.nodes / 1e4
        print(f"  {name:36s} {us:7.1f} us  {core:5.2f} % of a core   (rounds: {rounds})")
    print(
        "  columns / today: decode "
        f"{med['columns: decode'] / med['today: decode']:.2f}x, with the bookkeeping "
        f"{med['columns: decode + bookkeeping'] / med['today: decode + bookkeeping']:.2f}x"
    )


if __name__ == "__main__":
    main()
