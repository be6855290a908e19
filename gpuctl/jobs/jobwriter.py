"""Writing a job's folder on its target's host, before anything starts: the row in the job
store first ("preparing": a store that cannot be written refuses the job before anything
exists on the node), then the folder (mode 0700) with the payload (the measured bytes, or
pickled again straight into the file), its sources for tracebacks, the user's code folder
(once per content), the passed variables (a 0600 file), ``meta.json`` and the runner (or a
shared one); a job refused before it started is taken back (its folder, then its row).

``JobWriter`` is the part of ``gpuctl.jobs.executor.Executor`` that writes: the ``Executor``
sets the options it reads (below) and submits, starts and maps.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import cloudpickle

from gpuctl.jobs import _chunk, jobenv, sources, usercode
from gpuctl.jobs.backends import Backend, SlurmBackend
from gpuctl.jobs.hosts import Host
from gpuctl.jobs.job import SUBMITTER_PYTHON
from gpuctl.jobs.jobqueue import queue_owner
from gpuctl.jobs.pickling import _HashingWriter, _measure, _Pickled, pickling_by_value
from gpuctl.jobs.provision import Venv2, payload_distributions, payload_modules, write_runner
from gpuctl.jobs.records import JobMeta, Limits, Probe
from gpuctl.jobs.report import FailureReport
from gpuctl.jobs.store import JobRecord, JobStore
from gpuctl.node import jobfiles

if TYPE_CHECKING:
    from gpuctl.context import Context


class JobWriter:
    """Writes job folders for an ``Executor`` (see the module docstring)."""

    target: str
    backend: Backend
    limits: Limits
    tasks: int
    setup: tuple[str, ...]
    cwd: str
    job_env: dict[str, str]
    env_pass: tuple[str, ...]
    ship_limit: int
    ship_exclude: tuple[str, ...]
    _venv2: Venv2
    _store: JobStore | bool | None
    _context: Context | None
    _root_ready: bool
    _code_folders: set[str]
    _unseen: tuple[str, ...]

    @property
    def store(self) -> JobStore | None:
        """The job store this executor's rows go to (None: none; a debug job's is none: nothing
        of it outlives this process). ``store=True``: the session's, opened at the first use,
        the one every executor, ``attach`` and job command of the session shares. Raises
        ``StoreError`` when it cannot be opened (ConfigError: the process's config cannot be
        read to make its session)."""
        if self._store is True:
            from gpuctl.context import current

            self._store = (self._context or current()).job_store()
        return self._store or None

    def venv2(self) -> Probe:
        """Resolve (and build if asked) VENV2; return its probe ``{python, cloudpickle, ...}``.

        Raises ``JobFailed`` (env_build_failed, venv2_wont_start, python_mismatch,
        cloudpickle_mismatch, module_missing) with a remedy that says exactly what to do.
        """
        return self._venv2.probe()

    def _job_root(self) -> str:
        """The job root on the target's host (``~`` resolved there), created on first use."""
        root = self.backend.host.expand(self.backend.job_root)
        if not self._root_ready:
            self.backend.host.mkdir(root, 0o700)
            self._root_ready = True
        return root

    def _prepare(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        name: str,
        command: list[str] | None = None,
        *,
        registered: bool = False,
        runner: str | None = None,
        pickled: _Pickled | None = None,
    ) -> tuple[str, str, JobMeta]:
        """Write one job folder; return (id, jobdir, meta). ``registered``: the caller pickles
        under ``pickling_by_value`` already (a submit and a map do, once for all their chunks);
        ``runner``: a shared runner folder (``shared_runner``) instead of a copy in this one;
        ``pickled``: the payload ``(fn, args, kwargs)`` as the caller measured it.

        The job's row goes into the store first ("preparing"): a store that cannot be written
        refuses the job (``StoreError``) before anything exists on the node. A job that fails
        to be prepared (its function cannot be pickled) leaves no row."""
        probe = self.venv2()
        job_id = uuid.uuid4().hex
        jobdir = f"{self.backend.host.expand(self.backend.job_root)}/{job_id}"
        if self.store is not None:
            self.store.add(
                JobRecord(
                    id=job_id,
                    name=name,
                    target=self.target,
                    # who writes it: once that process is gone, it never starts
                    backend={**self.backend.describe(), "queued_by": queue_owner()},
                    jobdir=jobdir,
                    state="preparing",
                    created_at=time.time(),
                )
            )
        try:
            with contextlib.ExitStack() as registration:
                if not registered:
                    registration.enter_context(pickling_by_value(fn))
                return self._write_folder(
                    job_id, jobdir, fn, args, kwargs, name, probe, command, runner, pickled
                )
        except BaseException as e:  # a Ctrl-C during the upload too
            self._unwrite([(job_id, jobdir)], f"interrupted while its folder was written: {e!r}")
            raise

    def _refused_row(self, job_id: str, why: str) -> None:
        """End the row of a job refused before it started: ``never_started`` with ``why`` and
        what to do about it (not a Slurm job's remedy: there is no pending reason)."""
        if self.store is None:
            return
        report = FailureReport(
            kind="never_started",
            phase="not started",
            evidence=(why[:500],),
            remedy="fix what the line above says, then submit again",
            logs={},
            job_id=job_id,
        )
        self.store.update(
            job_id,
            state="failed",
            kind="never_started",
            summary=why[:500],
            ended_at=time.time(),
            report=report.to_dict(),
        )

    def _unwrite(self, folders: Sequence[tuple[str, str]], why: str) -> None:
        """Take back jobs refused before they started: their folders on the host go, then their
        rows. A folder that cannot be removed (the node went away) keeps its row, ended
        (``never_started``, ``why``), so that ``gpuctl jobs purge`` removes it later."""
        for job_id, jobdir in folders:
            try:
                self.backend.host.remove_tree(jobdir, timeout=30)
            except Exception as e:  # the refusal goes up, whatever this does
                with contextlib.suppress(Exception):
                    self._refused_row(job_id, f"{why}; its folder stayed ({e})")
                continue
            if self.store is not None:
                with contextlib.suppress(Exception):
                    self.store.delete(job_id)

    def _write_folder(
        self,
        job_id: str,
        jobdir: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        name: str,
        probe: Probe,
        command: list[str] | None,
        runner: str | None = None,
        pickled: _Pickled | None = None,
    ) -> tuple[str, str, JobMeta]:
        """The job folder, pickled under the caller's ``pickling_by_value``."""
        if self.tasks > 1 and callable(getattr(fn, "checkpoint", None)):
            raise ValueError(
                "checkpoint and requeue work for jobs of one task: submit a checkpointable "
                "function without nodes=/tasks_per_node="
            )
        host = self.backend.host
        if pickled is None:  # one pass: measured, scanned, and kept when small
            pickled = _measure((fn, args, kwargs), None, hashing=True, keep=True)
        # before the first byte goes out: what the payload holds loads in VENV2, and the user's
        # own modules it may import travel with it
        modules = payload_modules(pickled.modules)
        dists = payload_distributions(modules)
        self._venv2.check_distributions(modules, dists)
        user_fn = args[0] if fn is _chunk.run_chunk else fn  # a map's chunk runs the user's
        code = (
            usercode.UserCode()  # a command imports nothing of the submitter's
            if command is not None
            else self._user_code(user_fn)
        )
        root = self._job_root()
        host.mkdir(jobdir, 0o700)
        folder = code.folder(root) if code.files else None
        if folder is not None and folder not in self._code_folders:
            usercode.ship(host, root, code)
            self._code_folders.add(folder)
        limits = self.limits.copy()
        if (
            limits.get("mem_bytes")
            and isinstance(self.backend, SlurmBackend)
            and self.backend.memory_enforced()
        ):
            limits["mem_enforced_by"] = "slurm"
        digest, size, cells = self._write_payload(host, jobdir, (fn, args, kwargs), pickled)
        passed = self.passed_env()
        if passed:  # the values: a 0600 file the supervisor removes once read, never meta.json
            host.write_bytes(f"{jobdir}/{jobfiles.JOB_ENV}", json.dumps(passed).encode(), 0o600)
        meta: JobMeta = {
            "id": job_id,
            "name": name,
            "target": self.target,
            "python_version": SUBMITTER_PYTHON,
            "cloudpickle_version": cloudpickle.__version__,
            "python": probe["path"],
            "payload_sha256": digest,
            "payload_bytes": size,
            "limits": limits,
            "setup": list(self.setup),
            "env_names": sorted(passed),
            "cwd": self.cwd,
            "worker": f"{runner}/{jobfiles.WORKER_SCRIPT}" if runner else jobfiles.WORKER_SCRIPT,
            "created_at": time.time(),
            "checkpointable": callable(getattr(fn, "checkpoint", None)),
        }
        if command is not None:
            meta["command"] = command
        if folder is not None:
            meta["code"] = folder
        if code.unshipped:
            meta["unshipped"] = {k: list(v) for k, v in code.unshipped.items()}
        if dists:
            meta["dists"] = dists
        if cells:
            meta["cells"] = cells
        if runner:  # a Slurm map's chunks share one (Slurm picks their GPUs)
            meta["runner"] = runner
        else:
            # the supervisor picks the GPUs where no scheduler does: through NVML, which it may
            # lack
            write_runner(
                host, jobdir, nvml=bool(limits.get("gpus")) and self.backend.kind != "slurm"
            )
        host.write_bytes(f"{jobdir}/{jobfiles.META}", json.dumps(meta, indent=1).encode(), 0o600)
        return job_id, jobdir, meta

    def passed_env(self) -> dict[str, str]:
        """The variables the job gets on top of its node's environment (``jobenv.passed_env``:
        ``env_pass``, then ``job_env``). The first time, one line on stderr names this
        process's variables that look like credentials or caches and that the job will not see
        (said once a job started: ``_tell_unseen``)."""
        passed, unseen = jobenv.passed_env(self.env_pass, self.job_env)
        if unseen:  # said once a job started: a refused submit is one line, its own
            self._unseen = unseen
        return passed

    def _tell_unseen(self) -> None:
        """The notice of ``passed_env``, once a job of this submit has started."""
        unseen, self._unseen = self._unseen, ()
        jobenv.tell_unseen(unseen)

    def _job_root_path(self) -> str:
        """The job root on the target's host, ``~`` resolved there (not created)."""
        return self.backend.host.expand(self.backend.job_root)

    def _write_shared(self, path: str, fn: object, pickled: _Pickled) -> None:
        """Write a map's shared part to ``path`` (named by its content's hash) unless a map
        wrote the same before; from ``pickled``'s bytes when it kept them."""
        host = self.backend.host
        if host.touch(path):  # written before, now marked used (``gpuctl jobs purge``)
            return
        self._job_root()
        host.mkdir(os.path.dirname(path), 0o700)
        writer = host.open_atomic(path, 0o600)
        try:
            if pickled.data is not None:
                writer.write(pickled.data)
                files = pickled.filenames
            else:
                files = sources.dump(fn, _HashingWriter(writer, hashing=False)).filenames
        except BaseException:
            writer.abort()
            raise
        text = sources.read_sources(files)
        if text:  # beside it, for the chunks' tracebacks (``_chunk.load_shared``)
            host.write_bytes(f"{path}.sources.json", json.dumps(text).encode(), 0o600)
        writer.commit()

    def _write_payload(
        self, host: Host, jobdir: str, obj: object, pickled: _Pickled
    ) -> tuple[str, int, dict[str, str]]:
        """Write the payload into the job folder: ``pickled``'s bytes when the measuring pass
        kept them, else pickled again straight into the file (streamed over SFTP for a node,
        no temporary copy); the file appears under its name only once complete. Returns its
        sha256, size and the notebook cells its code came from (``sources.cell_names``)."""
        writer = host.open_atomic(f"{jobdir}/{jobfiles.PAYLOAD}", 0o600)
        try:
            if pickled.data is not None:
                writer.write(pickled.data)
                digest, size, files = pickled.digest, pickled.size, pickled.filenames
            else:
                w = _HashingWriter(writer)
                files = sources.dump(obj, w).filenames
                digest, size = w.hexdigest(), w.size
        except BaseException:
            writer.abort()
            raise
        writer.commit()
        text = sources.read_sources(files)
        if text:
            host.write_bytes(f"{jobdir}/{jobfiles.SOURCES}", json.dumps(text).encode(), 0o600)
        return digest, size, sources.cell_names(files)

    def _user_code(self, fn: Callable[..., Any]) -> usercode.UserCode:
        """The user's code that ships with ``fn``'s job (``usercode.collect``)."""
        return usercode.collect(fn, limit=self.ship_limit, exclude=self.ship_exclude)
