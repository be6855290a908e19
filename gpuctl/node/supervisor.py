"""VENV1 job supervisor: runs one VENV2 job from its folder and ALWAYS writes ``outcome.json``.

``python3 supervisor.py JOBDIR`` (a copy of this file lives in every job folder), also reachable as
``python3 gpuctl-node-<hash>.pyz supervisor JOBDIR`` and ``python3 -m gpuctl.node supervisor
JOBDIR``. Standard library only, Python 3.6 syntax: this runs on a node's system Python.

What it does, in order:

1. reads ``meta.json`` (never the payload: the supervisor unpickles nothing);
2. runs the job's setup lines (``module load cuda/12.1`` ...) in ``bash`` with their output in
   ``setup.log``, and takes the environment they leave behind for VENV2;
3. starts VENV2's python as ``python -X faulthandler -u worker.py JOBDIR`` with stdout and stderr
   going to ``stdout.txt``/``stderr.txt`` (files, not pipes: a chatty job cannot block on a full
   pipe), in its own session;
4. waits: writes ``heartbeat.json`` every few seconds, enforces the time limit itself outside Slurm
   (TERM, grace, KILL to VENV2's process group) and a memory limit where nothing else does (the
   resident memory of VENV2's session, summed every ``MEM_CHECK_EVERY`` s; over it, KILL), forwards SIGUSR1/SIGUSR2 (Slurm's warning signal,
   stack dumps) to VENV2's python alone, and turns SIGTERM/SIGINT/SIGHUP into a cancel;
5. records exit code or signal, peak RSS (``wait4``), wall time, the cgroup (v1 or v2) memory limit
   and OOM-kill count before and after, kills whatever VENV2 left in its process group and every
   other descendant (the supervisor is a child subreaper: what the job double-forked or moved to
   a session of its own comes back to it, grandchildren included), and writes ``outcome.json``
   atomically, whatever happened, including its own failure.

In front of the supervisor stays its keeper (``keeper.keep``): the process the backend started, a child
subreaper that forked the supervisor and forwards the job's signals to it. When the supervisor is
killed (``kill -9``, the OOM killer), VENV2 dies of its parent-death signal, what the function
started reparents to the keeper, and the keeper ends it all and writes an outcome that names the
signal.

Children start through ``proc.spawn`` (own session, SIGKILL when the supervisor dies). There is
no liveness timeout here on purpose: a job outlives the link that submitted it (a network
partition, gpuctl closed); only its own limits, a cancel or the scheduler end it. File names and
formats come from ``jobfiles``.

``python3 supervisor.py --build-env SPEC.json`` builds a VENV2 environment (``envbuild``) and
prints one JSON line.

This module is the supervision loop and the entry point; its other mechanisms are modules
beside it (each a copy in the job folder's ``gpuctl_runner``, ``jobfiles.RUNNER_MODULES``):
``cgroups`` (the memory cgroup before and after), ``rendezvous`` (one task of a job of several:
its folder, torch's ``env://``), ``scontrol`` (the node's one Slurm command: hostnames,
preemption, requeue), ``resources`` (``gpus=``/``cpus=`` outside a scheduler, thread counts),
``attempts`` (checkpoint, preemption and requeue records), ``envbuild`` (``--build-env``) and
``keeper``.
"""

import errno
import fcntl
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
import traceback
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

if TYPE_CHECKING:
    from . import attempts, jobfiles, proc
    from .cgroups import cgroup_memory
    from .envbuild import build_env
    from .keeper import FORWARDED, STOPPING, keep
    from .readers.procs import process_command
    from .rendezvous import rendezvous_env, task_folder
    from .resources import node_resources, thread_count
    from .scontrol import slurm_preemption
else:
    try:
        from . import attempts, jobfiles, proc
        from .cgroups import cgroup_memory
        from .envbuild import build_env
        from .keeper import FORWARDED, STOPPING, keep
        from .readers.procs import process_command
        from .rendezvous import rendezvous_env, task_folder
        from .resources import node_resources, thread_count
        from .scontrol import slurm_preemption
    except ImportError:  # a script in a job folder: copies of the node modules sit beside it
        from gpuctl_runner import attempts, jobfiles, proc
        from gpuctl_runner.cgroups import cgroup_memory
        from gpuctl_runner.envbuild import build_env
        from gpuctl_runner.keeper import FORWARDED, STOPPING, keep
        from gpuctl_runner.readers.procs import process_command
        from gpuctl_runner.rendezvous import rendezvous_env, task_folder
        from gpuctl_runner.resources import node_resources, thread_count
        from gpuctl_runner.scontrol import slurm_preemption

DEFAULT_GRACE = 10.0
HEARTBEAT_EVERY = 2.0
MEM_CHECK_EVERY = 0.2  # seconds between two sums of the job's resident memory (mem= outside Slurm)


def _now() -> float:
    return time.time()


# --- the job -------------------------------------------------------------------------------


def _rss_kb(pid: int) -> Optional[int]:
    st = proc.read_stat(pid)
    return st.rss // 1024 if st is not None else None


def _session_rss_kb(sid: int) -> int:
    """Resident memory of every process of session ``sid`` (VENV2 and what it started), in KiB.

    Resident, not virtual: CUDA maps far more address space than it uses, so an address-space
    limit (RLIMIT_AS) would break it where this does not."""
    return proc.session_rss(sid) // 1024


def _run_setup(jobdir: str, lines: List[str],
               env: Dict[str, str]) -> Tuple[bool, int, Optional[Dict[str, str]]]:
    """Run setup lines in bash; return (ok, rc, env after them). Output goes to the setup log."""
    script = os.path.join(jobdir, jobfiles.SETUP_SCRIPT)
    envfile = os.path.join(jobdir, jobfiles.SETUP_ENV)
    with open(script, "w") as f:
        f.write("set -e\n")
        for line in lines:
            f.write(line.rstrip("\n") + "\n")
        # The environment the lines leave behind is what VENV2 must see (module load, conda).
        f.write('env -0 > "$GPUCTL_SETUP_ENV"\n')
    env = dict(env)
    env["GPUCTL_SETUP_ENV"] = envfile
    with open(os.path.join(jobdir, jobfiles.SETUP_LOG), "ab") as log:
        log.write(("# setup lines, %s\n" % time.strftime("%Y-%m-%d %H:%M:%S")).encode())
        log.flush()
        rc = proc.spawn(["bash", script], stdout=log, stderr=log, env=env, cwd=jobdir).wait()
    if rc != 0:
        return False, rc, None
    new_env = {}  # type: Dict[str, str]
    try:
        with open(envfile, "rb") as f:
            for item in f.read().split(b"\0"):
                name, sep, value = item.partition(b"=")
                if sep and name:
                    new_env[name.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
        os.unlink(envfile)
    except OSError:
        return True, rc, env
    new_env.pop("GPUCTL_SETUP_ENV", None)
    for key in ("SHLVL", "_", "OLDPWD"):
        new_env.pop(key, None)
    return True, rc, new_env



MAX_LEFT_SHOWN = 10


def left_running() -> "List[jobfiles.LeftProcess]":
    """The processes still alive under this supervisor once VENV2 ended (what the function
    started and did not end: they reparent to this subreaper): pid and command line."""
    found = []  # type: List[jobfiles.LeftProcess]
    for pid in proc.descendants()[:MAX_LEFT_SHOWN]:
        cmd = process_command(pid)
        if cmd is not None:
            found.append({"pid": pid, "cmd": cmd})
    return found


SHM = "/dev/shm"
MAX_SHM_SHOWN = 10


def shm_names() -> "Dict[str, int]":
    """This user's entries of ``/dev/shm``: name -> inode (a name removed and made again is
    another file)."""
    found = {}  # type: Dict[str, int]
    try:
        names = os.listdir(SHM)
    except OSError:
        return found
    uid = os.getuid()
    for name in names:
        try:
            st = os.lstat(os.path.join(SHM, name))
        except OSError:
            continue
        if st.st_uid == uid:
            found[name] = st.st_ino
    return found


def shm_left(before: "Dict[str, int]") -> "List[jobfiles.ShmFile]":
    """This user's files in ``/dev/shm`` that were not there when the job started (a torch
    DataLoader's, a POSIX shared memory segment the function did not unlink): the biggest
    first, with the memory each holds. A job of the same user beside it on the node may have
    made some of them: they are named, not removed."""
    left = []  # type: List[jobfiles.ShmFile]
    for name, ino in shm_names().items():
        if before.get(name) == ino:
            continue
        path = os.path.join(SHM, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        left.append({"path": path, "bytes": st.st_blocks * 512})
    left.sort(key=lambda f: -f["bytes"])
    return left[:MAX_SHM_SHOWN]


STACK_DUMP_WAIT = 2.0  # seconds for VENV2's faulthandler to write its stacks before the TERM
STACK_DUMP_QUIET = 0.1  # the dump is over once stderr has not grown for this long
MAX_STACK_DUMP = 32768  # bytes of it kept in the outcome


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


class Supervisor(object):
    """One job run; ``run()`` returns the outcome dict (also written to ``outcome.json``)."""

    def __init__(self, jobdir: str) -> None:
        self.jobdir = os.path.abspath(jobdir)
        self.outcome = {
            "supervisor_version": 1,
            "supervisor_python": sys.version.split()[0],
            "supervisor_executable": sys.executable,
            "hostname": socket.gethostname(),
            "supervisor_pid": os.getpid(),
            "started_at": _now(),
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
            "phase": "supervisor",
        }  # type: jobfiles.Outcome
        self.stop_reason = None  # type: Optional[str]
        self.stop_at = None  # type: Optional[float]
        self.kill_at = None  # type: Optional[float]
        self.child = None  # type: Optional[subprocess.Popen[bytes]]
        self.pending_forward = []  # type: List[int]
        self.wake_r = -1
        self.wake_w = -1
        self.requeued = False
        self.env_folder = ""  # the job folder that held the passed variables (``JOB_ENV``)
        self.shm_before = None  # type: Optional[Dict[str, int]]
        # a SIGTERM under Slurm: a cancel or a preemption, which ``_resolve_stop`` tells apart
        self.term_pending = False

    def path(self, name: str) -> str:
        """The path of job file ``name`` (a ``jobfiles`` name)."""
        return os.path.join(self.jobdir, name)

    def _on_stop(self, signum: int, frame: Any) -> None:
        if self.stop_reason is None and not self.term_pending:
            self.outcome["stop_signal"] = signal.Signals(signum).name
            if self.outcome["slurm_job_id"] and signum == signal.SIGTERM:
                self.term_pending = True  # not in a handler: it asks Slurm
            else:
                self.stop_reason = "cancelled"

    def _resolve_stop(self) -> None:
        """What a SIGTERM under Slurm means: gpuctl's cancel (its file), else Slurm's word, a
        preemption (``slurm_preemption``: the job goes back to the queue) or a cancel
        (``scancel``, the time limit)."""
        if not self.term_pending or self.stop_reason is not None:
            return
        self.term_pending = False
        if not self._preempted_now():
            self.stop_reason = "cancelled"

    def _preempted_now(self) -> bool:
        """True (and the stop reason "preempted") when Slurm says it preempts this job and
        gpuctl did not ask to cancel it."""
        if os.path.exists(self.path(jobfiles.CANCEL)):
            return False
        evidence = slurm_preemption(str(self.outcome["slurm_job_id"]),
                                    int(os.environ.get("SLURM_RESTART_COUNT") or 0))
        if evidence:
            self.outcome["preempted"] = evidence
            self.stop_reason = "preempted"
        return bool(evidence)

    def _on_forward(self, signum: int, frame: Any) -> None:
        self.pending_forward.append(signum)

    def install_signals(self) -> None:
        self.wake_r, self.wake_w = os.pipe()
        for fd in (self.wake_r, self.wake_w):
            fl = fcntl.fcntl(fd, fcntl.F_GETFL)
            fcntl.fcntl(fd, fcntl.F_SETFL, fl | os.O_NONBLOCK)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda s, f: None)
        for name in STOPPING:
            signal.signal(getattr(signal, name), self._on_stop)
        for name in FORWARDED:
            signal.signal(getattr(signal, name), self._on_forward)

    def run(self) -> "jobfiles.Outcome":
        try:
            if self.wake_w < 0:
                self.install_signals()
            if proc.become_subreaper():
                self.outcome["subreaper"] = True
            self._run()
        except BaseException as e:  # the outcome is written whatever happens
            self.outcome["supervisor_error"] = "%s: %s" % (type(e).__name__, e)
            self.outcome["supervisor_traceback"] = traceback.format_exc()
        finally:
            if self.child is not None and self.child.returncode is None:
                self._killpg(signal.SIGKILL)
                try:
                    self._reap(block=True)
                except OSError:
                    pass
            try:
                # A child subreaper inherits what the job left in other sessions (a daemon, a
                # double fork): it all ends with the job, before the outcome says it did.
                left = proc.kill_descendants()
                if left:
                    self.outcome["descendants_killed"] = len(left)
            except Exception as e:
                self.outcome["descendants_error"] = "%s: %s" % (type(e).__name__, e)
            self.outcome["ended_at"] = _now()
            self.outcome["wall_s"] = round(self.outcome["ended_at"] - self.outcome["started_at"], 3)
            try:
                self.outcome["cgroup_after"] = cgroup_memory()
            except Exception:
                pass
            if self.shm_before is not None:  # what the job left in /dev/shm, RAM held
                shm = shm_left(self.shm_before)
                if shm:
                    self.outcome["shm_left"] = shm
            if not self.requeued:  # Slurm starts the next attempt; it writes the outcome
                if self.env_folder:
                    jobfiles.take_job_env(self.env_folder, remove=True)
                jobfiles.write_json(self.path(jobfiles.OUTCOME), self.outcome)
        return self.outcome

    def _run(self) -> None:
        os.chmod(self.jobdir, 0o700)
        # the passed variables' values: read from their 0600 file, which goes at once (under
        # Slurm at the end: a requeued attempt and the other ranks read it too)
        self.env_folder = self.jobdir
        job_env = jobfiles.take_job_env(self.jobdir, remove=not self.outcome["slurm_job_id"])
        self.jobdir = task_folder(self.jobdir, self.outcome)
        jobfiles.write_json(self.path(jobfiles.PIDFILE), {
            "pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0),
            "hostname": self.outcome["hostname"], "started_at": self.outcome["started_at"]})
        meta = jobfiles.read_json(self.path(jobfiles.META))
        if not isinstance(meta, dict):
            self.outcome["supervisor_error"] = "%s missing or unreadable in %s" % (
                jobfiles.META, self.jobdir)
            return
        attempts.begin(self.path, self.outcome)
        self.outcome["cgroup_before"] = cgroup_memory()
        self.shm_before = shm_names()
        limits = meta.get("limits") or {}
        time_limit = limits.get("time_limit_s")
        grace = float(limits.get("grace_s") or DEFAULT_GRACE)
        mem_bytes = limits.get("mem_bytes")
        under_slurm = bool(self.outcome["slurm_job_id"])
        env = dict(os.environ)
        env.update(rendezvous_env(meta, env))
        env.update(job_env)
        env["GPUCTL_JOB_DIR"] = self.jobdir
        env["GPUCTL_JOB_ID"] = str(meta.get("id", ""))
        setup = list(meta.get("setup") or [])
        if setup:
            self.outcome["phase"] = "setup"
            ok, rc, new_env = _run_setup(self.jobdir, setup, env)
            self.outcome["setup"] = {"lines": setup, "rc": rc}
            if not ok or new_env is None:
                self.outcome["setup_failed"] = True
                return
            self._resolve_stop()
            if self.stop_reason == "preempted":
                self._preempted()
            if self.stop_reason:
                return
            env = new_env
        if not under_slurm:  # under Slurm, the allocation is Slurm's (--gpus, --cpus-per-task)
            add, lacking = node_resources(limits, env)
            if lacking:
                self.outcome["resources_unavailable"] = lacking
                return
            env.update(add)
            if add:
                self.outcome["resources"] = add
        elif meta.get("checkpointable"):  # its first SIGTERM may be a preemption's
            env[jobfiles.TERM_WAITS_ENV] = "1"
        self.outcome["threads"] = thread_count(env)
        python = meta["python"]
        worker = self.path(meta.get("worker", jobfiles.WORKER_SCRIPT))
        # -u: what the function prints reaches the stdout file at once (live logs, nothing lost
        # in a buffer when the process is killed)
        argv = [python, "-X", "faulthandler", "-u", worker, self.jobdir]
        self.outcome["argv"] = argv
        # Under Slurm the job's cgroup enforces --mem; where nothing does (no cgroup limit,
        # jobacct_gather/none), this supervisor does: it sums the resident memory of VENV2's
        # session every MEM_CHECK_EVERY seconds and kills it over the limit, so a limit is
        # never silently ignored. When Slurm kills over-limit steps itself (OverMemoryKill,
        # seen by gpuctl at submit), its verdict is left to it.
        cg_limit = (self.outcome["cgroup_before"] or {}).get("limit_bytes")
        slurm_enforces = under_slurm and limits.get("mem_enforced_by") == "slurm"
        mem_watch = mem_bytes if (mem_bytes and not slurm_enforces
                                  and (not under_slurm or not cg_limit)) else None
        self.outcome["mem_watch_bytes"] = mem_watch

        # A checkpointable function outside Slurm gets the warning Slurm's --signal would send
        warn_at = None  # type: Optional[float]
        if meta.get("checkpointable") and not under_slurm and time_limit:
            warn_at = max(0.0, float(time_limit) - float(limits.get("warning_s") or 60))
        while True:
            self._attempt(argv, env, meta, time_limit, grace, mem_watch, warn_at)
            if not self._next_attempt(limits, under_slurm):
                return

    def _attempt(self, argv: List[str], env: Dict[str, str], meta: Dict[str, Any],
                 time_limit: Optional[float], grace: float, mem_watch: Optional[int],
                 warn_at: Optional[float]) -> None:
        """One run of VENV2: start it, watch it (limits, signals, heartbeats) until it ends."""
        python = argv[0]

        def preexec() -> None:
            # Back to default dispositions in the child; VENV2 must see TERM as TERM. USR1 and
            # USR2 are ignored until the worker sets its handlers: a warning or a stack-dump
            # request that comes while Python starts must not kill it (an ignored signal stays
            # ignored across exec; a handled one is reset for the function's own children).
            for name in STOPPING + ("SIGCHLD",):
                signal.signal(getattr(signal, name), signal.SIG_DFL)
            for name in FORWARDED:
                signal.signal(getattr(signal, name), signal.SIG_IGN)

        self.outcome["phase"] = "start"
        self.outcome["cwd"] = meta.get("cwd") or self.jobdir  # where relative paths resolve
        out = open(self.path(jobfiles.STDOUT), "ab")
        err = open(self.path(jobfiles.STDERR), "ab")
        try:
            # Its own session; SIGKILL if the supervisor dies (no orphan jobs).
            self.child = proc.spawn(argv, stdout=out, stderr=err, env=env,
                                    cwd=self.outcome["cwd"], preexec=preexec)
        except OSError as e:
            self.outcome["start_error"] = {
                "errno": e.errno, "errno_name": errno.errorcode.get(e.errno or 0, ""),
                "message": e.strerror or str(e), "python": python}
            return
        finally:
            out.close()
            err.close()
        child = self.child
        self.outcome["venv2_pid"] = child.pid
        self.outcome["phase"] = "running"
        started = time.monotonic()
        next_beat = 0.0
        next_mem = 0.0
        peak_seen = 0
        while child.returncode is None:
            now = time.monotonic()
            if mem_watch and now >= next_mem and not self.outcome.get("mem_limit_exceeded"):
                next_mem = now + MEM_CHECK_EVERY
                used_kb = _session_rss_kb(child.pid)
                peak_seen = max(peak_seen, used_kb)
                if used_kb * 1024 > int(mem_watch):
                    # over the limit: no grace (it would only grow), the whole session goes
                    self.outcome["mem_limit_exceeded"] = {
                        "rss_kb": used_kb, "limit_bytes": int(mem_watch),
                        "after_s": round(now - started, 3)}
                    self.stop_reason = self.stop_reason or "mem_limit"
                    self.outcome["stop_reason"] = self.stop_reason
                    self._killpg(signal.SIGKILL)
            self._resolve_stop()
            if self.stop_reason is None and os.path.exists(self.path(jobfiles.CANCEL)):
                self.stop_reason = "cancelled"
            if (warn_at is not None and self.stop_reason is None and now - started >= warn_at
                    and not self.outcome.get("warned") and self._worker_running()):
                self.outcome["warned"] = True  # as Slurm's --signal=B:USR1@N does
                self.pending_forward.append(signal.SIGUSR1)
            if (self.stop_reason is None and time_limit
                    and now - started > float(time_limit)):
                self.stop_reason = "time_limit"
            if self.stop_reason and self.stop_at is None:
                self.stop_at = now
                self.kill_at = now + grace
                self.outcome["stop_reason"] = self.stop_reason
                self.outcome["stop_requested_after_s"] = round(now - started, 3)
                if self.stop_reason == "preempted" and meta.get("checkpointable"):
                    # it checkpoints (or, declining, is killed after the grace)
                    self.pending_forward.append(signal.SIGUSR1)
                else:
                    if self.stop_reason == "time_limit" or (
                            self.stop_reason == "cancelled" and self.outcome["slurm_job_id"]):
                        # where a job that hangs waits (Slurm's time limit comes as a TERM)
                        self._dump_stacks(child.pid)
                    self._killpg(signal.SIGTERM)
            if self.kill_at is not None and now >= self.kill_at and not self.outcome.get(
                    "escalated_to_kill"):
                self.outcome["escalated_to_kill"] = True
                self._killpg(signal.SIGKILL)
            while self.pending_forward:
                # To VENV2's Python only: the function's own children (data loaders, servers)
                # would die of a USR1/USR2 meant for the worker's handlers.
                signum = self.pending_forward.pop(0)
                self.outcome.setdefault("forwarded", []).append(signal.Signals(signum).name)
                try:
                    os.kill(child.pid, signum)
                except OSError:
                    pass
            if now >= next_beat:
                rss = _rss_kb(child.pid)
                if rss:
                    peak_seen = max(peak_seen, rss)
                jobfiles.write_json(self.path(jobfiles.HEARTBEAT), {
                    "t": _now(), "elapsed_s": round(now - started, 3), "venv2_pid": child.pid,
                    "rss_kb": rss})
                next_beat = now + HEARTBEAT_EVERY
            if self._reap(block=False):
                break
            waits = [next_beat - now, 1.0]
            if self.kill_at is not None and not self.outcome.get("escalated_to_kill"):
                waits.append(max(0.0, self.kill_at - now))
            if time_limit and self.stop_reason is None:
                waits.append(max(0.0, started + float(time_limit) - now + 0.01))
            if warn_at is not None and not self.outcome.get("warned"):
                # after the moment, until the function runs (its handler is set): 0.1 s polls
                waits.append(max(0.1, started + warn_at - now))
            if mem_watch and not self.outcome.get("mem_limit_exceeded"):
                waits.append(max(0.0, next_mem - now))
            try:
                select.select([self.wake_r], [], [], max(0.0, min(waits)))
            except (OSError, select.error):
                pass
            try:
                while os.read(self.wake_r, 512):
                    pass
            except OSError:
                pass
        self.outcome["phase"] = "exited"
        self.outcome["run_s"] = round(time.monotonic() - started, 3)
        if peak_seen and not self.outcome.get("peak_rss_kb"):
            self.outcome["peak_rss_kb"] = peak_seen
        if self.stop_reason is None:  # it ended on its own: what it left behind is named
            left = left_running()
            if left:
                self.outcome["left_running"] = left
        # Whatever the function left running in its session goes with it: no orphans.
        self._killpg(signal.SIGKILL)

    def _dump_stacks(self, pid: int) -> None:
        """Have VENV2 write every thread's stack (faulthandler, on SIGUSR2, into stderr) and
        keep it in the outcome (``stacks``): what a job that reached its time limit was
        waiting on. Waits at most STACK_DUMP_WAIT s for it; nothing when the function had not
        started (the worker's handler is not set before)."""
        if not self._worker_running():
            return
        err = self.path(jobfiles.STDERR)
        start = _size(err)
        try:
            os.kill(pid, signal.SIGUSR2)
        except OSError:
            return
        deadline = time.monotonic() + STACK_DUMP_WAIT
        size, quiet_since = start, time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(0.02)  # polling a file another process writes
            now_size = _size(err)
            if now_size != size:
                size, quiet_since = now_size, time.monotonic()
            elif size > start and time.monotonic() - quiet_since >= STACK_DUMP_QUIET:
                break
        if size <= start:
            return
        with open(err, "rb") as f:
            f.seek(start)
            text = f.read(MAX_STACK_DUMP).decode("utf-8", "replace")
        self.outcome["stacks"] = text

    def _worker_running(self) -> bool:
        """Whether this attempt's worker reached the function (its last phase is "running")."""
        for line in reversed(jobfiles.tail(self.path(jobfiles.STATUS), 2000).splitlines()):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("phase"):
                return bool(record["phase"] == "running")
        return False

    def _next_attempt(self, limits: Dict[str, Any], under_slurm: bool) -> bool:
        """After VENV2 ended: True to run the next attempt here, at once. A checkpointed attempt
        (the worker's CHECKPOINTED_EXIT and a ``checkpoint.pkl``) becomes a line of
        ``attempts.jsonl`` and its checkpoint the payload; under Slurm the job is requeued
        (``scontrol requeue``: Slurm starts the next attempt, maybe elsewhere) and this process
        ends without an outcome; outside Slurm the next attempt starts here, with a fresh time
        limit, up to ``max_requeues`` times."""
        self._resolve_stop()
        if (self.stop_reason is None and under_slurm
                and self.outcome.get("signal_name") == "SIGTERM"):
            # Slurm signals every process of the job: VENV2 may die of it before this process
            # hears its own, and only Slurm can say whether it was a preemption
            self._preempted_now()
        if self.stop_reason == "preempted":
            self._preempted()
            return False
        if (self.outcome.get("exit_code") != jobfiles.CHECKPOINTED_EXIT
                or not os.path.exists(self.path(jobfiles.CHECKPOINT))
                or self.stop_reason == "cancelled"):
            return False
        after = attempts.after_checkpoint(self.path, self.outcome, limits, under_slurm)
        if after == attempts.REQUEUED:
            self.requeued = True
        if after != attempts.HERE:
            return False
        self.stop_reason = self.stop_at = self.kill_at = None
        return True

    def _preempted(self) -> None:
        """This attempt was preempted and Slurm requeues the job itself (``attempts.preempted``:
        no outcome)."""
        attempts.preempted(self.path, self.outcome)
        self.requeued = True

    def _killpg(self, signum: int) -> None:
        if self.child is not None:
            proc.signal_group(self.child.pid, signum)

    def _reap(self, block: bool) -> bool:
        assert self.child is not None
        while True:
            try:
                pid, status, usage = os.wait4(self.child.pid, 0 if block else os.WNOHANG)
            except ChildProcessError:
                return True
            except InterruptedError:
                continue
            break
        if pid == 0:
            return False
        self.child.returncode = -1  # mark reaped for Popen; the real values are below
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            self.outcome["signal"] = sig
            try:
                self.outcome["signal_name"] = signal.Signals(sig).name
            except ValueError:
                self.outcome["signal_name"] = "signal %d" % sig
            self.outcome["exit_code"] = None
            self.outcome["core_dumped"] = bool(os.WCOREDUMP(status))
        else:
            self.outcome["exit_code"] = os.WEXITSTATUS(status)
            self.outcome["signal"] = None
        self.outcome["peak_rss_kb"] = usage.ru_maxrss  # kilobytes on Linux
        self.outcome["cpu_user_s"] = round(usage.ru_utime, 3)
        self.outcome["cpu_sys_s"] = round(usage.ru_stime, 3)
        return True


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if len(argv) == 2 and argv[0] == "--build-env":
        spec = jobfiles.read_json(argv[1])
        if not isinstance(spec, dict):
            sys.stdout.write(json.dumps({"ok": False, "error": "unreadable spec %s" % argv[1]}))
            return 2
        try:
            result = build_env(spec)
        except Exception as e:
            result = {"ok": False, "error": "%s: %s" % (type(e).__name__, e),
                      "traceback": traceback.format_exc()}
        sys.stdout.write(json.dumps(result) + "\n")
        return 0 if result.get("ok") else 1
    if len(argv) != 1 or argv[0].startswith("-"):
        sys.stderr.write("usage: supervisor JOBDIR | supervisor --build-env SPEC.json\n")
        return 2
    return keep(argv[0], Supervisor)


if __name__ == "__main__":
    sys.exit(main())
