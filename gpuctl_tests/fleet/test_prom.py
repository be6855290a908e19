"""The screen over the site's Prometheus (issue 29), with real parts: Debian's prometheus on a
loopback port scraping stand-in DCGM exporters (their text format and labels) and
``gpuctl export --demo``; the fleet, ``gpuctl status`` and the TUI read it through the HTTP API.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuctl import service
from gpuctl.core.format import gpu_flags
from gpuctl.core.model import MigInstance, NodeEvent, NodeState
from gpuctl.fleet import control
from gpuctl.fleet.fleet import Fleet
from gpuctl.fleet.prom import PromError, PromLink, PromSource, PromTarget
from gpuctl.fleet.recording.format import slurm_jobs
from gpuctl.fleet.session import refusal
from gpuctl.tui import GpuctlApp
from gpuctl.tui.fleet_store import FleetStore
from gpuctl.tui.screens.detail import DetailScreen, Facts
from gpuctl.tui.view import trouble_counts
from gpuctl_tests.fleet.prom_site import NODES, Site, gpuctl, site_fleet
from gpuctl_tests.fleet.test_export import Exporter, Samples, one, scrape
from gpuctl_tests.harness.prometheus import (
    PASSWORD,
    USER,
    StandInExporter,
    Store,
    free_port,
    prometheus,
)
from gpuctl_tests.harness.slurm import SlurmCluster
from gpuctl_tests.helpers import (
    all_live,
    open_detail,
    wait_until,
    wait_until_async,
)
from gpuctl_tests.helpers import until as until_screen

MIB = 1 << 20


pytestmark = pytest.mark.prometheus  # a real /usr/bin/prometheus: the full lane only


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
