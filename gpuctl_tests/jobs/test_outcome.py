"""``outcome.json`` has one definition, ``gpuctl.node.jobfiles.Outcome``: the supervisor is
type-checked against it (mypy) and the login side decodes the file through it. Here real jobs
(VENV1 the real Python 3.6), each through branches that write different keys, check that every
key written, nested ones included, is one the reader knows and keeps with its value."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from gpuctl.jobs import JobFailed
from gpuctl.jobs.records import Outcome
from gpuctl.node import jobfiles
from gpuctl_tests.helpers import assert_reader_keeps_all, wait_until


def assert_the_reader_keeps_all(jobdir: str) -> dict[str, Any]:
    """The job's outcome.json, read as the login side reads it, is what the supervisor wrote:
    no key unknown to ``Outcome``, none dropped for its value's type."""
    written = json.loads(Path(jobdir, jobfiles.OUTCOME).read_text())
    assert_reader_keeps_all(Outcome, written, "outcome.json")
    return dict(written)


def _leave_a_process() -> int:
    import subprocess

    return subprocess.Popen(["sleep", "300"]).pid


def _sleep_in_python(seconds: float) -> None:
    import time

    time.sleep(seconds)


def _grow(mib: int) -> int:
    import time

    blocks = []
    for _ in range(mib):
        b = bytearray(1 << 20)
        b[::4096] = b"x" * len(b[::4096])  # touch every page: resident, not just reserved
        blocks.append(b)
    time.sleep(30)  # the supervisor's watch ends it long before
    return len(blocks)


def test_a_clean_job_that_left_a_process(make_executor: Any) -> None:
    job = make_executor(cpus=1, setup=["echo setup"]).submit(_leave_a_process)
    job.result(60)
    written = assert_the_reader_keeps_all(job.jobdir)
    # the branches this run took wrote these (a run that skipped them would check less)
    assert {"supervisor_version", "argv", "venv2_pid", "cpu_user_s", "threads", "setup"} <= set(
        written
    ), sorted(written)
    assert written["left_running"]
    assert written["cgroup_before"] is None or "version" in written["cgroup_before"]


def test_a_job_stopped_at_its_time_limit(make_executor: Any) -> None:
    job = make_executor(time_limit=2, grace=1).submit(_sleep_in_python, 60)
    with pytest.raises(JobFailed):
        job.result(60)
    written = assert_the_reader_keeps_all(job.jobdir)
    assert {"stop_reason", "stop_requested_after_s", "stacks", "signal_name"} <= set(written), (
        sorted(written)
    )


def test_a_job_over_its_memory_limit(make_executor: Any) -> None:
    job = make_executor(mem="150M").submit(_grow, 300)
    with pytest.raises(JobFailed):
        job.result(60)
    written = assert_the_reader_keeps_all(job.jobdir)
    assert written["mem_watch_bytes"] == 150 << 20 and written["mem_limit_exceeded"]


def test_the_keepers_outcome_of_a_killed_supervisor(make_executor: Any) -> None:
    job = make_executor().submit(_sleep_in_python, 300)
    pidfile = Path(job.jobdir, jobfiles.PIDFILE)
    wait_until(lambda: pidfile.exists() and pidfile.read_text(), 30, "the supervisor's pid")
    wait_until(lambda: Path(job.jobdir, jobfiles.STATUS).exists(), 30, "the worker to start")
    os.kill(json.loads(pidfile.read_text())["pid"], signal.SIGKILL)
    with pytest.raises(JobFailed) as info:
        job.result(30)
    assert info.value.kind == "supervisor_killed", info.value
    written = assert_the_reader_keeps_all(job.jobdir)
    assert {"supervisor_killed", "keeper_pid"} <= set(written), sorted(written)
