"""The overview: one panel per node, one row per GPU, drawn with the Line API.

Only the lines on screen are ever rendered (a thousand GPUs cost what forty do), and a node's
update repaints only that node's lines. Colours come from component classes styled in
``app.tcss`` with theme variables. Every string a node sent reaches a segment through
``node_str`` (no control characters; segments are never parsed as markup).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Collection
from typing import ClassVar, NamedTuple

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding, BindingType
from textual.geometry import Region, Size
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widget import Widget

from gpuctl.core.format import counted, host_text, reader_text, short_model
from gpuctl.core.model import GpuSample, NodeInfo, NodeSnapshot, NodeState
from gpuctl.fleet.troublelog import Trouble
from gpuctl.tui.fleet_store import FleetStore
from gpuctl.tui.gpusort import SORT_BY_KEY, next_sort, order_gpus, order_nodes
from gpuctl.tui.keys import TROUBLE_KEYS
from gpuctl.tui.messages import GpuSelected
from gpuctl.tui.text import node_str
from gpuctl.tui.view import (
    Levels,
    down_text,
    fmt_power,
    is_problem,
    model_tags,
    models_text,
    next_stop,
    node_is_down,
)
from gpuctl.tui.widgets.columns import (
    LIVE_OR_STALE,
    STATE_CLASSES,
    TEXT_LIMIT,
    titles,
)
from gpuctl.tui.widgets.gpu_columns import Row, columns_at, row_plan
from gpuctl.tui.widgets.node_columns import PER_GPU_W, NodeLine, compact_columns_at

# A sorted list re-sorts this often (and on ``o`` or a filter): rows do not move under the
# cursor with every sample, and between re-sorts no sample costs a sort.
RESORT_S = 5.0


# Narrower than this, a node's header takes two lines: its state and GPUs, then its host's
# load, driver, CUDA and reader (on one line, a 120-column list cut every header before the
# driver). Wider, one line holds all of it (about 180 characters).
ONE_LINE_HEAD_W = 190


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
        return (
            is_problem(snap, None, False)
            or any(self.store.node_trouble(line.node).values())
            or self.store.fleet.idle.count(line.node) > 0  # its TROUBLE's IDLE×n
        )

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
        for draw, width, gap, reading in row_plan(self.size.width, self.mixed):
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
        return titles(compact_columns_at(per_gpu), mark)
    return titles(columns_at(width, mixed), mark, width)


class GpuColumns(Widget):
    """The column titles above the GPU list; they follow its sort and compact mode."""

    DEFAULT_CSS = "GpuColumns { height: 1; }"

    def render(self) -> Text:
        nodes = self.screen.query(NodeList)
        sort = nodes.first().sort if nodes else None
        compact = nodes.first().compact if nodes else False
        per_gpu = nodes.first().per_gpu_w if nodes else PER_GPU_W
        mixed = nodes.first().mixed if nodes else False
        line = column_titles(self.size.width, sort, compact, per_gpu, mixed)
        return Text(line, end="", no_wrap=True)
