"""Failure classification: what really happened to a job, from the files its folder holds.

The inputs are the supervisor's ``outcome.json``, the worker's ``status.jsonl`` and first
``error.json``, the tails of ``stderr.txt`` and ``setup.log``, and what the scheduler says (Slurm
state, pending reason). The output is a ``report.FailureReport``: the phase reached, a
classification (a kind of ``report.FAILURES``), the evidence, a remedy and the paths to the
logs. There is no "result not found" class: when nothing explains a failure the report says
which file is missing and what the exit status was. A job of several tasks is one report of
its ranks (``combine_ranks``); a node that stopped answering, ``unreachable_report``. The
lines each kind of evidence gives come from ``gpuctl.jobs.evidence``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpuctl.core import wire
from gpuctl.jobs.evidence import (
    CPU_TORCH,
    CRASH_SIGNALS,
    DISK_FULL_KB,
    HANG_REMEDY,
    _disk_lines,
    _faulthandler_stack,
    _is_gpu_oom,
    _module_from_message,
    _oom_delta,
    _relative_missing,
    _slurm_memory_kill,
    _slurm_said,
    _unshipped,
    left_note,
    name_cells,
    stack_overflow,
    threads_note,
    waiting_in,
)
from gpuctl.jobs.records import (
    Attempt,
    Heartbeat,
    JobMeta,
    Outcome,
    ResultInfo,
    SchedulerState,
    StatusLine,
    WorkerError,
)
from gpuctl.jobs.report import KINDS, REMEDIES, FailureReport, _fmt_bytes, version_remedy
from gpuctl.node import jobfiles

COMMAND_KINDS = ("command_failed", "command_not_found")


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
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def last_phase(self) -> str:
        return str(self.status[-1]["phase"]) if self.status else "not started"


def parse_status(text: str) -> list[StatusLine]:
    """The worker's status lines; a torn last line (crash mid-write) is skipped, and so is a
    line that names no phase."""
    return wire.parse_list(StatusLine, jobfiles.parse_lines(text))


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
    if files.meta and files.meta.get("python_version"):
        py_line = f"submitter Python {files.meta.get('python_version')}"
    command = (files.meta or {}).get("command")
    for s in files.status:
        if s.get("phase") == "start" and s.get("python"):
            py_line += f", VENV2 Python {s['python']} ({s.get('executable')})"
    # A command that exits 0 on the TERM of a cancel or a time limit (a clean shutdown) was
    # still stopped: its 0 is not the end of its work.
    stopped = command is not None and o.get("stop_reason") is not None
    if (
        files.outcome is not None
        and o.get("exit_code") == 0
        and files.result_info is not None
        and not stopped
    ):
        return None

    def report(
        kind: str, *extra: str, remedy: str | None = None, exit_status: int | None = None
    ) -> FailureReport:
        lines = [*extra, *ev]
        code = o.get("exit_code")
        sig = o.get("signal_name")
        if files.outcome is not None and kind in COMMAND_KINDS and code is not None:
            # VENV2's own exit code is the worker's, not the command's (said above)
            lines.append(
                f"it ran {o.get('run_s', '?')} s, "
                f"peak RSS {_fmt_bytes((o.get('peak_rss_kb') or 0) * 1024)}"
            )
        elif files.outcome is not None and (code is not None or sig):
            status = f"signal {sig}" if sig else f"exit code {code}"
            threads = threads_note(o)
            lines.append(
                f"VENV2 ended with {status} after {o.get('run_s', '?')} s, "
                f"peak RSS {_fmt_bytes((o.get('peak_rss_kb') or 0) * 1024)}"
                + (f", {threads}" if threads else "")
            )
        left = left_note(o)
        if left:
            lines.append(left)
        if files.attempts:
            lines.append(
                f"attempt {len(files.attempts) + 1}: requeued {len(files.attempts)} time(s) ("
                + ", ".join(str(a.get("reason")) for a in files.attempts)
                + ")"
            )
        if sstate:
            lines.append(f"scheduler state: {sched.get('state')}")
        if py_line:
            lines.append(py_line.lstrip(", "))
        stderr = files.stderr_tail.strip()
        dump = str(o.get("stacks") or "").strip().split("\n", 1)[0]
        if dump and dump in stderr:  # the stacks come whole as the traceback: not again here
            stderr = stderr[: stderr.rfind(dump)].strip()
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
            traceback=name_cells(tb, (files.meta or {}).get("cells")),
            exit_status=exit_status,
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

    killed = o.get("supervisor_killed")
    if isinstance(killed, dict):
        return report(
            "supervisor_killed",
            f"the supervisor (pid {killed.get('pid')}) was killed by {killed.get('signal')}; "
            f"its keeper ended the job's {o.get('descendants_killed', 0)} remaining process(es)",
        )
    if o.get("supervisor_error"):
        tb = str(o.get("supervisor_traceback") or "")
        return report("supervisor_failed", f"supervisor error: {o['supervisor_error']}")
    if o.get("requeue_error"):
        return report("requeue_failed", str(o["requeue_error"]))
    if o.get("requeues_exhausted"):
        ex = o["requeues_exhausted"]
        return report(
            "time_limit",
            f"the function checkpointed at its time-limit warning in attempt {ex.get('attempts')}"
            f", and max_requeues={ex.get('max_requeues')} requeues were used up",
            remedy="raise max_requeues=... or time_limit=..., or make each attempt do more",
        )
    if o.get("resources_unavailable"):
        return report("resources_unavailable", str(o["resources_unavailable"]))
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
    if stop == "time_limit" or sstate == "TIMEOUT":
        # every thread's stack, dumped by the supervisor before its SIGTERM: where it waited
        tb = str(o.get("stacks") or "").strip()
        waiting = waiting_in(tb)
        hang = [
            *([f"it was waiting in {waiting}"] if waiting else []),
            *(["every thread's stack just before the SIGTERM is the traceback"] if tb else []),
        ]
        if stop != "time_limit":
            return report(
                "time_limit",
                f"Slurm ended the job at its time limit (TIMEOUT) in phase {phase}; the "
                f"supervisor got {o.get('stop_signal') or 'SIGTERM'} and stopped VENV2",
                *hang,
                remedy=HANG_REMEDY if tb else None,
            )
        return report(
            "time_limit",
            f"time limit {limits.get('time_limit_s')} s reached in phase {phase}; "
            f"sent SIGTERM{', then SIGKILL' if o.get('escalated_to_kill') else ''}",
            *hang,
            remedy=HANG_REMEDY if tb else None,
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

    if err is not None and command is not None:
        found = _command_report(err, command, oom)
        if found is not None:
            kind, line = found
            code = err.get("code") if kind == "command_failed" else None
            return report(kind, line, exit_status=code)
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
        if kind == "version_mismatch":
            dist, there = str(err.get("dist")), str(err.get("venv2_version"))
            here, venv2 = str(err.get("pickler_version")), str(err.get("venv2_executable"))
            return report(
                "version_mismatch",
                f"the payload refers to {err.get('module')!r}, which {dist} {there} in VENV2 "
                f"({venv2}) does not have: it was pickled with {dist} {here}",
                remedy=version_remedy(dist, here, there, venv2),
            )
        if kind == "module_missing" or (
            kind == "user_exception" and err.get("type") in ("ModuleNotFoundError", "ImportError")
        ):
            name = err.get("module") or _module_from_message(str(err.get("message")))
            exe = err.get("venv2_executable")
            unshipped = _unshipped(files.meta, str(name or ""))
            if unshipped is not None:
                return report(
                    "module_missing",
                    unshipped,
                    f"VENV2 cannot import {name!r} during {err.get('phase')}: {msg}",
                    remedy=unshipped.split(" was not shipped: ", 1)[1],
                )
            # the distribution to install: the one the payload's module came from here (a
            # submodule such as numpy._core.numeric is no package of its own)
            held = ((files.meta or {}).get("dists") or {}).get(str(name or "").split(".")[0])
            package = f"{held[0]}=={held[1]}" if held and len(held) == 2 else name
            return report(
                "module_missing",
                f"module {name!r} cannot be imported in VENV2{f' ({exe})' if exe else ''}"
                f" during {err.get('phase')}: {msg}",
                remedy=f"add {package!r} to the environment's packages, or install it into VENV2",
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
        relative = _relative_missing(err)
        if kind == "user_exception" and relative:
            host, cwd = o.get("hostname") or "the node", o.get("cwd") or "its job folder"
            # no cwd given (a node's job): it ran in its job folder, not in the submitter's
            elsewhere = "" if (files.meta or {}).get("cwd") else ", not where you submitted from"
            return report(
                "user_exception",
                f"{msg}",
                f"the job ran on {host} in {cwd}: the relative path {relative!r} resolves "
                f"there{elsewhere}",
                remedy=(
                    f"use an absolute path that exists on {host}, copy the file there, or give "
                    "the job another working directory (Executor(cwd=...))"
                ),
            )
        if kind == "user_exception" and CPU_TORCH in str(err.get("message")):
            exe = err.get("venv2_executable") or "VENV2"
            return report(
                "user_exception",
                f"{msg}",
                f"VENV2's torch ({exe}) is a CPU-only build: it cannot use a GPU, whatever the "
                "node has",
                remedy=(
                    "install a CUDA build of torch into VENV2 (the wheel for the node's CUDA, "
                    "from PyTorch's index: https://download.pytorch.org/whl/cuXXX), or build "
                    "VENV2 with one (env=EnvSpec(packages=[...], ...))"
                ),
            )
        if kind == "user_exception":
            return report("user_exception", f"{msg}")
        if kind == "unpicklable_result":
            return report(
                "unpicklable_result",
                f"the function returned a {err.get('result_type')} that cannot be pickled: {msg}",
            )
        if kind == "disk_full":
            what = "writing the result" if err.get("phase") == "saving" else "the function"
            return report(
                "disk_full",
                f"{what} failed: {msg}",
                *_disk_lines(err.get("disk"), tb, err.get("errno")),
            )
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
        overflow = stack_overflow(stack)
        if overflow:
            return report(
                "crash",
                f"VENV2 died of {sig} in phase {phase}: a stack overflow, {overflow}",
                remedy=(
                    "the recursion went deeper than the C stack holds (a raised "
                    "sys.setrecursionlimit lets it): make it iterative or shallower, or run it in "
                    "a thread with a larger stack (threading.stack_size)"
                ),
            )
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


def _command_report(err: WorkerError, argv: list[str], oom: int) -> tuple[str, str] | None:
    """(kind, evidence) of a command job whose command failed or could not start (the worker
    records its exit status as a ``sys.exit`` code), else None: the runner's other kinds."""
    import shlex
    import signal

    shown = shlex.join(argv)
    kind = err.get("kind")
    code = err.get("code")
    if kind == "sys_exit" and isinstance(code, int):
        if code >= 0:
            return "command_failed", f"`{shown}` exited with code {code}"
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        if name == "SIGKILL" and oom > 0:
            return "out_of_memory", (
                f"`{shown}` was killed by SIGKILL, with {oom} cgroup OOM kill(s) during the job"
            )
        return "command_failed", f"`{shown}` was killed by {name}"
    if kind == "user_exception" and err.get("type") in (
        "FileNotFoundError",
        "PermissionError",
        "NotADirectoryError",
    ):
        message = re.sub(r"^\[Errno \d+\] ", "", str(err.get("message")))
        return "command_not_found", f"`{shown}`: {message}"
    return None


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
