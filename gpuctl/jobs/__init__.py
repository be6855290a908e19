"""Run Python functions on nodes: ``Executor(target).submit(fn, ...)``, with failures that say
what really happened (see ``report``). VENV1 (``gpuctl/node/supervisor.py``) supervises, VENV2
(``gpuctl/workloads/worker.py``) runs the function.

Modules: ``executor`` (``Executor``, ``attach``), ``decorator`` (``remote``), ``job`` (a
submitted ``Job``), ``pickling`` (what a call pickles into), ``provision`` (VENV2), ``targets``
(which backend a target names), ``backends`` (local, SSH, Slurm), ``hosts`` (files and commands
on a host), ``classify`` (what happened to a job), ``report`` (why a job failed, as a report),
``store`` (the job store)."""

from gpuctl.jobs.decorator import remote
from gpuctl.jobs.errors import JobCancelled, JobFailed, RemoteTraceback
from gpuctl.jobs.executor import Executor, attach
from gpuctl.jobs.hosts import HostError
from gpuctl.jobs.job import Job
from gpuctl.jobs.pickling import Unpicklable
from gpuctl.jobs.provision import EnvSpec, EnvSpecError
from gpuctl.jobs.report import FailureReport
from gpuctl.jobs.store import JobNotFound, JobRecord, JobStore, StoreError

__all__ = [
    "EnvSpec",
    "EnvSpecError",
    "Executor",
    "FailureReport",
    "HostError",
    "Job",
    "JobCancelled",
    "JobFailed",
    "JobNotFound",
    "JobRecord",
    "JobStore",
    "RemoteTraceback",
    "StoreError",
    "Unpicklable",
    "attach",
    "remote",
]
