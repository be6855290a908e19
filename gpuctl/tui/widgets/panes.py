"""Panes 2 and 3: the job store's jobs, and the acceptance run started with ``a``."""

from __future__ import annotations

import time
from typing import Any

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, RichLog, Static

from gpuctl.tui.view import fmt_age

JOB_COLUMNS = ("id", "name", "target", "state", "time", "summary")


class JobsPane(Vertical):
    """The newest jobs of the job store, refreshed in place every few seconds while shown."""

    def __init__(self, job_store: Any | None, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.job_store = job_store
        self.created: dict[str, float] = {}

    def compose(self) -> ComposeResult:
        yield Static("", id="jobs-note", classes="pane-title")
        yield DataTable(id="jobs-table", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for col in JOB_COLUMNS:
            table.add_column(col, key=col)
        note = self.query_one("#jobs-note", Static)
        if self.job_store is None:
            note.update("The job store is not available: jobs cannot be listed here.")
        else:
            note.update("jobs (gpuctl submit / jobs / logs); refreshed every 2 s")
        self.set_interval(2.0, self.reload)

    def reload(self) -> None:
        if self.display and self.job_store is not None:
            self.load()

    @work(thread=True, exclusive=True, group="jobs-pane", exit_on_error=False)
    def load(self) -> None:
        records = self.job_store.list(100) if self.job_store is not None else []
        self.app.call_from_thread(self.show, records)

    def show(self, records: list[Any]) -> None:
        table = self.query_one(DataTable)
        existing = {str(k.value) for k in table.rows}
        seen = set()
        added = False
        for r in records:
            seen.add(r.id)
            duration = r.duration
            row = (
                r.id[:12],
                r.name,
                r.target,
                r.state,
                "-" if duration is None else fmt_age(duration),
                r.summary or "",
            )
            if r.id in existing:
                for col, value in zip(JOB_COLUMNS, row, strict=True):
                    if str(table.get_cell(r.id, col)) != value:
                        table.update_cell(r.id, col, Text(value), update_width=False)
            else:
                table.add_row(*(Text(v) for v in row), key=r.id)
                self.created[r.id[:12]] = r.created_at
                added = True
        for gone in existing - seen:
            table.remove_row(gone)
        if added:  # newest first, as `gpuctl jobs` lists them
            table.sort("id", key=lambda short: -self.created.get(str(short), 0.0))


class AcceptPane(Vertical):
    """The current acceptance run: a status grid (node × section) and the suite's lines."""

    def compose(self) -> ComposeResult:
        yield Static("No acceptance run yet: select a node and press a.", id="accept-note")
        yield DataTable(id="accept-table", cursor_type="row", zebra_stripes=True)
        yield RichLog(id="accept-log", max_lines=500, wrap=False, markup=False)

    def start(self, run: Any, sections: tuple[str, ...]) -> None:
        """Show a new run (``AcceptRun``); its progress arrives through ``progress()``."""
        self.run = run
        self.sections = sections
        table = self.query_one(DataTable)
        table.clear(columns=True)
        table.add_column("node", key="node")
        for s in sections:
            table.add_column(s, key=s)
        table.add_column("verdict", key="verdict")
        for node in run.nodes:
            table.add_row(node, *("pending" for _ in sections), "…", key=node)
        self.query_one(RichLog).clear()
        self.started = time.time()
        self.query_one("#accept-note", Static).update(
            f"acceptance on {', '.join(run.nodes)} (a again: cancel)"
        )

    def progress(self, p: Any) -> None:
        table = self.query_one(DataTable)
        log = self.query_one(RichLog)
        if p.node and p.node in {str(k.value) for k in table.rows}:
            status = self.run.status.get(p.node, {})
            for s in self.sections:
                value = str(status.get(s, ""))
                if str(table.get_cell(p.node, s)) != value:
                    table.update_cell(p.node, s, value, update_width=False)
            if p.kind in ("done", "error"):
                outcome = self.run.outcomes.get(p.node)
                verdict = outcome.verdict if outcome is not None else (p.verdict or "?")
                table.update_cell(p.node, "verdict", verdict, update_width=False)
        if p.kind == "line" and p.text:
            log.write(f"{p.node}: {p.text}")
        elif p.kind == "error":
            log.write(f"{p.node}: could not run: {p.text}")
        elif p.kind == "finished":
            self.query_one("#accept-note", Static).update(
                f"acceptance finished: {p.verdict or '?'}"
                + (f"  (report: {self.run.report_paths[0]})" if self.run.report_paths else "")
            )
