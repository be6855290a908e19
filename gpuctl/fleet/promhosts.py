"""The hosts a Prometheus source holds (``gpuctl.fleet.prom``): found, capped, odd names left
out, and forgotten.

A host that appears in the store after the start becomes a node at the next poll
(``Fleet.add_node``; a cluster of the store's hosts only, not a mixed one), and one whose
newest sample is older than ``forget_after`` (``prometheus_forget_after``, 10 min by default:
twice Prometheus's own 5 min lookback) leaves the fleet (``Fleet.remove_node``): a
decommissioned node, an exporter gone for good, a host the selector no longer matches is
otherwise shown unreachable for ever. It is added again if it comes back. Older is counted from
the store's newest sample of any host, so a store that stops scraping (every node at once) drops
none; and never a mixed cluster's node (named in the config, reached by its agent: that it is
unreachable is news). A host over ``prometheus_max_hosts`` is left out (``capped`` says so once),
and one whose name gpuctl does not take (``_HOST_NAME``) too, said once.

``PromHosts`` holds that state and its rules; ``prompoll.PromPolling`` builds on it (its
polls tell it what moved), ``prom.PromSource`` makes the nodes' links (``_new_link``).
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from gpuctl.config import PrometheusConfig
from gpuctl.core.format import fmt_age
from gpuctl.fleet.promgroup import NodeReading
from gpuctl.fleet.promwire import HOST_LABELS, PromClient

if TYPE_CHECKING:
    from gpuctl.fleet.fleet import Fleet
    from gpuctl.fleet.prom import PromLink
    from gpuctl.fleet.slurm import JobWatcher

log = logging.getLogger(__name__)

DEFAULT_PERIOD = 30.0  # the scrape period assumed until one series shows two samples

# Odd host names: a label value holding a hostlist's brackets or comma, a space, a control
# character, a quote (the screen, ``status``'s reader lines and the hostlists gpuctl writes would
# read it as something else): skipped, said once. ``instance`` is ``host:port``.
_HOST_NAME = re.compile(r"[A-Za-z0-9_.:@%+-]{1,253}")


class PromHosts:
    """The hosts of one store: ``latest`` (each host's newest reading), ``links`` (the nodes
    made of them), those added later and those that left (see the module's doc)."""

    def __init__(
        self,
        target: PrometheusConfig,
        *,
        interval: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.target = target
        self.client = PromClient(target)
        self.interval = interval
        self.clock = clock
        self.period = DEFAULT_PERIOD
        self.latest: dict[str, NodeReading] = {}
        self.links: dict[str, PromLink] = {}
        # Set by the fleet's builder: where the jobs go and new hosts are added (``_take``).
        self.fleet: Fleet | None = None
        self.adds_hosts = False  # a cluster of every host the store holds (not mixed)
        self.jobs_from_squeue: set[str] = set()  # nodes whose jobs gpuctl's squeue watch tells
        # a cluster with ``slurm = true``: squeue tells each GPU's job and user (the hpc_job
        # label has no user); hosts added later join ``job_watcher``'s nodes
        self.squeue = False
        self.squeue_conf: str | None = None
        self.job_watcher: JobWatcher | None = None
        self.odd_hosts: set[str] = set()  # host names left out (``_note_odd``)
        self.capped: str | None = None  # the line saying hosts were left out over the cap

    def _new_link(self, host: str) -> PromLink:
        """A node's link for ``host`` (``prom.PromSource``'s)."""
        raise NotImplementedError

    def _forget(self, host: str) -> None:
        """What else is held of ``host``, dropped as it leaves (``prompoll``'s turns)."""

    @property
    def forget_after(self) -> float:
        """Seconds after its newest sample that a host leaves the fleet (0: never); never
        before three sample periods, when it is barely stale."""
        bound = self.target.forget_after
        return max(bound, 3 * self.staleness_period) if bound > 0 else math.inf

    def _newest(self) -> float | None:
        """The store's newest sample of any host held: what a host's age is counted from
        to tell whether it left (``_drop_gone``)."""
        return max((r.t for r in self.latest.values() if r.t is not None), default=None)

    def present(self, hosts: list[str]) -> list[str]:
        """``hosts`` less those that left: whose newest sample is older than ``forget_after``
        counted from the store's newest (see ``_drop_gone``)."""
        newest, bound = self._newest(), self.forget_after
        if newest is None:
            return hosts
        return [h for h in hosts if newest - (self.latest[h].t or -math.inf) <= bound]

    @property
    def staleness_period(self) -> float:
        """The seconds between two samples of a node as seen here: a scrape, or a poll when
        polls are rarer (the hello's ``interval``: a node is stale after three)."""
        return max(self.interval, self.period)

    def _note_odd(self, host: str) -> None:
        """A host whose name gpuctl does not take (``_HOST_NAME``) is left out, said once."""
        if host in self.odd_hosts or len(self.odd_hosts) >= 100:
            return
        self.odd_hosts.add(host)
        log.warning(
            "Prometheus at %s: host %r left out: a node's name is letters, digits and _.:@%%+- "
            "(check the exporters' %s labels)",
            self.client.base,
            host[:80],
            "/".join(HOST_LABELS),
        )

    def _within_cap(self, stamps: dict[str, float]) -> dict[str, float]:
        """``stamps`` of at most ``max_hosts`` hosts (``prometheus_max_hosts``): the held ones
        first, then new ones by name; ``capped`` says, once, that some were left out."""
        cap = self.target.max_hosts
        if len(stamps) <= cap:
            return stamps
        held = [h for h in stamps if h in self.latest]
        kept = held[:cap] + sorted(h for h in stamps if h not in self.latest)[: cap - len(held)]
        line = (
            f"Prometheus at {self.client.base} holds GPUs of {len(stamps):,} hosts, over "
            f"prometheus_max_hosts ({cap:,}): "
            f"{len(stamps) - len(kept):,} left out; narrow "
            f"{self.target.name('prometheus_match')}, or raise that limit (a config key)"
        )
        if self.capped != line:
            log.warning("%s", line)
        self.capped = line
        return {h: stamps[h] for h in kept}

    def _add_hosts(self, readings: dict[str, NodeReading]) -> None:
        """Hosts the store holds GPUs of now and the fleet has no node for become nodes (a
        node booted, a rack added). Every poll's queries already cover every host the
        selector matches, so this is a set difference a poll, not a discovery query."""
        assert self.fleet is not None
        newest = self._newest()
        for host in sorted(set(readings) - set(self.links)):
            reading = readings[host]
            if not reading.gpus or reading.t is None or host in self.fleet.nodes:
                continue  # no GPU yet, or a node of another cluster by that name
            if newest is not None and newest - reading.t > self.forget_after:
                continue  # an old sample the store still answers with: not back
            link = self.links[host] = self._new_link(host)
            self.fleet.add_node(host, link)
            if self.job_watcher is not None:
                self.job_watcher.nodes.add(host)
                self.jobs_from_squeue.add(host)

    def _drop_gone(self) -> None:
        """The hosts whose newest sample is older than ``forget_after`` leave the fleet (see
        the module's doc). Older than the store's newest sample of any host, not than the
        clock: when the store stops scraping, or every exporter stops at once, no host falls
        behind the others and none leaves. (Judged by the clock, with "unless no host is
        fresh" as the guard, the hosts whose last scrape came a second earlier left while the
        last scraped were still fresh: a test saw it.) A poll's readings are the hosts that
        moved: the others' newest sample is the one held in ``latest``."""
        fleet = self.fleet
        assert fleet is not None
        newest, bound, now = self._newest(), self.forget_after, self.clock()
        if newest is None:
            return
        for host, reading in list(self.latest.items()):
            if reading.t is None or newest - reading.t <= bound:
                continue
            age = now - reading.t
            del self.latest[host]
            self._forget(host)
            link = self.links.pop(host, None)
            if link is None:
                continue  # never a node (another cluster's name, an old sample)
            self.jobs_from_squeue.discard(host)
            if self.job_watcher is not None:
                self.job_watcher.nodes.discard(host)
            rt = fleet.nodes.get(host)
            if rt is not None and rt.link is link:
                fleet.remove_node(host, f"left the store (last sample {fmt_age(age)} ago)")
