"""From a ``Config`` to a running-ready ``Fleet``: one link per node, Slurm services alongside."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from gpuctl.config import ClusterConfig, Config, NodeConfig
from gpuctl.fleet.fleet import Fleet
from gpuctl.fleet.links import LocalLink, NodeLink
from gpuctl.fleet.slurm import JobWatcher, SrunFanout, SrunLink, StepLink, discover
from gpuctl.fleet.ssh import BundleStore, SshLink
from gpuctl.reach.slurm import SlurmClient, SlurmError, SlurmNode, SlurmValueError

if TYPE_CHECKING:
    from gpuctl.fleet.prom import PromSource

LOCAL_NAME = "localhost"
DEFAULT_PROM_INTERVAL = 5.0  # seconds between polls of a Prometheus (scrapes are 15 s or more)
Service = Callable[[], Coroutine[Any, Any, None]]


class ClusterFleet(Fleet):
    """A Fleet that also runs background services (the Slurm job watcher) while started."""

    def __init__(
        self, links: Mapping[str, NodeLink], *, services: list[Service] | None = None, **kw: Any
    ) -> None:
        super().__init__(links, **kw)
        self.services = list(services or [])
        self.watchers: list[JobWatcher] = []
        self.store: BundleStore | None = None
        self._service_tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        await super().start()
        if not self._service_tasks:
            self._service_tasks = [asyncio.create_task(s()) for s in self.services]

    async def stop(self) -> None:
        tasks, self._service_tasks = self._service_tasks, []
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        await super().stop()


def cluster_nodes(
    cluster: ClusterConfig, *, timeout: float = 15.0
) -> tuple[list[NodeConfig], dict[str, SlurmNode]]:
    """The cluster's nodes, asking ``sinfo`` when the config names none (discovery).

    Also returns what Slurm says of each discovered node. Raises SlurmError.
    """
    if not cluster.discover:
        return list(cluster.nodes), {}
    assert cluster.template is not None
    client = _client(cluster.name, cluster.slurm_conf, timeout)
    try:
        found = discover(cluster.partition, client=client)
    except SlurmValueError as e:
        raise SlurmValueError(f"clusters.{cluster.name}: {e}") from None
    if not found:
        where = f"partition {cluster.partition}" if cluster.partition else "this Slurm cluster"
        raise SlurmError(f"cluster {cluster.name}: sinfo lists no node in {where}")
    from dataclasses import replace

    nodes = [replace(cluster.template, name=n.name) for n in found]
    return nodes, {n.name: n for n in found}


def fleet_from_config(
    config: Config,
    *,
    read_only: bool | None = None,
    interval: float | None = None,
    **fleet_kwargs: Any,
) -> ClusterFleet:
    """Build the fleet for ``config``: its nodes, or this machine when it names none.

    The agents start with ``--read-only`` when ``read_only`` (default: the config's) is true,
    and sample every ``interval`` seconds when given (``--interval``), else as each node's
    config says.
    Raises SlurmError when a cluster's nodes must come from sinfo and it fails.
    """
    if read_only is None:
        read_only = config.read_only
    settings = config.fleet
    kwargs: dict[str, Any] = {
        "concurrency": settings.concurrency,
        "connect_timeout": settings.connect_timeout,
        "stale_after": settings.stale_after,
        "backoff_base": settings.backoff_base,
        "backoff_max": settings.backoff_max,
        "liveness_timeout": settings.liveness_timeout,
        "idle_after": settings.idle_after,
        "idle_below": settings.idle_below,
        **fleet_kwargs,
    }
    if config.empty:
        link = LocalLink(read_only=read_only, interval=interval or 1.0)
        return ClusterFleet({LOCAL_NAME: link}, **kwargs)
    store = BundleStore()
    links: dict[str, NodeLink] = {}
    slurm_watch: dict[str | None, list[str]] = {}
    owner: dict[str | None, str] = {}
    seed = 0
    sources: list[PromSource] = []
    for cluster in config.clusters.values():
        if cluster.prometheus is not None and not cluster.nodes and not cluster.discover:
            source, found = prometheus_source(cluster, interval)
            sources.append(source)
            for name, prom_link in found.items():
                if name in links:
                    raise SlurmError(f"node {name} is in two clusters (one read from Prometheus)")
                links[name] = prom_link
            template = cluster.template
            if template is not None and template.slurm:  # jobs and users from squeue
                slurm_watch.setdefault(template.slurm_conf, []).extend(found)
                owner.setdefault(template.slurm_conf, cluster.name)
                source.squeue_conf = template.slurm_conf
                source.squeue = True
            continue
        nodes, known = cluster_nodes(cluster)
        first = len(links)
        for node in nodes:
            if interval is not None:
                node = replace(node, interval=interval)
            if node.name in links:
                raise SlurmError(f"node {node.name} is in two clusters (one found by sinfo)")
            links[node.name] = link_for(
                node,
                store=store,
                seed=seed,
                slurm_node=known.get(node.name),
                read_only=read_only,
            )
            seed += 1
            if node.slurm:
                slurm_watch.setdefault(node.slurm_conf, []).append(node.name)
                owner.setdefault(node.slurm_conf, cluster.name)
        if cluster.prometheus is not None:  # mixed: watched through the store, acting via agents
            own = dict(list(links.items())[first:])
            source, found = prometheus_source(cluster, interval, agents=own)
            sources.append(source)
            links.update(found)
    _share_srun_steps(config, links)
    fleet = ClusterFleet(links, **kwargs)
    fleet.store = store
    squeued = {name for names in slurm_watch.values() for name in names}
    for source in sources:  # new hosts become nodes, hpc_job labels the GPUs' jobs
        source.fleet = fleet
        source.jobs_from_squeue = squeued & set(source.links)
        fleet.services.append(source.run)
    for conf, names in slurm_watch.items():
        watcher = JobWatcher(fleet, names, client=_client(owner[conf], conf))
        fleet.watchers.append(watcher)
        fleet.services.append(watcher.run)
        for source in sources:
            if source.squeue and source.squeue_conf == conf:
                source.job_watcher = watcher  # hosts that appear later are asked about too
    return fleet


def prometheus_source(
    cluster: ClusterConfig,
    interval: float | None = None,
    agents: dict[str, NodeLink] | None = None,
) -> tuple[PromSource, dict[str, NodeLink]]:
    """The cluster's store, read once (its hosts are the nodes; with ``agents``, those of them
    it holds, acting through their agents), and a link per node. Raises
    SlurmError (the error ``fleet_from_config`` callers turn into one line) naming the cluster
    when the store cannot be read or holds no GPU for the cluster's selector."""
    from gpuctl.fleet.prom import PromError, prometheus_links

    assert cluster.prometheus is not None
    try:
        return prometheus_links(
            cluster.prometheus,
            interval=interval or DEFAULT_PROM_INTERVAL,
            agents=agents,
        )
    except PromError as e:
        raise SlurmError(f"cluster {cluster.name}: {e}") from None


def _share_srun_steps(config: Config, links: dict[str, NodeLink]) -> None:
    """Put the srun nodes of each cluster (``srun_step = "shared"``, the default) behind one
    ``SrunFanout``: one srun step per job instead of one srun per node."""
    for cluster in config.clusters.values():
        own = {
            name: link
            for name, link in links.items()
            if isinstance(link, SrunLink)
            and link.node.cluster == cluster.name
            and link.node.srun_step == "shared"
        }
        if len(own) < 2:
            continue
        first = next(iter(own.values()))
        fanout = SrunFanout(own, first.client)
        for name, link in own.items():
            links[name] = StepLink(fanout, link)


def _client(cluster: str, slurm_conf: str | None, timeout: float = 15.0) -> SlurmClient:
    return SlurmClient(slurm_conf, timeout, origin=f"[clusters.{cluster}] slurm_conf")


def link_for(
    node: NodeConfig,
    *,
    store: BundleStore | None = None,
    seed: int = 0,
    slurm_node: SlurmNode | None = None,
    read_only: bool = False,
) -> NodeLink:
    """The link that reaches ``node`` the way its config says (read-only agents when asked)."""
    if node.via == "ssh":
        return SshLink(node, store=store, seed=seed, read_only=read_only)
    if node.via == "srun":
        return SrunLink(node, seed=seed, slurm_node=slurm_node, read_only=read_only)
    return LocalLink(
        python=node.python,
        interval=node.interval,
        simulate=node.simulate,
        seed=seed,
        read_only=read_only,
    )
