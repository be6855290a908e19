"""The process view (``p``): every GPU process of a node, or of one of its GPUs, nvitop-style.

User, pid, GPU memory, SM %, host %CPU and RSS, elapsed time and command line; sortable (``o``
next column, ``O`` reverse), as a tree of parents and children (``T``), for one GPU or the whole
node (``g``), filtered by user or command (``/``, Esc clears it as on the main screen:
``keys.escape_filter``). ``k`` / ``i`` / ``K`` send SIGTERM / SIGINT / SIGKILL after one
question to the processes marked with space (``u`` clears the marks) that the filter shows
(the hidden ones are counted in the question and left alone), else to the selected
one: only processes of the user running gpuctl, and never in read-only mode
(``gpuctl.fleet.control.signal_process`` checks both, once per process; the agent checks the
uid again).
Everything a node sent reaches the table as text (``gpuctl.tui.text``).
"""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, Static

from gpuctl import service
from gpuctl.fleet import control
from gpuctl.fleet.session import LinkError
from gpuctl.tui.fleet_store import FleetStore
from gpuctl.tui.keys import escape_filter, offer
from gpuctl.tui.procview import (
    COLUMN_KEYS,
    COLUMNS,
    DESCENDING,
    SORT_TITLES,
    SORTS,
    ProcRow,
    gpu_processes,
    process_rows,
)
from gpuctl.tui.screens.confirm import ConfirmScreen
from gpuctl.tui.text import node_str, node_text

CELL_LIMIT = 300  # characters of a cell: a command line can be long
SIGNAL_NAMES = {"TERM": "SIGTERM", "INT": "SIGINT", "KILL": "SIGKILL"}
MARK = "●"  # a marked process's first cell (``glyphs``: ``*`` in ASCII mode)
NAMED = 8  # processes the question names one by one; more are counted
# Narrower than this, the footer leaves out T tree and g GPU/node (the title says both; help
# lists them): mark and filter, the signals, help and quit fit 80 columns.
WIDE_FOOTER = 100


class ProcessScreen(Screen[None]):
    """Every GPU process of ``node`` (of GPU ``gpu`` only, when given)."""

    # "o O sort", "k i K kill": groups keep the footer, ? help and q quit in 80 columns
    SORT_KEYS = Binding.Group("sort")
    SIGNAL_KEYS = Binding.Group("kill")
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding(
            "escape", "back", "back", id="procs_back", tooltip="back; close or clear the filter"
        ),
        Binding("space", "mark", "mark", id="procs_mark", tooltip="mark / unmark the process"),
        Binding("u", "unmark", "unmark all", show=False, id="procs_unmark"),
        Binding(
            "slash", "filter", "filter", id="procs_filter", tooltip="filter by user or command"
        ),
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
        self.total = 0  # the GPU processes before the filter
        self.only = ""  # the filter: a part of the user or the command line
        self.marked: dict[int, ProcRow] = {}  # pid -> its row when last seen
        self._labelled: tuple[str, bool] | None = None  # the order the column titles show
        self._ready = False

    def compose(self) -> ComposeResult:
        yield Static(id="procs-title")
        yield DataTable(id="procs-table", cursor_type="row", zebra_stripes=True)
        yield Input(placeholder="filter: part of a user or command line", id="procs-filter")
        yield Footer(compact=True, show_command_palette=False)

    def on_resize(self, event: events.Resize) -> None:
        wide = event.size.width >= WIDE_FOOTER
        offer(self, "procs_tree", wide)
        offer(self, "procs_scope", wide)

    def on_mount(self) -> None:
        self.query_one("#procs-filter").display = False
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
            snap,
            gpu,
            sort=self.sort,
            reverse=self.reverse,
            tree=self.as_tree,
            now=now,
            only=self.only,
        )
        self.total = len(gpu_processes(snap, gpu))
        # a mark lasts while its process runs on the node (shown or not)
        alive = {r.pid: r for r in gpu_processes(snap) if r.pid is not None}
        self.marked = {pid: alive[pid] for pid in self.marked if pid in alive}
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
            for column, cell in zip(("mark", *COLUMN_KEYS), self._cells(r, now), strict=True):
                if table.get_cell(r.key, column) != cell:
                    table.update_cell(r.key, column, cell, update_width=False)

    def _cells(self, r: ProcRow, now: float) -> list[Text]:
        style = "" if r.gpu_process else "dim"
        marked = r.gpu_process and r.pid in self.marked
        mark = Text(MARK if marked else " ", style="bold", end="")
        cells = [node_text(c, style, limit=CELL_LIMIT) for c in r.cells(now)]
        if marked:
            for cell in cells:
                cell.stylize("bold")
        return [mark, *cells]

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
        table.add_column(Text(" "), key="mark")
        for title, key in zip(COLUMNS, COLUMN_KEYS, strict=True):
            label = Text(title + (self._order() if key == self.sort else ""))
            table.add_column(label, key=key)

    def _title(self, count: int) -> None:
        where = f"GPU {self.gpu}" if self.one_gpu else "all GPUs"
        order = self._order()
        mode = "  ·  tree" if self.as_tree else ""
        shown = f"{count} of {self.total} shown" if self.only.strip() else f"{count} on GPUs"
        marks = f"  ·  {len(self.marked)} marked" if self.marked else ""
        title = (
            f" processes on {node_str(self.node)} · {where}  ·  {shown}{marks}  ·  "
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
        """Close or clear the filter (as on the main screen), else back to where ``p`` was
        pressed."""
        table = self.query_one("#procs-table", DataTable)
        if escape_filter(self.query_one("#procs-filter", Input), table):
            return
        self.app.pop_screen()

    def action_filter(self) -> None:
        box = self.query_one("#procs-filter", Input)
        box.display = True
        box.focus()

    @on(Input.Changed, "#procs-filter")
    def filter_changed(self, event: Input.Changed) -> None:
        self.only = event.value
        self.node_changed()
        kept = bool(event.value.strip())
        # as the main screen does: esc unfilter in place of / filter (80 columns hold one)
        offer(self, "procs_back", True, "unfilter" if kept else "back")
        offer(self, "procs_filter", not kept)

    @on(Input.Submitted, "#procs-filter")
    def filter_done(self, event: Input.Submitted) -> None:
        event.input.display = False
        self.query_one("#procs-table", DataTable).focus()

    def action_mark(self) -> None:
        """Mark the selected process, or unmark it, and go to the next row (as htop does)."""
        row = self.selected()
        if row is None or row.pid is None or not row.gpu_process:
            self.notify("no GPU process selected", severity="warning")
            return
        if self.marked.pop(row.pid, None) is None:
            self.marked[row.pid] = row
        self.node_changed()
        self.query_one("#procs-table", DataTable).action_cursor_down()

    def action_unmark(self) -> None:
        self.marked.clear()
        self.node_changed()

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
        """``signal`` to the marked processes, else to the selected one, after one question
        naming them; refused at once in read-only mode, or when none is the user's own."""
        name = SIGNAL_NAMES[signal]
        # Only what the user sees: a marked process the ``/`` filter hides is left alone (and
        # counted in the question), its mark kept for when the filter is cleared.
        shown = {r.pid for r in self.rows if r.gpu_process}
        hidden = len([pid for pid in self.marked if pid not in shown])
        if self.marked and hidden == len(self.marked):
            self.notify(
                f"{marked_count(hidden)} hidden by the filter: none signalled "
                "(esc clears the filter, u unmarks)",
                severity="warning",
            )
            return
        if self.marked:
            targets = sorted(
                (r for pid, r in self.marked.items() if pid in shown), key=lambda r: r.pid or 0
            )
        else:
            row = self.selected()
            if row is None or row.pid is None:
                self.notify("no process selected", severity="warning")
                return
            if not row.gpu_process:
                self.notify(
                    f"pid {row.pid} is not a GPU process: not signalled", severity="warning"
                )
                return
            targets = [row]
        error = service.refusal(
            "signalling processes",
            read_only=self.read_only,
            fleet=self.store.fleet,
            why=service.ANY_SOURCE,
        )
        if error is not None:
            self.notify(f"read-only: {error.what} is disabled ({error.why})", severity="warning")
            return
        refused = [(r, why) for r in targets if (why := service.not_mine(r.user)) is not None]
        ours = [r for r in targets if service.not_mine(r.user) is None]
        if not ours:
            r, why = refused[0]
            more = f" (and {len(refused) - 1} more not yours)" if len(refused) > 1 else ""
            self.notify(f"{name} refused: pid {r.pid} {why}{more}", severity="warning")
            return
        question = signal_question(
            name, node_str(self.node), ours, [r for r, _ in refused], hidden=hidden
        )
        pids = [r.pid for r in ours if r.pid is not None]

        def answered(yes: bool | None) -> None:
            if yes:
                for r in targets:
                    self.marked.pop(r.pid or 0, None)
                self.run_worker(
                    self._send_all(pids, signal),
                    name=f"{name} pid {', '.join(map(str, pids))}",
                    group=f"node:{self.node}",
                    exit_on_error=False,
                )

        self.app.push_screen(ConfirmScreen(question, f"Send {name}"), answered)

    async def _send_all(self, pids: list[int], signal: str) -> None:
        """One request per process, each checked and audited as a single one is
        (``control.signal_process``); a refusal or failure of one does not stop the others."""
        for pid in pids:
            try:
                await self._send(pid, signal)
            except (LinkError, service.ReadOnlyError) as e:
                self.notify(f"pid {pid}: {e}", severity="error")
        self.node_changed()

    async def _send(self, pid: int, signal: str) -> None:
        reply = await control.signal_process(
            self.store.fleet, self.node, pid, signal, read_only=self.read_only
        )
        self.notify(f"{self.node}: {reply.get('message') or f'{signal} sent to pid {pid}'}")


def marked_count(n: int) -> str:
    return f"{n} marked process" + ("es" if n != 1 else "")


def signal_question(
    name: str, node: str, ours: list[ProcRow], others: list[ProcRow], *, hidden: int = 0
) -> str:
    """The one question before ``name`` goes to the processes ``ours`` on ``node``: each named
    by pid, user and command (the first ``NAMED``, then a count), the marked processes of
    other users that are left alone, and how many marked ones the filter hides (left alone)."""
    if len(ours) == 1 and not others and not hidden:
        command = node_str(ours[0].command or "?", limit=60)
        return f"Send {name} to pid {ours[0].pid} ({command}) on {node}?"
    count = f"{len(ours)} process" + ("es" if len(ours) != 1 else "")
    lines = [f"Send {name} to {count} on {node}?"]
    lines += [
        f"  pid {r.pid} {node_str(r.user or '?', limit=32)}: {node_str(r.command or '?', limit=48)}"
        for r in ours[:NAMED]
    ]
    if len(ours) > NAMED:
        lines.append(f"  and {len(ours) - NAMED} more")
    if others:
        pids = ", ".join(str(r.pid) for r in others[:NAMED])
        lines.append(f"{len(others)} marked of other users left alone (pid {pids})")
    if hidden:
        lines.append(f"{marked_count(hidden)} hidden by the filter: left alone")
    return "\n".join(lines)
