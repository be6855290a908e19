"""One node's acceptance report: each section's verdict, then every figure with its verdict,
its fraction of the model's peak and its trend over the node's earlier runs (the history)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from gpuctl.tui.text import node_content, node_str, node_text
from gpuctl.workloads.accept_suite.schema import SECTIONS

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


CELL_LIMIT = 60  # characters of a cell: labels and names come from the node's report
LINE_LIMIT = 1000  # characters of a summary or a failure


def _finite(v: Any) -> float | None:
    """A report's number as a float, or None for anything else (a string, 10**400, NaN)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def _num(v: Any, fmt: str = ".4g") -> str:
    f = _finite(v)
    return "-" if f is None else format(f, fmt)


def _frac(v: Any) -> str:
    f = _finite(v)
    return "-" if f is None or abs(f) > 1e6 else f"{100 * f:.0f}%"


def _s(v: Any) -> str:
    """A string field of the report, printable and cut for a cell."""
    return node_str(v, limit=CELL_LIMIT)


def _dict(v: Any) -> Mapping[str, Any]:
    return v if isinstance(v, Mapping) else {}


def _dicts(v: Any) -> list[Mapping[str, Any]]:
    return [x for x in v if isinstance(x, Mapping)] if isinstance(v, list) else []


def section(report: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """One section of a node report, ``{}`` when it is missing or not a mapping."""
    return _dict(_dict(report.get("sections")).get(name))


def figure_rows(report: Mapping[str, Any]) -> list[FigureRow]:
    """Every figure of a node report, in suite order; keys match ``history.figures``.

    The report is what a node sent: a field of the wrong type counts as missing."""
    rows: list[FigureRow] = []
    for d in _dicts(section(report, "compute").get("devices")):
        label = _s(d.get("label") or d.get("index"))
        name = _s(d.get("name") or "")
        for r in _dicts(d.get("results")):
            dtype = _s(r.get("dtype"))
            value = f"{_num(r.get('tflops'))} TFLOP/s" if r.get("tflops") is not None else "-"
            cells = (
                "compute",
                f"{label} {name}".strip() if name and name != label else label,
                dtype,
                value,
                _num(r.get("peak_tflops"), "g"),
                _frac(r.get("fraction")),
                _s(r.get("verdict") or "-"),
            )
            rows.append((cells, f"compute/{label}/{dtype}"))
    for d in _dicts(section(report, "membw").get("devices")):
        label = _s(d.get("label") or d.get("index"))
        cells = (
            "membw",
            label,
            "copy",
            f"{_num(d.get('gbps'))} GB/s",
            _num(d.get("peak_gbps"), "g"),
            _frac(d.get("fraction")),
            _s(d.get("verdict") or "-"),
        )
        rows.append((cells, f"membw/{label}"))
    for d in _dicts(section(report, "pcie").get("devices")):
        label = _s(d.get("label") or d.get("index"))
        value = f"{_num(d.get('h2d_gbps'))}/{_num(d.get('d2h_gbps'))} GB/s"
        cells = (
            "pcie",
            label,
            "h2d/d2h",
            value,
            _num(d.get("peak_gbps"), "g"),
            _frac(d.get("fraction")),
            _s(d.get("verdict") or "-"),
        )
        rows.append((cells, ""))
    for d in _dicts(section(report, "train").get("devices")):
        label = _s(d.get("label") or d.get("index"))
        drop = _finite(d.get("drop"))
        value = f"loss {_num(d.get('first_loss'), '.4g')} → {_num(d.get('final_loss'), '.4g')}"
        if drop is not None and abs(drop) <= 1e6:
            value += f" (-{100 * drop:.0f}%)"
        verdict = _s(d.get("verdict") or "-")
        rows.append((("train", label, f"{_s(d.get('steps'))} steps", value, "", "", verdict), ""))
    ar = section(report, "ddp_allreduce")
    if ar.get("busbw_gbps") is not None or ar.get("algbw_gbps") is not None:
        world = _s(ar.get("world_size"))
        nnodes = _s(ar.get("nnodes"))
        where = f"{world} ranks" + (f", {nnodes} node(s)" if ar.get("nnodes") else "")
        verdict = _s(ar.get("verdict") or "-")
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
        verdict = _s(r.get("verdict") or "?")
        style = "$success bold" if verdict == "PASS" else "$error bold"
        duration = r.get("duration_s")
        self.query_one("#report-title", Static).update(
            node_content(
                (f" {_s(self.node)} ", "$primary bold"),
                " acceptance · ",
                (verdict, style),
                f" · {_s(r.get('device', '?'))}{' quick' if r.get('quick') else ''}",
                f" · {_num(duration, '.1f')} s" if duration is not None else "",
                f" · host {_s(r.get('hostname'))}" if r.get("hostname") else "",
                one_line=True,
            )
        )
        sections = self.query_one("#report-sections", DataTable)
        sections.border_title = "sections"
        sections.add_columns("section", "verdict", "seconds", "summary")
        for name in SECTIONS:
            sec = section(r, name)
            sections.add_row(
                Text(name),
                self._verdict(_s(sec.get("verdict") or "-")),
                Text(_num(sec.get("seconds"), ".1f")),
                node_text(sec.get("summary") or "", limit=LINE_LIMIT),
                key=name,
            )
        figures = self.query_one("#report-figures", DataTable)
        figures.border_title = "figures (trend: this node's earlier runs, oldest → newest)"
        for col in FIGURE_COLUMNS:
            figures.add_column(col, key=col)
        for i, (cells, _key) in enumerate(self.figures):
            *plain, verdict = cells
            figures.add_row(
                *(node_text(c) for c in plain), self._verdict(verdict), Text(""), key=str(i)
            )
        notes: list[object] = []
        failures = r.get("failures")
        for f in failures if isinstance(failures, list) else []:
            notes += [("FAIL ", "$error bold"), node_str(f, limit=LINE_LIMIT), "\n"]
        for d in self.degradations:
            what = _degradation_text(d)
            notes += [("DEGRADED ", "$warning bold"), node_str(what, limit=LINE_LIMIT), "\n"]
        self.query_one("#report-notes", Static).update(node_content(*notes, one_line=False))
        self.query_one("#report-notes").display = bool(notes)
        figures.focus()
        if self.history_path is not None and self.history_path.exists():
            self.load_trends(self.history_path)

    def _verdict(self, verdict: str) -> Text:
        cls = VERDICT_CLASS.get(verdict)
        return node_text(verdict, self.get_component_rich_style(cls, partial=True) if cls else "")

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
        style = self.get_component_rich_style("acceptreport--trend", partial=True)
        for row, spark in trends.items():
            table.update_cell(row, "trend", Text(spark, style=style))

    def action_back(self) -> None:
        self.dismiss(None)


def _degradation_text(d: Mapping[str, Any]) -> str:
    """The history's own reason for a degradation (below the median, falling at every run, a
    figure or a GPU gone), or the bare figures when the entry cannot be read as one."""
    from gpuctl.accept.history import Degradation

    try:
        return Degradation.from_dict(d).reason()
    except (KeyError, TypeError, ValueError):
        return (
            f"{d.get('key')}: {_num(d.get('value'))} {d.get('unit', '')} is "
            f"{_frac(d.get('drop'))} below its earlier runs ({_num(d.get('reference'))})"
        )
