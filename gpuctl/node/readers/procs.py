"""Who runs a GPU process, and what it costs the host: /proc, shared by the NVML and smi readers.

Python 3.6, standard library only. ``ProcessNames`` keeps per pid what does not change (uid,
user, command line) and forgets pids that stop showing up, so a busy GPU costs two small /proc
reads per new process; what changes (``/proc/PID/stat``: parent, CPU time, resident memory,
start time) is read once per sample for each GPU process, through a descriptor kept open while
the pid stays known (one ``pread``; opening, reading and closing cost 0.07 ms against 0.04 ms on
an H100's VM). A descriptor names the process, not its number: once the process is gone its
reads fail (ESRCH), also when a new process takes the pid, which is then opened afresh. Host %CPU is the CPU time a process
used between two samples over the wall time between them, so the first sample of a process has
none (null).

The Slurm job of a GPU process is the ``job_NNN`` of its own cgroup's path (``/proc/PID/cgroup``:
Slurm's cgroup v1 ``/slurm/uid_U/job_NNN/step_S/...`` and v2
``/system.slice/slurmstepd.scope/job_NNN/step_S/...``), read once per process: the node tells
which job runs on which GPU even where Slurm's GPU numbering and the node's differ.

``signal_process`` is the agent's ``signal`` request: it sends SIGTERM, SIGINT or SIGKILL to a GPU process
of the agent's own user, and refuses anything else (see its docstring).
"""

import os
import pwd
import re
import signal
import time
from typing import Any, Dict, FrozenSet, Iterable, List, Optional, Set, Tuple

from ..proc import (
    CLOCK_TICKS, STAT_BYTES, KeptOpen, ProcStat, boot_time, parse_stat, read_stat)

MAX_COMMAND = 200  # characters: enough to tell jobs apart, small enough for one sample line
MAX_PARENTS = 64  # ancestors of GPU processes sent in one sample (a tree, not a process table)
MAX_DEPTH = 16  # ancestors followed up from one GPU process
PARENTS_EVERY_S = 5.0  # ... walked again this often while the GPU pids stay the same
SIGNALS = {"TERM": signal.SIGTERM, "INT": signal.SIGINT, "KILL": signal.SIGKILL}
SLURM_JOB_DIR = re.compile(r"/job_([0-9]{1,12})(?=/|$)")  # a Slurm job's cgroup folder
CGROUP_BYTES = 8192  # /proc/PID/cgroup read at most: a line per hierarchy


def slurm_job_of(pid: int) -> Optional[str]:
    """The Slurm job whose cgroup holds ``pid`` (its ``job_NNN``), else None."""
    try:
        with open("/proc/%d/cgroup" % pid, "rb") as f:
            text = f.read(CGROUP_BYTES).decode("utf-8", "replace")
    except (OSError, ValueError):
        return None
    for line in text.splitlines():
        m = SLURM_JOB_DIR.search(line.split(":", 2)[-1])
        if m:
            return m.group(1)
    return None


def process_uid(pid: int) -> Optional[int]:
    """Return the real uid running ``pid``, or None."""
    try:
        with open("/proc/%d/status" % pid, "rb") as f:
            for line in f:
                if line.startswith(b"Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def user_of(uid: Optional[int]) -> Optional[str]:
    """The name of ``uid`` (the uid as text when it has none), or None."""
    if uid is None:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def process_user(pid: int) -> Optional[str]:
    """Return the name of the real user running ``pid`` (uid as text if unnamed), or None."""
    return user_of(process_uid(pid))


def process_command(pid: int) -> Optional[str]:
    """Return the command line of ``pid`` (arguments joined by spaces, truncated), or None."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            raw = f.read(4 * MAX_COMMAND)
        if not raw.strip(b"\0"):  # a kernel thread or a zombie: fall back to its name
            with open("/proc/%d/comm" % pid, "rb") as f:
                raw = f.read(64).strip()
    except OSError:
        return None
    text = raw.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace").strip()
    if len(text) > MAX_COMMAND:
        text = text[: MAX_COMMAND - 3] + "..."
    return text or None


Identity = Tuple[Optional[int], Optional[str], Optional[str]]  # uid, user, command


class ProcessNames(object):
    """Per-pid facts of GPU processes (see the module docstring). A reader calls ``rows`` for
    each GPU of a sample, then ``parents`` once, then ``forget_except`` with every pid seen."""

    def __init__(self, clock: Any = time.monotonic) -> None:
        self._cache = {}  # type: Dict[int, Identity]
        self._jobs = {}  # type: Dict[int, Optional[str]]  # pid -> its Slurm job (cgroup)
        self._clock = clock
        self._boot = boot_time()
        self._stats = {}  # type: Dict[int, Optional[ProcStat]]  # this sample's reads
        self._fields = {}  # type: Dict[int, Dict[str, Any]]  # this sample's host fields
        self._cpu = {}  # type: Dict[int, Tuple[int, int, float]]  # start, ticks, when
        # parents() of the last GPU pid set: (the set, when read, the rows)
        self._parents = None  # type: Optional[Tuple[FrozenSet[int], float, List[Dict[str, Any]]]]
        self._seen = set()  # type: Set[int]
        self._stat_files = KeptOpen()  # each listed process's /proc/PID/stat

    def identity(self, pid: int) -> Identity:
        """Return ``(uid, user, command)`` for ``pid``; any may be None (another namespace)."""
        hit = self._cache.get(pid)
        if hit is None:
            uid = process_uid(pid)
            hit = (uid, user_of(uid), process_command(pid))
            self._cache[pid] = hit
        return hit

    def lookup(self, pid: int) -> Tuple[Optional[str], Optional[str]]:
        """Return ``(user, command)`` for ``pid``; either may be None (pid in another namespace)."""
        _, user, command = self.identity(pid)
        return user, command

    def stat(self, pid: int) -> Optional[ProcStat]:
        """``/proc/PID/stat``, read once per sample."""
        if pid not in self._stats:
            self._stats[pid] = self._read_stat(pid)
        return self._stats[pid]

    def _read_stat(self, pid: int) -> Optional[ProcStat]:
        """Through a descriptor kept open while the process is listed: once it ends the read
        fails (ESRCH, even when its pid is another's now) and the file is opened again."""
        path = "/proc/%d/stat" % pid
        kept = path in self._stat_files
        data = self._stat_files.read(path, STAT_BYTES)
        st = None if data is None else parse_stat(data)
        if st is None and kept:  # that process is gone: its pid may be another's now
            self._stat_files.forget(path)
            data = self._stat_files.read(path, STAT_BYTES)
            st = None if data is None else parse_stat(data)
        if st is None:
            self._stat_files.forget(path)
        return st

    def close(self) -> None:
        """Close the /proc files kept open."""
        files = getattr(self, "_stat_files", None)
        if files is not None:
            files.close()

    def __del__(self) -> None:
        self.close()

    def forget_except(self, pids: Iterable[int]) -> None:
        """End a sample: drop cached pids not in ``pids`` (so a reused pid is looked up afresh)
        and this sample's stat reads."""
        keep = set(pids) | self._seen
        for cache in (self._cache, self._cpu, self._jobs):
            for pid in list(cache):
                if pid not in keep:
                    del cache[pid]
        for path in self._stat_files.paths():
            if int(path.split("/")[2]) not in keep:
                self._stat_files.forget(path)
        self._stats = {}
        self._fields = {}
        self._seen = set()

    def host_fields(self, pid: int) -> Dict[str, Any]:
        """``ppid``, ``cpu`` (host %CPU since the last sample, None on the first), ``rss``
        (bytes) and ``started`` (unix time) of ``pid``; all None when /proc cannot tell."""
        done = self._fields.get(pid)  # a process on two GPUs is measured once per sample
        if done is not None:
            return done
        st = self.stat(pid)
        if st is None:
            return {"ppid": None, "cpu": None, "rss": None, "started": None}
        now = self._clock()
        cpu = None  # type: Optional[float]
        before = self._cpu.get(pid)
        if before is not None and before[0] == st.start_ticks and now > before[2]:
            used = (st.cpu_ticks - before[1]) / float(CLOCK_TICKS)
            cpu = round(max(0.0, 100.0 * used / (now - before[2])), 1)
        self._cpu[pid] = (st.start_ticks, st.cpu_ticks, now)
        done = self._fields[pid] = {
            "ppid": st.ppid, "cpu": cpu, "rss": st.rss, "started": self.started(st)}
        return done

    def started(self, st: ProcStat) -> Optional[float]:
        if self._boot is None:
            return None
        return round(self._boot + st.start_ticks / float(CLOCK_TICKS), 2)

    def rows(self, found: Dict[int, Optional[int]], seen: Set[int],
             sm: Optional[Dict[int, Optional[int]]] = None) -> List[Dict[str, Any]]:
        """The sample's ``processes`` list for ``found`` (pid -> GPU memory in bytes or None),
        by pid, with uid, user, command, host fields, ``sm`` (the process's SM % from
        ``sm``, None when unknown) and ``slurm_job`` (its cgroup's); every pid is added to
        ``seen``."""
        out = []  # type: List[Dict[str, Any]]
        for pid in sorted(found):
            seen.add(pid)
            uid, user, command = self.identity(pid)
            if pid not in self._jobs:
                self._jobs[pid] = slurm_job_of(pid)
            row = {"pid": pid, "user": user, "command": command, "mem": found[pid], "uid": uid,
                   "sm": (sm or {}).get(pid), "slurm_job": self._jobs[pid]}  # type: Dict[str, Any]
            row.update(self.host_fields(pid))
            out.append(row)
        return out

    def parents(self, gpu_pids: Iterable[int]) -> List[Dict[str, Any]]:
        """The ancestors of ``gpu_pids`` that are not GPU processes themselves (a launcher such
        as torchrun, a shell), up to but not including pid 1: ``pid``, ``ppid``, ``uid``,
        ``user``, ``command``, ``started``; at most ``MAX_PARENTS``. Walked again when the set
        of GPU pids changes or ``PARENTS_EVERY_S`` has passed: a launcher's chain rarely
        changes, and walking it read 4-5 /proc files per sample (an agent profiled under
        cProfile, one GPU process under a shell chain: 1,495 /proc/PID/stat reads in 299
        samples, 323 once kept)."""
        gpu = frozenset(gpu_pids)
        now = self._clock()
        last = self._parents
        if last is not None and last[0] == gpu and now - last[1] < PARENTS_EVERY_S:
            self._seen.update(row["pid"] for row in last[2])  # keep their identities cached
            return last[2]
        out = {}  # type: Dict[int, Dict[str, Any]]
        for pid in sorted(gpu):
            st = self.stat(pid)
            depth = 0
            while st is not None and st.ppid > 1 and depth < MAX_DEPTH:
                ppid = st.ppid
                if ppid in gpu or ppid in out or len(out) >= MAX_PARENTS:
                    break
                st = self.stat(ppid)
                if st is None:
                    break
                uid, user, command = self.identity(ppid)
                self._seen.add(ppid)
                out[ppid] = {"pid": ppid, "ppid": st.ppid, "uid": uid, "user": user,
                             "command": command, "started": self.started(st)}
                depth += 1
        rows = [out[p] for p in sorted(out)]
        self._parents = (gpu, now, rows)
        return rows


def signal_process(pid: Any, name: Any, gpu_pids: Iterable[int],
                   started: Any = None) -> Tuple[Optional[str], str]:
    """Send SIGTERM, SIGINT or SIGKILL (``name`` "TERM" | "INT" | "KILL") to ``pid``; returns ``(None, what
    was done)`` or ``(error code, one line why not)``.

    Refused: a name other than TERM/INT/KILL (``bad_argument``), a pid that is not one of
    ``gpu_pids`` (the GPU processes of the latest sample: this is no general kill tool;
    ``not_gpu_process``), a process gone or whose start time is not ``started`` (unix time, as
    the sample said: the pid was reused; ``no_process``), and a process of another user than the
    agent's own (``not_yours``): whatever the login side decided, and even for root.
    """
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 1:
        return "bad_argument", "signal needs the pid of a GPU process"
    sig = SIGNALS.get(name) if isinstance(name, str) else None
    if sig is None:
        return "bad_argument", "signal must be TERM, INT or KILL"
    if pid not in set(gpu_pids):
        return "not_gpu_process", "pid %d is not a GPU process of this node" % pid
    uid = process_uid(pid)
    st = read_stat(pid)
    if uid is None or st is None or st.state in ("Z", "X"):
        return "no_process", "pid %d has ended" % pid
    if started is not None:
        boot = boot_time()
        now_started = None if boot is None else round(boot + st.start_ticks / float(CLOCK_TICKS), 2)
        if isinstance(started, bool) or not isinstance(started, (int, float)) \
                or now_started is None or abs(now_started - started) > 0.05:
            return "no_process", "pid %d has ended (a newer process has its number)" % pid
    if uid != os.geteuid():
        return "not_yours", "pid %d belongs to %s, not to %s: only your own processes" % (
            pid, user_of(uid), user_of(os.geteuid()))
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return "no_process", "pid %d has ended" % pid
    except PermissionError as e:
        return "not_yours", "pid %d: %s" % (pid, e)
    return None, "SIG%s sent to pid %d" % (name, pid)
