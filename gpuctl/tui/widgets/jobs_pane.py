"""Pane 2: the job store's jobs, the selected job's live output and its failure report.

The list is read from the ``JobStore`` in a worker thread every two seconds and applied in place
(changed cells only). Unfinished local and Slurm jobs are brought up to date on the way (as
``gpuctl jobs`` does: files and one ``squeue``). The selected job is attached once
(``gpuctl.jobs.attach``) and its stdout/stderr are read from where the last read stopped, in a
worker thread, once a second while it runs; only the new bytes are appended to the logs.
"""

from __future__ import annotations

import codecs
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.coordinate import Coordinate
from textual.widgets import DataTable, Log, Static

from gpuctl.jobs.records import ReportDict
from gpuctl.jobs.store import PARTIAL, JobRecord, JobStore, StoreError, shown_state
from gpuctl.node import jobfiles
from gpuctl.tui.screens.confirm import ConfirmScreen
from gpuctl.tui.text import node_content, node_str, node_text

if TYPE_CHECKING:
    from gpuctl.jobs.job import Job

JOB_COLUMNS = ("id", "state", "target", "function", "time", "summary")
FINAL_STATES = ("done", "failed", "cancelled")
STREAMS = (jobfiles.STDOUT, jobfiles.STDERR)
LOG_LINES = 2000
TAIL_BYTES = 64 * 1024  # a newly selected job shows at most this much of each log's end
# and at most the last lines the view keeps after its "[… N bytes before]" line: read on the
# job's node, only they travel however long the log (as ``gpuctl logs --tail``)
TAIL_LINES = LOG_LINES - 2  # the marker line, and the empty line after the last break
LIST_EVERY_S = 2.0
TAIL_EVERY_S = 1.0
SLURM_EVERY = 5  # list rounds between Slurm state polls (one squeue per unfinished job)
COLUMN_WIDTHS = {"id": 12, "state": 9, "time": 8}
CELL_LIMIT = 200  # characters of a cell: a summary can be a whole traceback
LINE_LIMIT = 2000  # characters of one line of a failure report
NOTE = "jobs (gpuctl submit / jobs / logs): ↑↓ select · c cancel"
EMPTY_NOTE = (
    "no jobs yet: gpuctl submit train.py:main --target NODE (or Executor(...).submit(fn) in "
    "Python; README: Jobs) and they show here"
)
STATE_STYLES = {
    "done": "jobspane--done",
    PARTIAL: "jobspane--partial",
    "failed": "jobspane--failed",
    "cancelled": "jobspane--cancelled",
    "running": "jobspane--running",
}


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


def job_duration(rec: JobRecord, now: float) -> float | None:
    """Start (or creation) to end, or to ``now`` while it is not over."""
    start = rec.started_at or rec.created_at
    end = rec.ended_at or (None if rec.state in FINAL_STATES else now)
    return None if end is None or start is None else max(0.0, end - start)


def report_content(report: ReportDict) -> Content:
    """A stored failure report (``FailureReport.to_dict()``) in four sections, theme coloured.

    Every field may hold what a node printed: each is made printable (``node_content``), one
    line each but the traceback's lines."""
    parts: list[object] = []

    def heading(text: str) -> None:
        if parts:
            parts.append("\n\n")
        parts.append((text, "$primary bold"))
        parts.append("\n")

    def line(value: object) -> str:
        return node_str(value, limit=LINE_LIMIT)

    heading("What happened")
    parts.append((line(report.get("title") or report.get("kind") or "failed"), "$error bold"))
    kind, phase = report.get("kind"), report.get("phase")
    parts.append(f"  [{line(kind)}]" + (f" in phase {line(phase)}" if phase else ""))
    heading("Evidence")
    evidence = report.get("evidence")
    evidence = [line(e) for e in evidence] if isinstance(evidence, list) else []
    parts.append("\n".join(f"  {e}" for e in evidence) if evidence else "  (none recorded)")
    tb = node_str(report.get("traceback") or "", one_line=False).rstrip()
    if tb:
        parts.append("\n")
        parts.append(("  traceback (last lines):", "$text-muted"))
        parts.append("\n" + "\n".join("    " + t for t in tb.splitlines()[-30:]))
    heading("Remedy")
    parts.append(("  " + line(report.get("remedy") or "-"), "$success"))
    heading("Logs")
    logs = report.get("logs")
    logs = logs if isinstance(logs, dict) else {}
    parts.append(
        "\n".join(f"  {line(name)}: {line(path)}" for name, path in logs.items())
        if logs
        else "  (none)"
    )
    return node_content(*parts, one_line=False)


_UNSHOWN = object()


def _default_attach(rec: JobRecord, store: JobStore | None) -> Job:
    from gpuctl.jobs import attach

    return attach(rec, store, watch=False)  # the pane's own refresh polls it


class JobsPane(Vertical):
    """The newest jobs; below them the selected job's report (when it failed) and its logs."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("c", "cancel_job", "cancel job", id="cancel_job"),
    ]
    COMPONENT_CLASSES: ClassVar[set[str]] = set(STATE_STYLES.values())

    def __init__(
        self,
        job_store: JobStore | None,
        *,
        id: str | None = None,
        clock: Callable[[], float] = time.time,
        attach: Callable[[JobRecord, JobStore | None], Job] = _default_attach,
        unavailable: str | None = None,
    ) -> None:
        """``unavailable`` says why there is no ``job_store`` (one line: the file, what to
        do); the pane shows it in place of the list."""
        super().__init__(id=id)
        self.job_store = job_store
        self.unavailable = unavailable
        self.clock = clock
        self.attach = attach
        self.records: dict[str, JobRecord] = {}
        self.selected: str | None = None
        self.offsets: dict[str, int] = {}
        self.decoders: dict[str, codecs.IncrementalDecoder] = {}
        self.final_read = False  # the last read after the selected job ended is done
        self.returned: str | None = None  # the ended job's return value (its short repr)
        self.shown_report: object = None
        self._jobs: dict[str, Job] = {}  # attached Job per id (worker threads only)
        self._jobs_lock = threading.Lock()
        self._rounds = 0

    def compose(self) -> ComposeResult:
        yield Static("", id="jobs-note", classes="pane-title")
        yield DataTable(id="jobs-table", cursor_type="row", zebra_stripes=True)
        yield Static("", id="job-title")
        with VerticalScroll(id="job-report-box"):
            yield Static("", id="job-report")
        with Horizontal(id="job-logs"):
            yield Log(id="job-stdout", max_lines=LOG_LINES)
            yield Log(id="job-stderr", max_lines=LOG_LINES)

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for col in JOB_COLUMNS:  # fixed widths where cells change in place
            table.add_column(col, key=col, width=COLUMN_WIDTHS.get(col))
        if self.job_store is None:
            self.show_unavailable(self.unavailable or "no job store here: jobs cannot be listed")
        else:
            self._note(NOTE)
        self.query_one("#job-stdout", Log).border_title = "stdout"
        self.query_one("#job-stderr", Log).border_title = "stderr"
        box = self.query_one("#job-report-box")
        box.border_title = "why it ended"
        box.display = False
        self.app.theme_changed_signal.subscribe(self, lambda _t: self._restyle())
        self.set_interval(LIST_EVERY_S, self.reload)
        self.set_interval(TAIL_EVERY_S, self.tail)

    def _note(self, text: str) -> None:
        note = self.query_one("#jobs-note", Static)
        if str(note.content) != text:
            note.update(node_text(text))

    def show_unavailable(self, why: str) -> None:
        """The list is empty because the store cannot be read: say so, and why, in the note."""
        self.unavailable = why
        self._note(why)
        self.query_one("#jobs-note").add_class("-unavailable")

    # -- the list -----------------------------------------------------------------------------
    def reload(self) -> None:
        if self.display and self.job_store is not None:
            self.load()

    @work(thread=True, exclusive=True, group="jobs-pane", exit_on_error=False)
    def load(self) -> None:
        store = self.job_store
        if store is None:
            return
        try:
            records = store.list(100)
            if self._refresh(records):
                records = store.list(100)
        except (StoreError, OSError) as e:  # damaged since we opened it: the store's one line
            self.app.call_from_thread(self.show_unavailable, str(e))
            return
        self.app.call_from_thread(self.show, records)

    def _refresh(self, records: list[JobRecord]) -> bool:
        """Poll unfinished local jobs (files) and, every few rounds, Slurm jobs (squeue); SSH
        jobs only when selected. True when a state changed."""
        self._rounds += 1
        kinds = ("local", "slurm") if self._rounds % SLURM_EVERY == 1 else ("local",)
        changed = False
        for rec in records:
            if rec.state in FINAL_STATES or rec.backend.get("kind") not in kinds:
                continue
            job = self._job(rec)
            if job is None:
                continue
            try:
                changed = job.state != rec.state or changed
            except Exception:  # a vanished folder, a failing squeue: the stored row stays
                continue
        return changed

    def _job(self, rec: JobRecord) -> Job | None:
        with self._jobs_lock:
            job = self._jobs.get(rec.id)
        if job is None:
            try:
                job = self.attach(rec, self.job_store)
            except Exception:
                return None
            with self._jobs_lock:
                job = self._jobs.setdefault(rec.id, job)
        return job

    def _state_cell(self, state: str) -> Text:
        cls = STATE_STYLES.get(state)
        return node_text(state, self.get_component_rich_style(cls, partial=True) if cls else "")

    def _row(self, r: JobRecord) -> tuple[str, str, str, str, str, str]:
        """The row's cells as printable strings (names and summaries come from jobs)."""
        return (
            node_str(r.id)[:12],  # the short id `gpuctl jobs` accepts
            node_str(shown_state(r.state, r.kind), limit=CELL_LIMIT),
            node_str(r.target + (f" ({r.tasks} tasks)" if r.tasks > 1 else ""), limit=CELL_LIMIT),
            node_str(r.name, limit=CELL_LIMIT),
            fmt_duration(job_duration(r, self.clock())),
            node_str(r.summary, limit=CELL_LIMIT),
        )

    def show(self, records: list[JobRecord]) -> None:
        table = self.query_one(DataTable)
        existing = {str(k.value) for k in table.rows}
        added = False
        if self.unavailable is not None and self.job_store is not None:  # readable again
            self.unavailable = None
            self.query_one("#jobs-note").remove_class("-unavailable")
        if self.unavailable is None:
            self._note(NOTE if records else EMPTY_NOTE)
        for r in records:
            row = self._row(r)
            if r.id in existing:
                for col, value in zip(JOB_COLUMNS, row, strict=True):
                    if str(table.get_cell(r.id, col)) != value:
                        cell = self._state_cell(value) if col == "state" else Text(value)
                        # the summary, last, takes the width it needs; the others stay put
                        table.update_cell(r.id, col, cell, update_width=col == "summary")
            else:
                cells = [
                    self._state_cell(v) if c == "state" else Text(v)
                    for c, v in zip(JOB_COLUMNS, row, strict=True)
                ]
                table.add_row(*cells, key=r.id)
                added = True
        self.records = {r.id: r for r in records}
        for gone in existing - set(self.records):
            table.remove_row(gone)
        if added:  # newest first, as `gpuctl jobs` lists them
            created = {r.id[:12]: r.created_at for r in records}
            table.sort("id", key=lambda short: -created.get(str(short), 0.0))
        # The highlighted row is the selected job (the one c cancels): a sort or a removal
        # moves rows under a cursor that stays put, so put the cursor back on the selection.
        if self.selected in self.records and self.selected in table.rows:
            index = table.get_row_index(self.selected)
            if index != table.cursor_row:
                table.move_cursor(row=index)
            self._show_selected()
        elif table.row_count:
            self.select(self._cursor_job() or "")

    def _cursor_job(self) -> str | None:
        """The id of the job under the cursor, or None for an empty list."""
        table = self.query_one(DataTable)
        if not table.row_count:
            return None
        key = table.coordinate_to_cell_key(Coordinate(table.cursor_row, 0)).row_key.value
        return None if key is None else str(key)

    def _restyle(self) -> None:
        table = self.query_one(DataTable)
        shown = {str(k.value) for k in table.rows}
        for r in self.records.values():
            if r.id in shown:
                state = self._state_cell(shown_state(r.state, r.kind))
                table.update_cell(r.id, "state", state, update_width=False)

    # -- the selected job ---------------------------------------------------------------------
    @on(DataTable.RowHighlighted, "#jobs-table")
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key.value is not None:
            self.select(str(event.row_key.value))

    def select(self, job_id: str) -> None:
        if job_id == self.selected:
            return
        self.selected = job_id
        self.offsets = dict.fromkeys(STREAMS, 0)
        self.decoders = {s: codecs.getincrementaldecoder("utf-8")("replace") for s in STREAMS}
        self.final_read = False
        self.shown_report = _UNSHOWN
        self.returned = None
        for log in (self.query_one("#job-stdout", Log), self.query_one("#job-stderr", Log)):
            log.clear()
            log.display = True
        self.query_one("#job-logs").display = True
        self.query_one("#job-report-box").remove_class("-alone")
        self._show_selected()
        self.tail()

    def _show_selected(self) -> None:
        rec = self.records.get(self.selected or "")
        title = self.query_one("#job-title", Static)
        box = self.query_one("#job-report-box")
        if rec is None:
            title.update("")
            box.display = False
            return
        duration = fmt_duration(job_duration(rec, self.clock()))
        state = shown_state(rec.state, rec.kind)
        state = state if state != "failed" else f"failed ({rec.kind or '?'})"
        title.update(
            node_content(
                (f" {node_str(rec.id)[:12]} ", "$primary bold"),
                f" {node_str(rec.name, limit=CELL_LIMIT)} on {node_str(rec.target, limit=80)} · ",
                (node_str(state, limit=80), "bold"),
                f" · {duration}",
                f" · returned {node_str(self.returned, limit=80)}" if self.returned else "",
                one_line=True,
            ),
            layout=False,
        )
        report = rec.report if rec.state in ("failed", "cancelled") else None
        if report != self.shown_report:
            self.shown_report = report
            box.display = bool(report)
            if report:
                self.query_one("#job-report", Static).update(report_content(report))

    def tail(self) -> None:
        """Read what is new in the selected job's logs (a no-op once it ended and was read)."""
        rec = self.records.get(self.selected or "")
        if rec is None or not self.display or self.final_read:
            return
        self.read_logs(rec, dict(self.offsets))

    @work(thread=True, exclusive=True, group="job-logs", exit_on_error=False)
    def read_logs(self, rec: JobRecord, offsets: dict[str, int]) -> None:
        start = dict(offsets)
        job = self._job(rec)
        if job is None:
            self.app.call_from_thread(self._logs_unreadable, rec.id)
            return
        final = rec.state in FINAL_STATES
        if not final:
            try:
                final = job.state in FINAL_STATES  # polls, and stores the end when it came
            except Exception:
                final = False
        chunks: dict[str, bytes] = {}
        for name in STREAMS:
            try:
                if offsets[name] == 0:  # a newly selected job: its logs' end, read on its node
                    data, size = job.read_lines(
                        name, tail=TAIL_LINES, sized=True, most_bytes=TAIL_BYTES
                    )
                    skipped = (size or 0) - len(data)
                    chunks[name] = f"[… {skipped} bytes before]\n".encode() if skipped else b""
                    chunks[name] += data
                    offsets[name] = size or 0
                    continue
                data = job.read_from(name, offsets[name])
            except Exception:
                data = b""
            chunks[name] = data
            offsets[name] += len(data)
        returned = None
        if final:  # its return value, as its worker described it (none for a failure)
            try:
                returned = (job.result_info() or {}).get("repr")
            except Exception:
                returned = None
        self.app.call_from_thread(
            self._append_logs, rec.id, start, chunks, offsets, final, returned
        )

    def _append_logs(
        self,
        job_id: str,
        start: dict[str, int],
        chunks: dict[str, bytes],
        offsets: dict[str, int],
        final: bool,
        returned: str | None = None,
    ) -> None:
        # A read that started from offsets the pane has moved past (two reads overlapped: the
        # tail timer's and the selection's, a slow node) would show the same lines twice.
        if job_id != self.selected or start != self.offsets:
            return
        for name, log_id in zip(STREAMS, ("#job-stdout", "#job-stderr"), strict=True):
            # What the job printed: escapes and control bytes go (line breaks and tabs stay).
            text = node_str(self.decoders[name].decode(chunks.get(name, b"")), one_line=False)
            if text:
                self.query_one(log_id, Log).write(text)
        self.offsets = offsets
        if final:
            self.final_read = True
            self.returned = returned
            # an ended job's empty stream gives its room to the other (40% of 80x24 went to
            # two empty boxes), and both to the report when it printed nothing
            logs = [self.query_one(i, Log) for i in ("#job-stdout", "#job-stderr")]
            for log in logs:
                log.display = bool(log.lines)
            printed = any(log.display for log in logs)
            self.query_one("#job-logs").display = printed
            self.query_one("#job-report-box").set_class(not printed, "-alone")
            self.reload()  # the store now holds the end: state, summary, report

    def _logs_unreadable(self, job_id: str) -> None:
        if job_id == self.selected:
            self.query_one("#job-stderr", Log).write_line("(cannot reach this job's folder)")
            self.final_read = True

    # -- cancel -------------------------------------------------------------------------------
    def action_cancel_job(self) -> None:
        refuse = getattr(self.app, "refuse", None)  # the app asks the service layer
        if refuse is not None and refuse("cancelling a job"):
            return
        highlighted = self._cursor_job()  # what the user sees is what gets cancelled
        if highlighted is not None and highlighted != self.selected:
            self.select(highlighted)
        rec = self.records.get(self.selected or "")
        if rec is None:
            self.notify("select a job first", severity="warning")
            return
        if rec.state in FINAL_STATES:
            self.notify(f"job {rec.id[:12]} already ended ({rec.state})", severity="warning")
            return
        what = f"{node_str(rec.name, limit=60)} on {node_str(rec.target, limit=60)}"

        def answered(yes: bool | None) -> None:
            if yes:
                self.cancel_job(rec)

        self.app.push_screen(
            ConfirmScreen(f"Cancel job {rec.id[:12]} ({what})?", "Cancel job", "Keep it"),
            answered,
        )

    @work(thread=True, group="job-cancel", exit_on_error=False)
    def cancel_job(self, rec: JobRecord) -> None:
        job = self._job(rec)
        if job is None:
            self.app.call_from_thread(
                self.notify, f"job {rec.id[:12]}: cannot reach it to cancel", severity="error"
            )
            return
        ok = job.cancel(read_only=bool(getattr(self.app, "read_only", False)))
        text = f"cancelling job {rec.id[:12]}" if ok else f"job {rec.id[:12]} had already ended"
        self.app.call_from_thread(self.notify, text)
        self.app.call_from_thread(self.reload)
