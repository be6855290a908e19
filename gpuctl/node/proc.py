"""Starting and stopping a node's children: the one home of that mechanism.

Every child the node side starts (a torch burner, the gpu-burn wrapper and gpu_burn itself, the
acceptance suite and its torchrun, a job's VENV2 under the supervisor) goes through ``spawn``:

- its own session (so its own process group): stopping it signals the whole group;
- a parent-death signal set without a race: libc's ``prctl`` is resolved here, at import, never
  in a forked child (which must not dlopen: another thread may hold the loader's lock), and after
  ``prctl`` the child checks that its parent is still the process that forked it; if the parent
  died in between, the signal would never come, so the child kills itself. Linux delivers it when
  the *thread* that forked the child ends, which is the agent's or supervisor's main thread;
- the bundle environment (``bundle_env``): ``PYTHONPATH`` names the folder or ``.pyz`` that holds
  the running ``gpuctl`` package, ``PYTHONUNBUFFERED=1``.

Reading children: ``LineBuffer`` turns bytes into lines with a bounded buffer (a line longer than
``protocol.MAX_LINE`` is dropped, never kept whole), ``JsonLines`` parses each line with
``protocol.parse_json`` (the guards untrusted text needs: huge numbers, NaN, deep nesting) and
hands back the objects.

Stopping: ``stop_group`` sends SIGTERM to a group, waits up to a deadline, then SIGKILL, and says
whether the group is gone; ``kill_descendants`` ends what a child subreaper (``become_subreaper``)
inherited. Python 3.6 syntax, standard library only; no other module calls ``prctl``.
"""

import os
import signal
import subprocess
import sys
import time
from typing import IO, Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

from . import protocol

try:
    import ctypes
except ImportError:  # a Python built without ctypes: no parent-death signal, close hooks remain
    ctypes = None  # type: ignore[assignment]

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
GRACE_S = 5.0  # SIGTERM -> SIGKILL
KILL_WAIT_S = 5.0  # after SIGKILL: a process stuck in the kernel (a hung GPU) may never go
POLL_S = 0.02  # polling a group's exit: the kernel has no "group ended" notification

Preexec = Callable[[], None]
FileArg = Union[None, int, IO[Any]]


def _load_prctl() -> Optional[Callable[..., int]]:
    if ctypes is None or not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong)
    return fn


_PRCTL = _load_prctl()  # resolved at import: a forked child must not dlopen


def prctl_available() -> bool:
    """Whether this process can set parent-death signals and become a subreaper (Linux)."""
    return _PRCTL is not None


def set_death_signal(sig: int, parent: Optional[int] = None) -> bool:
    """Ask for ``sig`` when this process's parent dies (Linux ``PR_SET_PDEATHSIG``).

    ``parent`` is the pid the caller knows as its parent; when the parent has changed already
    (it died before the call, so the signal will never come), ``sig`` is sent now. Returns False
    when the signal cannot be set here (no prctl).
    """
    if _PRCTL is None:
        return False
    _PRCTL(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), int(sig))
    return True


def die_with_parent(sig: int = signal.SIGKILL, then: Optional[Preexec] = None) -> Preexec:
    """A ``preexec_fn``: the child gets ``sig`` when the calling process dies; ``then`` runs
    after (resetting signal dispositions, resource limits). Build it in the parent, just before
    the fork: it records the parent's pid."""
    parent = os.getpid()

    def preexec() -> None:
        if _PRCTL is not None:
            _PRCTL(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)
        if then is not None:
            then()

    return preexec


def become_subreaper() -> bool:
    """Make this process a child subreaper: orphaned descendants reparent to it instead of to
    init, so ``kill_descendants`` can end them. Returns False where that is impossible."""
    if _PRCTL is None:
        return False
    return _PRCTL(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def code_root() -> str:
    """The folder (or ``.pyz`` bundle) holding the ``gpuctl`` package this process runs."""
    here = os.path.abspath(__file__)
    return os.path.dirname(os.path.dirname(os.path.dirname(here)))


def bundle_env(extra: Optional[Mapping[str, str]] = None,
               base: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The environment of a child that runs ``python -m gpuctl.workloads...``: ``base`` (default
    this process's) with ``code_root()`` first on ``PYTHONPATH``, ``PYTHONUNBUFFERED=1``, then
    ``extra``."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (code_root(), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def spawn(argv: Sequence[str], stdin: FileArg = subprocess.DEVNULL, stdout: FileArg = None,
          stderr: FileArg = None, env: Optional[Mapping[str, str]] = None,
          cwd: Optional[str] = None, pass_fds: Sequence[int] = (),
          death_signal: int = signal.SIGKILL,
          preexec: Optional[Preexec] = None) -> "subprocess.Popen[bytes]":
    """Start ``argv`` in a session of its own with the parent-death signal ``death_signal``
    (``preexec`` runs in the child after it). The child's pid is its process group's id.
    Raises OSError when it cannot start (the interpreter is missing, ...)."""
    return subprocess.Popen(
        list(argv), stdin=stdin, stdout=stdout, stderr=stderr, env=env, cwd=cwd,
        pass_fds=tuple(pass_fds), close_fds=True, start_new_session=True,
        preexec_fn=die_with_parent(death_signal, preexec))


def group_alive(pgid: int) -> bool:
    """Whether any process (an unreaped zombie included) is left in process group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to process group ``pgid``; False when nobody is left to get it."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _gone(pgid: int, proc: "Optional[subprocess.Popen[Any]]") -> bool:
    if proc is not None:
        proc.poll()  # reap the leader: a zombie leader keeps the group "alive"
    return not group_alive(pgid)


def _wait_gone(pgid: int, proc: "Optional[subprocess.Popen[Any]]", seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not _gone(pgid, proc):
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)  # polling the group's exit (see POLL_S)
    return True


def stop_group(pgid: int, grace: float = GRACE_S,
               proc: "Optional[subprocess.Popen[Any]]" = None,
               kill_wait: float = KILL_WAIT_S) -> bool:
    """SIGTERM to process group ``pgid``, up to ``grace`` seconds for it to end, then SIGKILL
    and up to ``kill_wait`` more. ``proc``, the group's leader when it is this process's child,
    is reaped on the way. Returns True once no process is left in the group."""
    if _gone(pgid, proc):
        return True
    if grace > 0:
        signal_group(pgid, signal.SIGTERM)
        if _wait_gone(pgid, proc, grace):
            return True
    signal_group(pgid, signal.SIGKILL)
    return _wait_gone(pgid, proc, kill_wait)


# -- /proc/PID/stat ------------------------------------------------------------------------------
class ProcStat(object):
    """What ``/proc/PID/stat`` says of a process: ``state`` ("R", "S", "Z", ...), ``ppid``,
    ``cpu_ticks`` (user + system time, in clock ticks), ``start_ticks`` (start time in clock
    ticks after boot; with the pid it names one process, whatever reuses the pid later),
    ``rss`` (resident bytes), ``session`` (its session id) and ``pgrp`` (its process group). The
    node side's one reader of /proc/PID/stat (the agent's process facts, descendants, the
    supervisor's memory limit, the burners of other sessions)."""

    __slots__ = ("state", "ppid", "cpu_ticks", "start_ticks", "rss", "session", "pgrp")

    def __init__(self, state: str, ppid: int, cpu_ticks: int, start_ticks: int, rss: int,
                 session: int = 0, pgrp: int = 0) -> None:
        self.state = state
        self.ppid = ppid
        self.cpu_ticks = cpu_ticks
        self.start_ticks = start_ticks
        self.rss = rss
        self.session = session
        self.pgrp = pgrp


CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


STAT_BYTES = 4096  # /proc/PID/stat: 52 numbers and a name of at most 16 bytes fit


def read_stat(pid: Union[int, str], proc_root: str = "/proc") -> Optional[ProcStat]:
    """``/proc/PID/stat`` of ``pid``, or None when it is gone or unreadable."""
    try:
        # os.open/read/close: a file object (buffered reader, context manager) was two thirds
        # of the 32 us this cost per GPU process and sample here (0.116 -> 0.071 ms on an
        # H100's VM, where each system call at 1 Hz costs 0.01-0.03 ms)
        fd = os.open(os.path.join(proc_root, str(pid), "stat"), os.O_RDONLY)
        try:
            stat = os.read(fd, STAT_BYTES)
        finally:
            os.close(fd)
    except OSError:
        return None
    return parse_stat(stat)


class KeptOpen(object):
    """Files read again and again from their start through a descriptor kept open (``pread``):
    the /proc files the agent reads every sample (the host's, each GPU process's stat), where
    opening a file costs more than reading it (a file object to open and read /proc/PID/stat
    was 0.116 ms on an H100's VM at 1 Hz, a kept descriptor's pread 0.044 ms). ``read`` gives
    the bytes (at most ``most``) or None; a read that fails closes the file (a process that
    ended: ESRCH), to be opened again at the next read. A file is read with one ``pread`` when
    it fits (a short read is its end): asking again past the end of a /proc file makes the
    kernel generate it a second time. ``replaceable``: before each read, check that the file
    was not removed (a test's tree, whose files are replaced; never under /proc, where the
    ``fstat`` would cost 0.015 ms a file)."""

    CHUNK = 1 << 16  # bytes asked of a file per pread

    def __init__(self, replaceable: bool = False) -> None:
        self._fds = {}  # type: Dict[str, int]
        self._replaceable = replaceable

    def __contains__(self, path: str) -> bool:
        return path in self._fds

    def paths(self) -> List[str]:
        return list(self._fds)

    def read(self, path: str, most: int = 1 << 20) -> Optional[bytes]:
        fd = self._fds.get(path)
        try:
            if fd is not None and self._replaceable and os.fstat(fd).st_nlink == 0:
                self.forget(path)
                fd = None
            if fd is None:
                fd = self._fds[path] = os.open(path, os.O_RDONLY)
            chunks = []  # type: List[bytes]
            size = 0
            while size < most:
                ask = min(self.CHUNK, most - size)
                chunk = os.pread(fd, ask, size)
                chunks.append(chunk)
                size += len(chunk)
                if len(chunk) < ask:  # its end
                    break
            return b"".join(chunks)
        except OSError:
            self.forget(path)
            return None

    def forget(self, path: str) -> None:
        """Close ``path``'s descriptor (if kept)."""
        fd = self._fds.pop(path, None)
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    def close(self) -> None:
        for path in list(self._fds):
            self.forget(path)


def parse_stat(stat: bytes) -> Optional[ProcStat]:
    """The text of a /proc/PID/stat, or None when it is not one. The command name may hold
    spaces and parentheses: the fields are read after its last ``)``."""
    try:
        fields = stat[stat.rindex(b")") + 2:].split()
        # fields[n - 3] is field n of proc(5): 4 ppid, 5 pgrp, 6 session, 14 utime, 15 stime,
        # 22 starttime, 24 rss
        return ProcStat(fields[0].decode("ascii", "replace"), int(fields[1]),
                        int(fields[11]) + int(fields[12]), int(fields[19]),
                        int(fields[21]) * PAGE_BYTES, int(fields[3]), int(fields[2]))
    except (ValueError, IndexError):
        return None


def boot_time(proc_root: str = "/proc") -> Optional[float]:
    """The unix time the machine booted (``btime`` of /proc/stat), or None."""
    try:
        with open(os.path.join(proc_root, "stat"), "rb") as f:
            for line in f:
                if line.startswith(b"btime "):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def session_rss(sid: int, proc_root: str = "/proc") -> int:
    """Resident bytes of every process of session ``sid`` (one ``read_stat`` each)."""
    total = 0
    try:
        names = os.listdir(proc_root)
    except OSError:
        return 0
    for name in names:
        if name.isdigit():
            st = read_stat(name, proc_root)
            if st is not None and st.session == sid:
                total += st.rss
    return total


# -- descendants (a child subreaper's inheritance) ----------------------------------------------
def _parents(proc_root: str = "/proc") -> Dict[int, int]:
    """pid -> parent pid of every live (non-zombie) process, from /proc."""
    out = {}
    for entry in os.listdir(proc_root):
        if not entry.isdigit():
            continue
        stat = read_stat(entry, proc_root)
        if stat is None or stat.state in ("Z", "X"):
            continue
        out[int(entry)] = stat.ppid
    return out


def descendants(pid: Optional[int] = None) -> List[int]:
    """Live descendants of ``pid`` (default: this process), from /proc."""
    root = os.getpid() if pid is None else pid
    parents = _parents()
    children = {}  # type: Dict[int, List[int]]
    for child, parent in parents.items():
        children.setdefault(parent, []).append(child)
    out = []
    todo = list(children.get(root, ()))
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, ()))
    return sorted(out)


def reap_children() -> None:
    """Collect every exited child of this process (without blocking)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        except InterruptedError:
            continue
        if pid == 0:
            return


def kill_descendants(grace: float = 1.0, kill_wait: float = KILL_WAIT_S) -> List[int]:
    """End every descendant of this process: SIGTERM, up to ``grace`` seconds, SIGKILL until
    none is left (a killed process's children reparent to a subreaper, which sees them next
    round) or ``kill_wait`` runs out. Reaps them. Returns the pids that were signalled."""
    signalled = []  # type: List[int]
    first = descendants()
    for pid in first:
        try:
            os.kill(pid, signal.SIGTERM)
            signalled.append(pid)
        except OSError:
            pass
    deadline = time.monotonic() + grace
    while first and time.monotonic() < deadline:
        reap_children()
        first = descendants()
        if first:
            time.sleep(POLL_S)  # polling their exit (see POLL_S)
    deadline = time.monotonic() + kill_wait
    while True:
        reap_children()
        left = descendants()
        if not left or time.monotonic() >= deadline:
            return signalled
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                continue
            if pid not in signalled:
                signalled.append(pid)
        time.sleep(POLL_S)


# -- reading children: lines and JSON ------------------------------------------------------------
class LineBuffer(object):
    """Bytes in, complete lines out (without their newline), in bounded memory.

    A line longer than ``max_line`` bytes is dropped whole: what was buffered is let go as soon
    as the bound is passed, and the rest is skipped up to its newline. ``on_overlong()`` is
    called once per such line; ``overlong`` counts them.
    """

    def __init__(self, max_line: int = protocol.MAX_LINE,
                 on_overlong: Optional[Callable[[], None]] = None) -> None:
        self.max_line = max_line
        self.on_overlong = on_overlong
        self.overlong = 0
        self._buf = bytearray()
        self._discarding = False

    def _drop(self) -> None:
        self.overlong += 1
        if self.on_overlong is not None:
            self.on_overlong()

    def feed(self, data: bytes) -> List[bytes]:
        """Take a chunk; return the lines it completed."""
        self._buf.extend(data)
        lines = []
        start = 0
        buf = self._buf
        while True:
            nl = buf.find(b"\n", start)
            if nl < 0:
                break
            if self._discarding:  # the tail of an overlong line
                self._discarding = False
            elif nl - start > self.max_line:
                self._drop()
            else:
                lines.append(bytes(buf[start:nl]))
            start = nl + 1
        del buf[:start]
        if len(buf) > self.max_line:
            if not self._discarding:
                self._drop()
            self._discarding = True
            del buf[:]
        elif self._discarding:
            del buf[:]
        return lines

    def finish(self) -> List[bytes]:
        """The stream ended: the unterminated last line, if any."""
        tail = bytes(self._buf)
        del self._buf[:]
        discarding, self._discarding = self._discarding, False
        if discarding or not tail:
            return []
        return [tail]


def json_object(line: Union[bytes, str]) -> Optional[Dict[str, Any]]:
    """A child's output line as a dict (non-finite numbers as None), or None for anything else."""
    try:
        value = protocol.parse_json(line, nan_to_none=True)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


class JsonLines(object):
    """A child's JSON-line output, incrementally: ``feed(bytes)`` returns the objects of the
    lines it completed; any other non-blank line goes to ``on_text(text)``. Never raises on
    what the child wrote (junk, partial UTF-8, NaN, huge numbers, overlong lines)."""

    def __init__(self, on_text: Optional[Callable[[str], None]] = None,
                 max_line: int = protocol.MAX_LINE) -> None:
        self.on_text = on_text
        self.lines = LineBuffer(max_line)

    def _take(self, lines: List[bytes]) -> List[Dict[str, Any]]:
        out = []
        for line in lines:
            if not line.strip():
                continue
            obj = json_object(line)
            if obj is not None:
                out.append(obj)
            elif self.on_text is not None:
                self.on_text(line.decode("utf-8", "replace").rstrip())
        return out

    def feed(self, data: bytes) -> List[Dict[str, Any]]:
        """Take a chunk of output; return the objects of the lines it completed."""
        return self._take(self.lines.feed(data))

    def finish(self) -> List[Dict[str, Any]]:
        """The stream ended: the object of an unterminated last line, if any."""
        return self._take(self.lines.finish())
