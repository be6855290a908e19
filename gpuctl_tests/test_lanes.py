"""The full lane's workers (gpuctl_tests/lanes.py): a module stays whole on one worker, every
real-Slurm test goes to one, and ``--record-slow`` keeps a test's id without its group; the
unit lane's few screenshots."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpuctl_tests.helpers import REPO, node_env
from gpuctl_tests.lanes import plain_id

MODULE = """
import os
from pathlib import Path

import pytest

def ran(name):
    Path(__file__).with_name("ran").joinpath(name).write_text(os.environ["PYTEST_XDIST_WORKER"])

@pytest.mark.slurm
def test_slurm():
    ran("{m}-slurm")

@pytest.mark.parametrize("i", range(4))
def test_plain(i):
    ran(f"{m}-plain-{{i}}")
"""


def test_two_workers_keep_modules_whole_and_slurm_on_one(tmp_path: Path) -> None:
    (tmp_path / "ran").mkdir()
    modules = [f"m{i}" for i in range(4)]
    for m in modules:
        (tmp_path / f"test_{m}.py").write_text(MODULE.format(m=m))
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "gpuctl_tests.lanes",
         "-c", "/dev/null", "--rootdir", str(tmp_path), "-n", "2", "--dist", "loadgroup",
         "-W", "ignore::pytest.PytestUnknownMarkWarning", str(tmp_path)],
        cwd=tmp_path, env=node_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    worker = {p.name: p.read_text() for p in (tmp_path / "ran").iterdir()}
    assert len(worker) == 4 * 5, worker
    assert len(set(worker.values())) == 2, worker  # both workers took work
    for m in modules:
        assert len({worker[f"{m}-plain-{i}"] for i in range(4)}) == 1, worker
    assert len({worker[f"{m}-slurm"] for m in modules}) == 1, worker


def test_a_recorded_id_drops_the_group_and_keeps_its_parameters() -> None:
    assert plain_id("gpuctl_tests/a.py::test_x[1]@slurm") == "gpuctl_tests/a.py::test_x[1]"
    assert plain_id("a.py::t@gpuctl_tests/a.py") == "a.py::t"
    assert plain_id("a.py::t[user@host]") == "a.py::t[user@host]"
    assert plain_id("a.py::t") == "a.py::t"


def pytest_in_repo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=REPO, env=node_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip


SCREENSHOTS = ("gpuctl_tests/tui/test_snapshots.py", "gpuctl_tests/tui/test_snapshots_sizes.py")


def test_the_unit_lane_has_a_few_screenshots() -> None:
    """Issue 41.8: every screenshot was in the full lane only, so a maintainer saw a screen's
    change only there; the overview, heatmap and detail at 120x40 and the help are in both."""
    r = pytest_in_repo("--unit", "--collect-only", *SCREENSHOTS)
    assert r.returncode == 0, r.stdout + r.stderr
    ids = {line for line in r.stdout.splitlines() if "::" in line}
    assert ids == {
        "gpuctl_tests/tui/test_snapshots.py::test_help",
        "gpuctl_tests/tui/test_snapshots_sizes.py::test_overview[120x40]",
        "gpuctl_tests/tui/test_snapshots_sizes.py::test_heatmap[120x40]",
        "gpuctl_tests/tui/test_snapshots_sizes.py::test_detail[120x40]",
    }, r.stdout


def test_the_unit_lane_passes_with_the_screenshots_it_leaves_out() -> None:
    """syrupy fails a run whose snapshot files hold snapshots no test asked for: in the unit
    lane those are the full lane's, not unused (CI's 3.10 lane failed so, all tests passed)."""
    r = pytest_in_repo("--unit", *SCREENSHOTS)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "4 snapshots passed" in r.stdout, r.stdout[-2000:]


def test_the_unit_lane_refuses_to_update_screenshots_in_one_line() -> None:
    """syrupy takes the screenshots a lane leaves out for unused ones and deletes them."""
    before = sorted(REPO.glob("gpuctl_tests/tui/__snapshots__/*/*.svg"))
    r = pytest_in_repo("--unit", "--snapshot-update", *SCREENSHOTS)
    assert r.returncode == pytest.ExitCode.USAGE_ERROR, r.stdout + r.stderr
    (line,) = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert "--snapshot-update in the full lane only" in line, r.stderr
    assert sorted(REPO.glob("gpuctl_tests/tui/__snapshots__/*/*.svg")) == before
