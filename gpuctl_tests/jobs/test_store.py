"""Store first: a job's row is written before anything starts; a store that cannot be written
refuses the job; a damaged store is one line, not a traceback."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from gpuctl.jobs import Executor, HostError, JobStore, StoreError
from gpuctl_tests.helpers import node_env, unavailable, wait_until

JOB = "import os\n\ndef f():\n    return os.getpid()\n"


def gpuctl(tmp_path: Path, argv: list[str], state: Path, wrap: str = "") -> Any:
    env = node_env({"GPUCTL_STATE_DIR": str(state), "GPUCTL_CONFIG": str(tmp_path / "c.toml")})
    (tmp_path / "c.toml").write_text(f'[jobs]\ndir = "{tmp_path / "jobs"}"\n')
    cmd = [sys.executable, "-m", "gpuctl", *argv]
    if wrap:
        cmd = ["sh", "-c", wrap + " " + shlex.join(cmd)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)


def read_only_mount(folder: Path) -> str:
    """Shell text running what follows with ``folder`` mounted read-only (a private mount
    namespace: root included, nothing can write there)."""
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if shutil.which("unshare") is None or probe.returncode != 0:
        unavailable("needs unshare -m (root; CI runs as root)")
    q = shlex.quote(str(folder))
    inner = f'mount --bind {q} {q} && mount -o remount,ro,bind {q} {q} && exec "$0" "$@"'
    return f"exec unshare -m sh -c {shlex.quote(inner)}"


def test_a_store_that_cannot_be_written_refuses_the_job(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    JobStore(state / "jobs.sqlite")  # a good store, then the file system goes read-only
    (tmp_path / "job.py").write_text(JOB)
    r = gpuctl(tmp_path, ["submit", "job.py:f"], state, wrap=read_only_mount(state))
    assert r.returncode == 1, r.stdout + r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("gpuctl: the job store ") and "cannot be written" in line
    assert "GPUCTL_STATE_DIR" in line and "Traceback" not in r.stderr
    assert not (state / "jobs").exists()  # nothing written for the job: its row came first


def test_a_damaged_store_is_one_line_for_every_command(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "jobs.sqlite").write_bytes(b"this is no database\n" * 64)
    (tmp_path / "job.py").write_text(JOB)
    for argv in (["jobs"], ["jobs", "--json"], ["submit", "job.py:f"], ["result", "abc"]):
        r = gpuctl(tmp_path, argv, state)
        assert r.returncode == 1, (argv, r.stderr)
        (line,) = r.stderr.strip().splitlines()
        assert "is damaged" in line and f"mv {state / 'jobs.sqlite'}" in line, argv
    assert not (tmp_path / "jobs").exists() or not any((tmp_path / "jobs").iterdir())


def test_a_start_refused_takes_its_row_and_folder_back(tmp_path: Path) -> None:
    """The row is written before the start; a start refused (no supervisor Python) takes it
    back with the folder: the error says why, nothing is left to purge (#40.7)."""
    store = JobStore(tmp_path / "jobs.sqlite")
    ex = Executor(
        "local",
        supervisor_python=str(tmp_path / "no-such-python"),
        job_root=str(tmp_path / "jobs"),
        store=store,
    )
    with pytest.raises(HostError, match="no python at"):
        ex.submit(os.getpid)
    assert store.list() == []
    assert [p.name for p in (tmp_path / "jobs").iterdir()] == []


def test_a_function_that_cannot_be_pickled_leaves_no_row(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs.sqlite")
    ex = Executor("local", job_root=str(tmp_path / "jobs"), store=store)
    lock = threading.Lock()
    with pytest.raises(TypeError):
        ex.submit(lambda: lock)
    assert store.list() == []


def test_store_error_is_a_one_line_exception_of_the_api(tmp_path: Path) -> None:
    (tmp_path / "jobs.sqlite").write_bytes(b"junk" * 100)
    damaged = r"is damaged \(file is not a database\): move it away \(mv "
    with pytest.raises(StoreError, match=damaged):
        JobStore(tmp_path / "jobs.sqlite")


def test_many_processes_opening_one_old_store_at_once(tmp_path: Path) -> None:
    """An old store (no heartbeat column) opened by eight gpuctl processes at the same time:
    each adds the column or finds it added by another, none calls the store damaged.

    The test holds the store's write lock until every process has read the columns and waits
    for the lock (sleeping in SQLite's busy handler), so that all of them race for the ALTER."""
    import sqlite3

    path = tmp_path / "jobs.sqlite"
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE jobs (id TEXT PRIMARY KEY, name TEXT NOT NULL, target TEXT NOT NULL,"
            " backend TEXT NOT NULL, jobdir TEXT NOT NULL, state TEXT NOT NULL, kind TEXT,"
            " summary TEXT, created_at REAL NOT NULL, started_at REAL, ended_at REAL,"
            " report TEXT)"
        )
        db.execute("CREATE INDEX jobs_created ON jobs(created_at)")
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # readers may read; nobody may write
    code = "import sys; from gpuctl.jobs.store import JobStore; JobStore(sys.argv[1])"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(path)],
            env=node_env(),
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(8)
    ]

    def waiting_for_the_lock(pid: int) -> bool:
        try:
            return "nanosleep" in Path(f"/proc/{pid}/wchan").read_text()
        except OSError:
            return False

    wait_until(lambda: all(waiting_for_the_lock(p.pid) for p in procs), 60, "the writers")
    holder.execute("ROLLBACK")
    holder.close()
    errors = [p.communicate(timeout=60)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 8, errors
    assert "heartbeat" in {r[1] for r in sqlite3.connect(path).execute("PRAGMA table_info(jobs)")}


def test_one_session_opens_its_job_store_once(make_executor: Any) -> None:
    """The executors, ``attach`` by id and the session itself share the one store the session
    opened (``gpuctl.context.Context.job_store``): before, each executor and each attach by id
    opened one of its own."""
    from gpuctl.context import current
    from gpuctl.jobs import attach

    a, b = make_executor(store=True), make_executor(store=True)
    assert a.store is b.store
    assert a.store is current().job_store()
    job = a.submit(os.getpid)
    assert job.store is a.store and job.result(60) != os.getpid()
    again = attach(job.id[:8], watch=False)
    assert again.store is a.store and again.state == "done"
    assert [r.id for r in a.store.list()] == [job.id]
