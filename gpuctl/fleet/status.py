"""One snapshot of every node, for ``gpuctl status`` and scripts."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from gpuctl.core.deadline import wait_for
from gpuctl.core.model import NodeSnapshot, NodeState
from gpuctl.fleet.fleet import Fleet


async def collect(fleet: Fleet, timeout: float = 20.0) -> list[NodeSnapshot]:
    """Start the fleet, wait until every node has sent a sample or failed once, stop it.

    Nodes still connecting at the deadline come back as UNREACHABLE (timeout).
    """
    done = asyncio.Event()

    def settled(s: NodeSnapshot) -> bool:
        return (
            s.state is NodeState.UNREACHABLE
            or s.last_sample_t is not None
            or (s.state is NodeState.LIVE and s.info is not None and s.info.reader is None)
        )

    def check(_s: NodeSnapshot) -> None:
        if all(settled(s) for s in fleet.snapshots()):
            done.set()

    fleet.subscribe(check)
    await fleet.start()
    with contextlib.suppress(TimeoutError):
        await wait_for(done.wait(), timeout)
    snaps = fleet.snapshots()
    await fleet.stop()
    return [
        s
        if settled(s)
        else NodeSnapshot(
            name=s.name,
            state=NodeState.UNREACHABLE,
            link=s.link,
            info=s.info,
            reason=f"timeout: no sample within {timeout:g} s",
        )
        for s in snaps
    ]


def node_to_json(s: NodeSnapshot, now: float | None = None) -> dict[str, Any]:
    """A node as plain JSON: state, versions, and every GPU's static facts and latest sample."""
    now = time.time() if now is None else now
    info = s.info
    statics = {g.index: g for g in info.gpus} if info else {}
    gpus = []
    for g in s.gpus:
        st = statics.get(g.index)
        d = g.to_dict()
        d["name"] = st.name if st else None
        d.update({k: v for k, v in s.annotations.get(g.index, {}).items() if k not in d})
        gpus.append(d)
    return {
        "name": s.name,
        "state": s.state.value,
        "link": s.link,
        "reason": s.reason,
        "hostname": info.hostname if info else None,
        "reader": info.reader if info else None,
        "reader_error": info.reader_error if info else None,
        "bindings": info.bindings if info else None,
        "driver": info.driver if info else None,
        "cuda": info.cuda if info else None,
        "python": info.python if info else None,
        "sample_age": s.age(now),
        "gpus": gpus,
    }
