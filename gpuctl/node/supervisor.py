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

Children start through ``proc.spawn`` (own session, SIGKILL when the supervisor dies). There is
no liveness timeout here on purpose: a job outlives the link that submitted it (a network
partition, gpuctl closed); only its own limits, a cancel or the scheduler end it. File names and
formats come from ``jobfiles``.

``python3 supervisor.py --build-env SPEC.json`` builds a VENV2 environment (see ``build_env``) and
prints one JSON line.
"""

import errno
import fcntl
import hashlib
import json
import os
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
    from . import jobfiles, proc
else:
    try:
        from . import jobfiles, proc
    except ImportError:  # a script in a job folder: copies of the node modules sit beside it
        from gpuctl_runner import jobfiles, proc

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


def cgroup_memory() -> Dict[str, Any]:
    """Memory limit, usage peak and OOM-kill count of this process's cgroup (v1 or v2)."""
    version, path = _cgroup_dirs()
    info = {"version": version, "path": path}  # type: Dict[str, Any]
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


def task_folder(jobdir: str, outcome: Dict[str, Any]) -> str:
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


def _first_node(environ: Dict[str, str]) -> str:
    """The allocation's first node by name (``scontrol show hostnames``), else this one."""
    try:
        out = subprocess.check_output(
            ["scontrol", "show", "hostnames", environ.get("SLURM_JOB_NODELIST", "")],
            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, timeout=30)
        names = out.decode("utf-8", "replace").split()
    except (OSError, subprocess.SubprocessError):
        names = []
    return names[0] if names else environ.get("SLURMD_NODENAME") or socket.gethostname()


# --- the job -------------------------------------------------------------------------------


def _rss_kb(pid: int) -> Optional[int]:
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024


def _session_rss_kb(sid: int) -> int:
    """Resident memory of every process of session ``sid`` (VENV2 and what it started), in KiB.

    Resident, not virtual: CUDA maps far more address space than it uses, so an address-space
    limit (RLIMIT_AS) would break it where this does not."""
    total = 0
    try:
        names = os.listdir("/proc")
    except OSError:
        return 0
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as f:
                stat = f.read()
            # after the command's closing parenthesis: state ppid pgrp session ...
            fields = stat[stat.rindex(b")") + 2:].split()
            if int(fields[3]) != sid:
                continue
            with open("/proc/%s/statm" % name, "rb") as f:
                total += int(f.read().split()[1]) * PAGE_KB
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or not ours to read
    return total


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
        }  # type: Dict[str, Any]
        self.stop_reason = None  # type: Optional[str]
        self.stop_at = None  # type: Optional[float]
        self.kill_at = None  # type: Optional[float]
        self.child = None  # type: Optional[subprocess.Popen[bytes]]
        self.pending_forward = []  # type: List[int]
        self.wake_r = -1
        self.wake_w = -1

    def path(self, name: str) -> str:
        """The path of job file ``name`` (a ``jobfiles`` name)."""
        return os.path.join(self.jobdir, name)

    def _on_stop(self, signum: int, frame: Any) -> None:
        if self.stop_reason is None:
            self.stop_reason = "cancelled"
            self.outcome["stop_signal"] = signal.Signals(signum).name

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

    def run(self) -> Dict[str, Any]:
        try:
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
        self._install_signals()
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
            if self.stop_reason:
                return
            env = new_env
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

        def preexec() -> None:
            # Back to default dispositions in the child; VENV2 must see TERM as TERM.
            for name in STOPPING + FORWARDED + ("SIGCHLD",):
                signal.signal(getattr(signal, name), signal.SIG_DFL)

        self.outcome["phase"] = "start"
        out = open(self.path(jobfiles.STDOUT), "ab")
        err = open(self.path(jobfiles.STDERR), "ab")
        try:
            # Its own session; SIGKILL if the supervisor dies (no orphan jobs).
            self.child = proc.spawn(argv, stdout=out, stderr=err, env=env,
                                    cwd=meta.get("cwd") or self.jobdir, preexec=preexec)
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
            if self.stop_reason is None and os.path.exists(self.path(jobfiles.CANCEL)):
                self.stop_reason = "cancelled"
            if (self.stop_reason is None and time_limit
                    and now - started > float(time_limit)):
                self.stop_reason = "time_limit"
            if self.stop_reason and self.stop_at is None:
                self.stop_at = now
                self.kill_at = now + grace
                self.outcome["stop_reason"] = self.stop_reason
                self.outcome["stop_requested_after_s"] = round(now - started, 3)
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
        # Whatever the function left running in its session goes with it: no orphans.
        self._killpg(signal.SIGKILL)

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
            base_python: Optional[str] = None) -> str:
    """Content hash naming an environment: the same (Python, packages) is built once."""
    blob = json.dumps([str(python_version), sorted(packages), bool(system_site_packages)]
                      + ([base_python] if base_python else []))
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


_PROBE = ("import sys, json\n"
          "try:\n import cloudpickle; cp = cloudpickle.__version__\n"
          "except Exception: cp = None\n"
          "print(json.dumps({'python': list(sys.version_info[:3]), 'cloudpickle': cp, "
          "'executable': sys.executable}))\n")


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
    "methods": ["uv", "conda", "venv"]}. The folder is ``root/<key>``; a file lock serialises
    builders; ``.gpuctl-ready`` marks a build whose probe succeeded. Result: {"ok": true,
    "python": path, "key", "method", "probe"} or {"ok": false, "error", "log"}.
    """
    root = os.path.expanduser(spec["root"])
    version = str(spec["python"])
    packages = list(spec.get("packages") or [])
    ssp = bool(spec.get("system_site_packages"))
    base = spec.get("base_python")
    key = env_key(version, packages, ssp, base)
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
                          cached=True)
            return result
        if os.path.isdir(envdir):
            shutil.rmtree(envdir, ignore_errors=True)
        with open(log_path, "w") as log:
            method, ok = _build(envdir, version, packages, ssp, spec.get("methods"), log, base)
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
        jobfiles.write_json(ready, {"method": method, "probe": info, "built_at": _now(), "spec": spec})
        result.update(ok=True, method=method, probe=info, cached=False)
        return result


def _step(argv: List[str], log: Any) -> bool:
    log.write("$ %s\n" % " ".join(argv))
    log.flush()
    try:
        rc = subprocess.call(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    except OSError as e:
        log.write("cannot run %s: %s\n" % (argv[0], e))
        rc = 127
    log.write("# exit %d\n" % rc)
    log.flush()
    return rc == 0


def _build(envdir: str, version: str, packages: List[str], ssp: bool,
           methods: Optional[List[str]], log: Any,
           base_python: Optional[str] = None) -> Tuple[str, bool]:
    methods = list(methods or ("uv", "conda", "venv"))
    py = os.path.join(envdir, "bin", "python")
    tried = []  # type: List[str]
    for method in methods:
        if method == "uv" and shutil.which("uv"):
            argv = ["uv", "venv", "--python", version, envdir]
            if ssp:
                argv.insert(2, "--system-site-packages")
            ok = _step(argv, log) and (not packages or _step(
                ["uv", "pip", "install", "--python", py] + packages, log))
            return "uv", ok
        if method == "conda" and shutil.which("conda"):
            # The env's own bin/python installs packages: no `conda run`, no activation.
            ok = _step([str(shutil.which("conda")), "create", "-y", "-q", "-p", envdir,
                        "python=%s" % version, "pip"], log) and (not packages or _step(
                            [py, "-m", "pip", "install", "-q"] + packages, log))
            return "conda", ok
        if method == "venv":
            base = os.path.expanduser(base_python) if base_python else _find_python(version)
            if base is None:
                tried.append("no python%s on PATH or in ~/.pyenv" % version)
                continue
            argv = [base, "-m", "venv", envdir]
            if ssp:
                argv.insert(3, "--system-site-packages")
            ok = _step(argv, log) and (not packages or _step(
                [py, "-m", "pip", "install", "-q", "--disable-pip-version-check"] + packages,
                log))
            return "venv", ok
        tried.append("%s not available" % method)
    log.write("no way to build Python %s here: %s\n" % (version, "; ".join(tried)))
    return "none", False


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
    outcome = Supervisor(argv[0]).run()
    return 0 if outcome.get("exit_code") == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
