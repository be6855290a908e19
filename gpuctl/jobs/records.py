"""What flows between the job API, its backends, the job store and a job's folder, as types.

A job folder's JSON files (their names and writers are in ``gpuctl.node.jobfiles``, Python 3.6)
are written on the node by the supervisor and the worker, so the login side reads them as data:
``gpuctl.core.wire.parse(Schema, value)`` keeps each field only when it has the type declared
here. The same goes for the VENV2 probe and the environment builder's answer, and for the
store's JSON columns when a row is read back.

- ``JobMeta`` (``meta.json``, written by the executor) and its ``Limits``;
- ``Outcome`` (``outcome.json``, the supervisor's: defined in ``gpuctl.node.jobfiles``, where
  the supervisor is type-checked against it), ``StatusLine`` (``status.jsonl``),
  ``WorkerError`` (``error.json``), ``ResultInfo`` (``result_info.json``), ``Heartbeat``
  (``heartbeat.json``), ``PidFile`` (``supervisor.json``);
- ``Handle`` (how a backend finds a job it started), ``BackendInfo`` (``Backend.describe()``:
  what the store keeps to rebuild the backend), ``SchedulerState`` (what Slurm says of a job);
- ``Probe`` (VENV2's versions) and ``BuildResult`` (the environment builder's answer);
- ``ReportDict`` (``FailureReport.to_dict()``, the store's ``report`` column).
"""

from __future__ import annotations

from typing import Any, TypedDict

from gpuctl.node.jobfiles import Outcome

__all__ = ["Outcome"]  # defined with its writer, the supervisor (the job folder's contract)


# -- written by the submitter ----------------------------------------------------------------
class Limits(TypedDict, total=False):
    """A job's resources, per task: ``mem_bytes`` and ``time_limit_s`` (None: no limit),
    ``grace_s`` (SIGTERM to SIGKILL), ``mem_enforced_by`` ("slurm" when Slurm kills over
    ``--mem``); ``nodes`` x ``tasks_per_node`` tasks (Slurm only; absent: one task)."""

    cpus: int | None  # None: no cpus= (outside Slurm the job may use all the node's CPUs)
    gpus: int
    nodes: int
    tasks_per_node: int
    mem_bytes: int | None
    time_limit_s: float | None
    grace_s: float
    mem_enforced_by: str
    max_requeues: int
    warning_s: float


class JobMeta(TypedDict, total=False):
    """``meta.json``: what the supervisor and the worker need, and what a report names."""

    id: str
    name: str
    target: str
    python_version: str  # the submitter's
    cloudpickle_version: str
    python: str  # VENV2's interpreter
    payload_sha256: str
    payload_bytes: int
    limits: Limits
    setup: list[str]
    env_names: list[str]  # the variables passed (``job_env``, ``env_pass``); values: JOB_ENV
    cwd: str
    worker: str
    created_at: float
    checkpointable: bool
    command: list[str]  # a command job's argv (``Executor.submit_command``)
    runner: str  # a runner folder shared by a Slurm map's chunks (else the runner is in the folder)
    code: str  # the user's modules shipped with the job (``usercode``): first on VENV2's path
    unshipped: dict[str, list[str]]  # the user's modules left out: name -> [path, why]
    dists: dict[str, list[str]]  # top-level module -> [distribution, version] the payload holds
    cells: dict[str, str]  # a notebook cell's file name -> "In[N]" (its traceback frames' name)


# -- written on the node (outcome.json's Outcome is imported above) ------------------------------
class Attempt(TypedDict, total=False):
    """A line of ``attempts.jsonl``: an attempt of the job that ended in a requeue."""

    attempt: int
    reason: str  # "checkpoint", "preempted", "requeued by the scheduler"
    checkpointed: bool  # a preempted attempt: the next one goes on from its checkpoint
    ended_at: float | None
    hostname: str | None
    run_s: float | None
    slurm_job_id: str | None
    exit_code: int | None
    stop_reason: str | None


class _StatusPhase(TypedDict):
    phase: str


class StatusLine(_StatusPhase, total=False):
    """A line of ``status.jsonl``: the phase the worker entered (``start`` carries VENV2's
    ``python`` version and ``executable``)."""

    t: float
    pid: int
    python: str
    executable: str


class DiskEvidence(TypedDict, total=False):
    """``error.json``'s ``disk`` (``worker._disk_evidence``): the largest ``files`` of the job
    and working folders ([path, bytes], largest first), ``named`` (the OSError's own file), the
    file system's ``mount`` point, its ``free_bytes`` and ``size_bytes``, whether it is
    ``full`` (a write naming no file may have filled another); ``error`` when
    gathering them failed."""

    files: list[list[Any]]
    named: str
    mount: str
    free_bytes: int
    size_bytes: int
    full: bool
    error: str


class WorkerError(TypedDict, total=False):
    """``error.json``: the worker's first error (``kind``, the ``phase`` it was in, the
    exception's ``type``, the module defining it as ``type_module``, and ``message``, its
    ``traceback``; ``module``: the module an ImportError could not import; ``stack`` where an
    exit was called; ``result_type`` of an unpicklable result; ``venv2_executable``)."""

    kind: str
    phase: str
    type: str | None
    type_module: str | None
    module: str | None
    message: str
    traceback: str
    t: float
    code: int | None
    stack: str
    result_type: str
    venv2_executable: str
    dist: str  # version_mismatch: the distribution, its version in VENV2 and the submitter's
    venv2_version: str
    pickler_version: str
    errno: int  # disk_full: the OSError's errno, and what filled the disk
    disk: DiskEvidence


class FailedItems(TypedDict, total=False):
    """``items_failed.json`` of a map's chunk (``gpuctl.jobs._chunk``): of its ``items``,
    ``count`` failed; ``failed`` names the first ones (their arguments, shortened), ``first``
    is the first one's exception line."""

    items: int
    count: int
    failed: list[str]
    first: str


class ResultInfo(TypedDict, total=False):
    """``result_info.json``: written once the result is saved."""

    type: str
    size: int
    repr: str


class PidFile(TypedDict, total=False):
    """``supervisor.json``: the supervisor's pid, process group and session, written first."""

    pid: int
    pgid: int
    sid: int
    hostname: str
    started_at: float


class Heartbeat(TypedDict, total=False):
    """``heartbeat.json``: the supervisor's sign of life (``t`` unix time, ``elapsed_s`` of
    VENV2, ``rss_kb``)."""

    t: float
    elapsed_s: float
    venv2_pid: int
    rss_kb: int | None


# -- backends and the scheduler ---------------------------------------------------------------
class Handle(TypedDict, total=False):
    """How a backend finds a job it started: the supervisor's ``pid`` and ``host`` (process
    backends), or the Slurm job id, its ``array`` and the Slurm ``output`` file pattern;
    ``tasks``: how many tasks (ranks) the job runs, each in its own folder (absent: one);
    ``split``: a map's tasks were more than one array may hold, which array this one is in."""

    pid: int | None
    host: str
    slurm_id: str
    array: str
    output: str
    tasks: int
    split: str


class QueuedBy(TypedDict, total=False):
    """The process that is to start a job not started yet (it writes its folder, or holds it
    in the ``JobQueue`` of a capped map): its ``pid`` on ``host``, and its start time in clock
    ticks since boot (``start_ticks``: a pid reused by another process is told apart)."""

    pid: int
    host: str
    start_ticks: int


class BackendInfo(TypedDict, total=False):
    """``Backend.describe()``, kept in the job store to rebuild the backend after a restart
    (plus the job's ``handle`` once it started). Records of older versions lack newer keys;
    ``slurm_env`` is such a record's way of naming slurm.conf."""

    kind: str
    job_root: str
    python: str
    node: str
    partition: str | None
    slurm_conf: str | None
    nodelist: str | None
    sbatch_args: list[str]
    slurm_env: dict[str, str]
    handle: Handle
    queued_by: QueuedBy


class FinalState(TypedDict, total=False):
    state: str
    source: str | None
    output_tail: str


class SchedulerState(TypedDict, total=False):
    """What the scheduler knows of a job: while queued its ``state`` and pending ``reason``;
    once gone its final ``state``, where that came from (``source``: sacct or scontrol) and the
    tail of Slurm's output file; ``cancelled``, ``heartbeat_age`` and ``disk_free_kb`` (the
    job folder's file system, probed when the supervisor left no outcome) are added by the job."""

    state: str
    reason: str
    queued: bool
    source: str | None
    output_tail: str
    cancelled: bool
    heartbeat_age: float
    disk_free_kb: int
    final: FinalState


# -- VENV2 ------------------------------------------------------------------------------------
class Probe(TypedDict, total=False):
    """VENV2 as its probe saw it: ``path`` (the interpreter gpuctl runs), ``python`` (version
    numbers), ``cloudpickle`` (version or None), ``executable``; for a built environment its
    ``env_key``, the ``method`` that built it and ``notes`` for the user (a relaxed pin)."""

    path: str
    python: list[int]
    cloudpickle: str | None
    executable: str
    env_key: str | None
    method: str | None
    notes: list[str]
    dists: dict[str, str]  # every distribution of VENV2 (pip's name) -> its version


class BuildResult(TypedDict, total=False):
    """The environment builder's answer (``supervisor.py --build-env``)."""

    ok: bool
    python: str
    key: str
    method: str
    probe: Probe
    error: str
    log: str
    log_tail: str
    notes: list[str]


# -- the store --------------------------------------------------------------------------------
class ReportDict(TypedDict, total=False):
    """``FailureReport.to_dict()``: the store's ``report`` column."""

    kind: str
    title: str
    phase: str
    evidence: list[str]
    remedy: str
    logs: dict[str, str]
    job_id: str
    traceback: str
    exit_status: int | None
