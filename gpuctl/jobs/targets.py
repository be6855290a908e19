"""Targets: how an ``Executor`` turns "local", "slurm" or a node's name into a backend.

``resolve`` reads the config (``[jobs]``: ``dir``, ``setup``, ``env_root``; a node's ``via``,
``python``, ``workload_python`` and ``setup``; the Slurm clusters) and returns a ``Target``: the
backend that starts supervisors, the job root on its host, the working directory and setup
lines jobs get, and the VENV2 used when the caller names none. ``backend_of`` rebuilds a
backend from the description a job's stored record keeps (``Backend.describe()``), for
``attach`` after a restart.
"""

from __future__ import annotations

import os
import pwd
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuctl import paths
from gpuctl.jobs.backends import Backend, LocalBackend, SlurmBackend, SshBackend
from gpuctl.jobs.hosts import HostError, LocalHost, SshHost
from gpuctl.jobs.records import BackendInfo
from gpuctl.reach.slurm import SlurmClient, slurm_target

if TYPE_CHECKING:
    from gpuctl.config import Config


@dataclass(frozen=True)
class Target:
    """Where an Executor's jobs run and what they get there.

    ``python`` is the VENV2 to use when the caller gives neither ``python`` nor ``env``;
    ``setup`` the node's and the config's ``[jobs]`` setup lines (the caller's come after);
    ``env_root`` the config's ``[jobs] env_root`` (None: not set); ``config`` the config that
    was read (None when none was needed).
    """

    backend: Backend
    python: str
    cwd: str
    setup: tuple[str, ...] = ()
    env_root: str | None = None
    config: Config | None = None


def _config(config: Config | None) -> Config:
    if config is not None:
        return config
    from gpuctl.context import current

    return current().config


def per_user(shared: str | None) -> str | None:
    """``<shared>/<user>`` for the config's ``[jobs] dir``: a file system shared by a cluster's
    users gets one private folder per user, so two users' job folders never meet."""
    if not shared:
        return None
    return f"{shared.rstrip('/')}/{pwd.getpwuid(os.getuid()).pw_name}"


def _local_python(supervisor_python: str | None) -> str:
    """VENV1 on this machine: the caller's, else python3 on PATH, else this interpreter."""
    return supervisor_python or shutil.which("python3") or sys.executable


def resolve(
    target: str,
    *,
    config: Config | None = None,
    supervisor_python: str | None = None,
    job_root: str | None = None,
    env_root: str | None = None,
    partition: str | None = None,
    slurm_conf: str | None = None,
    sbatch_args: Sequence[str] = (),
    cwd: str | None = None,
) -> Target:
    """The backend and settings of ``target`` ("local", "slurm" or a node of the config; see
    ``Executor``). The config is read (``load_config``) when a target needs it and none is given.

    Raises ValueError for a node the config does not name, ``SlurmValueError`` (a ValueError)
    for a Slurm value that cannot go into a batch script, ``ConfigError`` when the config
    cannot be read.
    """
    if target == "local":
        root = str(paths.jobs_dir(job_root))
        return Target(
            LocalBackend(LocalHost(), root, _local_python(supervisor_python)),
            python=sys.executable,
            cwd=cwd or os.getcwd(),
            env_root=env_root,
            config=config,
        )
    cfg = _config(config)
    jobs = cfg.jobs  # counts for Slurm jobs as for a node's: folders, setup lines
    setup = jobs.setup
    job_root = job_root or per_user(jobs.dir)
    env_root = env_root or jobs.env_root
    if target == "slurm":
        client = None
        if slurm_conf is None:
            where = slurm_target(cfg, "jobs", partition=partition)
            partition, client = where.partition, where.client()
        backend: Backend = SlurmBackend(
            LocalHost(),
            str(paths.jobs_dir(job_root)),
            _local_python(supervisor_python),
            partition=partition,
            slurm_conf=slurm_conf,
            sbatch_args=sbatch_args,
            client=client,
        )
        return Target(backend, sys.executable, cwd or os.getcwd(), setup, env_root, cfg)
    nodes = {n.name: n for n in cfg.nodes()}
    node = nodes.get(target)
    if node is None:
        known = ", ".join(sorted(nodes)[:10]) or "none configured"
        raise ValueError(
            f"unknown target {target!r}: use 'local', 'slurm', 'debug' or a node of the config "
            f"({known})"
        )
    setup = (*node.setup, *setup)
    vpy = supervisor_python or node.python
    python = node.workload_python or "python3"
    if node.via == "local":
        backend = LocalBackend(LocalHost(), str(paths.jobs_dir(job_root)), vpy)
        return Target(backend, python, cwd or os.getcwd(), setup, env_root, cfg)
    if node.via == "srun":
        # a node reached through Slurm: its jobs are batch jobs pinned to it
        conf = slurm_conf or node.slurm_conf
        origin = "slurm_conf" if slurm_conf else f"[clusters.{node.cluster}] slurm_conf"
        backend = SlurmBackend(
            LocalHost(),
            str(paths.jobs_dir(job_root)),
            vpy,
            partition=partition or node.partition,
            nodelist=node.name,
            sbatch_args=sbatch_args,
            client=SlurmClient(conf, origin=origin),
        )
        return Target(backend, python, cwd or os.getcwd(), setup, env_root, cfg)
    # on the node: its own home, resolved there
    backend = SshBackend(SshHost.for_node(node), job_root or paths.NODE_JOB_DIR, vpy, node.name)
    return Target(backend, python, cwd or "", setup, env_root, cfg)


def backend_of(description: BackendInfo, job_id: str, config: Config | None = None) -> Backend:
    """The backend a stored job record describes (``Backend.describe()``), to reattach it.

    Raises HostError for a node no longer in the config or an unknown backend kind.
    """
    b = description
    kind = b.get("kind")
    if kind == "local":
        return LocalBackend(LocalHost(), b["job_root"], b["python"])
    if kind == "slurm":
        # records written before slurm_conf was stored carry it as slurm_env's SLURM_CONF
        conf = b.get("slurm_conf") or (b.get("slurm_env") or {}).get("SLURM_CONF")
        return SlurmBackend(
            LocalHost(),
            b["job_root"],
            b["python"],
            partition=b.get("partition"),
            slurm_conf=conf,
            nodelist=b.get("nodelist"),
            sbatch_args=b.get("sbatch_args") or (),
        )
    if kind == "ssh":
        nodes = {n.name: n for n in _config(config).nodes()}
        node = nodes.get(b["node"])
        if node is None:
            raise HostError(f"node {b['node']} of job {job_id} is not in the config any more")
        return SshBackend(SshHost.for_node(node), b["job_root"], b["python"], node.name)
    raise HostError(f"job {job_id} has an unknown backend {kind!r}")
