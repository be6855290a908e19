"""Values from the wire: a number no GPU can report becomes None, never an exception later."""

from __future__ import annotations

import pytest

from gpuctl.core.model import GpuProcess, GpuSample, GpuStatic, NodeInfo

HUGE = 10**400


def test_huge_and_non_finite_numbers_become_none() -> None:
    g = GpuSample.from_wire(
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
        },
        0.0,
    )
    assert (g.util_gpu, g.mem_used, g.mem_total, g.temp) == (None, None, None, None)
    assert (g.power, g.power_limit, g.sm_clock) == (None, None, None)
    assert g.processes == (GpuProcess(None, "u", "c", None),)
    # What the rest of the screen does with a sample must not raise.
    assert GpuStatic.from_wire({"mem_total": HUGE, "power_limit": HUGE}).mem_total is None


def test_big_but_real_numbers_stay() -> None:
    g = GpuSample.from_wire(
        {"index": 1, "mem_used": 2**63 - 1, "power": 1e308, "temp": -5, "ecc": {"x": 1}}, 0.0
    )
    assert g.mem_used == 2**63 - 1 and g.power == 1e308 and g.temp == -5
    assert NodeInfo.from_hello({"hostname": "h", "gpus": [{"index": 0}]}).gpus[0].index == 0


def test_process_fields_from_a_node_are_checked() -> None:
    """Every process field is of its type and within what a process can have, or None."""
    good = GpuProcess.from_wire(
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
        }
    )
    assert (good.pid, good.uid, good.ppid, good.sm, good.cpu) == (42, 1001, 41, 87.0, 101.5)
    assert (good.rss, good.started) == (5 << 30, 1_700_000_000.5)
    assert good.to_dict()["sm"] == 87.0
    junk = GpuProcess.from_wire(
        {
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
    )
    assert junk == GpuProcess(None, None, None, None)
    assert GpuProcess.from_wire("not a dict") == GpuProcess(None, None, None, None)


def test_a_samples_parents_are_read_and_bounded() -> None:
    from gpuctl.fleet.session import MAX_PARENTS, decode_sample

    parents = [{"pid": 10 + i, "command": "bash job.sh"} for i in range(MAX_PARENTS + 50)]
    sample = decode_sample({"type": "sample", "t": 1.0, "gpus": [], "parents": [*parents, 5]})
    assert len(sample.parents) == MAX_PARENTS
    assert sample.parents[0] == GpuProcess(10, None, "bash job.sh", None)
    assert decode_sample({"type": "sample", "parents": "junk"}).parents == ()


def test_process_fields_are_checked_as_the_wire_schema_says() -> None:
    """``GpuProcess.from_wire`` reads field by field (the hot path); what it keeps of every junk
    value is what ``wire.parse(ProcessWire, ...)`` keeps, before the ranges apply."""
    from gpuctl.core import wire
    from gpuctl.core.model import ProcessWire

    values: list[object] = [
        None,
        True,
        False,
        0,
        3,
        -3,
        2**64,
        -(2**64),
        1.5,
        -0.5,
        float("nan"),
        float("inf"),
        "x",
        [1],
        {"a": 1},
        50,
        1_700_000_000.5,
    ]
    ranges = {"sm": (0.0, 100.0), "cpu": (0.0, 100_000.0), "started": (1.0, 1e11)}
    for key in ProcessWire.__annotations__:
        for v in values:
            got = getattr(GpuProcess.from_wire({key: v}), key)
            checked = (wire.parse(ProcessWire, {key: v}) or {}).get(key)
            if key in ranges:
                low, high = ranges[key]
                want = float(checked) if checked is not None and low <= checked <= high else None
            elif key in ("user", "command"):
                want = checked
            else:
                want = (
                    checked
                    if checked is not None and checked >= 0 and (key != "pid" or checked > 0)
                    else None
                )
            assert got == want and type(got) is type(want), (key, v, got, want)


def test_host_fields_are_checked_as_the_wire_schema_says() -> None:
    """``HostSample.from_wire`` (the hot path) keeps what reading through
    ``wire.parse(HostWire, ...)`` and then the ranges kept."""
    from gpuctl.core import wire
    from gpuctl.core.model import HostSample, HostWire

    def through_the_schema(d: dict[str, object]) -> HostSample:
        w = wire.parse(HostWire, d) or {}

        def amount(key: str) -> int | None:
            v = w.get(key)
            return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None

        def within(key: str, low: float, high: float) -> float | None:
            v = w.get(key)
            return float(v) if isinstance(v, int | float) and low <= v <= high else None

        return HostSample(
            cpu=within("cpu", 0.0, 100.0),
            cpus=amount("cpus"),
            mem_total=amount("mem_total"),
            mem_available=amount("mem_available"),
            load=tuple(x for x in (w.get("load") or [])[:3] if 0.0 <= x <= 1e9),
            net_rx=within("net_rx", 0.0, 1e15),
            net_tx=within("net_tx", 0.0, 1e15),
        )

    values: list[object] = [
        None,
        True,
        0,
        7,
        -7,
        2**64,
        1.5,
        -0.5,
        150.0,
        float("nan"),
        float("inf"),
        "x",
        [0.5, 1, 2.5],
        [0.5, True],
        [0.5, float("nan")],
        [3, 2, 1, 0],
        [-1.0, 2.0],
        [],
        {},
    ]
    for key in HostWire.__annotations__:
        for v in values:
            got = HostSample.from_wire({key: v})
            want = through_the_schema({key: v})
            assert got == want, (key, v, got, want)
    assert HostSample.from_wire("not a dict") is None


def test_values_built_from_the_wire_are_the_frozen_classes_themselves() -> None:
    """``from_wire`` builds through a plain twin class and then sets the class: what comes out
    must be indistinguishable from ``cls(...)``: the type, frozen, equal, hashed, replaced,
    pickled and printed alike."""
    import dataclasses
    import pickle

    from gpuctl.core.model import HostSample

    wire_gpu = {
        "index": 2,
        "uuid": "GPU-1",
        "util_gpu": 50,
        "power": 120.5,
        "throttle": ["sw_power"],
        "processes": [{"pid": 42, "user": "ann", "command": "python", "mem": 1024}],
    }
    built = [
        GpuSample.from_wire(wire_gpu, 5.0),
        GpuSample.from_wire(wire_gpu, 5.0).processes[0],
        HostSample.from_wire({"cpu": 12.5, "cpus": 4, "load": [0.5, 1.0, 1.5]}),
    ]
    for value in built:
        cls = type(value)
        assert cls in (GpuSample, GpuProcess, HostSample)
        direct = cls(**{f.name: getattr(value, f.name) for f in dataclasses.fields(value)})
        assert value == direct and hash(value) == hash(direct) and repr(value) == repr(direct)
        assert not hasattr(value, "__dict__")
        first = dataclasses.fields(value)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, first, None)
        assert dataclasses.replace(value, **{first: None}) != value
        assert pickle.loads(pickle.dumps(value)) == value
    assert built[0].processes == (GpuProcess(42, "ann", "python", 1024),)
    assert built[0].throttle == ("sw_power",) and built[0].power == 120.5


def test_a_samples_processes_are_read_when_first_looked_into(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Most samples' processes are never looked at (only the latest one of a GPU on screen
    is): they are read from the node's dicts on first use, once, and are then what an eager
    read gives, equal to it as a tuple in every way the code uses it."""
    import pickle

    from gpuctl.core.model import WireProcesses

    raw: list[object] = [
        {"pid": 42, "user": "ann", "command": "python", "mem": 1024, "sm": 250.0},
        "junk",
        {"pid": 7, "user": "bob", "mem": 10**400},
    ]
    eager = tuple(GpuProcess.from_wire(p) for p in raw)
    reads: list[object] = []
    real = GpuProcess.from_wire.__func__  # type: ignore[attr-defined]

    def counting(cls: type[GpuProcess], d: object) -> GpuProcess:
        reads.append(d)
        return real(cls, d)  # type: ignore[no-any-return]

    monkeypatch.setattr(GpuProcess, "from_wire", classmethod(counting))
    g = GpuSample.from_wire({"index": 0, "processes": raw}, 1.0)
    assert isinstance(g.processes, WireProcesses)
    assert len(g.processes) == 3 and reads == []  # counted, not read
    assert g.processes[0] == eager[0] and len(reads) == 3  # the first look reads them all
    assert list(g.processes) == list(eager) and g.processes[1:] == eager[1:]
    assert len(reads) == 3  # once
    assert g.processes == eager and eager == g.processes and g.processes != eager[:2]
    assert hash(g.processes) == hash(eager) and repr(g.processes) == repr(eager)
    assert g == GpuSample.from_wire({"index": 0, "processes": raw}, 1.0)
    assert g.processes[0].sm is None and g.processes[2].mem is None  # checked as ever
    copied = pickle.loads(pickle.dumps(g))
    assert copied == g and type(copied.processes) is tuple
    assert GpuSample.from_wire({"index": 0, "processes": []}, 1.0).processes == ()
    assert GpuSample.from_wire({"index": 0, "processes": "junk"}, 1.0).processes == ()
