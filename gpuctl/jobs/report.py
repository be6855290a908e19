"""Failure classification: what really happened to a job, from the files its folder holds.

The inputs are the supervisor's ``outcome.json``, the worker's ``status.jsonl`` and first
``error.json``, the tails of ``stderr.txt`` and ``setup.log``, and what the scheduler says (Slurm
state, pending reason). The output is a ``FailureReport``: the phase reached, a classification, the
evidence, a remedy and the paths to the logs. There is no "result not found" class: when nothing
explains a failure the report says which file is missing and what the exit status was.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpuctl.core import wire
from gpuctl.jobs.records import (
    Heartbeat,
    JobMeta,
    Outcome,
    ReportDict,
    ResultInfo,
    SchedulerState,
    StatusLine,
    WorkerError,
)
from gpuctl.node import jobfiles

# Classifications, each with a one-line title.
KINDS: dict[str, str] = {
    "user_exception": "the function raised an exception",
    "out_of_memory": "out of memory",
    "gpu_out_of_memory": "the GPU ran out of memory",
    "crash": "VENV2 crashed",
    "python_mismatch": "Python version mismatch between the submitter and VENV2",
    "cloudpickle_mismatch": "cloudpickle version mismatch between the submitter and VENV2",
    "module_missing": "a module is missing in VENV2",
    "venv2_wont_start": "VENV2's python will not start",
    "venv1_wont_start": "VENV1, the supervisor's Python, will not start",
    "env_build_failed": "the VENV2 environment could not be built",
    "setup_failed": "a setup line failed before VENV2 started",
    "time_limit": "time limit reached",
    "cancelled": "cancelled",
    "node_failure": "the node failed",
    "preempted": "preempted by the scheduler",
    "never_started": "the job never started",
    "disk_full": "disk full",
    "unpicklable_result": "the result cannot be pickled",
    "result_unloadable": "the result cannot be unpickled here",
    "load_failed": "the payload could not be loaded in VENV2",
    "sys_exit": "the function exited the process",
    "killed": "VENV2 was killed by a signal",
    "lost": "the job's supervisor disappeared",
    "node_unreachable": "the node cannot be reached",
    "supervisor_failed": "the supervisor failed",
    "exited_without_result": "VENV2 exited without a result",
}

REMEDIES: dict[str, str] = {
    "user_exception": "fix the function; the remote traceback above shows where it raised",
    "out_of_memory": "ask for more memory (mem=...) or use less: the process hit the limit",
    "gpu_out_of_memory": "use less GPU memory (a smaller batch, activation checkpointing, "
    "bf16), or a GPU with more; another process on the same GPU may hold memory (the screen's "
    "processes show who)",
    "crash": "the stack above shows the Python line that was running when it crashed; check the "
    "C extension it calls (ctypes, CUDA, a wheel built for another platform)",
    "python_mismatch": "make VENV2 run the submitter's Python minor version "
    "(env=EnvSpec(python='X.Y', ...)) or run gpuctl under VENV2's Python",
    "cloudpickle_mismatch": "install the submitter's cloudpickle version into VENV2 "
    "(add 'cloudpickle==X' to the env's packages)",
    "module_missing": "add the module to the environment's packages (env=EnvSpec(packages=[...]))"
    " or install it into VENV2",
    "venv2_wont_start": "check the VENV2 interpreter path on the node (python=...), or let gpuctl "
    "build one with env=...",
    "venv1_wont_start": "point supervisor_python= (--supervisor-python, or the node's python in "
    "the config) at a Python 3.6 or newer on the node",
    "env_build_failed": "read the build log; fix the package list or the node's conda/uv/python",
    "setup_failed": "fix the setup line shown (module name, path) in the cluster or job config",
    "time_limit": "raise time_limit=... or make the function faster",
    "cancelled": "nothing to fix: the job was cancelled",
    "node_failure": "resubmit; report the node to the cluster admins if it repeats",
    "preempted": "resubmit, or use a partition/QOS without preemption",
    "never_started": "see the pending reason; ask for fewer resources or another partition",
    "disk_full": "free space in the job folder's file system (or point the job root elsewhere)",
    "unpicklable_result": "return plain data (lists, dicts, arrays) instead of open files, locks, "
    "generators or sockets",
    "load_failed": "the payload refers to something VENV2 cannot rebuild; see the traceback",
    "result_unloadable": "install what the result's classes need into this Python, or return "
    "plain data",
    "sys_exit": "return a value instead of calling sys.exit/os._exit inside the function",
    "killed": "something outside the job sent the signal (an admin, the OOM killer, a scheduler)",
    "lost": "the node rebooted or the supervisor was killed; resubmit",
    "node_unreachable": "the job may still be running on the node: once the node is back, "
    "`gpuctl result ID` (or Job.result()) picks up its real outcome from the job folder",
    "supervisor_failed": "this is a gpuctl bug: please report it with the supervisor error",
    "exited_without_result": "a C extension or a thread ended the process; see stderr",
}

DISK_FULL_KB = 1024  # below this much free space a missing outcome is put down to the disk

CRASH_SIGNALS = {"SIGSEGV", "SIGABRT", "SIGBUS", "SIGFPE", "SIGILL"}


@dataclass(frozen=True)
class FailureReport:
    """Why a job failed: ``kind`` (a key of KINDS), phase, evidence lines, remedy, log paths."""

    kind: str
    phase: str
    evidence: tuple[str, ...]
    remedy: str
    logs: Mapping[str, str] = field(default_factory=dict)
    job_id: str = ""
    traceback: str = ""

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
        )


@dataclass
class JobFiles:
    """What a job folder held when it was read (None = file absent or not a JSON object; each
    file's fields checked against its ``gpuctl.jobs.records`` type)."""

    outcome: Outcome | None = None
    status: list[StatusLine] = field(default_factory=list)
    error: WorkerError | None = None
    result_info: ResultInfo | None = None
    stderr_tail: str = ""
    setup_tail: str = ""
    meta: JobMeta | None = None

    @property
    def last_phase(self) -> str:
        return str(self.status[-1]["phase"]) if self.status else "not started"


def parse_status(text: str) -> list[StatusLine]:
    """The worker's status lines; a torn last line (crash mid-write) is skipped, and so is a
    line that names no phase."""
    return wire.parse_list(StatusLine, jobfiles.parse_lines(text))


def _is_gpu_oom(err: WorkerError) -> bool:
    """torch's ``OutOfMemoryError`` (torch.cuda, torch.OutOfMemoryError), or the RuntimeError
    older torch raised with "CUDA out of memory"."""
    module = str(err.get("type_module") or "")
    if err.get("type") == "OutOfMemoryError" and module.split(".")[0] == "torch":
        return True
    return err.get("type") == "RuntimeError" and "CUDA out of memory" in str(err.get("message"))


def _faulthandler_stack(stderr: str) -> str:
    """The faulthandler block of stderr ("Fatal Python error: ..." and the stack after it)."""
    idx = stderr.rfind("Fatal Python error")
    if idx < 0:
        return ""
    return stderr[idx:].strip()


def _fmt_bytes(n: float | None) -> str:
    if n is None:
        return "unknown"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _oom_delta(outcome: Outcome) -> int:
    before = (outcome.get("cgroup_before") or {}).get("oom_kill")
    after = (outcome.get("cgroup_after") or {}).get("oom_kill")
    if isinstance(before, int) and isinstance(after, int):
        return after - before
    return 0


def classify(
    files: JobFiles,
    *,
    job_id: str = "",
    logs: Mapping[str, str] | None = None,
    scheduler: SchedulerState | None = None,
    submitter_python: str = "",
) -> FailureReport | None:
    """Classify a finished job; None when it succeeded (a result was saved and VENV2 exited 0).

    ``scheduler`` may hold ``state`` (Slurm state such as OUT_OF_MEMORY, TIMEOUT, CANCELLED,
    NODE_FAIL, PREEMPTED, PENDING) and ``reason`` (the pending reason).
    """
    o = files.outcome or {}
    err = files.error
    sched = scheduler.copy() if scheduler is not None else SchedulerState()
    sstate = str(sched.get("state") or "").upper().split()[0] if sched.get("state") else ""
    phase = files.last_phase
    ev: list[str] = []
    tb = ""
    py_line = ""
    if files.meta:
        py_line = f"submitter Python {files.meta.get('python_version')}"
    for s in files.status:
        if s.get("phase") == "start" and s.get("python"):
            py_line += f", VENV2 Python {s['python']} ({s.get('executable')})"
    if files.outcome is not None and o.get("exit_code") == 0 and files.result_info is not None:
        return None

    def report(kind: str, *extra: str, remedy: str | None = None) -> FailureReport:
        lines = [*extra, *ev]
        code = o.get("exit_code")
        sig = o.get("signal_name")
        if files.outcome is not None and (code is not None or sig):
            status = f"signal {sig}" if sig else f"exit code {code}"
            lines.append(
                f"VENV2 ended with {status} after {o.get('run_s', '?')} s, "
                f"peak RSS {_fmt_bytes((o.get('peak_rss_kb') or 0) * 1024)}"
            )
        if sstate:
            lines.append(f"scheduler state: {sched.get('state')}")
        if py_line:
            lines.append(py_line.lstrip(", "))
        stderr = files.stderr_tail.strip()
        if stderr and kind not in ("crash",):
            last = stderr.splitlines()[-8:]
            lines.append("last lines of stderr:")
            lines += ["| " + line for line in last]
        return FailureReport(
            kind=kind,
            phase=phase,
            evidence=tuple(lines),
            remedy=remedy or REMEDIES[kind],
            logs=dict(logs or {}),
            job_id=job_id,
            traceback=tb,
        )

    slurm_mem = _slurm_memory_kill(str(sched.get("output_tail") or ""))
    said = _slurm_said(str(sched.get("output_tail") or ""))
    if said and sstate in ("", "CANCELLED", "FAILED"):
        # no accounting and the job has left scontrol's memory: slurmstepd's own words decide
        sstate = said
        sched["state"] = f"{said} (from slurmstepd's message in the Slurm output)"

    # Scheduler verdicts that no file can give.
    if files.outcome is None:
        if slurm_mem:
            return report("out_of_memory", *slurm_mem)
        if sstate == "PENDING" or (sstate == "" and sched.get("reason") and not files.status):
            reason = sched.get("reason") or "unknown"
            return report("never_started", f"pending reason: {reason}")
        if sstate in ("NODE_FAIL", "BOOT_FAIL"):
            return report("node_failure", f"Slurm says {sstate}")
        if sstate == "PREEMPTED":
            return report("preempted", "Slurm preempted the job")
        if sstate == "OUT_OF_MEMORY":
            return report("out_of_memory", "Slurm says OUT_OF_MEMORY")
        if sstate == "TIMEOUT":
            return report("time_limit", "Slurm ended the job at its time limit (TIMEOUT)")
        if sstate.startswith("CANCELLED"):
            if not files.status:
                return report("cancelled", "cancelled before VENV2 started")
            return report("cancelled", f"Slurm says {sched.get('state')}")
        if sched.get("cancelled"):
            return report("cancelled", "cancelled before the supervisor wrote its outcome")
        free = sched.get("disk_free_kb")
        if free is not None and free < DISK_FULL_KB:
            return report(
                "disk_full",
                f"{jobfiles.OUTCOME} was never written, and the job folder's file system has "
                f"{free} KiB free: the supervisor could not write its files",
            )
        return report(
            "lost",
            f"{jobfiles.OUTCOME} was never written: the supervisor did not finish "
            + (
                f"(last heartbeat {sched['heartbeat_age']:.0f} s ago)"
                if "heartbeat_age" in sched
                else "(no heartbeat)"
            ),
        )

    if o.get("supervisor_error"):
        tb = str(o.get("supervisor_traceback") or "")
        return report("supervisor_failed", f"supervisor error: {o['supervisor_error']}")
    if o.get("setup_failed"):
        setup = o.get("setup") or {}
        last = files.setup_tail.strip().splitlines()[-6:]
        return report(
            "setup_failed",
            f"setup lines exited with {setup.get('rc')}: {setup.get('lines')}",
            *("| " + line for line in last),
        )
    if o.get("start_error"):
        se = o["start_error"]
        return report(
            "venv2_wont_start",
            f"cannot execute {se.get('python')}: [{se.get('errno_name')}] {se.get('message')}",
        )
    stop = o.get("stop_reason")
    sig = o.get("signal_name")
    code = o.get("exit_code")
    limits = (files.meta or {}).get("limits") or {}
    if sstate == "TIMEOUT" and stop != "time_limit":
        return report(
            "time_limit",
            f"Slurm ended the job at its time limit (TIMEOUT) in phase {phase}; the supervisor "
            f"got {o.get('stop_signal') or 'SIGTERM'} and stopped VENV2",
        )
    if stop == "time_limit" or sstate == "TIMEOUT":
        return report(
            "time_limit",
            f"time limit {limits.get('time_limit_s')} s reached in phase {phase}; "
            f"sent SIGTERM{', then SIGKILL' if o.get('escalated_to_kill') else ''}",
        )
    if stop == "cancelled" or sstate.startswith("CANCELLED"):
        return report("cancelled", f"stopped by request ({o.get('stop_signal') or 'cancel file'})")
    if sstate in ("NODE_FAIL", "BOOT_FAIL"):
        return report("node_failure", f"Slurm says {sstate}")
    if sstate == "PREEMPTED":
        return report("preempted", "Slurm preempted the job")

    oom = _oom_delta(o)
    mem_limit = limits.get("mem_bytes")
    peak = (o.get("peak_rss_kb") or 0) * 1024
    cg_limit = (o.get("cgroup_after") or {}).get("limit_bytes")
    over = o.get("mem_limit_exceeded") or {}
    if (
        (err is not None and err.get("kind") == "memory_error")
        or sstate == "OUT_OF_MEMORY"
        or slurm_mem
        or over
        or (sig == "SIGKILL" and (oom > 0 or (cg_limit and peak >= 0.9 * cg_limit)))
    ):
        lines = []
        if over:
            lines.append(
                f"the job's processes held {_fmt_bytes((over.get('rss_kb') or 0) * 1024)} "
                f"resident after {over.get('after_s', '?')} s, over its limit of "
                f"{_fmt_bytes(over.get('limit_bytes'))} (mem=): gpuctl's supervisor killed them"
            )
        if err is not None and err.get("kind") == "memory_error":
            lines.append(
                f"MemoryError raised in phase {err.get('phase')}"
                + (f" under a memory limit of {_fmt_bytes(mem_limit)}" if mem_limit else "")
            )
            tb = str(err.get("traceback") or "")
        if sstate == "OUT_OF_MEMORY":
            lines.append("Slurm says OUT_OF_MEMORY")
        lines += slurm_mem
        if oom > 0:
            lines.append(f"cgroup OOM kills during the job: {oom} (limit {_fmt_bytes(cg_limit)})")
        if sig == "SIGKILL" and not over:
            lines.append(f"VENV2 was SIGKILLed at peak RSS {_fmt_bytes(peak)}")
        return report("out_of_memory", *lines)

    if err is not None:
        kind = str(err.get("kind"))
        tb = str(err.get("traceback") or "")
        msg = f"{err.get('type') or ''}: {err.get('message')}".lstrip(": ")
        if kind == "python_mismatch":
            return report(
                "python_mismatch",
                str(err.get("message")),
                f"VENV2 interpreter: {err.get('venv2_executable')}",
            )
        if kind == "cloudpickle_mismatch":
            return report("cloudpickle_mismatch", str(err.get("message")))
        if kind == "module_missing" or (
            kind == "user_exception" and err.get("type") in ("ModuleNotFoundError", "ImportError")
        ):
            name = err.get("module") or _module_from_message(str(err.get("message")))
            exe = err.get("venv2_executable")
            return report(
                "module_missing",
                f"module {name!r} cannot be imported in VENV2{f' ({exe})' if exe else ''}"
                f" during {err.get('phase')}: {msg}",
                remedy=f"add {name!r} to the environment's packages, or install it into VENV2",
            )
        if kind == "user_exception" and _is_gpu_oom(err):
            return report("gpu_out_of_memory", f"{msg}")
        if kind == "user_exception" and err.get("type") == "KeyboardInterrupt":
            return report(
                "user_exception",
                f"{msg}",
                "raised on the node (by the function's code, or a SIGINT sent to VENV2 there): "
                "not a Ctrl-C of yours",
            )
        if kind == "user_exception":
            return report("user_exception", f"{msg}")
        if kind == "unpicklable_result":
            return report(
                "unpicklable_result",
                f"the function returned a {err.get('result_type')} that cannot be pickled: {msg}",
            )
        if kind == "disk_full":
            return report("disk_full", f"writing the result failed: {msg}")
        if kind in ("sys_exit", "os_exit"):
            stack = str(err.get("stack") or "")
            if stack:
                tb = stack
            return report("sys_exit", str(err.get("message")))
        if kind == "load_failed":
            return report("load_failed", msg)
        if kind == "save_failed":
            return report("disk_full" if "No space" in msg else "load_failed", msg)
        return report("exited_without_result", f"worker error {kind}: {msg}")

    if sig in CRASH_SIGNALS:
        stack = _faulthandler_stack(files.stderr_tail)
        tb = stack
        return report(
            "crash",
            f"VENV2 died of {sig} in phase {phase}"
            + ("" if stack else f" (no faulthandler output in {jobfiles.STDERR})"),
        )
    if sig:
        if sig == "SIGKILL" and mem_limit and peak >= 0.9 * mem_limit:
            return report("out_of_memory", f"SIGKILL at peak RSS {_fmt_bytes(peak)}")
        return report("killed", f"VENV2 died of {sig} in phase {phase}")
    if code is not None and code != 0 and phase == "start" and not files.status[1:]:
        return report(
            "venv2_wont_start",
            f"VENV2's python exited with {code} before the worker ran",
        )
    if not files.status:
        return report(
            "venv2_wont_start", f"VENV2's python exited with {code} before the worker started"
        )
    if phase == "running":
        return report(
            "sys_exit", f"the process ended with exit code {code} while the function was running"
        )
    return report(
        "exited_without_result",
        f"exit code {code} in phase {phase}; {jobfiles.RESULT} was "
        + ("written" if files.result_info else "not written"),
    )


# How a task ends when another task of its job failed first: srun (--kill-on-bad-exit) sends
# TERM (the supervisor stops VENV2: "cancelled"), then KILL (no outcome: "lost"; "killed").
_ENDED_BY_OTHERS = ("cancelled", "lost", "killed")


def combine_ranks(
    reports: Sequence[FailureReport | None],
    files: Sequence[JobFiles | None],
    *,
    job_id: str = "",
    cancel_requested: bool = False,
) -> tuple[FailureReport | None, int | None]:
    """The report of a job of several tasks from its tasks' reports (rank order), and the rank
    whose failure it is about: (None, None) when every task succeeded.

    The failed ranks are the ones whose report is not what srun's ending of the others leaves
    (the first to fail leads: its error's time, else its end); when that is all there is,
    every unfinished rank counts. The
    report is the leading rank's, with lines naming each failed rank and each rank ended with
    it first."""
    failed = [r for r, rep in enumerate(reports) if rep is not None]
    if not failed:
        return None, None
    by_rank: dict[int, FailureReport] = {r: rep for r, rep in enumerate(reports) if rep}
    causes = [r for r in failed if by_rank[r].kind not in _ENDED_BY_OTHERS] or failed
    if cancel_requested:
        causes = [r for r in failed if by_rank[r].kind == "cancelled"] or causes

    def outcome(r: int) -> Outcome:
        return (files[r] or JobFiles()).outcome or {}

    def failed_at(r: int) -> float:
        err = (files[r] or JobFiles()).error or {}
        return float(err.get("t") or outcome(r).get("ended_at") or float("inf"))

    lead = min(causes, key=lambda r: (failed_at(r), r))
    n = len(reports)
    host = outcome(lead).get("hostname")
    first = by_rank[lead]
    lines = []
    order = sorted(causes, key=lambda r: (failed_at(r), r))  # the lead's line first
    for kind in dict.fromkeys(by_rank[r].kind for r in order):
        ranks = [r for r in causes if by_rank[r].kind == kind]
        where = f" (on {host})" if lead in ranks and host else ""
        lines.append(f"{_ranks(ranks)} of {n}{where} failed: {KINDS.get(kind, kind)} [{kind}]")
    others = [r for r in failed if r not in causes]
    if others:
        lines.append(
            f"{_ranks(others)} of {n} did not finish: Slurm ended "
            f"{'them' if len(others) > 1 else 'it'} when "
            f"{_ranks(causes)} failed (srun --kill-on-bad-exit)"
        )
    if len(failed) < n:
        done = [r for r in range(n) if r not in by_rank]
        lines.append(f"{_ranks(done)} of {n} finished")
    lines.append(f"rank {lead}'s report:")
    lines += [f"  {e}" for e in first.evidence]
    return (
        FailureReport(
            kind=first.kind,
            phase=first.phase,
            evidence=tuple(lines),
            remedy=first.remedy,
            logs={f"rank {lead} {name}": path for name, path in first.logs.items()},
            job_id=job_id,
            traceback=first.traceback,
        ),
        lead,
    )


def _ranks(ranks: Sequence[int], limit: int = 8) -> str:
    """ "rank 1", "ranks 0, 2, 3" (the first ``limit``, then how many more)."""
    shown = ", ".join(str(r) for r in ranks[:limit])
    more = f" and {len(ranks) - limit} more" if len(ranks) > limit else ""
    return f"rank{'s' if len(ranks) > 1 else ''} {shown}{more}"


def unreachable_report(
    *,
    job_id: str,
    node: str,
    jobdir: str,
    error: str,
    since: float,
    now: float,
    beat: Heartbeat | None,
    beat_seen_at: float | None,
    logs: Mapping[str, str] | None = None,
) -> FailureReport:
    """The report for a job whose node stopped answering: not a verdict (the job may still run),
    but what is known: since when, the last heartbeat seen, where the job folder is."""
    ev = [
        f"cannot reach {node} since {_clock(since)} ({now - since:.0f} s): {error}",
    ]
    written = beat.get("t") if beat else None
    if beat and written is not None:
        t = float(written)
        extra = []
        elapsed, rss = beat.get("elapsed_s"), beat.get("rss_kb")
        if elapsed is not None:
            extra.append(f"VENV2 running for {float(elapsed):.0f} s")
        if rss:
            extra.append(f"RSS {_fmt_bytes(int(rss) * 1024)}")
        ev.append(
            f"last heartbeat seen: written {_clock(t)}, {now - t:.0f} s ago"
            + (f" ({', '.join(extra)})" if extra else "")
        )
    elif beat_seen_at is not None:
        ev.append("no heartbeat seen: the supervisor had not started VENV2 when last looked at")
    else:
        ev.append("no heartbeat seen by this gpuctl process before the node went away")
    ev.append(f"job folder on {node}: {jobdir}")
    ev.append(
        f"the job may still be running on {node}: its supervisor keeps writing {jobfiles.OUTCOME} "
        "there whether or not gpuctl is connected"
    )
    return FailureReport(
        kind="node_unreachable",
        phase="running" if beat else "unknown",
        evidence=tuple(ev),
        remedy=f"check {node} (network, sshd, power); once it is back, `gpuctl result {job_id}` "
        "(or Job.result() again) picks up the real outcome; `gpuctl logs "
        f"{job_id}` shows its output",
        logs=dict(logs or {}),
        job_id=job_id,
    )


def _clock(t: float) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


_SLURM_MEM_KILL = re.compile(
    r"(StepId=\S+|[Ss]tep \S+) exceeded memory limit \((\d+) > (\d+)\), being killed"
)


_SLURM_DUE_TO = {
    "DUE TO TIME LIMIT": "TIMEOUT",
    "DUE TO PREEMPTION": "PREEMPTED",
    "DUE TO NODE FAILURE": "NODE_FAIL",
}


def _slurm_said(output: str) -> str:
    """The Slurm state slurmstepd's "*** JOB N ON host CANCELLED AT t DUE TO ... ***" line in
    the job's output names (TIMEOUT, PREEMPTED, NODE_FAIL), else ""."""
    for line in reversed(output.splitlines()):
        if "*** JOB" in line or "*** STEP" in line:
            for words, state in _SLURM_DUE_TO.items():
                if words in line:
                    return state
    return ""


def _slurm_memory_kill(output: str) -> list[str]:
    """Evidence lines when slurmstepd killed the job for memory (``JobAcctGatherParams=
    OverMemoryKill`` writes "StepId=N.batch exceeded memory limit (USED > LIMIT), being killed"
    to the job's Slurm output file), else []."""
    m = _SLURM_MEM_KILL.search(output)
    if m is None:
        if "Exceeded job memory limit" in output or "Exceeded step memory limit" in output:
            return ["Slurm's output file says: Exceeded job memory limit"]
        return []
    step, used, limit = m.group(1), int(m.group(2)), int(m.group(3))
    return [
        f"Slurm killed {step} for memory: it used {_fmt_bytes(used)}, over its --mem limit of "
        f"{_fmt_bytes(limit)} (slurmstepd: {m.group(0)})"
    ]


def _module_from_message(message: str) -> str:
    m = re.search(r"No module named '([^']+)'", message)
    return m.group(1) if m else "?"
