"""The evidence a failure report quotes, read from what a job left: the stacks of a hung job
(where it waits, ``waiting_in``), a stack overflow, threads and processes left behind, shared
memory, the disk, the memory it ran out of, the notebook cells of a traceback (``name_cells``),
what Slurm said when it ended the job, and a module of the user's that did not ship. Each
helper turns one kind of evidence into report lines; ``classify`` decides which apply.
"""

from __future__ import annotations

import re

from gpuctl.jobs import usercode
from gpuctl.jobs.records import JobMeta, Outcome, WorkerError
from gpuctl.jobs.report import _fmt_bytes
from gpuctl.node import jobfiles

DISK_FULL_KB = 1024  # below this much free space a missing outcome is put down to the disk


CRASH_SIGNALS = {"SIGSEGV", "SIGABRT", "SIGBUS", "SIGFPE", "SIGILL"}


def _unshipped(meta: JobMeta | None, module: str) -> str | None:
    """The line for a user's module that did not ship with the job (``usercode``), if it is
    one: the module or a package above it is in ``meta.json``'s ``unshipped``, or it is one of
    the user's files here, outside the folders that ship."""
    left = (meta or {}).get("unshipped") or {}
    parts = module.split(".")
    for i in range(len(parts), 0, -1):
        found = left.get(".".join(parts[:i]))
        if found and len(found) == 2:
            path, why = found
            return f"your module `{'.'.join(parts[:i])}` (`{path}`) was not shipped: {why}"
    here = usercode.local_module(parts[0]) if module else None
    if here is not None:
        return f"your module `{parts[0]}` (`{here}`) was not shipped: {usercode.OUTSIDE}"
    return None


def _is_gpu_oom(err: WorkerError) -> bool:
    """torch's ``OutOfMemoryError`` (torch.cuda, torch.OutOfMemoryError), or the RuntimeError
    older torch raised with "CUDA out of memory"."""
    module = str(err.get("type_module") or "")
    if err.get("type") == "OutOfMemoryError" and module.split(".")[0] == "torch":
        return True
    return err.get("type") == "RuntimeError" and "CUDA out of memory" in str(err.get("message"))


def _faulthandler_stack(stderr: str) -> str:
    """The faulthandler block of stderr ("Fatal Python error: ..." and the stack after it).
    A deep stack (a stack overflow: 100 frames, each with its file's whole path) can be longer
    than the tail of stderr that is read: then the block from its first thread or frame line."""
    idx = stderr.rfind("Fatal Python error")
    if idx < 0:
        found = re.search(
            r'^(Current thread 0x|Thread 0x|\s*File ".*", line \d+ in )', stderr, re.M
        )
        if found is None:
            return ""
        idx = found.start()
    return stderr[idx:].strip()


HANG_REMEDY = (
    "if it hangs (a deadlock: a lock, queue or collective that is never released, a rank that "
    "died, input that never comes), the traceback's stacks show where each thread waited: fix "
    "that; if it only needs longer, raise time_limit=... or make the function faster"
)


_FRAME = re.compile(r'^\s*File "([^"]*)", line (\d+) in (\S+)')


_LIBRARY = ("/lib/python", "site-packages", "dist-packages", "<frozen", "/gpuctl/", "<string>")


def _frames(block: str) -> list[tuple[str, str, str]]:
    """(file, line, function) of each frame line of a faulthandler block, innermost first."""
    found = []
    for line in block.splitlines():
        m = _FRAME.match(line)
        if m:
            found.append((m.group(1), m.group(2), m.group(3)))
    return found


def _user_frame(frames: list[tuple[str, str, str]]) -> tuple[str, str, str] | None:
    """The innermost frame of the user's own code: not the standard library, an installed
    package or the runner (its worker script)."""
    for f in frames:
        if any(part in f[0] for part in _LIBRARY):
            continue
        if f[0].endswith("/" + jobfiles.WORKER_SCRIPT) and f[2] in ("run", "main"):
            continue
        return f
    return None


def waiting_in(stacks: str) -> str:
    """Where a job whose stacks were dumped was waiting: "fn (file, line N)" of the innermost
    frame of the user's code in the thread that got the signal (faulthandler's "Current
    thread", the main thread as a rule), and the call it was in when that was a library's;
    "" when the dump has no such frame."""
    blocks = re.split(r"\n\s*\n", stacks)
    current = [b for b in blocks if b.lstrip().startswith("Current thread")]
    for block in current + [b for b in blocks if b not in current]:
        frames = _frames(block)
        mine = _user_frame(frames)
        if mine is None:
            continue
        where = f"{mine[2]} ({mine[0]}, line {mine[1]})"
        inner = frames[0]
        if inner != mine:
            where += f", in {inner[2]} of {inner[0].rsplit('/', 1)[-1]}"
        return where
    return ""


def stack_overflow(stack: str) -> str:
    """For a crash's faulthandler stack whose frames repeat (recursion deeper than the C
    stack): "fn (file, line N) called itself N times in the last frames shown", else ""."""
    frames = _frames(stack)
    if len(frames) < 30:
        return ""
    counts: dict[tuple[str, str, str], int] = {}
    for f in frames:
        counts[f] = counts.get(f, 0) + 1
    top, n = max(counts.items(), key=lambda kv: kv[1])
    if n < len(frames) // 3:
        return ""
    return (
        f"the same frames repeat: {top[2]} ({top[0]}, line {top[1]}) is {n} of the last "
        f"{len(frames)} frames shown (deep recursion)"
    )


def threads_note(o: Outcome) -> str:
    """ "16 threads (...)": how many threads the job's math libraries started, and why."""
    t = o.get("threads") or {}
    n = t.get("count")
    if not n:
        return ""
    if t.get("source") == "OMP_NUM_THREADS":
        return f"{n} thread(s) (OMP_NUM_THREADS={n})"
    return f"{n} thread(s) (OMP_NUM_THREADS unset: the {t.get('cpus', n)} CPUs it may use)"


def left_note(o: Outcome) -> str:
    """The line that names the processes the function left running (ended by gpuctl)."""
    left = o.get("left_running") or []
    if not left:
        return ""
    shown = "; ".join(f"pid {p.get('pid')} `{p.get('cmd') or '?'}`" for p in left[:3])
    more = f" and {len(left) - 3} more" if len(left) > 3 else ""
    return (
        f"the function left {len(left)} process(es) running when it finished, and gpuctl stopped "
        f"them (TERM, then KILL): {shown}{more}"
    )


# torch's words when CUDA is asked of a build without it (``torch.cuda._lazy_init``)
CPU_TORCH = "Torch not compiled with CUDA enabled"


def shm_note(o: Outcome) -> str:
    """The line that names the files that appeared in ``/dev/shm`` during the job and outlive
    it (RAM held on the node until removed), with the memory each holds."""
    left = o.get("shm_left") or []
    if not left:
        return ""
    shown = ", ".join(f"{f.get('path')} ({_fmt_bytes(f.get('bytes'))})" for f in left[:3])
    more = f" and {len(left) - 3} more" if len(left) > 3 else ""
    host = o.get("hostname") or "the node"
    return (
        f"{len(left)} file(s) appeared in /dev/shm on {host} while the job ran and are still "
        f"there, holding memory: {shown}{more} (remove them once nothing uses them)"
    )


def end_notes(o: Outcome) -> list[str]:
    """What a job's end left to know beside its result: processes gpuctl stopped (a sidecar),
    files left in ``/dev/shm``."""
    return [n for n in (left_note(o), shm_note(o)) if n]


def _relative_missing(err: WorkerError) -> str:
    """The relative path of a FileNotFoundError the function raised, else ""."""
    if err.get("type") != "FileNotFoundError":
        return ""
    m = re.search(r"No such file or directory: '([^']+)'", str(err.get("message") or ""))
    path = m.group(1) if m else ""
    return path if path and not path.startswith(("/", "~")) else ""


def name_cells(traceback: str, cells: object) -> str:
    """``traceback`` with each notebook cell's frame named as IPython names it (``cells``:
    meta.json's, from ``sources.cell_names``): ``File "/tmp/ipykernel_1/2.py", line 4, in f``
    becomes ``Cell In[3], line 4, in f``."""
    if isinstance(cells, dict):
        for name, label in cells.items():
            if isinstance(name, str) and isinstance(label, str):
                traceback = traceback.replace(f'File "{name}", line ', f"Cell {label}, line ")
    return traceback


def _disk_lines(disk: object, tb: str, code: object) -> list[str]:
    """The evidence of a full disk the worker gathered (``worker._disk_evidence``): the file
    that grew (and the next largest when it is a tenth of its size or more), the file system
    and its free space; and the line of the function that wrote."""
    lines = []
    if isinstance(disk, dict) and disk.get("full") is False and not disk.get("named"):
        lines.append(
            f"the job folder's file system (mounted at {disk.get('mount')}) has "
            f"{_fmt_bytes(disk.get('free_bytes'))} free: the one that filled is another, "
            "and the OSError names no file (see the line that raised it)"
        )
    elif isinstance(disk, dict):
        files = [f for f in disk.get("files") or [] if isinstance(f, list) and len(f) == 2]
        if disk.get("named"):
            lines.append(f"the OSError names {disk['named']}")
        if files:
            path, size = files[0]
            lines.append(f"the file that grew: {path} ({_fmt_bytes(size)})")
            lines += [
                f"next largest: {p} ({_fmt_bytes(n)})"
                for p, n in files[1:]
                if isinstance(n, int) and isinstance(size, int) and n * 10 >= size
            ]
        if disk.get("mount"):
            lines.append(
                f"its file system (mounted at {disk['mount']}) had "
                f"{_fmt_bytes(disk.get('free_bytes'))} free of {_fmt_bytes(disk.get('size_bytes'))}"
            )
    at = _raised_at(tb, f"[Errno {code}]" if code else "No space left")
    if at:
        lines.append(f"raised at {at}")
    return lines


def _raised_at(tb: str, marker: str) -> str:
    """``File ..., line N, in f: <its line>`` of the innermost frame of the first exception
    of ``tb``'s chain whose last line has ``marker`` (the last exception's when none has)."""
    blocks: list[list[str]] = [[]]
    for line in tb.splitlines():
        if line.startswith(("During handling of the above", "The above exception was")):
            blocks.append([])
        else:
            blocks[-1].append(line)
    pick = next((b for b in blocks if any(marker in x for x in b[-3:] if x.strip())), blocks[-1])
    frames = [i for i, line in enumerate(pick) if line.lstrip().startswith("File ")]
    if not frames:
        return ""
    at = pick[frames[-1]].strip()
    src = pick[frames[-1] + 1].strip() if frames[-1] + 1 < len(pick) else ""
    if src and not src.startswith("File ") and marker not in src and "Error" not in src[:30]:
        at += f": {src}"
    return at


def _oom_delta(outcome: Outcome) -> int:
    before = (outcome.get("cgroup_before") or {}).get("oom_kill")
    after = (outcome.get("cgroup_after") or {}).get("oom_kill")
    if isinstance(before, int) and isinstance(after, int):
        return after - before
    return 0


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
