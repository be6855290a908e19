"""Values from the wire: a number no GPU can report becomes None, never an exception later; a
line's one broken field never hides the rest of it."""

from __future__ import annotations

import json
import math
import pickle
from typing import Any

import msgspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpuctl.core import wire
from gpuctl.core.model import (
    GpuProcess,
    GpuSample,
    GpuStatic,
    HostSample,
    NodeEvent,
    NodeInfo,
    Sample,
)
from gpuctl.fleet.session import MAX_PARENTS, decode_line, decode_sample
from gpuctl.node import protocol
from gpuctl.node.readers.sim import SimReader
from gpuctl_tests.core.test_wire import HUGE, JSON


def test_huge_and_non_finite_numbers_become_none() -> None:
    # a dict as json.loads gives it (a recording): NaN and the infinities may be in it
    s = decode_sample(
        {
            "t": 7.0,
            "gpus": [
                {
                    "index": 0,
                    "util_gpu": HUGE,
                    "mem_used": HUGE,
                    "mem_total": -HUGE,
                    "temp": 2**64,
                    "power": HUGE,  # an int where a float goes: beyond any float
                    "power_limit": float("inf"),
                    "sm_clock": float("nan"),
                    "processes": [{"pid": HUGE, "user": "u", "command": "c", "mem": HUGE}],
                }
            ],
        }
    )
    (g,) = s.gpus
    assert (g.index, g.t, g.util_gpu, g.mem_used, g.mem_total, g.temp) == (
        0,
        7.0,
        None,
        None,
        None,
        None,
    )
    assert (g.power, g.power_limit, g.sm_clock) == (None, None, None)
    assert g.processes == (GpuProcess(None, "u", "c", None),)
    static = wire.lenient(GpuStatic, {"mem_total": HUGE, "power_limit": HUGE}, {"index": 3})
    assert static == GpuStatic(3)


def test_big_but_real_numbers_stay() -> None:
    gpu = {"index": 1, "mem_used": 2**63 - 1, "power": 1e308, "temp": -5, "ecc": {"x": 1}}
    (g,) = decode_sample({"t": 0.0, "gpus": [gpu]}).gpus
    assert g.mem_used == 2**63 - 1 and g.power == 1e308 and g.temp == -5 and g.ecc == {"x": 1}
    info = wire.lenient(NodeInfo, {"hostname": "h", "gpus": [{"index": 0}, {"name": "b"}]})
    assert info is not None and info.gpus == (GpuStatic(0), GpuStatic(1, name="b"))


def test_process_fields_from_a_node_are_checked() -> None:
    """Every process field is of its type and within what a process can have, or None."""
    good = wire.lenient(
        GpuProcess,
        {
            "pid": 42,
            "user": "alice",
            "command": "python train.py",
            "mem": 1 << 30,
            "uid": 1001,
            "ppid": 41,
            "sm": 87,
            "cpu": 101.5,
            "rss": 5 << 30,
            "started": 1_700_000_000.5,
        },
    )
    assert good is not None
    assert (good.pid, good.uid, good.ppid, good.sm, good.cpu) == (42, 1001, 41, 87.0, 101.5)
    assert (good.rss, good.started) == (5 << 30, 1_700_000_000.5)
    assert good.to_dict()["sm"] == 87.0 and type(good.sm) is float
    junk = {
        "pid": -3,
        "user": 7,
        "command": ["rm"],
        "mem": 10**30,
        "uid": "root",
        "ppid": True,
        "sm": 250,
        "cpu": -1.0,
        "rss": -5,
        "started": 1e300,
        "extra": "x",
    }
    assert wire.lenient(GpuProcess, junk) == GpuProcess(None, None, None, None)
    assert wire.lenient(GpuProcess, {"pid": 0}) == GpuProcess()  # pid 0 is no process
    assert wire.lenient(GpuProcess, "not a dict") is None


def test_a_samples_parents_are_read_and_bounded() -> None:
    parents = [{"pid": 10 + i, "command": "bash job.sh"} for i in range(MAX_PARENTS + 50)]
    sample = decode_sample({"type": "sample", "t": 1.0, "gpus": [], "parents": [*parents, 5]})
    assert len(sample.parents) == MAX_PARENTS
    assert sample.parents[0] == GpuProcess(10, None, "bash job.sh", None)
    assert decode_sample({"type": "sample", "parents": "junk"}).parents == ()
    line = protocol.encode({"type": "sample", "t": 1.0, "gpus": [], "parents": parents})
    got = decode_line(line)  # the fast path refuses the list (too long); the slow one cuts it
    assert isinstance(got, Sample) and got.parents == sample.parents


def _valid_line() -> bytes:
    reader = SimReader.from_spec("4:H100", seed=11)
    for _ in range(3):
        reader.sample()
    msg = {
        "type": "sample",
        "t": 1_700_000_000.25,
        "seq": 3,
        "gpus": reader.sample(),
        "parents": reader.parents(),
        "host": reader.host(),
    }
    return protocol.encode(msg)


# Junk for one field, as raw JSON text: what a broken or hostile agent could write.
JUNK = ['"x"', "NaN", "-Infinity", "1e999", "9" * 400, "true", "[1]", '{"a":1}', "-1", "1.5"]


def test_one_broken_field_never_hides_the_rest_of_a_sample() -> None:
    """The fast path takes a valid line whole; for each field of a GPU, of a process, of the
    host and of the sample, and each junk value: the line with only that field broken reads
    as the valid one with that field left at its default (or, where the junk fits the type,
    read as it is); every other field is unchanged."""
    line = _valid_line()
    valid = decode_line(line)
    assert isinstance(valid, Sample) and len(valid.gpus) == 4 and valid.host is not None
    assert valid == decode_sample(json.loads(line))  # the fast and the slow path agree
    assert all(g.t == valid.t for g in valid.gpus)
    procs = [g for g in valid.gpus if g.processes]
    assert procs, "the simulated GPUs run processes"
    msg = json.loads(line)
    places: list[tuple[str, list[Any], type[msgspec.Struct], dict[str, Any]]] = [
        ("gpu", ["gpus", 1], GpuSample, msg["gpus"][1]),
        ("process", ["gpus", procs[0].index, "processes", 0], GpuProcess, {}),
        ("host", ["host"], HostSample, msg["host"]),
        ("sample", [], Sample, msg),
    ]
    for _what, path, cls, _ in places:
        for field in msgspec.structs.fields(cls):
            if cls is GpuSample and field.name == "t":
                continue  # not on the wire: the sample's t
            for junk in JUNK:
                broken = _with_raw(msg, path, field.encode_name, junk)
                got = decode_line(broken)
                assert isinstance(got, Sample), (path, field.name, junk)
                want_value = _lenient_field(cls, field.name, junk)
                want = _replace_at(valid, path, field.name, want_value)
                if cls is Sample and field.name == "t":
                    want = _restamp(want)
                assert got == want, (path, field.name, junk)


def _with_raw(msg: dict[str, Any], path: list[Any], key: str, raw: str) -> bytes:
    """``msg`` as a line whose ``key`` at ``path`` holds the raw JSON text ``raw``."""
    marker = "\u0001MARK\u0001"
    copy = json.loads(json.dumps(msg))
    at: Any = copy
    for step in path:
        at = at[step]
    at[key] = marker
    return json.dumps(copy).replace(json.dumps(marker), raw).encode() + b"\n"


def _lenient_field(cls: type[msgspec.Struct], name: str, raw: str) -> object:
    """What a lone field ``name`` of ``cls`` reads as from the raw JSON ``raw``: its value when
    the schema takes it, else its default."""
    value = protocol.decode('{"type":"x","v":' + raw + "}", lenient=True)["v"]
    defaults = {"index": 99} if "index" in cls.__struct_fields__ else {}
    got = wire.lenient(cls, {name: value}, defaults)
    if got is None:  # a required field (index): the reading takes its position
        return None
    return getattr(got, name)


def _replace_at(valid: Sample, path: list[Any], name: str, value: object) -> Sample:
    """``valid`` with the field ``name`` of the value at ``path`` set to ``value`` (a GPU's
    index that is no index takes the GPU's position)."""
    replace = msgspec.structs.replace
    if not path:
        return replace(valid, **{name: value})
    if path[0] == "host":
        assert valid.host is not None
        return replace(valid, host=replace(valid.host, **{name: value}))
    gpus = list(valid.gpus)
    g = gpus[path[1]]
    if len(path) == 2:
        if name == "index" and value in (None, 99):
            value = path[1]
        gpus[path[1]] = replace(g, **{name: value})
    else:
        procs = list(g.processes)
        procs[path[3]] = replace(procs[path[3]], **{name: value})
        gpus[path[1]] = replace(g, processes=tuple(procs))
    return replace(valid, gpus=tuple(gpus))


def _restamp(sample: Sample) -> Sample:
    replace = msgspec.structs.replace
    return replace(sample, gpus=tuple(replace(g, t=sample.t) for g in sample.gpus))


def test_events_and_other_messages() -> None:
    event = decode_line(b'{"type":"event","t":5,"kind":"xid","gpu":1,"detail":{"xid":79}}')
    assert event == NodeEvent(5.0, "xid", 1, {"xid": 79})
    broken = decode_line(b'{"type":"event","t":NaN,"kind":"xid","gpu":"x","detail":[1]}\n')
    assert broken == NodeEvent(0.0, "xid", None, {})
    assert decode_line(b'{"type":"pong","id":3,"t":NaN}') == {"type": "pong", "id": 3, "t": None}
    deep = b"[" * 100_000 + b"]" * 100_000
    too_long = b'{"type":"x"' + b" " * protocol.MAX_LINE + b"}"
    for bad, code in (
        (b"[1]", "bad_message"),
        (b"{}", "bad_message"),
        (b'{"type":5}', "bad_message"),
        (b"not json", "bad_json"),
        (b'{"type":"sample","x":' + deep + b"}", "bad_json"),  # nested too deeply
        (b'{"type":"x","x":' + deep + b"}", "bad_json"),
        (too_long, "line_too_long"),
    ):
        with pytest.raises(protocol.ProtocolError) as refused:
            decode_line(bad)
        assert refused.value.code == code, (bad[:30], refused.value.code)


def test_values_from_the_wire_are_frozen_values() -> None:
    """What the decoder builds is frozen, equal and hashed as ``cls(...)`` is, and pickles."""
    line = _valid_line()
    sample = decode_line(line)
    assert isinstance(sample, Sample)
    g = sample.gpus[0]
    built: list[msgspec.Struct] = [g, sample.host or HostSample(), *sample.parents]
    for value in built:
        direct = type(value)(**msgspec.structs.asdict(value))
        assert value == direct and repr(value) == repr(direct)
        assert pickle.loads(pickle.dumps(value)) == value
        first = value.__struct_fields__[0]
        with pytest.raises(AttributeError):
            setattr(value, first, None)
    assert hash(sample.parents[0]) == hash(GpuProcess(**msgspec.structs.asdict(sample.parents[0])))
    assert GpuSample(0, state="lost").lost and not g.lost
    assert g.to_dict()["state"] == "ok" and "t" not in g.to_dict()


FIELDS = st.sampled_from(
    [
        *("index", "t", "gpus", "processes", "parents", "host", "pid", "sm", "load", "temp"),
        *("power", "throttle", "ecc", "features", "interval", "detail", "gpu", "kind", "state"),
    ]
)
SCHEMAS = (Sample, GpuSample, GpuProcess, HostSample, NodeInfo, GpuStatic, NodeEvent)


@settings(max_examples=300, deadline=None)
@given(st.one_of(JSON, st.dictionaries(FIELDS, st.one_of(JSON, st.dictionaries(FIELDS, JSON)))))
@example({"detail": {"index": math.inf}})  # found on a CI run: an infinity under `Any` stayed
def test_junk_never_raises_and_what_comes_out_fits_the_schema(value: object) -> None:
    """``wire.lenient`` never raises, and what it gives is valid for its schema as a whole
    (the strict decoder takes it back): every bound holds, nothing is NaN."""
    for schema in SCHEMAS:
        got = wire.lenient(schema, value, {"index": 0})
        if got is not None:
            assert type(got) is schema
            again = msgspec.json.decode(msgspec.json.encode(got), type=schema)
            assert again == got or _has_nan(got)
    if isinstance(value, dict):
        sample = decode_sample(value)
        assert all(g.t == sample.t and math.isfinite(g.t) for g in sample.gpus)


def _has_nan(value: object) -> bool:
    return "nan" in repr(value).lower()
