"""The heatmap: one coloured cell per GPU, nodes side by side, 1,024 GPUs on a 160×48 screen."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding, BindingType
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widget import Widget

from gpuctl.core.format import gpu_flags
from gpuctl.core.model import GpuSample, NodeState
from gpuctl.fleet.troublelog import Trouble
from gpuctl.tui.fleet_store import FleetStore
from gpuctl.tui.keys import TROUBLE_KEYS
from gpuctl.tui.messages import GpuSelected
from gpuctl.tui.text import node_str
from gpuctl.tui.view import (
    HEAT_LEVELS,
    METRIC_TITLES,
    METRICS,
    POWER_CAP_REASONS,
    SLOWDOWN_REASONS,
    heat_level,
    heat_scale,
    is_problem,
    metric_fraction,
    next_stop,
    node_is_down,
)

CELL = "  "
GAP = 2


class Heatmap(ScrollView, can_focus=True):
    """Nodes laid out in columns, each a label and a row of GPU cells; the cursor is one cell."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        *(f"heatmap--heat-{i}" for i in range(HEAT_LEVELS)),
        "heatmap--none",
        "heatmap--mark",
        "heatmap--alarm",
        "heatmap--label",
        "heatmap--stale",
        "heatmap--down",
        "heatmap--cursor",
        "heatmap--cursor-label",
        "heatmap--minor",
    }

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up", "move(0,-1)", "up", show=False, id="cursor_up"),
        Binding("down", "move(0,1)", "down", show=False, id="cursor_down"),
        Binding("left", "move(-1,0)", "left", show=False, id="cursor_left"),
        Binding("right", "move(1,0)", "right", show=False, id="cursor_right"),
        *TROUBLE_KEYS,
    ]

    class Selected(GpuSelected):
        """The cursor moved onto a GPU cell."""

    def __init__(self, store: FleetStore, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.store = store
        self.metric = METRICS[0]
        self.names: list[str] = []
        self.per_line = 1
        self.label_w = 8
        self.cells = 1
        self.cursor: tuple[int, int] = (0, 0)  # (node position in names, gpu position)
        self.on_paint: Callable[[str, float], None] | None = None  # (node, arrival): benchmark
        self.painted: dict[str, float] = {}

    # -- layout -------------------------------------------------------------------------------
    def rebuild(self) -> None:
        self.names = [
            n for n in self.store.order if self.store.visible_gpus(self.store.snaps[n]) is not None
        ]
        self.label_w = min(12, max((len(n) for n in self.names), default=4))
        self.cells = max((len(self.store.snaps[n].gpus) for n in self.names), default=1) or 1
        block = self.label_w + 1 + len(CELL) * self.cells + GAP
        self.per_line = max(1, (max(self.size.width, block)) // block)
        rows = -(-len(self.names) // self.per_line) if self.names else 0
        self.virtual_size = Size(self.size.width, rows)
        ni, gi = self.cursor
        self.cursor = (min(ni, max(0, len(self.names) - 1)), gi)
        self.refresh()
        # A new width lays the nodes out in other rows: the cursor's GPU stays on screen.
        self.call_after_refresh(self.cursor_into_view)

    def cursor_into_view(self) -> None:
        """Scroll so that the cursor's row is on screen."""
        self.scroll_to_region_row(self.cursor[0] // self.per_line)

    def nodes_changed(self, names: set[str]) -> None:
        known = set(self.names)
        if any(n not in known for n in names) or any(
            len(self.store.snaps[n].gpus) > self.cells for n in names
        ):
            self.rebuild()
            return
        if self.store.filter.has_gpu_terms or self.store.filter.node_terms:
            self.rebuild()
            return
        index = {n: i for i, n in enumerate(self.names)}
        rows = {index[n] // self.per_line for n in names if n in index}
        for r in rows:
            self.refresh_line(r)

    def on_resize(self, event: events.Resize) -> None:
        self.rebuild()

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self.refresh()

    # -- cursor -------------------------------------------------------------------------------
    def selected(self) -> tuple[str, int | None] | None:
        if not self.names:
            return None
        ni, gi = self.cursor
        snap = self.store.snaps[self.names[ni]]
        gpu = snap.gpus[gi].index if gi < len(snap.gpus) else None
        return snap.name, gpu

    def action_move(self, dx: int, dy: int) -> None:
        if not self.names:
            return
        ni, gi = self.cursor
        old_row = ni // self.per_line
        if dx:
            gi += dx
            n = len(self.store.snaps[self.names[ni]].gpus)
            if gi < 0 and ni > 0:
                ni -= 1
                gi = max(0, len(self.store.snaps[self.names[ni]].gpus) - 1)
            elif gi >= max(1, n) and ni < len(self.names) - 1:
                ni, gi = ni + 1, 0
            gi = max(0, min(gi, max(0, len(self.store.snaps[self.names[ni]].gpus) - 1)))
        if dy:
            target = ni + dy * self.per_line
            if 0 <= target < len(self.names):
                ni = target
                gi = min(gi, max(0, len(self.store.snaps[self.names[ni]].gpus) - 1))
        self.cursor = (ni, gi)
        self.refresh_line(old_row)
        row = ni // self.per_line
        self.refresh_line(row)
        self.scroll_to_region_row(row)
        sel = self.selected()
        if sel is not None:
            self.post_message(self.Selected(*sel))

    def action_problem(self, step: int) -> None:
        """The next (``step`` 1) or previous (-1) GPU in trouble (or down node), in reading
        order, round the end."""
        cells = [(ni, gi) for ni, n in enumerate(self.names) for gi in range(self._cells_of(n))]
        if not cells:
            return
        here = cells.index(self.cursor) if self.cursor in cells else 0
        unacked = self.store.unacked_at()  # the trouble log's unacknowledged rows go first

        def row_at(k: int) -> Trouble | None:
            ni, gi = cells[k]
            snap = self.store.snaps[self.names[ni]]
            g = snap.gpus[gi] if gi < len(snap.gpus) else None
            row = unacked.get((snap.name, None if g is None else g.index))
            return row or (unacked.get((snap.name, None)) if gi == 0 else None)

        def in_trouble(k: int) -> bool:
            ni, gi = cells[k]
            snap = self.store.snaps[self.names[ni]]
            g = snap.gpus[gi] if gi < len(snap.gpus) else None
            if gi and node_is_down(snap):
                return False  # a down node is one problem: its first cell
            return is_problem(snap, g, g is not None and (snap.name, g.index) in self.store.xids)

        k = next_stop(len(cells), here, step, lambda k: row_at(k) is not None, in_trouble)
        if k is not None:
            self.cursor = cells[k]
            self.action_move(0, 0)
            self.refresh()
            row = row_at(k)
            if row is not None:
                self.notify(self.store.unacked_notice(row), timeout=4)
            return
        self.notify("no trouble on the map", timeout=3)

    def _cells_of(self, name: str) -> int:
        """Cells of a node the cursor can stand on (one for a node without GPUs)."""
        return max(1, len(self.store.snaps[name].gpus))

    def scroll_to_region_row(self, row: int) -> None:
        top = int(self.scroll_offset.y)
        if row < top:
            self.scroll_to(y=row, animate=False)
        elif row >= top + self.size.height:
            self.scroll_to(y=row - self.size.height + 1, animate=False)

    def select(self, node: str, gpu: int | None) -> None:
        if node in self.names:
            ni = self.names.index(node)
            snap = self.store.snaps[node]
            gi = next((i for i, g in enumerate(snap.gpus) if g.index == gpu), 0)
            self.cursor = (ni, gi)
            self.refresh()
            self.scroll_to_region_row(ni // self.per_line)

    def on_click(self, event: events.Click) -> None:
        row = event.y + int(self.scroll_offset.y)
        block = self.label_w + 1 + len(CELL) * self.cells + GAP
        col, x = divmod(event.x, block)
        ni = row * self.per_line + col
        gx = x - self.label_w - 1
        if 0 <= ni < len(self.names) and gx >= 0:
            self.cursor = (ni, min(gx // len(CELL), self.cells - 1))
            self.action_move(0, 0)
            self.refresh()

    # -- drawing ------------------------------------------------------------------------------
    def render_line(self, y: int) -> Strip:
        row = y + int(self.scroll_offset.y)
        width = self.size.width
        base = self.rich_style
        first = row * self.per_line
        if first >= len(self.names) or row < 0:
            return Strip.blank(width, base)
        st = self.get_component_rich_style
        heat = [st(f"heatmap--heat-{i}") for i in range(HEAT_LEVELS)]
        none = st("heatmap--none")
        cursor = st("heatmap--cursor")
        cursor_label = st("heatmap--cursor-label")
        # partial: a mark's colour over the cell's own background, not the widget's
        mark_styles = {
            "mark": st("heatmap--mark", partial=True),
            "alarm": st("heatmap--alarm", partial=True),
            "minor": st("heatmap--minor", partial=True),
        }
        blank = Style()
        segs: list[Segment] = []
        for ni in range(first, min(first + self.per_line, len(self.names))):
            name = self.names[ni]
            snap = self.store.snaps[name]
            label = {
                NodeState.STALE: "heatmap--stale",
                NodeState.UNREACHABLE: "heatmap--down",
                NodeState.CONNECTING: "heatmap--stale",
            }.get(snap.state, "heatmap--label")
            shown = node_str(name)[-self.label_w :]  # names can come from Slurm
            # the selected cell's node label stands out as the list's selected row does
            label_style = cursor_label if ni == self.cursor[0] else st(label)
            segs.append(Segment(f"{shown:>{self.label_w}}", label_style))
            segs.append(Segment(" "))
            has_data = snap.state in (NodeState.LIVE, NodeState.STALE)  # stale: last colours
            stale = snap.state is NodeState.STALE
            # Neighbouring cells of one colour become one segment: fewer segments, less work
            # for the compositor on every repaint.
            run_text, run_style = "", blank
            for gi in range(self.cells):
                if gi < len(snap.gpus):
                    g = snap.gpus[gi]
                    lv = heat_level(metric_fraction(g, self.metric)) if has_data else None
                    style = none if lv is None else heat[lv]
                    text = CELL
                    if has_data:
                        text, kind = heat_mark(
                            g,
                            xid=(name, g.index) in self.store.xids,
                            burning=self.store.is_burning(snap, g.index),
                            stale=stale,
                            reading=lv is not None,
                        )
                        if text != CELL:
                            style = style + mark_styles[kind]
                else:
                    style, text = blank, " " * len(CELL)
                if (ni, gi) == self.cursor:
                    if text.strip(" ·"):  # the mark stays, the cursor beside it
                        if run_text:
                            segs.append(Segment(run_text, run_style))
                        segs.append(Segment(text[0], style))
                        style, text = style + cursor, "◀"
                        run_text, run_style = "", blank
                    else:
                        style, text = style + cursor, "◀▶"
                if style is run_style:
                    run_text += text
                else:
                    if run_text:
                        segs.append(Segment(run_text, run_style))
                    run_text, run_style = text, style
            if run_text:
                segs.append(Segment(run_text, run_style))
            segs.append(Segment(" " * GAP))
            if self.on_paint is not None and name in self.painted:
                self.on_paint(name, self.painted.pop(name))
        return Strip(segs).apply_style(base).extend_cell_length(width, base).crop(0, width)

    def note_arrivals(self, arrivals: dict[str, float]) -> None:
        if self.on_paint is None:
            return
        top = int(self.scroll_offset.y)
        index = {n: i for i, n in enumerate(self.names)}
        for name, t in arrivals.items():
            i = index.get(name)
            if i is not None and top <= i // self.per_line < top + self.size.height:
                self.painted.setdefault(name, t)


# A cell's mark, most urgent first: what each letter means is the legend's second half.
MARKS: tuple[tuple[str, str], ...] = (
    ("✕", "lost"),
    ("X", "XID"),
    ("E", "ECC/remap"),
    ("B", "burning"),
    ("T", "slowdown"),  # thermal or hardware
    ("P", "power cap"),
    ("·", "stale"),
    ("?", "no reading"),
)
ALARMS = {"✕", "X", "E"}
MINOR = {"P"}  # normal at full load: drawn quietly, never as an alarm


def heat_mark(
    g: GpuSample, *, xid: bool, burning: bool, stale: bool, reading: bool
) -> tuple[str, str]:
    """The two characters of a GPU's cell (``CELL`` when nothing is to say) and how to draw
    them ("alarm", "mark" or "minor"): its most urgent state (lost, XID seen, ECC or row-remap
    trouble, burning, thermal or hardware slowdown, power cap, no reading of the metric), then
    ``·`` when its node is stale."""
    flags = gpu_flags(g)
    if g.lost:
        first = "✕"
    elif xid:
        first = "X"
    elif "ECC" in flags or "REMAP" in flags:
        first = "E"
    elif burning:
        first = "B"
    elif SLOWDOWN_REASONS.intersection(flags):
        first = "T"
    elif POWER_CAP_REASONS.intersection(flags):
        first = "P"
    elif not reading:
        first = "?"
    else:
        first = " "
    kind = "alarm" if first in ALARMS else "minor" if first in MINOR else "mark"
    return first + ("·" if stale else " "), kind


class HeatLegend(Widget):
    """Under the heatmap: its metric's scale in the heatmap's colours, and the marks; on as
    many lines as the width needs (two at 80 columns, where one line cut the marks off)."""

    DEFAULT_CSS = "HeatLegend { height: auto; }"

    def chunks(self) -> list[Text]:
        """The legend's pieces, each kept whole on a line: the scale, "no data", each mark."""
        maps = self.screen.query(Heatmap)
        if not maps:
            return []
        heat = maps.first()
        st = heat.get_component_rich_style
        low, high = heat_scale(heat.metric)
        scale = Text(f"{METRIC_TITLES.get(heat.metric, heat.metric)} {low} ", end="")
        for i in range(HEAT_LEVELS):
            scale.append(CELL, st(f"heatmap--heat-{i}"))
        scale.append(f" {high}")
        none = Text("", end="")
        none.append("  ", st("heatmap--none"))
        none.append(" no data")
        out = [scale, none]
        for mark, meaning in MARKS:
            kind = "alarm" if mark in ALARMS else "minor" if mark in MINOR else "mark"
            piece = Text("", end="")
            piece.append(mark, st(f"heatmap--{kind}", partial=True))
            piece.append(f" {meaning}")
            out.append(piece)
        return out

    def lines(self, width: int) -> list[Text]:
        """The pieces laid out in lines of ``width`` cells (a piece too long for one: cut)."""
        lines: list[Text] = []
        line = Text(" ", end="")
        for piece in self.chunks():
            gap = "  " if line.cell_len > 1 else ""
            if line.cell_len > 1 and line.cell_len + len(gap) + piece.cell_len > width:
                lines.append(line)
                line, gap = Text(" ", end=""), ""
            line.append(gap)
            line.append_text(piece)
        lines.append(line)
        return lines

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return max(1, len(self.lines(width)))

    def on_resize(self, _event: events.Resize) -> None:
        self.refresh(layout=True)  # another width may need another number of lines

    def render(self) -> Text:
        return Text("\n", end="").join(self.lines(self.size.width or 80))
