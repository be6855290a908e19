"""Text rendering of acceptance reports (no torch: the login side uses it too)."""

from collections.abc import Mapping, Sequence
from typing import Any

from .schema import SECTIONS


def summary_table(report: "Mapping[str, Any]") -> "list[str]":
    """The human summary: one row per section, then one per GPU and dtype of COMPUTE."""
    rows: list[tuple[str, ...]] = [("SECTION", "VERDICT", "SECONDS", "DETAIL")]
    for name in SECTIONS:
        s = report["sections"].get(name, {})
        rows.append(
            (
                name,
                str(s.get("verdict", "-")),
                f"{s.get('seconds', 0):.1f}",
                (s.get("summary") or "")[:90],
            )
        )
    lines = table(rows)
    comp = report["sections"].get("compute", {}).get("devices") or []
    if comp:
        rows = [("DEVICE", "DTYPE", "TFLOP/s", "PEAK", "FRACTION", "VERDICT")]
        for d in comp:
            for r in d["results"]:
                rows.append(
                    (
                        str(d["label"]),
                        str(r["dtype"]),
                        f"{r['tflops']:.3f}" if r["tflops"] is not None else "-",
                        f"{r['peak_tflops']:g}" if r["peak_tflops"] else "-",
                        f"{r['fraction']:.2f}" if r["fraction"] else "-",
                        str(r["verdict"]),
                    )
                )
        lines += ["", *table(rows)]
    sweep = report["sections"].get("ddp_allreduce", {}).get("sweep")
    if sweep:
        lines += ["", *sweep_table(report["sections"]["ddp_allreduce"])]
    lines += burn_plots(report)
    return lines


def sweep_table(section: "Mapping[str, Any]") -> "list[str]":
    """The [DDP] size sweep as nccl-tests prints it: per collective a header naming the ranks
    and the topology (GPUs per node x nodes), then one row per size."""
    lines: list[str] = []
    for op, rows in (section.get("sweep") or {}).items():
        lines.append(
            f"# {op}: {section.get('world_size')} ranks ({section.get('topology')} = GPUs per "
            f"node x nodes), {section.get('backend')}"
        )
        cells = [
            ("size", "count", "type", "redop", "time", "algbw", "busbw", "#wrong"),
            ("(B)", "(elements)", "", "", "(us)", "(GB/s)", "(GB/s)", ""),
        ]
        for r in rows:
            cells.append(
                (
                    str(r["size"]),
                    str(r["count"]),
                    str(r["type"]),
                    str(r["redop"]),
                    _fixed(r["time_us"], 2),
                    _fixed(r["algbw"], 2),
                    _fixed(r["busbw"], 2),
                    str(r["wrong"]),
                )
            )
        widths = [max(len(c[i]) for c in cells) for i in range(len(cells[0]))]
        lines += ["  " + "  ".join(c.rjust(widths[i]) for i, c in enumerate(row)) for row in cells]
    return lines


def _fixed(value: Any, places: int) -> str:
    return "-" if value is None else f"{float(value):.{places}f}"


BURN_PLOTS = (
    ("power_w", "power (W)"),
    ("sm_clock_mhz", "SM clock (MHz)"),
    ("temp_c", "temperature (C)"),
)
MARKS = "0123456789abcdefghijklmnopqrstuvwxyz"


def burn_plots(report: "Mapping[str, Any]", width: int = 100, height: int = 14) -> "list[str]":
    """The [BURN] trace as text plots, one per quantity, each GPU drawn with its index as the
    marker; [] when the report has no trace. Without plotext (a node's VENV2 may lack it) one
    line says where the data is."""
    trace = (report.get("sections", {}).get("burn") or {}).get("trace") or {}
    t = trace.get("t") or []
    gpus = trace.get("gpus") or []
    if not t or not gpus:
        return []
    try:
        import plotext as plt
    except ImportError:
        return ["", "[BURN] trace: plotext is not installed here; the JSON report holds the data"]
    lines = [""]
    for key, title in BURN_PLOTS:
        plt.clear_figure()
        plt.plotsize(width, height)
        plt.theme("clear")
        drawn = 0
        for g in gpus:
            ys = g.get(key) or []
            pts = [(t[k], ys[k]) for k in range(min(len(t), len(ys))) if ys[k] is not None]
            if not pts:
                continue
            mark = MARKS[int(g["index"]) % len(MARKS)]
            plt.plot([p[0] for p in pts], [p[1] for p in pts], label=g["label"], marker=mark)
            drawn += 1
        if not drawn:
            continue
        plt.title(f"[BURN] {title}")
        plt.xlabel("seconds")
        lines += plt.uncolorize(plt.build()).rstrip("\n").splitlines()
    plt.clear_figure()
    return lines


def table(rows: "Sequence[Sequence[Any]]") -> "list[str]":
    """Rows of cells as left-aligned text columns."""
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(str(c).ljust(widths[i]) for i, c in enumerate(r)).rstrip() for r in rows]
