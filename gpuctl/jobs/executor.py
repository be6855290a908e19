"""The job API: ``Executor(target).submit(fn, *args) -> Job``, ``map``, ``remote``.

A submit pickles ``(fn, args, kwargs)`` with cloudpickle into a file (the function's own module by
value, so helpers, globals and classes of a script or test module travel with it), makes a job
folder (uuid, mode 0700) on the target's host holding ``payload.pkl`` (temporary name, then
renamed), ``meta.json`` and copies of ``supervisor.py`` and ``worker.py``, and starts the
supervisor on the folder. Nothing of the user's code or data is ever on a command line.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import hashlib
import json
import logging
import os
import shutil
import sys
import sysconfig
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, overload

import cloudpickle

from gpuctl import paths, service
from gpuctl.jobs import _chunk
from gpuctl.jobs.backends import (
    Backend,
    LocalBackend,
    SlurmBackend,
    SshBackend,
)
from gpuctl.jobs.hosts import Host, HostError, LocalHost, SshHost
from gpuctl.jobs.report import (
    KINDS,
    REMEDIES,
    FailureReport,
    JobFiles,
    classify,
    parse_status,
    unreachable_report,
)
from gpuctl.jobs.store import JobRecord, JobStore, StoreError
from gpuctl.node import jobfiles
from gpuctl.reach.slurm import SlurmClient, slurm_target

R = TypeVar("R")
log = logging.getLogger(__name__)

PACKAGE = Path(__file__).resolve().parent.parent
# Copied into every job folder (path there -> source): the scripts and the contract they import.
RUNNER_FILES = {name: PACKAGE.parent / src for name, src in jobfiles.RUNNER.items()}
SUBMITTER_PYTHON = sys.version.split()[0]
UNREACHABLE_AFTER = 60.0  # seconds a node may stay unreachable before result() reports it
BEAT_EVERY = 3.0  # seconds between heartbeat reads while a job runs
SLURM_VERDICT_WAIT = 30.0  # seconds to wait for Slurm's final state after a signalled stop

cloudpickle.register_pickle_by_value(_chunk)


def _write_runner(host: Host, folder: str) -> None:
    """Copy the runner (``jobfiles.RUNNER``: the scripts and the package they import) into
    ``folder``, the supervisor last: a folder holding it is complete."""
    host.mkdir(f"{folder}/{jobfiles.RUNNER_PACKAGE}", 0o700)
    for name, src in sorted(RUNNER_FILES.items(), key=lambda i: i[0] == jobfiles.SUPERVISOR_SCRIPT):
        host.write_bytes(f"{folder}/{name}", src.read_bytes(), 0o600)


class JobFailed(Exception):
    """A system failure of a job (not an exception of the function); ``str`` is the report."""

    def __init__(self, report: FailureReport) -> None:
        super().__init__(report.text())
        self.report = report

    @property
    def kind(self) -> str:
        return self.report.kind


class RemoteTraceback(Exception):
    """Attached as ``__cause__`` of a re-raised user exception: the traceback on the node."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return f'\n"""\n{self.tb}"""'


@dataclass(frozen=True)
class EnvSpec:
    """A VENV2 to provision on the node: Python ``X.Y`` plus pip packages.

    ``system_site_packages`` lets the environment see the base interpreter's packages (fast to
    build when the node already has them). ``methods`` is the order to try (uv, conda, venv).
    """

    python: str = f"{sys.version_info[0]}.{sys.version_info[1]}"
    packages: tuple[str, ...] = ()
    system_site_packages: bool = False
    methods: tuple[str, ...] = ("uv", "conda", "venv")
    base_python: str | None = None  # the interpreter ``venv`` copies (default: python3.X)

    def pinned_packages(self) -> list[str]:
        """The packages with cloudpickle pinned to this submitter's version (added if absent):
        a payload only loads with the cloudpickle that wrote it."""
        pin = f"cloudpickle=={cloudpickle.__version__}"
        out = [pin if p.strip().lower() == "cloudpickle" else p for p in self.packages]
        if not any(p.strip().lower().startswith("cloudpickle") for p in out):
            out.insert(0, pin)
        return out


def parse_mem(mem: int | str | None) -> int | None:
    """Bytes from ``mem``: an int (bytes) or "512M", "4G", "1.5GB"."""
    if mem is None or isinstance(mem, int):
        return mem
    text = mem.strip().upper().removesuffix("B").removesuffix("I")
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(float(text))


def _is_user_module(name: str) -> bool:
    """True for a module imported from a file outside the standard library and site-packages."""
    mod = sys.modules.get(name)
    path = getattr(mod, "__file__", None)
    if mod is None or not path or name == "__main__" or name.split(".")[0] == "gpuctl":
        return False
    path = os.path.realpath(path)
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        base = sysconfig.get_paths().get(key)
        if base and path.startswith(os.path.realpath(base) + os.sep):
            return False
    return "site-packages" not in path and "dist-packages" not in path


def register_by_value(obj: Any) -> None:
    """Make cloudpickle copy the module that defines ``obj`` (when it is the user's own)."""
    name = getattr(obj, "__module__", None)
    if isinstance(name, str) and _is_user_module(name):
        with contextlib.suppress(ValueError):
            cloudpickle.register_pickle_by_value(sys.modules[name])


class Job:
    """A submitted function call; like ``concurrent.futures.Future``, but it explains failures.

    When the job's node stops answering, ``state`` is "unreachable" and ``result()`` keeps trying
    for ``unreachable_after`` seconds (or until its timeout), then raises ``JobFailed`` of kind
    ``node_unreachable``: not a verdict, the job may still run there, and a later ``result()``
    (or ``gpuctl result ID``) picks up the real outcome once the node is back.
    """

    unreachable_after = UNREACHABLE_AFTER

    def __init__(
        self,
        job_id: str,
        name: str,
        target: str,
        backend: Backend,
        jobdir: str,
        handle: dict[str, Any],
        store: JobStore | None,
        created_at: float | None = None,
    ) -> None:
        self.id = job_id
        self.name = name
        self.target = target
        self.backend = backend
        self.jobdir = jobdir
        self.handle = handle
        self.store = store
        self.created_at = created_at or time.time()
        self._files: JobFiles | None = None
        self._report: FailureReport | None = None
        self._final = False
        self._cancel_requested = False
        self._stored_state = "submitted"
        self._lock = threading.Lock()
        self._host_error: str | None = None
        self._unreachable_since: float | None = None  # wall clock of the first failed poll
        self._unreachable_mono: float | None = None
        self._beat: dict[str, Any] | None = None
        self._beat_read_at: float | None = None  # monotonic time of the last heartbeat read
        self._outcome_seen_at: float | None = None
        self._store_warned = False

    def __repr__(self) -> str:
        return f"<Job {self.id} {self.name} on {self.target}: {self.state}>"

    # --- files ---------------------------------------------------------------------------

    def _read(self, name: str) -> bytes | None:
        return self.backend.host.read_bytes(f"{self.jobdir}/{name}")

    def _json(self, name: str) -> Any:
        return jobfiles.loads(self._read(name))

    def _tail(self, name: str, limit: int = 6000) -> str:
        data = self._read(name) or b""
        return data[-limit:].decode("utf-8", "replace")

    def stdout(self) -> str:
        """What the function printed to stdout so far."""
        return (self._read(jobfiles.STDOUT) or b"").decode("utf-8", "replace")

    def stderr(self) -> str:
        """What went to stderr so far (tracebacks, faulthandler stacks, warnings)."""
        return (self._read(jobfiles.STDERR) or b"").decode("utf-8", "replace")

    def logs(self) -> dict[str, str]:
        """Paths of the job's log files on its host."""
        names = jobfiles.LOGS
        if not isinstance(self.backend.host, LocalHost):
            return {n: f"{self.backend.host.name}:{self.jobdir}/{n}" for n in names}
        found = {n: p for n in names if os.path.exists(p := f"{self.jobdir}/{n}")}
        pattern = str(self.handle.get("output") or "")
        for path in sorted(glob.glob(pattern))[:1] if pattern else ():
            found["slurm output"] = path  # where slurmstepd says why it killed the job
        return found

    # --- state ---------------------------------------------------------------------------

    def _poll(self) -> bool:
        """Read the folder; True once the job is over (outcome written, or can never be).

        A node that cannot be reached is remembered (``_host_error``, since when) and reads as
        "not over yet": the job may well be running there.
        """
        try:
            over = self._poll_files()
        except HostError as e:
            self._host_error = str(e)
            if self._unreachable_since is None:
                self._unreachable_since = time.time()
                self._unreachable_mono = time.monotonic()
            return False
        self._host_error = None
        self._unreachable_since = self._unreachable_mono = None
        return over

    @property
    def unreachable_for(self) -> float | None:
        """Seconds the node has been unreachable (None while it answers)."""
        if self._unreachable_mono is None:
            return None
        return time.monotonic() - self._unreachable_mono

    def _note_beat(self) -> None:
        """Read heartbeat.json now and then, so an unreachable node's report can say when the
        job was last seen alive."""
        now = time.monotonic()
        if self._beat_read_at is not None and now - self._beat_read_at < BEAT_EVERY:
            return
        self._beat_read_at = now
        beat = self._json(jobfiles.HEARTBEAT)
        if isinstance(beat, dict) and beat != self._beat:
            self._beat = beat
            self._remember(heartbeat=beat)  # for a later gpuctl that finds the node gone

    @property
    def last_heartbeat(self) -> dict[str, Any] | None:
        """The supervisor's last heartbeat this process read (``t``, ``elapsed_s``, ``rss_kb``)."""
        return self._beat

    def unreachable_report(self) -> FailureReport | None:
        """The ``node_unreachable`` report while the node does not answer, else None."""
        if self._host_error is None or self._unreachable_since is None:
            return None
        host = self.backend.host
        return unreachable_report(
            job_id=self.id,
            node=host.name,
            jobdir=self.jobdir,
            error=self._host_error,
            since=self._unreachable_since,
            now=time.time(),
            beat=self._beat,
            beat_seen_at=self._beat_read_at,
            logs=self.logs(),
        )

    def _poll_files(self) -> bool:
        with self._lock:
            if self._final:
                return True
            outcome = self._json(jobfiles.OUTCOME)
            sched: dict[str, Any] | None = None
            if outcome is None:
                self._note_beat()
                if not self.backend.finished_without_outcome(self.handle, self.jobdir):
                    return False
                # the supervisor may have written it just before it went away
                outcome = self._json(jobfiles.OUTCOME)
                if outcome is None:
                    sched = self.backend.scheduler_state(self.handle) or {}
                    if self._cancel_requested:
                        sched["cancelled"] = True
                    beat = self._json(jobfiles.HEARTBEAT)
                    if beat and "t" in beat:
                        sched["heartbeat_age"] = time.time() - float(beat["t"])
            elif isinstance(self.backend, SlurmBackend):
                sched = self.backend.scheduler_state(self.handle)
                if self._await_slurm_verdict(outcome, sched):
                    return False
            self._files = self._collect(outcome)
            self._report = classify(
                self._files,
                job_id=self.id,
                logs=self.logs(),
                scheduler=sched,
                submitter_python=SUBMITTER_PYTHON,
            )
            self._final = True
        self._store_final()
        return True

    def _await_slurm_verdict(self, outcome: dict[str, Any], sched: dict[str, Any] | None) -> bool:
        """True while a Slurm job whose supervisor was stopped by a signal gpuctl did not send
        (Slurm's time limit, preemption, an admin's scancel) is still in the queue: its final
        state says which, so wait for it (at most SLURM_VERDICT_WAIT s)."""
        if not (sched or {}).get("queued") or self._cancel_requested:
            return False
        if outcome.get("stop_reason") != "cancelled" or os.path.exists(
            jobfiles.JobPaths(self.jobdir).cancel
        ):
            return False
        now = time.monotonic()
        if self._outcome_seen_at is None:
            self._outcome_seen_at = now
        return now - self._outcome_seen_at < SLURM_VERDICT_WAIT

    def _collect(self, outcome: dict[str, Any] | None) -> JobFiles:
        return JobFiles(
            outcome=outcome,
            status=parse_status((self._read(jobfiles.STATUS) or b"").decode("utf-8", "replace")),
            error=self._json(jobfiles.ERROR),
            result_info=self._json(jobfiles.RESULT_INFO),
            stderr_tail=self._tail(jobfiles.STDERR),
            setup_tail=self._tail(jobfiles.SETUP_LOG, 3000),
            meta=self._json(jobfiles.META),
        )

    def _remember(self, **values: Any) -> None:
        """Write to the job store; a store that stopped being writable costs the record, never
        the job (its folder keeps the truth): said once in the log."""
        if self.store is None:
            return
        try:
            self.store.update(self.id, **values)
        except StoreError as e:
            if not self._store_warned:
                self._store_warned = True
                log.warning("job %s: %s", self.id, e)

    def _store_final(self) -> None:
        if self.store is None:
            return
        state = self.state
        r = self._report
        o = (self._files.outcome if self._files else None) or {}
        self._remember(
            state=state,
            kind=r.kind if r else None,
            summary=(r.evidence[0] if r and r.evidence else None),
            started_at=o.get("started_at"),
            ended_at=o.get("ended_at") or time.time(),
            report=r.to_dict() if r else None,
        )

    @property
    def state(self) -> str:
        """submitted | pending | running | unreachable | done | failed | cancelled."""
        if self._final or self._poll():
            if self._report is None:
                return "done"
            return "cancelled" if self._report.kind == "cancelled" else "failed"
        state = self._live_state()
        if state != self._stored_state and self.store is not None:
            self._stored_state = state
            self._remember(state=state)
        return state

    def _live_state(self) -> str:
        if self._host_error is not None:
            return "unreachable"
        try:
            if isinstance(self.backend, SlurmBackend):
                info = self.backend.scheduler_state(self.handle) or {}
                if info.get("state") == "PENDING":
                    return "pending"
            if self._beat or self._read(jobfiles.STATUS) or self._read(jobfiles.HEARTBEAT):
                return "running"
        except HostError as e:
            self._host_error = str(e)
            if self._unreachable_since is None:
                self._unreachable_since = time.time()
                self._unreachable_mono = time.monotonic()
            return "unreachable"
        return "submitted"

    def done(self) -> bool:
        """True once the job finished, failed or was cancelled."""
        return self._poll()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until done; False at the timeout, or once the node has not answered for
        ``unreachable_after`` seconds (then ``unreachable_report()`` says so)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.005
        while not self._poll():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            gone = self.unreachable_for
            if gone is not None and gone >= self.unreachable_after:
                return False
            step = delay if left is None else min(delay, left)
            self.backend.wait_hint(self.handle, step)
            delay = min(delay * 1.5, 0.5 if isinstance(self.backend.host, LocalHost) else 1.0)
        return True

    def report(self) -> FailureReport | None:
        """The failure report once the job is over (None while running or after success); while
        the node does not answer, the ``node_unreachable`` report."""
        if not self._poll():
            return self.unreachable_report()
        return self._report

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The exception ``result()`` would raise, or None on success."""
        try:
            self.result(timeout)
        except TimeoutError:
            raise
        except BaseException as e:
            return e
        return None

    def result(self, timeout: float | None = None) -> Any:
        """The function's return value.

        Raises the function's own exception (its class when importable here, with the remote
        traceback as ``__cause__``), ``JobFailed`` for any other failure (its message is the
        report; kind ``node_unreachable`` when the node stopped answering: call again once it
        is back), or ``TimeoutError``.
        """
        if not self.wait(timeout):
            lost = self.unreachable_report()
            if lost is not None:
                raise JobFailed(lost)
            raise TimeoutError(f"job {self.id} not finished after {timeout} s")
        r = self._report
        try:
            if r is None:
                return self._load_result()
            exc = self._load_exception() if r.kind == "user_exception" else None
        except HostError as e:  # the node went away between the outcome and the result
            self._host_error = str(e)
            self._unreachable_since = time.time()
            self._unreachable_mono = time.monotonic()
            lost = self.unreachable_report()
            assert lost is not None
            raise JobFailed(lost) from None
        if exc is not None:
            raise exc
        raise JobFailed(r)

    def _load_result(self) -> Any:
        path = jobfiles.JobPaths(self.jobdir)(jobfiles.RESULT)
        host = self.backend.host
        if isinstance(host, LocalHost):
            with open(path, "rb") as f:
                return cloudpickle.load(f)
        with tempfile.TemporaryDirectory(prefix="gpuctl-result-") as tmp:
            local = os.path.join(tmp, jobfiles.RESULT)
            host.get_file(path, local)
            with open(local, "rb") as f:
                return cloudpickle.load(f)

    def _load_exception(self) -> BaseException | None:
        data = self._read(jobfiles.EXCEPTION)
        if not data:
            return None
        exc = _rebuild_exception(data)
        if exc is None:
            return None
        err = (self._files.error if self._files else None) or {}
        tb = str(err.get("traceback") or "")
        exc.__cause__ = RemoteTraceback(tb)
        return exc

    def cancel(self, *, read_only: bool | None = None) -> bool:
        """Ask the job to stop (TERM, grace, KILL on the node); False if it had finished.

        Raises ``gpuctl.service.ReadOnlyError`` in read-only mode (``read_only``: the caller's
        decision; None: ``$GPUCTL_READ_ONLY`` and the config, ConfigError when it cannot be
        read)."""
        service.check("cancelling jobs", read_only=read_only)
        if self._poll():
            return False
        self._cancel_requested = True
        self.backend.cancel(self.handle, self.jobdir)
        return True

    def dump_stacks(self) -> None:
        """Ask VENV2 to write every thread's stack to stderr (for a job that makes no progress)."""
        import signal

        self.backend.signal(self.handle, self.jobdir, signal.SIGUSR2)


class Executor:
    """Runs functions on ``target``: "local", a node name from the config, or "slurm".

    ``python`` names an existing VENV2 interpreter on the target; ``env`` (an ``EnvSpec``) asks
    gpuctl to build one (once, cached by content hash); ``supervisor_python`` is VENV1 (default:
    the node's configured python3). ``mem`` (bytes or "4G"), ``time_limit`` (seconds), ``cpus``,
    ``gpus`` are limits; ``setup`` lines run before VENV2 starts (after the cluster's own).
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
    """

    def __init__(
        self,
        target: str = "local",
        *,
        config: Any = None,
        python: str | None = None,
        env: EnvSpec | None = None,
        supervisor_python: str | None = None,
        gpus: int = 0,
        cpus: int = 1,
        mem: int | str | None = None,
        time_limit: float | None = None,
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
        self.limits: dict[str, Any] = {
            "cpus": cpus,
            "gpus": gpus,
            "mem_bytes": parse_mem(mem),
            "time_limit_s": time_limit,
            "grace_s": grace,
        }
        self.env_spec = env
        self.job_env = dict(job_env or {})
        self.verify = verify
        self._python = python
        self._probe: dict[str, Any] | None = None
        self._lock = threading.Lock()
        node_setup: tuple[str, ...] = ()
        cfg = config
        if target == "local":
            host: Host = LocalHost()
            vpy = supervisor_python or shutil.which("python3") or sys.executable
            root = str(paths.jobs_dir(job_root))
            self.backend: Backend = LocalBackend(host, root, vpy)
            if self._python is None and env is None:
                self._python = sys.executable
            self.cwd = cwd or os.getcwd()
        elif target == "slurm":
            if cfg is None:
                from gpuctl.config import load_config

                cfg = load_config(None)
            # the [jobs] table counts for Slurm jobs as for a node's: folders, setup lines
            jobs_cfg = dict(getattr(cfg, "jobs", {}) or {})
            node_setup = tuple(str(x) for x in jobs_cfg.get("setup", ()))
            job_root = job_root or jobs_cfg.get("dir")
            env_root = env_root or jobs_cfg.get("env_root")
            host = LocalHost()
            vpy = supervisor_python or shutil.which("python3") or sys.executable
            root = str(paths.jobs_dir(job_root))
            client = None
            if slurm_conf is None:
                where = slurm_target(cfg, "jobs", partition=partition)
                partition, client = where.partition, where.client()
            self.backend = SlurmBackend(
                host,
                root,
                vpy,
                partition=partition,
                slurm_conf=slurm_conf,
                sbatch_args=sbatch_args,
                client=client,
            )
            if self._python is None and env is None:
                self._python = sys.executable
            self.cwd = cwd or os.getcwd()
        else:
            if cfg is None:
                from gpuctl.config import load_config

                cfg = load_config(None)
            nodes = {n.name: n for n in cfg.nodes()}
            node = nodes.get(target)
            if node is None:
                known = ", ".join(sorted(nodes)[:10]) or "none configured"
                raise ValueError(
                    f"unknown target {target!r}: use 'local', 'slurm' or a node of the config"
                    f" ({known})"
                )
            node_setup = tuple(node.setup)
            jobs_cfg = dict(getattr(cfg, "jobs", {}) or {})
            node_setup += tuple(str(x) for x in jobs_cfg.get("setup", ()))
            job_root = job_root or jobs_cfg.get("dir")
            env_root = env_root or jobs_cfg.get("env_root")
            vpy = supervisor_python or node.python
            if self._python is None and env is None:
                self._python = node.workload_python or "python3"
            if node.via == "local":
                root = str(paths.jobs_dir(job_root))
                self.backend = LocalBackend(LocalHost(), root, vpy)
                self.cwd = cwd or os.getcwd()
            elif node.via == "srun":
                # a node reached through Slurm: its jobs are batch jobs pinned to it
                conf = slurm_conf or node.slurm_conf
                origin = "slurm_conf" if slurm_conf else f"[clusters.{node.cluster}] slurm_conf"
                self.backend = SlurmBackend(
                    LocalHost(),
                    str(paths.jobs_dir(job_root)),
                    vpy,
                    partition=partition or node.partition,
                    nodelist=node.name,
                    sbatch_args=sbatch_args,
                    client=SlurmClient(conf, origin=origin),
                )
                self.cwd = cwd or os.getcwd()
            else:
                host = SshHost.for_node(node)
                # on the node: its own home, resolved there
                root = job_root or paths.NODE_JOB_DIR
                self.backend = SshBackend(host, root, vpy, node.name)
                self.cwd = cwd or ""
        self.setup = (*node_setup, *setup)
        self.env_root = env_root or paths.NODE_ENV_DIR
        if store is True:
            self.store: JobStore | None = JobStore()
        elif store is False or store is None:
            self.store = None
        else:
            self.store = store
        self._root_ready = False
        self.guard = service.Guard(read_only, cfg)  # read-only mode, judged at each submit

    # --- VENV2 ---------------------------------------------------------------------------

    def _abs(self, path: str) -> str:
        if path.startswith("~/") or path == "~":
            return self.backend.host.home() + path[1:]
        return path

    def venv2(self) -> dict[str, Any]:
        """Resolve (and build if asked) VENV2; return its probe ``{python, cloudpickle, ...}``.

        Raises ``JobFailed`` (env_build_failed, venv2_wont_start, python_mismatch,
        cloudpickle_mismatch, module_missing) with a remedy that says exactly what to do.
        """
        with self._lock:
            if self._probe is not None:
                return self._probe
            if self.env_spec is not None:
                probe = self._build_env(self.env_spec)
            elif not self.verify:
                probe = {"path": self._python}
            else:
                assert self._python is not None
                probe = self._run_probe(self._python)
            if self.verify:
                self._check_versions(probe)
            self._probe = probe
            return probe

    def _run_probe(self, python: str) -> dict[str, Any]:
        from gpuctl.node.supervisor import _PROBE

        rc, out, err = self.backend.host.run([python, "-c", _PROBE], timeout=120)
        text = out.decode("utf-8", "replace").strip()
        if rc != 0 or not text:
            raise JobFailed(
                _provision_report(
                    "venv2_wont_start",
                    [
                        f"{python} on {self.target} does not run: exit {rc}",
                        *(err.decode("utf-8", "replace").strip().splitlines()[-5:]),
                    ],
                )
            )
        probe: dict[str, Any] = json.loads(text.splitlines()[-1])
        probe.setdefault("executable", python)
        probe["path"] = python
        return probe

    def _build_env(self, spec: EnvSpec) -> dict[str, Any]:
        host = self.backend.host
        root = self._abs(self.env_root)
        host.mkdir(root, 0o700)
        # The runner once per version: a folder named by the hash of its files
        digest = hashlib.sha256()
        for name, src in sorted(RUNNER_FILES.items()):
            digest.update(name.encode() + b"\0" + src.read_bytes() + b"\0")
        runner = f"{root}/runner-{digest.hexdigest()[:12]}"
        sup = f"{runner}/{jobfiles.SUPERVISOR_SCRIPT}"
        if not host.exists(sup):
            host.mkdir(runner, 0o700)
            _write_runner(host, runner)
        spec_json = {
            "root": root,
            "python": spec.python,
            "packages": spec.pinned_packages(),
            "system_site_packages": spec.system_site_packages,
            "methods": list(spec.methods),
            "base_python": spec.base_python,
        }
        spec_path = f"{root}/spec-{uuid.uuid4().hex[:12]}.json"
        host.write_bytes(spec_path, json.dumps(spec_json).encode())
        try:
            rc, out, err = host.run(
                [self.backend.supervisor_python, sup, "--build-env", spec_path], timeout=3600
            )
        finally:
            host.run(["rm", "-f", spec_path], timeout=30)
        try:
            result = json.loads(out.decode().strip().splitlines()[-1])
        except (ValueError, IndexError):
            result = {
                "ok": False,
                "error": f"the builder printed nothing (exit {rc})",
                "log_tail": err.decode("utf-8", "replace")[-3000:],
            }
        if not result.get("ok"):
            tail = str(result.get("log_tail") or "").strip().splitlines()[-12:]
            raise JobFailed(
                _provision_report(
                    "env_build_failed",
                    [
                        f"building Python {spec.python} with {spec.pinned_packages()}"
                        f" on {self.target}: {result.get('error')}",
                        *(f"| {line}" for line in tail),
                    ],
                    logs={"build log": str(result.get("log", ""))},
                )
            )
        probe = dict(result.get("probe") or {})
        probe["path"] = result["python"]
        probe["env_key"] = result.get("key")
        probe["method"] = result.get("method")
        return probe

    def _check_versions(self, probe: Mapping[str, Any]) -> None:
        have = list(probe.get("python") or [])[:2]
        want = list(sys.version_info[:2])
        path = probe.get("path")
        if have != want:
            hv = ".".join(str(x) for x in probe.get("python") or [])
            raise JobFailed(
                _provision_report(
                    "python_mismatch",
                    [
                        f"VENV2 {path} on {self.target} runs Python {hv}, this gpuctl runs Python "
                        f"{SUBMITTER_PYTHON}: cloudpickled functions only load on"
                        " the"
                        " same minor version"
                    ],
                    remedy=f"use env=EnvSpec(python='{want[0]}.{want[1]}', packages=[...]) to let "
                    f"gpuctl build a Python {want[0]}.{want[1]} VENV2, or python=<a Python "
                    f"{want[0]}.{want[1]} interpreter on {self.target}>, or run gpuctl itself"
                    " under "
                    f"Python {have[0] if have else '?'}.{have[1] if len(have) > 1 else '?'}",
                )
            )
        cp = probe.get("cloudpickle")
        if not cp:
            raise JobFailed(
                _provision_report(
                    "module_missing",
                    [f"VENV2 {path} on {self.target} has no cloudpickle"],
                    remedy=f"{path} -m pip install cloudpickle=={cloudpickle.__version__}, or use "
                    "env=EnvSpec(...) which installs it",
                )
            )
        if str(cp).split(".")[:2] != cloudpickle.__version__.split(".")[:2]:
            raise JobFailed(
                _provision_report(
                    "cloudpickle_mismatch",
                    [
                        f"VENV2 {path} has cloudpickle {cp},"
                        f" this gpuctl has {cloudpickle.__version__}"
                    ],
                    remedy=f"{path} -m pip install cloudpickle=={cloudpickle.__version__}",
                )
            )

    # --- submit --------------------------------------------------------------------------

    def _job_root(self) -> str:
        """The job root on the target's host (``~`` resolved there), created on first use."""
        root = self._abs(self.backend.job_root)
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
    ) -> tuple[str, str, dict[str, Any]]:
        """Write one job folder; return (id, jobdir, meta).

        The job's row goes into the store first ("preparing"): a store that cannot be written
        refuses the job (``StoreError``) before anything exists on the node. A job that fails
        to be prepared (its function cannot be pickled) leaves no row."""
        probe = self.venv2()
        job_id = uuid.uuid4().hex
        jobdir = f"{self._abs(self.backend.job_root)}/{job_id}"
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
        probe: Mapping[str, Any],
    ) -> tuple[str, str, dict[str, Any]]:
        host = self.backend.host
        self._job_root()
        host.mkdir(jobdir, 0o700)
        register_by_value(fn)
        limits = dict(self.limits)
        if (
            limits.get("mem_bytes")
            and isinstance(self.backend, SlurmBackend)
            and self.backend.memory_enforced()
        ):
            limits["mem_enforced_by"] = "slurm"
        digest, size = self._write_payload(host, jobdir, (fn, args, kwargs))
        meta = {
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
        _write_runner(host, jobdir)
        host.write_bytes(f"{jobdir}/{jobfiles.META}", json.dumps(meta, indent=1).encode(), 0o600)
        return job_id, jobdir, meta

    def _write_payload(self, host: Host, jobdir: str, obj: Any) -> tuple[str, int]:
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

    def _start(self, folders: Sequence[tuple[str, str]], meta: Mapping[str, Any]) -> list[Job]:
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
                str(meta["name"]),
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
        meta: dict[str, Any] = {}
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
                        raise exc

        return results()


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


class _HashingWriter:
    """A file wrapper that hashes and counts what cloudpickle writes through it."""

    def __init__(self, f: Any) -> None:
        self.f = f
        self.h = hashlib.sha256()
        self.size = 0

    def write(self, data: Any) -> int:
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


def _provision_report(
    kind: str,
    evidence: list[str],
    *,
    remedy: str | None = None,
    logs: Mapping[str, str] | None = None,
) -> FailureReport:
    assert kind in KINDS
    return FailureReport(
        kind=kind,
        phase="provision",
        evidence=tuple(evidence),
        remedy=remedy or REMEDIES[kind],
        logs=dict(logs or {}),
        job_id="(not submitted)",
    )


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

    def wrap(func: Callable[..., Any]) -> Callable[..., Any]:
        holder: dict[str, Executor] = {}

        def executor() -> Executor:
            if "ex" not in holder:
                holder["ex"] = Executor(target, **options)
            return holder["ex"]

        @functools.wraps(func)
        def call(*args: Any, **kwargs: Any) -> Any:
            return executor().submit(func, *args, **kwargs).result()

        def submit(*args: Any, **kwargs: Any) -> Job:
            return executor().submit(func, *args, **kwargs)

        call.submit = submit  # type: ignore[attr-defined]
        call.local = func  # type: ignore[attr-defined]
        return call

    if fn is not None:
        return wrap(fn)
    return wrap


def attach(record: JobRecord, store: JobStore | None = None, *, config: Any = None) -> Job:
    """Rebuild a ``Job`` from its stored record (after gpuctl restarted)."""
    b = record.backend
    kind = b.get("kind")
    handle = dict(b.get("handle") or {})
    backend: Backend
    if kind == "local":
        backend = LocalBackend(LocalHost(), b["job_root"], b["python"])
    elif kind == "slurm":
        # records written before slurm_conf was stored carry it as slurm_env's SLURM_CONF
        conf = b.get("slurm_conf") or (b.get("slurm_env") or {}).get("SLURM_CONF")
        backend = SlurmBackend(
            LocalHost(),
            b["job_root"],
            b["python"],
            partition=b.get("partition"),
            slurm_conf=conf,
            nodelist=b.get("nodelist"),
            sbatch_args=b.get("sbatch_args") or (),
        )
    elif kind == "ssh":
        if config is None:
            from gpuctl.config import load_config

            config = load_config(None)
        nodes = {n.name: n for n in config.nodes()}
        node = nodes.get(b["node"])
        if node is None:
            raise HostError(f"node {b['node']} of job {record.id} is not in the config any more")
        host = SshHost.for_node(node)
        backend = SshBackend(host, b["job_root"], b["python"], node.name)
    else:
        raise HostError(f"job {record.id} has an unknown backend {kind!r}")
    job = Job(
        record.id,
        record.name,
        record.target,
        backend,
        record.jobdir,
        handle,
        store,
        record.created_at,
    )
    job._stored_state = record.state
    job._beat = record.heartbeat
    return job
