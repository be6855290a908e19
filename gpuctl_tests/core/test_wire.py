"""JSON from outside read into TypedDicts: a field is what its schema says, or it is absent;
junk never raises."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal, TypedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuctl.core import wire
from gpuctl.core.model import BurnState, burn_from_wire
from gpuctl.fleet.session import AgentError, refusal
from gpuctl.node.messages import StressReply, StressStatus

HUGE = 10**400


class Inner(TypedDict):
    name: str
    n: int


class Record(TypedDict, total=False):
    s: str
    i: int
    f: float
    b: bool
    maybe: str | None
    kind: Literal["a", "b", 1]
    ints: list[int]
    counts: dict[str, int]
    labels: Mapping[str, str]
    inner: Inner
    inners: list[Inner]
    anything: Any


class Required(TypedDict):
    id: str


class WithOptional(Required, total=False):
    note: str


def test_fields_of_the_right_type_stay_and_the_rest_go() -> None:
    value = {
        "s": "x",
        "i": 3,
        "f": 2,  # an int is a float
        "b": False,
        "maybe": None,
        "kind": 1,
        "ints": [1, 2],
        "counts": {"a": 1},
        "labels": {"k": "v"},
        "inner": {"name": "n", "n": 1},
        "inners": [{"name": "n", "n": 1}, {"name": 2, "n": 1}, "junk", {"name": "m", "n": 2}],
        "anything": {"nested": [object]},
        "unknown": "dropped",
    }
    got = wire.parse(Record, value)
    assert got == {
        "s": "x",
        "i": 3,
        "f": 2,
        "b": False,
        "maybe": None,
        "kind": 1,
        "ints": [1, 2],
        "counts": {"a": 1},
        "labels": {"k": "v"},
        "inner": {"name": "n", "n": 1},
        "inners": [{"name": "n", "n": 1}, {"name": "m", "n": 2}],  # records that read stay
        "anything": {"nested": [object]},
    }
    assert got is not None and got["ints"] is not value["ints"]  # copied, not shared


@pytest.mark.parametrize(
    ("key", "junk"),
    [
        ("s", 1),
        ("i", True),  # a bool is not a number
        ("i", 1.5),
        ("i", HUGE),
        ("i", -(2**64)),
        ("f", float("nan")),
        ("f", float("inf")),
        ("f", HUGE),
        ("f", "1.0"),
        ("b", 0),
        ("maybe", 5),
        ("kind", "c"),
        ("kind", True),  # True == 1, but it is not the literal 1
        ("ints", [1, "2"]),  # a list of values goes whole
        ("ints", "12"),
        ("counts", {"a": "1"}),
        ("counts", [1]),
        ("inner", {"name": "n"}),  # a required key missing
        ("inner", "n"),
        ("inners", {"name": "n", "n": 1}),
    ],
)
def test_a_field_of_the_wrong_type_is_left_out(key: str, junk: object) -> None:
    other = "i" if key == "s" else "s"
    kept = {other: 7 if other == "i" else "kept"}
    assert wire.parse(Record, {key: junk, **kept}) == kept


def test_not_an_object_or_a_required_key_missing_is_none() -> None:
    for junk in (None, [], "x", 1, 1.5, True):
        assert wire.parse(Record, junk) is None
    assert wire.parse(WithOptional, {"note": "n"}) is None
    assert wire.parse(WithOptional, {"id": 1, "note": "n"}) is None
    assert wire.parse(WithOptional, {"id": "i", "note": 2}) == {"id": "i"}
    assert wire.parse_list(Required, [{"id": "a"}, {"id": 1}, None]) == [{"id": "a"}]
    assert wire.parse_list(Required, {"id": "a"}) == []


def test_a_schema_it_cannot_check_is_a_programming_error() -> None:
    class Odd(TypedDict):
        when: complex

    with pytest.raises(TypeError, match="cannot check"):
        wire.parse(Odd, {})
    with pytest.raises(TypeError, match="not a TypedDict"):
        wire.parse(dict, {})


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.just(HUGE)
    | st.floats()
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=20,
)
FIELDS = st.sampled_from(
    ["state", "tflops", "errors", "owner", "started", "kept", "others", "features", "pid", "code"]
)


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(JSON, st.dictionaries(FIELDS, JSON)),
)
def test_junk_never_raises_and_what_comes_out_has_its_type(value: object) -> None:
    for schema in (Record, BurnState, StressReply, StressStatus, AgentError):
        got = wire.parse(schema, value)
        assert got is None or isinstance(got, dict)
    burn = burn_from_wire(value)
    for key in ("tflops", "ends_at"):
        v = burn.get(key)
        assert v is None or (isinstance(v, int | float) and math.isfinite(v))
    errors = burn.get("errors")
    assert errors is None or (type(errors) is int and abs(errors) < 2**64)
    owner = burn.get("owner")
    assert owner is None or all(isinstance(owner[k], str) for k in ("user", "host", "session"))
    if isinstance(value, dict):
        refusal(value)


def test_a_burn_event_keeps_what_the_agent_sends() -> None:
    detail = {
        "state": "running",
        "engine": "torch",
        "ends_at": 1700000000.5,
        "dtype": "bf16",
        "verdict": None,
        "reason": None,
        "pid": 4242,
        "owner": {"user": "u", "host": "h", "session": "s"},
        "tflops": 412.3,
        "tflops_mean": 410,
        "errors": 0,
        "iterations": 12.0,
        "elapsed": 3.5,
        "size": 8192,
        "duty": 0.9,
        "temp": 71,
        "name": "NVIDIA H100",
        "message": "warming up",
    }
    assert burn_from_wire(detail) == detail
    hostile = {"state": "[bold]x[/]", "tflops": "[b]", "errors": HUGE, "owner": {"user": "u"}}
    assert burn_from_wire(hostile) == {"state": "[bold]x[/]"}
    assert burn_from_wire("not a dict") == {}


def test_an_error_reply_is_read_checked() -> None:
    assert refusal({"type": "ok"}) is None
    assert refusal({"type": "error", "code": "busy", "message": "m", "id": 3}) == {
        "type": "error",
        "code": "busy",
        "message": "m",
    }
    assert refusal({"type": "error", "code": 5}) == {"type": "error"}


def test_the_input_order_is_kept() -> None:
    """A JSON document printed again (``stress status --json``) lists its keys as sent."""
    got = wire.parse(Record, {"i": 1, "unknown": 0, "s": "x", "b": True})
    assert list(got or {}) == ["i", "s", "b"]
