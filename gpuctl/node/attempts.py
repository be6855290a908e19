"""A job's attempts: what a checkpoint, a preemption or Slurm's requeue leaves in its folder.

An attempt that checkpointed (the worker's ``CHECKPOINTED_EXIT`` and a ``checkpoint.pkl``) or
was preempted becomes a line of ``attempts.jsonl``, its checkpoint the next attempt's payload;
under Slurm the job goes back to the queue (``requeue.json`` marks it, and no outcome is
written), and the next attempt's supervisor turns the marker and a previous outcome into lines
of ``attempts.jsonl`` (``begin``). The supervisor decides when (``Supervisor._next_attempt``);
these write the files. ``path`` is the supervisor's ``path`` (a job file's name -> its path in
the task's folder), ``outcome`` its ``outcome.json`` as it stands. Standard library only,
Python 3.6.
"""

import os
import time
from typing import TYPE_CHECKING, Any, Callable, Dict

from . import jobfiles
from .scontrol import scontrol

if TYPE_CHECKING:
    JobFile = Callable[[str], str]

# What ``after_checkpoint`` leaves to the supervisor: the job ends here (with an outcome), Slurm
# requeued it (no outcome: the next attempt writes one), or the next attempt starts here at once.
ENDS, REQUEUED, HERE = "ends", "requeued", "here"


def after_checkpoint(path: "JobFile", outcome: "jobfiles.Outcome", limits: Dict[str, Any],
                     under_slurm: bool) -> str:
    """An attempt that checkpointed: its line of ``attempts.jsonl``, its checkpoint the payload;
    under Slurm the job is requeued (``scontrol requeue``: Slurm starts the next attempt, maybe
    elsewhere: REQUEUED, or ENDS with ``requeue_error`` when Slurm refuses); outside Slurm the
    next attempt starts here (HERE, ``outcome`` cleared of how this attempt ended), up to
    ``max_requeues`` times (then ENDS with ``requeues_exhausted``)."""
    ckpt = path(jobfiles.CHECKPOINT)
    done = jobfiles.parse_lines(jobfiles.tail(path(jobfiles.ATTEMPTS), 1 << 20))
    attempt = len(done) + 1
    limit = int(limits.get("max_requeues", 3))
    # preemptions are Slurm's doing, not the job's: only checkpoints count
    if sum(1 for a in done if a.get("reason") == "checkpoint") + 1 > limit:
        outcome["requeues_exhausted"] = {"attempts": attempt, "max_requeues": limit}
        return ENDS
    record = {"attempt": attempt, "reason": "checkpoint", "ended_at": time.time(),
              "hostname": outcome["hostname"], "run_s": outcome.get("run_s"),
              "slurm_job_id": outcome["slurm_job_id"]}
    os.replace(ckpt, path(jobfiles.PAYLOAD))
    jobfiles.append_line(path(jobfiles.ATTEMPTS), record)
    with open(path(jobfiles.STDOUT), "ab") as out:
        out.write(("--- gpuctl: attempt %d checkpointed, the job goes on from its checkpoint"
                   " ---\n" % attempt).encode())
    if under_slurm:
        job = os.environ.get("SLURM_JOB_ID", "")
        if os.environ.get("SLURM_ARRAY_TASK_ID"):
            job = "%s_%s" % (os.environ.get("SLURM_ARRAY_JOB_ID"),
                             os.environ["SLURM_ARRAY_TASK_ID"])
        jobfiles.write_json(path(jobfiles.REQUEUE), record)
        rc, said = scontrol("requeue", job)
        if rc != 0:
            os.unlink(path(jobfiles.REQUEUE))
            outcome["requeue_error"] = "scontrol requeue %s: %s" % (job, said or rc)
            return ENDS
        return REQUEUED
    # how this attempt ended goes (the next one says it again); one key a line, as mypy
    # checks each against jobfiles.Outcome only when it is spelled out
    outcome.pop("exit_code", None)
    outcome.pop("signal", None)
    outcome.pop("signal_name", None)
    outcome.pop("core_dumped", None)
    outcome.pop("stop_reason", None)
    outcome.pop("stop_requested_after_s", None)
    outcome.pop("escalated_to_kill", None)
    outcome.pop("warned", None)
    outcome.pop("forwarded", None)
    outcome["attempt"] = attempt + 1
    return HERE


def preempted(path: "JobFile", outcome: "jobfiles.Outcome") -> None:
    """This attempt was preempted and Slurm requeues the job itself: a line of
    ``attempts.jsonl`` that says so (and whether the function checkpointed: then its
    checkpoint becomes the payload, else the next attempt starts over), the requeue marker
    for the next attempt, and no outcome."""
    ckpt = path(jobfiles.CHECKPOINT)
    checkpointed = (outcome.get("exit_code") == jobfiles.CHECKPOINTED_EXIT
                    and os.path.exists(ckpt))
    done = jobfiles.parse_lines(jobfiles.tail(path(jobfiles.ATTEMPTS), 1 << 20))
    attempt = len(done) + 1
    record = {"attempt": attempt, "reason": "preempted", "checkpointed": checkpointed,
              "ended_at": time.time(), "hostname": outcome["hostname"],
              "run_s": outcome.get("run_s"), "exit_code": outcome.get("exit_code"),
              "slurm_job_id": outcome["slurm_job_id"]}
    if checkpointed:
        os.replace(ckpt, path(jobfiles.PAYLOAD))
    jobfiles.append_line(path(jobfiles.ATTEMPTS), record)
    with open(path(jobfiles.STDOUT), "ab") as out:
        out.write(("--- gpuctl: attempt %d preempted, the job %s ---\n" % (
            attempt, "goes on from its checkpoint" if checkpointed else "starts over")
        ).encode())
    jobfiles.write_json(path(jobfiles.REQUEUE), record)


def begin(path: "JobFile", outcome: "jobfiles.Outcome") -> None:
    """A job Slurm started again (after this supervisor's ``scontrol requeue``, or its own
    requeue of a preempted job): the marker goes, a previous outcome becomes an attempt."""
    marker = jobfiles.read_json(path(jobfiles.REQUEUE))
    if isinstance(marker, dict):
        os.unlink(path(jobfiles.REQUEUE))
        outcome["attempt"] = int(marker.get("attempt", 0)) + 1
    previous = jobfiles.read_json(path(jobfiles.OUTCOME))
    if isinstance(previous, dict):
        done = jobfiles.parse_lines(jobfiles.tail(path(jobfiles.ATTEMPTS), 1 << 20))
        jobfiles.append_line(path(jobfiles.ATTEMPTS), {
            "attempt": len(done) + 1, "reason": "requeued by the scheduler",
            "ended_at": previous.get("ended_at"), "hostname": previous.get("hostname"),
            "exit_code": previous.get("exit_code"),
            "stop_reason": previous.get("stop_reason"),
            "slurm_job_id": previous.get("slurm_job_id")})
        for name in (jobfiles.OUTCOME, jobfiles.ERROR):
            try:
                os.unlink(path(name))
            except OSError:
                pass
        outcome["attempt"] = len(done) + 2
