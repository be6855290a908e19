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
import shlex
import sys
import sysconfig
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, overload

import cloudpickle

from gpuctl import paths, service
from gpuctl.jobs import _chunk, _command, checkpoint, debug, targets
from gpuctl.jobs.backends import SlurmBackend
from gpuctl.jobs.hosts import AtomicWriter, Host
from gpuctl.jobs.job import (
    SUBMITTER_PYTHON,
    Job,
    JobFailed,
    JobQueue,
    RemoteTraceback,
    queue_owner,
)
from gpuctl.jobs.provision import EnvSpec, Venv2, shared_runner, write_runner
from gpuctl.jobs.records import BackendInfo, Handle, JobMeta, Limits, Probe
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
cloudpickle.register_pickle_by_value(checkpoint)
cloudpickle.register_pickle_by_value(_command)


CHUNKS_PER_SLOT = 4  # chunks of a map per running job: enough to balance, few enough that
# process start-up (two interpreters per chunk) does not dominate tiny items


def chunk_size(items: int, max_running: int) -> int:
    """Items per job of a ``map`` of ``items`` items capped at ``max_running`` jobs at a time:
    ``ceil(items / min(items, 4 * max_running))``, i.e. about four jobs per running slot and
    never an empty one. It depends on nothing of the machine that submits."""
    if items <= 0:
        return 1
    chunks = min(items, CHUNKS_PER_SLOT * max_running)
    return -(-items // chunks)


def _positive(value: int | None, what: str) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{what} must be a whole number of 1 or more, not {value!r}")
    return value


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
    """Runs functions (``submit``, ``map``) and commands (``submit_command``) on ``target``:
    "local", a node name from the config, "slurm", or "debug".

    "debug" runs the function in this process, synchronously, so that breakpoints and pdb work
    (see ``gpuctl.jobs.debug``): no job folder, VENV2, limits, setup lines or store row (the
    options that configure them are accepted and not used); the call is still pickled, into
    nothing, so that what would not travel to a node is refused as ``submit`` refuses it.

    ``python`` names an existing VENV2 interpreter on the target; ``env`` (an ``EnvSpec``) asks
    gpuctl to build one (once, cached by content hash); ``supervisor_python`` is VENV1 (default:
    the node's configured python3). ``mem`` (bytes or "4G"), ``time_limit`` (seconds), ``cpus``,
    ``gpus`` are limits (of each task); ``setup`` lines run before VENV2 starts (after the
    cluster's own). A checkpointable function (``gpuctl.jobs.checkpoint``) is warned
    ``warning`` seconds before its time limit and requeued from its checkpoint at most
    ``max_requeues`` times.
    ``verify=False`` skips the pre-submit probe of VENV2 (only to exercise the node-side checks).
    ``read_only`` is the caller's decision on read-only mode (None: at each submit, from
    ``$GPUCTL_READ_ONLY`` and ``config``, else the config files); in read-only mode ``submit``,
    ``map_jobs`` and ``map`` raise ``gpuctl.service.ReadOnlyError`` before anything is built or
    written.

    ``max_running`` caps how many jobs of one ``map`` run at once (default: the backend's,
    ``default_max_running``: 64 through Slurm, 8 on one machine, local or SSH); see ``map_jobs``.

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
        max_requeues: int = 3,
        warning: float = 60.0,
        max_running: int | None = None,
    ) -> None:
        if python is not None and env is not None:
            raise ValueError("give python= (an existing VENV2) or env= (one to build), not both")
        self.target = target
        self.debug = target == "debug"
        self.limits: Limits = {
            "cpus": cpus,
            "gpus": gpus,
            "mem_bytes": parse_mem(mem),
            "time_limit_s": time_limit,
            "grace_s": grace,
            "max_requeues": max_requeues,
            "warning_s": warning,
            "nodes": _count(nodes, "nodes"),
            "tasks_per_node": _count(tasks_per_node, "tasks_per_node"),
        }
        self.env_spec = env
        self.max_running = _positive(max_running, "max_running")
        self.job_env = dict(job_env or {})
        self.verify = verify
        where = targets.resolve(
            "local" if self.debug else target,  # a backend to type against; never started
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
            python=python
            if (python is not None or env is not None) and not self.debug
            else where.python,
            spec=None if self.debug else env,
            env_root=self.env_root,
            supervisor_python=self.backend.supervisor_python,
            verify=verify,
            # Slurm's VENV1 runs on a compute node this side cannot reach before the job does
            probe_venv1=not isinstance(self.backend, SlurmBackend),
        )
        if self.debug:
            self.store: JobStore | None = None  # nothing of a debug job outlives this process
        elif store is True:
            self.store = JobStore()
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
        command: list[str] | None = None,
        *,
        registered: bool = False,
        runner: str | None = None,
    ) -> tuple[str, str, JobMeta]:
        """Write one job folder; return (id, jobdir, meta). ``registered``: the caller made
        ``register_by_value`` for this function already (a map does it once, not per chunk);
        ``runner``: a shared runner folder (``shared_runner``) instead of a copy in this one.

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
            return self._write_folder(
                job_id, jobdir, fn, args, kwargs, name, probe, command, registered, runner
            )
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
        command: list[str] | None,
        registered: bool = False,
        runner: str | None = None,
    ) -> tuple[str, str, JobMeta]:
        if self.tasks > 1 and callable(getattr(fn, "checkpoint", None)):
            raise ValueError(
                "checkpoint and requeue work for jobs of one task: submit a checkpointable "
                "function without nodes=/tasks_per_node="
            )
        host = self.backend.host
        self._job_root()
        host.mkdir(jobdir, 0o700)
        if not registered:
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
            "worker": f"{runner}/{jobfiles.WORKER_SCRIPT}" if runner else jobfiles.WORKER_SCRIPT,
            "created_at": time.time(),
            "checkpointable": callable(getattr(fn, "checkpoint", None)),
        }
        if command is not None:
            meta["command"] = command
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
        if self.debug:
            register_by_value(fn)
            return debug.run_here(self.backend, fn, args, kwargs, name)
        self.venv2()
        job_id, jobdir, meta = self._prepare(fn, args, kwargs, name)
        return self._start([(job_id, jobdir)], meta)[0]

    def submit_command(self, argv: Sequence[str]) -> Job:
        """Run the command ``argv`` (``["python", "train.py", "--lr", "3e-4"]``, no shell) on the
        target through the same runner as ``submit``: job folder, supervisor, limits, cancel,
        logs. It runs in VENV2's environment (VENV2's ``bin`` first on PATH: ``python`` is
        VENV2's python) in the job's working directory; returns at once with a ``Job``.

        The job's result is 0; a command that exits otherwise fails the job with kind
        ``command_failed`` (``JobFailed``: the exit code or signal and the last lines of
        stderr), one that cannot be started with ``command_not_found``. Raises TypeError or
        ValueError for an ``argv`` that is not a non-empty list of strings, and what ``submit``
        raises.
        """
        command = _check_argv(argv)
        self.guard.check("submitting jobs")
        name = shlex.join(command)
        if self.debug:  # the terminal's stdin, Ctrl-C as in a shell
            here = {"interactive": True}
            return debug.run_here(
                self.backend, _command.run_command, (command,), here, name, command
            )
        self.venv2()
        job_id, jobdir, meta = self._prepare(_command.run_command, (command,), {}, name, command)
        return self._start([(job_id, jobdir)], meta)[0]

    def _start(
        self,
        folders: Sequence[tuple[str, str]],
        meta: JobMeta,
        *,
        max_running: int | None = None,
    ) -> list[Job]:
        """Start prepared folders (their rows are in the store already) and return the Jobs.

        A start that fails marks the rows failed, with why, before the error goes up."""
        now = time.time()
        try:
            dirs = [d for _, d in folders]
            if isinstance(self.backend, SlurmBackend):
                handles = self.backend.start(dirs, meta, max_running=max_running)
            else:
                handles = self.backend.start(dirs, meta)
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
        return [self._job(f, meta, h, now) for f, h in zip(folders, handles, strict=True)]

    def _job(self, folder: tuple[str, str], meta: JobMeta, handle: Handle, now: float) -> Job:
        """The Job of a prepared folder; ``handle`` empty: not started yet (it waits for its
        turn in a ``JobQueue``), its row "pending"."""
        job_id, jobdir = folder
        job = Job(job_id, meta["name"], self.target, self.backend, jobdir, handle, self.store, now)
        if self.store is not None:
            backend: BackendInfo = {**self.backend.describe(), "handle": handle}
            if not handle:  # whose queue holds it: once that process is gone, it never starts
                backend["queued_by"] = queue_owner()
            state = "submitted" if handle else "pending"
            if not self.store.update(job_id, state=state, backend=backend) and handle:
                self.backend.cancel(handle, jobdir)  # `gpuctl cancel` came while it was prepared
        return job

    def _start_waiting(self, meta: JobMeta, job: Job) -> None:
        """Start a job that waited for its turn (``JobQueue``): its row becomes "submitted"."""
        (handle,) = self.backend.start([job.jobdir], meta)
        if self.store is not None:
            self.store.update(
                job.id, state="submitted", backend={**self.backend.describe(), "handle": handle}
            )
        job._started(handle)

    def map_jobs(
        self,
        fn: Callable[..., Any],
        *iterables: Iterable[Any],
        chunksize: int | None = None,
        max_running: int | None = None,
    ) -> list[Job]:
        """Submit ``fn`` over the zipped iterables in chunks; one job (Slurm array task) per chunk.

        At most ``max_running`` of them run at once (default: the Executor's, else the
        backend's ``default_max_running``): through Slurm the array says so
        (``--array=0-N%K``) and Slurm keeps the rest pending; on one machine (local, SSH) the
        rest wait here, "pending", and each starts as one ends (from this process: jobs still
        waiting when it exits never start, and their rows say so). Items per chunk:
        ``chunksize``, else ``chunk_size(items, max_running)`` (about four chunks per running
        job, whatever machine submits), through Slurm raised when needed so that the chunks
        fit one array (the cluster's ``MaxArraySize``). A ``chunksize`` that makes more tasks
        than that is kept: the tasks go into several arrays that run one after another, so the
        cap holds over all (each job's ``handle["split"]`` says which array it is in).

        Each job's result is a list of ("ok", value) / ("err", exception, traceback): one bad
        item is that item's error, never its chunk's. Raises ValueError for a cap or a chunk
        size below 1, and ``gpuctl.service.ReadOnlyError`` in read-only mode, before anything
        is submitted.
        """
        self.guard.check("submitting jobs")
        if self.tasks > 1:
            raise ValueError(
                "map runs one task per chunk: use an Executor without nodes=/tasks_per_node="
            )
        cap = (
            _positive(max_running, "max_running")
            or self.max_running
            or self.backend.default_max_running
        )
        _positive(chunksize, "chunksize")
        items = list(zip(*iterables, strict=False))
        if not items:
            return []
        size = chunksize or chunk_size(len(items), cap)
        if not chunksize and isinstance(self.backend, SlurmBackend):
            # chunks enough that one array holds them: Slurm then caps them itself
            size = max(size, -(-len(items) // self.backend.max_array_size()))
        name = _name(fn)
        register_by_value(fn)
        if self.debug:
            return [
                debug.run_here(
                    self.backend,
                    _chunk.run_chunk,
                    (fn, items[i : i + size]),
                    {},
                    f"map:{name}",
                )
                for i in range(0, len(items), size)
            ]
        self.venv2()
        folders = []
        meta: JobMeta = {}
        # an array's chunks share one runner (the job folders are all on the login side's
        # file system): a folder then holds its payload and meta.json only
        runner = (
            shared_runner(self.backend.host, self._job_root())
            if isinstance(self.backend, SlurmBackend)
            else None
        )
        for i in range(0, len(items), size):
            job_id, jobdir, meta = self._prepare(
                _chunk.run_chunk,
                (fn, items[i : i + size]),
                {},
                f"map:{name}",
                registered=True,
                runner=runner,
            )
            folders.append((job_id, jobdir))
        if isinstance(self.backend, SlurmBackend):
            return self._start(folders, meta, max_running=cap)
        now = time.time()
        jobs = [self._job(f, meta, Handle(), now) for f in folders]
        JobQueue(jobs, cap, functools.partial(self._start_waiting, meta))
        return jobs

    def map(
        self,
        fn: Callable[..., R],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int | None = None,
        max_running: int | None = None,
    ) -> Iterator[R]:
        """Like ``concurrent.futures.Executor.map``: results in order; the first exception raised
        by ``fn`` is raised when its turn comes (a system failure raises ``JobFailed``).
        Chunks and the cap on running jobs as in ``map_jobs``."""
        jobs = self.map_jobs(fn, *iterables, chunksize=chunksize, max_running=max_running)
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

    PIECE = 8 << 20  # a large buffer is hashed piece by piece, each sent while the next hashes

    def write(self, data: bytes | bytearray | memoryview) -> int:
        mv = memoryview(data).cast("B")
        n = len(mv)
        for i in range(0, n, self.PIECE):
            piece = mv[i : i + self.PIECE]
            self.h.update(piece)
            self.f.write(piece)
        self.size += n
        return n

    def hexdigest(self) -> str:
        return self.h.hexdigest()


def _check_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` as a list of strings; TypeError or ValueError with one line otherwise."""
    if isinstance(argv, str | bytes):
        raise TypeError(
            "give the command as a list of words, e.g. ['python', 'train.py'], not one string "
            "(no shell runs it)"
        )
    command = list(argv)
    if not command:
        raise ValueError("the command is empty: give at least the program to run")
    for i, word in enumerate(command):
        if not isinstance(word, str):
            raise TypeError(f"word {i} of the command is a {type(word).__name__}, not a str")
        if "\0" in word:
            raise ValueError(f"word {i} of the command holds a NUL character")
    return command


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
    record: JobRecord | str,
    store: JobStore | None = None,
    *,
    config: Config | None = None,
    watch: bool = True,
) -> Job:
    """Rebuild a ``Job`` from its stored record (after gpuctl restarted), or from its id or a
    unique prefix of it (looked up in ``store``, else the default job store; ``JobNotFound``,
    one line naming the candidates, when none or several match). ``watch=False``: no
    background polling (for callers that poll it themselves: the CLI, the jobs pane)."""
    if isinstance(record, str):
        store = store if store is not None else JobStore()
        record = store.find(record)
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
    job._restore(record)
    return job
