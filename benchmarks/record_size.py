"""Record and replay benchmark: bytes per GPU per hour, and replay speed with the screen open.

Records a simulated cluster (the real agent loop with simulated GPUs, ``ThreadSimLink``: values
that move, one process per GPU) through the real ``Recorder``. To save time it samples every
``--interval`` seconds and closes a frame every ``10 * interval`` s of stream, so that a frame
holds as many samples as at 1 Hz with the default 10 s frames; the size per GPU-sample is then
the size at 1 Hz, and bytes per GPU per hour is that times 3,600. It prints that, the raw JSON
size and the compression ratio.

Then it replays the file on the real screen (``ReplayApp``, headless, 160x48) at the highest
speed and prints the samples the fleet took in per second (node samples and GPU samples) from
the start of the replay until every node shows its last recorded sample.

First (``--shapes``, or alone with ``--shapes-only``) it compares the sample shapes of protocol
1 (every field of every GPU in every sample) and protocol 2 (nulls, defaults and what the hello
holds left out) on the same readings: the simulated reader of each demo node on a stepped 1 Hz
clock for ``--seconds`` s, each sample encoded both ways (``protocol.encode``: the bytes on the
SSH link and in the agent's pipe), and the records written both ways through the real
``RecordingWriter`` in 10 s frames that start with every node's hello and last sample, as the
``Recorder`` writes them (the record file's bytes). Sizes only: nothing is timed.

Usage: python benchmarks/record_size.py [--nodes 32] [--gpus 8] [--seconds 30] [--interval 0.2]
           [--shapes | --shapes-only]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpuctl.fleet.demo import demo_nodes  # noqa: E402
from gpuctl.fleet.fleet import simulated_fleet  # noqa: E402
from gpuctl.fleet.recording.reader import RecordingReader  # noqa: E402
from gpuctl.fleet.recording.replayer import Replayer  # noqa: E402
from gpuctl.fleet.recording.writer import FRAME_SECONDS, Recorder, RecordingWriter  # noqa: E402
from gpuctl.node import protocol  # noqa: E402
from gpuctl.node.readers.sim import SimReader  # noqa: E402

SLOW_FIELDS = ("ecc", "retired_pages", "remapped_rows")


def shapes(nodes: int, gpus: int, seconds: int) -> None:
    """Bytes per GPU-sample on the wire and in a record file, protocol 1 and 2, same readings."""
    t0 = 1_700_000_000.0
    names = demo_nodes(nodes, gpus)
    now = [0.0]
    readers = {}
    for i, (name, spec) in enumerate(names):
        reader = SimReader.from_spec(spec, seed=i, clock=lambda: now[0])
        reader.wall = lambda: t0 + now[0]
        readers[name] = reader
    hellos = {
        name: {"type": "hello", "protocol": 2, "hostname": name, "gpus": r.static()}
        for name, r in readers.items()
    }
    wire = {1: 0, 2: 0}
    other = {"slow": 0, "array": 0}
    records: dict[int, list[list[dict[str, object]]]] = {1: [], 2: []}
    last: dict[int, dict[str, dict[str, object]]] = {1: {}, 2: {}}
    for k in range(seconds):
        now[0] = float(k)
        t = t0 + k
        if k % int(FRAME_SECONDS) == 0:  # a new frame: every node's hello and last sample
            for v in (1, 2):
                frame: list[dict[str, object]] = []
                for name in readers:
                    frame.append({"t": t, "n": name, "k": 1, "m": {**hellos[name], "protocol": v}})
                    if name in last[v]:
                        frame.append({"t": t, "n": name, "k": 1, "m": last[v][name]})
                records[v].append(frame)
        for name, r in readers.items():
            gpu_list = r.sample(slow=k % protocol.SLOW_EVERY == 0)
            parents = r.parents()
            host = r.host()
            msgs = {
                1: {
                    "type": "sample",
                    "t": t,
                    "seq": k,
                    "gpus": gpu_list,
                    "parents": parents,
                    "host": host,
                },
                2: {
                    "type": "sample",
                    "t": t,
                    "seq": k,
                    "gpus": protocol.compact_gpus(gpu_list, hellos[name]["gpus"]),
                    "parents": protocol.compact_records(parents),
                    "host": host,
                },
            }
            # Not built, for comparison: protocol 2 with the slow fields only in the samples
            # that read them (the login side would carry them forward), and protocol 1's GPUs
            # as arrays in SAMPLE_FIELDS order (msgspec's array_like): wire bytes only.
            slow_only = [
                {f: v for f, v in g.items() if f not in SLOW_FIELDS}
                for g in msgs[2]["gpus"]  # type: ignore[attr-defined]
            ]
            arrays = [[g.get(f) for f in protocol.SAMPLE_FIELDS] for g in gpu_list]
            for variant, gl in (("slow", slow_only), ("array", arrays)):
                if variant != "slow" or k % protocol.SLOW_EVERY != 0:
                    m = {**msgs[2 if variant == "slow" else 1], "gpus": gl}
                else:
                    m = msgs[2]
                other[variant] += len(protocol.encode(m))
            for v, m in msgs.items():
                wire[v] += len(protocol.encode(m))
                last[v][name] = m
                records[v][-1].append({"t": t, "n": name, "m": m})
    gpu_samples = nodes * gpus * seconds
    file_bytes = {}
    for v in (1, 2):
        path = Path(tempfile.mkdtemp(prefix="gpuctl-bench-")) / f"protocol{v}.gpurec"
        writer = RecordingWriter(path, names, started=t0)
        for frame in records[v]:
            payload = b"".join(protocol.encode(rec) for rec in frame)
            writer.write_frame(payload, float(frame[0]["t"]), float(frame[-1]["t"]))
        writer.close()
        file_bytes[v] = path.stat().st_size
    print(
        f"shapes: {nodes} nodes x {gpus} GPUs, {seconds} samples each at 1 Hz, the same readings"
        " (bytes per GPU-sample)"
    )
    for v in (1, 2):
        print(
            f"  protocol {v}: wire {wire[v] / gpu_samples:6.1f}  record file "
            f"{file_bytes[v] / gpu_samples:5.1f}"
        )
    print(
        f"  protocol 2 / 1: wire {wire[2] / wire[1]:.2f}x, record file "
        f"{file_bytes[2] / file_bytes[1]:.2f}x"
    )
    print(
        f"  not built: protocol 2 with ECC/retired pages/remapped rows only when read (every "
        f"{protocol.SLOW_EVERY}th sample): wire {other['slow'] / gpu_samples:.1f}; protocol 1 "
        f"with each GPU an array (array_like): wire {other['array'] / gpu_samples:.1f}"
    )


async def record(path: Path, nodes: int, gpus: int, seconds: float, interval: float) -> int:
    fleet = simulated_fleet(demo_nodes(nodes, gpus), interval=interval, concurrency=nodes)
    recorder = Recorder(fleet, path, frame_seconds=FRAME_SECONDS * interval)
    await fleet.start()
    await asyncio.sleep(seconds)  # the recording's length: a timer, not synchronisation
    await fleet.stop()
    recorder.close()
    return recorder.samples


def sizes(path: Path) -> tuple[int, int, int]:
    """(GPU samples, raw JSON bytes of the records, file bytes)."""
    import json

    reader = RecordingReader(path)
    gpu_samples = raw = 0
    for _i, rec in reader.records():
        raw += len(json.dumps(rec, separators=(",", ":"))) + 1
        m = rec.get("m")
        if isinstance(m, dict) and m.get("type") == "sample" and not rec.get("k"):
            gpu_samples += len(m.get("gpus") or ())
    reader.close()
    return gpu_samples, raw, path.stat().st_size


async def replay(path: Path) -> tuple[int, float]:
    from gpuctl.tui.replay import ReplayApp

    reader = RecordingReader(path)
    last: dict[str, float] = {}
    for _i, rec in reader.records():
        m = rec.get("m")
        if isinstance(m, dict) and m.get("type") == "sample" and not rec.get("k"):
            last[rec["n"]] = float(m["t"])
    replayer = Replayer(reader, speed=1e6)
    replayer.paused = True  # until the screen is up: the timing is the replay's alone
    app = ReplayApp(replayer, state_dir=Path(tempfile.mkdtemp(prefix="gpuctl-bench-")))
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause(0.5)
        start = time.monotonic()
        replayer.toggle_pause()
        while not (
            replayer.ended
            and all(app.fleet.snapshot(n).last_sample_t == t for n, t in last.items())
        ):
            await pilot.pause(0.01)  # a poll: the replay runs as fast as it can meanwhile
        elapsed = time.monotonic() - start
    return replayer.samples_played, elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=32)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--interval", type=float, default=0.2)
    ap.add_argument("--shapes", action="store_true", help="compare protocol 1 and 2 first")
    ap.add_argument("--shapes-only", action="store_true", help="only compare protocol 1 and 2")
    args = ap.parse_args()
    if args.shapes or args.shapes_only:
        shapes(args.nodes, args.gpus, max(1, round(args.seconds)))
        if args.shapes_only:
            return
    path = Path(tempfile.mkdtemp(prefix="gpuctl-bench-")) / "bench.gpurec"
    samples = asyncio.run(record(path, args.nodes, args.gpus, args.seconds, args.interval))
    gpu_samples, raw, size = sizes(path)
    per = size / gpu_samples
    print(
        f"record: {args.nodes} nodes x {args.gpus} GPUs, {samples} node samples "
        f"({gpu_samples} GPU samples) in {size / 1024:.0f} KiB: {per:.1f} bytes per GPU sample "
        f"= {per * 3600 / 1024:.0f} KiB per GPU per hour at 1 Hz "
        f"({per * 3600 * 24 * 1000 / 2**30:.1f} GiB per day for 1,000 GPUs); raw JSON "
        f"{raw / gpu_samples:.0f} bytes per GPU sample, compression x{raw / size:.1f}"
    )
    played, elapsed = asyncio.run(replay(path))
    print(
        f"replay with the screen open: {played} node samples in {elapsed:.2f} s = "
        f"{played / elapsed:.0f} node samples/s = {played * args.gpus / elapsed:.0f} GPU "
        f"samples/s ({played * args.gpus / elapsed / (args.nodes * args.gpus):.0f}x real "
        f"time for this cluster at 1 Hz)"
    )


if __name__ == "__main__":
    main()
