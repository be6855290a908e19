"""Fuzz: an agent's lines (``fleet.session.decode_line``, ``core.model``'s Structs through
``core.wire``): whatever a node sends is a Sample, a NodeEvent, a dict or a one-line
ProtocolError; a valid line reads the same by the fast path and the lenient one, and one broken
field of a sample leaves the rest of it as it was."""

from __future__ import annotations

import copy
import json
from typing import Any

import msgspec
import pytest
from hypothesis import strategies as st

from gpuctl.core import wire
from gpuctl.core.model import NodeEvent, NodeInfo, Sample, burn_from_wire
from gpuctl.fleet import session
from gpuctl.fleet.fixed_links import recorded_node
from gpuctl.fleet.session import decode_line, decode_message, statics
from gpuctl.node import protocol
from gpuctl.node.messages import AcceptEvent, StressReply
from gpuctl.node.protocol import ProtocolError
from gpuctl_tests.fuzz.harness import LANES, bounded, junk_bytes, run

EVENTS: list[dict[str, Any]] = [
    {"type": "event", "t": 1.0, "kind": "xid", "gpu": 1, "detail": {"xid": 79}},
    {
        "type": "event",
        "t": 2.0,
        "kind": "burn",
        "gpu": 0,
        "detail": {"state": "running", "tflops": 700.5, "errors": 0, "engine": "torch"},
    },
    {"type": "event", "t": 3.0, "kind": "accept", "gpu": None, "detail": {"event": "line"}},
]
MESSAGES = recorded_node("n1", "3:H100", samples=2, events=EVENTS)
HELLO = MESSAGES[0]
INFO = wire.lenient(NodeInfo, HELLO)
VALID = [protocol.encode(m) for m in MESSAGES]
SAMPLE = MESSAGES[1]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _decode(line: bytes) -> object:
    hello = statics(INFO) if INFO is not None else None
    result = bounded(decode_line, line, hello, errors=(ProtocolError,))
    assert isinstance(result, (Sample, NodeEvent, dict, ProtocolError)), type(result)
    if isinstance(result, ProtocolError):
        assert result.code in ("bad_json", "bad_message", "line_too_long"), result.code
    else:
        msgspec.json.encode(result)  # what it read can be written again (recordings, export)
    return result


@pytest.mark.parametrize("examples", LANES)
def test_any_line_is_a_message_or_one_line_error(examples: int) -> None:
    run(examples, junk_bytes(VALID), _decode)


@pytest.mark.parametrize("examples", LANES)
def test_any_json_message_is_read_or_refused(examples: int) -> None:
    kinds = st.sampled_from(["sample", "event", "hello", "ok", "error", "", None, 1])
    messages = st.fixed_dictionaries({"type": kinds}, optional={"t": json_values}).flatmap(
        lambda head: st.dictionaries(
            st.sampled_from(["t", "seq", "gpus", "kind", "gpu", "detail", "host", "x"]),
            json_values,
            max_size=5,
        ).map(lambda rest: {**rest, **head})
    )
    run(examples, messages, lambda m: _decode(json.dumps(m).encode()))


def test_a_valid_line_reads_the_same_by_both_paths() -> None:
    hello = statics(INFO) if INFO is not None else None
    for line, msg in zip(VALID, MESSAGES, strict=True):
        fast = decode_line(line, hello)
        slow = decode_message(protocol.decode(line), hello)
        assert fast == slow, msg["type"]
        if isinstance(fast, (Sample, NodeEvent)):  # and nothing of it is lost on the way
            again = msgspec.json.decode(msgspec.json.encode(fast), type=type(fast))
            assert again == fast


GPU_FIELDS = sorted(k for k in SAMPLE["gpus"][0] if k != "index")


@pytest.mark.parametrize("examples", LANES)
def test_one_broken_field_leaves_the_rest_of_the_sample(examples: int) -> None:
    whole = decode_line(protocol.encode(SAMPLE), statics(INFO) if INFO is not None else None)
    assert isinstance(whole, Sample)

    def check(case: tuple[int, str, Any]) -> None:
        gpu, field, junk = case
        msg = copy.deepcopy(SAMPLE)
        msg["gpus"][gpu][field] = junk
        got = _decode(json.dumps(msg).encode())
        assert isinstance(got, Sample)
        assert got.t == whole.t and len(got.gpus) == len(whole.gpus)
        for i, (g, w) in enumerate(zip(got.gpus, whole.gpus, strict=True)):
            if i != gpu:
                assert g == w, (i, field, junk)

    gpus = st.integers(0, len(SAMPLE["gpus"]) - 1)
    run(examples, st.tuples(gpus, st.sampled_from(GPU_FIELDS), json_values), check)


# A sample with every kind of field the schema has: a host with its load, parents, MIG
# instances, and an event with a detail.
RICH: list[dict[str, Any]] = [
    {
        **SAMPLE,
        "gpus": [
            {**SAMPLE["gpus"][0], "mig": [{"id": "1", "profile": "3g.40gb", "util": 5}]},
            *SAMPLE["gpus"][1:],
        ],
        "host": {"cpu": 12.5, "cpus": 64, "mem_total": 10**12, "load": [1.0, 2.0, 3.0]},
        "parents": [{"pid": 3000, "user": "dana", "command": "bash"}, {"pid": 3097}],
    },
    EVENTS[1],
]


def _places(value: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON value: each key of each object, each element of each list."""
    found = [at] if at else []
    if isinstance(value, dict):
        for key, v in value.items():
            found += _places(v, (*at, key))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found += _places(v, (*at, i))
    return found


def _old_path(line: bytes, hello: Any) -> object:
    """What decode_line made of a line its typed decoder refused before it read such a line in
    one pass: the line parsed again whole, then its dicts read leniently."""
    try:
        return decode_message(session._parse(line), hello)
    except ProtocolError as e:
        return e.code


@pytest.mark.parametrize("examples", LANES)
def test_a_refused_line_reads_in_one_pass_as_parsed_whole(examples: int) -> None:
    # The one pass (``wire.lenient_fields``: each field's text decoded on its own, starting
    # where the typed decoder refused) makes of any junk, anywhere in a sample or an event, one
    # to three places at a time, what parsing the line again and reading its dicts made.
    hello = statics(INFO) if INFO is not None else None
    places = [(k, p) for k, msg in enumerate(RICH) for p in _places(msg) if p != ("type",)]

    def check(case: tuple[int, list[tuple[int, Any]]]) -> None:
        which, changes = case
        msg = copy.deepcopy(RICH[which])
        for k, junk in changes:
            _, path = places[k % len(places)]
            if _places(msg).count(path):  # not gone under an earlier change
                parent = msg
                for step in path[:-1]:
                    parent = parent[step]
                parent[path[-1]] = junk
        line = json.dumps(msg).encode()
        got = _decode(line)
        assert (got.code if isinstance(got, ProtocolError) else got) == _old_path(line, hello)

    change = st.tuples(st.integers(0, len(places) - 1), json_values)
    run(
        examples,
        st.tuples(st.integers(0, len(RICH) - 1), st.lists(change, min_size=1, max_size=3)),
        check,
    )


def test_a_line_with_one_bad_value_is_parsed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # It was parsed twice: refused by the typed decoder, then parsed again whole into dicts
    # (``session._parse``) and read leniently (125 us for 8 GPUs against 10 for a valid line).
    parsed: list[object] = []
    whole = session._parse
    monkeypatch.setattr(session, "_parse", lambda line: parsed.append(line) or whole(line))
    hello = statics(INFO) if INFO is not None else None
    msg = copy.deepcopy(RICH[0])
    msg["gpus"][2]["temp"] = "hot"
    msg["gpus"][1]["processes"][0]["pid"] = -1
    msg["host"]["load"] = [1.0, 2.0, 3.0, 4.0]  # past its max_length: the first three kept
    msg["parents"] = [{"pid": 1}] * 300  # past MAX_PARENTS: the first 256
    line = json.dumps(msg).encode()
    got = decode_line(line, hello)
    assert parsed == []
    assert got == _old_path(line, hello)
    assert isinstance(got, Sample) and got.gpus[2].temp is None and got.gpus[1].temp == 39
    assert got.gpus[1].processes[0].pid is None and got.gpus[1].processes[0].user == "chen"
    assert got.host is not None and got.host.load == (1.0, 2.0, 3.0) and len(got.parents) == 256
    # What the one pass cannot read as the lenient JSON reader does goes the old way: a number
    # out of range (null in a count), bad UTF-8, NaN, another message.
    for odd in (
        line.replace(b'"volatile_corrected": 0', b'"volatile_corrected": 1e999', 1),
        line.replace(b'"P0"', b'"P\xff"', 1),
        line.replace(b'"temp": 39', b'"temp": NaN', 1),
        b'{"type": "reply", "id": "x", "t": "y"}',
    ):
        parsed.clear()
        assert decode_line(odd, hello) == _old_path(odd, hello)
        assert len(parsed) == 2  # the line, and for the comparison


@pytest.mark.parametrize("examples", LANES)
def test_wire_typed_dicts_take_any_json(examples: int) -> None:
    def check(value: Any) -> None:
        for schema in (AcceptEvent, StressReply):
            got = bounded(wire.parse, schema, value)
            assert got is None or isinstance(got, dict)
        burn = bounded(burn_from_wire, value)
        assert isinstance(burn, dict)
        event = bounded(wire.lenient, NodeEvent, value)
        assert event is None or isinstance(event, NodeEvent)

    run(examples, json_values, check)


def test_bad_utf8_in_a_line_is_refused_in_one_line() -> None:
    # Found by the fuzz: msgspec raises UnicodeDecodeError (not a DecodeError) for bad UTF-8,
    # which escaped decode_line and the session, and ended the node's task.
    line = b'{"\x80ype":"hello","protocol":2}\n'
    with pytest.raises(ProtocolError) as e:
        decode_line(line)
    assert e.value.code == "bad_message" and "\n" not in e.value.message
    sample = json.dumps(SAMPLE).encode().replace(b'"P0"', b'"P\xff"')
    got = decode_line(sample)
    assert isinstance(got, Sample) and len(got.gpus) == len(SAMPLE["gpus"])


async def test_a_node_that_sends_bad_utf8_stays_on_the_fleet() -> None:
    # The same line through a fleet: the UnicodeDecodeError ended the node's task (no LinkError:
    # nothing reconnected it), so the node froze at its last state; now the line is read
    # leniently (a sample missing its bad field) and the node goes on.
    from gpuctl.core.model import NodeState
    from gpuctl.fleet.fleet import Fleet
    from gpuctl_tests.helpers import wait_until_async
    from gpuctl_tests.tui.hostile import ScriptedAgentLink

    bad = json.dumps({**MESSAGES[1], "seq": 1}).encode().replace(b'"P0"', b'"P\xff"') + b"\n"
    good = protocol.encode({**MESSAGES[2], "seq": 2})
    fleet = Fleet({"n1": ScriptedAgentLink([HELLO, bad, good])}, stale_after=1e9)
    await fleet.start()
    try:
        await wait_until_async(
            lambda: fleet.snapshot("n1").last_sample_t == MESSAGES[2]["t"], 20, "the good sample"
        )
        snap = fleet.snapshot("n1")
        assert snap.state is NodeState.LIVE and len(snap.gpus) == 3
        task = fleet.nodes["n1"].task
        assert task is not None and not task.done()
    finally:
        await fleet.stop()
