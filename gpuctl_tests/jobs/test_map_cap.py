"""``map`` with a cap on running jobs (local here; Slurm in test_slurm.py) and its chunk rule."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from gpuctl.jobs import HostError, JobStore
from gpuctl.jobs.executor import chunk_size
from gpuctl_tests.helpers import wait_until


def held(i: int, gate: str, marks: str) -> tuple[int, float, float]:
    """Marks its start, then waits until ``gate`` exists; returns (i, start, end) as the
    function itself measured them."""
    import os
    import time

    start = time.time()
    open(os.path.join(marks, f"{i}.start"), "w").close()
    deadline = time.monotonic() + 120
    while not os.path.exists(gate):
        if time.monotonic() > deadline:
            raise TimeoutError("the test never opened the gate")
        time.sleep(0.01)  # the job's own wait for the test; not the test's synchronisation
    return i, start, time.time()


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The largest number of (start, end) spans that overlap at one moment."""
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    now = most = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def started(marks: Path) -> int:
    return len(list(marks.glob("*.start")))


def run_capped(
    ex: Any, tmp_path: Path, items: int, cap: int, while_held: Any = None
) -> list[tuple[int, float, float]]:
    """A map of ``items`` one-item jobs capped at ``cap``: checks that exactly ``cap`` start
    and the others are "pending" while the first ones are held (``while_held(jobs)`` checks
    more then), lets them all end, checks that no more than ``cap`` ran at once by the items'
    own clocks; returns each item's (i, start, end)."""
    gate, marks = tmp_path / "gate", tmp_path / "marks"
    marks.mkdir()
    jobs = ex.map_jobs(
        held, range(items), [str(gate)] * items, [str(marks)] * items, chunksize=1, max_running=cap
    )
    assert len(jobs) == items
    wait_until(lambda: started(marks) == cap, timeout=120)
    # none of the first `cap` can end before the gate opens, so no other may have started
    waiting = [j for j in jobs if not (marks / f"{jobs.index(j)}.start").exists()]
    assert len(waiting) == items - cap
    assert {j.state for j in waiting} == {"pending"}
    if while_held is not None:
        while_held(jobs)
    gate.touch()
    values: list[tuple[int, float, float]] = [item for j in jobs for _, item in j.result(120)]
    assert [v[0] for v in values] == list(range(items))  # each job's one item, in order
    assert most_at_once([(v[1], v[2]) for v in values]) == cap
    return values


def test_local_map_runs_at_most_max_running_jobs_at_once(
    make_executor: Any, tmp_path: Path
) -> None:
    store = JobStore(tmp_path / "jobs.sqlite")
    run_capped(make_executor(store=store), tmp_path, items=6, cap=2)
    assert {r.state for r in store.list()} == {"done"}


def test_a_capped_map_that_cannot_start_says_so_at_once(make_executor: Any, tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs.sqlite")
    ex = make_executor(supervisor_python=str(tmp_path / "no-python"), store=store)
    with pytest.raises(HostError, match="no python at"):
        ex.map_jobs(abs, range(5), chunksize=1, max_running=2)
    rows = store.list()
    assert len(rows) == 5 and {(r.state, r.kind) for r in rows} == {("failed", "never_started")}
    # no Slurm job: no "pending reason" to see, but what to fix (#40.7)
    remedies = {str((r.report or {}).get("remedy")) for r in rows}
    assert all(x.startswith("fix what the line above says") for x in remedies), remedies


def test_chunk_rule_depends_on_items_and_cap_only() -> None:
    assert chunk_size(10_000, 64) == 40  # 250 chunks: about four per running slot
    assert chunk_size(1_000, 8) == 32
    assert chunk_size(5, 64) == 1  # never an empty chunk
    assert chunk_size(256, 64) == 1
    assert chunk_size(257, 64) == 2


def test_map_chunks_the_same_whatever_cpu_count_the_login_node_has(
    make_executor: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 512)
    ex = make_executor()
    jobs = ex.map_jobs(abs, [-i for i in range(20)], max_running=2)
    assert len(jobs) == 7  # chunks of chunk_size(20, 2) == 3 items
    assert [v for j in jobs for _, v in j.result(120)] == list(range(20))
    with pytest.raises(ValueError, match="max_running must be a whole number of 1 or more"):
        ex.map_jobs(abs, [1], max_running=0)
