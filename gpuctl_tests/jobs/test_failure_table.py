"""The failure-mode table of docs/job-failures.md is the code's own (``report.FAILURES``), made
by ``python -m gpuctl.jobs.failure_table``: this test fails as soon as the two differ."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpuctl.jobs import failure_table
from gpuctl.jobs.report import FAILURES, KINDS, REMEDIES

FAILURES_PAGE = Path(__file__).resolve().parents[2] / "docs" / "job-failures.md"


def test_the_docs_failure_table_is_the_one_the_code_makes() -> None:
    page = FAILURES_PAGE.read_text(encoding="utf-8")
    assert failure_table.with_table(page) == page, (
        "docs/job-failures.md's failure-mode table differs from the code's: run "
        "`python -m gpuctl.jobs.failure_table --write docs/job-failures.md`"
    )
    rows = [line for line in page.splitlines() if line.startswith("| ") and "| `" in line]
    for kind, mode in FAILURES.items():
        (row,) = [r for r in rows if f"| `{kind}`: " in r]
        assert row.startswith(f"| {mode.phase} | ") and row.endswith(f" | {mode.remedy} |")


def test_one_table_kinds_and_remedies_are_its_views() -> None:
    assert {k: m.title for k, m in FAILURES.items()} == KINDS
    assert {k: m.remedy for k, m in FAILURES.items()} == REMEDIES
    assert all(m.phase and m.evidence for m in FAILURES.values())


def test_the_generator_rewrites_only_between_its_markers(tmp_path: Path) -> None:
    start, end = failure_table.TABLE_START, failure_table.TABLE_END
    doc = tmp_path / "doc.md"
    doc.write_text(f"before\n{start}\nstale | table\n{end}\nafter\n")
    cmd = [sys.executable, "-m", "gpuctl.jobs.failure_table"]
    r = subprocess.run([*cmd, "--write", str(doc)], capture_output=True, text=True, check=True)
    assert r.stderr == ""
    text = doc.read_text()
    assert text.startswith(f"before\n{start}\n| phase | evidence | name | hint |\n")
    assert text.endswith(f"{end}\nafter\n") and "stale" not in text
    shown = subprocess.run([*cmd, "--markdown"], capture_output=True, text=True, check=True)
    assert shown.stdout == failure_table.markdown_table() and shown.stderr == ""
    (tmp_path / "bare.md").write_text("no markers\n")
    r = subprocess.run([*cmd, "--write", str(tmp_path / "bare.md")], capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and "markers" in r.stderr
    with pytest.raises(ValueError):
        failure_table.with_table("no markers\n")
