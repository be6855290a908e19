"""How a prepared job folder gets run: a local process, a supervisor over SSH, or Slurm.

Every backend starts the same thing, ``VENV1 JOBDIR/supervisor.py JOBDIR`` (a Slurm map's
chunks: ``VENV1 RUNNER/supervisor.py JOBDIR``, one runner folder shared by them): one command line
holding only paths gpuctl made. What differs is how it is started, how its state is asked for,
and how it is cancelled.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import re
import shlex
import signal
import threading
import time
from collections.abc import Sequence

from gpuctl.core import wire
from gpuctl.jobs.hosts import _REAPER, Host, HostError, LocalHost
from gpuctl.jobs.records import BackendInfo, FinalState, Handle, JobMeta, PidFile, SchedulerState
from gpuctl.node import jobfiles
from gpuctl.node.proc import read_stat
from gpuctl.reach.slurm import (
    DEFAULT_MAX_ARRAY_SIZE,
    SlurmClient,
    SlurmError,
    SlurmValueError,
    check_hostlist,
    check_name,
    job_name,
    sbatch_arg,
    sbatch_path,
)
from gpuctl.reach.slurm import nodelist as nodelist_of

SUPERVISOR_FILE = jobfiles.SUPERVISOR_SCRIPT
REMOTE_PROBE_EVERY = 3.0  # seconds between `kill -0` probes of a remote supervisor
POLL_EVERY = 0.5  # seconds between squeue calls of one Slurm backend, with few jobs to watch
POLL_EVERY_MOST = 3.0  # ... and with hundreds


class Backend:
    """Base: starts supervisors on ``host`` for job folders under ``job_root``."""

    kind = "base"
    default_max_running = 8  # jobs of one map running at once on one machine (local, SSH)

    def __init__(self, host: Host, job_root: str, supervisor_python: str) -> None:
        self.host = host
        self.job_root = job_root
        self.supervisor_python = supervisor_python

    def describe(self) -> BackendInfo:
        """What the store keeps to rebuild this backend after a restart."""
        return {"kind": self.kind, "job_root": self.job_root, "python": self.supervisor_python}

    def supervisor_argv(self, jobdir: str) -> list[str]:
        return [self.supervisor_python, f"{jobdir}/{SUPERVISOR_FILE}", jobdir]

    def start(self, jobdirs: Sequence[str], meta: JobMeta) -> list[Handle]:
        """Start supervisors for ``jobdirs``; return one handle per folder."""
        raise NotImplementedError

    def scheduler_state(self, handle: Handle) -> SchedulerState | None:
        """What the scheduler knows of a job without an outcome (None: nothing to add)."""
        return None

    def finished_without_outcome(self, handle: Handle, jobdir: str) -> bool:
        """True when the job can no longer write its outcome (process gone, job ended)."""
        raise NotImplementedError

    def wait_hint(self, handle: Handle, timeout: float) -> None:
        """Block up to ``timeout`` s or until the job may have changed (default: sleep)."""
        time.sleep(timeout)

    def forget(self, handle: Handle) -> None:
        """The job is over and its outcome read: nothing more to ask the scheduler about it."""

    def cancel(self, handle: Handle, jobdir: str) -> None:
        raise NotImplementedError

    def signal(self, handle: Handle, jobdir: str, signum: int) -> None:
        """Send ``signum`` to the supervisor (it forwards SIGUSR1/SIGUSR2 to VENV2)."""
        raise NotImplementedError


class ProcessBackend(Backend):
    """A detached supervisor process on a host: local or over SSH (``setsid``)."""

    kind = "process"

    def __init__(self, host: Host, job_root: str, supervisor_python: str) -> None:
        super().__init__(host, job_root, supervisor_python)
        self._last_probe: dict[str, float] = {}

    def start(self, jobdirs: Sequence[str], meta: JobMeta) -> list[Handle]:
        handles: list[Handle] = []
        for jobdir in jobdirs:
            log = f"{jobdir}/{jobfiles.SUPERVISOR_LOG}"
            pid = self.host.start_detached(self.supervisor_argv(jobdir), log, self.start_env())
            handles.append({"pid": pid, "host": self.host.name})
        return handles

    def start_env(self) -> dict[str, str] | None:
        """The supervisor's environment (None: the host's own for a command, sshd's session)."""
        return None

    def _pid_info(self, jobdir: str) -> PidFile | None:
        return wire.parse(
            PidFile, jobfiles.loads(self.host.read_bytes(f"{jobdir}/{jobfiles.PIDFILE}"))
        )

    def _alive(self, pid: int) -> bool:
        if isinstance(self.host, LocalHost):
            _REAPER.poll()
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                return True
            st = read_stat(pid)  # a zombie that is not ours is dead for this purpose
            return st is not None and st.state != "Z"
        rc, _, _ = self.host.run(["kill", "-0", str(pid)], timeout=30)
        return rc == 0

    def finished_without_outcome(self, handle: Handle, jobdir: str) -> bool:
        remote = not isinstance(self.host, LocalHost)
        if remote:
            # a liveness probe is an SSH round trip: at most one per job every few seconds
            now = time.monotonic()
            if now - self._last_probe.get(jobdir, -1e9) < REMOTE_PROBE_EVERY:
                return False
            self._last_probe[jobdir] = now
        pid = handle.get("pid")
        if not pid:
            info = self._pid_info(jobdir)
            pid = info.get("pid") if info else None
        if not pid:
            return False
        return not self._alive(int(pid))

    def wait_hint(self, handle: Handle, timeout: float) -> None:
        pid = handle.get("pid")
        if isinstance(self.host, LocalHost) and pid and _REAPER.wait(int(pid), timeout):
            return
        time.sleep(timeout)

    def cancel(self, handle: Handle, jobdir: str) -> None:
        # The file covers a supervisor that has not installed its handlers yet.
        self.host.write_bytes(f"{jobdir}/{jobfiles.CANCEL}", b"cancel\n")
        self.signal(handle, jobdir, signal.SIGTERM)

    def signal(self, handle: Handle, jobdir: str, signum: int) -> None:
        info = self._pid_info(jobdir)
        pid = (info or {}).get("pid") or handle.get("pid")
        if not pid:
            return
        if isinstance(self.host, LocalHost):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signum)
            return
        self.host.run(["kill", f"-{signal.Signals(signum).name[3:]}", str(pid)], timeout=30)


class LocalBackend(ProcessBackend):
    kind = "local"

    def start_env(self) -> dict[str, str] | None:
        # this process's environment is the submitter's, not the machine's: only its base
        # (``jobfiles.BASE_ENV``), as a job on any other backend gets
        return jobfiles.base_env(dict(os.environ))


class SshBackend(ProcessBackend):
    kind = "ssh"

    def __init__(self, host: Host, job_root: str, supervisor_python: str, node: str) -> None:
        super().__init__(host, job_root, supervisor_python)
        self.node = node

    def describe(self) -> BackendInfo:
        return {**super().describe(), "node": self.node}


# --- Slurm -----------------------------------------------------------------------------------

_TERMINAL = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "OUT_OF_MEMORY",
    "NODE_FAIL",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "REVOKED",
    "SPECIAL_EXIT",
}


class SlurmBackend(Backend):
    """``sbatch`` a script gpuctl writes into the job folder; ``map`` becomes a job array.

    Slurm's commands run on this (login) machine through ``SlurmClient``; ``host`` is only for
    the job folder's files. State polling is batched (one ``squeue -u USER`` for every job of
    this backend) and cached for ``poll_every`` seconds with backoff; finished jobs are looked
    up with ``sacct`` when accounting exists, else ``scontrol show job``.

    Every value of the batch script is checked when the backend is made (partition, node list,
    extra sbatch options) or when the script is written (job name, folders): SlurmValueError.
    """

    kind = "slurm"
    default_max_running = 64  # array tasks of one map running at once (``--array=0-N%64``)

    def __init__(
        self,
        host: Host,
        job_root: str,
        supervisor_python: str,
        *,
        partition: str | None = None,
        slurm_conf: str | None = None,
        nodelist: str | None = None,
        sbatch_args: Sequence[str] = (),
        signal_warning: str | None = "USR1@60",
        client: SlurmClient | None = None,
    ) -> None:
        super().__init__(host, job_root, supervisor_python)
        self.partition = check_name(partition, "partition") if partition else None
        self.client = client or SlurmClient(slurm_conf)
        self.slurm_conf = self.client.slurm_conf
        self.nodelist = nodelist_of(check_hostlist(nodelist, "nodelist")) if nodelist else None
        self.sbatch_args = [sbatch_arg(a) for a in sbatch_args]
        if signal_warning is not None and not re.fullmatch(r"[A-Z0-9]+@\d+", signal_warning):
            raise SlurmValueError(f"signal_warning {signal_warning!r} is not like USR1@60")
        self.signal_warning = signal_warning
        self._cache: dict[str, SchedulerState] = {}
        self._cache_t = 0.0
        self._poll_every = POLL_EVERY
        self._lock = threading.Lock()
        self._watch: set[str] = set()
        self._mem_enforced: bool | None = None
        self._max_array: int | None = None

    def describe(self) -> BackendInfo:
        return {
            **super().describe(),
            "partition": self.partition,
            "slurm_conf": self.slurm_conf,
            "nodelist": self.nodelist,
            "sbatch_args": self.sbatch_args,
        }

    def memory_enforced(self) -> bool:
        """True when Slurm itself kills a step that goes over its ``--mem``
        (``JobAcctGatherParams=OverMemoryKill``; asked once). The supervisor then leaves its
        own watch of the job's resident memory off, so Slurm's verdict is the one the job
        meets. (With task/cgroup the supervisor sees the cgroup limit.)"""
        if self._mem_enforced is None:
            try:
                params = self.client.config_value("JobAcctGatherParams") or ""
            except SlurmError:
                params = ""
            self._mem_enforced = "overmemorykill" in params.lower()
        return self._mem_enforced

    def max_array_size(self) -> int:
        """How many tasks one array may have here (the cluster's ``MaxArraySize``, asked once;
        Slurm's default 1001 when ``scontrol`` does not answer)."""
        if self._max_array is None:
            try:
                self._max_array = self.client.max_array_size()
            except SlurmError:
                self._max_array = DEFAULT_MAX_ARRAY_SIZE
        return self._max_array

    def script(
        self,
        jobdirs: Sequence[str],
        meta: JobMeta,
        *,
        max_running: int | None = None,
        after: str | None = None,
    ) -> str:
        """The batch script: resources as #SBATCH lines, then one exec of the supervisor.
        Several folders are one array, at most ``max_running`` tasks running at once; ``after``:
        the Slurm job it waits for (``--dependency=afterany``, however that one ended).

        Raises SlurmValueError for a job folder the script cannot name.
        """
        limits = meta.get("limits") or {}
        name = job_name(str(meta.get("name") or "job"))
        lines = ["#!/bin/bash", f"#SBATCH --job-name={name}"]
        if self.partition:
            lines.append(f"#SBATCH --partition={self.partition}")
        if self.nodelist:
            lines.append(f"#SBATCH --nodelist={self.nodelist}")
        cpus = int(limits.get("cpus") or 1)
        lines.append(f"#SBATCH --cpus-per-task={cpus}")
        gpus, mem, seconds = limits.get("gpus"), limits.get("mem_bytes"), limits.get("time_limit_s")
        per_node = int(limits.get("tasks_per_node") or 1)
        tasks = jobfiles.task_count(meta)
        if tasks > 1:
            lines.append(f"#SBATCH --nodes={int(limits.get('nodes') or 1)}")
            lines.append(f"#SBATCH --ntasks-per-node={per_node}")
        if gpus:  # per task; a node's tasks all see its GPUs (LOCAL_RANK picks one, as torchrun)
            many = f"-per-node={int(gpus) * per_node}" if tasks > 1 else f"={int(gpus)}"
            lines.append(f"#SBATCH --gpus{many}")
        if mem:  # per task; --mem is per node
            lines.append(f"#SBATCH --mem={max(1, int(mem) * per_node // (1 << 20))}M")
        if seconds:
            minutes = max(1, int((float(seconds) + 59) // 60))
            lines.append(f"#SBATCH --time={minutes}")
        if meta.get("checkpointable") and limits.get("warning_s"):
            # the warning a checkpoint waits for, as long before the limit as the job asked
            lines.append(f"#SBATCH --signal=B:USR1@{max(1, int(limits['warning_s']))}")
        elif self.signal_warning:
            lines.append(f"#SBATCH --signal=B:{self.signal_warning}")
        root = os.path.dirname(jobdirs[0])
        # %a of a job that is not an array would be a placeholder (4294967294): name it by %j
        pattern = "slurm-%A_%a.out" if len(jobdirs) > 1 else "slurm-%j.out"
        output = sbatch_path(f"{root}/{pattern}", "job folder", pattern=True)
        lines.append(f"#SBATCH --output={output}")
        lines.append(f"#SBATCH --chdir={sbatch_path(root, 'job folder')}")
        if len(jobdirs) > 1:
            cap = f"%{int(max_running)}" if max_running and max_running < len(jobdirs) else ""
            lines.append(f"#SBATCH --array=0-{len(jobdirs) - 1}{cap}")
        if after is not None:
            if not after.isdigit():
                raise SlurmValueError(f"job id {after!r} is not a Slurm job id")
            lines.append(f"#SBATCH --dependency=afterany:{after}")
        if meta.get("checkpointable"):  # the supervisor requeues it; one output for every attempt
            lines += ["#SBATCH --requeue", "#SBATCH --open-mode=append"]
        # the submitter's environment stays here, as for every backend: its base only
        # (``jobfiles.BASE_ENV``; Slurm adds its SLURM_* variables)
        names = sorted(jobfiles.base_env(dict(os.environ)))
        lines.append(f"#SBATCH --export={','.join(names) or 'NONE'}")
        lines += [f"#SBATCH {a}" for a in self.sbatch_args]
        quoted = " ".join(shlex.quote(d) for d in jobdirs)
        runner = meta.get("runner")  # one for every folder of the array, else each its own
        supervisor = (
            shlex.quote(f"{runner}/{SUPERVISOR_FILE}") if runner else f'"$D/{SUPERVISOR_FILE}"'
        )
        # several tasks: srun starts a supervisor per task (each writes its rank's folder) and
        # ends them all once one fails; it forwards the warning signal to them
        srun = (
            f"srun --kill-on-bad-exit=1 --cpus-per-task={cpus} --ntasks-per-node={per_node} "
            if tasks > 1
            else ""
        )
        lines += [
            f"DIRS=({quoted})",
            'D="${DIRS[${SLURM_ARRAY_TASK_ID:-0}]}"',
            f'exec {srun}{shlex.quote(self.supervisor_python)} {supervisor} "$D"',
        ]
        return "\n".join(lines) + "\n"

    def start(
        self, jobdirs: Sequence[str], meta: JobMeta, *, max_running: int | None = None
    ) -> list[Handle]:
        """``sbatch`` ``jobdirs``: one job, or an array with at most ``max_running`` tasks
        running at once.

        More folders than the cluster's ``MaxArraySize`` become several arrays, each within it,
        each waiting for the one before to end (``afterany``): one array runs at a time, so the
        cap holds over all of them, enforced by Slurm. Each handle then says so (``split``).
        """
        most = self.max_array_size()
        count = -(-len(jobdirs) // most)  # arrays, as even as can be
        bounds = [len(jobdirs) * k // count for k in range(count + 1)]
        groups = [jobdirs[a:b] for a, b in itertools.pairwise(bounds)]
        split = (
            f"{count} arrays of <={max(map(len, groups))} tasks (MaxArraySize {most}), "
            f"one after another"
            if count > 1
            else ""
        )
        handles: list[Handle] = []
        after: str | None = None
        for n, group in enumerate(groups):
            try:
                after, part = self._submit(group, meta, max_running, after)
            except HostError:
                if handles:  # the arrays already queued would run without their map: stop them
                    for array in {str(h.get("array") or h["slurm_id"]) for h in handles}:
                        with contextlib.suppress(SlurmError):
                            self.client.cancel(array)
                raise
            for h in part:
                if split:
                    h["split"] = f"array {n + 1} of {count}: {split}"
            handles += part
        with self._lock:
            self._watch.update(h["slurm_id"] for h in handles)
            self._cache_t = 0.0  # the next look asks squeue: it knows the new ids, the cache not
        return handles

    def _submit(
        self, jobdirs: Sequence[str], meta: JobMeta, max_running: int | None, after: str | None
    ) -> tuple[str, list[Handle]]:
        """``sbatch`` one script for ``jobdirs``; (its Slurm job id, one handle per folder)."""
        script_path = f"{jobdirs[0]}/job.sbatch"
        script = self.script(jobdirs, meta, max_running=max_running, after=after)
        self.host.write_bytes(script_path, script.encode(), 0o700)
        try:
            job_id = self.client.submit(script_path)
        except SlurmError as e:
            raise HostError(str(e)) from None
        root = os.path.dirname(jobdirs[0])
        handles: list[Handle]
        if len(jobdirs) == 1:
            handles = [{"slurm_id": job_id, "output": f"{root}/slurm-{job_id}.out"}]
            if jobfiles.task_count(meta) > 1:
                handles[0]["tasks"] = jobfiles.task_count(meta)
        else:
            handles = [
                {
                    "slurm_id": f"{job_id}_{i}",
                    "array": job_id,
                    "output": f"{root}/slurm-{job_id}_{i}.out",
                }
                for i in range(len(jobdirs))
            ]
        return job_id, handles

    def _refresh(self) -> None:
        now = time.monotonic()
        if now - self._cache_t < self._poll_every:
            return
        self._cache_t = now
        try:
            jobs = self.client.jobs(user=_user())
        except SlurmError:
            # the controller is slow or gone: back off instead of hammering it
            self._poll_every = min(10.0, self._poll_every * 2)
            return
        with self._lock:
            # every watched job's state comes from one squeue; with many, a slower pace (the
            # job folders, read more often, say when each ends)
            self._poll_every = min(POLL_EVERY_MOST, max(POLL_EVERY, len(self._watch) / 100))
        seen: dict[str, SchedulerState] = {
            j.job_id: {"state": j.state, "reason": j.reason or "None", "queued": True} for j in jobs
        }
        with self._lock:
            for sid in self._watch:
                if sid in seen:
                    self._cache[sid] = seen[sid]
                elif self._cache.get(sid, {}).get("queued", True):
                    self._cache[sid] = {"queued": False}

    def _final_state(self, slurm_id: str) -> FinalState:
        state, source = self.client.final_state(slurm_id)
        return {"state": state, "source": source}

    def _squeue_says(self, handle: Handle) -> tuple[str, SchedulerState]:
        """(Slurm id, what the last squeue said of it: a copy, {} when nothing yet); the job is
        watched from now on, and squeue asked again when its answer is ``poll_every`` old."""
        sid = str(handle.get("slurm_id") or "")
        if not sid:
            return "", SchedulerState()
        with self._lock:
            self._watch.add(sid)
        self._refresh()
        with self._lock:
            return sid, self._cache.get(sid, SchedulerState()).copy()

    def scheduler_state(self, handle: Handle) -> SchedulerState | None:
        sid, info = self._squeue_says(handle)
        if not sid:
            return None
        if info.get("queued"):
            return info
        if "final" not in info:
            info["final"] = self._final_state(sid)
            info["final"]["output_tail"] = self._output_tail(handle)
            with self._lock:
                self._cache[sid] = info
        final = info["final"]
        return {
            "state": final.get("state", ""),
            "source": final.get("source"),
            "output_tail": final.get("output_tail", ""),
        }

    def pending(self, handle: Handle) -> bool:
        """True while squeue (at most ``poll_every`` s ago) lists the job as PENDING."""
        _, info = self._squeue_says(handle)
        return bool(info.get("queued")) and info.get("state") == "PENDING"

    def _output_tail(self, handle: Handle, limit: int = 3000) -> str:
        """The end of Slurm's own output file for the job (slurmstepd writes why it killed a
        step there: memory limit, time limit, cancel)."""
        pattern = str(handle.get("output") or "")
        if not pattern or not isinstance(self.host, LocalHost):
            return ""
        for path in sorted(glob.glob(pattern)):
            data = self.host.read_bytes(path) or b""
            return data[-limit:].decode("utf-8", "replace")
        return ""

    def finished_without_outcome(self, handle: Handle, jobdir: str) -> bool:
        info = self.scheduler_state(handle) or {}
        if info.get("queued"):
            return False
        state = str(info.get("state") or "").split()[0] if info.get("state") else ""
        return state in _TERMINAL or state == ""

    def forget(self, handle: Handle) -> None:
        sid = str(handle.get("slurm_id") or "")
        with self._lock:
            self._watch.discard(sid)
            self._cache.pop(sid, None)

    def cancel(self, handle: Handle, jobdir: str) -> None:
        self.host.write_bytes(f"{jobdir}/{jobfiles.CANCEL}", b"cancel\n")
        sid = str(handle.get("slurm_id") or "")
        if sid:
            with contextlib.suppress(SlurmError):  # ended already, or Slurm away: files decide
                self.client.cancel(sid)

    def signal(self, handle: Handle, jobdir: str, signum: int) -> None:
        sid = str(handle.get("slurm_id") or "")
        if sid:
            name = signal.Signals(signum).name[3:]
            with contextlib.suppress(SlurmError):
                self.client.cancel(sid, signal=name, batch=True)


def _user() -> str:
    import getpass

    return getpass.getuser()
