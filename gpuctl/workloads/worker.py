"""VENV2 worker: loads ``payload.pkl`` from a job folder, runs the function, saves the result.

``python -X faulthandler worker.py JOBDIR``, started by the supervisor (a copy of this file lives
in every job folder; it imports only the standard library, cloudpickle and the job folder's
contract, ``gpuctl_runner.jobfiles`` beside it). Its annotations are quoted: it must import
under any Python, to report a VENV2 of the wrong version. Every phase is a line
in ``status.jsonl`` (``start → env_ok → loading → running → saving → done``). The first error is
written once to ``error.json`` (kind, type, message, traceback, phase) and never overwritten: a
later failure cannot hide the cause. The result is written to a temporary name and renamed to
``result.pkl``, with a small ``result.json`` (type, size, short repr) beside it.

Exit codes: 0 done, 1 the function raised, 3 environment check failed, 4 load failed, 5 save
failed, 6 the function called ``sys.exit``, 8 (``jobfiles.CHECKPOINTED_EXIT``) a checkpointable
function checkpointed on SIGUSR1 (a time-limit warning or a preemption; see ``_arm_checkpoint``).
"""

import contextlib
import errno
import faulthandler
import json
import os
import signal
import sys
import time
import traceback
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuctl.node import jobfiles
else:
    try:  # a script in a job folder: the contract's copy sits beside it (sys.path[0])
        from gpuctl_runner import jobfiles
    except ImportError:
        try:  # imported from the gpuctl package
            from gpuctl.node import jobfiles
        except ImportError:
            # run again as ``__mp_main__`` by a child that multiprocessing spawned (a spawn
            # Pool, DataLoader workers): its path is the worker's, without the job folder
            sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
            try:
                from gpuctl_runner import jobfiles
            finally:
                del sys.path[0]

JOBDIR = ""
_PID = os.getpid()


def _path(name: str) -> str:
    return os.path.join(JOBDIR, name)


def phase(name: str, **extra: Any) -> None:
    """Append one status line; flushed and fsynced so it survives a crash right after."""
    record = {"phase": name, "t": time.time()}
    record.update(extra)
    jobfiles.append_line(_path(jobfiles.STATUS), record)


def _note_signal(name: str) -> None:
    """A signal the job was sent, as a status line without a phase (readers skip it)."""
    jobfiles.append_line(_path(jobfiles.STATUS), {"signal": name, "t": time.time()})


def first_error(
    kind: str,
    current_phase: str,
    exc: "BaseException | None" = None,
    message: "str | None" = None,
    **extra: Any,
) -> bool:
    """Write the error file unless an earlier error is already there (the first one wins)."""
    record = {
        "kind": kind,
        "phase": current_phase,
        "type": type(exc).__name__ if exc is not None else None,
        # the exception class's own module; "module" is the module an ImportError could not find
        "type_module": type(exc).__module__ if exc is not None else None,
        "module": getattr(exc, "name", None) if isinstance(exc, ImportError) else None,
        "message": message if message is not None else (str(exc) if exc is not None else ""),
        # bounded, and never raising: the frames without their lines when those cannot be read
        "traceback": jobfiles.format_exception(exc) if exc is not None else "",
        "t": time.time(),
    }
    record.update(extra)
    return jobfiles.write_json_once(_path(jobfiles.ERROR), record)


# A cancel (the supervisor's SIGTERM, a Ctrl-C's SIGINT, a hang-up) still ends the job as it would.
_KEEP_HANDLERS = ("SIGTERM", "SIGINT", "SIGHUP")


def _ignore(signum: int, frame: Any) -> None:
    """A signal that came after the function ended: its handler is not run."""


def _quiet_signals() -> None:
    """Once the function has ended, the Python signal handlers it left behind are not run
    again: such a handler could raise in the middle of the report of how the function ended
    and replace it (torch's SIGCHLD handler raises at each signal once a DataLoader worker is
    dead, the report reads the source lines of the traceback, and a signal then made a
    ``RuntimeError`` of the function an exit without a result). Handlers the process set in C
    (faulthandler's) stay, and so do those of the termination signals (a cancel)."""
    keep = {getattr(signal, name) for name in _KEEP_HANDLERS if hasattr(signal, name)}
    for _ in range(8):
        try:
            for signum in range(1, signal.NSIG):
                if signum in keep:
                    continue
                try:
                    if callable(signal.getsignal(signum)):
                        signal.signal(signum, _ignore)
                except (OSError, ValueError):
                    continue
            return
        except Exception:  # a handler that ran (and raised) before it was replaced: again
            continue


def _short_repr(value: Any, limit: int = 200) -> str:
    try:
        text = repr(value)
    except Exception as e:
        text = f"<repr failed: {type(e).__name__}>"
    return text if len(text) <= limit else text[:limit] + "..."


def _watch_os_exit(state: "dict[str, str]") -> None:
    """Record a call to os._exit before it happens (it skips every handler)."""
    real = os._exit

    def recording_exit(code: int) -> Any:
        # Only this process: forked children (multiprocessing) use os._exit as normal exit.
        if os.getpid() == _PID:
            with contextlib.suppress(Exception):
                first_error(
                    "os_exit",
                    state["phase"],
                    message=f"the function called os._exit({code!r})",
                    code=code,
                    stack="".join(traceback.format_stack()[:-1]),
                )
            _remove(_path(jobfiles.RESERVE))
        real(code)

    os._exit = recording_exit  # type: ignore[assignment]


_REAL_EXIT = os._exit  # the checkpoint's exit is not the function's os._exit


def _unpack_resubmission(nxt: Any) -> "tuple[Any, tuple[Any, ...], dict[str, Any]]":
    """(function, args, kwargs) of what ``checkpoint()`` returned: gpuctl's ``Resubmit`` or
    anything with ``function``/``args``/``kwargs`` (submitit's ``DelayedSubmission``)."""
    fn = getattr(nxt, "function", None)
    if not callable(fn):
        raise TypeError(
            f"checkpoint() returned {type(nxt).__name__}, not a Resubmit(function, *args, **kwargs)"
        )
    return fn, tuple(getattr(nxt, "args", ()) or ()), dict(getattr(nxt, "kwargs", {}) or {})


def _arm_checkpoint(cloudpickle: ModuleType, fn: Any, args: Any, kwargs: Any) -> None:
    """SIGUSR1 (Slurm's time-limit warning; the supervisor's own outside Slurm) makes a
    checkpointable function (one with a ``checkpoint`` method, submitit's contract) pickle what
    ``fn.checkpoint(*args, **kwargs)`` returns into ``checkpoint.pkl`` and end this attempt with
    ``CHECKPOINTED_EXIT``; the supervisor starts the next attempt from it. A checkpoint that
    returns None or fails leaves the job running (the failure is a status note). Under Slurm
    (``jobfiles.TERM_WAITS_ENV`` set by the supervisor) the first SIGTERM is only noted: a
    preemption sends it to every process of the job, and the supervisor answers with SIGUSR1
    (checkpoint) or, for a cancel, a second SIGTERM."""

    def on_warning(signum: int, frame: Any) -> None:
        _note_signal("SIGUSR1")
        try:
            nxt = fn.checkpoint(*args, **kwargs)
            if nxt is None:
                return
            payload = _unpack_resubmission(nxt)
            tmp = _path(jobfiles.CHECKPOINT + ".tmp")
            with open(tmp, "wb") as f:
                cloudpickle.dump(payload, f, protocol=5 if sys.version_info >= (3, 8) else None)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, _path(jobfiles.CHECKPOINT))
        except BaseException as e:
            jobfiles.append_line(
                _path(jobfiles.STATUS),
                {"checkpoint_error": f"{type(e).__name__}: {e}", "t": time.time()},
            )
            traceback.print_exc()
            return
        phase("checkpointed")
        _remove(_path(jobfiles.RESERVE))
        sys.stdout.flush()
        sys.stderr.flush()
        _REAL_EXIT(jobfiles.CHECKPOINTED_EXIT)

    signal.signal(signal.SIGUSR1, on_warning)
    if os.environ.get(jobfiles.TERM_WAITS_ENV):

        def on_first_term(signum: int, frame: Any) -> None:
            # the supervisor decides: SIGUSR1 for a preemption, SIGTERM again for a cancel
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            _note_signal("SIGTERM")

        signal.signal(signal.SIGTERM, on_first_term)


def run(jobdir: str) -> int:
    global JOBDIR
    JOBDIR = os.path.abspath(jobdir)
    # The job folder is sys.path[0] (this script lives there); its worker.py/supervisor.py
    # must not shadow the user's own modules of those names.
    # (real paths: Python resolves a linked script's folder, as in a task folder of a job of
    # several tasks)
    here = os.path.dirname(os.path.realpath(__file__))
    if sys.path and os.path.realpath(sys.path[0] or ".") == here:
        del sys.path[0]
    state = {"phase": "start"}
    phase("start", pid=os.getpid(), python=sys.version.split()[0], executable=sys.executable)
    with open(_path(jobfiles.META)) as f:
        meta = json.load(f)
    _use_shipped_code(meta.get("code"))
    # Stack dumps on request (SIGUSR2), into stderr.txt; SIGUSR1 (Slurm's warning) is noted as
    # a line of its own that names no phase: the job stays in the phase it was in.
    faulthandler.register(signal.SIGUSR2, all_threads=True)
    signal.signal(signal.SIGUSR1, lambda s, f: _note_signal("SIGUSR1"))

    state["phase"] = "env_check"
    want = [int(x) for x in meta["python_version"].split(".")[:2]]
    have = list(sys.version_info[:2])
    if have != want:
        first_error(
            "python_mismatch",
            "env_check",
            message=f"VENV2 runs Python {have[0]}.{have[1]} but the function was pickled by"
            f" Python {want[0]}.{want[1]}",
            venv2_python=sys.version.split()[0],
            venv2_executable=sys.executable,
            pickler_python=meta["python_version"],
        )
        return 3
    try:
        import cloudpickle
    except ImportError as e:
        first_error(
            "module_missing", "env_check", e, module="cloudpickle", venv2_executable=sys.executable
        )
        return 3
    mine = cloudpickle.__version__
    theirs = meta.get("cloudpickle_version", "")
    if mine.split(".")[:2] != theirs.split(".")[:2]:
        first_error(
            "cloudpickle_mismatch",
            "env_check",
            message=f"VENV2 has cloudpickle {mine} but the payload was written by"
            f" cloudpickle {theirs}",
            venv2_cloudpickle=mine,
            pickler_cloudpickle=theirs,
        )
        return 3
    phase("env_ok", cloudpickle=mine)
    _watch_os_exit(state)

    state["phase"] = "loading"
    phase("loading")
    _load_sources()
    try:
        with open(_path(jobfiles.PAYLOAD), "rb") as f:
            fn, args, kwargs = cloudpickle.load(f)
    except ImportError as e:
        name = getattr(e, "name", None)
        kind, versions = _import_failure(name, meta.get("dists") or {})
        first_error(kind, "loading", e, module=name, venv2_executable=sys.executable, **versions)
        return 4
    except BaseException as e:
        first_error("load_failed", "loading", e)
        return 4

    if callable(getattr(fn, "checkpoint", None)):
        _arm_checkpoint(cloudpickle, fn, args, kwargs)
    state["phase"] = "running"
    phase("running")
    _hold_reserve()
    try:
        result = fn(*args, **kwargs)
    except SystemExit as e:
        _quiet_signals()
        first_error(
            "sys_exit",
            "running",
            e,
            message=f"the function called sys.exit({e.code!r})",
            code=e.code if isinstance(e.code, (int, str, type(None))) else repr(e.code),
        )
        return 6
    except BaseException as e:
        _quiet_signals()  # first: nothing may replace the function's exception from here on
        if isinstance(e, OSError) and _is_disk_full(e):  # the space held for the report
            disk = _disk_evidence(e)  # its free space before the held space is given back
            _remove(_path(jobfiles.RESERVE))
            first_error("disk_full", "running", e, disk=disk, errno=e.errno)
            _save_exception(cloudpickle, e)
            return 1
        pickled = _save_exception(cloudpickle, e)
        kind = "memory_error" if isinstance(e, MemoryError) else "user_exception"
        first_error(kind, "running", e, pickled=pickled)
        return 1
    _quiet_signals()
    del args, kwargs

    state["phase"] = "saving"
    phase("saving")
    tmp = _path(jobfiles.RESULT + ".tmp")
    try:
        with open(tmp, "wb") as f:
            cloudpickle.dump(result, f, protocol=5 if sys.version_info >= (3, 8) else None)
            f.flush()
            os.fsync(f.fileno())
        size = os.path.getsize(tmp)
        os.replace(tmp, _path(jobfiles.RESULT))
    except OSError as e:
        if _is_disk_full(e):
            disk = _disk_evidence(e)  # result.pkl.tmp named with its size, then removed
            _remove(_path(jobfiles.RESERVE))
            _remove(tmp)
            first_error("disk_full", "saving", e, disk=disk, errno=e.errno)
            return 5
        _remove(tmp)
        first_error("save_failed", "saving", e)
        return 5
    except BaseException as e:
        _remove(tmp)
        first_error("unpicklable_result", "saving", e, result_type=type(result).__name__)
        return 5
    info = {
        "type": f"{type(result).__module__}.{type(result).__qualname__}",
        "size": size,
        "repr": _short_repr(result),
    }
    jobfiles.write_json(_path(jobfiles.RESULT_INFO), info)
    state["phase"] = "done"
    phase("done")
    return 0


def _is_disk_full(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)


def _hold_reserve() -> None:
    """Write ``jobfiles.RESERVE`` (real blocks, not a sparse file): freed when the disk fills,
    it leaves room for the report. A disk already too full for it holds nothing."""
    try:
        with open(_path(jobfiles.RESERVE), "wb") as f:
            f.write(b"\xff" * jobfiles.RESERVE_BYTES)
            f.flush()
            os.fsync(f.fileno())
    except OSError:
        _remove(_path(jobfiles.RESERVE))


# free space under which a file system counts as the one that filled (its free space is
# measured before the worker gives back what it held)
FULL_BELOW = 16 << 20

# the worker's own files of a job folder: never "the file that grew" (stdout/stderr and the
# result's temporary file are: the function's prints and its return value)
_OWN = {
    jobfiles.STATUS,
    jobfiles.META,
    jobfiles.PAYLOAD,
    jobfiles.SOURCES,
    jobfiles.RESERVE,
    jobfiles.ERROR,
    jobfiles.WORKER_SCRIPT,
    jobfiles.SUPERVISOR_SCRIPT,
}


def _disk_evidence(e: OSError, limit: int = 2000) -> "dict[str, Any]":
    """What filled the disk: the largest files (at most ``limit`` looked at) of the full file
    system (the one of the file the OSError names, else the job folder's) in that file's
    folder, the job folder, the function's working folder and the file system's top (each at
    its top level and one below), its mount point and free space, and whether it is ``full``
    (under ``FULL_BELOW`` free: a write with no file named may have filled another one).
    Never raises."""
    out = {}  # type: dict[str, Any]
    try:
        named = getattr(e, "filename", None)
        named = os.path.abspath(named) if isinstance(named, str) and named else None
        base = JOBDIR
        if named and os.path.isdir(os.path.dirname(named)):
            base = os.path.dirname(named)
        mount = os.path.realpath(base)
        while not os.path.ismount(mount) and os.path.dirname(mount) != mount:
            mount = os.path.dirname(mount)
        dev = os.stat(base).st_dev
        sizes = {}  # type: dict[str, int]
        seen = 0
        for top in dict.fromkeys([base, JOBDIR, os.getcwd(), mount]):
            with contextlib.suppress(OSError):
                if os.stat(top).st_dev != dev:  # another file system did not fill
                    continue
            todo = [(top, 0)]
            while todo and seen < limit:
                folder, depth = todo.pop()
                try:
                    entries = list(os.scandir(folder))
                except OSError:
                    continue
                for entry in entries[: limit - seen]:
                    seen += 1
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            if depth < 1 and entry.name != jobfiles.RUNNER_PACKAGE:
                                todo.append((entry.path, depth + 1))
                        elif entry.is_file(follow_symlinks=False):
                            if folder == JOBDIR and entry.name in _OWN:
                                continue
                            st = entry.stat(follow_symlinks=False)
                            if st.st_dev == dev:
                                sizes[entry.path] = st.st_size
                    except OSError:
                        continue
        if named:
            out["named"] = named
            with contextlib.suppress(OSError):
                sizes[named] = os.path.getsize(named)
        biggest = sorted(sizes.items(), key=lambda kv: -kv[1])[:3]
        out["files"] = [[path, size] for path, size in biggest]
        vfs = os.statvfs(base)
        out["mount"] = mount
        out["free_bytes"] = vfs.f_bavail * vfs.f_frsize
        out["size_bytes"] = vfs.f_blocks * vfs.f_frsize
        out["full"] = out["free_bytes"] < FULL_BELOW
    except Exception as x:
        out["error"] = f"{type(x).__name__}: {x}"
    return out


def _load_sources() -> None:
    """The text of the files whose code the payload carries (``jobfiles.SOURCES``) into
    linecache: tracebacks then show the user's lines where the node lacks the file. An entry
    without a modification time is never checked against the disk."""
    import linecache

    data = jobfiles.read_json(_path(jobfiles.SOURCES), None)
    if not isinstance(data, dict):
        return
    for name, text in data.items():
        if isinstance(name, str) and isinstance(text, str):
            linecache.cache[name] = (len(text), None, text.splitlines(True), name)


def _use_shipped_code(folder: "str | None") -> None:
    """The user's modules shipped with the job (``gpuctl.jobs.usercode``) come first on the path,
    for this process and the Python processes the function starts."""
    if not folder:
        return
    sys.path.insert(0, folder)
    rest = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = folder + (os.pathsep + rest if rest else "")


def _import_failure(name: "str | None", dists: "dict[str, Any]") -> "tuple[str, dict[str, str]]":
    """``version_mismatch`` (with both versions) when the payload misses a submodule of a
    distribution VENV2 has at another version than the submitter's, else ``module_missing``."""
    top = (name or "").split(".")[0]
    found = dists.get(top)
    if not name or "." not in name or not isinstance(found, list) or len(found) != 2:
        return "module_missing", {}
    import importlib.metadata

    dist, theirs = str(found[0]), str(found[1])
    try:
        mine = importlib.metadata.version(dist)
    except Exception:
        return "module_missing", {}
    if mine == theirs:
        return "module_missing", {}
    return "version_mismatch", {"dist": dist, "venv2_version": mine, "pickler_version": theirs}


def _save_exception(cloudpickle: ModuleType, exc: BaseException) -> bool:
    """Pickle the exception for the submitter: whole, and as (type, args, __dict__), because
    an exception whose __init__ takes other arguments than its args cannot be unpickled whole."""
    try:
        whole = cloudpickle.dumps(exc)
    except Exception:
        whole = None
    for record in (
        {"whole": whole, "type": type(exc), "args": exc.args, "dict": dict(vars(exc))},
        {"whole": whole, "type": type(exc), "args": tuple(repr(a) for a in exc.args), "dict": {}},
    ):
        try:
            data = cloudpickle.dumps(record)
        except Exception:
            continue
        tmp = _path(jobfiles.EXCEPTION + ".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, _path(jobfiles.EXCEPTION))
        return True
    return False


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def main(argv: "list[str] | None" = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.stderr.write(f"usage: {jobfiles.WORKER_SCRIPT} JOBDIR\n")
        return 2
    try:
        code = run(argv[0])
    except BaseException as e:  # a bug here must still leave its trace in error.json
        try:
            first_error("worker_failed", "worker", e)
        except Exception:
            traceback.print_exc()
        code = 7
    finally:
        if JOBDIR:
            _remove(_path(jobfiles.RESERVE))
    for stream in (sys.stdout, sys.stderr):
        # the function's last prints, on a full disk: lost, the exit stays the same
        with contextlib.suppress(Exception):
            stream.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
