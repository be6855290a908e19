"""How many GPUs each node must show, so that a node that lost one fails acceptance.

First match per node: ``--expect-gpus`` (typed), the node's or its cluster's ``expect_gpus``
(``[clusters.NAME]`` / ``[clusters.NAME.override."node"]``), ``[accept] expect_gpus``, and for a
node Slurm manages (its cluster is reached ``via = "srun"`` or names a ``partition``,
``slurm_conf`` or ``slurm = true``) the GPU count of its GRES as ``sinfo`` reports it (through
``gpuctl.reach.slurm.SlurmClient``). A node with none of these has no expected count; inside a
Slurm job the suite itself falls back on ``SLURM_GPUS_ON_NODE``.

Each count carries its source, which the suite names when it fails a node ("gpu07: 7 of 8 GPUs
(Slurm gres gpu:h100:8)").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpuctl.config import Config, NodeConfig
from gpuctl.reach.slurm import SlurmClient, SlurmError

log = logging.getLogger(__name__)

TYPED = "--expect-gpus"


@dataclass(frozen=True, slots=True)
class Expectation:
    """The GPU count a node must show and where that figure came from."""

    count: int
    source: str


def slurm_managed(node: NodeConfig) -> bool:
    """True when the config says Slurm runs this node (its GRES then says how many GPUs)."""
    return node.via == "srun" or bool(node.partition or node.slurm_conf or node.slurm)


def from_config(
    config: Config, names: Iterable[str]
) -> tuple[dict[str, Expectation], dict[str, str | None]]:
    """The config's expected counts for ``names``, and the Slurm-managed nodes without one
    (node -> its ``slurm_conf``, None: the environment's), whose GRES is to be asked."""
    known = {n.name: n for n in config.nodes()}
    discovering = [c for c in config.clusters.values() if c.discover and c.template is not None]
    glob = config.accept.expect_gpus
    expected: dict[str, Expectation] = {}
    gres_from: dict[str, str | None] = {}
    for name in names:
        node = known.get(name)
        if node is None and len(discovering) == 1:  # found by sinfo: the cluster's settings
            template = discovering[0].template
            assert template is not None
            node = template
        if node is not None and node.expect_gpus is not None:
            expected[name] = Expectation(node.expect_gpus, f"[clusters.{node.cluster}] expect_gpus")
        elif isinstance(glob, int):
            expected[name] = Expectation(glob, "[accept] expect_gpus")
        elif node is not None and slurm_managed(node):
            gres_from[name] = node.slurm_conf
    return expected, gres_from


async def from_slurm(
    gres_from: Mapping[str, str | None], timeout: float = 15.0
) -> tuple[dict[str, Expectation], dict[str, str]]:
    """GRES GPU counts of these nodes (one ``sinfo`` per slurm.conf), and per node why none
    could be had (sinfo failed, the node has no GPU GRES)."""
    by_conf: dict[str | None, list[str]] = {}
    for node, conf in gres_from.items():
        by_conf.setdefault(conf, []).append(node)
    found: dict[str, Expectation] = {}
    missing: dict[str, str] = {}

    async def ask(conf: str | None, names: list[str]) -> None:
        client = SlurmClient(conf, timeout)
        try:
            nodes = {n.name: n for n in await client.nodes_async(names=names)}
        except SlurmError as e:
            log.warning("expected GPU counts of %s from Slurm: %s", ",".join(names), e)
            for name in names:
                missing[name] = f"Slurm's GRES could not be read: {e}"
            return
        for name in names:
            n = nodes.get(name)
            if n is None or n.gpus <= 0:
                missing[name] = "Slurm lists no GPU GRES for it"
                continue
            gres = f"gpu:{n.gpu_type}:{n.gpus}" if n.gpu_type else f"gpu:{n.gpus}"
            found[name] = Expectation(n.gpus, f"Slurm gres {gres}")

    await asyncio.gather(*(ask(conf, names) for conf, names in by_conf.items()))
    return found, missing


async def resolve(
    names: Iterable[str],
    typed: int | None,
    expected: Mapping[str, Expectation],
    gres_from: Mapping[str, str | None],
) -> tuple[dict[str, Expectation], dict[str, str]]:
    """Each node's expectation by the rule above, and why a Slurm node has none."""
    names = list(names)
    if typed is not None:
        return {n: Expectation(typed, TYPED) for n in names}, {}
    out = {n: expected[n] for n in names if n in expected}
    ask = {n: gres_from[n] for n in names if n not in out and n in gres_from}
    missing: dict[str, str] = {}
    if ask:
        found, missing = await from_slurm(ask)
        out.update(found)
    return out, missing
