"""The screen over the site's Prometheus (issue 29), with real parts: Debian's prometheus on a
loopback port scraping stand-in DCGM exporters (their text format and labels) and
``gpuctl export --demo``; the fleet, ``gpuctl status`` and the TUI read it through the HTTP API.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import re
import subprocess
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from gpuctl import service
from gpuctl.config import parse_config
from gpuctl.core.deadline import wait_for
from gpuctl.core.format import gpu_flags
from gpuctl.core.model import MigInstance, NodeEvent, NodeState
from gpuctl.fleet import control, prom
from gpuctl.fleet.build import fleet_from_config
from gpuctl.fleet.export import FleetExporter
from gpuctl.fleet.fleet import Fleet
from gpuctl.fleet.prom import PromError, PromLink, PromSource, PromTarget
from gpuctl.fleet.recording.format import slurm_jobs
from gpuctl.fleet.session import refusal
from gpuctl.fleet.status import node_to_json
from gpuctl.tui import GpuctlApp
from gpuctl.tui.fleet_store import FleetStore
from gpuctl.tui.screens.detail import DetailScreen, Facts
from gpuctl.tui.view import trouble_counts
from gpuctl_tests.cli.test_status_nodes import gpuctl as run_gpuctl
from gpuctl_tests.fleet.test_export import Exporter, Samples, one, scrape
from gpuctl_tests.harness.prometheus import (
    PASSWORD,
    USER,
    Prometheus,
    StandInExporter,
    StartedStores,
    Store,
    free_port,
    prometheus,
)
from gpuctl_tests.harness.slurm import SlurmCluster
from gpuctl_tests.helpers import (
    all_live,
    fleet_changes,
    node_env,
    open_detail,
    wait_fleet,
    wait_until,
    wait_until_async,
)
from gpuctl_tests.helpers import until as until_screen

MIB = 1 << 20
NODES = ("node-a", "node-b", "node-c")


pytestmark = pytest.mark.prometheus  # a real /usr/bin/prometheus: the full lane only


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"


@dataclass
class Site:
    prom: Prometheus
    exporters: dict[str, StandInExporter]


@pytest.fixture(scope="module")
def stores() -> Iterator[StartedStores]:
    stores = StartedStores()
    with stores.stack:
        yield stores


@pytest.fixture
def store(stores: StartedStores) -> Iterator[Store]:
    """A Prometheus of the test's own (``StartedStores``): the test serves its held ports."""
    with stores.take() as got:
        yield got


def three_nodes(stores: StartedStores) -> Iterator[Site]:
    """Three nodes of two GPUs each behind their own stand-in exporter, scraped every second
    by a Prometheus of their own; ready once every series has three samples (the scrape period
    can be read)."""
    with stores.take() as (prom, socks):
        exporters = {n: StandInExporter(n, sock=s) for n, s in zip(NODES, socks, strict=True)}
        try:
            prom.wait_for("count_over_time(DCGM_FI_DEV_GPU_UTIL[1m]) >= 3", 2 * len(NODES))
            yield Site(prom, exporters)
        finally:
            for e in exporters.values():
                e.close()


@pytest.fixture
def site(stores: StartedStores) -> Iterator[Site]:
    """``three_nodes``, the test's own: it may change what the exporters serve."""
    yield from three_nodes(stores)


@pytest.fixture(scope="module")
def _steady(stores: StartedStores) -> Iterator[Site]:
    yield from three_nodes(stores)


def _served(site: Site) -> object:
    return {
        name: (copy.deepcopy((e.gpus, e.jobs, e.mig)), e.serving, e.clock)
        for name, e in site.exporters.items()
    }


@pytest.fixture
def steady_site(_steady: Site) -> Iterator[Site]:
    """``three_nodes`` shared by the module's tests that only read them: a Prometheus takes some
    8 s to start and scrape three times (5 s of it before the first scrape: its discovery
    manager sends target updates every 5 s, a fixed period), once instead of once a test. A
    test that changes an exporter takes ``site``; this one checks that none was changed."""
    before = _served(_steady)
    yield _steady
    assert _served(_steady) == before, "this test changes an exporter: give it `site`"


def site_fleet(url: str, extra: str = "", **kw: Any) -> Fleet:
    config = parse_config(f'[clusters.site]\nprometheus = "{url}"\n{extra}')
    return fleet_from_config(config, interval=0.5, **kw)


def gpuctl(*args: str) -> subprocess.CompletedProcess[str]:
    return run_gpuctl(*args, env=node_env())


async def test_the_fleet_reads_every_gpu_from_prometheus(site: Site) -> None:
    fleet = site_fleet(site.prom.url, stale_after=1.0)
    assert sorted(fleet.nodes) == list(NODES)  # the hosts the store holds, no config of nodes
    events: list[tuple[str, NodeEvent]] = []
    fleet.on_event(lambda node, e: events.append((node, e)))
    await fleet.start()
    try:
        await wait_until_async(lambda: all_live(fleet.snapshots()), 20, "every node live")
        snap = fleet.snapshot("node-b")
        assert snap.link == "prometheus"
        g0, g1 = snap.gpus
        assert (g0.util_gpu, g1.util_gpu) == (10, 20)
        assert g0.mem_used == 1000 * MIB and g0.mem_total == (80000 + 1000 + 559) * MIB
        assert (g0.temp, g0.power, g0.sm_clock, g0.mem_clock) == (45, 120.5, 1980, 2619)
        assert g0.uuid == site.exporters["node-b"].uuid(0)
        assert snap.info is not None and snap.info.reader == "prometheus"
        assert snap.info.driver == "550.54.15"
        assert [g.name for g in snap.info.gpus] == ["NVIDIA H100 80GB HBM3"] * 2
        # the default counters leave these out: the node says which, not that it failed
        missing = snap.info.reader_error or ""
        assert "POWER_MGMT_LIMIT" in missing and "ECC_SBE_VOL_TOTAL" in missing
        assert "GPU_UTIL" not in missing and "CLOCK" not in missing
        assert g0.power_limit is None
        # the registry's plain gauges: the video engines come through; PCIe throughput (a
        # profiling counter the defaults leave out) is unknown and named as missing
        assert (g0.enc, g0.dec, g0.pcie_tx) == (0, 0, None) and "PCIE_TX_BYTES" in missing

        # The GPUs change: the next scrape and poll show it, faults as flags and an XID event.
        site.exporters["node-b"].set(1, util=97, events=0x8 | 0x40, dbe=2, xid=79, dec=40)
        await wait_until_async(
            lambda: fleet.snapshot("node-b").gpus[1].util_gpu == 97, 20, "the new reading"
        )
        g1 = fleet.snapshot("node-b").gpus[1]
        assert g1.dec == 40
        assert {"hw_slowdown", "hw_thermal"} <= set(gpu_flags(g1))
        # the ECC counters are slow metrics: asked at the node's turn, within SLOW_EVERY scrapes
        await wait_until_async(
            lambda: "ECC" in gpu_flags(fleet.snapshot("node-b").gpus[1]), 20, "the ECC flag"
        )
        await wait_until_async(
            lambda: [e for n, e in events if n == "node-b" and e.kind == "xid"], 20, "the XID event"
        )
        (xid,) = [e for n, e in events if n == "node-b" and e.kind == "xid"]
        assert (xid.gpu, xid.detail["xid"]) == (1, 79)
        counts = trouble_counts(fleet.snapshot("node-b"), {1})
        assert counts.get("xid") == 1 and counts.get("ecc") == 1

        # Read-only by nature: a request to act is refused, saying why.
        reply = await fleet.request("node-a", {"type": "stress_start", "gpus": [0]})
        error = refusal(reply)
        assert error is not None and error.get("code") == "read_only"
        assert "Prometheus" in str(error.get("message"))
        guard = service.refusal("stress", fleet=fleet)
        assert guard is not None and "through Prometheus" in guard.why

        # A node whose exporter stops goes stale by its samples' age; the others stay live.
        site.exporters["node-c"].close()
        await wait_until_async(
            lambda: fleet.snapshot("node-c").state is NodeState.STALE, 20, "node-c stale"
        )
        assert fleet.snapshot("node-a").state is NodeState.LIVE
    finally:
        await fleet.stop()


async def test_an_xid_held_at_discovery_is_told_once(site: Site) -> None:
    """DCGM exporter's XID_ERRORS is the last XID a GPU had: one it already holds when gpuctl
    first reads the store is an event once (an agent tells what the kernel log holds), not
    again on later polls or when the node is opened again; a new one after is told too."""
    site.exporters["node-a"].set(0, xid=48)
    site.prom.wait_for("DCGM_FI_DEV_XID_ERRORS == 48", 1)
    fleet = site_fleet(site.prom.url)
    link = fleet.nodes["node-a"].link
    assert isinstance(link, PromLink)
    source = link.source
    xids: list[tuple[str, int | None, object]] = []
    hellos: list[str] = []

    def on_event(node: str, event: NodeEvent) -> None:
        if event.kind == "xid":
            xids.append((node, event.gpu, event.detail["xid"]))

    def on_wire(node: str, msg: dict[str, Any]) -> None:
        if msg.get("type") == "hello":
            hellos.append(node)

    fleet.on_event(on_event)
    fleet.on_wire(on_wire)
    await fleet.start()
    try:
        await wait_until_async(lambda: xids, 20, "the XID held at discovery")
        polls = source.polls
        await wait_until_async(lambda: source.polls >= polls + 3, 20, "three more polls")
        await fleet.reconnect("node-a")
        await wait_until_async(lambda: hellos.count("node-a") >= 2, 20, "node-a opened again")
        polls = source.polls
        await wait_until_async(lambda: source.polls >= polls + 3, 20, "three more polls")
        assert xids == [("node-a", 0, 48)]
        site.exporters["node-a"].set(0, xid=79)
        await wait_until_async(lambda: len(xids) == 2, 20, "the new XID")
        assert xids[1] == ("node-a", 0, 79)
        assert not [x for x in xids if x[0] != "node-a"]
    finally:
        await fleet.stop()


async def test_slurm_jobs_come_from_the_hpc_job_label(site: Site) -> None:
    """DCGM exporter run with --hpc-job-mapping-dir gives each series of a GPU once per Slurm
    job on it, labelled ``hpc_job``: a Prometheus-only cluster shows them as the GPU's job
    annotation (``slurm_job``, as the squeue watch sets it for agents), gone when the job is."""
    site.exporters["node-b"].set_jobs(1, "1234")
    site.exporters["node-a"].set_jobs(0, "778", "77")  # a GPU shared by two jobs
    fleet = site_fleet(site.prom.url)
    store = FleetStore(fleet)
    fleet.subscribe(store.offer)

    def job(node: str, gpu: int) -> object:
        return (fleet.snapshot(node).annotations.get(gpu) or {}).get("slurm_job")

    await fleet.start()
    try:
        await wait_until_async(lambda: job("node-b", 1) == "1234", 20, "node-b's job")
        await wait_until_async(lambda: job("node-a", 0) == "77,778", 20, "node-a's two jobs")
        assert job("node-b", 0) is None and job("node-c", 1) is None
        assert slurm_jobs(fleet.snapshot("node-b")) == {"1": ["1234", None]}  # as recorded
        store.take_pending()
        assert store.snaps["node-b"].annotations[1].get("slurm_job") == "1234"
        site.exporters["node-b"].set_jobs(1)
        await wait_until_async(lambda: job("node-b", 1) is None, 20, "the job's end")
        assert job("node-a", 0) == "77,778"
    finally:
        await fleet.stop()


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
async def test_slurm_jobs_and_users_come_from_squeue(
    slurm_cluster: SlurmCluster, store: Store
) -> None:
    """A Prometheus-only cluster with ``slurm = true``: gpuctl's squeue watch tells each GPU's
    job and its user (DCGM exporter's hpc_job label has no user), for the store's hosts."""
    prom, socks = store  # its other targets stay refused: no series
    exporter = StandInExporter(slurm_cluster.node, sock=socks[0])
    out = await asyncio.to_thread(
        slurm_cluster.run, ["sbatch", "--parsable", "--gpus=1", "-J", "gpu", "--wrap", "sleep 300"]
    )
    job = out.stdout.strip().split(";")[0]
    try:
        prom.wait_for("count_over_time(DCGM_FI_DEV_GPU_UTIL[1m]) >= 3", 2)
        fleet = site_fleet(prom.url, f'slurm = true\nslurm_conf = "{slurm_cluster.conf_path}"\n')
        assert list(fleet.nodes) == [slurm_cluster.node]

        def holders() -> list[tuple[object, object]]:
            notes = fleet.snapshot(slurm_cluster.node).annotations.values()
            return [(n.get("slurm_job"), n.get("slurm_user")) for n in notes if n]

        await fleet.start()
        try:
            await wait_until_async(lambda: holders(), 60, "the job's GPU annotated")
            assert holders() == [(job, slurm_cluster.user)]
        finally:
            await fleet.stop()
    finally:
        exporter.close()
        await asyncio.to_thread(slurm_cluster.cancel_all)


async def test_history_comes_from_the_store(steady_site: Site) -> None:
    """The detail screen's history: what the store kept before this process saw the node is
    put before what it saw (``Fleet.backfill``, one query_range per plotted metric)."""
    fleet = site_fleet(steady_site.prom.url)
    link = fleet.nodes["node-a"].link
    assert isinstance(link, PromLink)
    link.source.history_step = 1.0  # the store holds seconds here, not hours
    link.source.history_seconds = 60.0
    await fleet.start()
    try:
        await wait_until_async(
            lambda: fleet.history("node-a", 0).series("util")[0], 20, "a first sample"
        )
        first_seen = fleet.history("node-a", 0).series("util")[0][0]
        assert await fleet.backfill("node-a")
        times, utils = fleet.history("node-a", 0).series("util")
        older = [(t, u) for t, u in zip(times, utils, strict=True) if t < first_seen]
        assert len(older) >= 2 and all(u == 10 for _t, u in older)
        assert times == sorted(times) and times[-1] >= first_seen
        temps = fleet.history("node-a", 0).series("temp")[1]
        assert temps[0] == 45
        assert not await fleet.backfill("node-a")  # once per node
        assert fleet.history("node-b", 0).series("util")[0][0] >= first_seen - 1
    finally:
        await fleet.stop()


def counted(source: PromSource) -> list[str]:
    """The queries ``source`` asks from now on, in order (its client's ``query`` wrapped)."""
    seen: list[str] = []
    query = source.client.query

    async def counting(promql: str, **kw: Any) -> Any:
        seen.append(promql)
        return await query(promql, **kw)

    source.client.query = counting  # type: ignore[method-assign]
    return seen


async def test_one_query_per_metric_for_all_gpus(steady_site: Site) -> None:
    """A poll's queries do not grow with the GPUs: one per metric (and one for the time, one
    for MIG instances' utilisation)."""
    source = PromSource(PromTarget(steady_site.prom.url), interval=1.0)
    seen = counted(source)
    readings = await source.poll()
    assert sorted(readings) == list(NODES)
    assert len(seen) == len(source.queries) == len(prom.METRICS) + 2
    assert all("gpu=" not in q for q in seen)  # never one GPU's own query


async def test_a_poll_asks_only_the_hosts_with_a_new_sample(steady_site: Site) -> None:
    """After the small stamp query, the metrics are asked for the hosts whose newest sample
    is newer than the one held, by name, and by the one host label in use (no ``instance``):
    at a 5 s poll of a 15 s scrape, a third of the GPUs."""
    source = PromSource(PromTarget(steady_site.prom.url), interval=1.0)
    source._take(await source.poll(), publish=False)
    stamped = await source.client.query(source.stamp_query)
    for host in NODES:  # node-b as if scraped since; the others not
        t = source.latest[host].t
        assert t is not None
        source.latest[host] = replace(source.latest[host], t=t - 100 if host == "node-b" else 1e12)
    source._samples["node-b"] = turn_next("node-b") - 1  # its slow metrics' turn: all asked
    moved, asked = source._plan(stamped)
    assert moved == {"node-b"}
    assert len(asked) == len(source.queries) - 1 == len(prom.METRICS) + 1  # and MIG's
    assert all("Hostname=~`node-b`" in q and "instance" not in q for _m, q in asked)
    answers = [await source.client.query(q) for _m, q in asked]
    readings = source._readings(stamped, moved, asked, answers)
    assert list(readings) == ["node-b"]
    assert [g["util_gpu"] for _i, g in sorted(readings["node-b"].gpus.items())] == [10, 20]


def mig_instance(gi: str, profile: str, used: int, free: int, gr: float) -> dict[str, Any]:
    return {
        "id": gi,
        "profile": profile,
        "fb_used": used,
        "fb_free": free,
        "fb_reserved": 0,
        "gr": gr,
    }


async def test_a_mig_gpu_is_one_row_summing_its_instances(site: Site) -> None:
    """DCGM exporter shows a GPU in MIG mode as one series per GPU instance (``GPU_I_ID``,
    ``GPU_I_PROFILE``, the parent's ``gpu``) and no GPU_UTIL for them. Each MIG GPU is one row:
    its memory the sum of its instances', its utilisation their GR_ENGINE_ACTIVE weighted by
    compute slices over the GPU's 7 (an H100's), ``mig_mode`` on: one busy 2g instance is
    2/7 of the GPU, not all of it; a node whose GPUs are all in MIG mode is still a node;
    the history from the store weighs them the same way."""
    site.exporters["node-b"].set_mig(
        1,
        mig_instance("1", "3g.40gb", 5000, 35000, 0.9),
        mig_instance("7", "1g.10gb", 1000, 9000, 0.2),
        mig_instance("8", "1g.10gb", 0, 10000, 0.0),
    )
    # node-a's GPU 1: one instance of 2 slices, busy; the other 5 held by none, idle
    site.exporters["node-a"].set_mig(1, mig_instance("3", "2g.20gb", 20000, 0, 1.0))
    for gpu in (0, 1):  # node-c: every GPU in MIG mode, one instance each
        site.exporters["node-c"].set_mig(gpu, mig_instance("0", "7g.80gb", 2000, 78000, 0.5))
    site.prom.wait_for('absent(DCGM_FI_DEV_GPU_UTIL{Hostname="node-c"})', 1)
    site.prom.wait_for('absent(DCGM_FI_DEV_GPU_UTIL{Hostname="node-b", gpu="1"})', 1)
    site.prom.wait_for('absent(DCGM_FI_DEV_GPU_UTIL{Hostname="node-a", gpu="1"})', 1)
    site.prom.wait_for('DCGM_FI_PROF_GR_ENGINE_ACTIVE{GPU_I_ID!=""}', 6)
    since = time.time()
    fleet = site_fleet(site.prom.url)
    assert sorted(fleet.nodes) == list(NODES)  # node-c, MIG only, found too
    await fleet.start()
    try:
        await wait_until_async(
            lambda: all_live(fleet.snapshots(), gpus=2), 20, "every node live with two GPUs"
        )
        b0, b1 = fleet.snapshot("node-b").gpus
        assert b0.util_gpu == 10 and b0.mem_used == 1000 * MIB  # not in MIG mode: as before
        assert b1.util_gpu == round((0.9 * 3 + 0.2 + 0.0) / 7 * 100)  # 41, not 58 of 5 slices
        a1 = fleet.snapshot("node-a").gpus[1]
        assert (a1.util_gpu, a1.mem_used) == (round(2 / 7 * 100), 20000 * MIB)  # 29, not 100
        assert b1.mem_used == 6000 * MIB and b1.mem_total == 60000 * MIB
        assert (b1.temp, b1.power, b1.sm_clock) == (45, 120.5, 1980)  # the GPU's own
        assert b0.mig is None and b1.mig == (  # each instance: id, profile, GR_ENGINE, memory
            MigInstance("1", "3g.40gb", 90, 5000 * MIB, 40000 * MIB),
            MigInstance("7", "1g.10gb", 20, 1000 * MIB, 10000 * MIB),
            MigInstance("8", "1g.10gb", 0, 0, 10000 * MIB),
        )
        info = fleet.snapshot("node-b").info
        assert info is not None and [g.mig_mode for g in info.gpus] == [None, True]
        assert info.gpus[1].uuid == site.exporters["node-b"].uuid(1)
        c = fleet.snapshot("node-c").gpus
        assert [(g.util_gpu, g.mem_used, g.mem_total) for g in c] == [
            (50, 2000 * MIB, 80000 * MIB)
        ] * 2
        link = fleet.nodes["node-c"].link
        assert isinstance(link, PromLink)
        link.source.history_step = 1.0
        await wait_until_async(lambda: time.time() > since + 3, 20, "three seconds of MIG samples")
        history = await link.source.history("node-b", since, time.time())
        gpu1 = [h for h in history if h.index == 1]
        assert len(gpu1) >= 2
        assert {(h.util_gpu, h.mem_used) for h in gpu1} == {(41, 6000 * MIB)}
    finally:
        await fleet.stop()
    r = gpuctl("status", "--prometheus", site.prom.url, "--json")
    assert r.returncode == 0, r.stderr
    nodes = {n["name"]: n for n in json.loads(r.stdout)["nodes"]}
    assert [g["util_gpu"] for g in nodes["node-b"]["gpus"]] == [10, 41]
    assert [g["util_gpu"] for g in nodes["node-a"]["gpus"]] == [10, 29]
    assert nodes["node-a"]["gpus"][1]["mig"] == [
        {
            "id": "3",
            "profile": "2g.20gb",
            "util": 100,
            "mem_used": 20000 * MIB,
            "mem_total": 20000 * MIB,
        }
    ]
    assert nodes["node-a"]["gpus"][0]["mig"] is None
    assert [g["util_gpu"] for g in nodes["node-c"]["gpus"]] == [50, 50]


async def test_the_detail_screen_lists_a_mig_gpus_instances(site: Site, state_dir: Path) -> None:
    """The detail screen of a GPU in MIG mode says each instance: its profile, DCGM's instance
    id, its GR_ENGINE_ACTIVE and its memory; a GPU not in MIG mode says none."""
    site.exporters["node-b"].set_mig(
        1,
        mig_instance("1", "3g.40gb", 5000, 35000, 0.9),
        mig_instance("7", "1g.10gb", 1000, 9000, 0.2),
    )
    site.prom.wait_for('DCGM_FI_PROF_GR_ENGINE_ACTIVE{Hostname="node-b", GPU_I_ID!=""}', 2)
    fleet = site_fleet(site.prom.url)
    app = GpuctlApp(fleet, read_only=True, state_dir=state_dir)
    async with app.run_test(size=(120, 36)) as pilot:

        def instances() -> bool:
            snap = app.store.snaps.get("node-b")
            return snap is not None and len(snap.gpus) == 2 and bool(snap.gpus[1].mig)

        await until_screen(pilot, instances, "node-b's MIG instances")
        await until_screen(pilot, lambda: app.overview.nodes.lines, "the nodes on screen")
        screen = await open_detail(pilot, "node-b", 1)
        now = screen.query_one("#detail-now", Facts)
        await until_screen(pilot, lambda: "MIG 3g.40gb" in now.text().plain, "the instances")
        text = now.text().plain.replace("\n", " ")
        assert "MIG 3g.40gb #1 90% 4.9/39.1 GiB" in text
        assert "MIG 1g.10gb #7 20% 1.0/9.8 GiB" in text
        assert "util 41%" in text  # the GPU's: 3 x 90% + 1 x 20% of 7 slices
        await pilot.press("escape")
        await until_screen(pilot, lambda: not isinstance(app.screen, DetailScreen), "back")
        app.overview.nodes.select("node-b", 0)
        await pilot.press("enter")
        screen = await until_screen(
            pilot,
            lambda: isinstance(app.screen, DetailScreen) and app.screen.gpu == 0 and app.screen,
            "GPU 0's detail",
        )
        now = screen.query_one("#detail-now", Facts)
        await until_screen(pilot, lambda: "util 10%" in now.text().plain, "GPU 0's readings")
        assert "MIG" not in now.text().plain


def move_only(source: PromSource, moved: str) -> None:
    """As if ``moved`` were scraped since the held reading and no other host were."""
    for host, held in list(source.latest.items()):
        assert held.t is not None
        source.latest[host] = replace(held, t=held.t - 100 if host == moved else 1e12)


def turn_next(host: str) -> int:
    """The count of new samples at which ``host``'s slow metrics are asked (its turn)."""
    return -zlib.crc32(host.encode()) % prom.SLOW_EVERY


async def test_slow_metrics_are_asked_at_each_hosts_turn_and_kept_between(site: Site) -> None:
    """The slow metrics (ECC, row remapping, reserved memory, power limit) are asked for a
    moved host only at its turn, every SLOW_EVERY-th new sample; between, the host's reading
    keeps their last values (the screen shows them, not a gap), and the fast ones are new."""
    source = PromSource(PromTarget(site.prom.url), interval=1.0)
    source._take(await source.poll(), publish=False)  # a first read: every metric
    assert source.latest["node-b"].gpus[1]["ecc"] == {"volatile_uncorrected": 0}
    site.exporters["node-b"].set(1, util=97, dbe=2, rr_u=3, fb_reserved=600)
    site.prom.wait_for('DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{Hostname="node-b", gpu="1"} == 2', 1)
    site.prom.wait_for('DCGM_FI_DEV_GPU_UTIL{Hostname="node-b", gpu="1"} == 97', 1)
    turn = turn_next("node-b")
    seen = counted(source)
    for n in range(1, prom.SLOW_EVERY + 1):  # node-b's next new samples: one is its turn
        move_only(source, "node-b")
        seen.clear()
        readings = await source.poll()
        assert list(readings) == ["node-b"]
        gpu = readings["node-b"].gpus[1]
        assert gpu["util_gpu"] == 97  # a fast metric: every poll
        slow = [q for q in seen if "ECC_DBE_VOL_TOTAL" in q]
        if n == turn or (n == prom.SLOW_EVERY and turn == 0):
            assert slow and all("Hostname=~`node-b`" in q for q in slow)
            assert gpu["ecc"] == {"volatile_uncorrected": 2}
            assert gpu["remapped_rows"]["uncorrectable"] == 3 and gpu["fb_reserved"] == 600
        else:  # not asked: the last values kept, and named as read (no "no series" for them)
            assert not slow and not any("REMAPPED_ROWS" in q or "RESERVED" in q for q in seen)
            assert gpu["ecc"] == source.latest["node-b"].gpus[1]["ecc"]
            assert gpu["fb_reserved"] == source.latest["node-b"].gpus[1]["fb_reserved"]
            assert "ECC_DBE_VOL_TOTAL" in readings["node-b"].seen
            assert len(seen) < len(prom.METRICS) // 2 + 2  # the stamp and the fast ones
        source._take(readings, publish=False)
    assert source.latest["node-b"].gpus[1]["ecc"] == {"volatile_uncorrected": 2}


async def test_a_hosts_sample_is_published_while_another_groups_slow_query_is_out(
    site: Site,
) -> None:
    """A poll publishes each group of hosts once every query that reads them has answered:
    while the slow counters' query for the hosts at their turn is held (not answered), the
    other moved hosts' new samples are on the screen already; the held hosts' are not (no row
    with new fast values and its slow counters missing), and come, ECC included, once the
    query answers. (Published after the poll's last answer, nothing moved while it was held.)
    """
    fleet = site_fleet(site.prom.url)
    link = fleet.nodes["node-a"].link
    assert isinstance(link, PromLink)
    source = link.source
    query = source.client.query
    release = asyncio.Event()
    holding = asyncio.Event()
    held: dict[str, Any] = {}  # the poll's moved hosts (stamp time) and the held query's
    moved: dict[str, float] = {}

    async def holding_query(promql: str, **kw: Any) -> list[prom.Series]:
        series = await query(promql, **kw)
        if promql == source.stamp_query:  # a poll's first query: which hosts moved
            # the poll awaits this answer: ``latest`` is the last poll's, unchanged meanwhile
            stamps = {s.metric.host(): float(s.value.text) for s in series}
            moved.clear()
            moved.update(
                (h, t)
                for h, t in stamps.items()
                if h in source.latest and t > (source.latest[h].t or 0.0)
            )
        elif "ECC_DBE_VOL_TOTAL" in promql and not held:  # a rare metric: its turn's hosts
            names = re.search(r"Hostname=~`([^`]*)`", promql)
            slow = set(names.group(1).split("|")) if names else set(moved)
            if set(moved) - slow:  # not every moved host at its turn: two groups
                held.update(moved=dict(moved), slow=slow)
                holding.set()
                await release.wait()
        return series

    source.client.query = holding_query  # type: ignore[method-assign]
    for k, host in enumerate(NODES):  # the hosts' turns apart (node-a's and node-c's alike)
        source._samples[host] = turn_next(host) - 1 + k
    shown: dict[str, float] = {}
    others_shown = asyncio.Event()

    def check() -> None:
        if held and all(
            shown.get(h, 0.0) >= t for h, t in held["moved"].items() if h not in held["slow"]
        ):
            others_shown.set()

    def on_snapshot(snap: Any) -> None:
        if snap.last_sample_t is not None:
            shown[snap.name] = snap.last_sample_t
            check()

    fleet.subscribe(on_snapshot)
    await fleet.start()
    try:
        await wait_for(holding.wait(), 30)  # a poll with hosts at their turn and not
        assert set(held["moved"]) - held["slow"] and held["slow"] <= set(held["moved"])
        check()
        await wait_for(others_shown.wait(), 15)  # while the query is held
        for host in held["slow"]:  # not before its slow counters are in
            assert shown.get(host, 0.0) < held["moved"][host]
        assert not release.is_set()
        release.set()
        for host in held["slow"]:
            t = held["moved"][host]
            await wait_until_async(
                lambda h=host, t=t: shown.get(h, 0.0) >= t, 20, f"{host}'s new sample"
            )
            gpu = fleet.snapshot(host).gpus[0]
            assert gpu.util_gpu == 10 and gpu.ecc == {"volatile_uncorrected": 0}  # not missing
    finally:
        release.set()
        await fleet.stop()


async def test_a_failed_slow_query_leaves_its_group_unpublished(site: Site) -> None:
    """A poll hands each group over when its queries are in: the slow counters' query failing
    leaves the hosts at their turn out (not half read; they move again at the next poll) and
    raises, while the group whose queries all answered was handed over, whole."""
    source = PromSource(PromTarget(site.prom.url), interval=1.0)
    source._take(await source.poll(), publish=False)
    for host, held in list(source.latest.items()):  # node-a, node-b scraped since; not node-c
        assert held.t is not None
        source.latest[host] = replace(held, t=held.t - 100 if host != "node-c" else 1e12)
    source._samples["node-b"] = turn_next("node-b") - 1  # its next sample: its turn
    source._samples["node-a"] = turn_next("node-a")  # not its turn
    held_b = source.latest["node-b"]
    query = source.client.query

    async def failing(promql: str, **kw: Any) -> list[prom.Series]:
        if "ECC_DBE_VOL_TOTAL" in promql:
            raise PromError("unreachable", "the store went away")
        return await query(promql, **kw)

    source.client.query = failing  # type: ignore[method-assign]
    handed: list[dict[str, prom.NodeReading]] = []
    with pytest.raises(PromError, match="went away"):
        await source.poll(ready=handed.append)
    assert [sorted(r) for r in handed] == [["node-a"]]
    a = handed[0]["node-a"]
    assert [g["util_gpu"] for _i, g in sorted(a.gpus.items())] == [10, 20]
    assert a.gpus[1]["ecc"] == {"volatile_uncorrected": 0}  # its last values, not asked
    assert source.latest["node-b"] is held_b


async def test_the_stamp_query_reads_gpu_0_while_every_host_has_one(steady_site: Site) -> None:
    """Each host's sample time is read from its GPU 0 alone (an exporter writes a host's GPUs in
    one scrape): Prometheus reads a series per host, not per GPU. Every GPU's at the first
    poll, every STAMP_EVERY-th, and while a held host has no GPU 0 (it would never move)."""
    source = PromSource(PromTarget(steady_site.prom.url), interval=1.0)
    source._take(await source.poll(), publish=False)
    assert 'gpu="0"' not in source.queries[0][1]  # the first poll: every GPU
    for host, held in list(source.latest.items()):  # every host as if scraped since
        assert held.t is not None
        source.latest[host] = replace(held, t=held.t - 100)
    readings = await source.poll()
    assert 'gpu="0"' in source.queries[0][1]
    assert sorted(readings) == list(NODES)  # each moved, its time from GPU 0 alone
    assert all(len(r.gpus) == 2 for r in readings.values())
    source._take(readings, publish=False)
    del source.latest["node-c"].gpus[0]  # as if its GPU 0 were lost
    await source.poll()
    assert 'gpu="0"' not in source.queries[0][1]
    source.latest["node-c"].gpus[0] = {}
    source.polls = prom.STAMP_EVERY * 3
    await source.poll()
    assert 'gpu="0"' not in source.queries[0][1]
    source.polls += 1
    await source.poll()
    assert 'gpu="0"' in source.queries[0][1]


@contextlib.contextmanager
def mixed_localhost(store: Store) -> Iterator[tuple[StandInExporter, Fleet, Any]]:
    """A mixed cluster of one node, localhost: its samples from a real Prometheus scraping a
    stand-in exporter, its actions through a local simulated agent (``link.agent``)."""
    prom, socks = store  # its other targets stay refused: no series
    exporter = StandInExporter("localhost", sock=socks[0])
    try:
        prom.wait_for("count_over_time(DCGM_FI_DEV_GPU_UTIL[1m]) >= 3", 2)
        fleet = site_fleet(
            prom.url,
            'via = "local"\nsimulate = "2:H100"\nprometheus_match = \'{Hostname="localhost"}\'\n',
        )
        yield exporter, fleet, fleet.nodes["localhost"].link
    finally:
        exporter.close()


async def test_mixed_watches_through_prometheus_and_acts_through_the_agent(
    store: Store,
) -> None:
    """A cluster that names its nodes and a Prometheus: the samples are the store's, and a
    burn goes to the node's agent, opened then (a node nobody acts on costs no connection)."""
    with mixed_localhost(store) as (_exporter, fleet, link):
        assert isinstance(link, PromLink) and link.agent is not None
        await fleet.start()
        try:
            await wait_until_async(
                lambda: (
                    fleet.snapshot("localhost").state is NodeState.LIVE
                    and fleet.snapshot("localhost").gpus
                ),
                20,
                "the node live",
            )
            snap = fleet.snapshot("localhost")
            assert [g.util_gpu for g in snap.gpus] == [10, 20]  # the store's, not the sim's
            assert link._agent_session is None  # nothing acted yet: no agent
            assert service.refusal("stress", fleet=fleet, read_only=False) is None
            reply = await control.set_stress(
                fleet, "localhost", [0], True, duration=1.5, read_only=False
            )
            assert reply["started"] == [0] and reply["engine"] == "sim"
            assert link._agent_session is not None
            done = await wait_until_async(
                lambda: (
                    (fleet.snapshot("localhost").burn(0) or {}).get("state") == "done"
                    and fleet.snapshot("localhost").burn(0)
                ),
                20,
                "the burn's end, from the agent's events",
            )
            assert done["verdict"] == "OK"
            # the agent's own samples never replace the store's
            assert [g.util_gpu for g in fleet.snapshot("localhost").gpus] == [10, 20]
        finally:
            await fleet.stop()


async def test_mixed_tells_an_xid_once(store: Store) -> None:
    """A mixed node hears an XID twice: from its agent (NVML, at once) and from the store (a
    scrape later, DCGM exporter's XID_ERRORS): it is told once, whichever comes first."""
    with mixed_localhost(store) as (exporter, fleet, link):
        assert isinstance(link, PromLink)
        source = link.source
        xids: list[tuple[int | None, object]] = []
        fleet.on_event(
            lambda _n, e: xids.append((e.gpu, e.detail["xid"])) if e.kind == "xid" else None
        )

        def store_xid(gpu: int) -> object:
            reading = source.latest.get("localhost")
            return reading is not None and reading.gpus.get(gpu, {}).get("xid")

        await fleet.start()
        try:
            await wait_until_async(lambda: fleet.snapshot("localhost").gpus, 20, "the node's GPUs")
            # the agent first (it opens for this request), the store a scrape later
            await fleet.request(
                "localhost", {"type": "simulate", "action": "xid", "gpu": 0, "xid": 79}
            )
            await wait_until_async(lambda: xids, 20, "the agent's XID")
            exporter.set(0, xid=79)
            await wait_until_async(lambda: store_xid(0) == 79, 20, "the store's XID")
            # the store first, the agent after; then another the agent alone has
            exporter.set(1, xid=48)
            await wait_until_async(lambda: (1, 48) in xids, 20, "the store's XID")
            for gpu, xid in ((1, 48), (1, 13)):
                await fleet.request(
                    "localhost", {"type": "simulate", "action": "xid", "gpu": gpu, "xid": xid}
                )
            await wait_until_async(lambda: (1, 13) in xids, 20, "the agent's second XID")
            polls = source.polls
            await wait_until_async(lambda: source.polls >= polls + 2, 20, "two more polls")
            assert xids == [(0, 79), (1, 48), (1, 13)]
        finally:
            await fleet.stop()


def test_status_json_and_table_through_prometheus(steady_site: Site) -> None:
    r = gpuctl("status", "--prometheus", steady_site.prom.url, "--json")
    assert r.returncode == 0, r.stderr
    nodes = {n["name"]: n for n in json.loads(r.stdout)["nodes"]}
    assert sorted(nodes) == list(NODES)
    assert all(n["state"] == "live" and n["link"] == "prometheus" for n in nodes.values())
    assert [g["util_gpu"] for g in nodes["node-a"]["gpus"]] == [10, 20]
    assert nodes["node-a"]["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"
    r = gpuctl(
        "status", "--prometheus", steady_site.prom.url, "--prometheus-match", '{Hostname="node-c"}'
    )
    assert r.returncode == 0, r.stderr
    assert "node-c" in r.stdout and "node-a" not in r.stdout
    assert "reader node-c: prometheus (no series for" in r.stderr  # stdout holds rows only


def test_export_demo_read_back_through_prometheus() -> None:
    """``gpuctl export --demo`` names its metrics as DCGM exporter does: a Prometheus scraping
    it is read back as the demo's six nodes of eight GPUs, but the one its story's XID 79 took off
    the bus (no readings, so no series: 47)."""
    exporter = Exporter("--demo", "--listen", "127.0.0.1:0")
    try:
        address = exporter.url().removeprefix("http://").removesuffix("/metrics")
        with prometheus([address]) as prom:
            prom.wait_for("DCGM_FI_DEV_GPU_UTIL", 47, timeout=60)
            r = gpuctl("status", "--prometheus", prom.url, "--json")
    finally:
        exporter.stop()
    assert r.returncode == 0, r.stderr
    nodes = json.loads(r.stdout)["nodes"]
    assert [n["name"] for n in nodes] == [f"sim-0{i}" for i in range(1, 7)]
    assert all(len(n["gpus"]) == 8 and n["state"] == "live" for n in nodes)
    read = [g for n in nodes for g in n["gpus"] if g["util_gpu"] is not None and g["mem_total"]]
    assert len(read) == 47, len(read)  # all but the GPU off the bus
    assert "H100" in (nodes[0]["gpus"][0]["name"] or "")
    assert nodes[0]["gpus"][0]["power_limit"] is not None  # export has the power limit


def test_export_re_serves_a_prometheus_cluster(steady_site: Site, tmp_path: Path) -> None:
    """``gpuctl export`` over a cluster read from Prometheus serves its GPUs under gpuctl's
    labels (a login node's own endpoint for a subset of the site, e.g. one cluster)."""
    config = tmp_path / "config.toml"
    config.write_text(f'[clusters.site]\nprometheus = "{steady_site.prom.url}"\n')
    exporter = Exporter("--config", str(config), "--listen", "127.0.0.1:0")
    try:
        url = exporter.url()

        def served() -> Samples | None:
            samples = scrape(url)
            up = [v for lab, v in samples.get("gpuctl_node_up", []) if lab["link"] == "prometheus"]
            return samples if len(up) == 3 and all(up) else None

        samples = wait_until(served, 30, "export to serve the three nodes", every=0.2)
    finally:
        exporter.stop()
    assert one(samples, "DCGM_FI_DEV_GPU_UTIL", node="node-b", gpu="1") == 20
    assert one(samples, "DCGM_FI_DEV_FB_USED", node="node-a", gpu="0") == 1000


def one_line_error(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def test_unreachable_prometheus_is_one_line() -> None:
    port = free_port()  # nothing listens there
    line = one_line_error(gpuctl("status", "--prometheus", f"http://127.0.0.1:{port}"))
    assert "cannot reach Prometheus at http://127.0.0.1:" in line and "refused" in line


def test_a_selector_matching_nothing_is_one_line(steady_site: Site) -> None:
    r = gpuctl(
        "status", "--prometheus", steady_site.prom.url, "--prometheus-match", '{cluster="nope"}'
    )
    line = one_line_error(r)
    assert 'has no series DCGM_FI_DEV_GPU_UTIL{cluster="nope"}' in line
    assert "check --prometheus-match" in line  # as given: the option, not the config's key


def test_a_query_over_the_sample_limit_is_one_line() -> None:
    exporters = [StandInExporter(f"big-{i}", gpus=8) for i in range(2)]
    try:
        with prometheus([e.address for e in exporters], max_samples=12) as prom:
            for e in exporters:  # 8 series a query: within the limit, all 16 are not
                prom.wait_for(f'DCGM_FI_DEV_GPU_UTIL{{Hostname="{e.hostname}"}}', 8)
            line = one_line_error(gpuctl("status", "--prometheus", prom.url))
    finally:
        for e in exporters:
            e.close()
    assert "over its sample limit" in line and "narrow --prometheus-match" in line


def test_basic_auth_refused_then_accepted(tmp_path: Path) -> None:
    exporter = StandInExporter("node-x")
    try:
        with prometheus([exporter.address], basic_auth=True) as prom:
            import base64

            auth = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
            prom.wait_for("DCGM_FI_DEV_GPU_UTIL", 2, auth=auth)
            line = one_line_error(gpuctl("status", "--prometheus", prom.url))
            assert "refused us (401" in line and "--prometheus-user" in line
            secret = tmp_path / "password"
            secret.write_text(PASSWORD + "\n")
            secret.chmod(0o600)  # a secret others cannot read (issue 38)
            config = tmp_path / "config.toml"
            config.write_text(
                f'[clusters.site]\nprometheus = "{prom.url}"\n'
                f'prometheus_user = "{USER}"\nprometheus_password_file = "{secret}"\n'
            )
            r = gpuctl("--config", str(config), "status", "--json")
            assert r.returncode == 0, r.stderr
            (node,) = json.loads(r.stdout)["nodes"]
            assert node["name"] == "node-x" and len(node["gpus"]) == 2
            secret.write_text("wrong\n")
            line = one_line_error(gpuctl("--config", str(config), "status"))
            assert "refused us (401" in line and "check prometheus_token_file" in line
    finally:
        exporter.close()


def test_source_errors_carry_a_reason() -> None:
    with pytest.raises(PromError) as e:
        PromSource(PromTarget("ftp://x")).discover()
    assert e.value.reason == "config"


async def test_the_screen_over_prometheus(site: Site, state_dir: Path) -> None:
    """The TUI on a Prometheus cluster: every node and GPU on screen from the store, the
    acting keys hidden and, pressed anyway, saying why."""
    fleet = site_fleet(site.prom.url)
    app = GpuctlApp(fleet, read_only=True, state_dir=state_dir)
    async with app.run_test(size=(120, 36)) as pilot:

        def on_screen() -> bool:
            snaps = app.store.snaps
            return (
                sorted(snaps) == list(NODES)
                and all_live(snaps.values(), gpus=2)
                and bool(app.overview.nodes.lines)
            )

        await until_screen(pilot, on_screen, "the nodes", 30)
        site.exporters["node-a"].set(0, util=88)
        reading = lambda: app.store.snaps["node-a"].gpus[0].util_gpu == 88  # noqa: E731
        await until_screen(pilot, reading, "the new reading", 30)
        await pilot.press("s")
        refused = [n.message for n in app._notifications if n.message.startswith("read-only:")]
        assert refused and "through Prometheus" in refused[0]
        # the detail screen asks the store for the node's history
        await pilot.press("enter")
        asked = lambda: "node-a" in fleet._backfilled  # noqa: E731
        await until_screen(pilot, asked, "the detail screen to ask for history", 30)
        assert isinstance(app.screen, DetailScreen) and app.screen.node == "node-a"


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
