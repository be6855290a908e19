"""The docs' failure-mode table, made from the code's own (``report.FAILURES``).

    python -m gpuctl.jobs.failure_table --markdown                    # print it
    python -m gpuctl.jobs.failure_table --write docs/job-failures.md  # between the page's markers

A test compares docs/job-failures.md with ``with_table`` of it, so the two never drift apart.
"""

from __future__ import annotations

from collections.abc import Callable

from gpuctl.jobs.report import FAILURES

TABLE_START = (
    "<!-- failure-modes: python -m gpuctl.jobs.failure_table --write docs/job-failures.md -->"
)
TABLE_END = "<!-- /failure-modes -->"


def markdown_table() -> str:
    """``FAILURES`` as a Markdown table: phase, evidence, name (kind and title), hint."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    rows = ["| phase | evidence | name | hint |", "|---|---|---|---|"]
    for kind, f in FAILURES.items():
        name = f"`{kind}`: {f.title}"
        rows.append(f"| {cell(f.phase)} | {cell(f.evidence)} | {cell(name)} | {cell(f.remedy)} |")
    return "\n".join(rows) + "\n"


def with_table(document: str) -> str:
    """``document`` with the text between its table markers replaced by ``markdown_table()``.

    Raises ValueError when the markers are missing or out of order."""
    return put_table(document, TABLE_START, TABLE_END, markdown_table())


def put_table(document: str, start_marker: str, end_marker: str, table: str) -> str:
    """``document`` with the text between the two markers replaced by ``table``; raises
    ValueError when the markers are missing or out of order (every docs table made from
    code: this one, ``gpuctl.metrics_table``)."""
    start, end = document.find(start_marker), document.find(end_marker)
    if start < 0 or end < start:
        raise ValueError(f"no {start_marker} ... {end_marker} markers, in this order")
    head = document[: start + len(start_marker)]
    return f"{head}\n{table}{document[end:]}"


def main(argv: list[str] | None = None) -> int:
    """``--markdown``: print the table; ``--write FILE``: put it between FILE's markers."""
    return run_cli(
        argv,
        "python -m gpuctl.jobs.failure_table",
        "the failure-mode table",
        markdown_table,
        with_table,
    )


def run_cli(
    argv: list[str] | None,
    prog: str,
    what: str,
    table: Callable[[], str],
    put: Callable[[str], str],
) -> int:
    """The command line of a docs table made from code (this one, ``gpuctl.metrics_table``):
    ``--markdown`` prints ``table()``, ``--write FILE`` rewrites FILE with ``put``; a file it
    cannot read or write, or one without the markers, is one line on stderr and exit 2."""
    import argparse
    import sys
    from pathlib import Path

    ap = argparse.ArgumentParser(prog=prog, description=main.__doc__)
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument("--markdown", action="store_true", help=f"print {what}")
    group.add_argument("--write", metavar="FILE", help=f"rewrite {what} between FILE's markers")
    args = ap.parse_args(argv)
    if args.markdown:
        sys.stdout.write(table())
        return 0
    path = Path(args.write)
    try:
        text = path.read_text(encoding="utf-8")
        path.write_text(put(text), encoding="utf-8")
    except (OSError, ValueError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        print(f"{path}: {why}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
