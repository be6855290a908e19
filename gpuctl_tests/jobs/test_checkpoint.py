"""Checkpoint and requeue (submitit's Checkpointable contract): at its time-limit warning a
checkpointable function is pickled again and the job goes on from it, in place outside Slurm
and through ``scontrol requeue`` on the real one-node Slurm; each attempt is in the history."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpuctl.jobs import JobFailed
from gpuctl.jobs.checkpoint import Checkpointable, Resubmit
from gpuctl_tests.helpers import wait_until


class Counter(Checkpointable):
    """Counts to ``target`` in steps of ``pause`` seconds; every call is a run (an attempt)."""

    def __init__(self) -> None:
        self.step = 0
        self.runs: list[int] = []

    def __call__(self, target: int, pause: float) -> dict[str, Any]:
        import os
        import time

        self.runs.append(os.getpid())
        while self.step < target:
            time.sleep(pause)
            self.step += 1
        return {"step": self.step, "runs": self.runs}


class UntilRequeued(Counter):
    """A Counter whose first run never ends by itself (a signal ends it, the time-limit
    warning's or Slurm's preemption's: when is Slurm's to say); a run that began from the
    checkpoint counts on to ``target``. Every call is a run; the object carries them across
    checkpoints."""

    def __call__(self, target: int, pause: float) -> dict[str, Any]:
        import os
        import time

        self.runs.append(os.getpid())
        while self.step < target or len(self.runs) < 2:
            time.sleep(pause)
            self.step += 1
        return {"step": self.step, "runs": self.runs}


class Declines(Counter):
    def checkpoint(self, *args: Any, **kwargs: Any) -> Resubmit | None:
        return None


def test_a_checkpointable_function_goes_on_from_its_checkpoint(make_executor: Any) -> None:
    # 3 s of work, a warning 1.5 s into each attempt: one attempt cannot finish it
    ex = make_executor(time_limit=3, warning=1.5, max_requeues=10)
    job = ex.submit(Counter(), 30, 0.1)
    got = job.result(60)
    assert got["step"] == 30
    assert len(got["runs"]) >= 2 and len(set(got["runs"])) == len(got["runs"])
    attempts = job.attempts()
    assert len(attempts) == len(got["runs"]) - 1
    assert [a["reason"] for a in attempts] == ["checkpoint"] * len(attempts)
    assert [a["attempt"] for a in attempts] == list(range(1, len(attempts) + 1))
    assert "attempt 1 checkpointed" in job.stdout()
    assert not Path(job.jobdir, "checkpoint.pkl").exists()  # it became the payload


def test_requeues_are_bounded_and_the_report_says_so(make_executor: Any) -> None:
    job = make_executor(time_limit=2, warning=1, max_requeues=1).submit(Counter(), 10_000, 0.1)
    with pytest.raises(JobFailed) as info:
        job.result(60)
    assert info.value.kind == "time_limit", info.value
    assert "max_requeues=1 requeues were used up" in str(info.value)
    assert "requeued 1 time(s) (checkpoint)" in str(info.value)
    assert len(job.attempts()) == 1


def test_a_checkpoint_that_declines_lets_the_time_limit_end_the_job(make_executor: Any) -> None:
    job = make_executor(time_limit=2, warning=1, grace=1).submit(Declines(), 10_000, 0.1)
    with pytest.raises(JobFailed) as info:
        job.result(60)
    assert info.value.kind == "time_limit"
    assert job.attempts() == []


def plain_sleep(seconds: float) -> float:
    import time

    time.sleep(seconds)
    return seconds


def test_a_plain_function_ignores_the_warning(make_executor: Any) -> None:
    """USR1 to a function without checkpoint() is only noted (Slurm sends it to every job)."""
    assert make_executor(time_limit=30, warning=29.5).submit(plain_sleep, 1.0).result(60) == 1.0


@pytest.mark.slurm
def test_checkpoint_and_scontrol_requeue_through_slurm(
    slurm_executor: Any, slurm_cluster: Any
) -> None:
    # the first run waits for the signal: 10 s of counting (Counter(), 40, 0.25) made the test
    # slower and could end before the signal came
    job = slurm_executor(time_limit=600).submit(UntilRequeued(), 20, 0.1)
    script = Path(job.jobdir, "job.sbatch").read_text()
    assert "#SBATCH --requeue" in script and "#SBATCH --signal=B:USR1@60" in script
    status = Path(job.jobdir, "status.jsonl")
    wait_until(lambda: status.exists() and '"running"' in status.read_text(), 60, "running")
    # what Slurm sends at --signal=B:USR1@60 (its own timer ticks too slowly for a test)
    job.backend.signal(job.handle, job.jobdir, signal.SIGUSR1)
    got = job.result(180)
    # two runs of the one object: the second began where the checkpoint left it
    assert got["step"] >= 20 and len(got["runs"]) == 2 and got["runs"][0] != got["runs"][1]
    (attempt,) = job.attempts()
    assert attempt["reason"] == "checkpoint"
    assert attempt["slurm_job_id"] == job.handle["slurm_id"]  # the same job, requeued
    show = subprocess.run(
        ["scontrol", "show", "job", str(job.handle["slurm_id"])],
        capture_output=True,
        text=True,
        env=slurm_cluster.env,
    ).stdout
    assert "Restarts=1" in show or show == ""  # "" once it left scontrol's memory
