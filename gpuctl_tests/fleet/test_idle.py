"""Allocated but idle (``gpuctl.fleet.idle``): GPUs of a Slurm job that do nothing, told by the
fleet's one tracker to the status table, ``status --json``, export and the job totals. Real
simulated agents stream; the Slurm job is put on the GPUs as the squeue watch puts it
(``Fleet.annotate``); the tracker's clock is driven, not waited for."""

from __future__ import annotations

from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from gpuctl.cli.status import render_table
from gpuctl.core.model import NodeSnapshot
from gpuctl.fleet import myjobs
from gpuctl.fleet.export import FleetExporter
from gpuctl.fleet.fleet import Fleet, simulated_fleet
from gpuctl.fleet.idle import IdleGpu
from gpuctl.fleet.status import node_to_json
from gpuctl_tests.helpers import all_live, fleet_changes, wait_fleet, wait_until_async

FAMILY = "gpuctl_gpu_allocated_idle_seconds"


class Clock:
    """The tracker's clock: moved by the test."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _gpu(s: NodeSnapshot, index: int) -> object:
    return next(g for g in s.gpus if g.index == index)


async def _next_sample(fleet: Fleet, node: str) -> None:
    """Wait for a sample newer than the one the fleet holds now (the tracker has seen it)."""
    seen = fleet.snapshot(node).last_sample_t
    await wait_fleet(fleet, lambda ss: ss[node].last_sample_t != seen, what="the next sample")


async def test_a_gpu_of_a_job_idle_for_idle_after_is_allocated_but_idle() -> None:
    clock = Clock()
    # idle_below 20: a simulated GPU with no job of its own moves a few % around 0
    fleet = simulated_fleet(
        [("n1", "8:H100")], interval=0.1, idle_after=1800, idle_below=20, idle_clock=clock
    )
    await fleet.start()
    try:
        snaps = await wait_fleet(fleet, lambda ss: all_live(ss.values(), 8), what="live")
        quiet = [g.index for g in snaps["n1"].gpus if not g.processes]
        assert quiet, "the simulator's seed 0 gives n1 a GPU without a job of its own"
        idle = quiet[0]
        busy = next(g.index for g in snaps["n1"].gpus if g.index != idle)
        await fleet.request("n1", {"type": "simulate", "action": "load", "gpus": [busy], "load": 1})
        await wait_fleet(
            fleet, lambda ss: (_gpu(ss["n1"], busy).util_gpu or 0) > 50, what="the load"
        )
        for gpu in (idle, busy):
            fleet.annotate("n1", gpu, slurm_job="4242", slurm_user="alice")
        await _next_sample(fleet, "n1")
        assert fleet.idle.seconds("n1", idle) == 0.0
        assert fleet.idle.seconds("n1", busy) is None  # busy: not idle at all
        clock.now += 1799
        assert fleet.idle.idle_for("n1", idle) is None and fleet.idle.idle() == []
        clock.now += 1
        assert fleet.idle.idle_for("n1", idle) == 1800.0
        await _next_sample(fleet, "n1")  # samples go on: the span keeps its start
        assert fleet.idle.idle() == [IdleGpu("n1", idle, "4242", "alice", 1_000_000.0, 1800.0)]
        assert fleet.idle.count() == 1

        # status: the IDLE flag on its row only, and alloc_idle_s in --json
        snap = fleet.snapshot("n1")
        rows = {r.split()[1]: r for r in render_table([snap], idle=fleet.idle).splitlines()[1:]}
        assert rows[str(idle)].endswith("IDLE")
        assert "IDLE" not in rows[str(busy)]
        gpus = {g["index"]: g for g in node_to_json(snap, idle=fleet.idle)["gpus"]}
        assert gpus[idle]["alloc_idle_s"] == 1800.0
        assert gpus[busy]["alloc_idle_s"] is None
        assert gpus[idle]["slurm_job"] == "4242"

        # export: a series per GPU in a job, 0 while busy; both parsers read it
        text = FleetExporter(fleet).text()
        (family,) = [f for f in text_string_to_metric_families(text) if f.name == FAMILY]
        series = family.samples
        got = {(x.labels["gpu"], x.labels["job"], x.labels["user"]): x.value for x in series}
        assert got == {(str(idle), "4242", "alice"): 1800.0, (str(busy), "4242", "alice"): 0.0}
        om = FleetExporter(fleet).text(openmetrics=True)
        assert next(f for f in openmetrics_families(om) if f.name == FAMILY).samples

        # the job's totals: two GPUs, one idle
        (job,) = myjobs.totals([snap], fleet.idle)
        assert (job.job, job.user, job.gpus, job.nodes) == ("4242", "alice", 2, ("n1",))
        assert job.idle == 1
        assert job.util_mean is not None and job.util_mean > 25
        assert "job 4242 alice: 2 GPUs on 1 node" in job.text()

        # another job on the GPU: its own span, from now
        fleet.annotate("n1", idle, slurm_job="4343", slurm_user="bob")
        await _next_sample(fleet, "n1")
        assert fleet.idle.seconds("n1", idle) == 0.0 and fleet.idle.count() == 0
        clock.now += 1800
        assert fleet.idle.idle_for("n1", idle) == 1800.0
        # work on it ends the span; the job leaving the GPU forgets it
        await fleet.request("n1", {"type": "simulate", "action": "load", "gpus": [idle], "load": 1})
        await wait_until_async(
            lambda: fleet.idle.seconds("n1", idle) is None, 20, "busy", wake=fleet_changes(fleet)
        )
        fleet.annotate("n1", busy, slurm_job=None, slurm_user=None)
        await _next_sample(fleet, "n1")
        assert [(g.gpu, g.job) for g in fleet.idle.in_jobs()] == [(idle, "4343")]
    finally:
        await fleet.stop()


async def test_my_jobs_select_the_gpus_of_a_user_or_a_job_across_nodes() -> None:
    fleet = simulated_fleet([("a", "2:H100"), ("b", "2:A100"), ("c", "1:L40S")], interval=0.2)
    await fleet.start()
    try:
        await wait_fleet(fleet, lambda ss: all_live(ss.values()), what="live")
        fleet.annotate("a", 1, slurm_job="7", slurm_user="alice")
        fleet.annotate("b", 0, slurm_job="7", slurm_user="alice")
        fleet.annotate("b", 1, slurm_job="8", slurm_user="bob")
        snaps = fleet.snapshots()
        mine = myjobs.select(snaps, user="alice")
        assert [(s.name, [g.index for g in s.gpus]) for s in mine] == [("a", [1]), ("b", [0])]
        assert [(s.name, [g.index for g in s.gpus]) for s in myjobs.select(snaps, job="8")] == [
            ("b", [1])
        ]
        assert myjobs.select(snaps, job="9") == []
        (seven,) = myjobs.totals(mine)
        assert (seven.gpus, seven.nodes) == (2, ("a", "b"))
        a1, b0 = _gpu(fleet.snapshot("a"), 1), _gpu(fleet.snapshot("b"), 0)
        assert seven.mem_used == (a1.mem_used or 0) + (b0.mem_used or 0)  # type: ignore[attr-defined]
    finally:
        await fleet.stop()


def test_an_unreachable_node_s_gpus_are_not_claimed_idle() -> None:
    """A node that cannot be reached says nothing of its GPUs: its spans are dropped, and a
    later sample starts them again."""
    from gpuctl.core.model import GpuNotes, GpuSample, NodeState
    from gpuctl.fleet.idle import IdleTracker

    clock = Clock()
    tracker = IdleTracker(after=60, clock=clock)
    notes = {0: GpuNotes(slurm_job="9", slurm_user="ann")}
    gpus = (GpuSample(index=0, util_gpu=0, util_mem=0),)
    live = NodeSnapshot("n", NodeState.LIVE, gpus=gpus, last_sample_t=1.0, annotations=notes)
    tracker.observe(live)
    clock.now += 60
    assert tracker.idle_for("n", 0) == 60.0
    stale = NodeSnapshot("n", NodeState.STALE, gpus=gpus, last_sample_t=1.0, annotations=notes)
    tracker.observe(stale)  # a pause: kept
    assert tracker.idle_for("n", 0) == 60.0
    down = NodeSnapshot("n", NodeState.UNREACHABLE, gpus=gpus, last_sample_t=1.0, annotations=notes)
    tracker.observe(down)
    assert tracker.seconds("n", 0) is None and tracker.in_jobs() == []
    tracker.observe(live)
    clock.now += 59
    assert tracker.idle_for("n", 0) is None and tracker.seconds("n", 0) == 59.0
