"""The main screen's process panel: the processes of the node under the cursor, under its GPU
rows, when the list leaves room for it.

For one node or a few GPUs most of the screen was empty below the GPU rows; nvitop fills it
with the processes. The panel takes only the lines the list does not use (``room``), worked out
at every layout (a resize, the filter box shown, a node's rows come or go:
``OverviewScreen.fit_procs``), and is 0 lines high when fewer than ``MIN_LINES`` are left, so
no GPU row is cut for it. Its rows are the process view's (``gpuctl.tui.procview``'s
``process_rows``, the same cells), the cursor GPU's processes first and in bold; ``p`` opens
the full view.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from rich.text import Text
from textual.geometry import Size
from textual.widget import Widget

from gpuctl.tui.fleet_store import FleetStore
from gpuctl.tui.procview import COLUMNS, ProcRow, process_rows
from gpuctl.tui.text import node_str, node_text

ABOVE = 1  # the list's column titles (``GpuColumns``), above the list in the pane
MIN_LINES = 4  # title, column titles and two processes: fewer left, no panel
# the process view's columns the panel shows (indices into ProcRow.cells), the command last;
# SM %, RSS and TIME join from WIDE columns
NARROW = (0, 1, 2, 3, 5, 8)
WIDE_COLUMNS = 110
WIDE = (0, 1, 2, 3, 4, 5, 6, 7, 8)


def room(pane_height: int, above: int, list_lines: int) -> int:
    """The lines the panel may take in a pane ``pane_height`` high whose list needs
    ``list_lines`` lines under ``above`` fixed ones (its column titles); 0 when it cannot show
    ``MIN_LINES``."""
    left = pane_height - above - list_lines
    return left if left >= MIN_LINES else 0


def panel_rows(rows: list[ProcRow], gpu: int | None) -> list[ProcRow]:
    """``rows`` with GPU ``gpu``'s processes first (each part in the view's order)."""
    if gpu is None:
        return rows
    return [r for r in rows if gpu in r.gpus] + [r for r in rows if gpu not in r.gpus]


class NodeProcs(Widget):
    """The processes of the node under the list's cursor, its GPU's first."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {"nodeprocs--title"}
    DEFAULT_CSS = """
    NodeProcs {
        height: auto;
        background: $background;
        color: $foreground;
    }
    NodeProcs > .nodeprocs--title {
        background: $panel;
        color: $primary;
        text-style: bold;
    }
    """

    def __init__(
        self,
        store: FleetStore,
        list_lines: Callable[[], int | None],
        cursor: Callable[[], tuple[str, int | None] | None],
        *,
        id: str | None = None,
    ) -> None:
        """``list_lines`` says how many lines the list above needs (None: no panel),
        ``cursor`` the node and GPU under the list's cursor."""
        super().__init__(id=id)
        self.store = store
        self.list_lines = list_lines
        self.cursor = cursor

    @property
    def node(self) -> str | None:
        here = self.cursor()
        return None if here is None else here[0]

    @property
    def gpu(self) -> int | None:
        here = self.cursor()
        return None if here is None else here[1]

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        lines = self.list_lines()
        return 0 if lines is None else room(container.height, ABOVE, lines)

    def render(self) -> Text:
        width = self.size.width
        node, gpu = self.cursor() or (None, None)
        snap = self.store.snaps.get(node) if node is not None else None
        if snap is None:
            return Text(" processes", end="")
        now = self.store.clock()
        rows = panel_rows(process_rows(snap, now=now), gpu)
        mine = sum(1 for r in rows if gpu in r.gpus)
        # "8 processes on dgx-a01 · 2 on GPU 3": the node's count, then the cursor GPU's (its
        # rows come first, in bold); the key's hint only where it fits the width
        title = Text(f" {len(rows)} process{'es' if len(rows) != 1 else ''}", end="")
        # a long name gives way so the GPU's count stays on the line at 80 columns
        room = max(12, min(60, width - len(title) - 16))
        title.append_text(node_text(f" on {snap.name}", limit=room))
        if gpu is not None:
            title.append(f" · {mine} on GPU {gpu}")
        key = getattr(self.app, "key_display", None)  # the configured key, not the default
        p = "p" if key is None else key("processes", "p")
        hint = f"  ({p}: view, sort, signal) "
        if title.cell_len + len(hint) <= width:
            title.append(hint)
        title.pad_right(max(0, width - title.cell_len))
        title.stylize(self.get_component_rich_style("nodeprocs--title"))
        out = Text(end="")
        out.append_text(title)
        columns = WIDE if width >= WIDE_COLUMNS else NARROW
        cells = [[node_str(c, limit=200) for c in _pick(r.cells(now), columns)] for r in rows]
        widths = [
            max([len(COLUMNS[c])] + [len(line[k]) for line in cells])
            for k, c in enumerate(columns[:-1])
        ]
        out.append(
            "\n" + _line([COLUMNS[c] for c in columns], columns, widths, width), style="bold"
        )
        shown = max(0, self.size.height - 2)
        if len(rows) > shown and shown:
            shown -= 1  # the last line says how many more
        for r, line in zip(rows[:shown], cells, strict=False):
            style = "bold" if gpu in r.gpus else ""
            out.append("\n")
            out.append_text(Text(_line(line, columns, widths, width), style=style, end=""))
        if not rows:
            out.append("\n no process on its GPUs", style="dim")
        elif len(rows) > shown:
            out.append(f"\n … {len(rows) - shown} more ({p})", style="dim")
        return out


def _pick(cells: tuple[str, ...], columns: tuple[int, ...]) -> list[str]:
    return [cells[i] for i in columns]


RIGHT = {1, 3, 4, 5, 6, 7}  # the figures' columns (indices into COLUMNS) align right


def _line(cells: list[str], columns: tuple[int, ...], widths: list[int], width: int) -> str:
    """Cells padded to ``widths`` (the last one takes what is left), cut at ``width``."""
    parts = [
        c.rjust(w) if k in RIGHT else c.ljust(w)
        for c, k, w in zip(cells, columns, widths, strict=False)
    ]
    text = " " + "  ".join([*parts, cells[-1]])
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"
