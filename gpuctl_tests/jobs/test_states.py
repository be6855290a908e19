"""A job's state never goes backwards, and every ended or stuck job can be cancelled and purged.

The transitions are enforced where the job store writes a row's state (``JobStore.update``):
every pair of states is tried here against a table written out independently. The rest drives
the case of issue 25: a capped map whose submitter is interrupted (or killed) leaves jobs that
never ran; `gpuctl result`, `cancel` and `jobs purge` must then see them as they ended.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from gpuctl.jobs import JobRecord, JobStore
from gpuctl.jobs.jobqueue import queue_owner
from gpuctl.jobs.records import BackendInfo, QueuedBy
from gpuctl.jobs.store import STATES
from gpuctl.node import jobfiles
from gpuctl_tests.helpers import node_env, wait_until
from gpuctl_tests.jobs.test_cli import run

FINAL = {"done", "failed", "cancelled"}
# (from, to) pairs a row may take, besides staying as it is; written out, not derived
ALLOWED = {
    *(("preparing", s) for s in ("submitted", "pending", *FINAL)),
    *(("submitted", s) for s in ("pending", "running", "unreachable", *FINAL)),
    *(("pending", s) for s in ("submitted", "running", "unreachable", *FINAL)),
    *(("running", s) for s in ("pending", "unreachable", *FINAL)),  # pending: Slurm requeued it
    *(("unreachable", s) for s in ("submitted", "pending", "running", *FINAL)),
}


def job_folders(root: Path) -> list[str]:
    """The job folders under a job root; the caches jobs share (the user's shipped code,
    runner folders, a map's shared part: content-addressed, kept like pip's cache) aside."""
    return [p for p in os.listdir(root) if not p.startswith(("code-", "runner-", "shared"))]


def _state(store: JobStore, job_id: str) -> str:
    rec = store.get(job_id)
    assert rec is not None
    return rec.state


def _row(store: JobStore, job_id: str, state: str) -> None:
    store.add(
        JobRecord(
            id=job_id,
            name="f",
            target="local",
            backend={"kind": "local", "job_root": "/nonexistent", "python": "python3"},
            jobdir=f"/nonexistent/{job_id}",
            state=state,
            created_at=time.time(),
        )
    )


@pytest.mark.parametrize(("old", "new"), list(itertools.product(STATES, STATES)))
def test_every_transition_is_taken_or_refused_where_the_store_writes_it(old: str, new: str) -> None:
    store = JobStore()
    _row(store, "j1", old)
    applied = store.update("j1", state=new, kind="k", summary="why")
    rec = store.get("j1")
    assert rec is not None
    if old == new or (old, new) in ALLOWED:
        assert applied and (rec.state, rec.kind, rec.summary) == (new, "k", "why")
    else:  # refused whole: neither the state nor what came with it
        assert not applied and (rec.state, rec.kind, rec.summary) == (old, None, None)


def test_a_transition_only_from_the_states_named_is_one_step() -> None:
    """A cancel of a job waiting for its turn ends it only while it still waits: its queue's
    claim (pending -> submitted) and the cancel cannot both win."""
    store = JobStore()
    _row(store, "j1", "pending")
    assert store.update("j1", state="submitted")  # the queue claimed it
    assert not store.update("j1", only_from=("pending",), state="cancelled")
    assert _state(store, "j1") == "submitted"
    assert store.update("j2", state="done")  # no such row: nothing to refuse


SUBMITTER = """
import os, sys, time
from gpuctl.jobs import Executor, JobStore

def held(gate):
    import os, time
    while not os.path.exists(gate):
        time.sleep(0.02)  # the job's own wait for the test's gate
    return "ran"

if __name__ == "__main__":
    ex = Executor("local", supervisor_python=sys.argv[1], python=sys.argv[2],
                  job_root=sys.argv[3], store=JobStore())
    jobs = ex.map_jobs(held, [sys.argv[4]] * 3, chunksize=1, max_running=1)
    print(" ".join(j.id for j in jobs), flush=True)
    jobs[0].result()
"""


def _submitter(tmp_path: Path, venv1: str, venv2: str) -> tuple[subprocess.Popen[str], list[str]]:
    """A real process that maps over three items, one at a time, and waits on the first."""
    script = tmp_path / "submitter.py"
    script.write_text(textwrap.dedent(SUBMITTER))
    gate = tmp_path / "gate"
    argv = [sys.executable, str(script), venv1, venv2, str(tmp_path / "jobs"), str(gate)]
    env = node_env({"GPUCTL_STATE_DIR": os.environ["GPUCTL_STATE_DIR"]})
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    ids = proc.stdout.readline().split()
    assert len(ids) == 3, proc.communicate()
    return proc, ids


def test_jobs_an_interrupted_map_never_ran_stay_ended_and_are_purged(
    tmp_path: Path, venv1: str, venv2: str, capsys: pytest.CaptureFixture[str]
) -> None:
    proc, ids = _submitter(tmp_path, venv1, venv2)
    store = JobStore()
    wait_until((tmp_path / "jobs" / ids[0] / jobfiles.STATUS).exists, timeout=60)  # it runs
    proc.send_signal(signal.SIGINT)  # Ctrl-C of the submitter
    proc.communicate(timeout=60)
    assert [_state(store, i) for i in ids[1:]] == ["failed", "failed"]
    never = ids[1]
    for _ in range(2):  # looking again changes nothing: the row stays as it ended
        rc, out, err = run(capsys, "result", never)
        assert rc == 1 and "[never_started]" in err and "never ran" in err, err
        assert _state(store, never) == "failed"
    rc, _, err = run(capsys, "cancel", never)
    assert rc == 1 and "already ended (failed)" in err
    rc, out, _ = run(capsys, "jobs")
    assert sum(" failed " in line and "never_started" in line for line in out.splitlines()) == 2
    (tmp_path / "gate").touch()
    rc, out, _ = run(capsys, "result", ids[0], "--timeout", "60")
    assert (rc, out.strip()) == (0, "[('ok', 'ran')]")
    rc, out, err = run(capsys, "jobs", "purge", "--older-than", "0")
    assert rc == 0 and "purged 3 job(s)" in out, err
    assert store.list() == [] and job_folders(tmp_path / "jobs") == []


def test_jobs_whose_submitter_was_killed_end_as_never_started_and_are_purged(
    tmp_path: Path, venv1: str, venv2: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """SIGKILL leaves no time to write anything: the rows say "pending" until a look finds the
    process that held them in its queue gone."""
    proc, ids = _submitter(tmp_path, venv1, venv2)
    store = JobStore()
    wait_until((tmp_path / "jobs" / ids[0] / jobfiles.STATUS).exists, timeout=60)  # it runs
    proc.kill()
    proc.communicate(timeout=60)
    assert [_state(store, i) for i in ids[1:]] == ["pending", "pending"]
    rc, out, err = run(capsys, "result", ids[2])
    assert rc == 1 and "[never_started]" in err and f"pid {proc.pid}" in err, err
    rc, out, err = run(capsys, "jobs", "purge", "--older-than", "0", "--dry-run")
    assert f"would purge {ids[1][:12]} failed" in out, err  # looked at: it ended, unseen
    rc, out, err = run(capsys, "jobs", "purge", "--older-than", "0")
    assert rc == 0 and "purged 2 job(s)" in out, err  # the first still runs: it stays
    assert [r.id for r in store.list()] == [ids[0]]
    rc, out, _ = run(capsys, "cancel", ids[0])
    assert rc == 0 and f"cancelling {ids[0]}" in out
    rc, _, err = run(capsys, "result", ids[0], "--timeout", "60")
    assert rc == 1 and "[cancelled]" in err
    assert _state(store, ids[0]) == "cancelled"


def test_a_job_waiting_for_its_turn_is_cancelled_here_or_from_another_gpuctl(
    make_executor: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpuctl_tests.jobs.test_map_cap import held

    gate, marks = tmp_path / "gate", tmp_path / "marks"
    marks.mkdir()
    ex = make_executor()
    jobs = ex.map_jobs(
        held, range(4), [str(gate)] * 4, [str(marks)] * 4, chunksize=1, max_running=1
    )
    store = JobStore()
    assert jobs[1].cancel()  # in this process
    assert jobs[1].cancelled() and jobs[1].state == "cancelled"
    with pytest.raises(concurrent.futures.CancelledError, match="never ran"):
        jobs[1].result(0)
    rc, out, err = run(capsys, "cancel", jobs[2].id[:10])  # as another gpuctl would
    assert rc == 0 and "cancelling" in out, err
    assert _state(store, jobs[2].id) == "cancelled"
    gate.touch()
    assert [v[0] for _, v in jobs[3].result(120)] == [3]
    assert jobs[2].cancelled() and jobs[0].result(0)[0][1][0] == 0
    # neither cancelled job was started: no supervisor ever ran in their folders
    assert sorted(p.name for p in marks.iterdir()) == ["0.start", "3.start"]
    assert not os.path.exists(f"{jobs[2].jobdir}/supervisor.json")
    assert [_state(store, j.id) for j in jobs] == ["done", "cancelled", "cancelled", "done"]


def test_stuck_rows_of_jobs_never_started_are_cancelled_and_purged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A row left "preparing" (its gpuctl died writing the folder) or "pending" by an older
    gpuctl: one whose writer is gone ends as never_started when looked at; one whose writer
    lives (or is not known) can be cancelled; both are then purged with their folders."""
    pid = int(subprocess.check_output([sys.executable, "-c", "import os; print(os.getpid())"]))
    dead: QueuedBy = {"pid": pid, "host": socket.gethostname()}  # a process that has ended
    store = JobStore()
    rows: dict[str, tuple[str, QueuedBy | None]] = {
        "a" * 32: ("preparing", dead),
        "b" * 32: ("preparing", queue_owner()),  # this process: alive
        "c" * 32: ("pending", None),  # written by a gpuctl that did not say whose queue
    }
    for job_id, (state, owner) in rows.items():
        folder = tmp_path / "jobs" / job_id
        folder.mkdir(parents=True)
        (folder / jobfiles.PAYLOAD).write_bytes(b"x" * 1000)
        backend: BackendInfo = {"kind": "local", "job_root": str(folder.parent), "python": "3"}
        if owner:
            backend["queued_by"] = owner
        store.add(JobRecord(job_id, "f", "local", backend, str(folder), state, time.time() - 60))
    rc, _, err = run(capsys, "result", "a" * 12)
    assert rc == 1 and "[never_started]" in err and f"pid {dead['pid']}" in err, err
    assert _state(store, "a" * 32) == "failed"
    for job_id in ("b" * 32, "c" * 32):
        rc, out, err = run(capsys, "result", job_id[:12])  # waits for its turn: not over
        assert rc == 3 and f"is {rows[job_id][0]}" in err, err
        rc, out, err = run(capsys, "cancel", job_id[:12])
        assert rc == 0 and f"cancelling {job_id}" in out, err
        assert _state(store, job_id) == "cancelled"
        rc, _, err = run(capsys, "result", job_id[:12])
        assert rc == 1 and "[cancelled]" in err and "never ran" in err, err
    # the end of the first was not seen: its age is its creation's; the others ended just now
    rc, out, err = run(capsys, "jobs", "purge", "--older-than", "30s")
    assert rc == 0 and "purged 1 job(s)" in out, err
    assert not (tmp_path / "jobs" / ("a" * 32)).exists()
    rc, out, err = run(capsys, "jobs", "purge", "--older-than", "0")
    assert rc == 0 and "purged 2 job(s)" in out, err
    assert store.list() == [] and job_folders(tmp_path / "jobs") == []


def test_a_job_cancelled_while_its_folder_was_written_is_stopped_as_it_starts(
    make_executor: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """`gpuctl cancel` of a row still "preparing" (a big payload being written): the row ends
    cancelled there and then, and the job the submitter starts next is stopped by its cancel
    file, never left running untracked."""
    from gpuctl_tests.jobs.test_handles import naps

    ex = make_executor()
    job_id, jobdir, meta = ex._prepare(naps, (60.0, 1), {}, "naps")  # the folder is written
    store = JobStore()
    assert _state(store, job_id) == "preparing"
    rc, out, err = run(capsys, "cancel", job_id)
    assert rc == 0 and f"cancelling {job_id}" in out and _state(store, job_id) == "cancelled", err
    (job,) = ex._start([(job_id, jobdir)], meta)  # what submit does next
    with pytest.raises(concurrent.futures.CancelledError):
        job.result(60)
    assert job.cancelled() and os.path.exists(f"{jobdir}/{jobfiles.CANCEL}")
    assert _state(store, job_id) == "cancelled"


LOST = """
import sys
from gpuctl.jobs import Executor, JobStore
from gpuctl_tests.jobs.test_handles import naps

ex = Executor("local", supervisor_python=sys.argv[1], python=sys.argv[2], job_root=sys.argv[3],
              store=JobStore())
for job in [ex.submit(naps, 120.0, i) for i in range(2)]:
    print(job.id, job.jobdir, flush=True)
"""


def test_lost_jobs_are_cancelled_as_ended_and_purged(
    venv1: str, venv2: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Jobs whose supervisor was killed (keeper and all: SIGKILL to its process group) wrote no
    outcome, and no gpuctl saw them end: `cancel` finds one ended, `purge` looks at them first
    and deletes them."""
    env = node_env({"GPUCTL_STATE_DIR": os.environ["GPUCTL_STATE_DIR"]})
    argv = [sys.executable, "-c", LOST, venv1, venv2, str(tmp_path / "jobs")]
    submitted = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert submitted.returncode == 0, submitted.stderr
    jobs = [line.split() for line in submitted.stdout.splitlines()]
    for _, jobdir in jobs:
        out = Path(jobdir, jobfiles.STDOUT)  # absent until the supervisor opens it
        wait_until(lambda out=out: out.exists() and out.read_bytes(), 60, "the job to run")
        os.killpg(json.loads(Path(jobdir, jobfiles.PIDFILE).read_text())["pgid"], signal.SIGKILL)
    store = JobStore()
    assert {_state(store, job_id) for job_id, _ in jobs} == {"submitted"}
    rc, _, err = run(capsys, "cancel", jobs[0][0])
    assert rc == 1 and "already ended (failed)" in err, err
    rc, out, err = run(capsys, "jobs", "purge", "--older-than", "0")
    assert rc == 0 and "purged 2 job(s)" in out, err
    assert store.list() == [] and job_folders(tmp_path / "jobs") == []
