"""One node's acceptance report: first what failed or warned (the rule it broke, its figures, the
likely cause the report shows and the next step), then each section's verdict, then every figure
with its verdict, its fraction of the model's peak and its trend over the node's earlier runs."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from gpuctl.core.format import short_model
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
            yield Static(id="report-findings")
            yield DataTable(id="report-sections", cursor_type="row", zebra_stripes=True)
            yield DataTable(id="report-figures", cursor_type="row", zebra_stripes=True)
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
                node_text(screen_names(node_str(sec.get("summary") or "")), limit=LINE_LIMIT),
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
        self._findings()
        figures.focus(scroll_visible=False)  # the screen opens on what failed
        if self.history_path is not None and self.history_path.exists():
            self.load_trends(self.history_path)

    def _findings(self) -> None:
        """What failed first: each finding's verdict and figure, its rule, then its figures,
        likely cause and next step on lines of their own."""
        box = self.query_one("#report-findings", Static)
        found = findings(self.report, self.node, self.degradations)
        box.display = bool(found)
        fails = sum(f.verdict in ("FAIL", "ERROR") for f in found)
        counts = [f"{fails} failed"] if fails else []
        counts += [f"{len(found) - fails} to look at"] if len(found) > fails else []
        box.border_title = f"{', '.join(counts)}: why, and what next"
        box.set_class(not fails, "-warn")
        style = {"FAIL": "$error bold", "ERROR": "$error bold", "WARN": "$warning bold"}
        parts: list[object] = []
        for i, f in enumerate(found):
            if parts:
                parts.append("\n")
            parts += [
                (f"{f.verdict} ", style.get(f.verdict, "$warning bold")),
                (f.what, "bold"),
                f": {f.rule}",
            ]
            after = found[i + 1] if i + 1 < len(found) else None
            # the cause and step the next finding shares are said once, after the last of them
            shared = after is not None and (after.cause, after.step) == (f.cause, f.step)
            notes = [("figures", f.figures)]
            notes += [] if shared else [("likely", f.cause), ("next", f.step)]
            for label, text in notes:
                if text:
                    parts += ["\n  ", (f"{label}: ", "$text-muted"), text]
        box.update(node_content(*parts, one_line=False))

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


# -- what failed, why, what next ----------------------------------------------------------------
BURN_AGAIN = "10m"  # the sustained run a slow figure is rerun under


@dataclass(frozen=True)
class Finding:
    """One failing or warning figure of a report, read for an operator: the rule it broke
    (threshold and distance), its figures, the likely cause when the report carries evidence
    ([HEALTH]'s throttle reasons, temperature and XIDs on that GPU) and the next step as a
    command the CLI takes."""

    verdict: str  # FAIL, WARN, ERROR or DEGRADED
    what: str  # "compute gpu1 bf16"
    rule: str
    figures: str = ""
    cause: str = ""
    step: str = ""


def _pct(f: float) -> str:
    return f"{100 * f:.0f}%"


def _evidence(report: Mapping[str, Any], index: Any) -> tuple[str, str]:
    """What [HEALTH] saw on GPU ``index`` during the run, in the screen's names (THERM, not
    sw_thermal), and the step it calls for: ("", "") when it saw nothing."""
    from gpuctl.core.format import THROTTLE_BADGES, THROTTLE_WORDS
    from gpuctl.workloads.accept_suite.nodehealth import XIDS, xid_text

    row = next(
        (g for g in _dicts(section(report, "health").get("gpus")) if g.get("index") == index), {}
    )
    causes: list[str] = []
    step = ""
    xids = [x for x in row.get("xids") or [] if isinstance(x, int) and not isinstance(x, bool)]
    for x in xids[:3]:
        causes.append(xid_text(x))
        if x in XIDS and XIDS[x].hardware:
            step = "drain"
    reasons = [str(t) for t in row.get("throttle") or [] if isinstance(t, str)]
    badges = [THROTTLE_BADGES.get(t, t.upper()) for t in reasons]
    if badges:
        words = ", ".join(
            f"{b} ({THROTTLE_WORDS[b]})" if b in THROTTLE_WORDS else b for b in badges
        )
        temp = _finite(row.get("temp"))
        at = f" at {temp:.0f} °C" if temp is not None else ""
        causes.append(node_str(f"throttled while computing: {words}{at}", limit=CELL_LIMIT * 3))
        if not step and any("THERM" in b for b in badges):
            step = "cooling"
        elif not step:
            step = "power"
    return "; ".join(causes), step


def _next(step: str, node: str) -> str:
    """The next step for an evidence kind, the commands as the CLI takes them."""
    rerun = f"gpuctl accept --nodes {node} --burn {BURN_AGAIN}"
    drain = f"gpuctl accept --nodes {node} --drain-failed"
    return {
        "drain": f"drain the node and open a ticket: {drain}",
        "cooling": f"check its cooling (fans, inlet air), then rerun under load: {rerun}",
        "power": f"check the node's power limits and supply, then rerun under load: {rerun}",
        "rerun": f"rerun under sustained load to see whether it holds: {rerun}",
        "again": f"rerun to confirm: gpuctl accept --nodes {node}; if it stays: {drain}",
    }.get(step, "")


def _model_floor(sec: Mapping[str, Any], name: str, dtype: str) -> float | None:
    """The floor the suite judged a figure by, from its options in the section."""
    from gpuctl.workloads.accept_suite import peaks

    floors = sec.get("floors") if isinstance(sec.get("floors"), dict) else None
    try:
        return peaks.floor_for(peaks.model_key(name), dtype, floors, _finite(sec.get("floor")))[0]
    except (TypeError, ValueError, AttributeError):
        return None


def _compute_findings(report: Mapping[str, Any], node: str) -> list[Finding]:
    sec = section(report, "compute")
    devices = _dicts(sec.get("devices"))
    tol = _finite(sec.get("same_model_tolerance"))
    best: dict[tuple[str, str], float] = {}
    for d in devices:
        for r in _dicts(d.get("results")):
            t = _finite(r.get("tflops"))
            if t is not None:
                k = (_s(d.get("name")), _s(r.get("dtype")))
                best[k] = max(best.get(k, t), t)
    out: list[Finding] = []
    for d in devices:
        label, name = _s(d.get("label") or d.get("index")), _s(d.get("name") or "")
        for r in _dicts(d.get("results")):
            verdict = _s(r.get("verdict") or "")
            if verdict not in ("FAIL", "WARN", "ERROR"):
                continue
            dtype = _s(r.get("dtype"))
            tflops, frac = _finite(r.get("tflops")), _finite(r.get("fraction"))
            floor, peak = _finite(r.get("floor")), _finite(r.get("peak_tflops"))
            if floor is None and frac is not None:  # a report before floors were recorded
                floor = _model_floor(sec, name, dtype)
            top = best.get((name, dtype))
            if r.get("check"):
                rule, kind = f"wrong result: {_s(r.get('check'))}", "drain"
            elif frac is not None and floor is not None and frac < floor:
                source = f", {_s(r.get('floor_source'))}" if r.get("floor_source") else ""
                rule = (
                    f"{_pct(frac)} of the peak: {100 * (floor - frac):.0f} points under the "
                    f"floor {_pct(floor)}{source}"
                )
                kind = "rerun"
            elif tflops is not None and top and tflops < top:
                allowed = f"; more than {_pct(tol)} below fails" if tol is not None else ""
                rule = (
                    f"{_pct(1 - tflops / top)} below the best {short_model(name)} of this "
                    f"node ({top:.1f} TFLOP/s){allowed}"
                )
                kind = "rerun"
            else:
                rule, kind = node_str(r.get("reason") or verdict, limit=LINE_LIMIT), "rerun"
            figures = "" if tflops is None else f"{tflops:.1f} TFLOP/s"
            if frac is not None and peak is not None:
                figures += f", {_pct(frac)} of the peak {peak:g}"
            cause, seen = _evidence(report, d.get("index"))
            out.append(
                Finding(
                    verdict,
                    f"compute {label} {dtype}",
                    rule,
                    figures,
                    cause,
                    _next(seen or kind, node),
                )
            )
    return out


def screen_names(text: str) -> str:
    """A suite's text with NVML's throttle reasons as the screen names them (THERM, not
    sw_thermal): one vocabulary on every screen."""
    from gpuctl.core.format import THROTTLE_BADGES

    for raw, badge in THROTTLE_BADGES.items():
        text = text.replace(raw, badge)
    return text


def _health_findings(report: Mapping[str, Any], node: str) -> list[Finding]:
    out: list[Finding] = []
    for g in _dicts(section(report, "health").get("gpus")):
        verdict = _s(g.get("verdict") or "")
        if verdict not in ("FAIL", "WARN", "ERROR"):
            continue
        reason = node_str(g.get("reason") or verdict, limit=LINE_LIMIT)
        cause, seen = _evidence(report, g.get("index"))
        cause = "; ".join(c for c in cause.split("; ") if c.startswith("XID "))  # not its rule
        out.append(
            Finding(
                verdict,
                f"health gpu{_s(g.get('index'))}",
                screen_names(reason),
                "",
                cause,
                _next(seen or ("drain" if verdict == "FAIL" else "again"), node),
            )
        )
    return out


def findings(
    report: Mapping[str, Any], node: str, degradations: Sequence[Mapping[str, Any]] = ()
) -> list[Finding]:
    """Every failing or warning figure of ``report`` (failures first), then the history's
    degradations: what a report screen opens on."""
    out = _compute_findings(report, node) + _health_findings(report, node)
    for name in SECTIONS:
        if name in ("compute", "health"):
            continue
        sec = section(report, name)
        verdict = _s(sec.get("verdict") or "")
        if verdict not in ("FAIL", "WARN", "ERROR"):
            continue
        lines = [x for x in (sec.get("failures") or []) + (sec.get("warnings") or [])]
        lines = [x for x in lines if isinstance(x, str)] or [sec.get("summary") or verdict]
        step = "drain" if name in ("memtest", "shape") and verdict == "FAIL" else "again"
        for line in lines:
            what, sep, rule = node_str(line, limit=LINE_LIMIT).partition(": ")
            out.append(
                Finding(
                    verdict, what if sep else name, rule if sep else what, step=_next(step, node)
                )
            )
    order = {"FAIL": 0, "ERROR": 0, "WARN": 1}
    out.sort(key=lambda f: order.get(f.verdict, 2))
    for d in degradations:
        what = _degradation_text(d)
        key, sep, rest = what.partition(": ")
        out.append(
            Finding(
                "DEGRADED",
                key if sep else "history",
                rest if sep else what,
                step=_next("again", node),
            )
        )
    return out
