"""The debug executor: ``Executor("debug")`` runs the function in this process, at once.

Breakpoints, ``pdb`` and a debugger's post-mortem work because nothing else runs: no job
folder, no supervisor, no VENV2, no limits, no job store row. What it keeps from the runner:
the call is pickled first (into nothing), so that an argument that could not travel is refused
here as ``submit`` refuses it; the result is pickled too; and the job it returns is a ``Job``
that is already over, whose ``result()``, ``exception()`` and ``report()`` answer as a real
job's would, the report coming from the same classifier (``classify.classify``) over the same
error record the worker writes.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import cloudpickle

from gpuctl.jobs.backends import Backend
from gpuctl.jobs.classify import JobFiles, classify
from gpuctl.jobs.job import SUBMITTER_PYTHON, Job
from gpuctl.jobs.records import Handle, JobMeta, WorkerError
from gpuctl.jobs.report import FailureReport
from gpuctl.node import jobfiles


class _Discard:
    """A file that keeps nothing: pickling into it only proves that the object pickles."""

    def write(self, data: bytes | bytearray | memoryview) -> int:
        return len(memoryview(data).cast("B"))


def check_pickles(obj: object) -> None:
    """Pickle ``obj`` as ``submit`` would, keeping nothing; raises what cloudpickle raises
    (``PicklingError``, ``TypeError``) for what cannot travel."""
    cloudpickle.dump(obj, _Discard(), protocol=5)


def _error(kind: str, exc: BaseException, **extra: Any) -> WorkerError:
    """The record the worker writes to ``error.json`` (``first_error``), for ``exc`` being
    handled now."""
    record: WorkerError = {
        "kind": kind,
        "phase": "running",
        "type": type(exc).__name__,
        "type_module": type(exc).__module__,
        "module": getattr(exc, "name", None) if isinstance(exc, ImportError) else None,
        "message": str(exc),
        "traceback": jobfiles.format_exception(exc),
        "t": time.time(),
    }
    record.update(extra)  # type: ignore[typeddict-item]
    return record


def run_here(
    backend: Backend,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    name: str,
    command: list[str] | None = None,
) -> DebugJob:
    """Call ``fn(*args, **kwargs)`` here and now; return the ``DebugJob`` holding how it ended.

    Raises what cloudpickle raises when the call cannot be pickled (before calling it), and
    ``KeyboardInterrupt``: a Ctrl-C here is this process's own, never the job's.
    """
    check_pickles((fn, args, kwargs))
    started = time.time()
    value: Any = None
    raised: BaseException | None = None
    error: WorkerError | None = None
    try:
        value = fn(*args, **kwargs)
    except KeyboardInterrupt:
        raise
    except SystemExit as e:
        code = e.code if isinstance(e.code, (int, str, type(None))) else repr(e.code)
        error = _error("sys_exit", e, message=f"the function called sys.exit({e.code!r})")
        if isinstance(code, int):
            error["code"] = code
    except BaseException as e:
        raised = e
        error = _error("memory_error" if isinstance(e, MemoryError) else "user_exception", e)
    else:
        try:
            check_pickles(value)
        except Exception as e:
            error = _error("unpicklable_result", e, result_type=type(value).__name__)
            error["phase"] = "saving"
    report = None
    job_id = uuid.uuid4().hex
    if error is not None:
        meta: JobMeta = {"command": command} if command is not None else {}
        files = JobFiles(
            outcome={"started_at": started, "ended_at": time.time()},
            status=[{"phase": error["phase"]}],
            error=error,
            meta=meta,
        )
        report = classify(files, job_id=job_id, submitter_python=SUBMITTER_PYTHON)
    return DebugJob(job_id, name, backend, started, value, raised, report)


class DebugJob(Job):
    """A job the debug executor ran in this process: over when ``submit`` returns.

    ``result()`` returns the value or raises the function's own exception (with its traceback
    in this process, for ``pdb.post_mortem``), ``report()`` is the runner's report; it has no
    folder, logs or store row (its output went to this process's stdout and stderr), and
    ``cancel()`` is False: there is nothing left to stop.
    """

    def __init__(
        self,
        job_id: str,
        name: str,
        backend: Backend,
        started: float,
        value: Any,
        raised: BaseException | None,
        report: FailureReport | None,
    ) -> None:
        super().__init__(job_id, name, "debug", backend, "", Handle(), None, started, watch=False)
        self._value = value
        self._raised = raised
        self._report = report
        self._final = True
        self._settle()

    def _poll(self) -> bool:
        return True

    def _read(self, name: str) -> bytes | None:
        return None

    def read_from(self, name: str, offset: int) -> bytes:
        """Nothing: a debug job's output went to this process's stdout and stderr."""
        return b""

    def logs(self) -> dict[str, str]:
        """None: a debug job has no folder."""
        return {}

    def _load_result(self) -> Any:
        return self._value

    def _load_exception(self) -> BaseException | None:
        return self._raised

    def copy_result(self, dest: str) -> None:
        """Write the result as a pickle to the file ``dest`` ("-": stdout)."""
        import sys

        data = cloudpickle.dumps(self.result(), protocol=5)
        if dest == "-":
            sys.stdout.flush()
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
            return
        with open(dest, "wb") as f:
            f.write(data)

    def dump_stacks(self) -> None:
        """Nothing to dump: the function has returned."""
