"""VENV2 worker: loads ``payload.pkl`` from a job folder, runs the function, saves the result.

``python -X faulthandler worker.py JOBDIR``, started by the supervisor (a copy of this file lives
in every job folder; it imports only the standard library and cloudpickle). Every phase is a line
in ``status.jsonl`` (``start → env_ok → loading → running → saving → done``). The first error is
written once to ``error.json`` (kind, type, message, traceback, phase) and never overwritten: a
later failure cannot hide the cause. The result is written to a temporary name and renamed to
``result.pkl``, with a small ``result.json`` (type, size, short repr) beside it.

Exit codes: 0 done, 1 the function raised, 3 environment check failed, 4 load failed, 5 save
failed, 6 the function called ``sys.exit``.
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

JOBDIR = ""
_PID = os.getpid()


def _path(name):
    return os.path.join(JOBDIR, name)


def phase(name, **extra):
    """Append one status line; flushed and fsynced so it survives a crash right after."""
    record = {"phase": name, "t": time.time()}
    record.update(extra)
    with open(_path("status.jsonl"), "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def first_error(kind, current_phase, exc=None, message=None, **extra):
    """Write ``error.json`` unless an earlier error is already there (O_EXCL: first one wins)."""
    record = {
        "kind": kind,
        "phase": current_phase,
        "type": type(exc).__name__ if exc is not None else None,
        "module": type(exc).__module__ if exc is not None else None,
        "message": message if message is not None else (str(exc) if exc is not None else ""),
        "traceback": traceback.format_exc() if exc is not None else "",
        "t": time.time(),
    }
    record.update(extra)
    try:
        fd = os.open(_path("error.json"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as e:
        if e.errno == errno.EEXIST:
            return False
        raise
    with os.fdopen(fd, "w") as f:
        json.dump(record, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    return True


def _short_repr(value, limit=200):
    try:
        text = repr(value)
    except Exception as e:
        text = f"<repr failed: {type(e).__name__}>"
    return text if len(text) <= limit else text[:limit] + "..."


def _watch_os_exit(state):
    """Record a call to os._exit before it happens (it skips every handler)."""
    real = os._exit

    def recording_exit(code):
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
        real(code)

    os._exit = recording_exit


def run(jobdir):
    global JOBDIR
    JOBDIR = os.path.abspath(jobdir)
    # The job folder is sys.path[0] (this script lives there); its worker.py/supervisor.py
    # must not shadow the user's own modules of those names.
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or ".") == here:
        del sys.path[0]
    state = {"phase": "start"}
    phase("start", pid=os.getpid(), python=sys.version.split()[0], executable=sys.executable)
    with open(_path("meta.json")) as f:
        meta = json.load(f)
    # Stack dumps on request (SIGUSR2), into stderr.txt; SIGUSR1 (Slurm's warning) is noted.
    faulthandler.register(signal.SIGUSR2, all_threads=True)
    signal.signal(signal.SIGUSR1, lambda s, f: phase("warning_signal", signal="SIGUSR1"))

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
    try:
        with open(_path("payload.pkl"), "rb") as f:
            fn, args, kwargs = cloudpickle.load(f)
    except ImportError as e:
        name = getattr(e, "name", None)
        first_error("module_missing", "loading", e, module=name, venv2_executable=sys.executable)
        return 4
    except BaseException as e:
        first_error("load_failed", "loading", e)
        return 4

    state["phase"] = "running"
    phase("running")
    try:
        result = fn(*args, **kwargs)
    except SystemExit as e:
        first_error(
            "sys_exit",
            "running",
            e,
            message=f"the function called sys.exit({e.code!r})",
            code=e.code if isinstance(e.code, (int, str, type(None))) else repr(e.code),
        )
        return 6
    except BaseException as e:
        pickled = _save_exception(cloudpickle, e)
        kind = "memory_error" if isinstance(e, MemoryError) else "user_exception"
        first_error(kind, "running", e, pickled=pickled)
        return 1
    del args, kwargs

    state["phase"] = "saving"
    phase("saving")
    tmp = _path("result.pkl.tmp")
    try:
        with open(tmp, "wb") as f:
            cloudpickle.dump(result, f, protocol=5 if sys.version_info >= (3, 8) else None)
            f.flush()
            os.fsync(f.fileno())
        size = os.path.getsize(tmp)
        os.replace(tmp, _path("result.pkl"))
    except OSError as e:
        _remove(tmp)
        kind = "disk_full" if e.errno in (errno.ENOSPC, errno.EDQUOT) else "save_failed"
        first_error(kind, "saving", e)
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
    with open(_path("result.json.tmp"), "w") as f:
        json.dump(info, f)
    os.replace(_path("result.json.tmp"), _path("result.json"))
    state["phase"] = "done"
    phase("done")
    return 0


def _save_exception(cloudpickle, exc):
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
        with open(_path("exception.pkl.tmp"), "wb") as f:
            f.write(data)
        os.replace(_path("exception.pkl.tmp"), _path("exception.pkl"))
        return True
    return False


def _remove(path):
    with contextlib.suppress(OSError):
        os.unlink(path)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.stderr.write("usage: worker.py JOBDIR\n")
        return 2
    try:
        code = run(argv[0])
    except BaseException as e:  # a bug here must still leave its trace in error.json
        try:
            first_error("worker_failed", "worker", e)
        except Exception:
            traceback.print_exc()
        code = 7
    sys.stdout.flush()
    sys.stderr.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
