"""Slurm verdicts read from slurmstepd's own lines, for when accounting is off and the job has
left ``scontrol``'s memory. The lines are those a real Slurm 22.05 wrote here: the memory kill is
also provoked end to end in test_slurm.py; the time limit (60 s minimum plus the controller's
30 s check, ~90 s measured) is too slow for the suite, so its line is checked here."""

from __future__ import annotations

from gpuctl.jobs.classify import JobFiles, classify
from gpuctl.jobs.evidence import _slurm_memory_kill, _slurm_said

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


def test_job_folder_files_of_junk_never_stop_a_report(tmp_path: object) -> None:
    """The files of a job folder come from the node: a field of the wrong type is left out
    where it is read (``gpuctl.jobs.records``), so the report still says what is known."""
    import json
    from pathlib import Path

    from gpuctl.core import wire
    from gpuctl.jobs.classify import parse_status, unreachable_report
    from gpuctl.jobs.job import Job
    from gpuctl.jobs.records import Heartbeat, Outcome, WorkerError
    from gpuctl.jobs.targets import backend_of

    outcome = wire.parse(
        Outcome,
        {
            "exit_code": "1",
            "signal_name": 9,
            "run_s": "long",
            "peak_rss_kb": 10**400,
            "cgroup_after": {"oom_kill": "x", "limit_bytes": 1 << 30},
            "stop_reason": None,
        },
    )
    assert outcome == {"cgroup_after": {"limit_bytes": 1 << 30}, "stop_reason": None}
    error = wire.parse(WorkerError, {"kind": "user_exception", "message": ["not", "text"]})
    status = parse_status('{"phase": "start", "python": 3.11}\n{"t": 1}\n[1]\n{"phase": "running"')
    assert status == [{"phase": "start"}]  # no phase: skipped; a torn last line: skipped
    report = classify(JobFiles(outcome=outcome, status=status, error=error))
    assert report is not None and report.kind == "user_exception"

    beat = wire.parse(Heartbeat, {"t": 100.0, "elapsed_s": "abc", "rss_kb": "big"})
    lost = unreachable_report(
        job_id="j",
        node="n",
        jobdir="/j",
        error="refused",
        since=50.0,
        now=200.0,
        beat=beat,
        beat_seen_at=None,
    )
    assert "last heartbeat seen: written" in "\n".join(lost.evidence)

    # a job whose files are junk: its state reads, its end is classified, nothing raises
    folder = Path(str(tmp_path))
    (folder / "outcome.json").write_text(json.dumps([1, 2]))  # not an object: no outcome yet
    (folder / "heartbeat.json").write_text(json.dumps({"t": "soon"}))
    (folder / "status.jsonl").write_text('{"phase": 5}\n')
    backend = backend_of({"kind": "local", "job_root": str(folder), "python": "python3"}, "j")
    job = Job("j", "f", "local", backend, str(folder), {"pid": None}, None)
    assert job.state == "running" and job.last_heartbeat == {}
    (folder / "outcome.json").write_text(json.dumps({"exit_code": 0, "run_s": "x"}))
    assert job.state == "failed" and job.report() is not None
