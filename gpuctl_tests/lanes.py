"""The suite's two lanes: the full lane (the README's ``bash scripts/test.sh``, CI: every test)
and the unit lane (``pytest --unit``, ``bash scripts/test.sh --unit``: the developer's loop).

The unit lane leaves out every test marked with one of ``UNIT_LEAVES_OUT``. Nobody has to
remember those marks on a new test:

- a test that asks for a fixture of ``FIXTURE_MARKS`` needs what the marker names (a real sshd,
  a real Slurm, a job on the real Python 3.6, chromium) and gets that marker here;
- a module that starts a real Prometheus (``gpuctl_tests.harness.prometheus``) marks itself
  ``prometheus`` (``pytestmark``);
- a test that took over ``SLOW_S`` seconds when it was last measured is listed in
  ``slow_tests.txt`` and gets the ``slow`` marker here (as a test marked slow by hand does).
  ``pytest --record-slow ...`` measures the tests it runs (setup, call and teardown) and
  updates their lines in that file, leaving the lines of the tests it did not run;
- a test marked ``unit`` stays in the unit lane whatever it took, and ``--record-slow`` leaves
  it out of that file: a few screenshots (``gpuctl_tests/tui/test_snapshots*.py``, some 1.5 s
  each), so a maintainer sees a screen's change in the unit lane before the full lane. Update
  them after a deliberate change with ``pytest gpuctl_tests/tui --snapshot-update`` (not with
  ``--unit``: it is refused, as syrupy would delete the screenshots the lane leaves out) and
  look at the SVGs before committing them.

The full lane runs in several pytest-xdist workers (``scripts/test.sh``: ``-n``, ``--dist
loadgroup``): its tests mostly wait (on sshd, Slurm, subprocesses, timeouts), and one process
kept a two-core machine 60% idle. Each test gets an ``xdist_group`` here, so a worker takes a
whole group: a module stays on one worker (its module-scoped fixtures, a Prometheus, are set up
once), and every test of a real Slurm (``slurm``) goes to the same worker, so the session's
clusters start once and no two Slurm clusters run side by side. The modules that start real
burners, or stop every burner of this user on this machine (``gpuctl stress stop --all``),
mark themselves ``burners`` and share a worker too: a burner is found machine-wide, so one
module's stop would end, and its listing count, another module's burner running beside it.

The lanes, for people: docs/development.md.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

FIXTURE_MARKS = {
    "ssh_cluster": "sshd",
    "slurm_cluster": "slurm",
    "slurm_nodes": "slurm",
    "slurm_executor": "slurm",
    "venv1": "jobs",  # a real job: the Python 3.6 supervisor, a VENV2 that gpuctl builds
    "browser": "chromium",
}
UNIT_LEAVES_OUT = ("slow", "sshd", "slurm", "jobs", "chromium", "prometheus")
SLOW_S = 1.0
SLOW_FILE = Path(__file__).with_name("slow_tests.txt")
_HEADER = (
    "# Tests that took over {:g} s when last measured: the unit lane (pytest --unit) leaves them\n"
    "# out. Written by `pytest --record-slow ...` (gpuctl_tests/lanes.py): one test id a line.\n"
)

_seconds: Counter[str] = Counter()
UNIT_LANE = False  # this run is the unit lane (--unit): set when pytest is configured


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpuctl lanes")
    group.addoption(
        "--unit",
        action="store_true",
        help="the unit lane: leave out the tests marked " + ", ".join(UNIT_LEAVES_OUT),
    )
    group.addoption(
        "--record-slow",
        action="store_true",
        help=f"update gpuctl_tests/slow_tests.txt for the tests run: listed when over {SLOW_S:g} s",
    )


def pytest_configure(config: pytest.Config) -> None:
    global UNIT_LANE
    UNIT_LANE = bool(config.getoption("unit"))
    if UNIT_LANE and config.getoption("update_snapshots", default=False):
        # syrupy would take the screenshots the unit lane leaves out for unused ones: deleted
        raise pytest.UsageError(
            "--snapshot-update in the full lane only (the unit lane would delete the "
            "screenshots it leaves out): pytest gpuctl_tests/tui --snapshot-update"
        )
    if UNIT_LANE and hasattr(config.option, "warn_unused_snapshots"):
        # the screenshots the unit lane leaves out are not unused: syrupy would fail the run
        config.option.warn_unused_snapshots = True


def read_slow() -> set[str]:
    try:
        text = SLOW_FILE.read_text()
    except FileNotFoundError:
        return set()
    return {line for line in text.splitlines() if line.strip() and not line.startswith("#")}


def xdist_group(item: pytest.Item) -> str:
    """The group a worker takes whole: every real-Slurm test in one, every test of a module
    marked ``burners`` in another, else the test's module."""
    if item.get_closest_marker("slurm"):
        return "slurm"
    if item.get_closest_marker("burners"):
        return "burners"
    return item.nodeid.split("::", 1)[0]


def plain_id(nodeid: str) -> str:
    """A test's id without the ``@group`` that ``--dist loadgroup`` appends to it."""
    return re.sub(r"@[^\[\]@]*$", "", nodeid)


# Before xdist's own hook, which appends the group to each test's id.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    slow = read_slow()
    for item in items:
        for fixture in getattr(item, "fixturenames", ()):
            marker = FIXTURE_MARKS.get(fixture)
            if marker is not None:
                item.add_marker(marker)
        if item.nodeid in slow and not item.get_closest_marker("unit"):
            item.add_marker("slow")
        item.add_marker(pytest.mark.xdist_group(xdist_group(item)))
    if not config.getoption("unit"):
        return
    kept, left = [], []
    for item in items:
        out = any(item.get_closest_marker(name) for name in UNIT_LEAVES_OUT)
        (left if out else kept).append(item)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = kept


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "unit" not in report.keywords:  # kept in the unit lane whatever it takes
        _seconds[plain_id(report.nodeid)] += report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    if not session.config.getoption("record_slow") or not _seconds:
        return
    if hasattr(session.config, "workerinput"):  # an xdist worker: the controller writes
        return
    slow = read_slow() - _seconds.keys()
    slow |= {nodeid for nodeid, seconds in _seconds.items() if seconds > SLOW_S}
    SLOW_FILE.write_text(_HEADER.format(SLOW_S) + "".join(f"{n}\n" for n in sorted(slow)))
