"""Pane 3: acceptance: a node × section verdict matrix, live while a run goes, and its lines.

Rows come from two places: the acceptance history (each node's latest stored run, read in a
worker thread) and the run started with ``a`` (an ``AcceptRun``; its progress arrives through
``progress()`` on the event loop). Cells change in place; colours come from the theme through
component classes. Enter on a row opens that node's report (``AcceptReportScreen``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from rich.style import Style
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.coordinate import Coordinate
from textual.widgets import DataTable, RichLog, Static

from gpuctl.core.format import fmt_age
from gpuctl.tui.screens.accept_report import AcceptReportScreen, section
from gpuctl.tui.text import node_str, node_text, short_path
from gpuctl.workloads.accept_suite.schema import SECTIONS

if TYPE_CHECKING:
    from gpuctl.accept.history import HistoryStore
    from gpuctl.accept.run import AcceptRun, NodeOutcome, Progress

CANCELLED = "CANCELLED"  # a node whose run was stopped: not an ERROR of the node
HEADERS = {
    "env": "env",
    "compute": "compute",
    "membw": "membw",
    "memtest": "memtest",
    "pcie": "pcie",
    "train": "train",
    "ddp_allreduce": "allreduce",
    "ddp_train": "ddp train",
    "health": "health",
}
VERDICT_CLASS = {
    "PASS": "acceptpane--pass",
    "WARN": "acceptpane--warn",
    "FAIL": "acceptpane--fail",
    "SKIP": "acceptpane--skip",
    "ERROR": "acceptpane--error",
    CANCELLED: "acceptpane--warn",
    "running": "acceptpane--running",
    "pending": "acceptpane--pending",
}
LABELS = {"pending": "·", "running": "▶ run", "stopped": "-"}
TREND_RUNS = 20
AGES_EVERY_S = 10.0
PREFERRED_DTYPES = ("bf16", "tf32", "fp32")
CELL_LIMIT = 40  # a verdict the suite made up must not push the matrix off the screen
# A section cell is as wide as its longest word: cells change in place without widening their
# column (``update_width=False``), so a column sized by its first cell ("·") or its title
# ("env") cut the words that came later ("PAS", "SKI", "ERRO").
WORD_W = max(len(LABELS.get(w, w)) for w in (*VERDICT_CLASS, *LABELS) if w != CANCELLED)
# The first four columns take the width of their widest cell, as it comes (update_width).
GROWING = frozenset({"verdict", "node", "when", "trend"})
LINE_LIMIT = 1000  # characters of one suite line in the log


@dataclass
class NodeRow:
    """What one matrix row shows; ``report`` is the node report the drill-down opens."""

    status: dict[str, str]
    verdict: str = "…"
    when: float | None = None
    trend: str = ""
    report: dict[str, Any] | None = None
    reason: str | None = None
    degradations: list[dict[str, Any]] = field(default_factory=list)
    live: bool = False


def node_trend(history: HistoryStore, node: str, limit: int = TREND_RUNS) -> str:
    """Sparkline of the node's mean COMPUTE TFLOP/s per run (bf16, else tf32, else fp32) and
    the latest figure, from ``HistoryStore.series``; "" without history."""
    from gpuctl.accept.history import sparkline

    keys = [k for k in history.keys(node) if k.startswith("compute/")]
    if not keys:
        return ""
    dtypes = {k.rsplit("/", 1)[-1] for k in keys}
    dtype = next((d for d in PREFERRED_DTYPES if d in dtypes), sorted(dtypes)[0])
    per_run: dict[float, list[float]] = {}
    for key in keys:
        if key.rsplit("/", 1)[-1] == dtype:
            for t, v, _unit in history.series(node, key, limit=limit):
                per_run.setdefault(t, []).append(v)
    means = [sum(v) / len(v) for _t, v in sorted(per_run.items())][-limit:]
    if not means:
        return ""
    return f"{sparkline(means)} {means[-1]:.3g} {dtype}"


def was_cancelled(outcome: NodeOutcome | None) -> bool:
    """True for a node whose suite was stopped by a cancel (``AcceptRun.cancel``), not one
    that failed to run: the run gives such a node no report and a reason saying so."""
    return (
        outcome is not None
        and outcome.report is None
        and (outcome.reason or "").startswith("cancelled")
    )


def row_from_report(report: Mapping[str, Any], when: float | None) -> NodeRow:
    status = {s: node_str(section(report, s).get("verdict") or "ERROR") for s in SECTIONS}
    verdict = "PASS" if report.get("verdict") == "PASS" else "FAIL"
    return NodeRow(status, verdict, when, report=dict(report))


class VerdictTable(DataTable[Any]):
    """The matrix; its Enter is named in the footer ("report") and remappable by id."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "select_cursor", "report", id="accept_report"),
    ]


class AcceptPane(Vertical):
    """The verdict matrix (node × section), the run's state line and the suite's lines."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "open_report", "report", id="accept_report"),
    ]
    COMPONENT_CLASSES: ClassVar[set[str]] = {*VERDICT_CLASS.values(), "acceptpane--trend"}

    def __init__(
        self,
        *,
        id: str | None = None,
        history_path: Path | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(id=id)
        self.history_path = history_path
        self.clock = clock
        self.rows: dict[str, NodeRow] = {}
        self.run: AcceptRun | None = None
        self.loaded = False
        self.silent = False  # the note says a node's suite is silent

    def compose(self) -> ComposeResult:
        yield Static(
            node_text("No acceptance run yet: select a node and press a."), id="accept-note"
        )
        # The cells' own colours (PASS green, SKIP grey) on the cursor's row too: the matrix is
        # often one row, always under the cursor.
        yield VerdictTable(
            id="accept-table",
            cursor_type="row",
            zebra_stripes=True,
            cursor_foreground_priority="renderable",
        )
        # Wrapped: the one line that says why a section failed is often the longest.
        # Wrapped at its own width: RichLog's default min_width (78) made the lines wider than
        # the log at 80 columns, cut at the right under a horizontal scrollbar.
        yield RichLog(id="accept-log", max_lines=500, wrap=True, markup=False, min_width=1)

    def on_mount(self) -> None:
        """The verdict, node, age and trend first (all four show at 120 columns), then the
        sections, each as wide as its longest word."""
        table = self.query_one(DataTable)
        table.add_column("verdict", key="verdict")
        table.add_column("node", key="node")
        table.add_column("when", key="when")
        table.add_column("trend (TFLOP/s)", key="trend")
        for s in SECTIONS:
            title = HEADERS.get(s, s)
            table.add_column(title, key=s, width=max(len(title), WORD_W))
        self.query_one(RichLog).border_title = "suite output"
        self.app.theme_changed_signal.subscribe(self, lambda _t: self._restyle())
        self.set_interval(AGES_EVERY_S, self._ages)

    # -- history ------------------------------------------------------------------------------
    def load_history(self) -> None:
        """Read each node's latest stored run (once when first shown, again after a run)."""
        if self.history_path is not None and self.history_path.exists():
            self._load_history(self.history_path)
        self.loaded = True

    @work(thread=True, exclusive=True, group="accept-history", exit_on_error=False)
    def _load_history(self, path: Path) -> None:
        from gpuctl.accept.history import HistoryStore

        history = HistoryStore(path)
        rows: dict[str, NodeRow] = {}
        for node in history.nodes():
            runs = history.runs(node, 1)
            if not runs:
                continue
            report = history.report(runs[0].id)
            if report is None:
                continue
            row = row_from_report(report, runs[0].t)
            row.degradations = list(runs[0].degradations)
            row.trend = node_trend(history, node)
            rows[node] = row
        self.app.call_from_thread(self._show_history, rows)

    def _show_history(self, rows: dict[str, NodeRow]) -> None:
        run = self.run
        live = set(run.nodes) if run is not None and not run.done() else set()
        for node, row in rows.items():
            if node in live:
                continue  # the live run's row wins until it ends
            self._put(node, row)
        if rows and self.run is None:
            self._note(
                f"latest acceptance run of {len(rows)} node(s) from the history · "
                "enter: report · a on a node: run again"
            )

    # -- the live run -------------------------------------------------------------------------
    def start(self, run: AcceptRun, sections: tuple[str, ...] = SECTIONS) -> None:
        """Show a new run (``AcceptRun``); its progress arrives through ``progress()``."""
        self.run = run
        for node in run.nodes:
            self._put(node, NodeRow(dict(run.status[node]), "…", run.started, live=True))
        table = self.query_one(DataTable)
        if run.nodes:
            table.move_cursor(row=table.get_row_index(run.nodes[0]))
        self.query_one(RichLog).clear()
        self._note(f"acceptance running on {', '.join(run.nodes)} (a again: cancel)")

    def _note(self, text: str) -> None:
        self.query_one("#accept-note", Static).update(node_text(text, limit=LINE_LIMIT))

    def progress(self, p: Progress) -> None:
        run = self.run
        if run is None:
            return
        row = self.rows.get(p.node)
        if row is not None and row.live and p.kind != "line":  # lines change no cell
            before = row.status
            row.status = dict(run.status.get(p.node, row.status))
            if p.kind in ("done", "error"):
                outcome = run.outcomes.get(p.node)
                row.verdict = outcome.verdict if outcome is not None else (p.verdict or "?")
                if outcome is not None:
                    row.report = outcome.report
                    row.reason = outcome.reason
                if was_cancelled(outcome):
                    # Sections it never reached were stopped, not broken.
                    row.status = {
                        s: "stopped" if before.get(s) in ("pending", "running") else v
                        for s, v in row.status.items()
                    }
                    row.verdict = CANCELLED
            self._put(p.node, row)
        if p.kind in ("done", "error") and all(n in run.outcomes for n in run.nodes):
            self._ended(run)
        log = self.query_one(RichLog)
        if p.kind == "line" and p.text:
            log.write(node_text(f"{p.node}: {p.text}", limit=LINE_LIMIT))
        elif p.kind == "error":
            log.write(node_text(f"{p.node}: could not run: {p.text}", limit=LINE_LIMIT))
        elif p.kind == "silent":  # where the operator looks: the note above the matrix
            self.silent = True
            self._note(f"{p.node}: {p.text} (a again: cancel)")
        if self.silent and p.kind in ("started", "section", "line") and not run.done():
            self.silent = False  # it speaks again
            self._note(f"acceptance running on {', '.join(run.nodes)} (a again: cancel)")
        elif p.kind == "finished":
            note, enter = f"acceptance finished: {p.verdict or '?'}", "  · enter: report"
            width = self.query_one("#accept-note").content_size.width or None
            if run.report_paths:  # ~-relative, cut in the middle to fit, its file name whole
                path = run.report_paths[0]
                room = None if width is None else width - len(note) - len("  · report: ")
                if room is not None and room - len(enter) < len(path.name) + 3:
                    enter = ""  # the footer says it too: ⏎ report
                fit = None if room is None else max(len(path.name) + 1, room - len(enter))
                note += f"  · report: {short_path(path, fit)}"
            note += enter
            self._note(note)
            for node in run.nodes:
                if node in self.rows:
                    self.rows[node].live = False
                    outcome = run.outcomes.get(node)
                    if outcome is not None:
                        self.rows[node].degradations = [d.to_dict() for d in outcome.degradations]
            self.load_history()  # the recorded run: trends move on

    def _ended(self, run: AcceptRun) -> None:
        """Every node has its outcome: the rows are no longer live. A cancelled run ends here
        (no "finished" comes after a cancel); a finished one's note follows with its report."""
        for node in run.nodes:
            if node in self.rows:
                self.rows[node].live = False
        cancelled = [n for n in run.nodes if was_cancelled(run.outcomes.get(n))]
        if cancelled:
            self._note(f"acceptance cancelled on {', '.join(cancelled)} · a on a node: run again")

    # -- drawing ------------------------------------------------------------------------------
    def _style(self, cls: str) -> Style:
        """A component's style for a cell: its own background only (the row's zebra or cursor
        shows through), its colour blended as drawn (a partial style left ``$text-muted``'s
        alpha out: SKIP came out white, not grey)."""
        partial = self.get_component_rich_style(cls, partial=True)
        return partial + Style(color=self.get_component_rich_style(cls).color)

    def _cell(self, value: str) -> Text:
        label = LABELS.get(value, value)
        cls = VERDICT_CLASS.get(value)
        style = self._style(cls) if cls else Style()
        return node_text(label, style, limit=CELL_LIMIT)  # verdicts come from the node

    def _cells(self, node: str, row: NodeRow) -> dict[str, Text]:
        verdict = self._cell(row.verdict)
        if row.degradations:
            verdict.append(
                f" ↓{len(row.degradations)}",
                self._style(VERDICT_CLASS["WARN"]),
            )
        cells = {
            "verdict": verdict,
            "node": node_text(node, limit=CELL_LIMIT),
            "when": Text(self._when(row)),
            "trend": node_text(row.trend, self._style("acceptpane--trend")),
        }
        for s in SECTIONS:
            cells[s] = self._cell(row.status.get(s, "pending"))
        return cells

    def _put(self, node: str, row: NodeRow) -> None:
        """Show ``row``: a new table row, or only the cells that changed."""
        table = self.query_one(DataTable)
        cells = self._cells(node, row)
        if node not in self.rows or node not in {str(k.value) for k in table.rows}:
            self.rows[node] = row
            table.add_row(*cells.values(), key=node)
            return
        self.rows[node] = row
        for col, cell in cells.items():
            if not _same(table.get_cell(node, col), cell):
                # The sections' columns hold their widest words already.
                table.update_cell(node, col, cell, update_width=col in GROWING)

    def _when(self, row: NodeRow) -> str:
        return "" if row.when is None else fmt_age(max(0.0, self.clock() - row.when)) + " ago"

    def _ages(self) -> None:
        if not self.display:
            return
        table = self.query_one(DataTable)
        for node, row in self.rows.items():
            text = self._when(row)
            if str(table.get_cell(node, "when")) != text:
                table.update_cell(node, "when", Text(text), update_width=True)

    def _restyle(self) -> None:
        for node, row in list(self.rows.items()):
            self._put(node, row)

    # -- drill-down ---------------------------------------------------------------------------
    @on(DataTable.RowSelected, "#accept-table")
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if event.row_key.value is not None:
            self.open_report(str(event.row_key.value))

    def cursor_node(self) -> str | None:
        """The node under the matrix cursor while this pane is shown, else None."""
        table = self.query_one(DataTable)
        if not self.display or not table.row_count:
            return None
        key = table.coordinate_to_cell_key(Coordinate(table.cursor_row, 0)).row_key.value
        return None if key is None else str(key)

    def action_open_report(self) -> None:
        node = self.cursor_node()
        if node is not None:
            self.open_report(node)

    def open_report(self, node: str) -> None:
        row = self.rows.get(node)
        if row is None:
            return
        if row.report is None:
            why = row.reason or ("the suite is still running" if row.live else "no report")
            self.notify(f"{node}: no report to show ({node_str(why)})", severity="warning")
            return
        self.app.push_screen(
            AcceptReportScreen(
                node, row.report, history_path=self.history_path, degradations=row.degradations
            )
        )


def _same(a: object, b: Text) -> bool:
    return isinstance(a, Text) and a.plain == b.plain and a.style == b.style and a.spans == b.spans
