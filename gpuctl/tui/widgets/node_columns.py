"""A node on one line (the compact list, ``v``): ``COMPACT_COLUMNS`` drawn from a ``NodeLine``
(state, GPU count, mean utilization and a bar per GPU, memory, hottest GPU, power, trouble
counted), painted by ``overview.NodeList._compact``."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import TYPE_CHECKING

from rich.segment import Segment
from rich.style import Style

from gpuctl.core.model import GpuSample, NodeSnapshot, NodeState
from gpuctl.tui.text import node_str
from gpuctl.tui.view import (
    SPARK_CHARS,
    NodeTotals,
    fmt_gib_pair,
    fmt_power,
    gpu_badges,
)
from gpuctl.tui.widgets.columns import (
    BADGE_CLASSES,
    LEVEL_CLASSES,
    PLAIN,
    STATE_CLASSES,
    TEXT_LIMIT,
    Cell,
    Cells,
    Column,
    from_width,
)

if TYPE_CHECKING:
    from gpuctl.tui.widgets.overview import NodeList


NAME_W = 12  # characters of a node name on a compact line
PER_GPU_W = 16  # at most this many GPUs of a node drawn as bars on a compact line


def gpu_bars(gpus: Iterable[GpuSample]) -> str:
    """One character per GPU, its utilization as a bar (an idle GPU a low one), ✕ if lost."""
    out = []
    for g in gpus:
        if g.lost or g.util_gpu is None:
            out.append("✕" if g.lost else "?")
        else:
            step = round(min(100, max(0, g.util_gpu)) / 100 * (len(SPARK_CHARS) - 2))
            out.append(SPARK_CHARS[1 + step])
    return "".join(out)


def node_trouble(s: NodeSnapshot, xid_gpus: set[int], idle: int = 0) -> list[str]:
    """A node's badges counted over its GPUs, worst first: ``LOST×1 XID×2 IDLE×2 PWRCAP×3``;
    ``idle``: its GPUs allocated but idle (``IdleTracker.count``, as the header counts them:
    a span of time, not in the snapshot)."""
    counts: dict[str, int] = {}
    for g in s.gpus:
        for badge in gpu_badges(g, g.index in xid_gpus):
            counts[badge] = counts.get(badge, 0) + 1
    if idle:
        counts["IDLE"] = idle
    first = ("LOST", "XID", "ECC", "REMAP", "HWSLOW", "PWRBRAKE", "HWTHERM", "THERM", "IDLE")
    order = sorted(counts, key=lambda b: (first.index(b) if b in first else len(first), b))
    return [f"{b}×{counts[b]}" for b in order]


class NodeLine:
    """What a compact column needs to draw a node's cells (``NodeList._compact``)."""

    __slots__ = ("dim", "nodes", "plain", "s", "stale")

    def __init__(self, nodes: NodeList, s: NodeSnapshot) -> None:
        self.nodes = nodes
        self.s = s
        self.dim = nodes._style("nodelist--dim")
        self.stale = s.state is not NodeState.LIVE
        self.plain = self.dim if self.stale else PLAIN

    def style(self, name: str) -> Style:
        return self.dim if self.stale else self.nodes._style(name)

    def totals(self) -> NodeTotals:
        return self.nodes.store.node_totals(self.s.name)


def _draw_node(r: NodeLine, w: int, gap: str) -> list[Segment]:
    name = node_str(r.s.name, limit=TEXT_LIMIT)
    return [Segment(f" {name[: w - 1]:<{w - 1}}{gap}", r.nodes._style("nodelist--name"))]


def _draw_state(r: NodeLine, w: int, gap: str) -> list[Segment]:
    word = {"live": "● live", "stale": "◐ stale", "unreachable": "✖ down"}.get(
        r.s.state.value, "○ …"
    )
    return [Segment(f"{word:<{w}}{gap}", r.nodes._style(STATE_CLASSES[r.s.state]))]


def _draw_gpus(r: NodeLine, w: int, gap: str) -> list[Segment]:
    return [Segment(f"{r.totals().gpus:>{w}}{gap}", r.dim)]


def _draw_mean_util(r: NodeLine, w: int, gap: str) -> list[Segment]:
    t = r.totals()
    util = f"{t.util_sum / t.util_n:.0f}%" if t.util_n else "-"
    return [Segment(f"{util:>{w}}{gap}", r.style("nodelist--util"))]


def _draw_per_gpu(r: NodeLine, w: int, gap: str) -> list[Segment]:
    return [Segment(f"{gpu_bars(r.s.gpus[:w]):<{w}}{gap}", r.style("nodelist--spark"))]


def _draw_node_mem(r: NodeLine, w: int, gap: str) -> list[Segment]:
    gpus = r.s.gpus
    used = sum(g.mem_used for g in gpus if g.mem_used is not None and not g.lost)
    total = sum(g.mem_total for g in gpus if g.mem_total is not None and not g.lost)
    return [Segment(f"{fmt_gib_pair(used, total):>{w}}{gap}", r.plain)]


def _draw_hottest(r: NodeLine, w: int, gap: str) -> list[Segment]:
    temps = [g.temp for g in r.s.gpus if g.temp is not None and not g.lost]
    hot = max(temps) if temps else None
    text = "-" if hot is None else f"{hot}°C"
    return [Segment(f"{text:>{w}}{gap}", r.style(LEVEL_CLASSES[r.nodes.levels.temp(hot)]))]


def _draw_node_power(r: NodeLine, w: int, gap: str) -> list[Segment]:
    return [Segment(f"{fmt_power(r.totals().power):>{w}}{gap}", r.plain)]


def _draw_node_trouble(r: NodeLine, _w: int, _gap: str) -> list[Segment]:
    nodes, s = r.nodes, r.s
    trouble = node_trouble(s, nodes.store.xid_gpus(s.name), nodes.store.fleet.idle.count(s.name))
    burning = sum(1 for g in s.gpus if nodes.store.is_burning(s, g.index))
    if burning:
        trouble.append(f"BURN×{burning}")
    segs = []
    for item in trouble:
        badge = item.partition("×")[0]
        cls = "nodelist--burn" if badge == "BURN" else BADGE_CLASSES.get(badge, "nodelist--dim")
        segs += [Segment(item, nodes._style(cls)), Segment(" ")]
    return segs


def _fixed(cells: int) -> Cells:
    return from_width((0, cells))


# The compact list's columns (``v``: a node a line), left to right; "per_gpu" is as wide as
# ``NodeList.per_gpu_w`` (the most GPUs a node has, up to ``PER_GPU_W``).
COMPACT_COLUMNS: tuple[Column, ...] = (
    Column("node", " NODE", _fixed(NAME_W + 1), _draw_node, "<", gap=1, reading=False),
    Column("state", "STATE", _fixed(8), _draw_state, "<", gap=0, reading=False),
    Column("gpus", "GPUS", _fixed(4), _draw_gpus, gap=1),
    Column("util", "UTIL", _fixed(5), _draw_mean_util, gap=1, sort="util"),
    Column("per_gpu", "PER GPU", _fixed(PER_GPU_W), _draw_per_gpu, "<", gap=1),
    Column("mem", "MEMORY", _fixed(9), _draw_node_mem, gap=1, sort="mem"),
    Column("temp", "MAX°C", _fixed(6), _draw_hottest, gap=1, sort="temp"),
    Column("power", "POWER", _fixed(7), _draw_node_power, gap=1, sort="power"),
    Column("flags", "TROUBLE", from_width(), _draw_node_trouble, sort="flags", rest=""),
)


@functools.lru_cache(maxsize=64)
def compact_columns_at(per_gpu: int) -> tuple[Cell, ...]:
    """``COMPACT_COLUMNS`` with their cells, the per-GPU bars ``per_gpu`` wide."""
    return tuple(
        Cell(c, per_gpu if c.key == "per_gpu" else c.cells(0, False), " " * c.gap)
        for c in COMPACT_COLUMNS
    )
