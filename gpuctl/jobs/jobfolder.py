"""Reading a submitted job's folder on its host: what the function printed (``stdout``,
``stderr``, ``read_output``, ``read_from``; ``read_lines`` brings only the lines asked for,
read on the host), the result's description (``result_info``), the JSON files through their
``gpuctl.jobs.records`` types, the paths of its logs, and its result and exception read back
and rebuilt here (``copy_result`` copies the result's pickle without unpickling it; a result
this Python cannot rebuild is a ``JobFailed`` of kind ``result_unloadable``; the user's
exception comes with the node's traceback as its ``RemoteTraceback`` cause). A job of several
tasks reads rank 0's outputs and names every rank's logs.

``JobFolder`` is the part of ``gpuctl.jobs.job.Job`` that reads: the ``Job`` sets its ``id``,
``target``, ``backend``, ``jobdir``, ``handle``, ``ranks`` and ``_files`` and adds the state,
the waiting and cancelling.
"""

from __future__ import annotations

import glob
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import cloudpickle

from gpuctl.core import wire
from gpuctl.jobs.backends import Backend
from gpuctl.jobs.errors import JobFailed, RemoteTraceback
from gpuctl.jobs.evidence import name_cells
from gpuctl.jobs.hosts import BinaryReader, HostError, LocalHost
from gpuctl.jobs.records import Handle, ResultInfo
from gpuctl.jobs.report import FailureReport
from gpuctl.node import jobfiles

if TYPE_CHECKING:
    from gpuctl.jobs.classify import JobFiles

T = TypeVar("T")

LINE_BYTES = 64 * 1024  # bytes a line at most, on average, that read_lines brings (tail=/head=)


class JobFolder:
    """A job's folder on its backend's host (see the module docstring)."""

    id: str
    target: str
    backend: Backend
    jobdir: str
    handle: Handle
    ranks: Sequence[JobFolder]  # a job of several tasks: one per rank, reading its folder
    _files: JobFiles | None  # what the folder held when the job was last classified

    def _read(self, name: str) -> bytes | None:
        return self.backend.host.read_bytes(f"{self.jobdir}/{name}")

    @property
    def _logs_dir(self) -> str:
        """Whose folder holds this job's outputs and result: its own, or rank 0's."""
        return self.ranks[0].jobdir if self.ranks else self.jobdir

    def read_from(self, name: str, offset: int) -> bytes:
        """The job folder's file ``name`` (``stdout.txt``, ``stderr.txt``, ...) from byte
        ``offset`` on (rank 0's for a job of several tasks): empty when absent. Raises
        ``HostError`` when the node does not answer."""
        folder = self._logs_dir
        return self.backend.host.read_bytes(f"{folder}/{name}", offset) or b""

    def _json(self, schema: type[T], name: str) -> T | None:
        """The job folder's JSON file ``name`` read as ``schema`` (None: absent or not an
        object; a field of the wrong type is left out)."""
        return wire.parse(schema, jobfiles.loads(self._read(name)))

    def result_info(self) -> ResultInfo | None:
        """What the job returned, as its worker described it once saved (type, size in bytes,
        a short repr), read without unpickling; None before then or when the folder is gone.
        ``HostError`` when the node does not answer."""
        return self._json(ResultInfo, jobfiles.RESULT_INFO)

    def _tail(self, name: str, limit: int = 6000) -> str:
        data = self._read(name) or b""
        return data[-limit:].decode("utf-8", "replace")

    def read_lines(
        self,
        name: str,
        *,
        tail: int | None = None,
        head: int | None = None,
        sized: bool = False,
        most_bytes: int | None = None,
    ) -> tuple[bytes, int | None]:
        """The last ``tail`` (or first ``head``) lines of the job folder's file ``name`` (rank
        0's for a job of several tasks), read on its host (``tail`` seeks from the end there):
        only those lines travel, at most ``LINE_BYTES`` a line on average (longer lines are
        cut, at the start for ``tail``). ``sized`` (with ``tail``): also the file's size the
        lines end at, to follow it from there (the node then reads the file through once);
        else None. ``most_bytes``: at most that many bytes travel, whatever the lines' count.
        Empty when absent; raises ``HostError`` when the node does not answer."""
        if (tail is None) == (head is None) or (tail or head or 0) < 0:
            raise ValueError("give one of tail= and head=, a whole number of lines, 0 or more")
        count = int(tail if tail is not None else head or 0)
        sized = sized and tail is not None
        path = f"{self._logs_dir}/{name}"
        most = str(most_bytes if most_bytes is not None else max(1, count) * LINE_BYTES)
        if tail is not None and sized:  # the size first: the lines shown are the ones before it
            script = 's=$(wc -c < "$1") || exit 3; echo "$s"; head -c "$s" -- "$1" | '
            script += 'tail -n "$2" | tail -c "$3"'
        elif tail is not None:
            script = 'tail -n "$2" -- "$1" | tail -c "$3"'
        else:
            script = 'head -n "$2" -- "$1" | head -c "$3"'
        script = f'[ -f "$1" ] || exit 3; {script}'
        rc, out, err = self.backend.host.run(
            ["sh", "-c", script, "sh", path, str(count), most], timeout=120
        )
        if rc == 3:
            return b"", 0 if sized else None
        if rc != 0:
            why = err.decode("utf-8", "replace").strip()[-300:] or f"exit status {rc}"
            raise HostError(f"{self.backend.host.name}: reading {path} failed: {why}")
        if not sized:
            return out, None
        size, _, data = out.partition(b"\n")
        return data, int(size.strip() or 0)

    def stdout(self, *, tail: int | None = None, head: int | None = None) -> str:
        """What the function printed to stdout so far (rank 0's); ``tail=N`` / ``head=N``: its
        last / first N lines only, and only those are read from the node."""
        return self._text(jobfiles.STDOUT, tail, head)

    def stderr(self, *, tail: int | None = None, head: int | None = None) -> str:
        """What went to stderr so far (tracebacks, faulthandler stacks, warnings; rank 0's);
        ``tail=N`` / ``head=N`` as for ``stdout``."""
        return self._text(jobfiles.STDERR, tail, head)

    def _text(self, name: str, tail: int | None, head: int | None) -> str:
        return self.read_output(name, tail=tail, head=head).decode("utf-8", "replace")

    def read_output(self, name: str, *, tail: int | None = None, head: int | None = None) -> bytes:
        """The bytes of the job folder's file ``name`` (``stdout.txt``, ``stderr.txt``; rank
        0's) as the job wrote them: all of it, or its last ``tail`` / first ``head`` lines."""
        if tail is None and head is None:
            return self.read_from(name, 0)
        return self.read_lines(name, tail=tail, head=head)[0]

    def logs(self) -> dict[str, str]:
        """Paths of the job's log files on its host (every rank's, named "rank R FILE")."""
        if self.ranks:
            return {
                f"rank {r} {name}": path
                for r, job in enumerate(self.ranks)
                for name, path in job.logs().items()
            }
        names = jobfiles.LOGS
        if not isinstance(self.backend.host, LocalHost):
            return {n: f"{self.backend.host.name}:{self.jobdir}/{n}" for n in names}
        found = {n: p for n in names if os.path.exists(p := f"{self.jobdir}/{n}")}
        pattern = str(self.handle.get("output") or "")
        for path in sorted(glob.glob(pattern))[:1] if pattern else ():
            found["slurm output"] = path  # where slurmstepd says why it killed the job
        return found

    def _load_result(self) -> Any:
        path = jobfiles.JobPaths(self.jobdir)(jobfiles.RESULT)
        host = self.backend.host
        # a node's result is unpickled as it arrives (no local copy): the worker renamed it
        # into place complete, and a transfer cut short raises HostError, never a short file
        shown = path if isinstance(host, LocalHost) else f"{host.name}:{path}"
        return self._unpickle_result(lambda: host.open_read(path), shown)

    def copy_result(self, dest: str) -> None:
        """Copy the result's pickle, as the worker wrote it, to the file ``dest`` ("-": stdout)
        without unpickling it: it works where the result's classes cannot be imported. The job
        must have succeeded (``result()`` says why when not)."""
        path = jobfiles.JobPaths(self._logs_dir)(jobfiles.RESULT)
        host = self.backend.host
        if dest == "-":
            sys.stdout.flush()
            sys.stdout.buffer.write(host.read_bytes(path) or b"")
            sys.stdout.buffer.flush()
        else:
            host.get_file(path, dest)

    def _unpickle_result(self, opener: Callable[[], BinaryReader], shown: str) -> Any:
        """The result from its file; one that this Python cannot rebuild (its class lives in a
        module not installed here, a newer pickle protocol) is a ``JobFailed`` that says so.
        Reading a node's may raise HostError (the node went away)."""
        try:
            with opener() as f:
                return cloudpickle.load(f)
        except HostError:
            raise
        except Exception as e:
            info = (self._files.result_info if self._files else None) or {}
            missing = getattr(e, "name", None) if isinstance(e, ImportError) else None
            evidence = [
                f"the job succeeded; its result ({info.get('type', 'unknown type')}, "
                f"{info.get('size', '?')} bytes) is in {shown}",
                f"unpickling it here failed: {type(e).__name__}: {e}",
            ]
            remedy = (
                f"install {missing!r} into this Python ({sys.executable}), or return plain data"
                if missing
                else "unpickle it with the Python and packages of VENV2, or return plain data"
            )
            raise JobFailed(
                FailureReport(
                    kind="result_unloadable",
                    phase="done",
                    evidence=tuple(evidence),
                    remedy=remedy,
                    logs=self.logs(),
                    job_id=self.id,
                )
            ) from e

    def _load_exception(self) -> BaseException | None:
        data = self._read(jobfiles.EXCEPTION)
        if not data:
            return None
        exc = _rebuild_exception(data)
        if exc is None:
            return None
        err = (self._files.error if self._files else None) or {}
        meta = (self._files.meta if self._files else None) or {}
        tb = name_cells(str(err.get("traceback") or ""), meta.get("cells"))
        exc.__cause__ = RemoteTraceback(tb)
        if hasattr(exc, "add_note"):  # Python 3.11+: shown under the exception, uncaught
            exc.add_note(
                f"(job {self.id} on {self.target}: `gpuctl logs {self.id}` shows its output)"
            )
        return exc


def _rebuild_exception(data: bytes) -> BaseException | None:
    """The user's exception from the worker's exception.pkl: whole when it unpickles, else
    rebuilt from (type, args, __dict__) without calling its ``__init__``."""
    try:
        record = cloudpickle.loads(data)
    except Exception:
        return None
    if not isinstance(record, dict):
        return None
    if record.get("whole"):
        try:
            exc = cloudpickle.loads(record["whole"])
        except Exception:
            exc = None
        if isinstance(exc, BaseException):
            return exc
    cls = record.get("type")
    if not (isinstance(cls, type) and issubclass(cls, BaseException)):
        return None
    try:
        rebuilt: BaseException = cls.__new__(cls)
        rebuilt.args = tuple(record.get("args") or ())
        rebuilt.__dict__.update(record.get("dict") or {})
    except Exception:
        return None
    return rebuilt
