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
    return lines


def table(rows: "Sequence[Sequence[Any]]") -> "list[str]":
    """Rows of cells as left-aligned text columns."""
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(str(c).ljust(widths[i]) for i, c in enumerate(r)).rstrip() for r in rows]
