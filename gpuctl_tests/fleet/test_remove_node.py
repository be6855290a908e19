"""``Fleet.remove_node`` (issue 29: a host that left the site's Prometheus leaves the fleet):
what the fleet's users see of a node that left. ``status`` and ``export`` no longer list it, a
recording keeps why it went, its task and link end, and the same name may come back as a new
node. When a Prometheus host leaves is tested with a real store in ``test_prom.py``."""

from __future__ import annotations

from pathlib import Path

from gpuctl.core.model import NodeSnapshot, NodeState
from gpuctl.fleet.export import FleetExporter
from gpuctl.fleet.fleet import simulated_fleet
from gpuctl.fleet.links import ThreadSimLink
from gpuctl.fleet.recording.reader import RecordingReader
from gpuctl.fleet.status import node_to_json
from gpuctl_tests.helpers import (
    all_live,
    fleet_changes,
    recording_fleet,
    wait_fleet,
    wait_until_async,
)

WHY = "left the store (last sample 11m ago)"


def live(snaps: dict[str, NodeSnapshot]) -> bool:
    return all_live(snaps.values())


async def test_a_removed_node_is_gone_from_status_export_and_a_recording(tmp_path: Path) -> None:
    fleet = simulated_fleet([("a", "2:H100"), ("b", "2:A100")], interval=0.1)
    path = tmp_path / "left.gpurec"
    exporter = FleetExporter(fleet)
    published: list[NodeSnapshot] = []
    removed: list[tuple[str, str, bool]] = []
    fleet.subscribe(published.append)
    fleet.on_removed(lambda node, why: removed.append((node, why, node in fleet.nodes)))
    async with recording_fleet(fleet, path):
        await wait_fleet(fleet, live, what="both nodes live")
        assert 'node="b"' in exporter.text()
        task = fleet.nodes["b"].task
        assert task is not None
        fleet.annotate("b", 0, slurm_job="77", slurm_user="bob")

        fleet.remove_node("b", WHY)
        # told after it left; its last snapshot says why (what a watcher of snapshots sees)
        assert removed == [("b", WHY, False)]
        last = published[-1]
        assert (last.name, last.state, last.reason) == ("b", NodeState.UNREACHABLE, WHY)
        assert [s.name for s in fleet.snapshots()] == ["a"]
        assert [node_to_json(s)["name"] for s in fleet.snapshots()] == ["a"]
        assert 'node="b"' not in exporter.text() and 'node="a"' in exporter.text()
        await wait_until_async(task.done, 10, "b's task ended")
        # what a screen or a Slurm watch may still ask of it until it hears: nothing, no error
        fleet.annotate("b", 0, slurm_job=None, slurm_user=None)
        assert fleet.history("b", 0).series("util") == ([], [])
        assert fleet.events("b") == [] and fleet.retry_at("b") is None
        count = len(published)
        await wait_until_async(
            lambda: len([s for s in published[count:] if s.name == "a"]) >= 3,
            10,
            "a's samples after b left",
            wake=fleet_changes(fleet),
        )
        assert all(s.name != "b" for s in published[count:])  # b's task says nothing more

        # The same name again (the host came back): a new node, live.
        fleet.add_node("b", ThreadSimLink("2:A100", seed=9, interval=0.1))
        await wait_fleet(fleet, live, what="b back")
        assert sorted(fleet.nodes) == ["a", "b"]
    # The recording says b left, and why; not that it went down first (its link never failed:
    # a replay would show it unreachable a moment before it leaves, which the screen never did).
    records = [rec for _i, rec in RecordingReader(path).records() if not rec.get("k")]
    assert [(r["n"], r["leave"]) for r in records if "leave" in r] == [("b", WHY)]
    assert [r for r in records if "down" in r] == []
