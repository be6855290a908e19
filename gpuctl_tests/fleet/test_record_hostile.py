"""Recordings made by someone else (attached to a ticket, left in a shared folder): damaged or
crafted files cost bounded memory and work, and end in one line or in what can be read, never
in an internal error (issue 28, sections 3 and 4). The files are built here from the documented
layout (see ``gpuctl.fleet.recording.format``), independently of the writer."""

from __future__ import annotations

import contextlib
import io
import json
import re
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuctl.cli.main import main
from gpuctl.fleet.recording import reader as record_reader
from gpuctl.fleet.recording.csvexport import export_csv
from gpuctl.fleet.recording.format import RecordingError
from gpuctl.fleet.recording.reader import MAX_NODES, RecordingReader
from gpuctl.fleet.recording.replayer import Replayer
from gpuctl.tui.replay import ReplayApp
from gpuctl_tests.fleet.test_record import gpuctl
from gpuctl_tests.helpers import node_env
from gpuctl_tests.tui.test_app import messages, until

FRAME = struct.Struct(">4sIdd")
TRAILER = struct.Struct(">8sQ")
T0 = 1_795_700_000.0
HELLO = {
    "type": "hello",
    "protocol": 1,
    "agent": "0.1.0",
    "interval": 1.0,
    "gpus": [{"index": 0, "name": "NVIDIA H100", "uuid": "GPU-0"}],
}


def sample(t: float, util: int) -> dict[str, Any]:
    gpu = {"index": 0, "uuid": "GPU-0", "state": "ok", "util_gpu": util, "processes": []}
    return {"type": "sample", "t": t, "seq": util, "gpus": [gpu]}


def line(rec: dict[str, Any]) -> bytes:
    return json.dumps(rec).encode() + b"\n"


# One node's frame: its hello and one sample (one CSV row).
PAYLOAD = line({"t": T0, "n": "a", "m": HELLO}) + line({"t": T0, "n": "a", "m": sample(T0, 7)})


def header(nodes: list[str] | None = None, **extra: Any) -> bytes:
    h = {
        "format": "gpuctl-recording",
        "version": 1,
        "started": T0,
        "gpuctl": "test",
        "nodes": [{"name": n, "link": "local"} for n in (nodes or ["a"])],
        **extra,
    }
    return json.dumps(h).encode() + b"\n"


def frame(payload: bytes, t0: float = T0, t1: float = T0 + 1, tag: bytes = b"GRF1") -> bytes:
    data = zstandard.ZstdCompressor(level=19).compress(payload)
    return FRAME.pack(tag, len(data), t0, t1) + data


def recording(
    head: bytes, payloads: list[bytes], index: bytes | None = None, trailer: bool = True
) -> bytes:
    """The file: ``head``, a frame per payload, and (``trailer``) an index and the trailer; the
    index is ``index`` (JSON) or the right one."""
    out = bytearray(head)
    offsets = []
    for i, p in enumerate(payloads):
        offsets.append(len(out))
        out += frame(p, T0 + 2 * i, T0 + 2 * i + 1)
    if trailer:
        if index is None:
            index = json.dumps([[T0 + 2 * i, o] for i, o in enumerate(offsets)]).encode()
        at = len(out)
        out += frame(index, 0.0, 0.0, b"GRI1") + TRAILER.pack(b"GRECEND1", at)
    return bytes(out)


def first_frame_offset(head: bytes) -> int:
    return len(head)


def deep(n: int) -> str:
    return "[" * n + "]" * n


# Runs gpuctl and reports its peak RSS: from a small process of its own, so that the child's
# high-water mark does not start at this test's (a child forked from a big process counts it).
MEASURE = """
import json, resource, subprocess, sys
r = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=600)
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(json.dumps([r.returncode, r.stdout, r.stderr, peak]))
"""


def gpuctl_measured(*args: str) -> tuple[int, str, str, float]:
    """Run gpuctl in a child; (exit status, stdout, stderr, its peak RSS in MiB)."""
    r = subprocess.run(
        [sys.executable, "-c", MEASURE, sys.executable, "-m", "gpuctl", *args],
        capture_output=True,
        text=True,
        env=node_env(),
        timeout=900,
    )
    assert r.returncode == 0, r.stderr
    rc, out, err, peak = json.loads(r.stdout)
    return rc, out, err, peak


def one_line_each(stderr: str) -> list[str]:
    lines = stderr.splitlines()
    assert all(x.startswith("gpuctl") for x in lines), stderr
    assert "internal error" not in stderr and "Traceback" not in stderr, stderr
    return lines


# -- 3: bounded work ---------------------------------------------------------------------------
def test_an_index_naming_one_frame_millions_of_times_is_damaged_and_cheap(tmp_path: Path) -> None:
    head = header()
    at = first_frame_offset(head)
    entries = b",".join([b"[%r,%d]" % (T0, at)] * 4_800_000)
    path = tmp_path / "index-bomb.gpurec"
    path.write_bytes(recording(head, [PAYLOAD], b"[" + entries + b"]"))
    assert path.stat().st_size < 16000  # 4.8 million entries in a few KB of zstd
    out = tmp_path / "out.csv"
    # Before: the index parsed whole into lists and the frame read once per entry:
    # 1.3 GB peak and 4.8 million rows (the 374 MB of CSV).
    rc, _, err, rss = gpuctl_measured("replay", str(path), "--export-csv", str(out))
    assert rc == 0, err
    assert "damaged index" in err and "reading frames in order" in err, err
    assert len(one_line_each(err)) == 2  # the damaged index; the rows written
    assert out.read_text().count("\n") == 2  # the columns and the frame's one row, once
    assert rss < 300, f"{rss:.0f} MiB"


@pytest.mark.parametrize(
    ("index", "why"),
    [
        (b"[[%r, %d], [%r, %d]]", "not after the frame before it"),  # the same frame twice
        (b"[[%r, -5]]", "other than [time, offset]"),  # was a bare "Invalid argument"
        (b"[[%r, 9223372036854775809]]", "names no frame"),  # was a ValueError
        (b"[[%r, 3]]", "not after the header"),
        (b"[[1, " + deep(100_000).encode() + b"]]", "other than [time, offset]"),  # Recursion
        (b'{"a": 1}', "not a list"),
    ],
    ids=["twice", "negative", "past-2**63", "in-header", "nested", "not-a-list"],
)
def test_a_bad_index_is_one_line_and_the_frames_are_read_in_order(
    tmp_path: Path, index: bytes, why: str
) -> None:
    head = header()
    at = first_frame_offset(head)
    if index.count(b"%") == 4:
        index = index % (T0, at, T0, at)
    elif b"%" in index:
        index = index % (T0,)
    path = tmp_path / "bad-index.gpurec"
    path.write_bytes(recording(head, [PAYLOAD], index))
    reader = RecordingReader(path)
    assert reader.damaged is not None and why in reader.damaged, reader.damaged
    assert len(reader.frames) == 1 and not reader.complete
    r = gpuctl("replay", str(path), "--export-csv", "-")
    assert r.returncode == 0, r.stderr
    assert one_line_each(r.stderr) == [
        f"gpuctl: {path}: damaged index ({reader.damaged}): reading frames in order"
    ]
    assert r.stdout.count("\n") == 2  # the header row and the sample's


def test_a_frame_of_millions_of_tiny_lines_is_skipped_cheaply(tmp_path: Path) -> None:
    # 64 MiB of "1\n" in 6 KB of zstd: before, split whole and each line parsed (62 s, 363 MB);
    # now it inflates past MAX_INFLATION and is not decompressed at all.
    path = tmp_path / "frame-bomb.gpurec"
    path.write_bytes(recording(header(), [PAYLOAD + b"1\n" * (32 << 20), PAYLOAD]))
    assert path.stat().st_size < 16000
    rc, out, err, rss = gpuctl_measured("replay", str(path), "--export-csv", "-")
    assert rc == 0, err
    (said,) = one_line_each(err)
    assert said.startswith(f"gpuctl: {path}: frame 1 skipped: ") and "8192 times" in said
    assert out.count("\n") == 2  # the header row, and the second frame's sample
    assert rss < 150, f"{rss:.0f} MiB"
    # lines that are not records, in a frame within the bounds: left after MAX_JUNK_LINES
    path.write_bytes(recording(header(), [PAYLOAD + bytes(range(32, 127)) * 40 + b"\n" * 400]))
    reader = RecordingReader(path)
    assert len(list(reader.records())) == 2
    assert reader.problems == ["frame 1 skipped: 100 of its first 102 lines are not records"]


def test_a_frame_is_left_after_max_frame_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(record_reader, "MAX_FRAME_LINES", 1000, raising=False)
    records = b"".join(line({"t": T0, "n": "a", "m": sample(T0, i % 100)}) for i in range(3000))
    path = tmp_path / "long.gpurec"
    path.write_bytes(recording(header(), [records]))
    reader = RecordingReader(path)
    assert len(list(reader.records())) == 1000
    assert reader.problems == ["frame 1 skipped: more than 1000 lines (from line 1001 on)"]


def test_a_frame_that_inflates_past_its_bound_is_skipped_in_one_line(tmp_path: Path) -> None:
    """Issue 38.6: frames of near-identical records inflate without bound (44 KB replayed as
    12.8 million rows, a 1.05 GB CSV). A frame that inflates more than ``MAX_INFLATION`` times
    its compressed size is skipped, before it is decompressed; the others replay."""
    bomb = line({"t": T0, "n": "a", "m": sample(T0, 7)}) * 200_000
    path = tmp_path / "inflating.gpurec"
    path.write_bytes(recording(header(), [PAYLOAD, PAYLOAD + bomb, PAYLOAD]))
    assert path.stat().st_size < 8000  # 200,000 rows in the middle frame
    r = gpuctl("replay", str(path), "--export-csv", "-")
    assert r.returncode == 0, r.stderr
    (said,) = one_line_each(r.stderr)
    assert re.fullmatch(
        rf"gpuctl: {re.escape(str(path))}: frame 2 skipped: \d+ bytes that inflate to \d+ "
        r"\(more than 8192 times: no recording's frame does\)",
        said,
    ), said
    assert r.stdout.count("\n") == 3  # the header row, the first and the last frame's sample


def test_a_frame_of_more_gpu_samples_than_its_bytes_allow_stops_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A frame under the inflation bound may still hold a sample of thousands of GPUs per line
    (rows without end for a CSV): at ``MAX_ROWS_PER_BYTE`` rows a compressed byte it stops,
    and what came before is kept."""
    monkeypatch.setattr(record_reader, "MAX_INFLATION", 1 << 20)  # the other bound, alone
    many = sample(T0, 7)
    many["gpus"] = [dict(many["gpus"][0], index=i % 8) for i in range(2000)]
    payload = PAYLOAD + b"".join(line({"t": T0, "n": "a", "m": many}) for _ in range(50))
    path = tmp_path / "wide.gpurec"
    path.write_bytes(recording(header(), [payload]))
    reader = RecordingReader(path)
    compressed = reader.frames[0].length
    kept = list(reader.records())
    most = record_reader.MAX_ROWS_PER_BYTE * compressed
    assert most < 100_000 and len(kept) == 2 + (most - 2) // 2000  # whole records to the bound
    (problem,) = reader.problems
    assert problem.startswith(f"frame 1 skipped: more than {most} GPU samples in {compressed}")


def test_the_steadiest_frames_the_writer_makes_are_read_whole(tmp_path: Path) -> None:
    """The bounds against what a real recording holds at its most compressible: 128 nodes of
    8 GPUs whose every reading stays the same for 8 s (only the times move), in the frames of
    the real writer (zstd level 3, closed at FRAME_BYTES)."""
    from gpuctl.fleet.fixed_links import recorded_node
    from gpuctl.fleet.recording.writer import FRAME_BYTES, RecordingWriter

    hello, first = recorded_node("n", "8:H100", samples=1)[:2]
    nodes = [f"gpu{n:03d}" for n in range(128)]
    writer = RecordingWriter(tmp_path / "steady.gpurec", [(n, "ssh") for n in nodes], started=T0)
    lines = [line({"t": T0, "n": n, "m": dict(hello, hostname=n)}) for n in nodes]
    for k in range(8):
        for n in nodes:
            t = T0 + k + nodes.index(n) / 1000
            lines.append(line({"t": t, "n": n, "m": dict(first, t=t - 0.002, seq=k)}))
    payload = b"".join(lines)
    assert len(payload) < FRAME_BYTES
    writer.write_frame(payload, T0, T0 + 8)
    writer.close()
    reader = RecordingReader(tmp_path / "steady.gpurec")
    ratio = len(payload) / reader.frames[0].length
    assert len(list(reader.records())) == len(lines) and reader.problems == [], ratio
    rows = 128 * 8 * 8 / reader.frames[0].length
    print(f"steady frame: {len(payload)} bytes, {ratio:.0f} times its zstd, {rows:.2f} rows a byte")
    assert ratio > 500  # as steady as a fleet gets: far above the 12-13 of a demo recording


def unsized(payload: bytes) -> bytes:
    """zstd of ``payload`` without its size in the frame header (a stream)."""
    out = io.BytesIO()
    with zstandard.ZstdCompressor().stream_writer(out, closefd=False) as w:
        w.write(payload)
    return out.getvalue()


def damaged_frame(how: str, data: bytes) -> bytes:
    if how == "not-zstd":
        return b"\x00" * 4 + data[4:]
    if how == "unsized":
        return unsized(PAYLOAD)
    if how == "corrupt":
        return data[:-12] + bytes(12)  # the end of the data and its checksum
    return zstandard.ZstdCompressor().compress(PAYLOAD + b"x" * 5000 + b"\n" + PAYLOAD)


@pytest.mark.parametrize(
    ("how", "why"),
    [
        ("not-zstd", "not a zstd frame of a known size up to 256 MiB"),
        ("unsized", "not a zstd frame of a known size up to 256 MiB"),
        ("corrupt", "damaged zstd data"),
        ("long-line", "a line of more than 4096 bytes"),
    ],
)
def test_a_damaged_frame_is_skipped_and_the_others_replay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str, why: str
) -> None:
    monkeypatch.setattr(record_reader, "MAX_RECORD_LINE", 4096)
    data = bytearray(recording(header(), [PAYLOAD, PAYLOAD, PAYLOAD]))
    path = tmp_path / "damaged-frame.gpurec"
    path.write_bytes(data)
    second = RecordingReader(path).frames[1]
    body = bytes(data[second.offset + 24 : second.offset + 24 + second.length])
    new = damaged_frame(how, body)
    head = struct.pack(">4sIdd", b"GRF1", len(new), second.t_first, second.t_last)
    path.write_bytes(
        data[: second.offset] + head + new + data[second.offset + 24 + second.length :]
    )
    reader = RecordingReader(path)  # the index is wrong now if the length changed: no matter
    rows = export_csv(reader, io.StringIO())
    assert reader.problems == [f"frame 2 skipped: {why}"]
    assert rows == (3 if how == "long-line" else 2)  # its first sample, when it came whole


def test_a_header_naming_100000_nodes_replays_a_bounded_number(tmp_path: Path) -> None:
    names = [f"n{i}" for i in range(100_000)]
    path = tmp_path / "nodes.gpurec"
    path.write_bytes(recording(header(["a", *names, "a"]), [PAYLOAD]))
    reader = RecordingReader(path)
    assert len(reader.nodes) == MAX_NODES and reader.nodes[0] == ("a", "local")
    assert reader.problems == [f"the recording names 100001 nodes: replaying the first {MAX_NODES}"]
    r = gpuctl("replay", str(path), "--export-csv", "-")
    assert r.returncode == 0 and one_line_each(r.stderr)[0] == (
        f"gpuctl: {path}: {reader.problems[0]}"
    ), r.stderr


def test_records_of_nodes_the_header_does_not_name_are_kept_nowhere(tmp_path: Path) -> None:
    # one frame naming 5,000 other nodes: nothing of them in the replay's state or the CSV
    others = b"".join(
        line({"t": T0 + 0.1, "n": f"x{i}", "m": sample(T0 + 0.1, 1)}) for i in range(5000)
    )
    path = tmp_path / "others.gpurec"
    path.write_bytes(recording(header(["a"]), [PAYLOAD + others]))
    reader = RecordingReader(path)
    replayer = Replayer(reader, start=reader.end)
    assert set(replayer.last_sample) == {"a"} and set(replayer.hellos) == {"a"}
    out = io.StringIO()
    assert export_csv(reader, out) == 1 and "x1" not in out.getvalue()


def test_a_node_added_before_joins_were_written_comes_in_at_its_hello(tmp_path: Path) -> None:
    # An older writer recorded a node added to the fleet (its hello, its samples) without a
    # join record: the replay and the CSV take it in at its hello, reached as "recorded".
    later = line({"t": T0 + 0.5, "n": "b", "m": HELLO}) + line(
        {"t": T0 + 0.5, "n": "b", "m": sample(T0 + 0.5, 42)}
    )
    path = tmp_path / "added.gpurec"
    path.write_bytes(recording(header(["a"]), [PAYLOAD + later]))
    reader = RecordingReader(path)
    replayer = Replayer(reader, start=reader.end)
    assert replayer.links["b"].describe() == "recorded recorded"
    assert replayer.last_sample["b"]["gpus"][0]["util_gpu"] == 42
    out = io.StringIO()
    assert export_csv(reader, out) == 2 and ",b,0," in out.getvalue()


def test_nodes_joining_past_the_bound_are_left_out(tmp_path: Path) -> None:
    # A node added while recording comes in at its join (the writer's); a file that joins
    # 5,000 (each with a hello and a sample) gets MAX_NODES nodes in all, and one line.
    joined = b"".join(
        line({"t": T0 + 0.1, "n": f"x{i}", "join": "prometheus"})
        + line({"t": T0 + 0.1, "n": f"x{i}", "m": HELLO})
        + line({"t": T0 + 0.1, "n": f"x{i}", "m": sample(T0 + 0.1, 1)})
        for i in range(5000)
    )
    path = tmp_path / "joined.gpurec"
    path.write_bytes(recording(header(["a"]), [PAYLOAD + joined]))
    reader = RecordingReader(path)
    replayer = Replayer(reader, start=reader.end)
    assert len(replayer.links) == MAX_NODES and len(replayer.last_sample) == MAX_NODES
    assert replayer.links["x0"].describe() == "recorded prometheus"
    assert f"x{MAX_NODES - 2}" in replayer.links and f"x{MAX_NODES - 1}" not in replayer.links
    told = [p for p in reader.problems if "joined" in p]
    assert told == [f"nodes joined the recording past {MAX_NODES} in all: they are left out"]
    out = io.StringIO()
    assert export_csv(RecordingReader(path), out) == MAX_NODES


# A replay opens no connection: the open-file limit is no concern of it (a replay of many nodes
# told the user to raise `ulimit -n`).
FD_CHECK = """
import asyncio, logging, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (300, 300))
logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(message)s")
from gpuctl.fleet.recording.reader import RecordingReader
from gpuctl.fleet.recording.replayer import Replayer
async def go():
    fleet = Replayer(RecordingReader(sys.argv[1])).fleet()
    await fleet.start()
    await fleet.stop()
asyncio.run(go())
"""


def test_a_replay_of_many_nodes_gives_no_open_file_advice(tmp_path: Path) -> None:
    path = tmp_path / "many.gpurec"
    path.write_bytes(recording(header([f"n{i}" for i in range(200)]), [PAYLOAD]))
    r = subprocess.run(
        [sys.executable, "-c", FD_CHECK, str(path)],
        capture_output=True,
        text=True,
        env=node_env(),
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "ulimit" not in r.stdout + r.stderr, r.stdout + r.stderr


# -- 4: one line, or what can be read ------------------------------------------------------------
def test_nested_json_in_the_header_is_not_a_recording(tmp_path: Path) -> None:
    path = tmp_path / "nested-header.gpurec"
    head = header(x="@@").replace(b'"@@"', deep(100_000).encode())
    path.write_bytes(recording(head, [PAYLOAD]))
    with pytest.raises(RecordingError, match="is not a gpuctl recording"):
        RecordingReader(path)
    r = gpuctl("replay", str(path))
    assert r.returncode == 2
    assert one_line_each(r.stderr) == [f"gpuctl: {path} is not a gpuctl recording"]


def nested_frame_recording(tmp_path: Path) -> Path:
    """A frame whose lines nest too deep (for the parser, or for what a replay feeds on),
    between a hello and two samples a replay plays after its start."""
    bad = [
        b'{"t": %r, "n": "a", "m": {"type": "sample", "x": %s}}\n' % (T0 + 0.6, deep(n).encode())
        for n in (40, 900, 100_000)
    ]
    good = [line({"t": T0 + t, "n": "a", "m": sample(T0 + t, u)}) for t, u in ((0.5, 1), (0.9, 2))]
    hello = line({"t": T0, "n": "a", "m": HELLO})
    path = tmp_path / "nested-frame.gpurec"
    path.write_bytes(recording(header(), [hello + bad[0] + good[0] + bad[1] + bad[2] + good[1]]))
    return path


def test_nested_json_in_a_frame_skips_those_lines(tmp_path: Path) -> None:
    reader = RecordingReader(nested_frame_recording(tmp_path))
    got = [rec["m"].get("seq") for _i, rec in reader.records()]
    assert got == [None, 1, 2] and reader.problems == []
    assert export_csv(reader, io.StringIO()) == 2


async def test_the_replay_screen_plays_a_recording_with_nested_json(tmp_path: Path) -> None:
    app = ReplayApp(Replayer(RecordingReader(nested_frame_recording(tmp_path)), speed=100))
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: app.overview.nodes.lines, "the replayed node")
        await until(pilot, lambda: app.replayer.ended, "the end of the replay")
        assert app.replayer.samples_played == 2


async def test_the_replay_screen_says_what_it_could_not_read(tmp_path: Path) -> None:
    head = header()
    at = first_frame_offset(head)
    path = tmp_path / "damaged.gpurec"
    index = b"[[%r, %d], [%r, %d]]" % (T0, at, T0, at)
    path.write_bytes(recording(head, [PAYLOAD, PAYLOAD + b"junk\n" * 200], index))
    app = ReplayApp(Replayer(RecordingReader(path), speed=100))
    async with app.run_test(size=(120, 36), notifications=True) as pilot:
        await until(pilot, lambda: app.replayer.ended, "the end of the replay")
        want = [
            "damaged index (entry 2 is not after the frame before it): reading frames in order",
            "frame 2 skipped: 100 of its first 102 lines are not records",
        ]
        await until(pilot, lambda: messages(app) == want, f"{want} in {messages(app)}")


# -- the fuzz test -------------------------------------------------------------------------------
JSON_LEAF = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
)
JSON = st.recursive(
    JSON_LEAF,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
    max_leaves=8,
)
HOSTILE_TEXT = st.sampled_from(
    [
        deep(5000),
        "-5",
        str(2**63 + 1),
        "1e400",
        "NaN",
        "9" * 200,
        '{"type": "sample", "gpus": [{"index": -1, "t": 1e300}]}',
        '{"type": "hello", "gpus": "x"}',
    ]
)


def mutated_line(base: dict[str, Any]) -> st.SearchStrategy[bytes]:
    """``base`` with one field replaced by any JSON or a hostile text, or a line of junk."""
    keys = st.sampled_from([*sorted(base), "m.gpus", "m.t", "m.type", "k"])

    def put(key: str, value: str) -> bytes:
        rec = json.loads(json.dumps(base))
        holder, _, leaf = key.rpartition(".")
        target = rec["m"] if holder == "m" and isinstance(rec.get("m"), dict) else rec
        target[leaf] = "@@"
        return json.dumps(rec).replace('"@@"', value).encode() + b"\n"

    as_json = st.builds(put, keys, JSON.map(json.dumps))
    as_text = st.builds(put, keys, HOSTILE_TEXT)
    junk = st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"") + b"\n")
    return as_json | as_text | junk


@st.composite
def hostile_recordings(draw: st.DrawFn) -> bytes:
    nodes = draw(st.lists(st.sampled_from(["a", "b", "", "a" * 300]), min_size=0, max_size=3))
    head = header(nodes or ["a"])
    if draw(st.integers(0, 3)) == 0:  # a header field replaced by any JSON or hostile text
        h = json.loads(head)
        h[draw(st.sampled_from(["started", "nodes", "version", "x"]))] = "@@"
        raw = draw(JSON.map(json.dumps) | HOSTILE_TEXT)
        head = json.dumps(h).replace('"@@"', raw).encode() + b"\n"
    base_lines = [
        {"t": T0, "n": "a", "m": HELLO},
        {"t": T0 + 0.5, "n": "a", "m": sample(T0 + 0.5, 3)},
        {"t": T0 + 0.7, "n": "a", "down": "unreachable: gone"},
        {"t": T0 + 0.8, "n": "a", "slurm": {"0": ["12", "dana"]}},
    ]
    payloads = []
    for _ in range(draw(st.integers(1, 3))):
        lines = [line(rec) for rec in base_lines]
        for _ in range(draw(st.integers(0, 3))):
            at = draw(st.integers(0, len(lines)))
            lines.insert(at, draw(mutated_line(draw(st.sampled_from(base_lines)))))
        payloads.append(b"".join(lines))
    index = draw(
        st.none()
        | st.lists(st.tuples(JSON_LEAF, st.integers(-(2**64), 2**64)), max_size=4).map(
            lambda e: json.dumps(e).encode()
        )
        | HOSTILE_TEXT.map(str.encode)
    )
    data = bytearray(recording(head, payloads, index, trailer=draw(st.booleans())))
    # then some bytes overwritten after the header (frame heads, lengths, times, zstd data, the
    # index, the trailer), and the file maybe cut short
    marks = [m.start() for m in re.finditer(b"GRF1|GRI1|GRECEND1", data)]
    for _ in range(draw(st.integers(0, 3))):
        if draw(st.booleans()):  # in a frame's head or its data's start, or in the trailer
            at = min(draw(st.sampled_from(marks)) + draw(st.integers(0, 31)), len(data) - 1)
        else:
            at = draw(st.integers(len(head), len(data) - 1))
        data[at : at + 8] = draw(st.binary(min_size=1, max_size=8))
    if draw(st.integers(0, 3)) == 0:
        del data[draw(st.integers(len(head), len(data))) :]
    return bytes(data)


def read_all(reader: RecordingReader) -> None:
    """Everything a replay and an export do with a reader, without a screen."""
    export_csv(reader, io.StringIO())
    replayer = Replayer(reader)
    for t in (reader.start, (reader.start + reader.end) / 2, reader.end):
        replayer.seek(t)
        while (rec := replayer._next()) is not None:
            replayer._play(rec)
    assert all(isinstance(p, str) and "\n" not in p for p in reader.problems)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    derandomize=True,
)
@given(data=hostile_recordings())
def test_no_recording_ends_in_an_internal_error(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "fuzz.gpurec"
    path.write_bytes(data)
    try:
        reader = RecordingReader(path)
    except RecordingError as e:
        assert "\n" not in str(e)
    else:
        try:
            read_all(reader)
        finally:
            reader.close()
    # and the command's own error path: one line each, never "internal error" (exit 70)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(["replay", str(path), "--export-csv", str(tmp_path / "out.csv")])
    assert rc in (0, 2), err.getvalue()
    one_line_each(err.getvalue())


def depth_of(value: object) -> int:
    if isinstance(value, dict):
        return 1 + max(map(depth_of, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth_of, value), default=0)
    return 0


DEEP_JSON = st.recursive(
    st.none() | st.integers() | st.text(alphabet='[]{}"\\ab', max_size=6),
    lambda c: st.lists(c, max_size=2) | st.dictionaries(st.text(max_size=3), c, max_size=2),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(value=DEEP_JSON, depth=st.integers(1, 12))
def test_the_nesting_check_on_the_text_is_the_depth_of_the_value(value: Any, depth: int) -> None:
    # strings full of brackets, quotes and backslashes: they must not count
    text = json.dumps({"t": 1, "v": value}).encode()
    assert record_reader._shallow(text, depth) == (depth_of({"v": value}) <= depth)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(
    parts=st.lists(
        st.sampled_from([b"", b"a", b"b" * 70_000, b"\n", b"xyz\n", b"c" * 200_000]), max_size=20
    )
)
def test_a_frame_is_read_in_the_lines_it_holds(parts: list[bytes]) -> None:
    # the frame's lines as they are decompressed in 64 KiB pieces: the lines of the whole text
    payload = b"".join(parts)
    want = payload.split(b"\n")
    if want[-1] == b"":
        want.pop()
    data = zstandard.ZstdCompressor().compress(payload)
    assert list(record_reader._lines(zstandard.ZstdDecompressor(), data)) == want
