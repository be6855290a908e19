"""Why a job failed, as a report: the one table of failure modes (``FAILURES``: each kind's
title, phase, evidence and remedy; ``KINDS`` and ``REMEDIES`` are views of it, and so is the
docs' table), and ``FailureReport`` (the phase reached, a kind, the evidence, a remedy, the
log paths; its text is ``JobFailed``'s message, its dict the store's row). What happened to a
job is read from its folder by ``classify``, which makes these.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuctl.jobs.records import ReportDict
from gpuctl.node import jobfiles


@dataclass(frozen=True)
class FailureMode:
    """One classification: its title, the phase(s) it shows in, the evidence it is read
    from, and the remedy its reports print."""

    title: str
    phase: str
    evidence: str
    remedy: str


# The one table of classifications. ``KINDS`` and ``REMEDIES`` are views of it, and so is the
# docs' failure-mode table (``python -m gpuctl.jobs.failure_table --write docs/job-failures.md``).
FAILURES: dict[str, FailureMode] = {
    "user_exception": FailureMode(
        title="the function raised an exception",
        phase="running",
        evidence=(
            f"{jobfiles.ERROR}: the exception the function raised, with its traceback (a map "
            "item's too)"
        ),
        remedy="fix the function; the remote traceback above shows where it raised",
    ),
    "out_of_memory": FailureMode(
        title="out of memory",
        phase="running",
        evidence=(
            "MemoryError under mem=; the supervisor's sum of resident memory over mem=; SIGKILL "
            'with a cgroup OOM kill; Slurm OUT_OF_MEMORY or slurmstepd\'s "exceeded memory limit"'
        ),
        remedy="ask for more memory (mem=...) or use less: the process hit the limit",
    ),
    "gpu_out_of_memory": FailureMode(
        title="the GPU ran out of memory",
        phase="running",
        evidence=f'{jobfiles.ERROR}: torch\'s OutOfMemoryError (or "CUDA out of memory")',
        remedy=(
            "use less GPU memory (a smaller batch, activation checkpointing, bf16), or a GPU with "
            "more; another process on the same GPU may hold memory (the screen's processes show "
            "who)"
        ),
    ),
    "crash": FailureMode(
        title="VENV2 crashed",
        phase="any",
        evidence=(
            "VENV2 died of SIGSEGV, SIGABRT, SIGBUS, SIGFPE or SIGILL; the faulthandler stack in "
            f"{jobfiles.STDERR} (the same frames repeating: a stack overflow)"
        ),
        remedy=(
            "the stack above shows the Python line that was running when it crashed; check the C "
            "extension it calls (ctypes, CUDA, a wheel built for another platform)"
        ),
    ),
    "python_mismatch": FailureMode(
        title="Python version mismatch between the submitter and VENV2",
        phase="provision, start",
        evidence=(
            f"VENV2's probe (before submitting) or the worker's check against {jobfiles.META}: "
            "another "
            "Python minor version"
        ),
        remedy=(
            "make VENV2 run the submitter's Python minor version (env=EnvSpec(python='X.Y', ...)) "
            "or run gpuctl under VENV2's Python"
        ),
    ),
    "cloudpickle_mismatch": FailureMode(
        title="cloudpickle version mismatch between the submitter and VENV2",
        phase="provision, start",
        evidence="VENV2's probe or the worker's check: another cloudpickle version",
        remedy=(
            "install the submitter's cloudpickle version into VENV2 (add 'cloudpickle==X' to the "
            "env's packages)"
        ),
    ),
    "version_mismatch": FailureMode(
        title="a package's version in VENV2 cannot load the payload",
        phase="provision, loading",
        evidence=(
            "the payload holds objects of a distribution (numpy, torch, pandas, ...) whose major "
            "version in VENV2 differs from the submitter's and lacks a module they name (VENV2's "
            "probe, before anything is sent); or unpickling misses a submodule of a distribution "
            "VENV2 has at another version"
        ),
        remedy=(
            "use the same major version on both sides, e.g. numpy 2.x in VENV2 (add "
            "'numpy==X' to the env's packages) or numpy 1.x here"
        ),
    ),
    "module_missing": FailureMode(
        title="a module is missing in VENV2",
        phase="provision, loading, running",
        evidence="ModuleNotFoundError / ImportError, the module named",
        remedy=(
            "add the module to the environment's packages (env=EnvSpec(packages=[...])) or install "
            "it into VENV2"
        ),
    ),
    "venv2_wont_start": FailureMode(
        title="VENV2's python will not start",
        phase="provision, start",
        evidence=(
            "the VENV2 probe fails, the supervisor cannot execute it, or it exits before the "
            "worker ran"
        ),
        remedy=(
            "check the VENV2 interpreter path on the node (python=...), or let gpuctl build one "
            "with env=..."
        ),
    ),
    "venv1_wont_start": FailureMode(
        title="VENV1, the supervisor's Python, will not start",
        phase="provision",
        evidence="the probe of supervisor_python: not a Python, or older than 3.6",
        remedy=(
            "point supervisor_python= (--supervisor-python, or the node's python in the config) at "
            "a Python 3.6 or newer on the node"
        ),
    ),
    "env_build_failed": FailureMode(
        title="the VENV2 environment could not be built",
        phase="provision",
        evidence="building env= (uv, conda, venv) failed; its log",
        remedy="read the build log; fix the package list or the node's conda/uv/python",
    ),
    "setup_failed": FailureMode(
        title="a setup line failed before VENV2 started",
        phase="setup",
        evidence=f"a setup line exited non-zero; the last lines of {jobfiles.SETUP_LOG}",
        remedy="fix the setup line shown (module name, path) in the cluster or job config",
    ),
    "time_limit": FailureMode(
        title="time limit reached",
        phase="any",
        evidence=(
            "time_limit= reached (TERM, grace, KILL), or Slurm TIMEOUT; every thread's stack "
            "just before the TERM, and the line of the user's code it was waiting in"
        ),
        remedy="raise time_limit=... or make the function faster",
    ),
    "cancelled": FailureMode(
        title="cancelled",
        phase="any",
        evidence="a cancel (file or signal), or Slurm CANCELLED",
        remedy="nothing to fix: the job was cancelled",
    ),
    "node_failure": FailureMode(
        title="the node failed",
        phase="any",
        evidence="Slurm NODE_FAIL or BOOT_FAIL",
        remedy="resubmit; report the node to the cluster admins if it repeats",
    ),
    "preempted": FailureMode(
        title="preempted by the scheduler",
        phase="any",
        evidence="Slurm PREEMPTED",
        remedy="resubmit, or use a partition/QOS without preemption",
    ),
    "never_started": FailureMode(
        title="the job never started",
        phase="not started",
        evidence=(
            "Slurm's pending reason, or starting the supervisor failed (a capped map's later job)"
        ),
        remedy="see the pending reason; ask for fewer resources or another partition",
    ),
    "disk_full": FailureMode(
        title="disk full",
        phase="saving, any",
        evidence=(
            "ENOSPC raised in the function or writing the result (the file that grew, its "
            f"size, the file system's free space), or no {jobfiles.OUTCOME} and the job "
            "folder's file system nearly full (df)"
        ),
        remedy="free space in the job folder's file system (or point the job root elsewhere)",
    ),
    "unpicklable_result": FailureMode(
        title="the result cannot be pickled",
        phase="saving",
        evidence="pickling the return value failed",
        remedy=(
            "return plain data (lists, dicts, arrays) instead of open files, locks, generators or "
            "sockets"
        ),
    ),
    "result_unloadable": FailureMode(
        title="the result cannot be unpickled here",
        phase="done",
        evidence=f"{jobfiles.RESULT} is there but does not unpickle in the submitter's Python",
        remedy="install what the result's classes need into this Python, or return plain data",
    ),
    "load_failed": FailureMode(
        title="the payload could not be loaded in VENV2",
        phase="loading",
        evidence="the payload does not unpickle in VENV2",
        remedy="the payload refers to something VENV2 cannot rebuild; see the traceback",
    ),
    "sys_exit": FailureMode(
        title="the function exited the process",
        phase="running",
        evidence=(
            "sys.exit / os._exit inside the function (caught, with the stack of the call), or an "
            "exit while it ran"
        ),
        remedy="return a value instead of calling sys.exit/os._exit inside the function",
    ),
    "killed": FailureMode(
        title="VENV2 was killed by a signal",
        phase="any",
        evidence="VENV2 died of another signal (not a crash, not an OOM kill)",
        remedy="something outside the job sent the signal (an admin, the OOM killer, a scheduler)",
    ),
    "lost": FailureMode(
        title="the job's supervisor disappeared",
        phase="any",
        evidence=f"no {jobfiles.OUTCOME} and the supervisor is gone; the last heartbeat's age",
        remedy="the node rebooted or the supervisor was killed; resubmit",
    ),
    "node_unreachable": FailureMode(
        title="the node cannot be reached",
        phase="any",
        evidence="the node stops answering: since when, the last heartbeat, the job folder there",
        remedy=(
            "the job may still be running on the node: once the node is back, `gpuctl result ID` "
            "(or Job.result()) picks up its real outcome from the job folder"
        ),
    ),
    "job_files_unreadable": FailureMode(
        title="the job's files cannot be read",
        phase="any",
        evidence="on this machine (local backend), reading the job folder failed for another "
        "reason than a missing file: the path and the system's words",
        remedy="something outside gpuctl changed the job folder (a file replaced by a folder, its "
        "permissions, a full or unmounted file system): mend it and ask again",
    ),
    "supervisor_failed": FailureMode(
        title="the supervisor failed",
        phase="any",
        evidence=f"{jobfiles.OUTCOME} carries the supervisor's own error and traceback",
        remedy="this is a gpuctl bug: please report it with the supervisor error",
    ),
    "exited_without_result": FailureMode(
        title="VENV2 exited without a result",
        phase="any",
        evidence=f"VENV2 exited without {jobfiles.RESULT}, outside the function",
        remedy="a C extension or a thread ended the process; see stderr",
    ),
    "supervisor_killed": FailureMode(
        title="the job's supervisor was killed",
        phase="any",
        evidence=(
            f"{jobfiles.OUTCOME} written by the supervisor's keeper: the supervisor died of a "
            "signal "
            "(kill -9, the OOM killer) and the keeper ended the job's processes"
        ),
        remedy=(
            "something outside the job killed its supervisor (an admin's kill, the OOM killer: see "
            "the node's `dmesg`); the job's processes were ended with it; resubmit"
        ),
    ),
    "resources_unavailable": FailureMode(
        title="the node lacks what the job asked for",
        phase="supervisor",
        evidence=(
            "outside Slurm, before VENV2 starts: gpus= more than NVML or nvidia-smi lists (within "
            "CUDA_VISIBLE_DEVICES), neither NVML nor nvidia-smi, or cpus= more than the job may "
            "use"
        ),
        remedy=(
            "ask for fewer (gpus=, cpus=) or choose a node that has them (`gpuctl status` lists "
            "each node's GPUs)"
        ),
    ),
    "requeue_failed": FailureMode(
        title="the job checkpointed but could not be requeued",
        phase="checkpointed",
        evidence=f"{jobfiles.OUTCOME}: `scontrol requeue` refused after a checkpoint (its words)",
        remedy=(
            "let the job be requeued (Slurm: JobRequeue, or ask the admins); the job folder keeps "
            "the checkpoint as its payload"
        ),
    ),
    "command_failed": FailureMode(
        title="the command exited with an error",
        phase="running",
        evidence="a command job's exit status other than 0 (or the signal that killed it)",
        remedy=(
            "read the command's own output (`gpuctl logs ID`; its last lines of stderr are above "
            "when it wrote any): the exit status is the command's, not gpuctl's"
        ),
    ),
    "command_not_found": FailureMode(
        title="the command cannot be started",
        phase="running",
        evidence="a command job's program is not on PATH, or not executable",
        remedy=(
            "give the path of the program, or install it into VENV2 (whose bin comes first on the "
            "command's PATH) or the node"
        ),
    ),
}

KINDS: dict[str, str] = {k: f.title for k, f in FAILURES.items()}
REMEDIES: dict[str, str] = {k: f.remedy for k, f in FAILURES.items()}


def version_remedy(dist: str, here: str, there: str, venv2: str) -> str:
    """The fix for ``dist`` at version ``here`` on the submitter's side, ``there`` in VENV2."""
    major = re.split(r"[.+!-]", here, maxsplit=1)[0]
    other = re.split(r"[.+!-]", there, maxsplit=1)[0]
    return (
        f"use {dist} {major}.x in VENV2 or {other}.x here: add '{dist}=={here}' to the env's "
        f"packages (env=EnvSpec(packages=[...])) or run `{venv2} -m pip install '{dist}=={here}'`"
        f", or install {dist} {other}.x into this Python"
    )


@dataclass(frozen=True)
class FailureReport:
    """Why a job failed: ``kind`` (a key of KINDS), phase, evidence lines, remedy, log paths;
    ``exit_status`` the failed command's (``command_failed``; negative: the signal's number)."""

    kind: str
    phase: str
    evidence: tuple[str, ...]
    remedy: str
    logs: Mapping[str, str] = field(default_factory=dict)
    job_id: str = ""
    traceback: str = ""
    exit_status: int | None = None

    @property
    def title(self) -> str:
        return KINDS.get(self.kind, self.kind)

    def text(self) -> str:
        """The report as plain text, the message of ``JobFailed``."""
        if self.phase == "provision":
            lines = [f"cannot submit: {self.title} [{self.kind}]"]
        elif self.kind == "node_unreachable":
            lines = [f"job {self.job_id}: outcome unknown, {self.title} [{self.kind}]"]
        else:
            lines = [f"job {self.job_id} failed: {self.title} [{self.kind}] in phase {self.phase}"]
        lines += [f"  {e}" for e in self.evidence]
        if self.traceback:
            lines.append("  traceback:")
            lines += ["    " + t for t in self.traceback.rstrip().splitlines()[-30:]]
        lines.append(f"  remedy: {self.remedy}")
        if self.logs:
            lines.append("  logs:")
            lines += [f"    {name}: {path}" for name, path in self.logs.items()]
        return "\n".join(lines)

    def to_dict(self) -> ReportDict:
        return {
            "kind": self.kind,
            "title": self.title,
            "phase": self.phase,
            "evidence": list(self.evidence),
            "remedy": self.remedy,
            "logs": dict(self.logs),
            "job_id": self.job_id,
            "traceback": self.traceback,
            "exit_status": self.exit_status,
        }

    @classmethod
    def from_dict(cls, d: ReportDict) -> FailureReport:
        return cls(
            kind=str(d["kind"]),
            phase=str(d.get("phase", "")),
            evidence=tuple(d.get("evidence", ())),
            remedy=str(d.get("remedy", "")),
            logs=dict(d.get("logs", {})),
            job_id=str(d.get("job_id", "")),
            traceback=str(d.get("traceback", "")),
            exit_status=d.get("exit_status"),
        )


def _fmt_bytes(n: float | None) -> str:
    if n is None:
        return "unknown"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
