"""The job API: ``Executor(target).submit(fn, *args) -> Job``, ``map``, ``remote``, ``attach``.

A submit pickles ``(fn, args, kwargs)`` with cloudpickle into a file (the function's own module by
value, so helpers, globals and classes of a script or test module travel with it), makes a job
folder (uuid, mode 0700) on the target's host holding ``payload.pkl`` (temporary name, then
renamed), ``meta.json`` and copies of ``supervisor.py`` and ``worker.py``, and starts the
supervisor on the folder. Nothing of the user's code or data is ever on a command line.

The parts live beside it: ``job`` (a submitted ``Job``), ``provision`` (VENV2: ``EnvSpec``, the
probe, the version checks), ``targets`` (which backend a target names). Their public names are
importable from here too, as before the split.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import importlib.metadata
import json
import os
import sys
import sysconfig
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, overload

import cloudpickle

from gpuctl import paths, service
from gpuctl.jobs import _chunk, targets
from gpuctl.jobs.backends import SlurmBackend
from gpuctl.jobs.hosts import AtomicWriter, Host
from gpuctl.jobs.job import SUBMITTER_PYTHON, Job, JobFailed, RemoteTraceback
from gpuctl.jobs.provision import EnvSpec, Venv2, write_runner
from gpuctl.jobs.records import Handle, JobMeta, Limits, Probe
from gpuctl.jobs.report import REMEDIES, FailureReport
from gpuctl.jobs.store import JobRecord, JobStore
from gpuctl.node import jobfiles

if TYPE_CHECKING:
    from gpuctl.config import Config

__all__ = [
    "EnvSpec",
    "Executor",
    "Job",
    "JobFailed",
    "RemoteTraceback",
    "attach",
    "parse_mem",
    "register_by_value",
    "remote",
]

R = TypeVar("R")

cloudpickle.register_pickle_by_value(_chunk)


def parse_mem(mem: int | str | None) -> int | None:
    """Bytes from ``mem``: an int (bytes) or "512M", "4G", "1.5GB"."""
    if mem is None or isinstance(mem, int):
        return mem
    text = mem.strip().upper().removesuffix("B").removesuffix("I")
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(float(text))


@functools.cache
def _installed_roots() -> tuple[str, ...]:
    """The folders Python's own and installed modules live in (stdlib, site-packages)."""
    paths = sysconfig.get_paths()
    bases = (paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib"))
    return tuple(os.path.realpath(b) + os.sep for b in bases if b)


@functools.lru_cache(maxsize=65536)
def _is_user_file(path: str) -> bool:
    real = os.path.realpath(path)
    if real.startswith(_installed_roots()):
        return False
    return "site-packages" not in real and "dist-packages" not in real


def _is_user_module(name: str) -> bool:
    """True for a module imported from a file outside the standard library and site-packages."""
    mod = sys.modules.get(name)
    path = getattr(mod, "__file__", None)
    if mod is None or not isinstance(path, str) or not path or name == "__main__":
        return False
    return name.split(".")[0] != "gpuctl" and _is_user_file(path)


@functools.cache
def _installed_top_levels() -> frozenset[str]:
    """Top-level import names that belong to an installed distribution (editable ones too)."""
    return frozenset(importlib.metadata.packages_distributions())


def register_by_value(obj: object) -> None:
    """Make cloudpickle copy the user's own modules into the payload: the one that defines
    ``obj`` and every other module loaded from the user's files (a sibling ``helpers.py`` or
    package next to ``train.py``), which VENV2 could not import by name. Only what the function
    reaches is pickled; installed packages still travel by name."""
    names = [getattr(obj, "__module__", None), *list(sys.modules)]
    installed = _installed_top_levels()
    for name in names:
        if not isinstance(name, str) or not _is_user_module(name):
            continue
        if name != names[0] and name.split(".")[0] in installed:
            continue  # an editable install of a package: VENV2 is expected to have it
        with contextlib.suppress(ValueError):
            cloudpickle.register_pickle_by_value(sys.modules[name])


class Executor:
    """Runs functions on ``target``: "local", a node name from the config, or "slurm".

    ``python`` names an existing VENV2 interpreter on the target; ``env`` (an ``EnvSpec``) asks
    gpuctl to build one (once, cached by content hash); ``supervisor_python`` is VENV1 (default:
    the node's configured python3). ``mem`` (bytes or "4G"), ``time_limit`` (seconds), ``cpus``,
    ``gpus`` are limits (of each task); ``setup`` lines run before VENV2 starts (after the
    cluster's own).
    ``verify=False`` skips the pre-submit probe of VENV2 (only to exercise the node-side checks).
    ``read_only`` is the caller's decision on read-only mode (None: at each submit, from
    ``$GPUCTL_READ_ONLY`` and ``config``, else the config files); in read-only mode ``submit``,
    ``map_jobs`` and ``map`` raise ``gpuctl.service.ReadOnlyError`` before anything is built or
    written.

    Slurm (``target="slurm"``, or a node reached ``via = "srun"``): ``slurm_conf`` names the
    cluster's slurm.conf and ``partition`` the partition. "slurm" reads the config's ``[jobs]``
    table (``dir``, ``setup``, ``env_root``) like a node target; without ``slurm_conf`` it takes
    both from the config (``gpuctl.reach.slurm.slurm_target``: ``[jobs] slurm_conf`` /
    ``partition``, else the configured Slurm clusters' own, else ``$SLURM_CONF``); an srun
    node takes its cluster's. ``sbatch_args`` are extra ``#SBATCH`` options (checked: one option
    each). Bad values raise ``SlurmValueError`` (a ValueError) before anything is submitted.

    Several tasks (Slurm only): ``nodes`` x ``tasks_per_node`` copies of the function run as one
    Slurm job (srun), each with torch.distributed's ``env://`` rendezvous set (RANK, LOCAL_RANK,
    WORLD_SIZE, LOCAL_WORLD_SIZE, NODE_RANK, MASTER_ADDR, MASTER_PORT); ``cpus``, ``gpus`` and
    ``mem`` are then per task. ``Job.result()`` is rank 0's value, ``Job.results()`` every
    rank's. Other backends, and ``map``, refuse more than one task (ValueError).
    """

    def __init__(
        self,
        target: str = "local",
        *,
        config: Config | None = None,
        python: str | None = None,
        env: EnvSpec | None = None,
        supervisor_python: str | None = None,
        gpus: int = 0,
        cpus: int = 1,
        mem: int | str | None = None,
        time_limit: float | None = None,
        nodes: int = 1,
        tasks_per_node: int = 1,
        grace: float = 10.0,
        setup: Sequence[str] = (),
        job_env: Mapping[str, str] | None = None,
        job_root: str | None = None,
        env_root: str | None = None,
        partition: str | None = None,
        slurm_conf: str | None = None,
        sbatch_args: Sequence[str] = (),
        store: JobStore | bool | None = True,
        verify: bool = True,
        cwd: str | None = None,
        read_only: bool | None = None,
    ) -> None:
        if python is not None and env is not None:
            raise ValueError("give python= (an existing VENV2) or env= (one to build), not both")
        self.target = target
        self.limits: Limits = {
            "cpus": cpus,
            "gpus": gpus,
            "mem_bytes": parse_mem(mem),
            "time_limit_s": time_limit,
            "grace_s": grace,
            "nodes": _count(nodes, "nodes"),
            "tasks_per_node": _count(tasks_per_node, "tasks_per_node"),
        }
        self.env_spec = env
        self.job_env = dict(job_env or {})
        self.verify = verify
        where = targets.resolve(
            target,
            config=config,
            supervisor_python=supervisor_python,
            job_root=job_root,
            env_root=env_root,
            partition=partition,
            slurm_conf=slurm_conf,
            sbatch_args=sbatch_args,
            cwd=cwd,
        )
        self.backend = where.backend
        self.tasks = nodes * tasks_per_node
        if self.tasks > 1 and not isinstance(self.backend, SlurmBackend):
            raise ValueError(
                f"nodes={nodes}, tasks_per_node={tasks_per_node}: jobs of several tasks run "
                f"through Slurm only (target 'slurm' or a node reached via srun), not on "
                f"{target!r}"
            )
        self.cwd = where.cwd
        self.setup = (*where.setup, *setup)
        self.env_root = where.env_root or paths.NODE_ENV_DIR
        self._venv2 = Venv2(
            self.backend.host,
            target,
            python=python if python is not None or env is not None else where.python,
            spec=env,
            env_root=self.env_root,
            supervisor_python=self.backend.supervisor_python,
            verify=verify,
            # Slurm's VENV1 runs on a compute node this side cannot reach before the job does
            probe_venv1=not isinstance(self.backend, SlurmBackend),
        )
        if store is True:
            self.store: JobStore | None = JobStore()
        elif store is False or store is None:
            self.store = None
        else:
            self.store = store
        self._root_ready = False
        self.guard = service.Guard(read_only, where.config)  # read-only mode, judged at each submit

    def venv2(self) -> Probe:
        """Resolve (and build if asked) VENV2; return its probe ``{python, cloudpickle, ...}``.

        Raises ``JobFailed`` (env_build_failed, venv2_wont_start, python_mismatch,
        cloudpickle_mismatch, module_missing) with a remedy that says exactly what to do.
        """
        return self._venv2.probe()

    # --- submit --------------------------------------------------------------------------

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
    ) -> tuple[str, str, JobMeta]:
        """Write one job folder; return (id, jobdir, meta).

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
                    backend=self.backend.describe(),
                    jobdir=jobdir,
                    state="preparing",
                    created_at=time.time(),
                )
            )
        try:
            return self._write_folder(job_id, jobdir, fn, args, kwargs, name, probe)
        except BaseException:
            if self.store is not None:
                self.store.delete(job_id)
            raise

    def _write_folder(
        self,
        job_id: str,
        jobdir: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        name: str,
        probe: Probe,
    ) -> tuple[str, str, JobMeta]:
        host = self.backend.host
        self._job_root()
        host.mkdir(jobdir, 0o700)
        register_by_value(fn)
        limits = self.limits.copy()
        if (
            limits.get("mem_bytes")
            and isinstance(self.backend, SlurmBackend)
            and self.backend.memory_enforced()
        ):
            limits["mem_enforced_by"] = "slurm"
        digest, size = self._write_payload(host, jobdir, (fn, args, kwargs))
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
            "env": self.job_env,
            "cwd": self.cwd,
            "worker": jobfiles.WORKER_SCRIPT,
            "created_at": time.time(),
        }
        write_runner(host, jobdir)
        host.write_bytes(f"{jobdir}/{jobfiles.META}", json.dumps(meta, indent=1).encode(), 0o600)
        return job_id, jobdir, meta

    def _write_payload(self, host: Host, jobdir: str, obj: object) -> tuple[str, int]:
        """Pickle straight into the job folder (streamed over SFTP for a node): no temporary
        copy, no size limit; the file appears under its name only once complete."""
        writer = host.open_atomic(f"{jobdir}/{jobfiles.PAYLOAD}", 0o600)
        w = _HashingWriter(writer)
        try:
            cloudpickle.dump(obj, w, protocol=5)
        except BaseException:
            writer.abort()
            raise
        writer.commit()
        return w.hexdigest(), w.size

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Job:
        """Run ``fn(*args, **kwargs)`` on the target; returns at once with a ``Job``.

        Raises ``JobFailed`` when VENV2 cannot be provisioned or does not match this Python,
        ``HostError`` when the target cannot be reached, and cloudpickle's ``PicklingError``
        (or TypeError) when ``fn`` or its arguments cannot be pickled, and
        ``gpuctl.service.ReadOnlyError`` in read-only mode (see the class docstring).
        """
        self.guard.check("submitting jobs")
        name = _name(fn)
        self.venv2()
        job_id, jobdir, meta = self._prepare(fn, args, kwargs, name)
        return self._start([(job_id, jobdir)], meta)[0]

    def _start(self, folders: Sequence[tuple[str, str]], meta: JobMeta) -> list[Job]:
        """Start prepared folders (their rows are in the store already) and return the Jobs.

        A start that fails marks the rows failed, with why, before the error goes up."""
        now = time.time()
        try:
            handles = self.backend.start([d for _, d in folders], meta)
        except BaseException as e:
            if self.store is not None:
                for job_id, _ in folders:
                    self.store.update(
                        job_id,
                        state="failed",
                        kind="never_started",
                        summary=f"starting it failed: {e}"[:500],
                        ended_at=time.time(),
                    )
            raise
        jobs = []
        for (job_id, jobdir), handle in zip(folders, handles, strict=True):
            job = Job(
                job_id,
                meta["name"],
                self.target,
                self.backend,
                jobdir,
                handle,
                self.store,
                now,
            )
            if self.store is not None:
                self.store.update(
                    job_id,
                    state="submitted",
                    backend={**self.backend.describe(), "handle": handle},
                )
            jobs.append(job)
        return jobs

    def map_jobs(
        self, fn: Callable[..., Any], *iterables: Iterable[Any], chunksize: int | None = None
    ) -> list[Job]:
        """Submit ``fn`` over the zipped iterables in chunks; one job (Slurm array task) per chunk.

        Each job's result is a list of ("ok", value) / ("err", exception, traceback). Raises
        ``gpuctl.service.ReadOnlyError`` in read-only mode, before anything is submitted.
        """
        self.guard.check("submitting jobs")
        if self.tasks > 1:
            raise ValueError(
                "map runs one task per chunk: use an Executor without nodes=/tasks_per_node="
            )
        items = list(zip(*iterables, strict=False))
        if not items:
            return []
        if chunksize is None:
            # about four chunks per worker slot: enough to balance, few enough that process
            # start-up (two interpreters per chunk) does not dominate tiny tasks
            parallel = 8 if isinstance(self.backend, SlurmBackend) else (os.cpu_count() or 1)
            chunksize = max(1, -(-len(items) // (4 * parallel)))
        self.venv2()
        name = _name(fn)
        register_by_value(fn)
        folders = []
        meta: JobMeta = {}
        for i in range(0, len(items), chunksize):
            job_id, jobdir, meta = self._prepare(
                _chunk.run_chunk, (fn, items[i : i + chunksize]), {}, f"map:{name}"
            )
            folders.append((job_id, jobdir))
        if isinstance(self.backend, SlurmBackend):
            return self._start(folders, meta)
        return [j for f in folders for j in self._start([f], meta)]

    def map(
        self,
        fn: Callable[..., R],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int | None = None,
    ) -> Iterator[R]:
        """Like ``concurrent.futures.Executor.map``: results in order; the first exception raised
        by ``fn`` is raised when its turn comes (a system failure raises ``JobFailed``)."""
        jobs = self.map_jobs(fn, *iterables, chunksize=chunksize)
        deadline = None if timeout is None else time.monotonic() + timeout

        def results() -> Iterator[R]:
            for job in jobs:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                for item in job.result(left):
                    if item[0] == "ok":
                        yield item[1]
                    else:
                        exc = item[1]
                        exc.__cause__ = RemoteTraceback(item[2])
                        if isinstance(exc, Exception):
                            raise exc
                        # sys.exit / KeyboardInterrupt in an item: the item's failure, never a
                        # Ctrl-C or an exit of this process
                        raise JobFailed(_item_report(job, exc, str(item[2]))) from exc

        return results()


def _count(value: int, name: str) -> int:
    """``value`` when it is a whole number >= 1; else ValueError (one line)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r}: give a whole number, 1 or more")
    return value


def _item_report(job: Job, exc: BaseException, tb: str) -> FailureReport:
    """The report of a map item that raised a BaseException that is not an Exception."""
    return FailureReport(
        kind="user_exception",
        phase="running",
        evidence=(
            f"a map item raised {type(exc).__name__}: {exc}",
            "raised on the node by the function: not a Ctrl-C or an exit of yours",
        ),
        remedy=REMEDIES["user_exception"],
        logs=job.logs(),
        job_id=job.id,
        traceback=tb,
    )


class _HashingWriter:
    """A file wrapper that hashes and counts what cloudpickle writes through it."""

    def __init__(self, f: AtomicWriter) -> None:
        self.f = f
        self.h = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        self.h.update(data)
        n = len(memoryview(data).cast("B"))
        self.size += n
        self.f.write(data)
        return n

    def hexdigest(self) -> str:
        return self.h.hexdigest()


def _name(fn: Callable[..., Any]) -> str:
    mod = getattr(fn, "__module__", "") or ""
    qual = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    return f"{mod}.{qual}" if mod and mod != "__main__" else str(qual)


@overload
def remote(fn: Callable[..., R], /) -> Callable[..., R]: ...


@overload
def remote(
    *, target: str = ..., **options: Any
) -> Callable[[Callable[..., R]], Callable[..., R]]: ...


def remote(fn: Any = None, /, *, target: str = "local", **options: Any) -> Any:
    """Decorator: calling the function runs it on ``target`` and returns its result.

    ``@remote(target="gpu01", mem="8G")``; ``f.submit(...)`` returns the ``Job`` instead, and
    ``f.local(...)`` calls the undecorated function. Options are those of ``Executor``.
    """

    def wrap(func: Callable[..., Any]) -> RemoteFunction:
        return RemoteFunction(func, target, options)

    if fn is not None:
        return wrap(fn)
    return wrap


class RemoteFunction:
    """What ``@remote`` makes of a function (see ``remote``).

    Pickled, it is the plain function again: a job that calls another ``@remote`` function runs
    it in its own process (VENV2 has no gpuctl to submit with), and nothing of this side's
    executor (its locks, its connections) travels.
    """

    def __init__(self, func: Callable[..., Any], target: str, options: dict[str, Any]) -> None:
        functools.update_wrapper(self, func)
        self.local = func
        self._target = target
        self._options = options
        self._executor: Executor | None = None
        self._lock = threading.Lock()

    def executor(self) -> Executor:
        """The Executor it submits through, made at the first call."""
        with self._lock:
            if self._executor is None:
                self._executor = Executor(self._target, **self._options)
            return self._executor

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.executor().submit(self.local, *args, **kwargs).result()

    def submit(self, *args: Any, **kwargs: Any) -> Job:
        """Run it on the target; returns the ``Job`` at once."""
        return self.executor().submit(self.local, *args, **kwargs)

    def __reduce__(self) -> tuple[Any, tuple[Any]]:
        # copy.copy of a function is the function: the standard library rebuilds it in VENV2
        return copy.copy, (self.local,)


def attach(
    record: JobRecord,
    store: JobStore | None = None,
    *,
    config: Config | None = None,
    watch: bool = True,
) -> Job:
    """Rebuild a ``Job`` from its stored record (after gpuctl restarted). ``watch=False``: no
    background polling (for callers that poll it themselves: the CLI, the jobs pane)."""
    backend = targets.backend_of(record.backend, record.id, config)
    job = Job(
        record.id,
        record.name,
        record.target,
        backend,
        record.jobdir,
        record.backend.get("handle", Handle()).copy(),
        store,
        record.created_at,
        watch=watch,
    )
    job._stored_state = record.state
    job._beat = record.heartbeat
    return job
