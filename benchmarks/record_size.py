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

Usage: python benchmarks/record_size.py [--nodes 32] [--gpus 8] [--seconds 30] [--interval 0.2]
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
from gpuctl.fleet.record import FRAME_SECONDS, Recorder, RecordingReader, Replayer  # noqa: E402


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
    args = ap.parse_args()
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
