"""The hosts a Prometheus source holds (``gpuctl.fleet.promhosts``) against a real Prometheus:
a host that appears later becomes a node, one whose series stop leaves and comes back, an old
sample is no node, a mixed cluster's node never leaves, none leaves while none is fresh."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from gpuctl.core.model import NodeState
from gpuctl.fleet.export import FleetExporter
from gpuctl.fleet.fleet import Fleet
from gpuctl.fleet.prom import PromSource
from gpuctl.fleet.status import node_to_json
from gpuctl.tui import GpuctlApp
from gpuctl.tui.fleet_store import FleetStore
from gpuctl_tests.fleet.prom_site import NODES, Site, gpuctl, site_fleet
from gpuctl_tests.harness.prometheus import (
    StandInExporter,
    Store,
)
from gpuctl_tests.helpers import (
    all_live,
    fleet_changes,
    wait_fleet,
    wait_until_async,
)
from gpuctl_tests.helpers import until as until_screen

MIB = 1 << 20

pytestmark = pytest.mark.prometheus  # a real /usr/bin/prometheus: the full lane only


async def test_a_host_that_appears_later_becomes_a_node(store: Store) -> None:
    """A host whose exporter comes up after gpuctl started (a node booted, a rack added) is
    added to a Prometheus-only cluster as a node, live with its GPUs, on the screen's store."""
    prom, (sock_a, sock_d, _) = store  # node-d's: scraped from the start, refused yet
    first = StandInExporter("node-a", sock=sock_a)
    late: StandInExporter | None = None
    try:
        prom.wait_for("count_over_time(DCGM_FI_DEV_GPU_UTIL[1m]) >= 3", 2)
        fleet = site_fleet(prom.url)
        assert sorted(fleet.nodes) == ["node-a"]
        store = FleetStore(fleet)
        fleet.subscribe(store.offer)
        await fleet.start()
        try:
            await wait_until_async(lambda: fleet.snapshot("node-a").gpus, 20, "node-a's GPUs")
            late = StandInExporter("node-d", sock=sock_d)
            late.set(1, util=55)
            await wait_until_async(lambda: "node-d" in fleet.nodes, 30, "node-d added")
            await wait_until_async(
                lambda: (
                    fleet.snapshot("node-d").state is NodeState.LIVE
                    and fleet.snapshot("node-d").gpus
                ),
                20,
                "node-d live",
            )
            assert [g.util_gpu for g in fleet.snapshot("node-d").gpus] == [10, 55]
            assert fleet.snapshot("node-d").link == "prometheus"
            store.take_pending()
            assert store.order == ["node-a", "node-d"]
        finally:
            await fleet.stop()
    finally:
        first.close()
        if late is not None:
            late.close()


@pytest.mark.slurm
def source_of(fleet: Fleet) -> PromSource:
    return next(
        s.__self__ for s in fleet.services if isinstance(getattr(s, "__self__", None), PromSource)
    )


async def test_a_host_whose_series_stop_leaves_the_screen_and_comes_back(
    site: Site, state_dir: Path
) -> None:
    """A host whose exporter stops serving its series (decommissioned, its exporter gone for
    good), once its newest sample is older than ``prometheus_forget_after``, leaves the fleet
    and the screen (one notice says so); the others stay; it is a node again when its series
    come back."""
    fleet = site_fleet(site.prom.url, "prometheus_forget_after = 3\n", stale_after=1.0)
    states: list[NodeState] = []
    left: list[tuple[str, str, float]] = []
    fleet.subscribe(lambda s: s.name == "node-b" and states.append(s.state))
    fleet.on_removed(lambda node, why: left.append((node, why, time.time())))
    app = GpuctlApp(fleet, read_only=True, state_dir=state_dir)
    async with app.run_test(size=(120, 36)) as pilot:
        await until_screen(
            pilot,
            lambda: sorted(app.store.snaps) == list(NODES) and all_live(app.store.snaps.values()),
            "every node live on screen",
            timeout=30,
        )
        app.overview.nodes.select("node-b", 1)
        last = fleet.snapshot("node-b").last_sample_t
        site.exporters["node-b"].serving = False
        await until_screen(pilot, lambda: "node-b" not in app.store.snaps, "node-b gone", 30)
        (node, why, when) = left[0]
        assert len(left) == 1 and node == "node-b"
        m = re.fullmatch(r"left the store \(last sample (\d+)s ago\)", why)
        assert m is not None and int(m.group(1)) >= 3, why
        assert last is not None and when - last >= 3  # not before the bound
        assert states[-1] is NodeState.UNREACHABLE  # its last word: it left, and why
        assert sorted(fleet.nodes) == ["node-a", "node-c"]  # the others stay
        await pilot.pause()
        assert [ln.node for ln in app.overview.nodes.lines if ln.kind == "head"] == [
            "node-a",
            "node-c",
        ]
        assert app.overview.nodes.cursor == ("node-c", 0)
        assert f"node-b {why}" in [n.message for n in app._notifications]
        assert [node_to_json(s)["name"] for s in fleet.snapshots()] == ["node-a", "node-c"]
        assert 'node="node-b"' not in FleetExporter(fleet).text()

        site.exporters["node-b"].serving = True
        await until_screen(
            pilot,
            lambda: (
                "node-b" in app.store.snaps
                and app.store.snaps["node-b"].state is NodeState.LIVE
                and len(app.store.snaps["node-b"].gpus) == 2
            ),
            "node-b back",
            30,
        )
        assert app.store.order == ["node-a", "node-c", "node-b"]


async def test_a_host_the_store_answers_with_an_old_sample_is_no_node(
    store: Store,
) -> None:
    """A store that still answers with a host's old sample (its samples carry their own time,
    as federated or remote-written ones do: Prometheus answers with them for 5 minutes) does not
    make it a node: not at discovery, not in ``status --json``, not again at each poll after
    it left (no coming and going); a newer sample does."""
    frozen = [time.time() - 60]
    prom, (sock_a, sock_b, _) = store  # the third target stays refused: no series
    fresh = StandInExporter("node-a", sock=sock_a)
    old = StandInExporter("node-b", sock=sock_b, clock=lambda: frozen[0])
    try:
        prom.wait_for("count_over_time(DCGM_FI_DEV_GPU_UTIL[1m]) >= 3", 2)
        prom.wait_for('DCGM_FI_DEV_GPU_UTIL{Hostname="node-b"}', 2)
        r = gpuctl("status", "--prometheus", prom.url, "--json")
        # 10 min by default: node-b is a node, unreachable for its sample's age
        nodes = {n["name"]: n["state"] for n in json.loads(r.stdout)["nodes"]}
        assert nodes == {"node-a": "live", "node-b": "unreachable"}, r.stderr
        r = gpuctl("status", "--prometheus", prom.url, "--json", "--prometheus-forget-after", "30s")
        assert r.returncode == 0, r.stderr
        assert [n["name"] for n in json.loads(r.stdout)["nodes"]] == ["node-a"]

        fleet = site_fleet(prom.url, "prometheus_forget_after = 5\n")
        assert sorted(fleet.nodes) == ["node-a"]
        source = source_of(fleet)
        seen: list[str] = []
        fleet.subscribe(lambda s: seen.append(s.name))
        fleet.on_removed(lambda node, why: seen.append(f"removed {node}"))
        await fleet.start()
        try:
            polls = source.polls
            await wait_until_async(lambda: source.polls >= polls + 4, 30, "four polls")
            assert "node-b" not in fleet.nodes and "node-b" not in seen

            old.clock = time.time  # its samples move again: a node
            await wait_fleet(
                fleet,
                lambda snaps: "node-b" in snaps and snaps["node-b"].state is NodeState.LIVE,
                what="node-b a node",
            )
            frozen[0] = time.time()
            old.clock = lambda: frozen[0]  # and stop: the store answers with the last
            await wait_until_async(
                lambda: "node-b" not in fleet.nodes,
                30,
                "node-b left",
                wake=fleet_changes(fleet),
            )
            answered = prom.query('timestamp(DCGM_FI_DEV_GPU_UTIL{Hostname="node-b"})')
            assert [float(s["value"][1]) for s in answered] == [int(frozen[0] * 1000) / 1000] * 2
            polls = source.polls
            await wait_until_async(lambda: source.polls >= polls + 4, 30, "four more polls")
            assert "node-b" not in fleet.nodes
            assert seen.count("removed node-b") == 1
        finally:
            await fleet.stop()
    finally:
        fresh.close()
        old.close()


async def test_a_mixed_clusters_node_never_leaves(store: Store) -> None:
    """A mixed cluster names its nodes and reaches them by agent: one whose store samples
    stopped stays a node however old they get (that it is unreachable is news), where a
    Prometheus-only cluster's host would have left (its twin's samples stay fresh: the store
    still scrapes)."""
    prom, socks = store  # the third target stays refused: no series
    exporters = [
        StandInExporter(n, sock=s) for n, s in zip(("localhost", "twin"), socks[:2], strict=True)
    ]
    try:
        prom.wait_for("count_over_time(DCGM_FI_DEV_GPU_UTIL[1m]) >= 3", 4)
        fleet = site_fleet(
            prom.url,
            'nodes = "localhost,twin"\nvia = "local"\nsimulate = "2:H100"\n'
            "prometheus_forget_after = 3\n",
        )
        source = source_of(fleet)
        assert not source.adds_hosts and sorted(source.links) == ["localhost", "twin"]
        await fleet.start()
        try:
            snaps = await wait_fleet(
                fleet,
                lambda s: all_live(s.values()),
                what="both live",
            )
            last = snaps["localhost"].last_sample_t
            assert last is not None
            exporters[0].serving = False
            await wait_until_async(
                lambda: time.time() - last > source.forget_after + 1, 30, "past the bound"
            )
            polls = source.polls
            await wait_until_async(lambda: source.polls >= polls + 3, 30, "three polls after")
            assert sorted(fleet.nodes) == ["localhost", "twin"]
            assert source.latest["twin"].t is not None
            assert time.time() - source.latest["twin"].t < source.forget_after  # fresh
        finally:
            await fleet.stop()
    finally:
        for e in exporters:
            e.close()


async def test_no_host_leaves_while_none_is_fresh(site: Site) -> None:
    """Every host's samples stopping at once is the store no longer scraping (or its exporters'
    network), not the fleet leaving: they stay, unreachable with their samples' age."""
    fleet = site_fleet(site.prom.url, "prometheus_forget_after = 3\n")
    source = source_of(fleet)
    await fleet.start()
    try:
        snaps = await wait_fleet(
            fleet,
            lambda s: all_live(s.values()),
            what="every node live",
        )
        last = max(s.last_sample_t or 0.0 for s in snaps.values())
        for e in site.exporters.values():
            e.serving = False
        await wait_until_async(
            lambda: time.time() - last > source.forget_after + 1, 30, "past the bound"
        )
        polls = source.polls
        await wait_until_async(lambda: source.polls >= polls + 3, 30, "three polls after")
        assert sorted(fleet.nodes) == list(NODES)
    finally:
        await fleet.stop()
