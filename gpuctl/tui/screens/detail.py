"""Node detail: one GPU now (its readings, throttle reasons, XID), the node's events, the GPU's
processes, then plots of its history and the static facts (what an operator reads first, first).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import ClassVar

from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.color import Color
from textual.containers import Grid, Horizontal, VerticalScroll
from textual.events import Resize
from textual.geometry import Size
from textual.message import Message
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import DataTable, Footer, Static
from textual_plotext import PlotextPlot

from gpuctl.core.format import (
    GIB,
    THROTTLE_BADGES,
    fmt_age,
    reader_text,
    short_model,
    throttle_order,
)
from gpuctl.core.model import GpuSample, MigInstance, NodeEvent, NodeSnapshot
from gpuctl.node import metrics
from gpuctl.node.metrics import BY_KEY
from gpuctl.tui.fleet_store import FleetStore
from gpuctl.tui.text import node_str, node_text
from gpuctl.tui.view import alloc_idle_text, node_age_text, trouble_lines
from gpuctl.workloads.accept_suite.nodehealth import xid_text

MAX_POINTS = 240  # a plot is at most ~120 cells wide: more points only cost time
CELL_LIMIT = 300  # characters of a process cell: a command line can be megabytes
LINE_LIMIT = 400  # characters of a line of facts or events
PLOT_LIMIT = 1e9  # no GPU metric in these units (%, GiB, °C, W, MHz) comes near

# plot id, title, the history columns it draws (one line each): every metric the registry
# (``gpuctl/node/metrics.py``) flags "plot", in the registry's shown units (a test holds it)
PLOTS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("util", "utilization %", ("util",)),
    ("mem", "memory used GiB", ("mem_gib",)),
    ("temp", "temperature °C", ("temp",)),
    ("power", "power W", ("power",)),
    ("clock", "clocks MHz: SM, memory", ("clock", "mem_clock")),
    ("video", "video % (NVENC, NVDEC)", ("enc", "dec")),
    ("pcie", "PCIe GB/s: TX, RX", ("pcie_tx", "pcie_rx")),
)

# the key of a two-series plot: its series' short names
SERIES_KEYS = {
    "clock": "SM",
    "mem_clock": "memory",
    "enc": "NVENC",
    "dec": "NVDEC",
    "pcie_tx": "TX",
    "pcie_rx": "RX",
}


def _points(
    times: list[float], values: list[float | None], now: float
) -> tuple[list[float], list[float]]:
    """The plotted points (x: seconds before ``now``, negative), at most MAX_POINTS of them,
    the newest always among them; a reading no GPU can give (a node's junk) is not plotted:
    plotext cannot scale an axis to 1e308."""
    step = max(1, len(times) // MAX_POINTS)
    xs: list[float] = []
    ys: list[float] = []
    for i in range(len(times) - 1, -1, -step):
        v = values[i]
        if v is not None and abs(v) <= PLOT_LIMIT:
            xs.append(times[i] - now)
            ys.append(v)
    return xs[::-1], ys[::-1]


# Tick steps of the time axis, in seconds: the first that gives at most TIME_TICKS ticks.
TIME_STEPS = (10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 3 * 3600, 6 * 3600, 86400)
TIME_TICKS = 4


def age_label(seconds: float, step: float) -> str:
    """A tick of the time axis: "now", "30s", "10m", "2h" (the unit of the step)."""
    if seconds <= 0:
        return "now"
    if step < 60:
        return f"{seconds:.0f}s"
    if step < 3600:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.0f}h"


def time_ticks(span: float) -> tuple[list[float], list[str]]:
    """Ticks of a time axis ``span`` seconds long ending now, as ages: "90s 60s 30s now" (the
    axis read -93.1 -69.9 ... -0.1 "seconds ago" before)."""
    step = next((s for s in TIME_STEPS if span / s <= TIME_TICKS), TIME_STEPS[-1])
    ticks = [-k * step for k in range(int(span // step), -1, -1)]
    return [float(t) for t in ticks], [age_label(-t, step) for t in ticks]


def value_ticks(lo: float, hi: float, most: int = 5) -> tuple[float, float, list[int]]:
    """Whole-number ticks (a step of 1, 2 or 5 times a power of ten) over ``lo``..``hi`` and
    the axis limits that hold them: the axis read 2469.3, 2479.5 before. A flat line at 0 (an
    idle link's PCIe rate) keeps 0 at the bottom: no reading plotted here is below it."""
    lo, hi = math.floor(lo), math.ceil(hi)
    if hi - lo < 2:
        lo, hi = (0, hi + 2) if lo == 0 else (lo - 1, hi + 1)
    raw = (hi - lo) / (most - 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    step = max(1, int(step))
    first = math.floor(lo / step) * step
    last = math.ceil(hi / step) * step
    return first, last, list(range(int(first), int(last) + 1, step))


PLOT_ROWS = 12  # a plot's height (app.tcss) until it is laid out
PLOT_FRAME_ROWS = 5  # plotext's rows around the plotting area: title, frame, x ticks


def even_limits(first: float, last: float, ticks: int, rows: int) -> tuple[float, float]:
    """The y limits that put ``ticks`` evenly spaced ticks from ``first`` to ``last`` on
    whole rows of a plot ``rows`` high: plotext rounds each tick to its row, and 0 50 100 on
    a plot of 12 rows stood 3 and 4 rows apart. The top grows by what the rows leave over."""
    span = rows - PLOT_FRAME_ROWS  # rows from the lowest tick's to the highest's
    if ticks < 2 or span < ticks - 1 or last <= first:
        return first, last
    per = span // (ticks - 1)  # rows between two ticks
    return first, first + (last - first) / (ticks - 1) * span / per


def even_ticks(lo: float, hi: float, rows: int) -> tuple[float, float, list[int]]:
    """``value_ticks`` for a plot ``rows`` high and the axis limits of ``even_limits``: the
    most ticks (at most 5) whose even spacing leaves at most one row over at the top (5 ticks
    on 7 rows stood a row apart under 3 empty rows)."""
    span = rows - PLOT_FRAME_ROWS
    best: tuple[int, float, float, list[int]] | None = None
    for most in (5, 4, 3, 2):
        first, last, ticks = value_ticks(lo, hi, most)
        bottom, top = even_limits(first, last, len(ticks), rows)
        per = span // max(1, len(ticks) - 1)
        waste = span - per * (len(ticks) - 1) if per else span
        if best is None or waste < best[0]:
            best = (waste, bottom, top, ticks)
        if waste <= 1:
            break
    assert best is not None
    return best[1], best[2], best[3]


def event_text(e: NodeEvent) -> str:
    """An agent event in words ("XID 79: GPU has fallen off the bus: drain and reset the
    node", "burn done: OK, 612 TF/s", "THERM PWRCAP started"); an unknown one as its kind and its
    plain fields."""
    d = e.detail
    if e.kind == "xid":
        return xid_text(d.get("xid", "?"))
    if e.kind == "throttle":
        parts = []
        for what in ("started", "ended"):
            reasons = d.get(what)
            if isinstance(reasons, list) and reasons:
                ordered = throttle_order(str(r) for r in reasons)
                names = " ".join(THROTTLE_BADGES.get(r, r) for r in ordered)
                parts.append(f"{names} {what}")
        return ", ".join(parts)
    if e.kind == "gpu_lost":
        return "fell off the bus" + (f": {d['reason']}" if d.get("reason") else "")
    if e.kind == "burn":
        words = [f"burn {d.get('state') or '?'}"]
        facts = [str(d["verdict"])] if d.get("verdict") else []
        tflops = d.get("tflops_mean") or d.get("tflops")
        if isinstance(tflops, int | float) and not isinstance(tflops, bool) and abs(tflops) < 1e9:
            facts.append(f"{tflops:.0f} TF/s")
        if isinstance(d.get("errors"), int) and d["errors"]:
            facts.append(f"{d['errors']} errors")
        if d.get("reason"):
            facts.append(str(d["reason"]))
        return words[0] + (": " + ", ".join(facts) if facts else "")
    if e.kind == "accept":
        what = d.get("event") or "?"
        code = d.get("rc")
        return f"acceptance {what}" + ("" if code is None else f" (exit code {code})")
    plain = [f"{k} {v}" for k, v in d.items() if isinstance(v, str | int | float | bool)]
    return " ".join([e.kind, *plain])


FOLD_AT = 3  # this many power-cap events of one GPU read as one line


def _power_cap_only(e: NodeEvent) -> bool:
    """A throttle event that starts or ends the power cap alone (a busy GPU's cap comes and
    goes all the time: it is the weather, not news)."""
    if e.kind != "throttle":
        return False
    reasons = [*(e.detail.get("started") or []), *(e.detail.get("ended") or [])]
    return bool(reasons) and all(THROTTLE_BADGES.get(str(r)) == "PWRCAP" for r in reasons)


def event_lines(events: list[NodeEvent], gpu: int | None, now: float) -> list[tuple[str, bool]]:
    """The detail's event lines and whether each is dimmed: GPU ``gpu``'s events first, then
    the node's own (no GPU), then the other GPUs' (dimmed), each part newest first; a GPU's
    power-cap starts and ends folded into one line ("PWRCAP ×14 in 10m") at its newest once
    there are FOLD_AT of them."""
    caps: dict[int | None, list[NodeEvent]] = {}
    for e in events:
        if _power_cap_only(e):
            caps.setdefault(e.gpu, []).append(e)
    parts: tuple[list[tuple[float, str]], ...] = ([], [], [])
    for e in events:
        fold = caps.get(e.gpu, [])
        if len(fold) >= FOLD_AT and any(x is e for x in fold):
            if e is not fold[-1]:
                continue
            text = f"PWRCAP ×{len(fold)} in {fmt_age(max(1.0, e.t - fold[0].t))}"
        else:
            text = event_text(e)
        where = "" if e.gpu is None else f"GPU {e.gpu}  "
        line = f"{fmt_age(max(0.0, now - e.t)):>4} ago  {where}{text}"
        which = 0 if e.gpu == gpu and gpu is not None else (1 if e.gpu is None else 2)
        parts[which].append((e.t, node_str(line, limit=LINE_LIMIT)))
    out: list[tuple[str, bool]] = []
    for i, part in enumerate(parts):
        out += [(line, i == 2) for _t, line in sorted(part, key=lambda x: -x[0])]
    return out


def pack(paragraphs: list[list[Text]], width: int) -> Text:
    """Facts packed into lines ``width`` cells wide, two spaces apart: a fact moves to the next
    line whole (a wrap broke "python 3.11.7" and a GPU's UUID mid-token at 80 columns). A fact
    wider than a line wraps between its words; a word wider than a line ends in an ellipsis.
    Each paragraph starts a line."""
    width = max(1, width)
    lines: list[Text] = []
    for facts in paragraphs:
        line = Text()
        for fact in facts:
            words = [fact] if fact.cell_len <= width else list(fact.split(" "))
            gap = "  "
            for word in words:
                if line.cell_len and line.cell_len + len(gap) + word.cell_len > width:
                    lines.append(line)
                    line = Text()
                if line.cell_len:
                    line.append(gap)
                if word.cell_len > width:
                    word = word.copy()
                    word.truncate(width, overflow="ellipsis")
                line.append_text(word)
                gap = " "  # between the words of one fact
        lines.append(line)
    return Text("\n").join(lines)


class Facts(Widget):
    """Paragraphs of short facts, packed to the widget's width (``pack``)."""

    DEFAULT_CSS = "Facts { height: auto; }"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.paragraphs: list[list[Text]] = []

    def show(self, paragraphs: list[list[Text]]) -> None:
        if paragraphs != self.paragraphs:
            self.paragraphs = paragraphs
            self.refresh(layout=True)

    def text(self) -> Text:
        return pack(self.paragraphs, self.content_size.width)

    def render(self) -> Text:
        return self.text()

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(pack(self.paragraphs, width).split())

    def on_resize(self, _event: Resize) -> None:
        self.refresh(layout=True)


def mig_text(i: MigInstance) -> str:
    """One MIG instance in the detail's "now": "MIG 3g.40gb #1 90% 4.9/39.1 GiB" (its
    profile, DCGM's instance id, GR_ENGINE_ACTIVE, memory used of its own), node text cut."""
    mem = "-" if i.mem_used is None else f"{i.mem_used / GIB:.1f}"
    total = "-" if i.mem_total is None else f"{i.mem_total / GIB:.1f}"
    profile = node_str(i.profile or "?", limit=40)
    return f"MIG {profile} #{node_str(i.id, limit=12)} {_num(i.util, '%')} {mem}/{total} GiB"


def _num(value: float | None, unit: str = "", digits: int = 0) -> str:
    """A reading, or "-" (none, or junk no GPU reports: 1e308 W)."""
    if value is None or not math.isfinite(value) or abs(value) > PLOT_LIMIT:
        return "-"
    return f"{value:.{digits}f}{unit}"


def _video(g: GpuSample) -> str | None:
    if g.enc is None and g.dec is None:
        return None
    return f"NVENC {_num(g.enc, '%')} NVDEC {_num(g.dec, '%')}"


def _pcie(g: GpuSample) -> str | None:
    if g.pcie_tx is None and g.pcie_rx is None:
        return None
    tx, rx = (metrics.fmt(BY_KEY[k], getattr(g, k)) for k in ("pcie_tx", "pcie_rx"))
    return f"PCIe TX {tx} RX {rx}"


def _memory(g: GpuSample) -> str:
    mem = "-" if g.mem_used is None else f"{g.mem_used / GIB:.1f}"
    total = "-" if g.mem_total is None else f"{g.mem_total / GIB:.0f}"
    return f"memory {mem}/{total} GiB"


# A GPU's "now" facts are the registry's readings in its order (``metrics.METRICS``): each one
# as its screen word and the figure the registry prints ("fan 30%") while it is known, unless
# it is placed here: in words of its own, shown with the reading it pairs with, or (None) not
# shown. A new reading needs no line here.
NOW_FACTS: dict[str, Callable[[GpuSample], str | None] | None] = {
    "util_gpu": lambda g: f"util {_num(g.util_gpu, '%')}",
    "util_mem": None,  # the memory controller's share: the list's and the CSV's, not here
    "mem_used": _memory,
    "mem_total": None,  # in "memory"
    "temp": lambda g: _num(g.temp, "°C"),
    "power": lambda g: f"power {_num(g.power)}/{_num(g.power_limit, ' W')}",
    "power_limit": None,  # in "power"
    "sm_clock": lambda g: f"SM {_num(g.sm_clock, ' MHz')}",
    "mem_clock": lambda g: f"mem clock {_num(g.mem_clock, ' MHz')}",
    "pstate": lambda g: node_str(g.pstate, limit=40) if g.pstate else None,
    "enc": _video,
    "dec": None,  # in "enc"
    "pcie_tx": _pcie,
    "pcie_rx": None,  # in "pcie_tx"
}


def now_facts(g: GpuSample) -> list[str]:
    """The "now" facts of GPU sample ``g`` (``NOW_FACTS``), in the registry's order."""
    out = []
    for m in metrics.METRICS:
        draw = NOW_FACTS.get(m.key, _by_registry(m))
        fact = None if draw is None else draw(g)
        if fact is not None:
            out.append(fact)
    return out


def _by_registry(m: metrics.Metric) -> Callable[[GpuSample], str | None]:
    def draw(g: GpuSample) -> str | None:
        value = getattr(g, m.key)
        return None if value is None else f"{m.name} {node_str(metrics.fmt(m, value), limit=40)}"

    return draw


class DetailScreen(Screen[None]):
    """Everything about one node; left/right step through its GPUs."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "back", "back", id="back"),
        Binding("left", "gpu(-1)", "prev GPU", id="prev_gpu"),
        Binding("right", "gpu(1)", "next GPU", id="next_gpu"),
    ]

    class GpuChosen(Message):
        """The screen now shows another GPU (the app follows, for s/S/r)."""

        def __init__(self, node: str, gpu: int | None) -> None:
            super().__init__()
            self.node = node
            self.gpu = gpu

    def __init__(self, store: FleetStore, node: str, gpu: int | None) -> None:
        super().__init__()
        self.store = store
        self.node = node
        self.gpu = gpu
        self._version = -1
        self._events_text: list[tuple[str, bool]] | None = None
        self._info_shown: object = None
        self._ready = False

    def compose(self) -> ComposeResult:
        yield Static(id="detail-title")
        with VerticalScroll(id="detail-body"):
            with Horizontal(id="detail-top"):
                yield Facts(id="detail-now")
                with VerticalScroll(id="detail-events-box"):
                    yield Static(id="detail-events")
            yield DataTable(id="detail-procs", cursor_type="row", zebra_stripes=True)
            with Grid(id="detail-plots"):
                for metric, _title, _series in PLOTS:
                    yield PlotextPlot(id=f"plot-{metric}", classes="plot")
            yield Facts(id="detail-facts")
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        table = self.query_one("#detail-procs", DataTable)
        table.add_column("PID", key="pid")
        table.add_column("user", key="user")
        table.add_column("GPU memory", key="mem")
        table.add_column("command", key="command")
        self.query_one("#detail-events-box").border_title = "recent events"
        self.query_one("#detail-facts", Facts).border_title = "facts"
        self.app.theme_changed_signal.subscribe(self, lambda _t: self.refresh_all())
        self._ready = True
        self.refresh_all()
        # a node read from a store (Prometheus) has hours of history there: plot them too
        self.run_worker(self.store.fleet.backfill(self.node), exit_on_error=False)

    # -- updates (called by the app when this node changed) -----------------------------------
    def refresh_all(self) -> None:
        self._version = -1
        self._info_shown = None
        self.node_changed()

    def node_changed(self) -> None:
        snap = self.store.snaps.get(self.node)
        if snap is None or not self._ready:
            return
        if self.gpu is None and snap.gpus:
            self.gpu = snap.gpus[0].index
        version = self.store.version.get(self.node, 0)
        self._title(snap)
        if version != self._version:
            self._version = version
            self._now(snap)
            self._plots()
            self._processes(snap)
        if snap.info is not self._info_shown:
            self._info_shown = snap.info
            self._facts(snap)
        self._events()

    def _title(self, s: NodeSnapshot) -> None:
        gpu = "" if self.gpu is None else f"  ·  GPU {self.gpu} {self.store.model(s, self.gpu)}"
        age = node_age_text(s, self.store.clock())
        title = node_text(f" {s.name}  ·  {age}  ·  {s.link}{gpu}", limit=LINE_LIMIT)
        self.query_one("#detail-title", Static).update(title, layout=False)

    def _theme_style(self, which: str) -> Style:
        theme = self.app.current_theme
        colour = getattr(theme, which, None) or theme.primary
        return Style(color=colour, bold=True)

    def _now(self, s: NodeSnapshot) -> None:
        """The GPU's readings, then its trouble: throttle reasons in words, an XID named with
        what to do, ECC and remapped rows, a lost GPU."""
        box = self.query_one("#detail-now", Facts)
        box.border_title = "now" if self.gpu is None else f"GPU {self.gpu} now"
        g: GpuSample | None = next((x for x in s.gpus if x.index == self.gpu), None)
        if g is None:
            box.show([[Text(node_str(s.reason or "no reading of this GPU yet", limit=LINE_LIMIT))]])
            return
        styles = {
            "alarm": self._theme_style("error"),
            "warn": self._theme_style("warning"),
            "plain": Style(),
        }
        last_xid = self.store.last_xid(self.node, self.gpu)
        lines = [
            Text(node_str(text, limit=200), styles[kind])
            for text, kind in trouble_lines(g, last_xid)
        ]
        xid = [lines.pop()] if last_xid is not None else []
        paragraphs: list[list[Text]] = []
        burn = s.burn(g.index)
        if burn:  # a burn on this GPU explains its load, heat and power cap: say it first
            from gpuctl.tui.widgets.gpu_columns import burn_text

            running = s.burning(g.index)
            said = burn_text(burn, self.store.clock()) + ("" if running else " (finished)")
            paragraphs.append(
                [Text(node_str(said, limit=LINE_LIMIT), styles["warn"] if running else "")]
            )
        idle = self.store.fleet.idle.idle_for(self.node, g.index)
        if idle is not None:  # allocated but idle: who holds it, since when
            notes = s.annotations.get(g.index) or {}
            said = alloc_idle_text(
                idle, notes.get("slurm_job"), notes.get("slurm_user"), self.store.fleet.idle.below
            )
            paragraphs.append([Text(node_str(said, limit=LINE_LIMIT), styles["warn"])])
        if g.lost:
            paragraphs.append(lines)
        else:
            facts = now_facts(g)
            paragraphs.append([Text(f) for f in facts])
            if g.mig:  # a GPU in MIG mode whose instances are known (read from Prometheus)
                paragraphs.append([Text(mig_text(i)) for i in g.mig])
            paragraphs.append(lines or [Text("not throttled")])
        if xid:
            paragraphs.append(xid)
        box.show(paragraphs)

    def _plots(self) -> None:
        if self.gpu is None:
            return
        hist = self.store.fleet.history(self.node, self.gpu)
        now = self.store.clock()
        times = hist.series("util")[0]
        span = max(1.0, now - times[0]) if times else 60.0
        xticks, xlabels = time_ticks(span)
        theme = self.app.current_theme
        colours = [Color.parse(c).rgb for c in (theme.primary, theme.accent or theme.primary)]
        for metric, title, series in PLOTS:
            plot = self.query_one(f"#plot-{metric}", PlotextPlot)
            plt = plot.plt
            plt.clear_data()
            plt.clear_figure()
            ys_all: list[float] = []
            for name, colour in zip(series, colours, strict=False):
                xs, ys = _points(*hist.series(name), now)
                if xs:  # two series: a key names each colour
                    key = SERIES_KEYS.get(name) if len(series) > 1 else None
                    plt.plot(xs, ys, color=colour, marker="braille", label=key)
                    ys_all += ys
            plt.title(f"GPU {self.gpu} {title}")
            plt.xlim(-span, 0)
            plt.xticks(xticks, xlabels)
            lo, hi = (
                (0.0, 100.0)
                if metric in ("util", "video")
                else (min(ys_all, default=0.0), max(ys_all, default=1.0))
            )
            bottom, top, yticks = even_ticks(lo, hi, plot.size.height or PLOT_ROWS)
            plt.ylim(bottom, top)
            plt.yticks([float(y) for y in yticks], [str(y) for y in yticks])
            plot.refresh()

    def _processes(self, s: NodeSnapshot) -> None:
        """This GPU's processes; users and command lines are the node's, shown as text."""
        table = self.query_one("#detail-procs", DataTable)
        rows: dict[str, tuple[str, str, str, str]] = {}
        for g in s.gpus:
            if g.index != self.gpu:
                continue
            for p in g.processes:
                key = f"{g.index}:{p.pid}"
                mem = "-" if p.mem is None else f"{p.mem / GIB:.1f} GiB"
                rows[key] = (
                    "?" if p.pid is None else str(p.pid),
                    node_str(p.user or "?", limit=CELL_LIMIT),
                    mem,
                    node_str(p.command or "?", limit=CELL_LIMIT),
                )
        existing = {str(k.value) for k in table.rows}
        for key in existing - rows.keys():
            table.remove_row(key)
        for key, row in rows.items():
            if key in existing:
                if str(table.get_cell(key, "mem")) != row[2]:
                    table.update_cell(key, "mem", Text(row[2]), update_width=False)
            else:
                table.add_row(*(Text(cell) for cell in row), key=key)
        gpu = "" if self.gpu is None else f" on GPU {self.gpu}"
        table.border_title = f"processes{gpu}" if rows else f"no processes{gpu}"

    def _facts(self, s: NodeSnapshot) -> None:
        """What does not change: the node's host, agent and driver, the GPU's identity."""
        info = s.info
        paragraphs: list[list[str]] = []
        if info is not None:
            paragraphs.append(
                [
                    f"host {info.hostname or '?'}",
                    f"agent {info.agent or '?'}",
                    f"python {info.python or '?'}",
                    f"driver {info.driver or '-'}",
                    f"CUDA {info.cuda or '-'}",
                    f"NVML {info.nvml or '-'}",
                    f"reader {reader_text(info)}",
                ]
            )
            if info.boot_time is not None and s.last_sample_t is not None:
                up = max(0.0, s.last_sample_t - info.boot_time)
                days = f"{int(up // 86400)}d" if up >= 2 * 86400 else fmt_age(up)
                paragraphs[-1].insert(1, f"up {days}")  # since the node booted
            for st in info.gpus:
                if st.index != self.gpu:
                    continue
                mem = "-" if st.mem_total is None else f"{st.mem_total / GIB:.0f} GiB"
                pcie = f"gen{st.pcie_gen} x{st.pcie_width}" if st.pcie_gen else "-"
                paragraphs.append(
                    [
                        f"GPU {st.index}: {short_model(st.name)}",
                        f"serial {st.serial or '-'}",
                        f"{st.uuid or '-'}",
                        f"memory {mem}",
                        f"power limit {st.power_limit or '-'} W",
                        f"PCIe {pcie}",
                        f"max SM {st.max_sm_clock or '-'} MHz",
                        f"max mem {st.max_mem_clock or '-'} MHz",
                        f"MIG {'on' if st.mig_mode else 'off'}",
                    ]
                )
        else:
            paragraphs.append([s.reason or "no hello from the agent yet"])
        self.query_one("#detail-facts", Facts).show(
            [[Text(node_str(f, limit=LINE_LIMIT)) for f in para] for para in paragraphs]
        )

    def _events(self) -> None:
        """This GPU's events first, then the node's own, then the other GPUs' dimmed, each part
        newest first, in words; a power cap that comes and goes folded into one line per GPU.
        Redrawn when an event or an age changed (the app calls this once a second)."""
        lines = event_lines(self.store.fleet.events(self.node), self.gpu, self.store.clock())
        if lines != self._events_text:
            self._events_text = lines
            text = Text("\n").join(
                node_text(line, Style(dim=True) if dim else "") for line, dim in lines
            )
            self.query_one("#detail-events", Static).update(text or Text("no events"))
            box = self.query_one("#detail-events-box")
            box.border_title = "events" if self.gpu is None else f"events: GPU {self.gpu} first"
        if self.store.troubles is not None:  # the trouble log's, kept across restarts (e)
            n = len(self.store.troubles.newest(node=self.node, acked=False))
            note = f"e: the log, {n} unacknowledged" if n else "e: the log"
            box = self.query_one("#detail-events-box")
            if box.border_subtitle != note:
                box.border_subtitle = note

    # -- actions ------------------------------------------------------------------------------
    def action_back(self) -> None:
        self.app.pop_screen()

    def action_gpu(self, step: int) -> None:
        snap = self.store.snaps.get(self.node)
        if snap is None or not snap.gpus:
            return
        indices = [g.index for g in snap.gpus]
        i = indices.index(self.gpu) if self.gpu in indices else 0
        self.gpu = indices[(i + step) % len(indices)]
        self.refresh_all()
        self.post_message(self.GpuChosen(self.node, self.gpu))
