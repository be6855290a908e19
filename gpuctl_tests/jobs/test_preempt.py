"""Preemption through a real Slurm (``PreemptType=preempt/partition_prio``,
``PreemptMode=REQUEUE`` on the low partition): a job of the high partition
that needs the node ends the low partition's job, which Slurm requeues. A checkpointable function
checkpoints on the preemption's SIGTERM and goes on from it; a plain one starts over; both say
"preempted" in their attempts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuctl.jobs import Executor, JobStore
from gpuctl_tests.helpers import wait_until
from gpuctl_tests.jobs.test_checkpoint import UntilRequeued

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def preempting_slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A one-node Slurm of its own with partitions ``low`` (preempted, requeued) and ``high``.

    No grace time (``GraceTime=0``): Slurm signals a batch job only when its grace is over (the
    grace's SIGTERM goes to job steps, and gpuctl's job is its batch script), so a grace would
    not change what the supervisor sees (a SIGTERM once the job is requeued, with PreemptTime
    set and Restarts up) but delays it: Slurm 22.05 requeues a job in its grace only
    KillWait + MessageTimeout (12 s here) after the preemption began (node_scheduler.c)."""
    from gpuctl_tests.harness.slurm import running_cluster

    folder = tmp_path_factory.mktemp("slurm-preempt")
    with running_cluster(folder, preemption=True, preempt_grace=0) as cluster:
        yield cluster


@pytest.fixture(autouse=True)
def _nothing_left(preempting_slurm: Any) -> Iterator[None]:
    yield
    preempting_slurm.cancel_all()
    preempting_slurm.wait_idle(60)


def _executor(cluster: Any, venv1: str, venv2: str, folder: Path) -> Executor:
    # every CPU of the node: the high partition's job can only start by preempting this one
    return Executor(
        "slurm",
        partition=cluster.low_partition,
        slurm_conf=str(cluster.conf_path),
        job_root=str(folder),
        store=JobStore(),
        supervisor_python=venv1,
        python=venv2,
        cpus=cluster.cpus,
        time_limit=600,
    )


def _preempt(cluster: Any, job: Any) -> None:
    """Once ``job`` runs its function, a job of the high partition that needs the whole node."""
    status = Path(job.jobdir, "status.jsonl")
    wait_until(lambda: status.exists() and '"running"' in status.read_text(), 90, "running")
    cluster.run(
        ["sbatch", "-p", cluster.high_partition, f"--cpus-per-task={cluster.cpus}", "--wrap",
         "sleep 2"],
        cwd=job.jobdir,
    )  # fmt: skip


def starts_twice(pause: float) -> int:
    """Its first run waits to be preempted; a second run in the same job folder returns how
    many runs there were."""
    import os
    import time

    marks = os.path.join(os.environ["GPUCTL_JOB_DIR"], "starts.txt")
    with open(marks, "a") as f:
        f.write("start\n")
    while True:
        with open(marks) as f:
            count = len(f.read().splitlines())
        if count >= 2:
            return count
        time.sleep(pause)


def test_a_preempted_checkpointable_function_goes_on_from_its_checkpoint(
    preempting_slurm: Any, venv1: str, venv2: str, tmp_path: Path
) -> None:
    job = _executor(preempting_slurm, venv1, venv2, tmp_path / "jobs").submit(
        UntilRequeued(), 20, 0.1
    )
    _preempt(preempting_slurm, job)
    got = job.result(240)
    # two runs of the same object: the second one began where the checkpoint left it
    assert len(got["runs"]) == 2 and got["runs"][0] != got["runs"][1], got
    assert got["step"] >= 20
    (attempt,) = job.attempts()
    assert attempt["reason"] == "preempted", attempt
    assert attempt.get("checkpointed") is True
    assert attempt["slurm_job_id"] == job.handle["slurm_id"]
    assert "attempt 1 preempted, the job goes on from its checkpoint" in job.stdout()


def test_a_preempted_plain_function_starts_over(
    preempting_slurm: Any, venv1: str, venv2: str, tmp_path: Path
) -> None:
    job = _executor(preempting_slurm, venv1, venv2, tmp_path / "jobs").submit(starts_twice, 0.1)
    _preempt(preempting_slurm, job)
    assert job.result(240) == 2  # started twice, and the second run finished
    (attempt,) = job.attempts()
    assert attempt["reason"] == "preempted", attempt
    assert attempt.get("checkpointed") is False
