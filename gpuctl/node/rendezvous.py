"""One task of a job of several (Slurm nodes x tasks_per_node, started by srun).

Each task's supervisor runs in its rank's own folder (``task_folder``), and its VENV2 gets
torch.distributed's ``env://`` variables (``rendezvous_env``) from what srun set. Standard
library only, Python 3.6.
"""

import os
import socket
from typing import Any, Dict

from . import jobfiles
from .scontrol import scontrol

MASTER_PORTS = (15000, 30000)  # below Linux's ephemeral ports (32768-60999), above well-known


def task_folder(jobdir: str, outcome: "jobfiles.Outcome") -> str:
    """Where this supervisor's files go: ``jobdir``, or for one task of a job of several its
    rank's own folder (``SLURM_PROCID``; made with links to the job's inputs), so that ranks
    never write each other's files. Raises OSError when the folder cannot be made."""
    meta = jobfiles.read_json(os.path.join(jobdir, jobfiles.META))
    rank = os.environ.get("SLURM_PROCID")
    if jobfiles.task_count(meta) < 2 or rank is None or not rank.isdigit():
        return jobdir
    outcome["rank"] = int(rank)
    return jobfiles.make_task_folder(jobdir, int(rank))


def rendezvous_env(meta: Dict[str, Any], environ: Dict[str, str]) -> Dict[str, str]:
    """torch.distributed's ``env://`` variables for one task of a job of several, from what
    srun set for it: RANK, LOCAL_RANK, NODE_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR (the
    node srun was started from: the batch step's, the allocation's first node) and MASTER_PORT
    (from the Slurm job id: the same in every task, different for jobs that share a node).
    Empty for a job of one task."""
    tasks = jobfiles.task_count(meta)
    if tasks < 2:
        return {}
    job_id = environ.get("SLURM_JOB_ID", "0")
    low, high = MASTER_PORTS
    port = low + (int(job_id) if job_id.isdigit() else 0) % (high - low)
    master = environ.get("SLURM_LAUNCH_NODE_IPADDR") or _first_node(environ)
    return {
        "RANK": environ.get("SLURM_PROCID", "0"),
        "LOCAL_RANK": environ.get("SLURM_LOCALID", "0"),
        "NODE_RANK": environ.get("SLURM_NODEID", "0"),
        "WORLD_SIZE": str(tasks),
        "LOCAL_WORLD_SIZE": str((meta.get("limits") or {}).get("tasks_per_node") or 1),
        "MASTER_ADDR": master,
        "MASTER_PORT": str(port),
    }

def _first_node(environ: Dict[str, str]) -> str:
    """The allocation's first node by name (``scontrol show hostnames``), else this one."""
    rc, out = scontrol("show", "hostnames", environ.get("SLURM_JOB_NODELIST", ""))
    names = out.split() if rc == 0 else []
    return names[0] if names else environ.get("SLURMD_NODENAME") or socket.gethostname()
