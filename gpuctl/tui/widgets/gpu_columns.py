"""A GPU's row of the list (``COLUMNS``, left to right): each column draws its cells from a
``Row``; ``columns_at`` says which columns a list of a width shows, and ``row_plan`` the same as
plain tuples for the painter (``overview.NodeList._gpu``)."""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any

from rich.segment import Segment
from rich.style import Style

from gpuctl.core.format import fmt_age
from gpuctl.core.model import BurnState, GpuSample, NodeSnapshot, NodeState
from gpuctl.node import metrics
from gpuctl.node.metrics import Metric, flagged
from gpuctl.tui.procview import gpu_owners
from gpuctl.tui.text import node_str
from gpuctl.tui.view import (
    TAG_W,
    bar,
    fmt_gib_pair,
    gpu_badges,
    level,
    mem_fraction,
    power_fraction,
    screen_word,
    sparkline,
)
from gpuctl.tui.widgets.columns import (
    BADGE_CLASSES,
    LEVEL_CLASSES,
    PLAIN,
    TEXT_LIMIT,
    Cell,
    Cells,
    Column,
    Draw,
    from_width,
)

if TYPE_CHECKING:
    from gpuctl.tui.widgets.overview import NodeList


SPARK_WIDTH = 12
BAR_WIDTH = 8


# A burn's colour by its state: a finished one dimmed (its verdict stays a minute), a failed one
# red as a fault; starting and running ones in the burn's own colour.
BURN_CLASSES = {"done": "nodelist--burn-ended", "failed": "nodelist--badge"}


def burn_text(burn: BurnState, now: float | None = None, rate: bool = True) -> str:
    """The burn column of a GPU row, e.g. BURN 412 TF/s 0 err 14m left, from a burn
    annotation (the time left when ``now`` is given and the burn runs; the TF/s unless not
    ``rate``)."""
    state = burn.get("state") or "?"
    parts = ["BURN" if state == "running" else f"BURN {state}"]
    tflops = burn.get("tflops")
    number = isinstance(tflops, int | float) and not isinstance(tflops, bool)
    if rate and number and abs(tflops) < 1e9:  # type: ignore[arg-type]
        parts.append(f"{tflops:.0f} TF/s")  # a huge int would not even convert to a float
    errors = burn.get("errors")
    if isinstance(errors, int) and not isinstance(errors, bool) and abs(errors) < 1 << 64:
        parts.append(f"{errors} err")
    verdict = burn.get("verdict")
    if verdict:
        parts.append(str(verdict))
    ends_at = burn.get("ends_at")
    if (
        now is not None
        and state in ("starting", "running")
        and isinstance(ends_at, int | float)
        and not isinstance(ends_at, bool)
        and math.isfinite(ends_at)
    ):
        parts.append(f"{fmt_age(max(0.0, min(ends_at - now, 1e9)))} left")
    return " ".join(parts)


class Row:
    """What a column needs to draw one GPU's cells (``NodeList._gpu`` makes one per row)."""

    __slots__ = ("dim", "empty", "g", "nodes", "plain", "s", "stale")

    def __init__(self, nodes: NodeList, s: NodeSnapshot, g: GpuSample, dim: Style) -> None:
        self.nodes = nodes
        self.s = s
        self.g = g
        self.dim = dim
        self.stale = s.state is not NodeState.LIVE
        self.plain = dim if self.stale else PLAIN  # a figure without a level
        self.empty = nodes._style("nodelist--bar-empty")  # a bar's empty part

    def style(self, name: str) -> Style:
        """A component class's style, dim on a node that is not live."""
        return self.dim if self.stale else self.nodes._style(name)

    def level(self, n: int) -> Style:
        return self.style(LEVEL_CLASSES[n])


def _draw_index(r: Row, w: int, gap: str) -> list[Segment]:
    return [Segment(f"{r.g.index:>{w}}{gap}", r.dim)]


def _draw_model(r: Row, w: int, gap: str) -> list[Segment]:
    """A GPU's model tag, while a shown node has several models (the header of a node of one
    model names it: the rows do not repeat it)."""
    model = node_str(r.nodes.model_tags(r.s)[1].get(r.g.index, "?"), limit=w)
    return [Segment(f"{model:<{w}}{gap}")]


def _draw_util(r: Row, w: int, gap: str) -> list[Segment]:
    g = r.g
    ul = r.style("nodelist--util")  # busy is healthy: never the alarm colour
    filled, rest = bar(None if g.util_gpu is None else g.util_gpu / 100, w - 5)
    pct = "-" if g.util_gpu is None else f"{g.util_gpu}%"
    return [Segment(filled, ul), Segment(rest, r.empty), Segment(f"{pct:>5}{gap}", ul)]


def _draw_mem(r: Row, w: int, gap: str) -> list[Segment]:
    g = r.g
    mf = mem_fraction(g)
    ml = r.level(r.nodes.levels.mem(mf))  # red only past [tui] mem_critical
    filled, rest = bar(mf, w - 9)
    pair = fmt_gib_pair(g.mem_used, g.mem_total)
    return [Segment(filled, ml), Segment(rest, r.empty), Segment(f"{pair:>9}{gap}", ml)]


def _draw_temp(r: Row, w: int, gap: str) -> list[Segment]:
    t = r.g.temp
    return [Segment(f"{'-' if t is None else f'{t}°C':>{w}}{gap}", r.level(r.nodes.levels.temp(t)))]


def _draw_power(r: Row, w: int, gap: str) -> list[Segment]:
    g = r.g
    pw = "-" if g.power is None else f"{g.power:.0f}"
    pl = "-" if g.power_limit is None else f"{g.power_limit:.0f}"
    style = r.level(min(1, level(power_fraction(g), 0.8, 0.97)))
    text = pw + "/" + pl + "W" if w >= POWER_W else pw + "W"  # narrow: the draw only
    return [Segment(f"{text:>{w}}{gap}", style)]


def _draw_clock(r: Row, w: int, gap: str) -> list[Segment]:
    clock = "-" if r.g.sm_clock is None else f"{r.g.sm_clock}MHz"
    return [Segment(f"{clock:>{w}}{gap}", r.plain)]


def _draw_figure(m: Metric) -> Draw:
    """A registry reading as the registry prints it (fan, P-state, video engines, PCIe; PCIe's
    figure bare, "12.3": its title says GB/s)."""
    suffix = m.shown != "GB/s"

    def draw(r: Row, w: int, gap: str) -> list[Segment]:
        text = metrics.fmt(m, getattr(r.g, m.key), suffix=suffix)
        return [Segment(f"{text:>{w}}{gap}", r.plain)]

    return draw


def _draw_recent(r: Row, w: int, gap: str) -> list[Segment]:
    spark = sparkline(r.nodes.store.util_history(r.s.name, r.g.index, w), w)
    return [Segment(spark + gap, r.style("nodelist--spark"))]


def _draw_rest(r: Row, w: int, _gap: str) -> list[Segment]:
    """Trouble, the Slurm job and user, a burn, then (last: a narrow row cuts it first) who
    runs processes on the GPU; ``p`` shows them all. In a row too narrow (``w`` cells left)
    for them all, the burn gives up its TF/s first: its errors and time left, and the owner
    after them, stay."""
    nodes, s, g = r.nodes, r.s, r.g
    st = nodes._style
    segs: list[Segment] = []
    badges = gpu_badges(g, (s.name, g.index) in nodes.store.xids)
    if (idle := nodes.store.fleet.idle.idle_for(s.name, g.index)) is not None:
        badges.append(f"IDLE {fmt_age(idle)}")
    for badge in badges:  # red for faults only: a power cap at full load is normal
        cls = BADGE_CLASSES.get(badge.partition(" ")[0], "nodelist--dim")
        segs.append(Segment(node_str(badge, limit=TEXT_LIMIT), st(cls)))
        segs.append(Segment(" "))
    if badges:
        segs.append(Segment(" "))
    ann = s.annotations.get(g.index) or {}
    job, user = ann.get("slurm_job"), ann.get("slurm_user")
    if job or user:
        who = " ".join(str(x) for x in (job and f"job {job}", user) if x)
        segs.append(Segment(node_str(who, limit=TEXT_LIMIT) + "  ", st("nodelist--job")))
    owners = gpu_owners(g)
    owner = node_str(owners, limit=40) if owners and owners != user else ""
    burn = nodes.store.burn(s, g.index)
    if burn is not None:
        now = nodes.store.clock()
        text = node_str(burn_text(burn, now), limit=TEXT_LIMIT)
        used = sum(seg.cell_length for seg in segs) + len(owner)
        if used + len(text) + 2 > w:
            text = node_str(burn_text(burn, now, rate=False), limit=TEXT_LIMIT)
        cls = BURN_CLASSES.get(burn.get("state") or "", "nodelist--burn")
        segs.append(Segment(text + "  ", st(cls)))
    if owner:
        segs.append(Segment(owner, st("nodelist--job")))
    return segs


POWER_W = 9  # cells of the power column ("699/700W") from 90 columns; narrower "699W"
BAR_CELLS = from_width((160, 2 * BAR_WIDTH), (90, BAR_WIDTH))  # a bar's cells (none below 90)


def _model_cells(_width: int, mixed: bool) -> int:
    """A model tag while a shown node mixes models; else none (the header names the model)."""
    return TAG_W if mixed else 0


def _bar_cells(figure: int) -> Cells:
    """A bar column's cells: the bar, then its ``figure``."""
    return lambda width, mixed: BAR_CELLS(width, mixed) + figure


def list_title(m: Metric) -> str:
    """A registry column's title: PCIe's with its unit ("TX GB/s": its figures are bare)."""
    return f"{m.title[-2:]} GB/s" if m.shown == "GB/s" else m.title


FIGURE_CELLS = {"%": 4, "": 3, "GB/s": 5}  # by shown unit: "100%", "P12", "123.4" (GB/s)


def reading_column(
    key: str,
    cells: int | Cells = 190,
    draw: Draw | None = None,
    title: str | None = None,
    **kw: Any,
) -> Column:
    """A column of the metric registry's reading ``key``: its title, its sort (flag "sort"),
    drawn as the registry prints it unless ``draw``. ``cells``: a list width (from there it
    shows, its figure as wide as its title or shown unit needs) or a ``Cells``."""
    m = metrics.BY_KEY[key]
    title = list_title(m) if title is None else title
    if isinstance(cells, int):
        cells = from_width((cells, max(len(title), FIGURE_CELLS.get(m.shown, 6))))
    sort = screen_word(m) if "sort" in m.flags else None
    return Column(key, title, cells, draw or _draw_figure(m), sort=sort, **kw)


# The registry's list columns (flag "list", in its order), placed and drawn here where they
# differ from a figure at 190 columns; a new "list" metric needs no line here.
_PLACED: dict[str, Column] = {
    c.key: c
    for c in (
        reading_column("util_gpu", _bar_cells(5), _draw_util, align="bar", figure=5),
        reading_column("mem_used", _bar_cells(9), _draw_mem, align="bar", figure=9),
        reading_column("temp", from_width((0, 5)), _draw_temp),
        reading_column("power", from_width((90, POWER_W), (0, 5)), _draw_power),
        reading_column("sm_clock", from_width((110, 7)), _draw_clock, "SM CLK"),  # "1980MHz"
        reading_column("fan", 160),
        reading_column("pstate", 160),
    )
}

# The GPU list's columns, left to right.
COLUMNS: tuple[Column, ...] = (
    Column("index", "#", from_width((0, 4)), _draw_index, gap=1, reading=False),
    Column("model", "MODEL", _model_cells, _draw_model, "<", gap=1, reading=False),
    *(_PLACED.get(m.key) or reading_column(m.key) for m in flagged("list")),
    Column("recent", "RECENT", from_width((140, SPARK_WIDTH), (110, 8)), _draw_recent, "<"),
    Column(
        "flags",
        "FLAGS",
        from_width(),
        _draw_rest,
        sort="flags",
        rest=" · JOB · USER · BURN · OWNERS",
    ),
)


# The columns that give way, first to last, while the flags, job, burn and owners (the last
# column) have fewer than ``REST_W`` cells: a burning GPU that throttles needs about 50
# ("THERM PWRCAP  BURN 705 TF/s 0 err 58m left  alice"). Its words were cut at every width.
GIVES_WAY = ("fan", "pstate", "enc", "dec", "pcie_tx", "pcie_rx", "sm_clock", "recent")
REST_W = 52


@functools.lru_cache(maxsize=64)
def columns_at(width: int, mixed: bool = False) -> tuple[Cell, ...]:
    """The columns a list ``width`` cells wide shows, with their cells (``mixed``: a shown node
    has GPUs of several models); the last one's cells are the rest of the line."""
    shown = {c.key: c.cells(width, mixed) for c in COLUMNS}
    rest = next(c.key for c in COLUMNS if c.rest is not None)

    def room() -> int:
        return width - sum(n + c.gap for c in COLUMNS if (n := shown[c.key]) and c.key != rest)

    for key in GIVES_WAY:
        if room() >= REST_W:
            break
        shown[key] = 0
    return tuple(
        Cell(c, max(0, room()) if c.key == rest else shown[c.key], " " * c.gap)
        for c in COLUMNS
        if shown[c.key] or c.key == rest
    )


@functools.lru_cache(maxsize=64)
def row_plan(width: int, mixed: bool) -> tuple[tuple[Draw, int, str, bool], ...]:
    """``columns_at`` as plain tuples for the row painter: (draw, cells, gap, reading). A row
    is painted per flush for each GPU on screen, and a NamedTuple's fields are read through
    descriptors: read per column they made a row at 80 columns 4-9% dearer than the list's
    hand-drawn row before the column model, 1-3% unpacked (``benchmarks/list_rows.py``)."""
    return tuple(
        (c.column.draw, c.width, c.gap, c.column.reading) for c in columns_at(width, mixed)
    )
