"""The simulated cluster of ``gpuctl demo`` and ``gpuctl status --demo``: nothing to configure.

The story, so that the demo shows what the screen is for (the README's words): one GPU burning
(a simulated burn, started as ``s`` starts one: its BURN badge and rate on its row, your user on
its process, which ``k`` stops) until it throttles, on a GPU that runs nobody else's job; one GPU
reports XID 79 and falls off the bus (no readings, no processes); bob's Slurm job 48377 holds a
GPU's memory and computes nothing (allocated but idle: its IDLE badge and the header's count
after ``DEMO_IDLE_AFTER_S``, which ``gpuctl demo`` sets in place of ``[fleet] idle_after``); and
the last node stalls for a few seconds now and then (its panel goes stale, then live again).
The simulated jobs on the other GPUs run warm, not hot: only the burning GPU throttles
(``gpuctl.node.readers.sim``).
The events screen (``e``) keeps the story: the XID 79 and the lost GPU at once, the thermal
throttle once the burn has heated its GPU (about a minute), in memory only
(``gpuctl.fleet.troublelog``: a simulated cluster's trouble is not written to the state folder).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuctl.fleet.fleet import Fleet

# The story's job that holds a GPU and computes nothing; the demo counts a GPU allocated but
# idle after DEMO_IDLE_AFTER_S (a cluster's ``[fleet] idle_after``: 30 min) so that it shows.
HOLD_JOB = "48377"
HOLD_USER = "bob"
DEMO_IDLE_AFTER_S = 60.0
STALL_FIRST_S = 20.0
STALL_EVERY_S = 45.0
STALL_FOR_S = 8.0

# A mixed cluster, as a real one grows: model per node, cycled.
DEMO_MODELS = ("H100", "H100", "A100", "H200", "L40S", "A100")


def demo_nodes(nodes: int = 6, gpus: int = 8) -> list[tuple[str, str]]:
    """Return ``(name, simulate spec)`` for each demo node, e.g. ``("sim-01", "8:H100")``."""
    if nodes < 1 or gpus < 1:
        raise ValueError("a demo needs at least one node of at least one GPU")
    width = max(2, len(str(nodes)))
    return [
        (f"sim-{i + 1:0{width}d}", f"{gpus}:{DEMO_MODELS[i % len(DEMO_MODELS)]}")
        for i in range(nodes)
    ]


async def story(
    fleet: Fleet,
    *,
    stall_every: float = STALL_EVERY_S,
    burns: set[tuple[str, int]] | None = None,
) -> None:
    """Drive the demo's events through the agents' ``simulate`` request; the burn it starts
    goes into ``burns`` (the app's ``stress_flow.own_burns``: quitting the demo does not ask
    about it)."""
    from gpuctl.fleet.session import LinkError

    names = list(fleet.names)
    await fleet.wait_settled(20.0)

    async def simulate(node: str, **msg: Any) -> None:
        with contextlib.suppress(LinkError, TimeoutError):
            await fleet.request(node, {"type": "simulate", **msg})

    target = burn_target(fleet)
    if target is not None:
        hot, gpu = target
        if burns is not None:
            burns.add((hot, gpu))
        if not await _burn(fleet, hot, gpu):  # read-only: the load alone, without a burn
            await simulate(hot, action="load", gpus=[gpu], load=1.0)
    xid_node = names[min(1, len(names) - 1)]
    xid_gpu = min(5, _gpus(fleet, xid_node) - 1)
    if target == (xid_node, xid_gpu) and xid_gpu > 0:
        xid_gpu -= 1  # the XID falls on another GPU than the burn's
    await simulate(xid_node, action="xid", gpu=xid_gpu, xid=79)
    held = hold_target(fleet, {target, (xid_node, xid_gpu)}, names[-1] if len(names) > 1 else "")
    if held is not None:  # bob's Slurm job holds a GPU and computes nothing: allocated but idle
        await simulate(held[0], action="hold", gpu=held[1], user=HOLD_USER)
        fleet.annotate(held[0], held[1], slurm_job=HOLD_JOB, slurm_user=HOLD_USER)
    if len(names) < 2:
        return
    stall = names[-1]
    await asyncio.sleep(STALL_FIRST_S)  # the demo's clock, not synchronisation
    while True:
        await simulate(stall, action="stall", seconds=STALL_FOR_S)
        await asyncio.sleep(stall_every)


def hold_target(
    fleet: Fleet, taken: set[tuple[str, int] | None], stalls: str
) -> tuple[str, int] | None:
    """The GPU the story's idle job holds: the first without a process, not the burn's nor
    the XID's, on a node that does not stall (its panel would go stale). None when none is."""
    for node in fleet.names:
        if node == stalls:
            continue
        for g in fleet.snapshot(node).gpus:
            if not g.lost and not g.processes and (node, g.index) not in taken:
                return node, g.index
    return None


def burn_target(fleet: Fleet) -> tuple[str, int] | None:
    """The GPU the story burns: the first (first node first) whose latest sample shows no
    process of another user, as an operator's ``s`` would choose (a burn over another user's
    job asks first; the story cannot ask). None when every GPU runs someone's job."""
    from gpuctl import service

    for node in fleet.names:
        snap = fleet.snapshot(node)
        for g in snap.gpus:
            if not g.lost and not service.others_on(snap, [g.index]):
                return node, g.index
    return None


async def _burn(fleet: Fleet, node: str, gpu: int) -> bool:
    """Burn one simulated GPU as ``s`` does (a BURN badge, its rate, ``s`` stops it), for as
    long as the agents let a burn last; False when it may not (``--read-only``)."""
    from gpuctl import service
    from gpuctl.config import ConfigError
    from gpuctl.fleet import control
    from gpuctl.fleet.session import LinkError

    try:
        reply = await control.set_stress(fleet, node, [gpu], True, read_only=False)
    except (LinkError, TimeoutError, service.ReadOnlyError, ConfigError):
        return False
    return gpu in reply.get("started", [])


def _gpus(fleet: Fleet, node: str) -> int:
    return max(1, len(fleet.snapshot(node).gpus) or 1)
