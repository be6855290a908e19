"""Slurm verdicts read from slurmstepd's own lines, for when accounting is off and the job has
left ``scontrol``'s memory. The lines are those a real Slurm 22.05 wrote here: the memory kill is
also provoked end to end in test_slurm.py; the time limit (60 s minimum plus the controller's
30 s check, ~90 s measured) is too slow for the suite, so its line is checked here."""

from __future__ import annotations

from gpuctl.jobs.report import JobFiles, _slurm_memory_kill, _slurm_said, classify

TIMEOUT_LINE = (
    "slurmstepd-localhost: error: *** JOB 1 ON localhost CANCELLED AT 2026-11-22T00:31:31 "
    "DUE TO TIME LIMIT ***\n"
)
OOM_LINES = (
    "slurmstepd-localhost: error: StepId=1.batch exceeded memory limit (431423488 > 104857600),"
    " being killed\nslurmstepd-localhost: error: Exceeded job memory limit\n"
)


def test_slurmstepd_lines() -> None:
    assert _slurm_said(TIMEOUT_LINE) == "TIMEOUT"
    assert _slurm_said(TIMEOUT_LINE.replace("TIME LIMIT", "PREEMPTION")) == "PREEMPTED"
    assert _slurm_said("slurmstepd: error: *** JOB 3 ON n1 CANCELLED AT 2026-11-22 ***") == ""
    (line,) = _slurm_memory_kill(OOM_LINES)
    assert "StepId=1.batch" in line and "411.4 MiB" in line and "100.0 MiB" in line
    assert _slurm_memory_kill("slurmstepd: error: Exceeded job memory limit\n")
    assert _slurm_memory_kill(TIMEOUT_LINE) == []


def test_a_signalled_stop_is_the_time_limit_slurm_names() -> None:
    """The supervisor saw a SIGTERM (it records a cancel); Slurm's line says why."""
    outcome = {"exit_code": None, "signal_name": "SIGTERM", "stop_reason": "cancelled"}
    files = JobFiles(outcome=outcome, status=[{"phase": "running"}], meta={"limits": {}})
    plain = classify(files, scheduler={"state": "", "output_tail": ""})
    assert plain is not None and plain.kind == "cancelled"
    timed = classify(files, scheduler={"state": "CANCELLED", "output_tail": TIMEOUT_LINE})
    assert timed is not None and timed.kind == "time_limit"
    assert "from slurmstepd's message" in "\n".join(timed.evidence)
    gone = classify(JobFiles(), scheduler={"state": "FAILED", "output_tail": OOM_LINES})
    assert gone is not None and gone.kind == "out_of_memory"


def test_a_store_from_an_older_gpuctl_gains_the_heartbeat_column(tmp_path: object) -> None:
    import sqlite3
    from pathlib import Path

    from gpuctl.jobs.store import JobRecord, JobStore

    path = Path(str(tmp_path)) / "old.sqlite"
    with sqlite3.connect(path) as db:  # the schema before the heartbeat column
        db.execute(
            "CREATE TABLE jobs (id TEXT PRIMARY KEY, name TEXT NOT NULL, target TEXT NOT NULL,"
            " backend TEXT NOT NULL, jobdir TEXT NOT NULL, state TEXT NOT NULL, kind TEXT,"
            " summary TEXT, created_at REAL NOT NULL, started_at REAL, ended_at REAL,"
            " report TEXT)"
        )
        db.execute(
            "INSERT INTO jobs (id, name, target, backend, jobdir, state, created_at)"
            " VALUES ('old1', 'f', 'gpu1', '{}', '/j', 'running', 1.0)"
        )
    db.close()
    store = JobStore(path)
    old = store.get("old1")
    assert old is not None and old.heartbeat is None and old.state == "running"
    store.add(JobRecord("new1", "g", "gpu1", {}, "/k", "submitted", 2.0))
    store.update("new1", heartbeat={"t": 5.0, "elapsed_s": 1.0})
    new = store.get("new1")
    assert new is not None and new.heartbeat == {"t": 5.0, "elapsed_s": 1.0}
