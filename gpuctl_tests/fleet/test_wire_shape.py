"""Protocol 2's sample: what the hello holds and what is null stay off the wire, and everything
above the links sees what protocol 1 showed it. gpuctl still reads protocol 1: an agent bundle
an older gpuctl deployed, and recordings made by one (``recordings/protocol1-demo.gpurec`` was
written by gpuctl at 1679462: ``gpuctl record FILE --demo --duration 3s --frame-seconds 1``)."""

from __future__ import annotations

import asyncio
import csv
import io
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gpuctl.core.model import GpuSample, NodeInfo, Sample
from gpuctl.fleet.recording.csvexport import export_csv
from gpuctl.fleet.recording.reader import RecordingReader
from gpuctl.fleet.recording.replayer import Replayer
from gpuctl.fleet.recording.writer import RecordingWriter
from gpuctl.fleet.session import AgentSession, LinkError, decode_line, statics
from gpuctl.node import protocol
from gpuctl.node.readers.sim import SimReader
from gpuctl_tests.helpers import wait_until_async

PROTOCOL1 = Path(__file__).parent / "recordings" / "protocol1-demo.gpurec"


def sample_msg(gpus: list[dict[str, Any]], parents: list[Any], t: float) -> dict[str, Any]:
    return {"type": "sample", "t": t, "seq": 1, "gpus": gpus, "parents": parents, "host": None}


def both_shapes() -> tuple[NodeInfo, list[tuple[bytes, bytes]]]:
    """A simulated node's hello and its samples as protocol 1 sent them and as protocol 2 does:
    with processes, slow and fast samples, a power cap set after the hello, a lost GPU."""
    reader = SimReader.from_spec("4:H100", seed=3)
    hello = reader.static()
    info = msgspec.convert({"protocol": 2, "gpus": hello}, NodeInfo)
    lines = []
    for k in range(12):
        if k == 8:
            reader.simulate("lose", {"gpu": 3})
        gpus = reader.sample(slow=k % protocol.SLOW_EVERY == 0)
        if k >= 4:
            gpus[1]["power_limit"] = 350.0  # capped since the hello: sent while it differs
        parents = reader.parents()
        full = protocol.encode(sample_msg(gpus, parents, 1e9 + k))
        compact = protocol.encode(
            sample_msg(
                protocol.compact_gpus(gpus, hello), protocol.compact_records(parents), 1e9 + k
            )
        )
        lines.append((full, compact))
    return info, lines


def test_a_protocol2_sample_reads_as_its_protocol1_twin() -> None:
    info, lines = both_shapes()
    hello = statics(info)
    assert hello is not None
    for full, compact in lines:
        assert decode_line(compact, hello) == decode_line(full)  # the fast path
        bad = b'"temp":"hot","was":'  # one bad field: the lenient path fills the same way
        lenient = decode_line(compact.replace(b'"temp":', bad, 1), hello)
        assert isinstance(lenient, Sample) and lenient.gpus[0].temp is None
        want = decode_line(full)
        assert isinstance(want, Sample)
        assert lenient.gpus[1:] == want.gpus[1:]
        assert msgspec.structs.replace(lenient.gpus[0], temp=want.gpus[0].temp) == want.gpus[0]
        wire = json.loads(compact)
        for g in wire["gpus"]:
            assert None not in g.values() and "mem_total" not in g and "uuid" not in g
            assert all(None not in p.values() for p in g.get("processes", []))
        assert [g.get("power_limit") for g in wire["gpus"]] in (
            [None] * 4,
            [None, 350.0, None, None],
        )
        assert len(compact) < 0.8 * len(full)
    decoded = decode_line(lines[-1][1], hello)
    assert isinstance(decoded, Sample)
    lost = decoded.gpus[3]
    assert lost.lost and lost.uuid == info.gpus[3].uuid and lost.mem_total is None
    assert decoded.gpus[1].power_limit == 350.0 and decoded.gpus[0].power_limit == 700.0


def test_what_protocol2_leaves_out_is_read_from_the_hello_not_from_nothing() -> None:
    info, lines = both_shapes()
    compact = lines[0][1]
    for got in (decode_line(compact), decode_line(compact, {})):  # no hello, or not these GPUs
        assert isinstance(got, Sample)
        assert {(g.uuid, g.mem_total) for g in got.gpus} == {(None, None)}
    # A reading that failed (null) shows the hello's value: the same GPU's total memory.
    g = {"index": 0, "state": "ok", "uuid": None, "mem_total": None, "power_limit": None}
    got = decode_line(protocol.encode(sample_msg([g], [], 1.0)), statics(info))
    assert isinstance(got, Sample)
    st = info.gpus[0]
    assert (got.gpus[0].uuid, got.gpus[0].mem_total, got.gpus[0].power_limit) == (
        st.uuid,
        st.mem_total,
        st.power_limit,
    )


class _Lines:
    def __init__(self, lines: list[bytes]) -> None:
        self.lines = list(lines)

    async def readline(self) -> bytes:
        return self.lines.pop(0) if self.lines else b""


class _Discard:
    def write(self, data: bytes) -> None:
        pass


async def session_samples(hello: dict[str, Any], lines: list[bytes]) -> list[Sample]:
    session = AgentSession(_Lines([protocol.encode(hello), *lines]), _Discard())
    await session.handshake(5)
    return [m async for m in session.messages() if isinstance(m, Sample)]


async def test_a_session_reads_protocol_1_and_2_and_refuses_others_in_one_line() -> None:
    info, lines = both_shapes()
    gpus = [msgspec.to_builtins(st) for st in info.gpus]
    v2 = await session_samples(
        {"type": "hello", "protocol": 2, "gpus": gpus}, [c for _, c in lines]
    )
    v1 = await session_samples(
        {"type": "hello", "protocol": 1, "gpus": gpus}, [f for f, _ in lines]
    )
    assert v2 == v1 and len(v2) == len(lines) and v2[0].gpus[0].uuid == info.gpus[0].uuid
    # Protocol 1 left nothing to the hello: a null there stays null, as it always did.
    null = {"index": 0, "uuid": None, "state": "ok", "mem_total": None, "power_limit": None}
    (s,) = await session_samples(
        {"type": "hello", "protocol": 1, "gpus": gpus},
        [protocol.encode(sample_msg([null], [], 1.0))],
    )
    assert (s.gpus[0].uuid, s.gpus[0].mem_total, s.gpus[0].power_limit) == (None, None, None)
    for version in (3, 0, "2", True, 2.0, None):
        with pytest.raises(LinkError) as e:
            await session_samples({"type": "hello", "protocol": version}, [])
        assert e.value.reason == "protocol"
        assert e.value.message == f"agent speaks protocol {version}, gpuctl reads 1 and 2"


def to_protocol2(source: Path, dest: Path) -> None:
    """``source`` (a protocol 1 recording) with every hello and sample as protocol 2 has them."""
    reader = RecordingReader(source)
    writer = RecordingWriter(dest, reader.nodes, started=reader.started)
    hellos: dict[str, list[dict[str, Any]]] = {}
    frames: dict[int, list[bytes]] = {}
    for i, rec in reader.records():
        m = rec.get("m") or {}
        if m.get("type") == "hello":
            assert m["protocol"] == 1
            m["protocol"] = 2
            hellos[rec["n"]] = m["gpus"]
        elif m.get("type") == "sample":
            m["gpus"] = protocol.compact_gpus(m["gpus"], hellos[rec["n"]])
            m["parents"] = protocol.compact_records(m["parents"])
        frames.setdefault(i, []).append(json.dumps(rec, separators=(",", ":")).encode() + b"\n")
    for i, payload in sorted(frames.items()):
        writer.write_frame(b"".join(payload), reader.frames[i].t_first, reader.frames[i].t_last)
    writer.close()
    reader.close()


def csv_of(path: Path) -> str:
    out = io.StringIO()
    reader = RecordingReader(path)
    assert export_csv(reader, out) > 0
    reader.close()
    return out.getvalue()


async def replayed(path: Path) -> dict[str, tuple[GpuSample, ...]]:
    """Every node's GPUs as a replay of ``path`` shows them at its end."""
    reader = RecordingReader(path)
    last: dict[str, float] = {}
    for _i, rec in reader.records():
        m = rec.get("m") or {}
        if m.get("type") == "sample":
            last[rec["n"]] = m["t"]
    replayer = Replayer(reader, speed=1e6)
    fleet = replayer.fleet()
    await fleet.start()
    play = asyncio.create_task(replayer.play())
    try:
        ended = lambda: all(fleet.snapshot(n).last_sample_t == t for n, t in last.items())  # noqa: E731
        await wait_until_async(ended, 20, "the replay to reach its end")
        return {n: fleet.snapshot(n).gpus for n in last}
    finally:
        play.cancel()
        await fleet.stop()


async def test_a_protocol1_recording_replays_and_exports_as_its_protocol2_twin(
    tmp_path: Path,
) -> None:
    v2 = tmp_path / "protocol2.gpurec"
    to_protocol2(PROTOCOL1, v2)
    assert v2.stat().st_size < PROTOCOL1.stat().st_size
    old = csv_of(PROTOCOL1)
    assert old == csv_of(v2)
    rows = list(csv.DictReader(io.StringIO(old)))
    assert len(rows) > 6 * 8
    assert all(r["uuid"].startswith("GPU-") and r["mem_total"] and r["power_limit"] for r in rows)
    shown = await replayed(PROTOCOL1)
    assert shown == await replayed(v2)
    assert len(shown) == 6 and all(
        g.uuid and g.mem_total and g.power_limit for gs in shown.values() for g in gs
    )
