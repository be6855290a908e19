"""Run Python functions on nodes: ``Executor(target).submit(fn, ...)``, with failures that say
what really happened (see ``report``). VENV1 (``gpuctl/node/supervisor.py``) supervises, VENV2
(``gpuctl/workloads/worker.py``) runs the function."""

from gpuctl.jobs.executor import (
    EnvSpec,
    Executor,
    Job,
    JobFailed,
    RemoteTraceback,
    attach,
    remote,
)
from gpuctl.jobs.hosts import HostError
from gpuctl.jobs.report import FailureReport
from gpuctl.jobs.store import JobRecord, JobStore, StoreError

__all__ = [
    "EnvSpec",
    "Executor",
    "FailureReport",
    "HostError",
    "Job",
    "JobFailed",
    "JobRecord",
    "JobStore",
    "RemoteTraceback",
    "StoreError",
    "attach",
    "remote",
]
