"""``gpuctl record`` / ``gpuctl replay``: a real recording of the demo, read back by an independent
reader here, replayed on the real screen (Textual's pilot) and into CSV; cut and killed files."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import signal
import stat
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import zstandard

from gpuctl.fleet.demo import HOLD_JOB, HOLD_USER, demo_nodes
from gpuctl.fleet.fleet import simulated_fleet
from gpuctl.fleet.links import ThreadSimLink
from gpuctl.fleet.recording.csvexport import CSV_READINGS, export_csv
from gpuctl.fleet.recording.reader import RecordingReader
from gpuctl.fleet.recording.replayer import Replayer
from gpuctl.fleet.recording.times import format_time
from gpuctl.fleet.session import decode_sample
from gpuctl.node.protocol import FROM_HELLO
from gpuctl.tui.app import GpuctlApp
from gpuctl.tui.replay import ReplayApp
from gpuctl_tests.helpers import (
    node_env,
    recording_fleet,
    until,
    wait_until,
    wait_until_async,
)

SIZE = (120, 36)


def gpuctl(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuctl", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=node_env(),
    )


# An independent reader of the documented layout: header line, then 24-byte frame heads
# (tag, length, first t, last t) each followed by one zstd frame of JSON lines.
def frames_of(path: Path) -> list[list[dict[str, Any]]]:
    data = path.read_bytes()
    at = data.index(b"\n") + 1
    out = []
    while at + 24 <= len(data):
        tag, length, _t0, _t1 = struct.unpack(">4sIdd", data[at : at + 24])
        if tag != b"GRF1" or at + 24 + length > len(data):
            break
        raw = zstandard.ZstdDecompressor().decompress(data[at + 24 : at + 24 + length])
        out.append([json.loads(line) for line in raw.splitlines()])
        at += 24 + length
    return out


def samples_in(frames: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return [
        r for f in frames for r in f if not r.get("k") and r.get("m", {}).get("type") == "sample"
    ]


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("rec") / "demo.gpurec"
    r = gpuctl("record", str(path), "--demo", "--duration", "4s", "--frame-seconds", "1")
    assert r.returncode == 0, r.stderr
    assert f"wrote {path}" in r.stdout
    return path


def test_recording_holds_every_nodes_stream(recording: Path) -> None:
    assert stat.S_IMODE(recording.stat().st_mode) == 0o600  # samples name users and commands
    frames = frames_of(recording)
    assert len(frames) >= 3  # 4 s in frames of 1 s
    header = json.loads(recording.read_bytes().split(b"\n", 1)[0])
    names = [n for n, _ in demo_nodes()]
    assert header["format"] == "gpuctl-recording" and [n["name"] for n in header["nodes"]] == names
    records = [r for f in frames for r in f if not r.get("k")]
    hellos = {r["n"] for r in records if r.get("m", {}).get("type") == "hello"}
    assert hellos == set(names)
    sampled = {r["n"] for r in samples_in(frames)}
    assert sampled == set(names)
    times = [r["t"] for r in records]
    assert times == sorted(times)
    for later in frames[1:]:  # each frame starts with every node's hello and last sample
        keys = [(r["n"], r["m"]["type"]) for r in later if r.get("k") and "m" in r]
        assert sorted(keys) == sorted((n, t) for n in names for t in ("hello", "sample"))
    # the story's Slurm job (a GPU held and idle), where it came within the recording: its
    # "slurm" records (the format's) name it, and nothing else
    jobs = [r["slurm"] for f in frames for r in f if "slurm" in r]
    assert all([tuple(v) for v in j.values()] in ([(HOLD_JOB, HOLD_USER)], []) for j in jobs), jobs
    reader = RecordingReader(recording)
    assert reader.complete and len(reader.frames) == len(frames)


def csv_rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def expected_rows(frames: list[list[dict[str, Any]]]) -> list[tuple[str, str, str, str, str]]:
    """The rows as the protocol documents a sample: a GPU's absent uuid is its hello's."""
    out = []
    uuids: dict[str, dict[int, str]] = {}
    for r in (r for f in frames for r in f):
        m = r.get("m", {})
        if m.get("type") == "hello":
            uuids[r["n"]] = {g["index"]: g["uuid"] for g in m["gpus"]}
        if r.get("k") or m.get("type") != "sample":
            continue
        for g in m["gpus"]:
            uuid = g.get("uuid", uuids[r["n"]][g["index"]])
            # a GPU off the bus (the demo's XID 79) has no readings: its cells are empty
            util, temp = (g.get(k) for k in ("util_gpu", "temp"))
            cells = ("" if v is None else str(v) for v in (util, temp))
            out.append((r["n"], str(g["index"]), *cells, uuid))
    return out


def test_csv_has_one_row_per_node_gpu_sample(recording: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.csv"
    r = gpuctl("replay", str(recording), "--export-csv", str(out))
    assert r.returncode == 0, r.stderr
    rows = csv_rows(out.read_text())
    frames = frames_of(recording)
    want = expected_rows(frames)
    assert len(want) > 6 * 8
    assert [(x["node"], x["gpu"], x["util_gpu"], x["temp"], x["uuid"]) for x in rows] == want
    hello = next(r["m"] for f in frames for r in f if r.get("m", {}).get("type") == "hello")
    first = next(x for x in rows if x["node"] == hello["hostname"] or x["node"] == "sim-01")
    assert first["model"] == "NVIDIA H100 80GB HBM3" and first["mem_total"] == str(80 * 2**30)
    sample = samples_in(frames)[0]["m"]
    assert rows[0]["t"] == f"{sample['t']:.3f}" and rows[0]["time"].endswith("Z")
    # every reading of the metric registry is a column named by its key, with the wire's value
    # (protocol 2: a field absent is null, and an "ok" GPU's FROM_HELLO fields are its hello's)
    hellos = {
        r["n"]: {g["index"]: g for g in r["m"]["gpus"]}
        for f in frames
        for r in f
        if r.get("m", {}).get("type") == "hello"
    }

    def value(node: str, g: dict[str, Any], key: str) -> Any:
        v = g.get(key)
        if v is None and key in FROM_HELLO and g.get("state", "ok") == "ok":
            v = hellos[node][g["index"]].get(key)
        return v

    wire = [(r["n"], g) for r in samples_in(frames) for g in r["m"]["gpus"]]
    assert {"enc", "dec", "pcie_tx", "pcie_rx"} <= set(CSV_READINGS)
    for key in CSV_READINGS:
        want_key = ["" if (v := value(n, g, key)) is None else str(v) for n, g in wire]
        assert [x[key] for x in rows] == want_key, key
    # --from: only samples received from then on
    reader = RecordingReader(recording)
    r = gpuctl("replay", str(recording), "--export-csv", "-", "--from", "2s")
    assert r.returncode == 0, r.stderr
    later = csv_rows(r.stdout)
    want_later = [
        (x["n"], str(g["index"]))
        for x in samples_in(frames)
        if x["t"] >= reader.start + 2
        for g in x["m"]["gpus"]
    ]
    assert [(x["node"], x["gpu"]) for x in later] == want_later and 0 < len(later) < len(rows)


def test_cut_recording_replays_up_to_its_last_complete_frame(
    recording: Path, tmp_path: Path
) -> None:
    frames = frames_of(recording)
    data = recording.read_bytes()
    # Cut in the middle of the last data frame: the index and the trailer are gone too.
    cut = tmp_path / "cut.gpurec"
    reader = RecordingReader(recording)
    last = reader.frames[-1]
    cut.write_bytes(data[: last.offset + 24 + last.length // 2])
    r = gpuctl("replay", str(cut), "--export-csv", "-")
    assert r.returncode == 0, r.stderr
    assert "cut short" in r.stderr and r.stderr.count("\n") == 1
    assert [(x["node"], x["util_gpu"]) for x in csv_rows(r.stdout)] == [
        (n, u) for n, _g, u, _t, _uu in expected_rows(frames[:-1])
    ]
    # Nothing but the header: one line saying so; not a recording at all: one line too.
    head = tmp_path / "head.gpurec"
    head.write_bytes(data[: data.index(b"\n") + 30])
    junk = tmp_path / "junk.gpurec"
    junk.write_bytes(b"\x28\xb5\x2f\xfd garbage\n")
    for path, says in ((head, "holds no complete frame"), (junk, "is not a gpuctl recording")):
        r = gpuctl("replay", str(path), "--export-csv", "-")
        assert r.returncode == 2 and says in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_killed_recorder_leaves_a_replayable_file(tmp_path: Path) -> None:
    path = tmp_path / "killed.gpurec"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuctl", "record", str(path), "--demo", "--frame-seconds", "0.5"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=node_env(),
    )
    try:
        wait_until(
            lambda: path.exists() and len(samples_in(frames_of(path))) >= 12,
            timeout=60,
            what="two frames of samples",
        )
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    r = gpuctl("replay", str(path), "--export-csv", "-")
    assert r.returncode == 0, r.stderr
    assert "cut short" in r.stderr
    assert len(csv_rows(r.stdout)) == len(expected_rows(frames_of(path))) >= 12 * 8


def test_bad_replay_input_is_one_line(recording: Path) -> None:
    for args, says in (
        (("replay", "/nonexistent.gpurec"), "No such file"),
        (("replay", str(recording), "--from", "yesterday"), "--from 'yesterday'"),
        (("replay", str(recording), "--from", "1h"), "is outside the recording"),
        (("replay", str(recording), "--speed", "0"), "--speed"),
        (("record", str(recording), "--demo"), "exists"),
        (("record", "/tmp/x.gpurec", "--duration", "soon"), "not a duration"),
    ):
        r = gpuctl(*args)
        assert r.returncode in (1, 2) and says in r.stderr, (args, r.stderr)
        assert r.stderr.count("\n") == 1 and r.stderr.startswith("gpuctl"), (args, r.stderr)


# -- the screen ---------------------------------------------------------------------------------
def last_samples(frames: list[list[dict[str, Any]]], upto: float) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for r in samples_in(frames):
        if r["t"] <= upto:
            out[r["n"]] = r["m"]
    return out


def shown(app: GpuctlApp, node: str) -> tuple[tuple[int | None, int | None], ...]:
    snap = app.store.snaps[node]
    return tuple((g.util_gpu, g.temp) for g in snap.gpus)


def recorded(msg: dict[str, Any]) -> tuple[tuple[int | None, int | None], ...]:
    gpus = decode_sample(msg).gpus
    return tuple((g.util_gpu, g.temp) for g in gpus)


async def test_replay_screen_shows_recorded_values_time_and_seeks(
    recording: Path, tmp_path: Path
) -> None:
    frames = frames_of(recording)
    reader = RecordingReader(recording)
    app = ReplayApp(Replayer(reader, speed=1000), state_dir=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        final = last_samples(frames, reader.end)
        await until(
            pilot,
            lambda: (
                app.replayer.ended and all(shown(app, n) == recorded(m) for n, m in final.items())
            ),
            "the last recorded sample of every node on screen",
        )
        label = app.overview.query_one("#mark-replay")
        await until(pilot, lambda: format_time(reader.end) in str(label.content), "end time")
        assert "end" in str(label.content)
        nodes = app.overview.nodes
        y = next(i for i, line in enumerate(nodes.lines) if line == ("gpu", "sim-01", 0))
        text = nodes.render_line(y - int(nodes.scroll_offset.y)).text
        util, temp = recorded(final["sim-01"])[0]
        assert f"{util}%" in text and f"{temp}°C" in text, text
        assert app.read_only
        # Pause, back to the start (a minute back is clamped), then on one second at a time.
        await pilot.press("space", "left_curly_bracket")
        first = last_samples(frames, reader.start)
        await until(
            pilot,
            lambda: all(
                shown(app, n) == (recorded(first[n]) if n in first else ()) for n in app.store.snaps
            ),
            "the start: no GPU values from later on screen",
        )
        await pilot.press("full_stop", "full_stop")
        at = reader.start + 2
        assert app.replayer.paused and app.replayer.now() == pytest.approx(at)
        then = last_samples(frames, at)
        assert then and then != final
        await until(
            pilot,
            lambda: all(shown(app, n) == recorded(m) for n, m in then.items()),
            "the samples of 2 s into the recording",
        )
        await until(pilot, lambda: format_time(at) in str(label.content), "the seek time")
        assert "paused" in str(label.content)
        for name in then:  # history went with the jump: nothing from after the seek
            times, _ = app.fleet.history(name, 0).series("util")
            assert all(t <= then[name]["t"] for t in times)


async def test_shift_r_records_the_screens_fleet(tmp_path: Path) -> None:
    fleet = simulated_fleet(demo_nodes(2, 2), interval=0.2)
    app = GpuctlApp(fleet, simulated=True, state_dir=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: all(s.gpus for s in app.store.snaps.values()), "live")
        await pilot.press("R")
        recorder = app.record_flow.recorder
        assert recorder is not None
        await until(pilot, lambda: recorder.samples >= 10, "samples recorded")
        await pilot.press("R")
        assert app.record_flow.recorder is None
    path = recorder.path
    assert path.parent == tmp_path / "recordings" and path.suffix == ".gpurec"
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    frames = frames_of(path)
    # The nodes were live before R: their hellos come from the keyframe.
    assert {r["n"] for r in frames[0] if r.get("k")} == {n for n, _ in demo_nodes(2, 2)}
    assert len(samples_in(frames)) == recorder.samples
    assert RecordingReader(path).complete


async def test_a_fast_replay_loses_no_sample(recording: Path) -> None:
    # At any speed, what a node said between its hello and the fleet opening its session
    # reaches the fleet: its history holds every recorded sample, in order.
    frames = frames_of(recording)
    want: dict[str, list[float]] = {}
    for r in samples_in(frames):
        want.setdefault(r["n"], []).append(r["m"]["t"])
    replayer = Replayer(RecordingReader(recording), speed=1e6)
    fleet = replayer.fleet()
    await fleet.start()
    play = asyncio.create_task(replayer.play())
    try:

        def got() -> dict[str, list[float]]:
            return {n: fleet.history(n, 0).series("util")[0] for n in want}

        await wait_until_async(lambda: got() == want, 20, f"the history {want}", now=got)
        assert replayer.samples_played == sum(len(v) for v in want.values())
    finally:
        play.cancel()
        await fleet.stop()


async def test_slurm_jobs_are_recorded_replayed_and_in_the_csv(tmp_path: Path) -> None:
    fleet = simulated_fleet([("a", "2:H100"), ("b", "1:A100")], interval=0.1)
    path = tmp_path / "jobs.gpurec"
    async with recording_fleet(fleet, path) as recorder:
        await wait_until_async(lambda: recorder.samples >= 6, 20, "samples before the job")
        fleet.annotate("a", 1, slurm_job="4242", slurm_user="alice")
        marked = recorder.samples
        await wait_until_async(lambda: recorder.samples >= marked + 12, 20, "samples under the job")
        fleet.annotate("a", 1, slurm_job=None, slurm_user=None)
        ended = recorder.samples
        await wait_until_async(lambda: recorder.samples >= ended + 6, 20, "samples after the job")
    reader = RecordingReader(path)
    out = io.StringIO()
    export_csv(reader, out)
    rows = [r for r in csv_rows(out.getvalue()) if r["node"] == "a" and r["gpu"] == "1"]
    jobs = [(r["slurm_job"], r["slurm_user"]) for r in rows]
    # none, then the job on every sample while it ran, then none again: in that order
    runs = [k for i, k in enumerate(jobs) if i == 0 or jobs[i - 1] != k]
    assert runs == [("", ""), ("4242", "alice"), ("", "")], jobs
    assert all(r["slurm_job"] == "" for r in csv_rows(out.getvalue()) if r["node"] == "b")
    # The replay puts the job on the GPU while the recording has it, and takes it off.
    t_on = next(rec["t"] for _i, rec in reader.records() if rec.get("slurm") and not rec.get("k"))
    replayer = Replayer(reader, speed=1.0, start=t_on + 0.05)
    replayer.paused = True
    replay_fleet = replayer.fleet()
    assert replay_fleet.snapshot("a").annotations[1] == {"slurm_job": "4242", "slurm_user": "alice"}
    await replay_fleet.start()
    try:
        replayer.seek(reader.end)
        assert "slurm_job" not in replay_fleet.snapshot("a").annotations.get(1, {})
        replayer.seek(t_on + 0.05)
        assert replay_fleet.snapshot("a").annotations[1]["slurm_job"] == "4242"
    finally:
        await replay_fleet.stop()


async def test_a_node_added_while_recording_is_replayed_from_its_arrival_and_in_the_csv(
    tmp_path: Path,
) -> None:
    # A node the fleet gains mid-recording (``Fleet.add_node``: a host that appeared in the
    # site's Prometheus) is not in the header: the recording says when it joined and how it is
    # reached, and the replay and the CSV take it in from then on.
    fleet = simulated_fleet([("a", "1:H100")], interval=0.1)
    path = tmp_path / "joined.gpurec"
    async with recording_fleet(fleet, path) as recorder:
        await wait_until_async(lambda: recorder.samples >= 8, 20, "samples of a alone")
        fleet.add_node("b", ThreadSimLink("2:A100", seed=1, interval=0.1))
        marked = recorder.samples
        # b's samples over more than two frames: a later frame's keyframes must bring b in
        await wait_until_async(lambda: recorder.samples >= marked + 30, 20, "samples with b")
    frames = frames_of(path)
    header = json.loads(path.read_bytes().split(b"\n", 1)[0])
    assert [n["name"] for n in header["nodes"]] == ["a"]
    records = [r for f in frames for r in f if not r.get("k")]
    joined = next(r for r in records if r["n"] == "b")
    assert joined.get("join") == "simulated"  # before anything of b's: when and how it came
    t_join = joined["t"]
    assert all(r["t"] >= t_join for r in records if r["n"] == "b")
    assert any(r.get("k") and r["n"] == "b" and r.get("join") for r in frames[-1])

    # The CSV holds b's rows, each of its recorded samples, as it holds a's.
    reader = RecordingReader(path)
    out = io.StringIO()
    export_csv(reader, out)
    rows = csv_rows(out.getvalue())
    got = [(x["node"], x["gpu"], x["util_gpu"], x["temp"], x["uuid"]) for x in rows]
    want = expected_rows(frames)
    assert {w[0] for w in want} == {"a", "b"} and len([w for w in want if w[0] == "b"]) >= 20
    assert got == want
    b_rows = [x for x in rows if x["node"] == "b"]
    assert {x["model"] for x in b_rows} == {"NVIDIA A100-SXM4-80GB"}

    # A replay from the start: b is not there before its arrival, and comes in as it arrives.
    last_b = last_samples(frames, reader.end)["b"]
    replayer = Replayer(reader, speed=1e6)
    replay_fleet = replayer.fleet()
    assert replay_fleet.names == ["a"]
    await replay_fleet.start()
    play = asyncio.create_task(replayer.play())
    try:
        await wait_until_async(
            lambda: (
                "b" in replay_fleet.names
                and tuple((g.util_gpu, g.temp) for g in replay_fleet.snapshot("b").gpus)
                == recorded(last_b)
            ),
            20,
            "b's last recorded sample in the replay",
        )
        assert replay_fleet.nodes["b"].link.describe() == "recorded simulated"
        # Back to before its arrival: b is not in the fleet (not on the screen), a is.
        replayer.toggle_pause()
        replayer.seek(t_join - 0.05)
        await wait_until_async(lambda: replay_fleet.names == ["a"], 20, "b gone before it came")
        # And forward again past its arrival: b is back, with its sample then.
        replayer.seek(reader.end)
        await wait_until_async(
            lambda: (
                "b" in replay_fleet.names
                and tuple((g.util_gpu, g.temp) for g in replay_fleet.snapshot("b").gpus)
                == recorded(last_b)
            ),
            20,
            "b at the end again",
        )
    finally:
        play.cancel()
        await replay_fleet.stop()

    # A replay that starts after the join has b from its first frame's keyframes.
    late = Replayer(RecordingReader(path), start=reader.end)
    late.paused = True
    assert late.fleet().names == ["a", "b"]
    assert late.last_sample["b"] == last_b


async def test_a_node_that_left_while_recording_leaves_the_replay_and_a_seek_brings_it_back(
    tmp_path: Path,
) -> None:
    # A node the fleet drops mid-recording (``Fleet.remove_node``: a host gone from the
    # site's Prometheus) is written as a ``leave``; a replay drops it there, keyframes after it
    # leave it out (a header node's say it left), and a seek to before the leave shows it again.
    fleet = simulated_fleet([("a", "1:H100"), ("b", "1:A100")], interval=0.1)
    path = tmp_path / "left.gpurec"
    async with recording_fleet(fleet, path) as recorder:
        await wait_until_async(lambda: recorder.samples >= 10, 20, "samples of a and b")
        fleet.remove_node("b", "left the store (last sample 11m ago)")
        marked = recorder.samples
        await wait_until_async(lambda: recorder.samples >= marked + 20, 20, "samples of a alone")
    frames = frames_of(path)
    records = [r for f in frames for r in f if not r.get("k")]
    leave = next(r for r in records if r.get("leave"))
    assert (leave["n"], leave["leave"]) == ("b", "left the store (last sample 11m ago)")
    assert not [r for r in records if r["n"] == "b" and r["t"] > leave["t"]]
    last = frames[-1]
    assert [r["leave"] for r in last if r.get("k") and r["n"] == "b"] == [leave["leave"]]
    assert not [r for r in last if r.get("k") and r["n"] == "b" and "m" in r]

    reader = RecordingReader(path)
    # its last sample
    t_last = max(r["t"] for r in records if r["n"] == "b" and (r.get("m") or {}).get("seq"))
    before = last_samples(frames, t_last)["b"]
    replayer = Replayer(reader, speed=1e6)
    replay_fleet = replayer.fleet()
    assert replay_fleet.names == ["a", "b"]
    await replay_fleet.start()
    play = asyncio.create_task(replayer.play())
    try:
        await wait_until_async(lambda: replay_fleet.names == ["a"], 20, "b leaving the replay")
        replayer.toggle_pause()
        replayer.seek(t_last)  # before it left: b as it was then
        await wait_until_async(
            lambda: (
                "b" in replay_fleet.names
                and tuple((g.util_gpu, g.temp) for g in replay_fleet.snapshot("b").gpus)
                == recorded(before)
            ),
            20,
            "b back before its leave",
        )
        replayer.seek(reader.end)  # a frame whose keyframes say b left
        await wait_until_async(lambda: replay_fleet.names == ["a"], 20, "b gone at the end")
    finally:
        play.cancel()
        await replay_fleet.stop()
    # a replay that starts after the leave has no b at all
    late = Replayer(RecordingReader(path), start=reader.end)
    assert late.fleet().names == ["a"]
