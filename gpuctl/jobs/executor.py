"""The job API: ``Executor(target).submit(fn, *args) -> Job``, ``map``, ``attach``.

A submit pickles ``(fn, args, kwargs)`` with cloudpickle into a file (the function's own module by
value, so helpers, globals and classes of a script or test module travel with it), makes a job
folder (uuid, mode 0700) on the target's host holding ``payload.pkl`` (temporary name, then
renamed), ``meta.json`` and copies of ``supervisor.py`` and ``worker.py``, and starts the
supervisor on the folder. Nothing of the user's code or data is ever on a command line.

The parts live beside it: ``job`` (a submitted ``Job``), ``jobwriter`` (writing the job
folder: ``JobWriter``, a base of ``Executor``), ``provision`` (VENV2: ``EnvSpec``, the probe,
the version checks), ``targets`` (which backend a target names), ``pickling`` (what the call
pickles into: by value, measured, the payload limit, ``Unpicklable``), ``jobenv`` (the
variables a job gets from here), ``decorator`` (``@remote``). The public names of ``job`` and
``provision`` are importable from here too, as before the split.
"""

from __future__ import annotations

import functools
import os
import pickle
import shlex
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from gpuctl import paths, service
from gpuctl.jobs import _chunk, _command, debug, interrupt, targets, usercode
from gpuctl.jobs.backends import SlurmBackend
from gpuctl.jobs.errors import JobFailed, RemoteTraceback
from gpuctl.jobs.job import Job
from gpuctl.jobs.jobqueue import JobQueue, queue_owner
from gpuctl.jobs.jobwriter import JobWriter
from gpuctl.jobs.pickling import (
    DEFAULT_MAX_PAYLOAD,
    SHARED_ABOVE,
    PayloadTooLarge,
    _biggest,
    _item_parts,
    _measure,
    _parts,
    _Pickled,
    _pickles,
    _unpicklable,
    check_callable,
    pickling_by_value,
)
from gpuctl.jobs.provision import (
    EnvSpec,
    Venv2,
    shared_runner,
)
from gpuctl.jobs.records import BackendInfo, Handle, JobMeta, Limits
from gpuctl.jobs.report import REMEDIES, FailureReport
from gpuctl.jobs.store import JobRecord, JobStore

if TYPE_CHECKING:
    from gpuctl.config import Config, JobsSettings

__all__ = [
    "EnvSpec",
    "Executor",
    "Job",
    "JobFailed",
    "RemoteTraceback",
    "attach",
    "parse_mem",
]

R = TypeVar("R")


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


def _size(value: int | str | None, what: str) -> int | None:
    """Bytes from ``value`` (an int, or "512M", "4G"); ValueError with one line when it is not
    a size of 1 byte or more."""
    try:
        n = parse_mem(value)
    except (ValueError, TypeError, AttributeError):
        n = 0
    if value is not None and (isinstance(value, bool) or not n or n < 1):
        raise ValueError(f'{what} must be a size such as 1073741824 or "4G", not {value!r}')
    return n


class Executor(JobWriter):
    """Runs functions (``submit``, ``map``) and commands (``submit_command``) on ``target``:
    "local", a node name from the config, "slurm", or "debug".

    "debug" runs the function in this process, synchronously, so that breakpoints and pdb work
    (see ``gpuctl.jobs.debug``): no job folder, VENV2, limits, setup lines or store row (the
    options that configure them are accepted and not used); the call is still pickled, into
    nothing, so that what would not travel to a node is refused as ``submit`` refuses it.

    ``python`` names an existing VENV2 interpreter on the target; ``env`` (an ``EnvSpec``) asks
    gpuctl to build one (once, cached by content hash); ``supervisor_python`` is VENV1 (default:
    the node's configured python3). ``mem`` (bytes or "4G"), ``time_limit`` (seconds), ``cpus``,
    ``gpus`` are limits (of each task); without ``cpus`` a job outside Slurm may use all the
    node's CPUs (and its libraries start a thread per CPU: the report says how many it ran
    with), with ``cpus=N`` it gets ``OMP_NUM_THREADS=N`` and its kin; ``setup`` lines run
    before VENV2 starts (after the cluster's own). A checkpointable function
    (``gpuctl.jobs.checkpoint``) is warned ``warning`` seconds before its time limit and
    requeued from its checkpoint at most ``max_requeues`` times.
    ``verify=False`` skips the pre-submit probe of VENV2 (only to exercise the node-side checks).
    ``read_only`` is the caller's decision on read-only mode (None: at each submit, from
    ``$GPUCTL_READ_ONLY`` and ``config``, else the config files); in read-only mode ``submit``,
    ``map_jobs`` and ``map`` raise ``gpuctl.service.ReadOnlyError`` before anything is built or
    written.

    The modules and packages of the user's project (the submitting script's folder, see
    ``gpuctl.jobs.usercode``) ship with each job, once per content, so that a function that
    imports them when it runs finds them: ``ship_limit`` caps their bytes (bytes or "64M"; 0 or
    None: ship nothing), ``ship_exclude`` leaves out the files, folders and modules matching
    its ``fnmatch`` patterns. A payload holding objects of a distribution that VENV2 has at
    another major version, lacking a module they name (numpy 2 here, 1 there), is refused
    before anything is written (``JobFailed``, version_mismatch).

    ``max_payload`` (bytes or "4G"; default: the config's ``[jobs] max_payload``, else 1 GiB)
    caps one pickled payload: a submit's call, a map's function with what it closes over (sent
    once per map) and each of its chunks; one over it raises ``PayloadTooLarge`` (a ValueError)
    before anything is written. ``cancel_on_interrupt`` (default: the config's ``[jobs]
    cancel_on_interrupt``, else False): a Ctrl-C while ``result()`` waits cancels the job;
    otherwise the job keeps running and a line on stderr says how to cancel it.

    The environment, one rule on every backend: a job gets its node's environment, never this
    process's: a local or Slurm job only the base names of it (``jobfiles.BASE_ENV``: PATH,
    LD_LIBRARY_PATH, HOME, USER, LOGNAME, SHELL, LANG, LC_*, TERM, TZ, TMPDIR,
    CUDA_VISIBLE_DEVICES; Slurm adds its SLURM_*), an SSH job sshd's session on the node; then
    the cluster's setup lines. On top:
    ``env_pass``, names or ``fnmatch`` patterns (``["WANDB_*", "HF_TOKEN"]``) of this process's
    variables passed at submit, and ``job_env``, explicit values, which win. Their values go to
    the node in a 0600 file the supervisor removes once read (``meta.json`` names them only).
    A submit that leaves behind variables that look like credentials or caches says so on
    stderr, once, naming them (``jobenv.HIDDEN_HINTS``).

    ``store``: the job store its jobs' rows go to (True: the session's,
    ``gpuctl.context.Context.job_store``, opened at the first submit: ``config``'s session
    when one is given, else the process's; False or None: none, nothing outlives the process).

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
        cpus: int | None = None,
        mem: int | str | None = None,
        time_limit: float | None = None,
        nodes: int = 1,
        tasks_per_node: int = 1,
        grace: float = 10.0,
        setup: Sequence[str] = (),
        job_env: Mapping[str, str] | None = None,
        env_pass: Sequence[str] = (),
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
        ship_limit: int | str | None = usercode.DEFAULT_LIMIT,
        ship_exclude: Sequence[str] = (),
        max_payload: int | str | None = None,
        cancel_on_interrupt: bool | None = None,
    ) -> None:
        if python is not None and env is not None:
            raise ValueError("give python= (an existing VENV2) or env= (one to build), not both")
        self.target = target
        self.debug = target == "debug"
        self.limits: Limits = {
            "cpus": _positive(cpus, "cpus"),
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
        self.ship_limit = parse_mem(ship_limit) or 0
        self.ship_exclude = (
            (ship_exclude,) if isinstance(ship_exclude, str) else tuple(ship_exclude)
        )
        self._code_folders: set[str] = set()  # code folders known complete on the host
        self.max_running = _positive(max_running, "max_running")
        self._max_payload = _size(max_payload, "max_payload")
        self._cancel_on_interrupt = cancel_on_interrupt
        self.job_env = dict(job_env or {})
        self.env_pass = (env_pass,) if isinstance(env_pass, str) else tuple(env_pass)
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
        # True: the session's, looked up at the first submit (``store``)
        self._store: JobStore | bool | None = None if self.debug else store
        self._root_ready = False
        # read-only mode: the caller's decision, else the session's (a config handed in is a
        # session of its own, decided now; none: the process's, looked up at the first submit)
        from gpuctl.context import Context

        self._context = Context.of(where.config) if where.config is not None else None
        self.guard = service.Guard(read_only, self._context)
        self._unseen: tuple[str, ...] = ()  # passed_env's notice, said once a job started
        self._config = where.config

    def _jobs_settings(self) -> JobsSettings:
        """The config's ``[jobs]`` settings: the one handed in, else the session's."""
        from gpuctl.context import current

        return (self._config or current().config).jobs

    @property
    def max_payload(self) -> int:
        """Bytes one pickled payload may have (a submit's call; a map's function and each
        chunk): ``max_payload=``, else the config's ``[jobs] max_payload``, else 1 GiB."""
        if self._max_payload is None:
            self._max_payload = (
                _size(self._jobs_settings().max_payload, "[jobs] max_payload")
                or DEFAULT_MAX_PAYLOAD
            )
        return self._max_payload

    @property
    def cancel_on_interrupt(self) -> bool:
        """Whether a Ctrl-C while waiting for a job cancels it (else it keeps running and a
        line says how to cancel it): ``cancel_on_interrupt=``, else the config's ``[jobs]
        cancel_on_interrupt``, else False."""
        if self._cancel_on_interrupt is None:
            self._cancel_on_interrupt = self._jobs_settings().cancel_on_interrupt
        return self._cancel_on_interrupt

    def _check_payload(
        self,
        what: str,
        obj: object,
        parts: Callable[[], Mapping[str, Any]],
        *,
        hashing: bool = False,
        keep: bool = False,
    ) -> _Pickled:
        """``obj`` pickled and measured (``_measure``: its bytes when ``keep`` and small);
        ``PayloadTooLarge`` when over ``max_payload``, naming the biggest of ``parts()`` (what
        the payload is made of)."""
        limit = self.max_payload
        try:
            pickled = _measure(obj, limit, hashing=hashing or keep, keep=keep)
        except (TypeError, pickle.PicklingError) as e:
            raise _unpicklable(what, e, parts()) from e
        if pickled.size > limit:  # refused: measured whole this time, to say how big it is
            whole = _measure(obj, None).size
            raise PayloadTooLarge(what, whole, limit, _biggest(parts(), limit))
        return pickled

    # --- submit --------------------------------------------------------------------------

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Job:
        """Run ``fn(*args, **kwargs)`` on the target; returns at once with a ``Job``.

        Raises ``JobFailed`` when VENV2 cannot be provisioned or does not match this Python,
        ``HostError`` when the target cannot be reached, and cloudpickle's ``PicklingError``
        (or TypeError) when ``fn`` or its arguments cannot be pickled, and
        ``gpuctl.service.ReadOnlyError`` in read-only mode (see the class docstring).
        """
        self.guard.check("submitting jobs")
        check_callable(fn)
        name = _name(fn)
        with pickling_by_value(fn, self._user_code(fn).ships):
            if self.debug:  # refused as a submit refuses it, culprit named
                _pickles(
                    f"the call of {name}", (fn, args, kwargs), lambda: _parts(fn, args, kwargs)
                )
                return debug.run_here(self.backend, fn, args, kwargs, name)
            pickled = self._check_payload(
                f"the call of {name}",
                (fn, args, kwargs),
                lambda: _parts(fn, args, kwargs),
                keep=True,
            )
            self.venv2()
            job_id, jobdir, meta = self._prepare(
                fn, args, kwargs, name, registered=True, pickled=pickled
            )
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
            if len(folders) == 1 or isinstance(self.backend, SlurmBackend):
                # nothing of it started (a Slurm map's arrays are cancelled when one is
                # refused): it leaves nothing behind, the error says why
                self._unwrite(folders, f"starting it failed: {e}")
                raise
            for job_id, _ in folders:  # a map on one machine: some may have started
                self._refused_row(job_id, f"starting it failed: {e}")
            raise
        self._tell_unseen()
        return [self._job(f, meta, h, now) for f, h in zip(folders, handles, strict=True)]

    def _job(self, folder: tuple[str, str], meta: JobMeta, handle: Handle, now: float) -> Job:
        """The Job of a prepared folder; ``handle`` empty: not started yet (it waits for its
        turn in a ``JobQueue``), its row "pending"."""
        job_id, jobdir = folder
        job = Job(job_id, meta["name"], self.target, self.backend, jobdir, handle, self.store, now)
        job.cancel_on_interrupt = self.cancel_on_interrupt
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
        check_callable(fn)
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
        with pickling_by_value(fn, self._user_code(fn).ships):  # until every payload is written
            if self.debug:  # refused as a map refuses it, culprit named
                for k in range(0, len(items), size):
                    chunk = items[k : k + size]
                    _pickles(
                        f"items {k} to {k + len(chunk) - 1} of map:{name}",
                        (_chunk.run_chunk, (fn, chunk), {}),
                        lambda: {**_parts(fn, (), {}), **_item_parts(chunk, k)},  # noqa: B023
                    )
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
            # The function and what it closes over go once per map: above SHARED_ABOVE into one
            # file (content-addressed, in the job root's shared/) that each chunk's payload names.
            # Every payload is measured against max_payload before anything is written.
            shared = self._check_payload(
                f"the function of map:{name} (with what it closes over)",
                fn,
                lambda: _parts(fn, (), {}),
                keep=True,
            )
            part: Any = fn
            if shared.size > SHARED_ABOVE:
                part = _chunk.SharedPart(f"{self._job_root_path()}/shared/{shared.digest}.pkl")
            chunks = [items[i : i + size] for i in range(0, len(items), size)]
            # each chunk measured and scanned once here; written by a second pass (all chunks'
            # bytes kept until written could be many times max_payload)
            measured = [
                self._check_payload(
                    f"chunk {k} of map:{name} (items {k * size} to {k * size + len(chunk) - 1})",
                    (_chunk.run_chunk, (part, chunk), {}),
                    functools.partial(_item_parts, chunk, k * size),
                )
                for k, chunk in enumerate(chunks)
            ]
            self.venv2()
            if isinstance(part, _chunk.SharedPart):
                self._write_shared(part.path, fn, shared)
            folders = []
            meta: JobMeta = {}
            # an array's chunks share one runner (the job folders are all on the login side's
            # file system): a folder then holds its payload and meta.json only
            runner = (
                shared_runner(self.backend.host, self._job_root())
                if isinstance(self.backend, SlurmBackend)
                else None
            )
            for chunk, pickled in zip(chunks, measured, strict=True):
                job_id, jobdir, meta = self._prepare(
                    _chunk.run_chunk,
                    (part, chunk),
                    {},
                    f"map:{name}",
                    registered=True,
                    runner=runner,
                    pickled=pickled,
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
                try:
                    done = job.result(left)
                except KeyboardInterrupt as e:  # Ctrl-C: the rest of the map, too
                    if interrupt.said(e):
                        interrupt.rest_of_map(jobs, job, job.cancel_on_interrupt)
                    raise
                for item in done:
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
    """What ``gpuctl jobs`` calls the function: ``train.py:main`` for a script's function (run
    as __main__, or loaded by ``gpuctl submit FILE.py:FUNC``), ``package.module.func`` else."""
    mod = getattr(fn, "__module__", "") or ""
    qual = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    if mod == "__main__" or mod.startswith("gpuctl_user_"):
        filename = getattr(getattr(fn, "__code__", None), "co_filename", "") or ""
        if filename and not filename.startswith("<"):
            return f"{os.path.basename(filename)}:{qual}"
        return str(qual)
    return f"{mod}.{qual}" if mod else str(qual)


def attach(
    record: JobRecord | str,
    store: JobStore | None = None,
    *,
    config: Config | None = None,
    watch: bool = True,
) -> Job:
    """Rebuild a ``Job`` from its stored record (after gpuctl restarted), or from its id or a
    unique prefix of it (looked up in ``store``, else the session's: ``config``'s, else the
    process's, ``gpuctl.context.Context.job_store``; ``JobNotFound``, one line naming the
    candidates, when none or several match). ``watch=False``: no background polling (for
    callers that poll it themselves: the CLI, the jobs pane)."""
    if isinstance(record, str):
        if store is None:
            from gpuctl.context import Context, current

            store = (Context.of(config) if config is not None else current()).job_store()
        record = store.find(record)
    return Job.of_record(record, store, config, watch=watch)
