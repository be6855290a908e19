"""The docs' GPU metrics table, made from the metric registry (``gpuctl/node/metrics.py``).

    python -m gpuctl.metrics_table --markdown               # print it
    python -m gpuctl.metrics_table --write docs/metrics.md  # put it between the page's markers

A test compares docs/metrics.md with ``with_table`` of it, so the two never drift apart. The
markers and the command line are ``gpuctl.jobs.failure_table``'s, with this table's names.
"""

from __future__ import annotations

from gpuctl.jobs import failure_table
from gpuctl.node.metrics import METRICS, PERCENT_OF, SLOW_READ_EVERY

TABLE_START = "<!-- gpu-metrics: python -m gpuctl.metrics_table --write docs/metrics.md -->"
TABLE_END = "<!-- /gpu-metrics -->"
FLAGS = ("list", "filter", "sort", "heatmap", "plot", "csv", "status")
_SHARE = {num: word for word, (num, _total) in PERCENT_OF.items()}


def markdown_table() -> str:
    """One row per reading: wire key, what, unit on the wire and shown, DCGM exporter name,
    the filter word, and where it appears."""
    rows = [
        "| reading | what | unit (shown) | exported as | filter word | in |",
        "|---|---|---|---|---|---|",
    ]
    for m in METRICS:
        unit = m.unit or "text"
        if m.shown != m.unit:
            unit += f" ({m.shown})"
        word = "-"
        if "filter" in m.flags:
            word = f"`{m.name}`" + (f", `{_SHARE[m.key]}` (%)" if m.key in _SHARE else "")
        where = ", ".join(f for f in FLAGS if f in m.flags) or "-"
        if m.slow:
            where += f"; read every {SLOW_READ_EVERY}th sample"
        dcgm = f"`{m.dcgm}`" if m.dcgm else "-"
        if m.dcgm and m.dcgm_scale == 1 / (1 << 20):
            dcgm += " (MiB)"
        rows.append(f"| `{m.key}` | {m.what} | {unit} | {dcgm} | {word} | {where} |")
    return "\n".join(rows) + "\n"


def with_table(document: str) -> str:
    """``document`` with the text between its table markers replaced by ``markdown_table()``.

    Raises ValueError when the markers are missing or out of order."""
    return failure_table.put_table(document, TABLE_START, TABLE_END, markdown_table())


def main(argv: list[str] | None = None) -> int:
    """``--markdown``: print the table; ``--write FILE``: put it between FILE's markers."""
    return failure_table.run_cli(
        argv, "python -m gpuctl.metrics_table", "the GPU metrics table", markdown_table, with_table
    )


if __name__ == "__main__":
    raise SystemExit(main())
