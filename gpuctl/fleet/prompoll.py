"""Polling a Prometheus source's store and publishing what moved (``gpuctl.fleet.prom``).

Every interval a poll reads the store (the site's DCGM exporters' series): first each host's
newest sample time (one small query, a series per host), then, for the hosts with a sample newer
than the one held, one instant query per metric for all of them at once (never one per GPU; by
name unless every host moved), each ``max by`` the one host label in use and ``gpu`` so the
answer carries only the labels used (DCGM exporter also sets pci_bus_id, device, pod, instance,
...: bytes for the store to write and gpuctl to decode for nothing). At a 5 s poll of a 15 s
scrape a poll asks a third of the GPUs. The answers are decoded by msgspec into typed structs,
grouped per host and handed to each host's ``PromLink`` as the protocol lines an agent would
send (a hello, then samples), so the fleet, the screen, ``status`` and ``export`` work
unchanged. At 16,384 GPUs over a 15 s scrape (``benchmarks/prom_scale.py --baseline``,
alternated with the code that asked every host each poll): answers 6.3 MB a poll on average (23
MB before), gpuctl's CPU 0.28 s a poll (0.63 s), a poll 2.1 s median (4.0 s) on a shared 2-core
machine where the store's own work is most of it; figures in the README.

Where a poll's time goes (``prom_scale.py`` prints each phase; Prometheus's own time from its
``stats=all``): the stamp query, which every other query waits on, now reads GPU 0 of each
host (a series per host, not per GPU: 0.10 -> 0.02 s median); the slow counters (``SLOW``)
and the metrics the store has none of are asked only at each host's turn, every
``SLOW_EVERY``-th of its new samples (between, its last values stand); each answer is grouped
as it comes, while the others are out (after the last answer 0.12 -> 0.03 s median); and
each group of hosts is published as soon as every query that reads it has answered (the
hosts not at their turn, most of them, once the fast queries are in, while the slow ones are
out: ``poll``'s ``ready``), not after the poll's last answer: from the last answer to every
moved node on the screen 0.175 -> 0.111 s median, 0.44 -> 0.36 s p95 (``prom_scale.py --tui
--baseline``). The rest is the store's evaluation: on the shared 2-core machine, a poll of
768 moved hosts is 0.1-1 s of Prometheus's time asked one query at a time, and the slowest
polls are the ones it evaluates slowly (its ``execTotalTime`` summed over the queries 4-5 s
within 1.6 s). Asking the fast gauges in one query by ``__name__`` instead of one each saves
it nothing (``prom_scale.py --shapes``, two runs: 1.18 s against 0.47 s summed, then 0.47 s
against 0.50 s) for 1.5x the bytes; a query's cost is its series' (8 hosts by name: 0.4 ms).

``PromPolling`` builds on ``promhosts.PromHosts`` (the hosts held, found and forgotten):
``discover`` is the first poll, ``poll`` / ``poll_once`` the others, ``run`` the loop; each
poll's readings are fed to the hosts' links (``prom.PromLink``) and the ``hpc_job`` labels to
the fleet (``_publish_jobs``).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import statistics
import time
import zlib
from collections.abc import Callable

from gpuctl.config import PrometheusConfig
from gpuctl.fleet.promgroup import NodeReading, group, number
from gpuctl.fleet.promhosts import _HOST_NAME, DEFAULT_PERIOD, PromHosts
from gpuctl.fleet.promhttp import PromError
from gpuctl.fleet.prommig import MIG_UTIL
from gpuctl.fleet.promquery import (
    METRICS,
    SLOW,
    UTIL,
    Metric,
    _selector,
    hosts_matcher,
    queries,
    stamp_query,
)
from gpuctl.fleet.promwire import HOST_LABELS, Series

QUERIES_AT_ONCE = 8  # a poll's queries in flight together (27 at once overran a loaded store)
SLOW_EVERY = 4  # a host's slow metrics (``SLOW``) are asked at every 4th of its new samples
STAMP_EVERY = 12  # every 12th poll the stamp query reads every GPU, not only GPU 0 (see _stamp)


class PromPolling(PromHosts):
    """Polls one store for every GPU it holds and feeds each host's link.

    ``discover()`` (blocking, before the fleet starts) makes the first poll: the nodes are the
    hosts it finds, and a store that cannot be read, or a selector that matches nothing, is one
    error line then. ``run()`` (a fleet service) polls every ``interval`` seconds after that.
    """

    def __init__(
        self,
        target: PrometheusConfig,
        *,
        interval: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(target, interval=interval, clock=clock)
        self.stamp_query = stamp_query(target.matchers())  # the next poll's (see ``_stamp``)
        self.queries = queries(target.matchers())  # the last poll's (tests count them)
        # the metric queries' plan (``_plan``): the slow metrics (``SLOW``) and the ones the
        # store had no series of when last asked are asked for ``_slow_hosts`` only, the moved
        # hosts whose turn it is; each moved host's count of new samples picks its turn
        self._samples: dict[str, int] = {}
        self._read_fully: set[str] = set()  # hosts asked every metric once
        self._absent: set[Metric] = set()
        self._slow_hosts: set[str] = set()
        self._rare: tuple[Metric, ...] = ()
        self.error: PromError | None = None
        self.polls = 0
        self.poll_seconds = 0.0  # the last poll's wall time, queries and grouping
        self.jobs_shown: dict[tuple[str, int], str] = {}

    def _forget(self, host: str) -> None:
        self._samples.pop(host, None)  # back later: read fully again, its turns anew
        self._read_fully.discard(host)

    def _stamp(self) -> str:
        """The stamp query for the next poll: of GPU 0 only once every held host has a GPU 0
        (its time is the host's; at 16,384 GPUs Prometheus reads 2,048 series, not 16,384:
        the poll's first query, which every other waits on, 0.10 -> 0.02 s here), of every
        GPU at the first poll, every ``STAMP_EVERY``-th, and while a held host has no GPU 0
        (lost, or a site whose indexes start elsewhere): such a host would never move."""
        full = (
            not self.latest
            or self.polls % STAMP_EVERY == 0
            or any(0 not in r.gpus for r in self.latest.values())
        )
        return stamp_query(self.target.matchers(), first_gpu=not full)

    def _plan(self, stamped: list[Series]) -> tuple[set[str], list[tuple[Metric | None, str]]]:
        """From the stamp query's answer: the hosts with a sample newer than the one held
        (``moved``), and the queries for their readings. Only those are asked for: at a
        5 s poll over a 15 s scrape a poll's answers hold a third of the GPUs, not every
        one (the rest would be decoded, grouped and dropped as not new). The slow metrics
        (``SLOW``) and those the store had none of are asked only for the moved hosts whose
        turn it is (``_slow_hosts``: every ``SLOW_EVERY``-th new sample of a host, the turns
        spread over the hosts by a hash of the name; a host not yet read fully at once);
        ``_readings`` keeps the others' last values of them."""
        stamps: dict[str, float] = {}
        labels: set[str] = set()
        for s in stamped:
            host, t = s.metric.host(), number(s.value.text)
            if host and t is not None and t > stamps.get(host, -math.inf):
                if host not in self.latest and not _HOST_NAME.fullmatch(host):
                    self._note_odd(host)
                    continue
                stamps[host] = t
                labels.add(s.metric.host_label())
        stamps = self._within_cap(stamps)
        moved = set()
        mine = self.links if self.links and not self.adds_hosts else None  # mixed: its nodes
        for host, t in stamps.items():
            held = self.latest.get(host)
            if (held is None or held.t is None or t > held.t) and (mine is None or host in mine):
                moved.add(host)
        self._slow_hosts = set()
        self._rare = ()
        if not moved:
            return moved, []
        slow_hosts = set()
        for host in moved:
            n = self._samples[host] = self._samples.get(host, -1) + 1
            if host not in self._read_fully or (n + zlib.crc32(host.encode())) % SLOW_EVERY == 0:
                slow_hosts.add(host)
        self._slow_hosts = slow_hosts
        by = tuple(label for label in HOST_LABELS if label in labels)
        everything = queries(self._matchers(moved, labels, len(stamps)), by)[1:]
        if slow_hosts == moved:
            return moved, everything
        rare = SLOW | self._absent
        self._rare = tuple(m for m in METRICS if m in rare)
        asked = [(m, q) for m, q in everything if m not in rare]
        if slow_hosts:
            some = queries(self._matchers(slow_hosts, labels, len(stamps)), by)[1:]
            asked += [(m, q) for m, q in some if m in rare]
        return moved, asked

    def _matchers(self, hosts: set[str], labels: set[str], held: int) -> str:
        """The selector's matchers for ``hosts`` of the ``held`` the store has: by name
        (Prometheus reads only theirs: a set of names is looked up in its index; one metric at
        16,384 GPUs here: 0.27 s for every host, 0.08 s for a third of them by name, 0.17 s
        for 62%, 0.30 s for all 2,048 by name), when one label names them all."""
        matchers = self.target.matchers()
        if len(labels) == 1 and len(hosts) < held:
            names = hosts_matcher(next(iter(labels)), sorted(hosts))
            matchers = ", ".join(m for m in (matchers, names) if m)
        return matchers

    def _readings(
        self,
        stamped: list[Series],
        moved: set[str],
        asked: list[tuple[Metric | None, str]],
        answers: list[list[Series]],
    ) -> dict[str, NodeReading]:
        """The moved hosts' readings from the poll's answers, all in (``discover``)."""
        self.queries = [(None, self.stamp_query), *asked]
        pairs = list(zip(asked, answers, strict=True))
        nodes = group([(m, a) for (m, _q), a in pairs])
        group([(None, stamped)], nodes)
        self._note_absent(pairs)
        return self._complete({h: r for h, r in nodes.items() if h in moved})

    def _note_absent(self, pairs: list[tuple[tuple[Metric | None, str], list[Series]]]) -> None:
        """The metrics none of the hosts asked has (asked by turns from the next poll on)."""
        for (m, _q), a in pairs:
            if m is None:
                continue
            if a:
                self._absent.discard(m)
            elif m not in self._rare:
                self._absent.add(m)

    def _complete(self, readings: dict[str, NodeReading]) -> dict[str, NodeReading]:
        """``readings`` (moved hosts whose queries have all answered) made whole: the hosts not
        asked the rare metrics this poll keep their last values of them."""
        rare = self._rare
        if rare:
            tables = {m.table for m in rare if m.table is not None}
            keys = [m.key for m in rare if m.table is None]
            labels = {m.label for m in rare}
            for host, reading in readings.items():
                held = self.latest.get(host)
                if host in self._slow_hosts or held is None:
                    continue
                reading.seen |= held.seen & labels
                for index, values in reading.gpus.items():
                    old = held.gpus.get(index)
                    if old is None:
                        continue
                    for table in tables:  # each poll's tables are new dicts: shared, not copied
                        if table in old:
                            values[table] = old[table]
                    for key in keys:
                        if key in old:
                            values[key] = old[key]
        self._read_fully |= self._slow_hosts & readings.keys()
        return readings

    async def _poll_whole(self) -> dict[str, NodeReading]:
        """A poll whose readings are used once all are in (``discover``)."""
        deadline = time.monotonic() + self.target.timeout
        self.stamp_query = self._stamp()
        stamped = await self.client.query(self.stamp_query, deadline=deadline)
        moved, asked = self._plan(stamped)
        gate = asyncio.Semaphore(QUERIES_AT_ONCE)

        async def ask(promql: str) -> list[Series]:
            async with gate:
                return await self.client.query(promql, deadline=deadline)

        answers = list(await asyncio.gather(*(ask(q) for _m, q in asked)))
        return self._readings(stamped, moved, asked, answers)

    async def poll(
        self, ready: Callable[[dict[str, NodeReading]], None] | None = None
    ) -> dict[str, NodeReading]:
        """One poll: the hosts with a new sample (see ``_plan``), each metric's query for them
        at once (threads, ``QUERIES_AT_ONCE`` in flight), each answer grouped per host as it
        comes, while the others are still out (grouping them all after the last answer was
        0.1 s median, 0.27 s p95 of a poll at 16,384 GPUs here). Raises PromError.

        With ``ready``, each group of hosts is handed to it as soon as every query that reads
        them has answered (``_groups``: the hosts not at their slow metrics' turn once the
        fast queries are in, the others at the end), whole (``_complete``): publishing the
        moved nodes after the whole poll's last answer was 0.15 / 0.41 s median / p95 of a
        poll at 16,384 GPUs with the screen, on top of the queries; now that is done for most
        of them while the slow counters are out. A host is handed over once, all its GPUs
        read by the same answers: no row mixes a new value with a missing one. When a query
        fails, the groups it reads are not handed over (their hosts move again next poll),
        the others are as their queries answer, and the poll raises the error then."""
        deadline = time.monotonic() + self.target.timeout  # the whole poll's
        self.stamp_query = self._stamp()
        stamped = await self.client.query(self.stamp_query, deadline=deadline)
        moved, asked = self._plan(stamped)
        gate = asyncio.Semaphore(QUERIES_AT_ONCE)
        nodes = group([(None, stamped)])
        groups = self._groups(moved, asked)
        waiting = [len(needs) for _hosts, needs in groups]
        readings: dict[str, NodeReading] = {}

        def hand_over(index: int) -> None:
            hosts = groups[index][0]
            # taken out of ``nodes``: an answer that also holds other hosts' series (not
            # asked by name) must not change a reading already handed over
            done = self._complete({h: nodes.pop(h) for h in hosts if h in nodes})
            readings.update(done)
            if ready is not None and done:
                ready(done)

        async def ask(n: int, metric: Metric | None, promql: str) -> list[Series]:
            async with gate:
                series = await self.client.query(promql, deadline=deadline)
            group([(metric, series)], nodes)
            for index, (_hosts, needs) in enumerate(groups):
                if n in needs:
                    waiting[index] -= 1
                    if waiting[index] == 0:
                        hand_over(index)
            return series

        # every query awaited, failed or not: the groups whose queries all answered are
        # handed over even when another's failed (a poll cancelled cancels them all)
        got = await asyncio.gather(
            *(ask(n, m, q) for n, (m, q) in enumerate(asked)), return_exceptions=True
        )
        answers: list[list[Series]] = []
        for answer in got:
            if isinstance(answer, BaseException):
                raise answer
            answers.append(answer)
        for index, count in enumerate(waiting):  # a group no query reads (none moved)
            if count == 0 and groups[index][0] & nodes.keys():
                hand_over(index)
        self.queries = [(None, self.stamp_query), *asked]
        self._note_absent(list(zip(asked, answers, strict=True)))
        return readings

    def _groups(
        self, moved: set[str], asked: list[tuple[Metric | None, str]]
    ) -> list[tuple[set[str], set[int]]]:
        """The moved hosts in groups, each with the queries (indexes into ``asked``) that read
        them: the rare metrics' queries read only ``_slow_hosts`` (see ``_plan``), every other
        query every moved host. ``asked`` lists the fast queries first, so the larger group,
        the hosts not at their turn, is whole while the rare ones are still out."""
        every = {n for n, (m, _q) in enumerate(asked) if m not in self._rare}
        if not self._rare:
            return [(moved, every)]
        slow = moved & self._slow_hosts
        return [(moved - slow, every), (slow, set(range(len(asked))))]

    def discover(self) -> list[str]:
        """The hosts the store holds GPUs of now, sorted; makes the nodes' links. Raises
        PromError (one line), ``no_match`` when the selector matches no GPU."""
        return self.client.run_blocking(self._discover)

    async def _discover(self) -> list[str]:
        polled = await self._poll_whole()
        if self.capped is not None:
            raise PromError("too_large", self.capped)
        readings = {h: r for h, r in polled.items() if r.gpus and r.t is not None}
        if not readings:
            sel = _selector(UTIL.names, self.target.matchers())
            raise PromError(
                "no_match",
                f"Prometheus at {self.client.base} has no series {sel}: is DCGM exporter scraped"
                f" there? check {self.target.name('prometheus_match')}",
            )
        self.period = await self._scrape_period(readings)
        self._take(readings, publish=False)
        return sorted(readings)

    async def _scrape_period(self, readings: dict[str, NodeReading]) -> float:
        """The scrape period: the median gap between one GPU's raw samples over 5 minutes."""
        host = min(readings)
        gpu = min(readings[host].gpus)
        extra = self.target.matchers()
        # which label named the host is not kept: each is tried until one answers
        for label in HOST_LABELS:
            matchers = ", ".join(m for m in (f'{label}="{host}", gpu="{gpu}"', extra) if m)
            # a MIG GPU's instances have GR_ENGINE_ACTIVE, not GPU_UTIL: either's times
            sel = f"{_selector((*UTIL.names, MIG_UTIL), matchers)}[5m]"
            try:
                series = await self.client.query_matrix(sel)
            except PromError:
                return DEFAULT_PERIOD
            if series:
                times = sorted(t for t, _v in series[0].values)
                gaps = [b - a for a, b in itertools.pairwise(times) if b > a]
                return float(statistics.median(gaps)) if gaps else DEFAULT_PERIOD
        return DEFAULT_PERIOD

    def _take(self, readings: dict[str, NodeReading], *, publish: bool, fed: bool = False) -> None:
        """A poll's ``readings`` held (``latest``) and, with ``publish``, told: new hosts
        added, gone ones dropped, each host's link fed its sample (unless ``fed``: ``poll``
        handed them to ``_feed`` group by group already), the ``hpc_job`` labels."""
        self.polls += 1
        if not fed:
            self._hold(readings)
        if not publish:
            return
        if self.fleet is not None and self.adds_hosts:
            self._add_hosts(readings)
            self._drop_gone()
        if not fed:
            self._feed(readings)
        if self.fleet is not None:
            self._publish_jobs()

    def _hold(self, readings: dict[str, NodeReading]) -> None:
        for host, reading in readings.items():
            if reading.t is not None:
                self.latest[host] = reading

    def _feed(self, readings: dict[str, NodeReading]) -> None:
        """``readings`` held and fed to their hosts' links (a group of a poll: see ``poll``)."""
        self._hold(readings)
        for host, reading in readings.items():
            link = self.links.get(host)
            if link is not None:
                link.update(reading)

    async def poll_once(self) -> dict[str, NodeReading]:
        """A poll as ``run`` makes it: each group of hosts fed to the links as soon as its
        queries have answered, then the poll's end (new hosts, gone ones, jobs). Raises
        PromError (the groups fed before it stay fed)."""
        readings = await self.poll(ready=self._feed)
        self._take(readings, publish=True, fed=True)
        return readings

    def _publish_jobs(self) -> None:
        """Each GPU's Slurm job from the ``hpc_job`` labels, as the fleet's GPU annotation
        (``slurm_job``, what the squeue watch sets for agents; the label has no user); the
        nodes in ``jobs_from_squeue`` are left to that watch."""
        fleet = self.fleet
        assert fleet is not None
        holders: dict[tuple[str, int], str] = {}
        for host, reading in self.latest.items():  # a poll reads the moved hosts only
            if host in self.jobs_from_squeue or host not in self.links:
                continue
            for gpu, jobs in reading.jobs.items():
                holders[(host, gpu)] = ",".join(sorted(jobs, key=lambda j: (len(j), j)))
        for host, gpu in set(self.jobs_shown) - set(holders):
            if host in fleet.nodes:
                fleet.annotate(host, gpu, slurm_job=None)
        for (host, gpu), job in holders.items():
            if self.jobs_shown.get((host, gpu)) != job and host in fleet.nodes:
                fleet.annotate(host, gpu, slurm_job=job)
        self.jobs_shown = holders

    async def run(self) -> None:
        """Poll every ``interval`` seconds until cancelled (a fleet service); cancelled, the
        poll's requests end with it and the connections are closed."""
        try:
            while True:
                started = time.monotonic()
                try:
                    await self.poll_once()
                except PromError as e:
                    self.error = e
                else:
                    self.error = None
                self.poll_seconds = time.monotonic() - started
                # a timer: the store is polled at a rate, not in answer to anything
                await asyncio.sleep(max(0.0, self.interval - self.poll_seconds))
        finally:
            await self.client.aclose()
