"""Allocated but idle: GPUs inside a running Slurm job that have done nothing for a while.

One tracker per fleet (``Fleet.idle``), fed by the fleet's snapshots: a GPU whose notes name a
Slurm job (``slurm_job``, from the squeue watch ``fleet.slurm.JobWatcher`` or a Prometheus
store's job label) and whose sample shows its utilization and its memory (copy) utilization
both at or below ``below`` percent is idle from the first such sample on; a sample above it, a
lost GPU, a reading not known or another job on the GPU starts the count again; a node that
becomes unreachable is forgotten (nothing is claimed of GPUs not seen). A GPU idle for
``after`` seconds or more is *allocated but idle*: the screen's ``IDLE`` badge and header count,
``status``'s flag and ``--json``'s ``alloc_idle_s``, and export's
``gpuctl_gpu_allocated_idle_seconds`` read it here.

The time is the tracker's ``clock`` (the fleet's ``idle_clock``; wall time by default), not the
samples' own: a test drives it instead of waiting half an hour. Only GPUs in jobs are kept, and
a node without job notes costs one dictionary look-up per sample.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from gpuctl.core.model import NodeSnapshot

IDLE_AFTER_S = 1800.0  # seconds idle in a job before a GPU counts as allocated but idle
IDLE_BELOW = 5.0  # % of utilization and of memory utilization at or below which a GPU is idle


@dataclass(frozen=True, slots=True)
class IdleGpu:
    """A GPU of a running job idle since ``since`` (the tracker's clock; None: busy now),
    ``seconds`` ago."""

    node: str
    gpu: int
    job: str
    user: str
    since: float | None
    seconds: float


class IdleTracker:
    """Per GPU in a job: the job, its user and since when the GPU is idle (None: busy now)."""

    def __init__(
        self,
        *,
        after: float = IDLE_AFTER_S,
        below: float = IDLE_BELOW,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.after = after
        self.below = below
        self.clock = clock
        # node -> GPU index -> (job, user, idle since or None)
        self._gpus: dict[str, dict[int, tuple[str, str, float | None]]] = {}

    def observe(self, s: NodeSnapshot) -> None:
        """Take a node's snapshot (a fleet listener): called for every sample of every node."""
        kept = self._gpus.get(s.name)
        if not s.annotations and kept is None:
            return  # most nodes, each sample: no job, nothing kept
        if s.state.value == "unreachable":
            self._gpus.pop(s.name, None)  # not seen: no claim that its GPUs idle on
            return
        if s.last_sample_t is None or s.state.value != "live":
            return  # a stale node's (a pause): what was seen stays until the next sample
        now = self.clock()
        below = self.below
        samples = {g.index: g for g in s.gpus}
        fresh: dict[int, tuple[str, str, float | None]] = {}
        for index, notes in s.annotations.items():
            job = notes.get("slurm_job")
            if not job:
                continue
            user = notes.get("slurm_user") or ""
            g = samples.get(index)
            idle = (
                g is not None
                and not g.lost
                and g.util_gpu is not None
                and g.util_gpu <= below
                and (g.util_mem is None or g.util_mem <= below)
            )
            since: float | None = None
            if idle:
                old = kept.get(index) if kept else None
                since = old[2] if old is not None and old[0] == job and old[2] is not None else now
            fresh[index] = (job, user, since)
        if fresh:
            self._gpus[s.name] = fresh
        else:
            self._gpus.pop(s.name, None)

    def forget(self, node: str, _why: str = "") -> None:
        """A node that left the fleet (a ``Fleet.on_removed`` listener)."""
        self._gpus.pop(node, None)

    def seconds(self, node: str, gpu: int) -> float | None:
        """How long a GPU in a job has been idle so far (None: not in a job, or busy)."""
        kept = self._gpus.get(node)
        entry = kept.get(gpu) if kept else None
        if entry is None or entry[2] is None:
            return None
        return max(0.0, self.clock() - entry[2])

    def idle_for(self, node: str, gpu: int) -> float | None:
        """``seconds`` when they reach ``after`` (the GPU is allocated but idle), else None."""
        seconds = self.seconds(node, gpu)
        return seconds if seconds is not None and seconds >= self.after else None

    def in_jobs(self) -> list[IdleGpu]:
        """Every GPU in a job, with its idle seconds so far (``since`` None and 0 seconds while
        busy): export's series, which a site alerts on."""
        now = self.clock()
        return [
            IdleGpu(node, gpu, job, user, since, 0.0 if since is None else max(0.0, now - since))
            # a copy: export's thread reads while the loop's replaces a node's (never changes it)
            for node, gpus in list(self._gpus.items())
            for gpu, (job, user, since) in gpus.items()
        ]

    def idle(self) -> list[IdleGpu]:
        """The GPUs allocated but idle, longest idle first."""
        out = [g for g in self.in_jobs() if g.since is not None and g.seconds >= self.after]
        return sorted(out, key=lambda g: (-g.seconds, g.node, g.gpu))

    def count(self, node: str | None = None) -> int:
        """How many GPUs are allocated but idle (the screen's header asks every flush), those
        of ``node`` only unless None (its line's TROUBLE in the compact list)."""
        limit = self.clock() - self.after
        nodes = list(self._gpus.values()) if node is None else [self._gpus.get(node, {})]
        return sum(
            1
            for gpus in nodes
            for _job, _user, since in gpus.values()
            if since is not None and since <= limit
        )
