"""A Prometheus source's polls (``gpuctl.fleet.prompoll``) against a real Prometheus: one query
per metric for every GPU, only the hosts with a new sample asked, the slow metrics at each host's
turn, each group of hosts published as its queries answer, the stamp query's GPU 0."""

from __future__ import annotations

import asyncio
import re
import zlib
from dataclasses import replace
from typing import Any

import pytest

from gpuctl.core.deadline import wait_for
from gpuctl.fleet import prom
from gpuctl.fleet.prom import PromError, PromLink, PromSource, PromTarget
from gpuctl_tests.fleet.prom_site import NODES, Site, site_fleet
from gpuctl_tests.helpers import wait_until_async

MIB = 1 << 20

pytestmark = pytest.mark.prometheus  # a real /usr/bin/prometheus: the full lane only


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
