"""The job folder's contract: every file name in it, and the helpers that read and write them.

One module for both sides, like submitit's ``JobPaths``: the supervisor (VENV1, Python 3.6), the
worker (VENV2) and the login side (``gpuctl.jobs``) all import it, and no other module spells a
job file's name (``gpuctl_tests/node/test_jobfiles.py`` checks). Standard library only, Python
3.6 syntax: ``supervisor.py`` and ``worker.py`` run from the job folder as scripts, and a copy of
this module (with ``proc`` and ``protocol``, which the supervisor needs) sits beside them as the
package ``gpuctl_runner``, imported from their folder (``sys.path[0]``); run from the gpuctl
package they import ``gpuctl.node.jobfiles`` instead.

A job folder (mode 0700), who writes each file -> who reads it:

    meta.json          login side, at submit -> supervisor, worker, reports
    job-env.json       login side, at submit (0600): the values of ``job_env``/``env_pass``, kept
                       out of meta.json -> the supervisor, which removes it once read (under
                       Slurm once the job ends: a requeue and every rank read it again)
    payload.pkl        login side (temporary name, renamed) -> worker
    supervisor.py, worker.py, gpuctl_runner/   copies of the runner -> run as scripts
    supervisor.json    supervisor at start: pid, pgid, sid, hostname -> login side (signals)
    supervisor.log     the supervisor's own stdout and stderr (its backend redirects them)
    setup.sh, setup.log, .setup-env   the supervisor's setup lines, their output, their env
    stdout.txt, stderr.txt   VENV2's output (files: a chatty job cannot block on a pipe)
    heartbeat.json     supervisor, every few seconds -> login side (last seen alive)
    status.jsonl       worker, one line per phase -> reports
    error.json         worker, the first error only (O_EXCL) -> reports
    result.pkl, result.json   worker: the pickled value (renamed into place), its summary
    exception.pkl      worker: the function's exception -> re-raised by the login side
    cancel-requested   login side -> supervisor (covers a supervisor without handlers yet)
    checkpoint.pkl     worker, when a checkpointable function checkpointed: the next attempt's
                       payload (the supervisor renames it to payload.pkl)
    attempts.jsonl     supervisor, one line per attempt that ended in a requeue -> reports
    requeue.json       supervisor, while Slurm requeues the job (the keeper then writes no
                       outcome) -> the next attempt's supervisor removes it; login side
    outcome.json       supervisor, last, always, atomically -> reports
    rank-R/            a job of several tasks (Slurm ``nodes`` x ``tasks_per_node``): one folder
                       per task (rank R), made by that task's supervisor, holding the files above
                       that a run writes, and links to the job's inputs (``TASK_LINKS``)
"""

import errno
import json
import os
import re
import sys
from typing import Any, Dict, List, Optional

META = "meta.json"
PAYLOAD = "payload.pkl"
# The source text of the files whose code the payload carries by value ({path: text}): the
# worker puts it in linecache, so that tracebacks show the user's lines where the file is not.
SOURCES = "sources.json"
# Space the worker holds in the job folder while the function runs (RESERVE_BYTES of real
# blocks) and gives back when the function's disk fills, so that error.json and the
# supervisor's outcome.json can still be written on the full file system.
RESERVE = "reserve.bin"
RESERVE_BYTES = 256 << 10
SUPERVISOR_SCRIPT = "supervisor.py"
WORKER_SCRIPT = "worker.py"
# The node modules the scripts need (this one, proc, protocol and the metric registry it reads,
# the readers, and the supervisor's own: its loop is the script, its other mechanisms these
# modules), copied as a package of this name beside them: the copies' relative imports keep
# working, and the name cannot shadow a module of the user's.
RUNNER_PACKAGE = "gpuctl_runner"
RUNNER_MODULES = ("__init__", "jobfiles", "metrics", "proc", "protocol", "readers/__init__",
                  "readers/base",
                  "readers/bindings", "readers/nvml", "readers/smi", "readers/procs",
                  "readers/emit", "attempts", "cgroups", "envbuild", "keeper", "rendezvous",
                  "resources", "scontrol")
PIDFILE = "supervisor.json"
SUPERVISOR_LOG = "supervisor.log"
SETUP_SCRIPT = "setup.sh"
SETUP_LOG = "setup.log"
SETUP_ENV = ".setup-env"
STDOUT = "stdout.txt"
STDERR = "stderr.txt"
HEARTBEAT = "heartbeat.json"
STATUS = "status.jsonl"
ERROR = "error.json"
RESULT = "result.pkl"
RESULT_INFO = "result.json"
EXCEPTION = "exception.pkl"
CANCEL = "cancel-requested"
OUTCOME = "outcome.json"
CHECKPOINT = "checkpoint.pkl"
ATTEMPTS = "attempts.jsonl"
REQUEUE = "requeue.json"
JOB_ENV = "job-env.json"
# The worker's exit status after a checkpoint: the supervisor starts the next attempt.
CHECKPOINTED_EXIT = 8
# Set (to "1") in a checkpointable function's environment under Slurm: the worker lets its first
# SIGTERM pass (Slurm's preemption and its cancel both send one to every process of the job) and
# waits for the supervisor's verdict: SIGUSR1 to checkpoint (a preemption), or SIGTERM again.
TERM_WAITS_ENV = "GPUCTL_TERM_WAITS"
TASK_FOLDER = "rank-%d"
# A task folder's links to the job folder's inputs: its supervisor and worker read the job as if
# the task folder were the job folder (a dangling link to the cancel file comes alive with it).
TASK_LINKS = (META, PAYLOAD, WORKER_SCRIPT, CANCEL)

# The one rule of a job's environment, the same on every backend: the node's environment, less
# what a login side's process would carry over, plus what the submitter passes. A local job and
# a Slurm job (sbatch --export) start from these names of the submitter's environment only (the
# same machine's, or the cluster's, values); an SSH job from sshd's session on the node. Then
# ``job_env`` and the variables ``env_pass`` names (both ``JOB_ENV``), which win.
BASE_ENV = ("PATH", "LD_LIBRARY_PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE",
            "TERM", "TZ", "TMPDIR", "CUDA_VISIBLE_DEVICES")
BASE_ENV_PREFIXES = ("LC_",)


def is_base_env(name: str) -> bool:
    """True for a variable a job starts with wherever it runs (``BASE_ENV``)."""
    return (name in BASE_ENV or name.startswith(BASE_ENV_PREFIXES)) and bool(
        re.match(r"[A-Za-z_][A-Za-z0-9_]*\Z", name))


def base_env(environ: Dict[str, str]) -> Dict[str, str]:
    """The part of ``environ`` a local or Slurm job starts from (``BASE_ENV``)."""
    return {k: v for k, v in environ.items() if is_base_env(k)}


def take_job_env(jobdir: str, remove: bool) -> Dict[str, str]:
    """The passed variables of the job in ``jobdir`` (``JOB_ENV``; {} without one), the file
    removed when ``remove``: the values are written nowhere else on the node."""
    path = os.path.join(jobdir, JOB_ENV)
    env = read_json(path)
    if remove:
        try:
            os.unlink(path)
        except OSError:
            pass
    if not isinstance(env, dict):
        return {}
    return {str(k): str(v) for k, v in env.items()}


# Files a person reads to see what a job did, in that order.
LOGS = (STDOUT, STDERR, STATUS, OUTCOME, ERROR, SETUP_LOG, SUPERVISOR_LOG)
# The runner, copied into every job folder: path in the folder -> source path under the folder
# that holds the ``gpuctl`` package.
RUNNER = {SUPERVISOR_SCRIPT: "gpuctl/node/supervisor.py", WORKER_SCRIPT: "gpuctl/workloads/worker.py"}
RUNNER.update(
    (RUNNER_PACKAGE + "/" + m + ".py", "gpuctl/node/" + m + ".py") for m in RUNNER_MODULES)


class JobPaths(object):
    """The paths of one job folder: ``JobPaths(d).outcome == d + "/outcome.json"``.

    ``folder`` may be a path on another host (the login side reads over SSH): paths are joined
    with "/".
    """

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def __call__(self, name: str) -> str:
        """The path of the file ``name`` (one of this module's names) in the folder."""
        return self.folder.rstrip("/") + "/" + name

    @property
    def meta(self) -> str:
        return self(META)

    @property
    def outcome(self) -> str:
        return self(OUTCOME)

    @property
    def heartbeat(self) -> str:
        return self(HEARTBEAT)

    @property
    def cancel(self) -> str:
        return self(CANCEL)

    @property
    def pidfile(self) -> str:
        return self(PIDFILE)


def task_count(meta: Any) -> int:
    """How many tasks (ranks) a job's ``meta.json`` asks for: nodes x tasks_per_node (>= 1)."""
    limits = meta.get("limits") if isinstance(meta, dict) else None
    if not isinstance(limits, dict):
        return 1
    try:
        return max(1, int(limits.get("nodes") or 1) * int(limits.get("tasks_per_node") or 1))
    except (TypeError, ValueError):
        return 1


def task_folder(jobdir: str, rank: int) -> str:
    """The folder of task ``rank`` of a job of several tasks (``jobdir/rank-R``)."""
    return jobdir.rstrip("/") + "/" + TASK_FOLDER % rank


def make_task_folder(jobdir: str, rank: int) -> str:
    """Make (mode 0700) and return task ``rank``'s folder, with ``TASK_LINKS`` to the job's
    inputs; existing links are kept (a requeued task). Raises OSError."""
    folder = task_folder(jobdir, rank)
    try:
        os.mkdir(folder, 0o700)
    except OSError as e:
        if e.errno != errno.EEXIST:
            raise
    for name in TASK_LINKS:
        try:
            os.symlink(os.path.join("..", name), os.path.join(folder, name))
        except OSError as e:
            if e.errno != errno.EEXIST:
                raise
    return folder


# -- outcome.json: one definition for its writer (the supervisor) and its reader ---------------
# The supervisor's ``outcome`` is typed as ``Outcome`` (mypy checks every key it writes and the
# type of its value), and the login side decodes the file through the same classes
# (``gpuctl.core.wire.parse``, which keeps a field only when it has the type declared here): a
# key written that no class here names would be dropped on the way in, which
# ``gpuctl_tests/jobs/test_outcome.py`` checks on real runs. Python 3.6 has no TypedDict: there
# the classes are not made (the node side only needs them for mypy), on 3.8 and later they are.
if sys.version_info >= (3, 8):
    from typing import TypedDict  # novermin

    class CgroupMemory(TypedDict, total=False):
        """The supervisor's memory cgroup before and after the job (``cgroup_memory``): its
        limit, peak and OOM kills (v1 or v2; ``path`` None: none found)."""

        version: Optional[int]
        path: Optional[str]
        limit_bytes: Optional[int]
        peak_bytes: Optional[int]
        oom_kill: Optional[int]
        oom: Optional[int]  # v2's memory.events
        failcnt: Optional[int]  # v1's memory.failcnt

    class SetupRun(TypedDict, total=False):
        lines: List[str]
        rc: Optional[int]

    class StartError(TypedDict, total=False):
        """Why VENV2's python could not be executed."""

        errno: Optional[int]
        errno_name: str
        message: str
        python: str

    class MemLimitExceeded(TypedDict, total=False):
        """``mem_limit_exceeded``: the resident memory of VENV2's session the supervisor saw
        over ``mem=`` (where neither Slurm nor a cgroup enforces it)."""

        rss_kb: int
        limit_bytes: int
        after_s: float

    class SupervisorKilled(TypedDict, total=False):
        """What the keeper saw when the supervisor died of a signal before writing its
        outcome."""

        signal: str
        pid: int
        last_heartbeat: Optional[float]

    class ThreadCount(TypedDict, total=False):
        """The threads a job's math libraries start by default (``thread_count``): ``count``,
        its ``source`` ("OMP_NUM_THREADS", or "cpus": the CPUs it may use), ``cpus``."""

        count: int
        source: str
        cpus: int

    class LeftProcess(TypedDict, total=False):
        """A process the function left running when it returned (the supervisor ended it)."""

        pid: int
        cmd: str

    class ShmFile(TypedDict, total=False):
        """A file of this user's that appeared in ``/dev/shm`` while the job ran and was still
        there when it ended (RAM held until someone removes it)."""

        path: str
        bytes: int  # the memory it holds (blocks), not its apparent size

    class Outcome(TypedDict, total=False):
        """``outcome.json``: how the supervisor (or, when it was killed, its keeper) saw the
        job end."""

        supervisor_version: int
        supervisor_python: str  # VENV1's version
        supervisor_executable: str
        supervisor_pid: int
        keeper_pid: int  # the keeper's outcome only
        hostname: str
        slurm_job_id: Optional[str]
        rank: int  # a task of a job of several: its rank (SLURM_PROCID)
        attempt: int
        started_at: float
        ended_at: float
        wall_s: float  # started_at to ended_at
        phase: str  # supervisor, setup, start, running, exited
        setup: SetupRun
        setup_failed: bool
        resources_unavailable: str
        resources: Dict[str, str]  # what gpus= and cpus= set in VENV2's environment
        threads: ThreadCount
        argv: List[str]  # VENV2's command line
        cwd: str  # the folder VENV2 ran in
        mem_watch_bytes: Optional[int]
        cgroup_before: Optional[CgroupMemory]
        cgroup_after: Optional[CgroupMemory]
        subreaper: bool
        start_error: StartError
        venv2_pid: int
        exit_code: Optional[int]
        signal: Optional[int]
        signal_name: Optional[str]
        core_dumped: bool
        run_s: float
        peak_rss_kb: Optional[int]
        cpu_user_s: float
        cpu_sys_s: float
        stop_signal: Optional[str]  # the signal the supervisor itself received
        stop_reason: Optional[str]
        stop_requested_after_s: float
        preempted: Dict[str, str]  # Slurm's evidence (``scontrol show job`` fields)
        warned: bool
        forwarded: List[str]  # signals passed on to VENV2
        escalated_to_kill: bool
        mem_limit_exceeded: MemLimitExceeded
        stacks: str  # every thread's stack (faulthandler) just before a time limit's TERM
        left_running: List[LeftProcess]
        shm_left: List[ShmFile]
        descendants_killed: int
        descendants_error: str
        requeue_error: str
        requeues_exhausted: Dict[str, int]
        supervisor_error: str
        supervisor_traceback: str
        supervisor_killed: SupervisorKilled


# -- helpers ------------------------------------------------------------------------------------
def write_json(path: str, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` atomically (temporary name, fsync, rename)."""
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_json_once(path: str, obj: Any) -> bool:
    """Write ``obj`` to ``path`` unless the file exists (O_EXCL: the first writer wins).
    Returns False when it was there already; raises OSError for anything else."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as e:
        if e.errno == errno.EEXIST:
            return False
        raise
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    return True


def append_line(path: str, obj: Any) -> None:
    """Append ``obj`` as one JSON line, flushed and fsynced (it survives a crash right after)."""
    with open(path, "a") as f:
        f.write(json.dumps(obj) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_json(path: str, default: Any = None) -> Any:
    """The JSON in ``path``, or ``default`` when it is missing or not JSON (a torn write)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def loads(data: Optional[bytes]) -> Any:
    """JSON from bytes read elsewhere (over SSH), or None when empty or not JSON."""
    if not data:
        return None
    try:
        return json.loads(data.decode("utf-8", "replace"))
    except ValueError:
        return None


def parse_lines(text: str) -> List[Dict[str, Any]]:
    """The records of a JSON-lines file (``status.jsonl``); a torn last line (a crash in the
    middle of a write) and anything that is not an object are skipped."""
    out = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


def tail(path: str, limit: int = 4000) -> str:
    """The last ``limit`` characters of a text file ('' when it does not exist)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


# A job's traceback (``error.json``, a map item's): bounded. A cycle of frames repeated (a
# RecursionError, direct or through several functions) is shown once and then counted; at most
# TRACEBACK_FRAMES frames per exception are shown (the first and the last half), and at most
# TRACEBACK_CHARS characters in all (its head and its tail).
TRACEBACK_FRAMES = 80
TRACEBACK_CHARS = 40000
_CYCLE_AT_MOST = 12  # the longest cycle of frames looked for
_CYCLE_FOLDED = 3  # a cycle repeated this many times or more is folded


def _fold(frames: "List[Any]") -> "List[Any]":
    """``frames`` (FrameSummary) with each run of a repeated cycle kept once, followed by a
    string that counts the rest; then the middle of what is left cut to TRACEBACK_FRAMES."""
    keys = [(f.filename, f.lineno, f.name) for f in frames]
    out = []  # type: List[Any]
    i, n = 0, len(keys)
    while i < n:
        best = (1, 0)  # (repeats, period)
        for p in range(1, _CYCLE_AT_MOST + 1):
            if i + p * _CYCLE_FOLDED > n:
                break
            reps = 1
            while i + (reps + 1) * p <= n and keys[i + reps * p: i + (reps + 1) * p] == keys[i: i + p]:
                reps += 1
            if reps >= _CYCLE_FOLDED and reps * p > best[0] * best[1]:
                best = (reps, p)
        reps, p = best
        if not p:
            out.append(frames[i])
            i += 1
            continue
        out.extend(frames[i: i + p])
        where = ", ".join("{}:{}".format(os.path.basename(f.filename), f.lineno)
                          for f in frames[i: i + p])
        above = "the frame above" if p == 1 else "the {} frames above".format(p)
        out.append("  [... {} more frames repeating {} ({})]\n".format((reps - 1) * p, above, where))
        i += reps * p
    if len(out) > TRACEBACK_FRAMES:
        half = TRACEBACK_FRAMES // 2
        cut = len(out) - 2 * half
        out = out[:half] + ["  [... {} frames left out ...]\n".format(cut)] + out[-half:]
    return out


def format_exception(exc: BaseException) -> str:
    """The traceback of ``exc`` (with its causes and contexts) as ``traceback`` writes it, but
    bounded (repeated cycles of frames folded, see TRACEBACK_FRAMES) and never raising: when
    the source lines cannot be read (an exception while ``linecache`` reads them, a signal
    handler's), the frames are named without them."""
    import traceback

    class Folded(traceback.StackSummary):
        def format(self, *args: Any, **kwargs: Any) -> "List[str]":
            lines = []  # type: List[str]
            for part in _fold(list(self)):
                if isinstance(part, str):
                    lines.append(part)
                else:
                    summary = traceback.StackSummary.from_list([part])
                    lines.extend(traceback.StackSummary.format(summary, *args, **kwargs))
            return lines

    try:
        te = traceback.TracebackException(type(exc), exc, exc.__traceback__)
        seen = set()  # type: Any
        todo = [te]  # type: List[Any]
        while todo:
            t = todo.pop()
            if t is None or id(t) in seen:
                continue
            seen.add(id(t))
            t.stack = Folded(t.stack)
            todo += [getattr(t, "__cause__", None), getattr(t, "__context__", None)]
        text = "".join(te.format())
    except Exception:
        text = _bare(exc)
    if len(text) > TRACEBACK_CHARS:
        half = TRACEBACK_CHARS // 2
        text = "{}\n[... {} characters left out ...]\n{}".format(
            text[:half], len(text) - 2 * half, text[-half:])
    return text


def _bare(exc: BaseException) -> str:
    """The frames of ``exc`` without their source lines (read nothing, format nothing)."""
    try:
        frames = []
        tb = exc.__traceback__
        while tb is not None:
            code = tb.tb_frame.f_code
            frames.append((code.co_filename, tb.tb_lineno, code.co_name))
            tb = tb.tb_next
        if len(frames) > TRACEBACK_FRAMES:
            frames = frames[:TRACEBACK_FRAMES // 2] + frames[-(TRACEBACK_FRAMES // 2):]
        lines = ["Traceback (most recent call last):\n"]
        lines += ['  File "{}", line {}, in {}\n'.format(*f) for f in frames]
        try:
            message = str(exc)
        except Exception:
            message = "<the message could not be read>"
        lines.append("{}: {}\n".format(type(exc).__name__, message))
        return "".join(lines)
    except Exception:
        return "{}\n".format(type(exc).__name__)
