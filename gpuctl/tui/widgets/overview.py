"""The overview: one panel per node, one row per GPU, drawn with the Line API.

Only the lines on screen are ever rendered (a thousand GPUs cost what forty do), and a node's
update repaints only that node's lines. Colours come from component classes styled in
``app.tcss`` with theme variables. Every string a node sent reaches a segment through
``node_str`` (no control characters; segments are never parsed as markup).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Collection, Iterable
from typing import Any, ClassVar, NamedTuple

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding, BindingType
from textual.geometry import Region, Size
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widget import Widget

from gpuctl.core.format import counted, fmt_age, host_text, reader_text, short_model
from gpuctl.core.model import BurnState, GpuSample, NodeInfo, NodeSnapshot, NodeState
from gpuctl.fleet.troublelog import Trouble
from gpuctl.node import metrics
from gpuctl.node.metrics import Metric, flagged
from gpuctl.tui.fleet_store import FleetStore
from gpuctl.tui.gpusort import SORT_BY_KEY, next_sort, order_gpus, order_nodes
from gpuctl.tui.keys import TROUBLE_KEYS
from gpuctl.tui.messages import GpuSelected
from gpuctl.tui.procview import gpu_owners
from gpuctl.tui.text import node_str
from gpuctl.tui.view import (
    SPARK_CHARS,
    TAG_W,
    Levels,
    NodeTotals,
    bar,
    down_text,
    fmt_gib_pair,
    fmt_power,
    gpu_badges,
    is_problem,
    level,
    mem_fraction,
    model_tags,
    models_text,
    next_stop,
    node_is_down,
    power_fraction,
    screen_word,
    sparkline,
)

SPARK_WIDTH = 12
BAR_WIDTH = 8
# A sorted list re-sorts this often (and on ``o`` or a filter): rows do not move under the
# cursor with every sample, and between re-sorts no sample costs a sort.
RESORT_S = 5.0


# Narrower than this, a node's header takes two lines: its state and GPUs, then its host's
# load, driver, CUDA and reader (on one line, a 120-column list cut every header before the
# driver). Wider, one line holds all of it (about 180 characters).
ONE_LINE_HEAD_W = 190


# A badge's colour: faults in the alarm colour, slowdowns as a warning, the rest (a power cap,
# sync boost) quiet.
BADGE_CLASSES = {
    "LOST": "nodelist--badge",
    "XID": "nodelist--badge",
    "ECC": "nodelist--badge",
    "REMAP": "nodelist--badge",
    "THERM": "nodelist--slow",
    "HWTHERM": "nodelist--slow",
    "HWSLOW": "nodelist--slow",
    "PWRBRAKE": "nodelist--slow",
    "IDLE": "nodelist--slow",  # allocated but idle: "IDLE 42m" (``gpuctl.fleet.idle``)
}
LEVEL_CLASSES = ("nodelist--ok", "nodelist--warm", "nodelist--hot")
STATE_CLASSES = {
    NodeState.LIVE: "nodelist--live",
    NodeState.STALE: "nodelist--stale",
    NodeState.UNREACHABLE: "nodelist--down",
    NodeState.CONNECTING: "nodelist--dim",
}
LIVE_OR_STALE = (NodeState.LIVE, NodeState.STALE)
TEXT_LIMIT = 300  # characters of one node string on a line (the line is cut at the edge anyway)


class Line(NamedTuple):
    kind: str  # "head" | "head2" (the header's second line) | "gpu" | "msg" | "gap" | "node"
    # (compact: a whole node on one line) | "nomatch" (the filter hides every node)
    node: str
    gpu: int | None  # GPU index for "gpu" lines


class NodeList(ScrollView, can_focus=True):
    """Every node's panel in one scrolling list; the cursor selects a GPU (or a GPU-less node)."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "nodelist--header",
        "nodelist--name",
        "nodelist--live",
        "nodelist--stale",
        "nodelist--down",
        "nodelist--dim",
        "nodelist--ok",
        "nodelist--warm",
        "nodelist--hot",
        "nodelist--bar-empty",
        "nodelist--badge",
        "nodelist--job",
        "nodelist--burn",
        "nodelist--burn-ended",
        "nodelist--spark",
        "nodelist--cursor",
        "nodelist--util",
        "nodelist--slow",
    }

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up", "cursor(-1)", "up", show=False, id="cursor_up"),
        Binding("down", "cursor(1)", "down", show=False, id="cursor_down"),
        Binding("left", "node(-1)", "previous node", show=False, id="cursor_left"),
        Binding("right", "node(1)", "next node", show=False, id="cursor_right"),
        Binding("pageup", "page(-1)", "page up", show=False, id="page_up"),
        Binding("pagedown", "page(1)", "page down", show=False, id="page_down"),
        Binding("home", "edge(-1)", "first", show=False, id="cursor_home"),
        Binding("end", "edge(1)", "last", show=False, id="cursor_end"),
        *TROUBLE_KEYS,
        Binding("o", "sort", "sort GPUs", show=False, id="gpu_sort"),
        Binding("v", "compact", "one line per node", show=False, id="compact"),
    ]

    class Selected(GpuSelected):
        """The cursor moved onto a node's GPU (``gpu`` None: the node itself)."""

    def __init__(self, store: FleetStore, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.store = store
        self.lines: list[Line] = []
        self.blocks: dict[str, tuple[int, tuple[int, ...] | None]] = {}  # node -> (first y, rows)
        self.head2: set[str] = set()  # the nodes whose header takes two lines
        self._narrow: bool | None = None  # narrower than ONE_LINE_HEAD_W when last resized
        self.cursor: tuple[str, int | None] | None = None
        self.cursor_y = 0
        self.painted: dict[str, float] = {}  # node -> arrival time waiting for its paint
        self.on_paint: Callable[[str, float], None] | None = None  # (node, arrival): benchmark
        self.sort: str | None = None  # a key of gpusort.SORTS; None: the fleet's order
        self.compact = False  # one line per node
        self._down_shown: dict[str, str] = {}  # a down node's state words as last painted
        self.node_order: list[str] = []  # the nodes in the order shown
        self.per_gpu_w = PER_GPU_W  # compact: the width of the per-GPU bars
        # A shown node has GPUs of several models: narrow rows tag each GPU's (``columns_at``)
        self.mixed = False
        self.levels = Levels()  # warm and hot temperature and memory: ``[tui]``, on mount
        self._tags: dict[str, tuple[NodeInfo | None, tuple[bool, dict[int, str]]]] = {}
        # A sort holds still between re-sorts: the order of the nodes and of each one's GPUs
        # (positions in its ``gpus``) when last sorted, and when that was (monotonic).
        self.resort_s = RESORT_S
        self._sorted_at = 0.0
        self._sorted_nodes: dict[str, int] = {}
        self._sorted_rows: dict[str, dict[int, int]] = {}
        self._base: Style | None = None  # ``rich_style``, until the styles change (``_base_style``)

    def on_mount(self) -> None:
        tui = getattr(self.app, "tui_settings", None)
        if tui is not None:
            self.levels = Levels.from_settings(tui)

    def forget(self, gone: Collection[str]) -> None:
        """Nodes that left the fleet: nothing of them is kept here (a node that comes back
        under the same name is a new one)."""
        for name in gone:
            for kept in (self.painted, self._down_shown, self._tags, self._sorted_rows,
                         self._sorted_nodes):  # fmt: skip
                kept.pop(name, None)

    # -- layout -------------------------------------------------------------------------------
    def _block_rows(self, name: str) -> tuple[int, ...] | None:
        snap = self.store.snaps[name]
        if self.sort is None and self.store.filter.empty:
            return _every_row(len(snap.gpus))  # each changed node, at each flush
        shown = self.store.visible_gpus(snap)
        if shown is None:
            return None
        if self.sort is not None and not self.compact:
            held = self._sorted_rows.get(name)
            if held is None:
                shown = order_gpus(snap, shown, self.sort, self.store.xid_gpus(name))
                self._sorted_rows[name] = {p: i for i, p in enumerate(shown)}
            else:
                shown = sorted(shown, key=lambda p: held.get(p, len(held)))
        return tuple(shown)

    def _order(self) -> list[str]:
        """The nodes as shown: the fleet's order, or the order of the last sort (a node that
        came since then last)."""
        if self.sort is None:
            return list(self.store.order)
        if not self._sorted_nodes:
            self._resort()
        held = self._sorted_nodes
        return sorted(self.store.order, key=lambda n: held.get(n, len(held)))

    def _resort(self) -> None:
        """Sort again from the newest samples; ``_order`` and ``_block_rows`` hold it."""
        self._sorted_at = time.monotonic()
        self._sorted_rows = {}
        if self.sort is None:
            self._sorted_nodes = {}
            return
        snaps = [self.store.snaps[n] for n in self.store.order]
        names = order_nodes(snaps, self.sort, self.store.xid_gpus)
        self._sorted_nodes = {n: i for i, n in enumerate(names)}

    def _resort_due(self) -> bool:
        return self.sort is not None and time.monotonic() - self._sorted_at >= self.resort_s

    def _height(self, name: str, rows: tuple[int, ...]) -> int:
        """Lines of a shown node's block: one when compact, else header (one or two lines),
        rows (or a message) and a gap."""
        if self.compact:
            return 1
        return 2 + (name in self.head2) + max(1, len(rows))

    def _two_line_head(self, name: str, narrow: bool) -> bool:
        """Whether a node's header takes two lines on a list ``narrow``er than ONE_LINE_HEAD_W:
        once the node said what it runs (its hello) or its host's load."""
        s = self.store.snaps[name]
        return narrow and not self.compact and (s.info is not None or s.host is not None)

    def rebuild(self) -> None:
        """Recompute every node's block (after a filter change or a change of GPU count)."""
        lines: list[Line] = []
        blocks: dict[str, tuple[int, tuple[int, ...] | None]] = {}
        head2: set[str] = set()
        narrow = self.size.width < ONE_LINE_HEAD_W
        self.node_order = self._order()
        most = max((len(self.store.snaps[n].gpus) for n in self.node_order), default=0)
        self.per_gpu_w = max(len("PER GPU"), min(PER_GPU_W, most))
        mixed = False
        for name in self.node_order:
            rows = self._block_rows(name)
            blocks[name] = (len(lines), rows)
            if rows is None:
                continue
            snap = self.store.snaps[name]
            mixed = mixed or self.model_tags(snap)[0]
            if self.compact:
                lines.append(Line("node", name, None))
                continue
            lines.append(Line("head", name, None))
            if self._two_line_head(name, narrow):
                lines.append(Line("head2", name, None))
                head2.add(name)
            if rows:
                lines.extend(Line("gpu", name, snap.gpus[i].index) for i in rows)
            else:
                lines.append(Line("msg", name, None))
            lines.append(Line("gap", name, None))
        if not lines and not self.store.filter.empty:
            lines.append(Line("nomatch", "", None))
        self.lines = lines
        self.blocks = blocks
        self.head2 = head2
        if mixed != self.mixed:
            self.mixed = mixed
            if self.is_mounted:
                self._columns_changed()  # the model tag's title comes or goes
        self.virtual_size = Size(self.size.width, len(lines))
        self._place_cursor()
        self.refresh()

    def nodes_changed(self, names: set[str]) -> None:
        """Repaint the lines of changed nodes that are on screen; re-layout if a block changed."""
        if not self.lines and not self.blocks:
            self.rebuild()
            return
        if self._resort_due():
            self.resort_in_place()
            return
        narrow = self.size.width < ONE_LINE_HEAD_W  # once: a widget's size is no attribute
        for name in names:
            old = self.blocks.get(name)
            if old is None or old[1] != self._block_rows(name):
                self.rebuild()
                return
            if (name in self.head2) != (old[1] is not None and self._two_line_head(name, narrow)):
                self.rebuild()
                return
            snap = self.store.snaps[name]
            if not self.mixed and old[1] is not None and self.model_tags(snap)[0]:
                self.rebuild()  # the first node of several models: narrow rows tag GPUs
                return
        top = int(self.scroll_offset.y)
        bottom = top + self.size.height
        for name in names:
            y0, rows = self.blocks[name]
            if rows is None:
                continue
            n = self._height(name, rows)
            if y0 < bottom and y0 + n > top:
                self.refresh_lines(y0, n)

    def resort_in_place(self) -> None:
        """Sort again; the selected GPU stays selected, on the same line of the screen."""
        row = self.cursor_y - int(self.scroll_offset.y)
        self._resort()
        self.rebuild()
        if self.cursor is not None and self.lines:
            self.scroll_to(y=max(0, self.cursor_y - row), animate=False, immediate=True)

    def refresh_stale_headers(self) -> None:
        """Ages tick every second for stale nodes, and a down node's next try counts down:
        repaint just their header lines (a down node's only when its words changed)."""
        top = int(self.scroll_offset.y)
        for y in range(top, min(len(self.lines), top + self.size.height)):
            line = self.lines[y]
            if line.kind not in ("head", "node"):
                continue
            snap = self.store.snaps[line.node]
            if snap.state is NodeState.STALE or (
                snap.state is NodeState.UNREACHABLE
                and self._down_shown.get(line.node) != self._state_text(snap)
            ):
                self.refresh_line(y)

    # -- cursor -------------------------------------------------------------------------------
    def selectable(self, line: Line) -> bool:
        return line.kind in ("gpu", "msg", "node")

    def _place_cursor(self) -> None:
        target = None
        if self.cursor is not None:
            for y, line in enumerate(self.lines):
                if (line.node, line.gpu) == self.cursor and self.selectable(line):
                    target = y
                    break
            if target is None:  # the row went away (filter): stay near the node
                y0 = self.blocks.get(self.cursor[0], (None, None))[0]
                target = self._next_selectable(y0 if y0 is not None else self.cursor_y, 1)
        if target is None:
            target = self._next_selectable(0, 1)
        self._move_to(target, post=self.cursor is None or target is not None)

    def _next_selectable(self, start: int, step: int) -> int | None:
        y = max(0, min(start, len(self.lines) - 1))
        while 0 <= y < len(self.lines):
            if self.selectable(self.lines[y]):
                return y
            y += step
        return None

    def _move_to(self, y: int | None, post: bool = True) -> None:
        if y is None:
            if self.cursor is not None and not any(self.selectable(x) for x in self.lines):
                self.cursor = None  # nothing to select (the filter hides every node)
            return
        old_y = self.cursor_y
        line = self.lines[y]
        new = (line.node, line.gpu)
        changed = new != self.cursor
        self.cursor = new
        self.cursor_y = y
        self.refresh_line(old_y)
        self.refresh_line(y)
        self._scroll_cursor_into_view()
        if changed and post:
            self.post_message(self.Selected(line.node, line.gpu))

    def _scroll_cursor_into_view(self) -> None:
        y = self.cursor_y
        line = self.lines[y] if y < len(self.lines) else None
        top = int(self.scroll_offset.y)
        height = max(1, self.size.height)
        if line is not None and y < top + 2:
            head = self.blocks.get(line.node, (y, None))[0]  # show the node's header too
            self.scroll_to(y=min(y, head), animate=False)
        elif y >= top + height:
            self.scroll_to(y=y - height + 2, animate=False)

    def action_cursor(self, step: int) -> None:
        if not self.lines:
            return
        y = self.cursor_y + step
        while 0 <= y < len(self.lines) and not self.selectable(self.lines[y]):
            y += step
        if 0 <= y < len(self.lines):
            self._move_to(y)

    def action_node(self, step: int) -> None:
        if not self.lines or self.cursor is None:
            return
        names = [n for n in self.node_order if self.blocks.get(n, (0, None))[1] is not None]
        if self.cursor[0] not in names:
            return
        i = names.index(self.cursor[0]) + step
        if 0 <= i < len(names):
            self._move_to(self._next_selectable(self.blocks[names[i]][0], 1))

    def action_page(self, step: int) -> None:
        if not self.lines:
            return
        y = max(0, min(len(self.lines) - 1, self.cursor_y + step * max(1, self.size.height - 2)))
        target = self._next_selectable(y, step) or self._next_selectable(y, -step)
        self._move_to(target)

    def action_edge(self, step: int) -> None:
        if self.lines:
            self._move_to(
                self._next_selectable(0, 1) if step < 0 else self._next_selectable(10**9, -1)
            )

    def action_sort(self) -> None:
        """The next order of the GPU list (``gpusort.SORTS``: trouble first, hottest, busiest,
        most idle, most memory, most power, the registry's other "sort" metrics, then the
        fleet's own); the view starts at its top."""
        self.sort = next_sort(self.sort)
        self._resort()
        self.rebuild()
        self.scroll_to(y=0, animate=False, immediate=True)
        self._move_to(self._next_selectable(0, 1))
        self._columns_changed()  # the sorted column's title shows the order

    def line_has_problem(self, line: Line) -> bool:
        """Whether ``n`` stops on ``line``: its GPU's trouble, or its node's (compact)."""
        if not self.selectable(line):
            return False
        snap = self.store.snaps[line.node]
        if line.kind == "gpu":
            g = next((x for x in snap.gpus if x.index == line.gpu), None)
            idle = None if g is None else self.store.fleet.idle.idle_for(line.node, g.index)
            return is_problem(snap, g, (line.node, line.gpu) in self.store.xids) or idle is not None
        return is_problem(snap, None, False) or any(self.store.node_trouble(line.node).values())

    def action_problem(self, step: int) -> None:
        """The next (``step`` 1) or previous (-1) GPU in trouble, round the end of the list."""
        if not self.lines:
            return
        n = len(self.lines)
        unacked = self.store.unacked_at()  # the trouble log's unacknowledged rows go first
        nodes = {node for node, _gpu in unacked}

        def first_of(y: int) -> int | None:
            node = self.lines[y].node
            return self._next_selectable(self.blocks[node][0], 1) if node else y

        def row_at(y: int) -> Trouble | None:
            line = self.lines[y]
            if line.node not in nodes or not self.selectable(line):
                return None
            row = unacked.get((line.node, line.gpu if line.kind == "gpu" else None))
            if row is None and y == first_of(y):
                row = unacked.get((line.node, None))
                if row is None and line.kind == "node":  # compact: any of its GPUs'
                    row = next(r for (m, _g), r in unacked.items() if m == line.node)
            return row

        def in_trouble(y: int) -> bool:
            line = self.lines[y]
            if y != first_of(y) and node_is_down(self.store.snaps[line.node]):
                return False  # a down node is one problem: stop on its first line only
            return self.line_has_problem(line)

        y = next_stop(n, self.cursor_y, step, lambda y: row_at(y) is not None, in_trouble)
        if y is not None:
            self._move_to(y)
            row = row_at(y)
            if row is not None:
                self.notify(self.store.unacked_notice(row), timeout=4)
            return
        self.notify("no trouble in the list", timeout=3)

    def action_compact(self) -> None:
        """One line per node, or back to a row per GPU."""
        self.compact = not self.compact
        if self.compact and self.cursor is not None:
            self.cursor = (self.cursor[0], None)
        elif self.cursor is not None:
            snap = self.store.snaps.get(self.cursor[0])
            if snap is not None and snap.gpus:
                self.cursor = (self.cursor[0], snap.gpus[0].index)
        self.rebuild()
        self._columns_changed()

    def _columns_changed(self) -> None:
        for columns in self.screen.query(GpuColumns):
            columns.refresh()

    def select(self, node: str, gpu: int | None) -> None:
        """Put the cursor on a node's GPU (from the heatmap or a test)."""
        self.cursor = (node, gpu)
        self._place_cursor()

    def on_click(self, event: events.Click) -> None:
        y = event.y + int(self.scroll_offset.y)
        if 0 <= y < len(self.lines):
            target = self._next_selectable(y, 1)
            if target is not None and self.lines[target].node == self.lines[y].node:
                self._move_to(target)

    def on_resize(self, event: events.Resize) -> None:
        narrow = event.size.width < ONE_LINE_HEAD_W
        if narrow != self._narrow:
            self._narrow = narrow
            self.rebuild()  # the headers fold or unfold at this width
        self.virtual_size = Size(event.size.width, len(self.lines))
        if self.lines:  # a smaller window must not leave the cursor out of view
            self.call_after_refresh(self._scroll_cursor_into_view)

    def notify_style_update(self) -> None:
        self._base = None
        super().notify_style_update()
        self.refresh()

    # -- drawing ------------------------------------------------------------------------------
    def _style(self, name: str) -> Style:
        return self.get_component_rich_style(name)

    def _base_style(self) -> Style:
        """``rich_style``, kept until the styles change (``notify_style_update``, which also
        clears Textual's own cache of the component styles made over it): Textual makes it
        afresh at each call, walking the widget's ancestors' styles, and every line painted
        asked for it (~45 lines a second at 4,096 GPUs: 0.55 s of a 30 s profile)."""
        base = self._base
        if base is None:
            base = self._base = self.rich_style
        return base

    def render_line(self, y: int) -> Strip:
        scroll_y = int(self.scroll_offset.y)
        ly = y + scroll_y
        width = self.size.width
        base = self._base_style()
        if ly >= len(self.lines):
            return Strip.blank(width, base)
        line = self.lines[ly]
        if line.kind == "nomatch":
            typed = self.store.filter.text.strip()
            text = f"    no GPU matches the filter {typed!r} (esc clears it)"
            segs = [Segment(node_str(text, limit=TEXT_LIMIT), self._style("nodelist--dim"))]
            return Strip(segs).apply_style(base).extend_cell_length(width, base).crop(0, width)
        snap = self.store.snaps[line.node]
        if line.kind in ("head", "head2"):
            if line.kind == "head2":
                segs = self._head_more(snap)
            elif line.node in self.head2:
                segs = self._head(snap)
            else:
                segs = self._head(snap) + self._head_more(snap)
            strip = Strip(segs).apply_style(base)
            header = self._style("nodelist--header")
            strip = strip.extend_cell_length(width, base + header).crop(0, width)
        elif line.kind == "gpu":
            segs = self._gpu(snap, line.gpu)
            strip = Strip(segs).apply_style(base).extend_cell_length(width, base).crop(0, width)
        elif line.kind == "node":
            segs = self._compact(snap)
            strip = Strip(segs).apply_style(base).extend_cell_length(width, base).crop(0, width)
        elif line.kind == "msg":
            segs = self._msg(snap)
            strip = Strip(segs).apply_style(base).extend_cell_length(width, base).crop(0, width)
        else:
            return Strip.blank(width, base)
        if ly == self.cursor_y and (line.node, line.gpu) == self.cursor:
            # The whole row on the cursor's background, over every other colour in it.
            cursor = Style(bgcolor=self._style("nodelist--cursor").bgcolor, bold=True)
            marked = [Segment("▶", base), *strip.crop(1, width)]
            strip = Strip(Segment.apply_style(marked, post_style=cursor), width)
        if self.on_paint is not None and line.node in self.painted:
            self.on_paint(line.node, self.painted.pop(line.node))
        return strip

    def _head(self, s: NodeSnapshot) -> list[Segment]:
        """A node's header: its name, state, link, GPUs (with their model, which a narrow row
        leaves out), utilization and power; then (``_head_more``) its driver, CUDA, reader and
        host's load, on the same line of a wide list, on a second line of a narrow one."""
        header = self._style("nodelist--header")
        name = header + self._style("nodelist--name")
        state_cls = STATE_CLASSES[s.state]
        dot = {"live": "●", "stale": "◐", "unreachable": "✖", "connecting": "○"}[s.state.value]
        state = header + self._style(state_cls)
        age = node_str(self._shown_state(s), limit=TEXT_LIMIT)
        segs = [
            Segment(" ", header),
            Segment(node_str(s.name, limit=TEXT_LIMIT), name),
            Segment("  ", header),
            Segment(f"{dot} {age}", state),
            Segment(f"  {node_str(s.link, limit=TEXT_LIMIT)}", header),
        ]
        info = s.info
        if info is not None and info.reader is None and info.reader_error:
            why = node_str(info.reader_error, limit=TEXT_LIMIT)
            segs.append(Segment(f"  {why}", header + self._style("nodelist--down")))
        if s.gpus and s.state in (NodeState.LIVE, NodeState.STALE):
            t = self.store.node_totals(s.name)
            util = f"{t.util_sum / t.util_n:.0f}%" if t.util_n else "-"
            models = {st.name for st in info.gpus} if info is not None else set()
            if info is not None and len(models) == 1 and len(info.gpus) == len(s.gpus):
                gpus = f"{t.gpus}× {node_str(short_model(models.pop()), limit=TEXT_LIMIT)}"
            elif info is not None and len(models) > 1 and len(info.gpus) == len(s.gpus):
                # "6× H100 · 2× 4090": the tags narrow rows show (80 columns keep the power)
                tags = models_text({st.index: st.name for st in info.gpus})
                gpus = node_str(tags, limit=TEXT_LIMIT)
            else:
                gpus = counted(t.gpus, "GPU")
            segs.append(Segment(f"  {gpus}  util {util}  {fmt_power(t.power)}", header))
        return segs

    def _head_more(self, s: NodeSnapshot) -> list[Segment]:
        """The rest of a node's header: driver, CUDA, reader and the host's load."""
        header = self._style("nodelist--header")
        info = s.info
        # The host's load: after the versions on a second line (80 columns cut its end), before
        # them on one line (the reader last, as the least urgent).
        host = host_text(s.host) if s.host is not None else ""
        load = [Segment(f"  ·  {host}", header)] if host and s.state in LIVE_OR_STALE else []
        two = s.name in self.head2
        more: list[Segment] = [] if two else list(load)
        if info is not None:
            if info.driver:
                more.append(Segment(f"  driver {node_str(info.driver, limit=TEXT_LIMIT)}", header))
            if info.cuda:
                more.append(Segment(f"  CUDA {node_str(info.cuda, limit=TEXT_LIMIT)}", header))
        if info is not None and info.reader in ("nvml", "nvidia-smi"):
            # The fallback stands out.
            style = header if info.reader == "nvml" else header + self._style("nodelist--warm")
            more.append(Segment(f"  {node_str(reader_text(info), limit=TEXT_LIMIT)}", style))
        if two:
            more += load
            more.insert(0, Segment("  ", header))  # under the name, indented
        elif len(more) > len(load):
            more.insert(len(load), Segment("  ·", header))
        return more

    def _state_text(self, s: NodeSnapshot) -> str:
        """The node's state as its header says it (a down node: last seen, next try)."""
        return down_text(s, self.store.clock(), self.store.retry_in(s.name))

    def _shown_state(self, s: NodeSnapshot) -> str:
        """``_state_text`` for a line being painted: a down node's is kept, so that the
        once-a-second tick repaints it only when its words change."""
        text = self._state_text(s)
        if s.state is NodeState.UNREACHABLE:
            self._down_shown[s.name] = text
        return text

    def _compact(self, s: NodeSnapshot) -> list[Segment]:
        """A whole node on one line (``COMPACT_COLUMNS``): state, GPU count, mean utilization
        and one bar per GPU, memory, hottest GPU, power, and its trouble counted; a down node
        says why after its state, a node without GPUs its message."""
        line = NodeLine(self, s)
        segs: list[Segment] = []
        for cell in compact_columns_at(self.per_gpu_w):
            if cell.column.reading and s.state not in LIVE_OR_STALE:
                state = self._style(STATE_CLASSES[s.state])
                segs.append(Segment(node_str(self._shown_state(s), limit=TEXT_LIMIT), state))
                break
            if cell.column.reading and not s.gpus:
                segs.append(Segment(self._msg_text(s), line.dim))
                break
            segs += cell.column.draw(line, cell.width, cell.gap)
        return segs

    def _msg_text(self, s: NodeSnapshot) -> str:
        return "".join(seg.text for seg in self._msg(s)).strip()

    def _msg(self, s: NodeSnapshot) -> list[Segment]:
        dim = self._style("nodelist--dim")
        if s.state is NodeState.CONNECTING:
            text = "connecting…"
        elif s.state is NodeState.UNREACHABLE:
            text = "no data yet: retrying with backoff (r: reconnect now)"
        elif s.info is not None and s.info.reader is None:
            # The hint first: the reason is long and the line is cut at the panel's edge.
            hint = " (try simulated GPUs: gpuctl demo)" if s.link == "local" else ""
            text = f"no GPU reader{hint}: " + (s.info.reader_error or "unknown")
        else:
            text = "no GPUs"
        return [Segment("    " + node_str(text, limit=TEXT_LIMIT), dim)]

    def _gpu(self, s: NodeSnapshot, index: int | None) -> list[Segment]:
        """A GPU's row: each of ``columns_at``'s columns draws its cells (``COLUMNS``)."""
        g: GpuSample | None = None
        for cand in s.gpus:
            if cand.index == index:
                g = cand
                break
        dim = self._style("nodelist--dim")
        if g is None or index is None:
            return [Segment("  ? gone", dim)]
        row = Row(self, s, g, dim)
        segs: list[Segment] = []
        for draw, width, gap, reading in _plan(self.size.width, self.mixed):
            if reading and g.lost:
                segs.append(Segment("LOST", self._style("nodelist--badge")))
                segs.append(Segment("  GPU fell off the bus", dim))
                break
            segs += draw(row, width, gap)
        return segs

    def model_tags(self, s: NodeSnapshot) -> tuple[bool, dict[int, str]]:
        """Whether a node has GPUs of several models, and ``view.model_tags`` of its GPUs; kept
        until its next hello."""
        held = self._tags.get(s.name)
        if held is not None and held[0] is s.info:
            return held[1]
        models = {st.index: st.name for st in s.info.gpus} if s.info else {}
        tags = (len(set(models.values())) > 1, model_tags(models))
        self._tags[s.name] = (s.info, tags)
        return tags

    # Paint accounting for the benchmark: an arrival is "painted" when its first line renders.
    def note_arrivals(self, arrivals: dict[str, float]) -> None:
        if self.on_paint is None:
            return
        top = int(self.scroll_offset.y)
        view = Region(0, top, 1, self.size.height)
        for name, t in arrivals.items():
            block = self.blocks.get(name)
            if block is not None and block[1] is not None and view.contains(0, block[0]):
                self.painted.setdefault(name, t)


@functools.lru_cache(maxsize=64)  # bounded: a node decides how many GPUs it sends
def _every_row(n: int) -> tuple[int, ...]:
    """``NodeList._block_rows`` of a node of ``n`` GPUs when no filter or sort applies."""
    return tuple(range(n))


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


def node_trouble(s: NodeSnapshot, xid_gpus: set[int]) -> list[str]:
    """A node's badges counted over its GPUs, worst first: ``LOST×1 XID×2 PWRCAP×3``."""
    counts: dict[str, int] = {}
    for g in s.gpus:
        for badge in gpu_badges(g, g.index in xid_gpus):
            counts[badge] = counts.get(badge, 0) + 1
    first = ("LOST", "XID", "ECC", "REMAP", "HWSLOW", "PWRBRAKE", "HWTHERM", "THERM")
    order = sorted(counts, key=lambda b: (first.index(b) if b in first else len(first), b))
    return [f"{b}×{counts[b]}" for b in order]


# -- the GPU list's columns ------------------------------------------------------------------
PLAIN = Style()  # no style (one for every row: a Style costs ~1 us to make, a row ~65 us)


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


# (row, cells, gap) -> the column's segments: ``cells`` wide, then the gap's spaces. The row is
# a ``Row`` (a GPU's line: ``COLUMNS``) or a ``NodeLine`` (a node's compact line).
Draw = Callable[[Any, int, str], list[Segment]]
# (list width, whether a shown node has GPUs of several models) -> cells; 0: not shown
Cells = Callable[[int, bool], int]


def from_width(*steps: tuple[int, int]) -> Cells:
    """A column's cells by the list's width: ``steps`` are (list width, cells), widest first;
    a list narrower than the last step does not show it."""

    def cells(width: int, _mixed: bool) -> int:
        for at, n in steps:
            if width >= at:
                return n
        return 0

    return cells


class Column(NamedTuple):
    """One column of the GPU list: its title, from which width and how wide it shows, how it
    draws a GPU's value, and the sort its title marks. ``COLUMNS`` holds them in their order
    (``COMPACT_COLUMNS`` the compact list's, a node a line); the rows (``NodeList._gpu``,
    ``_compact``) and the titles (``column_titles``) are both drawn from it, so a column is
    added or moved in one place, and a title cannot drift from its figures.

    Narrow, the model goes first (the same on every row of a node and in its header; a node of
    several models keeps a short tag), then the bars, sparkline and SM clock, so that badges,
    the Slurm job, a burn and the owners stay on an 80-column terminal; wide, bars grow (at 200
    columns 8-cell bars left ~45% of the screen empty) and the registry's other list columns
    come in (fan and P-state from 160 columns, the video engines and PCIe from 190)."""

    key: str  # a metric registry key (``metrics.BY_KEY``) for a reading, else the column's word
    title: str
    cells: Cells
    draw: Draw
    # the title over the cells: ">" right-aligned, "<" left; "bar": left over a bar, right over
    # the bare figure (``figure`` cells) when the list is too narrow for the bar
    align: str = ">"
    figure: int = 0
    gap: int = 2  # spaces after the cells
    sort: str | None = None  # the sort's column word (``gpusort.SORTS``) that marks the title
    reading: bool = True  # shows a reading: a lost GPU's row says LOST from the first such
    # the last column (not None): it takes the rest of the line; its title words after the mark
    rest: str | None = None


class Cell(NamedTuple):
    column: Column
    width: int
    gap: str


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
    trouble = node_trouble(s, nodes.store.xid_gpus(s.name))
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


def _titles(cells: tuple[Cell, ...], mark: dict[str, str], width: int | None = None) -> str:
    """Each column's title over its cells (``Column``'s ``align``); a title wider than its
    cells (a sort's mark) takes its gap's first cells, never the next column's. The last
    title's words close up (" · " to "·") where the list's ``width`` is too narrow for them
    spaced: "OWNERS" was cut at 80 columns with a node of two models (the tag column's 6
    cells) and at 120 columns (the model column and sparkline), by 5 and 8 cells."""
    out: list[str] = []
    for cell in cells:
        c, w = cell.column, cell.width
        title = c.title + mark.get(c.sort, "") if c.sort else c.title
        if c.rest is not None:
            rest = c.rest
            if width is not None and sum(map(len, out)) + len(title) + len(rest) > width:
                rest = rest.replace(" · ", "·")
            out.append(title + rest)
            break
        left = c.align == "<" or (c.align == "bar" and w > c.figure)
        text = f"{title:<{w}}" if left else f"{title:>{w}}"
        out.append(text + " " * max(min(1, c.gap), w + c.gap - len(text)))
    return "".join(out)


@functools.lru_cache(maxsize=64)
def _plan(width: int, mixed: bool) -> tuple[tuple[Draw, int, str, bool], ...]:
    """``columns_at`` as plain tuples for the row painter: (draw, cells, gap, reading). A row
    is painted per flush for each GPU on screen, and a NamedTuple's fields are read through
    descriptors: read per column they made a row at 80 columns 4-9% dearer than the list's
    hand-drawn row before the column model, 1-3% unpacked (``benchmarks/list_rows.py``)."""
    return tuple(
        (c.column.draw, c.width, c.gap, c.column.reading) for c in columns_at(width, mixed)
    )


def column_titles(
    width: int, sort: str | None, compact: bool, per_gpu: int = PER_GPU_W, mixed: bool = False
) -> str:
    """The titles above the GPU list, from the columns its rows draw (``columns_at``; compact:
    ``compact_columns_at``), the sorted column marked with its direction."""
    mark = {}
    if sort is not None:
        _, _, column, descending = SORT_BY_KEY[sort]
        mark[column] = "↓" if descending else "↑"
    if compact:
        return _titles(compact_columns_at(per_gpu), mark)
    return _titles(columns_at(width, mixed), mark, width)


class GpuColumns(Widget):
    """The column titles above the GPU list; they follow its sort and compact mode."""

    DEFAULT_CSS = "GpuColumns { height: 1; }"

    def render(self) -> Text:
        nodes = self.screen.query(NodeList)
        sort = nodes.first().sort if nodes else None
        compact = nodes.first().compact if nodes else False
        per_gpu = nodes.first().per_gpu_w if nodes else PER_GPU_W
        mixed = nodes.first().mixed if nodes else False
        titles = column_titles(self.size.width, sort, compact, per_gpu, mixed)
        return Text(titles, end="", no_wrap=True)
