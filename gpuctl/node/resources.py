"""What ``gpus=`` and ``cpus=`` mean where no scheduler allocates them (local, SSH), and how
many threads the job's math libraries will start.

The GPUs are read as the agent reads them (``readers.open_reader``: NVML, else nvidia-smi)
with the job's environment, which is put in ``os.environ`` for the read and taken back after
(a setup line's PATH finds nvidia-smi). Standard library only, Python 3.6.
"""

import os
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from . import readers

if TYPE_CHECKING:
    from . import jobfiles


THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
               "NUMEXPR_NUM_THREADS")


def _node_gpus(env: Dict[str, str]) -> Tuple[Optional[List[Tuple[str, str, bool]]], str]:
    """(index, uuid, busy) of each of the node's GPUs through the node's readers (NVML, else
    nvidia-smi: ``readers.open_reader``), read with the job's environment (a setup line's PATH
    finds nvidia-smi); busy: a process uses it. None and the readers' reason when neither
    works."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        reader, note = readers.open_reader()
        if reader is None:
            return None, note or ""
        try:
            rows = reader.sample(slow=False)
        finally:
            reader.close()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    found = []  # type: List[Tuple[str, str, bool]]
    for row in rows:
        if isinstance(row.get("index"), int):
            found.append((str(row["index"]), str(row.get("uuid") or ""),
                          bool(row.get("processes"))))
    return found, ""


def node_resources(limits: Dict[str, Any], env: Dict[str, str]) -> Tuple[Dict[str, str], str]:
    """What ``gpus=`` and ``cpus=`` mean where no scheduler allocates them (local, SSH).

    gpus=N: N of the node's GPUs in ``CUDA_VISIBLE_DEVICES`` (indices in PCI order, with
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so CUDA counts them the same way), the GPUs without compute
    processes first; a ``CUDA_VISIBLE_DEVICES`` the environment already has (the config's env,
    a setup line) is the set to choose from. The GPUs are read as the agent reads them (NVML,
    else nvidia-smi). cpus=N: the usual thread-count variables set to N
    (those the job's env does not set itself). Nothing is reserved: two jobs started at the same
    moment can pick the same idle GPU. Returns (environment additions, "" or why the node cannot
    give what was asked).
    """
    add = {}  # type: Dict[str, str]
    cpus = int(limits.get("cpus") or 0)
    if cpus:
        try:
            have = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            have = os.cpu_count() or 1
        if cpus > have:
            return {}, "cpus=%d asked, and this node lets the job use %d CPU(s)" % (cpus, have)
        for name in THREAD_VARS:
            if name not in env:
                add[name] = str(cpus)
    gpus = int(limits.get("gpus") or 0)
    if not gpus:
        return add, ""
    visible = [g.strip() for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
    if "CUDA_VISIBLE_DEVICES" in env and not visible:
        return {}, "gpus=%d asked, and CUDA_VISIBLE_DEVICES is empty in the job's environment" % gpus
    found, why = _node_gpus(env)
    if found is None:
        if "nvidia-smi is not on PATH" in why:
            return {}, ("gpus=%d asked, and this node has no NVML and no nvidia-smi on PATH (no "
                        "NVIDIA driver?)" % gpus)
        return {}, "gpus=%d asked, and the GPUs cannot be read here: %s" % (
            gpus, why.rpartition("nvidia-smi: ")[2].rstrip(")"))
    if visible:
        found = [g for g in found if g[0] in visible or g[1] in visible]
    free = [i for i, _, busy in found if not busy] + [i for i, _, busy in found if busy]
    if gpus > len(free):
        where = " of CUDA_VISIBLE_DEVICES=%s" % ",".join(visible) if visible else ""
        return {}, "gpus=%d asked, and this node has %d GPU(s)%s" % (gpus, len(free), where)
    add["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    add["CUDA_VISIBLE_DEVICES"] = ",".join(free[:gpus])
    return add, ""


def thread_count(env: Dict[str, str]) -> "jobfiles.ThreadCount":
    """How many threads the job's math libraries (torch, numpy's BLAS, OpenMP) start by
    default: ``OMP_NUM_THREADS`` when the job's environment sets it (``cpus=``, the config's
    env, a setup line), else the CPUs the job may run on (its affinity: under Slurm, its
    allocation)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    value = env.get("OMP_NUM_THREADS", "").strip()
    if value.isdigit() and int(value) > 0:
        return {"count": int(value), "source": "OMP_NUM_THREADS", "cpus": cpus}
    return {"count": cpus, "source": "cpus", "cpus": cpus}
