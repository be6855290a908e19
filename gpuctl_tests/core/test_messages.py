"""One contract on both sides: the agent's hello, sample and event are defined once on the node
side (``gpuctl/node/messages.py``: TypedDicts, written by one function each in ``protocol``) and
once on the login side (``gpuctl/core/model.py``: msgspec Structs). These tests hold the two equal,
field names and types (bounds are the login side's own: the node side writes what it read), as
``test_metrics.py`` does for a GPU's readings; and they check that the real writers write exactly
the node side's fields."""

from __future__ import annotations

import ast
import time
from pathlib import Path
from typing import Any

import msgspec.inspect as mi
import pytest

from gpuctl.core import model
from gpuctl.fleet.fixed_links import recorded_node
from gpuctl.fleet.session import decode_line
from gpuctl.node import messages, protocol
from gpuctl.node.agent import Agent
from gpuctl.node.readers.sim import SimReader

ENVELOPE = {"type", "id"}  # the protocol's own keys: the tag a Struct decodes by, a reply's id
# A sample's GPU dicts are the metric registry's (``test_metrics.py`` holds ``GpuSample`` to it).
REGISTRY_HELD = {("SampleMessage", "gpus")}

PAIRS = [
    (messages.Hello, model.NodeInfo),
    (messages.SampleMessage, model.Sample),
    (messages.EventMessage, model.NodeEvent),
]


def shape(t: mi.Type) -> Any:
    """A type as both sides can agree on it: null left out (the login side reads null as its
    default), bounds left out, a list and a tuple of items the same, objects by field."""
    if isinstance(t, mi.UnionType):
        kinds = [shape(x) for x in t.types if not isinstance(x, mi.NoneType)]
        return kinds[0] if len(kinds) == 1 else ("union", frozenset(kinds))
    if isinstance(t, (mi.ListType, mi.VarTupleType)):
        return ("array", shape(t.item_type))
    if isinstance(t, mi.DictType):
        return ("dict", shape(t.key_type), shape(t.value_type))
    if isinstance(t, (mi.StructType, mi.TypedDictType)):
        return ("object", fields(t))
    return type(t).__name__  # IntType, FloatType, StrType, BoolType, AnyType


def fields(t: mi.StructType | mi.TypedDictType) -> dict[str, Any]:
    return {f.name: shape(f.type) for f in t.fields if f.name not in ENVELOPE}


@pytest.mark.parametrize("node, login", PAIRS, ids=[p[0].__name__ for p in PAIRS])
def test_each_message_is_one_contract_on_both_sides(node: Any, login: Any) -> None:
    node_t, login_t = mi.type_info(node), mi.type_info(login)
    assert isinstance(node_t, mi.TypedDictType) and isinstance(login_t, mi.StructType)
    node_fields, login_fields = fields(node_t), fields(login_t)
    assert sorted(node_fields) == sorted(login_fields)
    for name in node_fields:
        if (node.__name__, name) in REGISTRY_HELD:
            assert node_fields[name] == ("array", ("dict", "StrType", "AnyType"))
            continue
        assert node_fields[name] == login_fields[name], name


def test_the_agent_writes_exactly_the_contracts_fields() -> None:
    """The agent's hello, sample and events hold the node side's keys (and so, by the test
    above, the login side's), and each decodes into the login side's types."""
    out = _Sink()
    reader = SimReader.from_spec("2:H100", seed=1)
    agent = Agent(reader, out=out)
    hello_time = time.time()
    hello = agent.hello()
    assert set(hello) == set(messages.Hello.__annotations__)
    assert set(hello["gpus"][0]) == set(messages.GpuStaticWire.__annotations__)
    boot = hello["boot_time"]  # /proc/stat's btime: this machine booted before the test ran
    assert boot is not None and 1e9 < boot <= hello_time
    reader.simulate("xid", {"gpu": 1, "xid": 79})
    agent.sample(req_id=7)
    # the sample, then the XID's event (XID 79 also takes the GPU off the bus: a "lost" event)
    sample, event, *_ = (protocol.decode(line) for line in out.lines())
    assert set(sample) == set(messages.SampleMessage.__annotations__)
    assert set(sample["host"]) == set(messages.HostWire.__annotations__)
    assert set(event) == set(messages.EventMessage.__annotations__)
    decoded = decode_line(protocol.encode(sample))
    assert isinstance(decoded, model.Sample) and decoded.host is not None
    assert decoded.host.cpus == sample["host"]["cpus"]
    xid = decode_line(protocol.encode(event))
    assert isinstance(xid, model.NodeEvent) and (xid.kind, xid.gpu) == ("xid", 1)


def test_the_fixed_replay_writes_what_the_agent_writes() -> None:
    """The screen tests' replayed nodes go through the node's writers: the same keys as a real
    agent's hello and samples (they once lacked read_only, liveness_timeout, max_duration and
    bindings, so a test never saw a hello as an agent sends it)."""
    hello, *samples = recorded_node("n1", "2:H100", samples=3)
    assert set(hello) == set(messages.Hello.__annotations__)
    for sample in samples:
        assert set(sample) == set(messages.SampleMessage.__annotations__) - {"id"}


class _Sink:
    def __init__(self) -> None:
        self.data = b""

    def write(self, data: bytes) -> int:
        self.data += data
        return len(data)

    def flush(self) -> None:
        pass

    def lines(self) -> list[bytes]:
        return [line for line in self.data.split(b"\n") if line]


def test_the_node_side_writes_each_message_in_one_place() -> None:
    """No dict literal with ``"type": "hello" | "sample" | "event"`` in the node side or the
    replayed nodes but the one in each of ``protocol``'s writers (a second writer is how a
    field drifts: the replayed nodes' hello lacked four of the agent's keys)."""
    root = Path(protocol.__file__).resolve().parents[2]
    files = [*sorted((root / "gpuctl" / "node").rglob("*.py")), root / FIXED_LINKS]
    found = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Dict):
                continue
            for key, value in zip(node.keys, node.values, strict=True):
                if (
                    isinstance(key, ast.Constant)
                    and key.value == "type"
                    and isinstance(value, ast.Constant)
                    and value.value in ("hello", "sample", "event")
                ):
                    found.append((str(path.relative_to(root)), value.value))
    assert sorted(found) == [
        ("gpuctl/node/protocol.py", "event"),
        ("gpuctl/node/protocol.py", "hello"),
        ("gpuctl/node/protocol.py", "sample"),
    ]


FIXED_LINKS = "gpuctl/fleet/fixed_links.py"
