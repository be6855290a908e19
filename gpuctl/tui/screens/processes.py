"""The process view (``p``): every GPU process of a node, or of one of its GPUs, nvitop-style.

User, pid, GPU memory, SM %, host %CPU and RSS, elapsed time and command line; sortable (``o``
next column, ``O`` reverse), as a tree of parents and children (``T``), for one GPU or the whole
node (``g``). ``k`` / ``i`` / ``K`` send SIGTERM / SIGINT / SIGKILL to the selected process
after asking: only a process of the user running gpuctl, and never in read-only mode
(``gpuctl.fleet.control.signal_process`` checks both; the agent checks the uid again).
Everything a node sent reaches the table as text (``gpuctl.tui.text``).
"""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from gpuctl import service
from gpuctl.fleet import control
from gpuctl.tui.fleet_store import FleetStore
from gpuctl.tui.procview import (
    COLUMN_KEYS,
    COLUMNS,
    DESCENDING,
    SORT_TITLES,
    SORTS,
    ProcRow,
    process_rows,
)
from gpuctl.tui.screens.confirm import ConfirmScreen
from gpuctl.tui.text import node_str, node_text

CELL_LIMIT = 300  # characters of a cell: a command line can be long
SIGNAL_NAMES = {"TERM": "SIGTERM", "INT": "SIGINT", "KILL": "SIGKILL"}


class ProcessScreen(Screen[None]):
    """Every GPU process of ``node`` (of GPU ``gpu`` only, when given)."""

    # "o O sort", "k i K kill": groups keep the footer, ? help and q quit in 80 columns
    SORT_KEYS = Binding.Group("sort")
    SIGNAL_KEYS = Binding.Group("kill")
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "back", "back", id="procs_back"),
        Binding("o", "sort", "sort", id="procs_sort", group=SORT_KEYS),
        Binding("O", "reverse", "reverse", id="procs_reverse", group=SORT_KEYS),
        Binding("T", "tree", "tree", id="procs_tree"),
        Binding("g", "scope", "GPU/node", id="procs_scope"),
        Binding("k", "signal('TERM')", "SIGTERM", id="procs_term", group=SIGNAL_KEYS),
        Binding("i", "signal('INT')", "SIGINT", id="procs_int", group=SIGNAL_KEYS),
        Binding("K", "signal('KILL')", "SIGKILL", id="procs_kill", group=SIGNAL_KEYS),
    ]

    def __init__(
        self, store: FleetStore, node: str, gpu: int | None, *, read_only: bool = False
    ) -> None:
        super().__init__()
        self.store = store
        self.node = node
        self.gpu = gpu  # the GPU the view was opened on
        self.one_gpu = gpu is not None
        self.read_only = read_only
        self.sort = SORTS[0][0]
        self.reverse = False
        self.as_tree = False
        self.rows: list[ProcRow] = []
        self._labelled: tuple[str, bool] | None = None  # the order the column titles show
        self._ready = False

    def compose(self) -> ComposeResult:
        yield Static(id="procs-title")
        yield DataTable(id="procs-table", cursor_type="row", zebra_stripes=True)
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        table = self.query_one("#procs-table", DataTable)
        self._ready = True
        self.node_changed()
        table.focus()

    # -- updates ------------------------------------------------------------------------------
    def node_changed(self) -> None:
        """Redraw from the node's newest snapshot (the app calls this when it changed)."""
        snap = self.store.snaps.get(self.node)
        if snap is None or not self._ready:
            return
        now = self.store.clock()
        gpu = self.gpu if self.one_gpu else None
        self.rows = process_rows(
            snap, gpu, sort=self.sort, reverse=self.reverse, tree=self.as_tree, now=now
        )
        self._title(len([r for r in self.rows if r.gpu_process]))
        table = self.query_one("#procs-table", DataTable)
        self._columns(table)
        keys = [r.key for r in self.rows]
        if [str(k.value) for k in table.rows] != keys:
            selected = self.selected()
            table.clear()
            for r in self.rows:
                table.add_row(*self._cells(r, now), key=r.key)
            if selected is not None and selected.key in keys:
                table.move_cursor(row=keys.index(selected.key), animate=False)
            return
        for r in self.rows:
            for column, cell in zip(COLUMN_KEYS, self._cells(r, now), strict=True):
                if table.get_cell(r.key, column) != cell:
                    table.update_cell(r.key, column, cell, update_width=False)

    def _cells(self, r: ProcRow, now: float) -> list[Text]:
        style = "" if r.gpu_process else "dim"
        return [node_text(c, style, limit=CELL_LIMIT) for c in r.cells(now)]

    def _order(self) -> str:
        return "↓" if (self.sort in DESCENDING) != self.reverse else "↑"

    def _columns(self, table: DataTable[Text]) -> None:
        """Column titles, the sorted one with its direction; the table is rebuilt when the
        order changes (a user's key press, not a sample)."""
        labelled = (self.sort, self.reverse)
        if self._labelled == labelled:
            return
        self._labelled = labelled
        table.clear(columns=True)
        for title, key in zip(COLUMNS, COLUMN_KEYS, strict=True):
            label = Text(title + (self._order() if key == self.sort else ""))
            table.add_column(label, key=key)

    def _title(self, count: int) -> None:
        where = f"GPU {self.gpu}" if self.one_gpu else "all GPUs"
        order = self._order()
        mode = "  ·  tree" if self.as_tree else ""
        title = (
            f" processes on {node_str(self.node)} · {where}  ·  {count} on GPUs  ·  "
            f"by {SORT_TITLES[self.sort]} {order}{mode}"
        )
        self.query_one("#procs-title", Static).update(node_text(title), layout=False)

    def selected(self) -> ProcRow | None:
        table = self.query_one("#procs-table", DataTable)
        if not self.rows or table.cursor_row < 0 or table.cursor_row >= len(self.rows):
            return None
        return self.rows[table.cursor_row]

    # -- actions ------------------------------------------------------------------------------
    def action_back(self) -> None:
        self.app.pop_screen()

    def action_sort(self) -> None:
        names = [k for k, _ in SORTS]
        self.sort = names[(names.index(self.sort) + 1) % len(names)]
        self.node_changed()

    def action_reverse(self) -> None:
        self.reverse = not self.reverse
        self.node_changed()

    def action_tree(self) -> None:
        self.as_tree = not self.as_tree
        self.node_changed()

    def action_scope(self) -> None:
        if self.gpu is None:
            self.notify("opened on a node: showing all its GPUs", severity="warning")
            return
        self.one_gpu = not self.one_gpu
        self.node_changed()

    def action_signal(self, signal: str) -> None:
        row = self.selected()
        name = SIGNAL_NAMES[signal]
        if row is None or row.pid is None:
            self.notify("no process selected", severity="warning")
            return
        if not row.gpu_process:
            self.notify(f"pid {row.pid} is not a GPU process: not signalled", severity="warning")
            return
        error = service.refusal(
            "signalling processes",
            read_only=self.read_only,
            fleet=self.store.fleet,
            why=service.ANY_SOURCE,
        )
        if error is not None:
            self.notify(f"read-only: {error.what} is disabled ({error.why})", severity="warning")
            return
        why = service.not_mine(row.user)
        if why is not None:
            self.notify(f"{name} refused: pid {row.pid} {why}", severity="warning")
            return
        pid = row.pid
        command = node_str(row.command or "?", limit=60)
        question = f"Send {name} to pid {pid} ({command}) on {node_str(self.node)}?"

        def answered(yes: bool | None) -> None:
            if yes:
                self.run_worker(
                    self._send(pid, signal),
                    name=f"{name} pid {pid}",
                    group=f"node:{self.node}",
                    exit_on_error=False,
                )

        self.app.push_screen(ConfirmScreen(question, f"Send {name}"), answered)

    async def _send(self, pid: int, signal: str) -> None:
        reply = await control.signal_process(
            self.store.fleet, self.node, pid, signal, read_only=self.read_only
        )
        self.notify(f"{self.node}: {reply.get('message') or f'{signal} sent to pid {pid}'}")
