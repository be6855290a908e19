"""One snapshot of every node, for ``gpuctl status`` and scripts."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import time
from typing import Any

import msgspec

from gpuctl.core.deadline import wait_for
from gpuctl.core.model import (
    GpuNotes,
    GpuSample,
    GpuStatic,
    NodeInfo,
    NodeSnapshot,
    NodeState,
)
from gpuctl.fleet.fleet import Fleet
from gpuctl.fleet.idle import IdleTracker


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
    started = time.monotonic()
    await fleet.start()
    with contextlib.suppress(TimeoutError):
        await wait_for(done.wait(), timeout)
    watchers = getattr(fleet, "watchers", ())  # Slurm's jobs on the GPUs: one poll at least
    if watchers:
        left = max(0.0, timeout - (time.monotonic() - started))
        with contextlib.suppress(TimeoutError):
            await wait_for(asyncio.gather(*(w.polled.wait() for w in watchers)), left)
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


# ``status --json`` is made from the model, not listed by hand: a node is its NodeSnapshot's
# fields with its hello's (NodeInfo's) beside them, and each GPU is its GpuStatic's fields, its
# GpuSample's over them and its notes (GpuNotes: burn, Slurm job) beside; a field added to one of
# them reaches the document, and its schema (``node_schema``), with no edit here. What is folded
# in is left out where it came from: the snapshot's ``info`` and ``annotations``, the hello's
# ``gpus`` (in each GPU) and a GPU sample's ``t`` (the node's ``last_sample_t``). ``sample_age``
# is derived (seconds since the newest sample, when the document was made).
NODE_FOLDED = ("info", "annotations", "gpus")
INFO_FOLDED = ("gpus",)
GPU_FOLDED = ("t",)


def _gpu_to_json(g: GpuSample, st: GpuStatic | None, notes: GpuNotes) -> dict[str, Any]:
    d: dict[str, Any] = msgspec.to_builtins(st if st is not None else GpuStatic(index=g.index))
    for k, v in g.to_dict().items():
        if k not in GPU_FOLDED and (v is not None or d.get(k) is None):
            d[k] = v  # the sample's reading; the hello's where the sample has none
    d.update({k: v for k, v in msgspec.to_builtins(notes).items() if k not in d})
    return d


def node_to_json(
    s: NodeSnapshot, now: float | None = None, idle: IdleTracker | None = None
) -> dict[str, Any]:
    """A node as plain JSON (``docs/status.schema.json``): its snapshot's fields, its hello's,
    its host's sample, and every GPU's static facts, latest sample and notes, and how long it
    has been idle in its Slurm job (``alloc_idle_s``, from ``idle``; null: busy or no job)."""
    now = time.time() if now is None else now
    info = s.info if s.info is not None else NodeInfo()
    statics = {g.index: g for g in info.gpus}
    d: dict[str, Any] = msgspec.to_builtins(
        {f.name: getattr(s, f.name) for f in dataclasses.fields(s) if f.name not in NODE_FOLDED}
    )
    hello = msgspec.to_builtins(info)
    d.update({k: v for k, v in hello.items() if k not in INFO_FOLDED})
    d["sample_age"] = s.age(now)
    d["gpus"] = [
        _gpu_to_json(g, statics.get(g.index), s.annotations.get(g.index, {})) for g in s.gpus
    ]
    for g in d["gpus"]:
        g["alloc_idle_s"] = None if idle is None else idle.seconds(s.name, g["index"])
    return d


def _bare(schema: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in schema.items() if k != "description"}


def _object(
    title: str, description: str, *parts: tuple[dict[str, Any], tuple[str, ...]]
) -> dict[str, Any]:
    """One object schema of the properties of ``parts`` (a schema and the properties it leaves
    out), each required: the document always holds every key. A property two parts share takes
    either's type; the later part's description."""
    props: dict[str, Any] = {}
    for schema, left_out in parts:
        for k, v in schema["properties"].items():
            if k in left_out:
                continue
            v = {kk: vv for kk, vv in v.items() if kk != "default"}  # never left out here
            old = props.get(k)
            if old is not None and _bare(old) != _bare(v):
                v = {"anyOf": [old, v]}
            props[k] = v
    return {
        "title": title,
        "description": description,
        "type": "object",
        "properties": props,
        "required": list(props),
    }


def node_schema() -> tuple[dict[str, Any], dict[str, Any]]:
    """The JSON Schema of one node of ``status --json`` (a ``$ref``) and its definitions, made
    from the model's types as ``node_to_json`` makes a node from its values."""
    _, defs = msgspec.json.schema_components(
        [NodeSnapshot, NodeInfo, GpuStatic, GpuSample, GpuNotes], ref_template="#/$defs/{name}"
    )
    defs["Gpu"] = _object(
        "Gpu",
        "A GPU: the hello's facts (GpuStatic), the latest sample's readings over them (GpuSample; "
        "its t is the node's last_sample_t) and what other subsystems note (GpuNotes: burn, "
        "slurm_job, slurm_user; present when known).",
        (defs["GpuStatic"], ()),
        (defs["GpuSample"], GPU_FOLDED),
    )
    defs["Gpu"]["properties"]["alloc_idle_s"] = {
        "description": "Seconds the GPU of a running Slurm job has been idle, as far as this "
        "run saw (gpuctl.fleet.idle); null: busy, or in no job.",
        "anyOf": [{"type": "number", "minimum": 0}, {"type": "null"}],
    }
    defs["Gpu"]["required"].append("alloc_idle_s")
    notes = defs["GpuNotes"]["properties"]
    defs["Gpu"]["properties"].update(notes)  # optional: only where a subsystem noted it
    age = {
        "sample_age": {
            "description": "Seconds since the newest sample, when the document was made.",
            "anyOf": [{"type": "number", "minimum": 0}, {"type": "null"}],
        },
        "gpus": {"type": "array", "items": {"$ref": "#/$defs/Gpu"}},
    }
    defs["Node"] = _object(
        "Node",
        "A node: its snapshot (NodeSnapshot), what its agent said in its hello (NodeInfo; null "
        "before one) and its GPUs.",
        (defs["NodeSnapshot"], NODE_FOLDED),
        (defs["NodeInfo"], INFO_FOLDED),
        ({"properties": age}, ()),
    )
    for folded in ("NodeSnapshot", "NodeInfo", "GpuStatic", "GpuSample", "GpuNotes"):
        del defs[folded]
    # as JSON reads back (a default of () is JSON's []), each description as ``inspect.cleandoc``
    # leaves a docstring: msgspec versions differ in whether they strip its indentation
    return {"$ref": "#/$defs/Node"}, _clean_docs(msgspec.json.decode(msgspec.json.encode(defs)))


def _clean_docs(value: Any) -> Any:
    """``value`` with every ``description`` string dedented (``inspect.cleandoc``)."""
    if isinstance(value, dict):
        return {
            k: inspect.cleandoc(v) if k == "description" and isinstance(v, str) else _clean_docs(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_clean_docs(v) for v in value]
    return value
