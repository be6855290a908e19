"""Figures the docs state that the code decides: each held to the code, so a page does not keep
a figure that went stale (the history's "about 25 KB" per GPU stayed after it grew to 27 KB and
more; figures that depend on a machine are on Measurements with the command that made them)."""

from __future__ import annotations

import re

from gpuctl.fleet.recording.reader import MAX_INFLATION, MAX_ROWS_PER_BYTE
from gpuctl_tests.fleet.test_gpu_history import HISTORY_BUDGET_KB
from gpuctl_tests.helpers import REPO
from gpuctl_tests.test_docs import README_MAX_LINES


def page(name: str) -> str:
    """A docs page's text with its line breaks as spaces (a figure may wrap)."""
    return re.sub(r"\s+", " ", (REPO / "docs" / name).read_text())


def test_the_history_per_gpu_is_the_bound_its_test_holds() -> None:
    for name in ("screen.md", "measurements.md"):
        text = page(name)
        assert f"under {HISTORY_BUDGET_KB} KB" in text, name
        assert not re.search(r"(about|~) ?\d+ KB (per GPU|of numbers)", text), name


def test_a_recordings_bounds_are_the_readers() -> None:
    text = page("record-replay.md")
    assert f"more than {MAX_INFLATION:,} times its bytes" in text
    assert f"more than {MAX_ROWS_PER_BYTE} GPU samples" in text
    assert f"at most {MAX_ROWS_PER_BYTE} rows per byte" in text


def test_the_readme_bound_is_the_tests() -> None:
    assert f"under {README_MAX_LINES} lines" in page("development.md")


def test_the_readme_says_the_test_commands_torch_and_pythons() -> None:
    """The README's and the development page's torch pin and claimed Pythons are the test
    command's (scripts/test.sh), which is what runs them."""
    script = (REPO / "scripts" / "test.sh").read_text()
    (pin,) = set(re.findall(r"torch==([\d.]+)", script))
    found = re.search(r"GPUCTL_TEST_PYTHONS-([\d. ]+)\}", script)
    assert found is not None
    unit, *smoke = found.group(1).split()
    readme = re.sub(r"\s+", " ", (REPO / "README.md").read_text())
    for name, text in (("README.md", readme), ("development.md", page("development.md"))):
        assert set(re.findall(r"torch==([\d.]+)", text)) == {pin}, name
    said = (
        f"the unit lane under Python {unit}, a smoke of every command under {' and '.join(smoke)}"
    )
    assert said in readme
