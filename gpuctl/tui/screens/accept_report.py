"""One node's acceptance report: each section's verdict, then every figure with its verdict,
its fraction of the model's peak and its trend over the node's earlier runs (the history)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.content import Content
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from gpuctl.workloads.accept.schema import SECTIONS

FIGURE_COLUMNS = ("section", "device", "what", "value", "peak", "of peak", "verdict", "trend")
VERDICT_CLASS = {
    "PASS": "acceptreport--pass",
    "WARN": "acceptreport--warn",
    "FAIL": "acceptreport--fail",
    "SKIP": "acceptreport--skip",
    "ERROR": "acceptreport--fail",
}

# One row of the figures table: its cells and the history key of its trend ("" for none).
FigureRow = tuple[tuple[str, str, str, str, str, str, str], str]


def _num(v: Any, fmt: str = ".4g") -> str:
    return format(v, fmt) if isinstance(v, int | float) else "-"


def _frac(v: Any) -> str:
    return f"{100 * v:.0f}%" if isinstance(v, int | float) else "-"


def figure_rows(report: Mapping[str, Any]) -> list[FigureRow]:
    """Every figure of a node report, in suite order; keys match ``history.figures``."""
    s = report.get("sections") or {}
    rows: list[FigureRow] = []
    for d in (s.get("compute") or {}).get("devices") or []:
        label = str(d.get("label") or d.get("index"))
        name = str(d.get("name") or "")
        for r in d.get("results") or []:
            dtype = str(r.get("dtype"))
            value = f"{_num(r.get('tflops'))} TFLOP/s" if r.get("tflops") is not None else "-"
            cells = (
                "compute",
                f"{label} {name}".strip() if name and name != label else label,
                dtype,
                value,
                _num(r.get("peak_tflops"), "g"),
                _frac(r.get("fraction")),
                str(r.get("verdict") or "-"),
            )
            rows.append((cells, f"compute/{label}/{dtype}"))
    for d in (s.get("membw") or {}).get("devices") or []:
        label = str(d.get("label") or d.get("index"))
        cells = (
            "membw",
            label,
            "copy",
            f"{_num(d.get('gbps'))} GB/s",
            _num(d.get("peak_gbps"), "g"),
            _frac(d.get("fraction")),
            str(d.get("verdict") or "-"),
        )
        rows.append((cells, f"membw/{label}"))
    for d in (s.get("pcie") or {}).get("devices") or []:
        label = str(d.get("label") or d.get("index"))
        value = f"{_num(d.get('h2d_gbps'))}/{_num(d.get('d2h_gbps'))} GB/s"
        cells = (
            "pcie",
            label,
            "h2d/d2h",
            value,
            _num(d.get("peak_gbps"), "g"),
            _frac(d.get("fraction")),
            str(d.get("verdict") or "-"),
        )
        rows.append((cells, ""))
    for d in (s.get("train") or {}).get("devices") or []:
        label = str(d.get("label") or d.get("index"))
        drop = d.get("drop")
        value = f"loss {_num(d.get('first_loss'), '.4g')} → {_num(d.get('final_loss'), '.4g')}"
        if isinstance(drop, int | float):
            value += f" (-{100 * drop:.0f}%)"
        verdict = str(d.get("verdict") or "-")
        rows.append((("train", label, f"{d.get('steps')} steps", value, "", "", verdict), ""))
    ar = s.get("ddp_allreduce") or {}
    if ar.get("busbw_gbps") is not None or ar.get("algbw_gbps") is not None:
        world = ar.get("world_size")
        where = f"{world} ranks" + (f", {ar.get('nnodes')} node(s)" if ar.get("nnodes") else "")
        verdict = str(ar.get("verdict") or "-")
        rows.append(
            (("ddp", where, "algbw", f"{_num(ar.get('algbw_gbps'))} GB/s", "", "", verdict), "")
        )
        rows.append(
            (
                ("ddp", where, "busbw", f"{_num(ar.get('busbw_gbps'))} GB/s", "", "", verdict),
                "ddp/busbw",
            )
        )
    return rows


class AcceptReportScreen(Screen[None]):
    """Drill-down from the acceptance pane: Esc goes back."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "back", "back", id="report_back"),
    ]
    COMPONENT_CLASSES: ClassVar[set[str]] = set(VERDICT_CLASS.values()) | {"acceptreport--trend"}

    def __init__(
        self,
        node: str,
        report: Mapping[str, Any],
        *,
        history_path: Path | None = None,
        degradations: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        super().__init__()
        self.node = node
        self.report = report
        self.history_path = history_path
        self.degradations = list(degradations)
        self.figures = figure_rows(report)

    def compose(self) -> ComposeResult:
        yield Static(id="report-title")
        with VerticalScroll(id="report-body"):
            yield DataTable(id="report-sections", cursor_type="row", zebra_stripes=True)
            yield DataTable(id="report-figures", cursor_type="row", zebra_stripes=True)
            yield Static(id="report-notes")
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        r = self.report
        verdict = str(r.get("verdict") or "?")
        style = "$success bold" if verdict == "PASS" else "$error bold"
        duration = r.get("duration_s")
        self.query_one("#report-title", Static).update(
            Content.assemble(
                (f" {self.node} ", "$primary bold"),
                " acceptance · ",
                (verdict, style),
                f" · {r.get('device', '?')}{' quick' if r.get('quick') else ''}",
                f" · {_num(duration, '.1f')} s" if duration is not None else "",
                f" · host {r.get('hostname')}" if r.get("hostname") else "",
            )
        )
        sections = self.query_one("#report-sections", DataTable)
        sections.border_title = "sections"
        sections.add_columns("section", "verdict", "seconds", "summary")
        for name in SECTIONS:
            sec = (r.get("sections") or {}).get(name) or {}
            sections.add_row(
                name,
                self._verdict(str(sec.get("verdict") or "-")),
                _num(sec.get("seconds"), ".1f"),
                Text(str(sec.get("summary") or "")),
                key=name,
            )
        figures = self.query_one("#report-figures", DataTable)
        figures.border_title = "figures (trend: this node's earlier runs, oldest → newest)"
        for col in FIGURE_COLUMNS:
            figures.add_column(col, key=col)
        for i, (cells, _key) in enumerate(self.figures):
            *plain, verdict = cells
            figures.add_row(*(Text(c) for c in plain), self._verdict(verdict), Text(""), key=str(i))
        notes: list[str | tuple[str, str]] = []
        for f in r.get("failures") or []:
            notes += [("FAIL ", "$error bold"), f"{f}\n"]
        for d in self.degradations:
            notes += [
                ("DEGRADED ", "$warning bold"),
                f"{d.get('key')}: {_num(d.get('value'))} {d.get('unit', '')} is "
                f"{_frac(d.get('drop'))} below its median ({_num(d.get('reference'))})\n",
            ]
        self.query_one("#report-notes", Static).update(Content.assemble(*notes))
        self.query_one("#report-notes").display = bool(notes)
        figures.focus()
        if self.history_path is not None and self.history_path.exists():
            self.load_trends(self.history_path)

    def _verdict(self, verdict: str) -> Text:
        cls = VERDICT_CLASS.get(verdict)
        return Text(verdict, style=self.get_component_rich_style(cls) if cls else "")

    @work(thread=True, exclusive=True, group="report-trends", exit_on_error=False)
    def load_trends(self, path: Path) -> None:
        from gpuctl.accept.history import HistoryStore, sparkline

        history = HistoryStore(path)
        known = set(history.keys(self.node))
        device = self.report.get("device")
        trends: dict[str, str] = {}
        for i, (_cells, key) in enumerate(self.figures):
            if key and key in known:
                series = history.series(
                    self.node, key, device=device if isinstance(device, str) else None
                )
                if len(series) > 1:
                    trends[str(i)] = sparkline([v for _t, v, _u in series])
        self.app.call_from_thread(self._show_trends, trends)

    def _show_trends(self, trends: dict[str, str]) -> None:
        table = self.query_one("#report-figures", DataTable)
        style = self.get_component_rich_style("acceptreport--trend")
        for row, spark in trends.items():
            table.update_cell(row, "trend", Text(spark, style=style))

    def action_back(self) -> None:
        self.dismiss(None)
