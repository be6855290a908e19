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

In front of the supervisor stays its keeper (``keep``): the process the backend started, a child
subreaper that forked the supervisor and forwards the job's signals to it. When the supervisor is
killed (``kill -9``, the OOM killer), VENV2 dies of its parent-death signal, what the function
started reparents to the keeper, and the keeper ends it all and writes an outcome that names the
signal.

Children start through ``proc.spawn`` (own session, SIGKILL when the supervisor dies). There is
no liveness timeout here on purpose: a job outlives the link that submitted it (a network
partition, gpuctl closed); only its own limits, a cancel or the scheduler end it. File names and
formats come from ``jobfiles``.

``python3 supervisor.py --build-env SPEC.json`` builds a VENV2 environment (see ``build_env``) and
prints one JSON line.
"""

import configparser
import errno
import fcntl
import hashlib
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

if TYPE_CHECKING:
    from . import jobfiles, proc, readers
    from .readers.procs import process_command
else:
    try:
        from . import jobfiles, proc, readers
        from .readers.procs import process_command
    except ImportError:  # a script in a job folder: copies of the node modules sit beside it
        from gpuctl_runner import jobfiles, proc, readers
        from gpuctl_runner.readers.procs import process_command

DEFAULT_GRACE = 10.0
HEARTBEAT_EVERY = 2.0
MEM_CHECK_EVERY = 0.2  # seconds between two sums of the job's resident memory (mem= outside Slurm)
FORWARDED = ("SIGUSR1", "SIGUSR2")
STOPPING = ("SIGTERM", "SIGINT", "SIGHUP")


def _now() -> float:
    return time.time()


# --- cgroups -------------------------------------------------------------------------------


def _read_int(path: str) -> Optional[int]:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _read_keyed(path: str) -> Dict[str, int]:
    out = {}  # type: Dict[str, int]
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2:
                    try:
                        out[parts[0]] = int(parts[1])
                    except ValueError:
                        pass
    except OSError:
        pass
    return out


def _cgroup_dirs() -> Tuple[Optional[int], Optional[str]]:
    """(version, directory) of this process's memory cgroup, or (None, None)."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None, None
    v1_path = v2_path = None  # type: Optional[str]
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2_path = parts[2]
        elif "memory" in parts[1].split(","):
            v1_path = parts[2]
    mounts = []  # type: List[Tuple[str, str, str, str]]
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields = left.split()
                rfields = right.split()
                if len(fields) >= 5 and rfields:
                    mounts.append((fields[3], fields[4], rfields[0], rfields[-1]))
    except OSError:
        pass
    for version, want in ((1, v1_path), (2, v2_path)):
        if want is None:
            continue
        for root, point, fstype, opts in mounts:
            if version == 1 and not (fstype == "cgroup" and "memory" in opts.split(",")):
                continue
            if version == 2 and fstype != "cgroup2":
                continue
            rel = want
            if root != "/" and (want == root or want.startswith(root + "/")):
                rel = want[len(root):]
            candidate = os.path.join(point, rel.lstrip("/"))
            if os.path.isdir(candidate):
                return version, candidate
            if os.path.isdir(point):
                return version, point
    return None, None


def cgroup_memory() -> "jobfiles.CgroupMemory":
    """Memory limit, usage peak and OOM-kill count of this process's cgroup (v1 or v2)."""
    version, path = _cgroup_dirs()
    info = {"version": version, "path": path}  # type: jobfiles.CgroupMemory
    if path is None:
        return info
    if version == 2:
        info["limit_bytes"] = _read_int(os.path.join(path, "memory.max"))
        info["peak_bytes"] = _read_int(os.path.join(path, "memory.peak"))
        events = _read_keyed(os.path.join(path, "memory.events"))
        info["oom_kill"] = events.get("oom_kill")
        info["oom"] = events.get("oom")
    else:
        limit = _read_int(os.path.join(path, "memory.limit_in_bytes"))
        # v1 reports "no limit" as a huge page-rounded number.
        info["limit_bytes"] = limit if limit is not None and limit < (1 << 60) else None
        info["peak_bytes"] = _read_int(os.path.join(path, "memory.max_usage_in_bytes"))
        control = _read_keyed(os.path.join(path, "memory.oom_control"))
        info["oom_kill"] = control.get("oom_kill")
        info["failcnt"] = _read_int(os.path.join(path, "memory.failcnt"))
    return info


# --- a task of a job of several (Slurm nodes x tasks_per_node, started by srun) -------------

MASTER_PORTS = (15000, 30000)  # below Linux's ephemeral ports (32768-60999), above well-known


def task_folder(jobdir: str, outcome: "jobfiles.Outcome") -> str:
    """Where this supervisor's files go: ``jobdir``, or for one task of a job of several its
    rank's own folder (``SLURM_PROCID``; made with links to the job's inputs), so that ranks
    never write each other's files. Raises OSError when the folder cannot be made."""
    meta = jobfiles.read_json(os.path.join(jobdir, jobfiles.META))
    rank = os.environ.get("SLURM_PROCID")
    if jobfiles.task_count(meta) < 2 or rank is None or not rank.isdigit():
        return jobdir
    outcome["rank"] = int(rank)
    return jobfiles.make_task_folder(jobdir, int(rank))


def rendezvous_env(meta: Dict[str, Any], environ: Dict[str, str]) -> Dict[str, str]:
    """torch.distributed's ``env://`` variables for one task of a job of several, from what
    srun set for it: RANK, LOCAL_RANK, NODE_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR (the
    node srun was started from: the batch step's, the allocation's first node) and MASTER_PORT
    (from the Slurm job id: the same in every task, different for jobs that share a node).
    Empty for a job of one task."""
    tasks = jobfiles.task_count(meta)
    if tasks < 2:
        return {}
    job_id = environ.get("SLURM_JOB_ID", "0")
    low, high = MASTER_PORTS
    port = low + (int(job_id) if job_id.isdigit() else 0) % (high - low)
    master = environ.get("SLURM_LAUNCH_NODE_IPADDR") or _first_node(environ)
    return {
        "RANK": environ.get("SLURM_PROCID", "0"),
        "LOCAL_RANK": environ.get("SLURM_LOCALID", "0"),
        "NODE_RANK": environ.get("SLURM_NODEID", "0"),
        "WORLD_SIZE": str(tasks),
        "LOCAL_WORLD_SIZE": str((meta.get("limits") or {}).get("tasks_per_node") or 1),
        "MASTER_ADDR": master,
        "MASTER_PORT": str(port),
    }


def _output(argv: List[str], env: Optional[Dict[str, str]] = None,
            timeout: float = 60) -> Tuple[int, str]:
    """Run a node tool: (exit status, its stdout and stderr as text); -1 and why when it cannot
    start or does not answer within ``timeout`` seconds."""
    try:
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, env=env)
    except OSError as e:
        return -1, "%s: %s" % (type(e).__name__, e)
    try:
        out = p.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        return -1, "%s did not answer in %d s" % (argv[0], timeout)
    return p.returncode, out.decode("utf-8", "replace").strip()


def scontrol(*args: str, timeout: float = 60) -> Tuple[int, str]:
    """Run ``scontrol ARGS`` on this node: (exit status, its output). The node side's only Slurm
    command (the login side's go through ``gpuctl.reach.slurm``, which a node's Python 3.6
    cannot import): ``show hostnames`` for the rendezvous, ``requeue`` after a checkpoint,
    ``show job`` to tell a preemption from a cancel."""
    return _output(["scontrol"] + list(args), timeout=timeout)


def slurm_preemption(job_id: str, restarts: int) -> Optional[Dict[str, str]]:
    """Whether Slurm is preempting (or requeuing) job ``job_id``, asked when a SIGTERM came:
    the evidence (``scontrol -o show job`` fields) or None (a cancel, the time limit, or Slurm
    did not answer). A preemption with a grace time sets the job's PreemptTime; once the grace
    is over Slurm requeues the job before it signals it, so its Restarts count is above
    ``restarts`` (this run's ``SLURM_RESTART_COUNT``). A cancel or a time limit does neither."""
    rc, out = scontrol("-o", "show", "job", job_id, timeout=10)
    if rc != 0:
        return None
    fields = {}  # type: Dict[str, str]
    for word in out.split():
        key, sep, value = word.partition("=")
        if sep and key in ("JobState", "Restarts", "PreemptTime"):
            fields.setdefault(key, value)
    if fields.get("PreemptTime", "None") not in ("None", "Unknown", "N/A", ""):
        return fields
    count = fields.get("Restarts", "")
    if count.isdigit() and int(count) > restarts:
        return fields
    return None


def _first_node(environ: Dict[str, str]) -> str:
    """The allocation's first node by name (``scontrol show hostnames``), else this one."""
    rc, out = scontrol("show", "hostnames", environ.get("SLURM_JOB_NODELIST", ""))
    names = out.split() if rc == 0 else []
    return names[0] if names else environ.get("SLURMD_NODENAME") or socket.gethostname()


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


THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
               "NUMEXPR_NUM_THREADS")


def _node_gpus(env: Dict[str, str]) -> Tuple[Optional[List[Tuple[str, str, bool]]], str]:
    """(index, uuid, busy) of each of the node's GPUs through the node's readers (NVML, else
    nvidia-smi: ``readers.open_reader``), read with the job's environment (a setup line's PATH
    finds nvidia-smi); busy: a process uses it. None and the readers' reason when neither
    works."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        reader, note = readers.open_reader()
        if reader is None:
            return None, note or ""
        try:
            rows = reader.sample(slow=False)
        finally:
            reader.close()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    found = []  # type: List[Tuple[str, str, bool]]
    for row in rows:
        if isinstance(row.get("index"), int):
            found.append((str(row["index"]), str(row.get("uuid") or ""),
                          bool(row.get("processes"))))
    return found, ""


def node_resources(limits: Dict[str, Any], env: Dict[str, str]) -> Tuple[Dict[str, str], str]:
    """What ``gpus=`` and ``cpus=`` mean where no scheduler allocates them (local, SSH).

    gpus=N: N of the node's GPUs in ``CUDA_VISIBLE_DEVICES`` (indices in PCI order, with
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so CUDA counts them the same way), the GPUs without compute
    processes first; a ``CUDA_VISIBLE_DEVICES`` the environment already has (the config's env,
    a setup line) is the set to choose from. The GPUs are read as the agent reads them (NVML,
    else nvidia-smi). cpus=N: the usual thread-count variables set to N
    (those the job's env does not set itself). Nothing is reserved: two jobs started at the same
    moment can pick the same idle GPU. Returns (environment additions, "" or why the node cannot
    give what was asked).
    """
    add = {}  # type: Dict[str, str]
    cpus = int(limits.get("cpus") or 0)
    if cpus:
        try:
            have = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            have = os.cpu_count() or 1
        if cpus > have:
            return {}, "cpus=%d asked, and this node lets the job use %d CPU(s)" % (cpus, have)
        for name in THREAD_VARS:
            if name not in env:
                add[name] = str(cpus)
    gpus = int(limits.get("gpus") or 0)
    if not gpus:
        return add, ""
    visible = [g.strip() for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
    if "CUDA_VISIBLE_DEVICES" in env and not visible:
        return {}, "gpus=%d asked, and CUDA_VISIBLE_DEVICES is empty in the job's environment" % gpus
    found, why = _node_gpus(env)
    if found is None:
        if "nvidia-smi is not on PATH" in why:
            return {}, ("gpus=%d asked, and this node has no NVML and no nvidia-smi on PATH (no "
                        "NVIDIA driver?)" % gpus)
        return {}, "gpus=%d asked, and the GPUs cannot be read here: %s" % (
            gpus, why.rpartition("nvidia-smi: ")[2].rstrip(")"))
    if visible:
        found = [g for g in found if g[0] in visible or g[1] in visible]
    free = [i for i, _, busy in found if not busy] + [i for i, _, busy in found if busy]
    if gpus > len(free):
        where = " of CUDA_VISIBLE_DEVICES=%s" % ",".join(visible) if visible else ""
        return {}, "gpus=%d asked, and this node has %d GPU(s)%s" % (gpus, len(free), where)
    add["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    add["CUDA_VISIBLE_DEVICES"] = ",".join(free[:gpus])
    return add, ""


def thread_count(env: Dict[str, str]) -> "jobfiles.ThreadCount":
    """How many threads the job's math libraries (torch, numpy's BLAS, OpenMP) start by
    default: ``OMP_NUM_THREADS`` when the job's environment sets it (``cpus=``, the config's
    env, a setup line), else the CPUs the job may run on (its affinity: under Slurm, its
    allocation)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    value = env.get("OMP_NUM_THREADS", "").strip()
    if value.isdigit() and int(value) > 0:
        return {"count": int(value), "source": "OMP_NUM_THREADS", "cpus": cpus}
    return {"count": cpus, "source": "cpus", "cpus": cpus}


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

    def _install_signals(self) -> None:
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
                self._install_signals()
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
            if not self.requeued:  # Slurm starts the next attempt; it writes the outcome
                jobfiles.write_json(self.path(jobfiles.OUTCOME), self.outcome)
        return self.outcome

    def _run(self) -> None:
        os.chmod(self.jobdir, 0o700)
        self.jobdir = task_folder(self.jobdir, self.outcome)
        jobfiles.write_json(self.path(jobfiles.PIDFILE), {
            "pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0),
            "hostname": self.outcome["hostname"], "started_at": self.outcome["started_at"]})
        meta = jobfiles.read_json(self.path(jobfiles.META))
        if not isinstance(meta, dict):
            self.outcome["supervisor_error"] = "%s missing or unreadable in %s" % (
                jobfiles.META, self.jobdir)
            return
        self._begin()
        self.outcome["cgroup_before"] = cgroup_memory()
        limits = meta.get("limits") or {}
        time_limit = limits.get("time_limit_s")
        grace = float(limits.get("grace_s") or DEFAULT_GRACE)
        mem_bytes = limits.get("mem_bytes")
        under_slurm = bool(self.outcome["slurm_job_id"])
        env = dict(os.environ)
        env.update(rendezvous_env(meta, env))
        env.update(meta.get("env") or {})
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
        ckpt = self.path(jobfiles.CHECKPOINT)
        if (self.outcome.get("exit_code") != jobfiles.CHECKPOINTED_EXIT
                or not os.path.exists(ckpt) or self.stop_reason == "cancelled"):
            return False
        done = jobfiles.parse_lines(jobfiles.tail(self.path(jobfiles.ATTEMPTS), 1 << 20))
        attempt = len(done) + 1
        limit = int(limits.get("max_requeues", 3))
        # preemptions are Slurm's doing, not the job's: only checkpoints count
        if sum(1 for a in done if a.get("reason") == "checkpoint") + 1 > limit:
            self.outcome["requeues_exhausted"] = {"attempts": attempt, "max_requeues": limit}
            return False
        record = {"attempt": attempt, "reason": "checkpoint", "ended_at": _now(),
                  "hostname": self.outcome["hostname"], "run_s": self.outcome.get("run_s"),
                  "slurm_job_id": self.outcome["slurm_job_id"]}
        os.replace(ckpt, self.path(jobfiles.PAYLOAD))
        jobfiles.append_line(self.path(jobfiles.ATTEMPTS), record)
        with open(self.path(jobfiles.STDOUT), "ab") as out:
            out.write(("--- gpuctl: attempt %d checkpointed, the job goes on from its checkpoint"
                       " ---\n" % attempt).encode())
        if under_slurm:
            job = os.environ.get("SLURM_JOB_ID", "")
            if os.environ.get("SLURM_ARRAY_TASK_ID"):
                job = "%s_%s" % (os.environ.get("SLURM_ARRAY_JOB_ID"),
                                 os.environ["SLURM_ARRAY_TASK_ID"])
            jobfiles.write_json(self.path(jobfiles.REQUEUE), record)
            rc, said = scontrol("requeue", job)
            if rc != 0:
                os.unlink(self.path(jobfiles.REQUEUE))
                self.outcome["requeue_error"] = "scontrol requeue %s: %s" % (job, said or rc)
                return False
            self.requeued = True
            return False
        # how this attempt ended goes (the next one says it again); one key a line, as mypy
        # checks each against jobfiles.Outcome only when it is spelled out
        self.outcome.pop("exit_code", None)
        self.outcome.pop("signal", None)
        self.outcome.pop("signal_name", None)
        self.outcome.pop("core_dumped", None)
        self.outcome.pop("stop_reason", None)
        self.outcome.pop("stop_requested_after_s", None)
        self.outcome.pop("escalated_to_kill", None)
        self.outcome.pop("warned", None)
        self.outcome.pop("forwarded", None)
        self.stop_reason = self.stop_at = self.kill_at = None
        self.outcome["attempt"] = attempt + 1
        return True

    def _preempted(self) -> None:
        """This attempt was preempted and Slurm requeues the job itself: a line of
        ``attempts.jsonl`` that says so (and whether the function checkpointed: then its
        checkpoint becomes the payload, else the next attempt starts over), the requeue marker
        for the next attempt, and no outcome."""
        ckpt = self.path(jobfiles.CHECKPOINT)
        checkpointed = (self.outcome.get("exit_code") == jobfiles.CHECKPOINTED_EXIT
                        and os.path.exists(ckpt))
        done = jobfiles.parse_lines(jobfiles.tail(self.path(jobfiles.ATTEMPTS), 1 << 20))
        attempt = len(done) + 1
        record = {"attempt": attempt, "reason": "preempted", "checkpointed": checkpointed,
                  "ended_at": _now(), "hostname": self.outcome["hostname"],
                  "run_s": self.outcome.get("run_s"), "exit_code": self.outcome.get("exit_code"),
                  "slurm_job_id": self.outcome["slurm_job_id"]}
        if checkpointed:
            os.replace(ckpt, self.path(jobfiles.PAYLOAD))
        jobfiles.append_line(self.path(jobfiles.ATTEMPTS), record)
        with open(self.path(jobfiles.STDOUT), "ab") as out:
            out.write(("--- gpuctl: attempt %d preempted, the job %s ---\n" % (
                attempt, "goes on from its checkpoint" if checkpointed else "starts over")
            ).encode())
        jobfiles.write_json(self.path(jobfiles.REQUEUE), record)
        self.requeued = True

    def _begin(self) -> None:
        """A job Slurm started again (after this supervisor's ``scontrol requeue``, or its own
        requeue of a preempted job): the marker goes, a previous outcome becomes an attempt."""
        marker = jobfiles.read_json(self.path(jobfiles.REQUEUE))
        if isinstance(marker, dict):
            os.unlink(self.path(jobfiles.REQUEUE))
            self.outcome["attempt"] = int(marker.get("attempt", 0)) + 1
        previous = jobfiles.read_json(self.path(jobfiles.OUTCOME))
        if isinstance(previous, dict):
            done = jobfiles.parse_lines(jobfiles.tail(self.path(jobfiles.ATTEMPTS), 1 << 20))
            jobfiles.append_line(self.path(jobfiles.ATTEMPTS), {
                "attempt": len(done) + 1, "reason": "requeued by the scheduler",
                "ended_at": previous.get("ended_at"), "hostname": previous.get("hostname"),
                "exit_code": previous.get("exit_code"),
                "stop_reason": previous.get("stop_reason"),
                "slurm_job_id": previous.get("slurm_job_id")})
            for name in (jobfiles.OUTCOME, jobfiles.ERROR):
                try:
                    os.unlink(self.path(name))
                except OSError:
                    pass
            self.outcome["attempt"] = len(done) + 2

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


# --- environments --------------------------------------------------------------------------


def env_key(python_version: str, packages: List[str], system_site_packages: bool = False,
            base_python: Optional[str] = None, requirements: str = "",
            conda_env: str = "") -> str:
    """Content hash naming an environment: the same (Python, packages, files) is built once."""
    blob = json.dumps([str(python_version), sorted(packages), bool(system_site_packages)]
                      + ([base_python] if base_python else [])
                      + ([["requirements", requirements]] if requirements else [])
                      + ([["conda_env", conda_env]] if conda_env else []))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _find_python(version: str) -> Optional[str]:
    """An interpreter of ``version`` (e.g. "3.11"): python3.11 on PATH, else pyenv's."""
    found = shutil.which("python%s" % version)
    if found:
        return found
    base = os.path.expanduser("~/.pyenv/versions")
    try:
        names = sorted(os.listdir(base), reverse=True)
    except OSError:
        names = []
    for name in names:
        if name == version or name.startswith(version + "."):
            candidate = os.path.join(base, name, "bin", "python")
            if os.path.exists(candidate):
                return candidate
    return None


# ``dists``: every distribution's version (pip's name), for the login side to compare with
# the versions of the distributions a payload holds objects of (numpy 1 against 2).
_PROBE = ("import sys, json\n"
          "try:\n import cloudpickle; cp = cloudpickle.__version__\n"
          "except Exception: cp = None\n"
          "try:\n import importlib.metadata as md\n"
          " ds = dict((d.metadata['Name'], d.version) for d in md.distributions()"
          " if d.metadata['Name'])\n"
          "except Exception: ds = {}\n"
          "print(json.dumps({'python': list(sys.version_info[:3]), 'cloudpickle': cp, "
          "'executable': sys.executable, 'dists': ds}))\n")


def probe(python: str) -> Dict[str, Any]:
    """Run a fixed probe in ``python``: its version and cloudpickle version, or an error."""
    try:
        out = subprocess.check_output([python, "-c", _PROBE], stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, timeout=120)
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        text = getattr(e, "output", None)
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        return {"error": "%s: %s" % (type(e).__name__, e), "output": text or ""}
    try:
        found = json.loads(out.decode().strip().splitlines()[-1])
        return found if isinstance(found, dict) else {"error": "probe printed %r" % (found,)}
    except (ValueError, IndexError):
        return {"error": "probe printed no JSON", "output": out.decode("utf-8", "replace")}


def build_env(spec: Dict[str, Any]) -> Dict[str, Any]:
    """Build (once) the VENV2 environment ``spec`` describes; return a result dict.

    spec: {"root": dir, "python": "3.11", "packages": [...], "system_site_packages": bool,
    "methods": ["uv", "conda", "venv"], "requirements": text of a requirements file,
    "conda_env": text of an environment.yml}. The files are written beside the folder
    (``<key>.requirements.txt``, ``<key>.environment.yml``) for the tools to read. The folder is ``root/<key>``; a file lock serialises
    builders; ``.gpuctl-ready`` marks a build whose probe succeeded. Result: {"ok": true,
    "python": path, "key", "method", "probe"} or {"ok": false, "error", "log"}.
    """
    root = os.path.expanduser(spec["root"])
    version = str(spec["python"])
    packages = list(spec.get("packages") or [])
    ssp = bool(spec.get("system_site_packages"))
    base = spec.get("base_python")
    requirements = str(spec.get("requirements") or "")
    conda_env = str(spec.get("conda_env") or "")
    key = env_key(version, packages, ssp, base, requirements, conda_env)
    os.makedirs(root, exist_ok=True)
    envdir = os.path.join(root, key)
    log_path = envdir + ".log"
    ready = os.path.join(envdir, ".gpuctl-ready")
    result = {"key": key, "dir": envdir, "log": log_path,
              "python": os.path.join(envdir, "bin", "python")}  # type: Dict[str, Any]
    with open(envdir + ".lock", "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        if os.path.exists(ready):
            info = jobfiles.read_json(ready, {})
            result.update(ok=True, method=info.get("method"), probe=info.get("probe"),
                          cached=True, notes=info.get("notes") or [])
            return result
        if os.path.isdir(envdir):
            shutil.rmtree(envdir, ignore_errors=True)
        files = {}  # type: Dict[str, str]
        for name, text in (("requirements.txt", requirements), ("environment.yml", conda_env)):
            if text:
                files[name] = "%s.%s" % (envdir, name)
                with open(files[name], "w") as f:
                    f.write(text)
        notes = []  # type: List[str]
        with open(log_path, "w") as log:
            method, ok = _build(envdir, version, packages, ssp, spec.get("methods"), log, base,
                                files.get("requirements.txt"), files.get("environment.yml"),
                                notes)
        if not ok:
            shutil.rmtree(envdir, ignore_errors=True)
            result.update(ok=False, method=method, error="environment build failed (%s)" % method,
                          log_tail=jobfiles.tail(log_path, 3000))
            return result
        info = probe(result["python"])
        want = [int(x) for x in version.split(".")]
        if "error" in info or info.get("python", [])[:len(want)] != want:
            result.update(ok=False, method=method, probe=info,
                          error="probe of the new environment failed: %s" % (
                              info.get("error") or "python %s, wanted %s" % (
                                  info.get("python"), version)),
                          log_tail=jobfiles.tail(log_path, 3000))
            return result
        if notes:
            notes = [n + ": it has cloudpickle %s" % info.get("cloudpickle") for n in notes]
        jobfiles.write_json(ready, {"method": method, "probe": info, "built_at": _now(),
                                    "spec": spec, "notes": notes})
        result.update(ok=True, method=method, probe=info, cached=False, notes=notes)
        return result


def _step(argv: List[str], log: Any, env: Optional[Dict[str, str]] = None) -> bool:
    log.write("$ %s\n" % " ".join(argv))
    log.flush()
    try:
        rc = subprocess.call(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                             env=dict(os.environ, **env) if env else None)
    except OSError as e:
        log.write("cannot run %s: %s\n" % (argv[0], e))
        rc = 127
    log.write("# exit %d\n" % rc)
    log.flush()
    return rc == 0


def _tool(name: str) -> Optional[str]:
    """``name`` on PATH, else where its installer puts it (a non-login shell over SSH often lacks
    ``~/.local/bin`` on PATH)."""
    found = shutil.which(name)
    if found:
        return found
    for folder in ("~/.local/bin", "~/.cargo/bin", "~/micromamba/bin", "~/miniforge3/bin",
                   "~/mambaforge/bin", "~/miniconda3/bin", "~/anaconda3/bin"):
        candidate = os.path.join(os.path.expanduser(folder), name)
        if os.access(candidate, os.X_OK):
            return candidate
    return None


CONDA_TOOLS = ("micromamba", "mamba", "conda")


def conda_create_argv(tool: str, envdir: str, version: str,
                      env_file: Optional[str]) -> List[str]:
    """The command that makes a conda environment at ``envdir``: from ``env_file`` (an
    environment.yml) when there is one, else Python ``version`` and pip."""
    name = os.path.basename(tool)
    if env_file:
        if name == "micromamba":
            return [tool, "create", "-y", "-q", "-p", envdir, "-f", env_file]
        return [tool, "env", "create", "-q", "-p", envdir, "-f", env_file]
    return [tool, "create", "-y", "-q", "-p", envdir, "python=%s" % version, "pip"]


def _build(envdir: str, version: str, packages: List[str], ssp: bool,
           methods: Optional[List[str]], log: Any,
           base_python: Optional[str] = None, requirements: Optional[str] = None,
           conda_env: Optional[str] = None,
           notes: Optional[List[str]] = None) -> Tuple[str, bool]:
    """Build the environment with the first method of ``methods`` this node has; uv that
    cannot install (its index unreachable, say) hands over to the next method. ``notes``
    gathers what the user should hear about (a relaxed pin)."""
    methods = list(methods or ("uv", "conda", "venv"))
    notes = notes if notes is not None else []
    py = os.path.join(envdir, "bin", "python")
    extra = ["-r", requirements] if requirements else []
    pip = [py, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    tried = []  # type: List[str]
    failed = None  # type: Optional[str]
    if conda_env:
        methods = [m for m in methods if m == "conda"]
        if not methods:
            tried.append("an environment.yml needs the conda method")
    for method in methods:
        uv = _tool("uv") if method == "uv" else None
        if uv:
            wanted = os.path.expanduser(base_python) if base_python else version
            argv = [uv, "venv", "-q", "--python", wanted, envdir]
            if ssp:
                argv.insert(2, "--system-site-packages")
            flags, env, lines = uv_index_options(dict(os.environ))
            for line in lines:
                log.write(line + "\n")
            ok = _step(argv, log) and (not (packages or extra) or _install(
                [uv, "pip", "install", "-q", "--python", py] + flags, packages, extra, log,
                notes, env))
            if ok:
                return "uv", True
            failed = "uv"
            tried.append("uv failed (above)")
            log.write("# uv could not build the environment: trying the next way\n")
            shutil.rmtree(envdir, ignore_errors=True)
            continue
        conda = None
        if method == "conda":
            conda = next((t for t in map(_tool, CONDA_TOOLS) if t), None)
        if conda:
            # The env's own bin/python installs pip packages: no `conda run`, no activation.
            ok = _step(conda_create_argv(conda, envdir, version, conda_env), log) and (
                not (packages or extra) or _install(pip, packages, extra, log, notes))
            return os.path.basename(conda), ok
        if method == "venv":
            base = os.path.expanduser(base_python) if base_python else _find_python(version)
            if base is None:
                tried.append("no python%s on PATH or in ~/.pyenv" % version)
                continue
            argv = [base, "-m", "venv", envdir]
            if ssp:
                argv.insert(3, "--system-site-packages")
            ok = _step(argv, log) and (not (packages or extra) or _install(
                pip, packages, extra, log, notes))
            return "venv", ok
        tried.append("%s not found" % ("/".join(CONDA_TOOLS) if method == "conda" else method))
    log.write("no way to build Python %s here: %s\n" % (version, "; ".join(tried)))
    return failed or "none", False

# --- pip's configuration, for uv ---------------------------------------------------------------

# pip's settings that say where packages come from, and the `uv pip install` flag of each.
PIP_TO_UV = (("index-url", "--index-url"), ("extra-index-url", "--extra-index-url"),
             ("find-links", "--find-links"), ("trusted-host", "--allow-insecure-host"),
             ("constraint", "--constraint"))
# What says that uv was configured for this site itself: then pip's settings are not handed on.
UV_OWN = ("UV_INDEX_URL", "UV_DEFAULT_INDEX", "UV_INDEX", "UV_EXTRA_INDEX_URL", "UV_FIND_LINKS",
          "UV_NO_INDEX", "UV_CONFIG_FILE")


def _truthy(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


def other_tools_config_dirs(environ: Dict[str, str]) -> Tuple[str, str, List[str]]:
    """Where the node's own tools (pip, uv: not gpuctl, whose files ``gpuctl.paths`` places)
    read their configuration, by the XDG base directory rules: (home, the user's config
    folder, the system's config folders)."""
    home = environ.get("HOME") or os.path.expanduser("~")
    config_home = environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    dirs = [d for d in (environ.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(":") if d]
    return home, config_home, dirs


def pip_config_files(environ: Dict[str, str], etc: str = "/etc") -> List[str]:
    """The configuration files ``pip install`` reads, in pip's order (a later one wins): the
    global ones, the user's (unless PIP_CONFIG_FILE names a file that exists), PIP_CONFIG_FILE;
    none at all when PIP_CONFIG_FILE is os.devnull."""
    named = environ.get("PIP_CONFIG_FILE")
    if named == os.devnull:
        return []
    home, config_home, dirs = other_tools_config_dirs(environ)
    files = [os.path.join(d, "pip", "pip.conf") for d in dirs] + [os.path.join(etc, "pip.conf")]
    if not (named and os.path.exists(named)):
        files += [os.path.join(home, ".pip", "pip.conf"),
                  os.path.join(config_home, "pip", "pip.conf")]
    if named:
        files.append(named)
    return files


def pip_settings(environ: Dict[str, str], etc: str = "/etc") -> Dict[str, str]:
    """pip's configuration for ``pip install`` as pip itself resolves it: the files' [global]
    sections, then their [install] sections, then the PIP_* variables (names as in pip.conf)."""
    parsers = []
    for path in pip_config_files(environ, etc):
        parser = configparser.RawConfigParser()
        try:
            parser.read(path)
        except (configparser.Error, OSError, UnicodeDecodeError):
            continue
        parsers.append(parser)
    settings = {}  # type: Dict[str, str]
    for section in ("global", "install"):
        for parser in parsers:
            if parser.has_section(section):
                for key, value in parser.items(section):
                    settings[key.replace("_", "-")] = value
    for name, value in environ.items():
        if name.startswith("PIP_") and name != "PIP_CONFIG_FILE":
            settings[name[4:].lower().replace("_", "-")] = value
    return settings


def uv_own_settings(environ: Dict[str, str], etc: str = "/etc") -> List[str]:
    """Where uv has index settings of its own (UV_* variables, a uv.toml): named, for the log."""
    found = [name for name in UV_OWN if environ.get(name)]
    _, config_home, dirs = other_tools_config_dirs(environ)
    places = [config_home] + dirs + [etc]
    found += [p for p in (os.path.join(d, "uv", "uv.toml") for d in places) if os.path.exists(p)]
    return found


def uv_index_options(environ: Dict[str, str], etc: str = "/etc"
                     ) -> Tuple[List[str], Dict[str, str], List[str]]:
    """pip's package sources as ``uv pip install`` flags, so that a site whose mirror is
    configured for pip gets the same packages through uv. Returns (flags, environment, lines
    for the build log). Nothing is handed on when uv has settings of its own. ``etc``: where
    the system-wide pip.conf and uv/uv.toml are."""
    own = uv_own_settings(environ, etc)
    if own:
        return [], {}, ["# uv has package index settings of its own (%s): pip's are not handed "
                        "to it" % ", ".join(own)]
    settings = pip_settings(environ, etc)
    flags = []  # type: List[str]
    env = {}  # type: Dict[str, str]
    for key, flag in PIP_TO_UV:
        for value in (settings.get(key) or "").split():
            flags += [flag, value]
    if _truthy(settings.get("no-index", "")):
        flags.append("--no-index")
    # pip takes the best version over all its indexes; uv by default only looks at the first
    # index that has the package (an old mirror's copy would hide the version asked for)
    if settings.get("extra-index-url") and not environ.get("UV_INDEX_STRATEGY"):
        flags += ["--index-strategy", "unsafe-best-match"]
    if settings.get("cert") and not environ.get("SSL_CERT_FILE"):
        env["SSL_CERT_FILE"] = settings["cert"]
    if settings.get("client-cert") and not environ.get("SSL_CLIENT_CERT"):
        env["SSL_CLIENT_CERT"] = settings["client-cert"]
    lines = ["# pip's configuration handed to uv: %s" % " ".join(flags)] if flags else []
    lines += ["# pip's %s handed to uv as %s" % (k, v) for k, v in sorted(env.items())]
    return flags, env, lines


_PIN = re.compile(r"^cloudpickle==(\d+)\.(\d+)(\.[0-9A-Za-z.+-]*)?$")


def _install(argv: List[str], packages: List[str], extra: List[str], log: Any,
             notes: List[str], env: Optional[Dict[str, str]] = None) -> bool:
    """Install ``packages`` (and ``extra``: ``-r FILE``) with ``argv``. When the exact
    cloudpickle pin (the submitter's version) is not on the node's index, take the same minor
    release (a pickle of cloudpickle X.Y loads with any X.Y release) and say so."""
    start = log.tell()
    if _step(argv + packages + extra, log, env):
        return True
    pins = [p for p in packages if _PIN.match(p.strip())]
    if not pins:
        return False
    try:
        with open(log.name) as f:
            f.seek(start)
            said = f.read()
    except (OSError, AttributeError, TypeError):
        said = ""
    pin = pins[0].strip()
    if pin not in said:  # the install failed for another reason
        return False
    m = _PIN.match(pin)
    assert m is not None
    relaxed = "cloudpickle==%s.%s.*" % (m.group(1), m.group(2))
    log.write("# %s is not on this node's package index: taking the same minor release "
              "(%s)\n" % (pin, relaxed))
    notes.append("%s is not on the node's package index: VENV2 got the same minor release "
                 "(%s)" % (pin, relaxed))
    return _step(argv + [relaxed if p is pins[0] else p for p in packages] + extra, log, env)


# --- the keeper ------------------------------------------------------------------------------


def keep(jobdir: str) -> int:
    """Run the supervisor in a forked child and stay in front of it as a child subreaper.

    What a SIGKILL to the supervisor (an admin's ``kill -9``, the OOM killer) would leave behind,
    the keeper ends: VENV2 dies of its parent-death signal, and the processes the function
    started (data loaders, servers, daemons in sessions of their own) reparent here, the nearest
    subreaper left. The keeper then kills every descendant and, when the supervisor wrote no
    outcome, writes one that names the signal, so the report says what happened instead of
    "lost". Signals meant for the job (a cancel's SIGTERM, Slurm's USR1 warning) are forwarded to
    the supervisor; the supervisor gets SIGTERM (a cancel) if the keeper dies. Returns the exit
    status for ``main``. Where a process cannot become a subreaper the supervisor runs in this
    process.
    """
    if not proc.become_subreaper():
        outcome = Supervisor(jobdir).run()
        return 0 if outcome.get("exit_code") == 0 else 1
    names = STOPPING + FORWARDED
    sigs = set(getattr(signal, n) for n in names)
    # Blocked across the fork: a signal that arrives meanwhile waits for the right handler.
    signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    keeper = os.getpid()
    child = os.fork()
    if child == 0:
        code = 1
        try:
            sup = Supervisor(jobdir)
            sup._install_signals()
            signal.pthread_sigmask(signal.SIG_UNBLOCK, sigs)
            proc.set_death_signal(signal.SIGTERM, parent=keeper)
            code = 0 if sup.run().get("exit_code") == 0 else 1
        finally:
            os._exit(code)

    def forward(signum: int, frame: Any) -> None:
        try:
            os.kill(child, signum)
        except OSError:
            pass

    for name in names:
        signal.signal(getattr(signal, name), forward)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, sigs)
    status = 0
    while True:
        try:
            pid, status = os.waitpid(-1, 0)  # reaps the orphans that reparent here, too
        except ChildProcessError:
            break
        if pid == child:
            break
    for name in names:
        signal.signal(getattr(signal, name), signal.SIG_DFL)
    left = proc.kill_descendants()
    try:  # one task of several writes in its rank's folder, as its supervisor did
        jobdir = task_folder(os.path.abspath(jobdir), {})
    except OSError:
        pass
    outcome_path = os.path.join(os.path.abspath(jobdir), jobfiles.OUTCOME)
    requeue = os.path.join(os.path.abspath(jobdir), jobfiles.REQUEUE)
    if os.WIFSIGNALED(status) and not os.path.exists(outcome_path) and not os.path.exists(
            requeue):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = "signal %d" % sig
        beat = jobfiles.read_json(os.path.join(os.path.abspath(jobdir), jobfiles.HEARTBEAT), {})
        killed = {
            "supervisor_killed": {"signal": name, "pid": child,
                                  "last_heartbeat": (beat or {}).get("t")},
            "phase": "supervisor", "keeper_pid": keeper, "hostname": socket.gethostname(),
            "exit_code": None, "signal_name": None, "descendants_killed": len(left),
            "ended_at": _now(), "slurm_job_id": os.environ.get("SLURM_JOB_ID")
        }  # type: jobfiles.Outcome
        jobfiles.write_json(outcome_path, killed)
        return 1
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1


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
    return keep(argv[0])


if __name__ == "__main__":
    sys.exit(main())
