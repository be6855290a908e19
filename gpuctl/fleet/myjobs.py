"""Jobs first: the GPUs of Slurm jobs together, whatever nodes they are on, and each job's totals.

A GPU belongs to the job its notes name (``slurm_job``/``slurm_user``: the squeue watch,
``gpuctl.fleet.slurm.JobWatcher``). ``select`` picks the GPUs of one user's jobs (``--mine``,
the screen's ``mine`` filter word) or of one job (``--job``, ``job:ID``); ``totals`` sums them
per job: GPUs, nodes, mean utilization, memory used and power, and how many are allocated but
idle (``gpuctl.fleet.idle``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from gpuctl.core.model import GpuSample, NodeSnapshot
from gpuctl.fleet.idle import IdleTracker


def user_name() -> str:
    """This process's user, as Slurm names a job's user (``squeue %u``)."""
    from gpuctl.reach.slurm import current_user

    return current_user()


def wanted(notes: object, *, user: str | None = None, job: str | None = None) -> bool:
    """Whether a GPU's notes put it in ``job`` (when given) of ``user`` (when given); a GPU in
    no job never is."""
    if not isinstance(notes, dict) or not notes.get("slurm_job"):
        return False
    if job is not None and str(notes.get("slurm_job")) != job:
        return False
    return user is None or notes.get("slurm_user") == user


def select(
    snaps: Iterable[NodeSnapshot], *, user: str | None = None, job: str | None = None
) -> list[NodeSnapshot]:
    """The snapshots with only the GPUs of ``user``'s jobs or of ``job``; a node with none of
    them is left out."""
    out = []
    for s in snaps:
        gpus = tuple(g for g in s.gpus if wanted(s.annotations.get(g.index), user=user, job=job))
        if gpus:
            out.append(replace(s, gpus=gpus))
    return out


@dataclass(frozen=True, slots=True)
class JobTotals:
    """One job's GPUs summed over its nodes."""

    job: str
    user: str
    nodes: tuple[str, ...]
    gpus: int
    util_mean: float | None  # % over the GPUs that sent a reading
    mem_used: int  # bytes
    mem_total: int  # bytes
    power: float  # W
    idle: int  # GPUs allocated but idle

    def text(self) -> str:
        """``job 4242 alice: 4 GPUs on 2 nodes, util 37%, mem 120.0/320.0 GiB, 1.2 kW``."""
        util = "-" if self.util_mean is None else f"{self.util_mean:.0f}%"
        gib = 1024**3
        power = f"{self.power / 1000:.1f} kW" if self.power >= 1000 else f"{self.power:.0f} W"
        nodes = len(self.nodes)
        idle = f", {self.idle} idle" if self.idle else ""
        return (
            f"job {self.job} {self.user}: {self.gpus} GPU{'s' * (self.gpus != 1)} on {nodes} "
            f"node{'s' * (nodes != 1)}, util {util}, mem {self.mem_used / gib:.1f}/"
            f"{self.mem_total / gib:.1f} GiB, {power}{idle}"
        )


def totals(snaps: Iterable[NodeSnapshot], idle: IdleTracker | None = None) -> list[JobTotals]:
    """Per job of the snapshots' GPUs (in the order first seen): its totals."""
    jobs: dict[str, list[tuple[str, GpuSample, str]]] = {}
    for s in snaps:
        for g in s.gpus:
            notes = s.annotations.get(g.index) or {}
            job = notes.get("slurm_job")
            if job:
                jobs.setdefault(str(job), []).append((s.name, g, notes.get("slurm_user") or ""))
    out = []
    for job, held in jobs.items():
        utils = [g.util_gpu for _n, g, _u in held if g.util_gpu is not None and not g.lost]
        out.append(
            JobTotals(
                job=job,
                user=held[0][2],
                nodes=tuple(dict.fromkeys(n for n, _g, _u in held)),
                gpus=len(held),
                util_mean=sum(utils) / len(utils) if utils else None,
                mem_used=sum(g.mem_used or 0 for _n, g, _u in held),
                mem_total=sum(g.mem_total or 0 for _n, g, _u in held),
                power=float(sum(g.power or 0.0 for _n, g, _u in held)),
                idle=0
                if idle is None
                else sum(idle.idle_for(n, g.index) is not None for n, g, _u in held),
            )
        )
    return out


def summary(jobs: list[JobTotals]) -> str:
    """The jobs' totals in a few words, for the screen's header beside its filter: one job's
    (``job 101: 3 GPUs 12% 40/240G 370W 1 idle``), or several summed (``2 jobs: ...``)."""
    if not jobs:
        return ""
    gpus = sum(j.gpus for j in jobs)
    weighted = [(j.util_mean, j.gpus) for j in jobs if j.util_mean is not None]
    n = sum(w for _u, w in weighted)
    util = f"{sum(u * w for u, w in weighted) / n:.0f}%" if n else "-"
    gib = 1024**3
    used, total = sum(j.mem_used for j in jobs) / gib, sum(j.mem_total for j in jobs) / gib
    power = sum(j.power for j in jobs)
    watts = f"{power / 1000:.1f}kW" if power >= 1000 else f"{power:.0f}W"
    idle = sum(j.idle for j in jobs)
    who = f"job {jobs[0].job}" if len(jobs) == 1 else f"{len(jobs)} jobs"
    return f"{who}: {gpus} GPU{'s' * (gpus != 1)} {util} {used:.0f}/{total:.0f}G {watts}" + (
        f" {idle} idle" if idle else ""
    )
