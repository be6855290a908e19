"""The supervisor is a child subreaper: what a job leaves in other sessions (a double fork, a
setsid'd daemon and its children) comes back to it and ends with the job, cancelled or not.
VENV1 is the real Python 3.6; the processes are checked in /proc."""

from __future__ import annotations

import json
import os
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest

from gpuctl.jobs import JobFailed
from gpuctl.node import jobfiles
from gpuctl_tests.helpers import wait_until
from gpuctl_tests.jobs.conftest import no_process_with_env
from gpuctl_tests.jobs.test_failures import running


def leave_daemons(path: str, then_sleep: float) -> list[int]:
    """Double fork into a new session: a daemon and its own child, both reparented away from
    the job when the middle process exits. Returns their pids."""
    import os
    import time

    r, w = os.pipe()
    middle = os.fork()
    if middle == 0:
        os.setsid()
        daemon = os.fork()
        if daemon == 0:
            child = os.fork()
            if child == 0:
                time.sleep(300)
                os._exit(0)
            os.write(w, f"{os.getpid()} {child}\n".encode())
            time.sleep(300)
            os._exit(0)
        os._exit(0)
    os.close(w)
    os.waitpid(middle, 0)
    with os.fdopen(r) as f:
        pids = [int(p) for p in f.readline().split()]
    Path(path).write_text(" ".join(map(str, pids)))
    time.sleep(then_sleep)
    return pids


def alive(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return text[text.rindex(")") + 2] not in "ZX"


def test_daemons_a_job_left_end_with_the_job(make_executor: Any, tmp_path: Path) -> None:
    token = f"GPUCTL_JOBTEST_{uuid.uuid4().hex}"
    job = make_executor(job_env={token: "1"}).submit(leave_daemons, str(tmp_path / "pids"), 0.0)
    pids = job.result(60)
    assert len(pids) == 2
    # The outcome is written after the descendants are gone: nothing to wait for.
    assert not any(alive(p) for p in pids)
    assert no_process_with_env(token)
    assert job.report() is None  # a clean success, not a failure because of the cleanup


def test_daemons_of_a_cancelled_job_end_with_it(make_executor: Any, tmp_path: Path) -> None:
    token = f"GPUCTL_JOBTEST_{uuid.uuid4().hex}"
    pid_file = tmp_path / "pids"
    job = make_executor(job_env={token: "1"}, grace=2).submit(leave_daemons, str(pid_file), 300.0)
    wait_until(lambda: running(job) and pid_file.exists(), 30, "the job to leave its daemons")
    pids = [int(p) for p in pid_file.read_text().split()]
    assert all(alive(p) for p in pids)
    assert job.cancel()
    with pytest.raises(JobFailed) as info:
        job.result(30)
    assert info.value.kind == "cancelled"
    assert not any(alive(p) for p in pids)
    assert no_process_with_env(token)


def start_children(path: str) -> None:
    """A child in the job's own session (a data loader) and a daemon in a session of its own;
    their pids go to ``path``; then wait to be killed."""
    import subprocess
    import time

    loader = subprocess.Popen(["sleep", "300"])
    daemon = subprocess.Popen(["sleep", "301"], start_new_session=True)
    Path(path).write_text(f"{loader.pid} {daemon.pid}")
    time.sleep(300)


def test_a_killed_supervisor_takes_the_job_processes_with_it(
    make_executor: Any, tmp_path: Path
) -> None:
    """kill -9 of the supervisor (an admin, the OOM killer): VENV2 dies of its parent-death
    signal, its children reparent to the keeper, which ends them and names what happened."""
    token = f"GPUCTL_JOBTEST_{uuid.uuid4().hex}"
    pid_file = tmp_path / "pids"
    job = make_executor(job_env={token: "1"}).submit(start_children, str(pid_file))
    wait_until(lambda: pid_file.exists() and pid_file.read_text(), 30, "the job's children")
    pids = [int(p) for p in pid_file.read_text().split()]
    supervisor = json.loads(Path(job.jobdir, jobfiles.PIDFILE).read_text())["pid"]
    os.kill(supervisor, signal.SIGKILL)
    with pytest.raises(JobFailed) as info:
        job.result(30)
    assert info.value.kind == "supervisor_killed", info.value
    assert "SIGKILL" in str(info.value)
    assert not any(alive(p) for p in pids)
    assert no_process_with_env(token)
