"""The full lane's workers (gpuctl_tests/lanes.py): a module stays whole on one worker, every
real-Slurm test goes to one, and ``--record-slow`` keeps a test's id without its group."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gpuctl_tests.helpers import node_env
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
