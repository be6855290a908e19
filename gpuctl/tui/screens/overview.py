"""The main screen: the cluster header, the GPUs / jobs / acceptance panes, the filter line."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Container, Horizontal
from textual.content import Content, Span
from textual.screen import Screen
from textual.widgets import ContentSwitcher, Footer, Input, Label, Static

from gpuctl.core.model import GpuSample, NodeState
from gpuctl.fleet import myjobs
from gpuctl.tui.fleet_store import FleetStore
from gpuctl.tui.keys import escape_filter, offer
from gpuctl.tui.messages import FleetChanged
from gpuctl.tui.screens.detail import DetailScreen
from gpuctl.tui.text import node_text
from gpuctl.tui.view import (
    METRIC_TITLES,
    METRICS,
    PROBLEMS,
    TROUBLE_TITLES,
    FilterError,
    fmt_power,
    parse_filter,
    trouble_lines,
    worst_trouble,
)
from gpuctl.tui.widgets.heatmap import HeatLegend, Heatmap
from gpuctl.tui.widgets.node_procs import NodeProcs
from gpuctl.tui.widgets.overview import GpuColumns, NodeList
from gpuctl.tui.widgets.panes import AcceptPane, JobsPane

if TYPE_CHECKING:
    from gpuctl.jobs.store import JobStore

PANES = ("gpus", "jobs", "accept")


class ClusterHeader(Horizontal):
    """The top line: name, SIMULATED / READ-ONLY markers, cluster totals, the filter."""

    def __init__(self, *, simulated: bool, read_only: bool) -> None:
        super().__init__(id="header")
        self.simulated = simulated
        self.read_only = read_only
        self._totals: list[str] = []  # the figures, longest way of saying them first
        self._counts: dict[str, int] | None = None  # the trouble counts shown

    def on_resize(self, _event: events.Resize) -> None:
        """A new width: the figures said as fits it (once the labels have their widths)."""
        self.call_after_refresh(self.fit_totals)

    def compose(self) -> ComposeResult:
        yield Label(" gpuctl ", id="brand")
        if self.simulated:
            yield Label(" SIMULATED ", id="mark-simulated", classes="marker")
        if self.read_only:
            yield Label(" READ-ONLY ", id="mark-read-only", classes="marker")
        yield Label("", id="trouble")
        yield Label("", id="totals")
        yield Label("", id="filter-shown")

    def fit_totals(self) -> None:
        """Show the longest way of saying the figures that fits their label's width."""
        if not self.is_mounted:
            return
        t = self.query_one("#totals", Label)
        if not self.size.width:
            return  # not laid out yet: its resize fits them
        width = self.size.width - t.styles.margin.width
        for label in self.query(Label):  # the room the others leave, from what they say
            if label is not t and label.display:
                text = Text(str(label.content))
                width -= text.cell_len + label.styles.padding.width + label.styles.margin.width
        shown = next(
            (x for x in self._totals if len(x) <= width),
            self._totals[-1] if self._totals else "",
        )
        if str(t.content) != shown:
            # fixed size: a relayout per sample costs ~20 ms
            t.update(Text(shown, end=""), layout=False)

    def show_trouble(self, counts: dict[str, int]) -> None:
        """The problems counted, worst first, each a link that filters the list by it."""
        if counts == self._counts:
            return  # most flushes: the same counts (their line and a query cost ~0.1 ms)
        self._counts = dict(counts)
        label = self.query_one("#trouble", Label)
        line = trouble_content(counts)
        if label.content != line:
            label.set_class(not counts_any(counts), "-none")
            label.update(line)  # rare (a count changes): the relayout is affordable
            self.call_after_refresh(self.fit_totals)  # the figures' room changed

    def show(self, totals: Sequence[str] | None, filter_text: str, matches: bool = True) -> None:
        """The cluster's figures (None: as they are), each way of saying them shorter than
        the one before: the longest that fits the line's width is shown (``totals_texts``:
        the units stay); and the filter."""
        if totals is not None:  # else the figures stay, and so does their room: the labels
            self._totals = list(totals)  # that take it, and a resize, fit them again
            self.fit_totals()
        f = self.query_one("#filter-shown", Label)
        shown = f"filter: {filter_text}" if filter_text else ""
        if filter_text and not matches:
            shown += " (no match)"
        if str(f.content) != shown:
            f.update(node_text(shown))  # what the user typed: text, not markup
            self.call_after_refresh(self.fit_totals)  # the figures' room changed


COMPACT_ABOVE_NODES = 2  # more configured nodes than this, on a small terminal: one line each
SMALL = (80, 30)  # a terminal of at most these columns and rows is small (80x24: 1.5 nodes fit)


def starts_compact(nodes: int, columns: int, rows: int) -> bool:
    """Whether the list starts in the compact view (a line per node, ``v`` toggles it): more
    than two nodes configured on a small terminal, where a row per GPU showed one and a half
    nodes of 8 GPUs at 80x24."""
    return nodes > COMPACT_ABOVE_NODES and 0 < columns <= SMALL[0] and 0 < rows <= SMALL[1]


def totals_texts(live: int, nodes: int, gpus: int, util: str, power: str) -> list[str]:
    """The cluster's figures, each way of saying them shorter than the one before, every one
    with its units (at 80 columns the header showed ``power 10.0``, its kW cut off)."""
    return [
        f"nodes {live}/{nodes} live   GPUs {gpus}   util {util}   power {power}",
        f"{live}/{nodes} live  {gpus} GPUs  util {util}  {power}",
        f"{live}/{nodes} live {gpus} GPUs {util} {power}",
        f"{live}/{nodes} live {util} {power}",
        f"{live}/{nodes} live",
    ]


def counts_any(counts: dict[str, int]) -> bool:
    return any(counts.get(k) for k in PROBLEMS)


def trouble_content(counts: dict[str, int]) -> Content:
    """``2 lost  1 XID  1 down``: each count links to ``screen.trouble(kind)`` (the filter of
    that kind); ``no trouble`` when there is none."""
    if not counts_any(counts):
        return Content("no trouble")
    parts = []
    for k in PROBLEMS:
        if counts.get(k):
            text = f"{counts[k]} {TROUBLE_TITLES[k]}"
            parts.append(Content(text, spans=[Span(0, len(text), f"@click=screen.trouble('{k}')")]))
    return Content("  ").join(parts)


class OverviewScreen(Screen[None]):
    """The main screen: header, the GPUs / jobs / acceptance panes, the filter line, the footer."""

    BINDINGS: ClassVar[list[BindingType]] = [
        # Enter opens the selected GPU as everywhere: in help, not the footer (80 columns)
        Binding("enter", "detail", "detail", show=False, id="detail"),
        Binding("m", "heatmap", "map", id="heatmap"),
        Binding("slash", "filter", "filter", id="filter"),
        Binding(
            "escape",
            "escape",
            "back",
            show=False,
            id="escape",
            tooltip="close or clear the filter; leave the map",
        ),
    ]

    def __init__(
        self,
        store: FleetStore,
        *,
        simulated: bool,
        read_only: bool,
        job_store: JobStore | None,
        job_store_error: str | None = None,
        history_path: Path | None = None,
    ) -> None:
        super().__init__()
        self.store = store
        self.job_store = job_store
        self.job_store_error = job_store_error
        self.history_path = history_path
        self.simulated = simulated
        self.read_only = read_only
        self.mode = "list"  # "list" or a heatmap metric
        self.ready = False
        self.filter_error: str | None = None  # why the filter text cannot be read
        # The header's figures (``update_header``): the counts they last showed, and the live
        # nodes that have not sent a sample since (None: show them at the next flush).
        self._counts_shown: tuple[int, int, int] | None = None
        self._round_left: set[str] | None = None

    def compose(self) -> ComposeResult:
        yield ClusterHeader(simulated=self.simulated, read_only=self.read_only)
        with ContentSwitcher(initial="pane-gpus", id="panes"):
            with Container(id="pane-gpus"):
                yield GpuColumns(id="gpu-columns")
                yield NodeList(self.store, id="nodes")
                yield NodeProcs(
                    self.store, self.list_lines, lambda: self.nodes.cursor, id="node-procs"
                )
                yield Heatmap(self.store, id="heatmap")
                yield HeatLegend(id="heat-legend")
                yield Static("", id="heat-status")
            yield JobsPane(
                self.job_store,
                id="pane-jobs",
                clock=self.store.clock,
                unavailable=self.job_store_error,
            )
            yield AcceptPane(
                id="pane-accept", history_path=self.history_path, clock=self.store.clock
            )
        yield Input(
            placeholder="filter: name, state (live stale down), temp>80 util<5 …", id="filter"
        )
        yield Footer(compact=True, show_command_palette=False)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """The GPU list's keys (detail, map, filter) work, and the footer offers them, on the
        GPUs pane only."""
        if action in ("detail", "heatmap", "filter") and self.ready:
            return self.current_pane() == "gpus"
        return True

    def on_mount(self) -> None:
        self.query_one(Heatmap).display = False
        self.query_one(HeatLegend).display = False
        self.query_one("#heat-status").display = False
        self.query_one("#filter").display = False
        if starts_compact(len(self.store.fleet.nodes), *self.app.size):
            self.nodes.compact = True  # ``v``: a row per GPU again
        self.nodes.rebuild()
        self.nodes.focus()
        # the process panel takes the lines the list leaves: laid out when its length changes
        self.watch(self.nodes, "virtual_size", lambda _size: self.fit_procs(), init=False)
        self.fit_procs()
        self.ready = True
        self.app.post_message(FleetChanged())  # show what arrived while we were composing

    def on_unmount(self) -> None:
        self.ready = False

    @property
    def nodes(self) -> NodeList:
        return self.query_one(NodeList)

    @property
    def heatmap(self) -> Heatmap:
        return self.query_one(Heatmap)

    def active_view(self) -> NodeList | Heatmap:
        return self.nodes if self.mode == "list" else self.heatmap

    def selection(self) -> tuple[str, int | None] | None:
        if self.mode == "list":
            return self.nodes.cursor
        return self.heatmap.selected()

    # -- what the app tells us ----------------------------------------------------------------
    def nodes_changed(self, names: set[str], arrivals: dict[str, float]) -> None:
        """Repaint what changed (the app calls this inside ``batch_update``)."""
        view = self.active_view()
        view.nodes_changed(names)
        view.note_arrivals(arrivals)
        procs = self.query_one(NodeProcs)
        if procs.size.height and procs.node in names:
            procs.refresh()
        if self.mode != "list":
            self.update_heat_status()
        self.update_header(names)

    def nodes_removed(self, gone: Collection[str]) -> None:
        """Nodes that left the fleet, already forgotten by the store (the app calls this inside
        ``batch_update``, before ``nodes_changed``): the view is laid out again without them. A
        cursor on one of them moves to the node shown after it (before it, when it was the
        last), on its first GPU, not back to the top."""
        view = self.active_view()
        if isinstance(view, NodeList):
            shown = [n for n in view.node_order if view.blocks.get(n, (0, None))[1] is not None]
            here = view.cursor[0] if view.cursor is not None else None
        else:
            shown = list(view.names)
            here = shown[view.cursor[0]] if shown else None
        target = None
        if here is not None and here in gone:
            i = shown.index(here) if here in shown else len(shown)
            after = [n for n in shown[i + 1 :] if n in self.store.snaps]
            before = [n for n in reversed(shown[:i]) if n in self.store.snaps]
            target = next(iter(after or before), None)
        self.nodes.forget(gone)
        view.rebuild()
        if target is not None:
            gpus = self.store.snaps[target].gpus
            view.select(target, gpus[0].index if gpus else None)
        if self.mode != "list":
            self.update_heat_status()
        self.update_header()

    def tick(self) -> None:
        """Once a second: ages of stale nodes and down nodes' next tries move on, and so does
        the header (its figures too: ``update_header``)."""
        down = (NodeState.STALE, NodeState.UNREACHABLE)  # ages and next tries count
        if self.mode == "list" and any(s.state in down for s in self.store.snaps.values()):
            self.nodes.refresh_stale_headers()
        self.update_header()

    def update_header(self, changed: Collection[str] | None = None) -> None:
        """The header: trouble counts and the filter as they are; the cluster's figures (nodes
        live, GPUs, mean utilization, power) as they are, but at a flush (``changed``: the
        nodes it brought) only once a round of samples is in: when every live node has sent
        one since the figures were last shown, or the node and GPU counts changed; the tick
        shows them at least once a second. At 512 nodes the flushes come ~9 times a second,
        each with a tenth of the nodes: the figures moved with every partial round, and
        repainting them was a third of the screen's paints (``benchmarks/tui_load.py``)."""
        if not self.ready:
            return
        text: str | None = None
        texts: list[str] | None = None
        left = self._round_left
        if changed is not None and left is not None and self.store.counts() == self._counts_shown:
            left.difference_update(changed)
            if left:
                text = ""  # the round is not in: the figures stay (the sums are not even made)
        if text is None:
            t = self.store.totals()
            util = "-" if t.util_mean is None else f"{t.util_mean:.0f}%"
            # stale and unreachable nodes are counted among the trouble ("down")
            texts = totals_texts(t.live, t.nodes, t.gpus, util, fmt_power(t.power))
            text = texts[0]
            self._counts_shown = (t.live, t.nodes, t.gpus)
            live = NodeState.LIVE
            self._round_left = {n for n, s in self.store.snaps.items() if s.state is live}
        f = self.store.filter
        matches = f.empty or self.store.any_match()
        header = self.query_one(ClusterHeader)
        header.show_trouble(self.store.trouble())
        shown = f.text.strip()
        if f.jobs is not None and matches:  # mine, job:ID: each job's totals beside the filter
            held = [
                replace(s, gpus=tuple(s.gpus[i] for i in at))
                for s in self.store.snaps.values()
                if (at := self.store.visible_gpus(s))
            ]  # the GPUs shown
            shown += " · " + myjobs.summary(myjobs.totals(held, self.store.fleet.idle))
        header.show(texts, shown, matches)

    @on(NodeList.Selected)
    def list_selected(self, _event: NodeList.Selected) -> None:
        """The cursor moved: the panel shows its node (a repaint; its height stays)."""
        panel = self.query_one(NodeProcs)
        if panel.size.height:
            panel.refresh()

    def list_lines(self) -> int | None:
        """The lines the GPU list needs (None: no process panel: the heatmap is shown, or
        nothing is selected)."""
        if self.mode != "list" or not self.is_mounted or self.nodes.cursor is None:
            return None
        return len(self.nodes.lines)

    def fit_procs(self) -> None:
        """The process panel of the node under the cursor, laid out again: it takes the lines
        the GPU list leaves (``NodeProcs.get_content_height``)."""
        self.query_one(NodeProcs).refresh(layout=True)

    def show_pane(self, pane: str) -> None:
        """Switch to pane ``gpus``, ``jobs`` or ``accept`` and focus it."""
        self.query_one(ContentSwitcher).current = f"pane-{pane}"
        self.refresh_bindings()  # the footer offers each pane's keys
        if pane == "gpus":
            self.active_view().focus()
        elif pane == "jobs":
            jobs = self.query_one(JobsPane)
            jobs.reload()
            jobs.query_one("#jobs-table").focus()
        else:
            accept = self.query_one(AcceptPane)
            if not accept.loaded:
                accept.load_history()
            self.query_one("#accept-table").focus()

    def current_pane(self) -> str:
        current = self.query_one(ContentSwitcher).current or "pane-gpus"
        return current.removeprefix("pane-")

    # -- actions ------------------------------------------------------------------------------
    def action_detail(self) -> None:
        sel = self.selection()
        if sel is None:
            self.notify("no node to show", severity="warning")
            return
        self.app.push_screen(DetailScreen(self.store, sel[0], sel[1]))

    def action_heatmap(self) -> None:
        """Cycle: list -> heatmap of each metric -> list."""
        order = ["list", *METRICS]
        sel = self.selection()
        self.mode = order[(order.index(self.mode) + 1) % len(order)]
        heat = self.mode != "list"
        self.nodes.display = not heat
        self.query_one(GpuColumns).display = not heat
        self.heatmap.display = heat
        self.query_one(HeatLegend).display = heat
        self.query_one("#heat-status").display = heat
        if heat:
            self.heatmap.metric = self.mode
            self.query_one(HeatLegend).refresh(layout=True)  # its lines: the metric's words
            self.heatmap.rebuild()
            if sel is not None:
                self.heatmap.select(*sel)
            self.heatmap.focus()
            self.update_heat_status()
        else:
            self.nodes.rebuild()
            if sel is not None:
                self.nodes.select(*sel)
            self.nodes.focus()
        self.fit_procs()

    def action_trouble(self, kind: str) -> None:
        """A header count chosen: the GPUs pane, filtered by that problem (its name is the
        filter language's word for it; Esc clears it)."""
        if kind not in PROBLEMS:
            return
        to_pane = getattr(self.app, "action_pane", None)
        if self.current_pane() != "gpus" and to_pane is not None:
            to_pane("gpus")
        self.set_filter(kind)

    def set_filter(self, text: str) -> None:
        """Filter the list by ``text`` as if typed after ``/`` (the box stays closed)."""
        box = self.query_one("#filter", Input)
        box.value = text  # Input.Changed applies it (filter_changed)

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.display = True
        box.focus()

    def action_escape(self) -> None:
        """Close the filter box (clearing it), else clear a kept filter, else leave the
        heatmap."""
        if escape_filter(self.query_one("#filter", Input), self.active_view()):
            return
        if self.mode != "list":
            self.mode = METRICS[-1]
            self.action_heatmap()

    @on(Input.Changed, "#filter")
    def filter_changed(self, event: Input.Changed) -> None:
        try:
            f = parse_filter(event.value)
        except FilterError as e:
            self.filter_error = str(e)
            event.input.border_title = node_text(str(e))  # it quotes what was typed
            event.input.add_class("-invalid")
            return
        self.filter_error = None
        event.input.border_title = None
        event.input.remove_class("-invalid")
        self.store.filter = f
        self.active_view().rebuild()
        self.call_later(self.update_header)
        self._offer_clear(not f.empty)

    def _offer_clear(self, on: bool) -> None:
        """While a filter is kept the footer offers ``esc unfilter`` in place of ``/ filter``:
        it says the list is filtered, and how to undo that (``/`` still edits it)."""
        offer(self, "escape", on, "unfilter" if on else "back")
        offer(self, "filter", not on)

    @on(Input.Submitted, "#filter")
    def filter_done(self, event: Input.Submitted) -> None:
        if self.filter_error is not None:
            # Closing would leave the last valid prefix of the text filtering, unexplained.
            self.notify(f"filter not applied: {self.filter_error}", severity="warning")
            return
        event.input.display = False
        self.active_view().focus()

    @on(Heatmap.Selected)
    def heat_selected(self, _event: Heatmap.Selected) -> None:
        self.update_heat_status()

    def update_heat_status(self) -> None:
        """The line under the heatmap: the GPU under the cursor (its trouble in the detail
        screen's words, then its readings), then how to change the metric; what does not fit
        the width goes, the hint first, then the model, then the readings."""
        if self.mode == "list":
            return
        sel = self.heatmap.selected()
        key = getattr(self.app, "key_display", None)  # the configured key, not the default
        next_key = "m" if key is None else key("heatmap", "m")
        hint = f"heatmap: {METRIC_TITLES[self.mode]}  ({next_key}: next metric, esc: list)"
        status = self.query_one("#heat-status", Static)
        if sel is None:
            status.update(Text(f" {hint}", end=""), layout=False)
            return
        width = status.size.width or self.app.size.width
        error = self.app.current_theme.error or "red"
        status.update(heat_status(self.store, sel, hint, width, error), layout=False)


def heat_status(
    store: FleetStore, sel: tuple[str, int | None], hint: str, width: int, alarm: str
) -> Text:
    """The heatmap's status line for the GPU ``sel`` in ``width`` cells (see
    ``OverviewScreen.update_heat_status``): the trouble drawn in ``alarm`` colour when it is
    an alarm (lost, XID, ECC), bold when a warning."""
    snap = store.snaps[sel[0]]
    gpu = sel[1]
    if gpu is None:
        return node_text(f" {snap.name} ({snap.state.value})", limit=200)
    g = next((x for x in snap.gpus if x.index == gpu), None)
    name = f"{snap.name} GPU {gpu}"
    model = store.model(snap, gpu)
    trouble = None if g is None else worst_trouble(trouble_lines(g, store.last_xid(snap.name, gpu)))
    readings = [] if g is None else gpu_readings(g)
    if snap.state is not NodeState.LIVE:
        readings.insert(0, snap.state.value)
    tries = [
        (f"{name} {model}", readings, hint),
        (f"{name} {model}", readings, None),
        (name, readings, None),
        (name, [], None),
    ]
    for head, figures, tail in tries:
        line = Text(" ", end="")
        line.append_text(node_text(head, limit=80))
        if trouble is not None:
            text, kind = trouble
            line.append(" · ")
            style = f"bold {alarm}" if kind == "alarm" else "bold" if kind == "warn" else ""
            line.append_text(node_text(text, limit=200, style=style))
        if figures:
            line.append_text(node_text(" · " + " · ".join(figures), limit=200))
        if tail:
            line.append(f"   ·  {tail}")
        if line.cell_len <= width:
            break
    return line


def gpu_readings(g: GpuSample) -> list[str]:
    """A GPU's readings for the status line: util, memory, temperature, power (none when lost:
    its trouble says so)."""
    if g.lost:
        return []
    parts = []
    if g.util_gpu is not None:
        parts.append(f"{g.util_gpu}%")
    if g.mem_used is not None and g.mem_total:
        parts.append(f"{g.mem_used / (1 << 30):.0f}/{g.mem_total / (1 << 30):.0f} GiB")
    if g.temp is not None:
        parts.append(f"{g.temp}°C")
    if g.power is not None:
        parts.append(f"{g.power:.0f} W")
    return parts
