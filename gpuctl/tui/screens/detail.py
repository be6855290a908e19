"""Node detail: per-metric plots of one GPU's history, its processes, static facts, events."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.color import Color
from textual.containers import Grid, Horizontal, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static
from textual_plotext import PlotextPlot

from gpuctl.core.format import GIB, fmt_age, reader_text
from gpuctl.core.model import NodeEvent, NodeSnapshot
from gpuctl.tui.store import FleetStore
from gpuctl.tui.text import node_str, node_text
from gpuctl.tui.view import node_age_text, short_model

MAX_POINTS = 240  # a plot is at most ~120 cells wide: more points only cost time
CELL_LIMIT = 300  # characters of a process cell: a command line can be megabytes
LINE_LIMIT = 400  # characters of a line of facts or events
PLOT_LIMIT = 1e9  # no GPU metric in these units (%, GiB, °C, W, MHz) comes near

# metric id, title; "clock" also draws the memory clock as a second line
PLOTS: tuple[tuple[str, str], ...] = (
    ("util", "utilization %"),
    ("mem", "memory used GiB"),
    ("temp", "temperature °C"),
    ("power", "power W"),
    ("clock", "clocks MHz: SM, memory"),
)


def _points(
    times: list[float], values: list[float | None], now: float, scale: float
) -> tuple[list[float], list[float]]:
    """The plotted points (x: time before ``now`` in ``scale`` units), at most MAX_POINTS of
    them, the newest always among them; a reading no GPU can give (a node's junk) is not
    plotted: plotext cannot scale an axis to 1e308."""
    step = max(1, len(times) // MAX_POINTS)
    xs: list[float] = []
    ys: list[float] = []
    for i in range(len(times) - 1, -1, -step):
        v = values[i]
        if v is not None and abs(v) <= PLOT_LIMIT:
            xs.append((times[i] - now) / scale)
            ys.append(v)
    return xs[::-1], ys[::-1]


def event_text(e: NodeEvent) -> str:
    """An agent event in words ("XID 79", "burn done: OK, 612 TF/s"); an unknown one as its
    kind and its plain fields."""
    d = e.detail
    if e.kind == "xid":
        return f"XID {d.get('xid', '?')}"
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
        self._events_text: str | None = None
        self._info_shown: object = None
        self._ready = False

    def compose(self) -> ComposeResult:
        yield Static(id="detail-title")
        with VerticalScroll(id="detail-body"):
            with Horizontal(id="detail-top"):
                yield Static(id="detail-facts")
                with VerticalScroll(id="detail-events-box"):
                    yield Static(id="detail-events")
            with Grid(id="detail-plots"):
                for metric, _title in PLOTS:
                    yield PlotextPlot(id=f"plot-{metric}", classes="plot")
            yield DataTable(id="detail-procs", cursor_type="row", zebra_stripes=True)
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        table = self.query_one("#detail-procs", DataTable)
        table.add_column("GPU", key="gpu")
        table.add_column("PID", key="pid")
        table.add_column("user", key="user")
        table.add_column("GPU memory", key="mem")
        table.add_column("command", key="command")
        table.border_title = "processes"
        self.query_one("#detail-events-box").border_title = "recent events"
        self.query_one("#detail-facts", Static).border_title = "facts"
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

    def _plots(self) -> None:
        if self.gpu is None:
            return
        hist = self.store.fleet.history(self.node, self.gpu)
        now = self.store.clock()
        times = hist.series("util")[0]
        span = now - times[0] if times else 0.0
        unit, scale = ("minutes", 60.0) if span > 120 else ("seconds", 1.0)
        if span > 3 * 3600:
            unit, scale = "hours", 3600.0
        theme = self.app.current_theme
        colours = [Color.parse(c).rgb for c in (theme.primary, theme.accent or theme.primary)]
        for metric, title in PLOTS:
            plot = self.query_one(f"#plot-{metric}", PlotextPlot)
            plt = plot.plt
            plt.clear_data()
            plt.clear_figure()
            series = ["sm_clock", "mem_clock"] if metric == "clock" else [metric]
            for name, colour in zip(series, colours, strict=False):
                xs, ys = _points(*hist.series(name), now, scale)
                if xs:
                    plt.plot(xs, ys, color=colour, marker="braille")
            plt.title(f"GPU {self.gpu} {title}")
            plt.xlabel(f"{unit} ago")
            if metric == "util":
                plt.ylim(0, 100)
            plot.refresh()

    def _processes(self, s: NodeSnapshot) -> None:
        """Every GPU's processes; users and command lines are the node's, shown as text."""
        table = self.query_one("#detail-procs", DataTable)
        rows: dict[str, tuple[str, str, str, str, str]] = {}
        for g in s.gpus:
            for p in g.processes:
                key = f"{g.index}:{p.pid}"
                mem = "-" if p.mem is None else f"{p.mem / GIB:.1f} GiB"
                rows[key] = (
                    str(g.index),
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
                if str(table.get_cell(key, "mem")) != row[3]:
                    table.update_cell(key, "mem", Text(row[3]), update_width=False)
            else:
                table.add_row(*(Text(cell) for cell in row), key=key)

    def _facts(self, s: NodeSnapshot) -> None:
        info = s.info
        lines = []
        if info is not None:
            lines.append(
                f"host {info.hostname or '?'}  agent {info.agent or '?'}  "
                f"python {info.python or '?'}"
            )
            lines.append(
                f"driver {info.driver or '-'}  CUDA {info.cuda or '-'}  NVML {info.nvml or '-'}"
            )
            lines.append(f"reader {reader_text(info)}")
            for st in info.gpus:
                if st.index != self.gpu:
                    continue
                lines.append(f"GPU {st.index}: {short_model(st.name)}  serial {st.serial or '-'}")
                lines.append(f"  {st.uuid or '-'}")
                mem = "-" if st.mem_total is None else f"{st.mem_total / GIB:.0f} GiB"
                pcie = f"gen{st.pcie_gen} x{st.pcie_width}" if st.pcie_gen else "-"
                lines.append(f"  memory {mem}  power limit {st.power_limit or '-'} W  PCIe {pcie}")
                lines.append(
                    f"  max SM {st.max_sm_clock or '-'} MHz  max mem "
                    f"{st.max_mem_clock or '-'} MHz  MIG {'on' if st.mig_mode else 'off'}"
                )
        else:
            lines.append(s.reason or "no hello from the agent yet")
        facts = "\n".join(node_str(line, limit=LINE_LIMIT) for line in lines)
        self.query_one("#detail-facts", Static).update(node_text(facts, one_line=False))

    def _events(self) -> None:
        """Every kept event, newest first, in words; redrawn when an event or an age changed
        (the app calls this once a second)."""
        events = self.store.fleet.events(self.node)
        now = self.store.clock()
        lines = []
        for e in events[::-1]:
            gpu = "" if e.gpu is None else f"GPU {e.gpu}  "
            line = f"{fmt_age(max(0.0, now - e.t)):>4} ago  {gpu}{event_text(e)}"
            lines.append(node_str(line, limit=LINE_LIMIT))
        text = "\n".join(lines) or "no events"
        if text != self._events_text:
            self._events_text = text
            self.query_one("#detail-events", Static).update(node_text(text, one_line=False))

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
