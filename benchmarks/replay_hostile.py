"""Hostile recordings benchmark (issue 28, section 3): what crafted files cost ``gpuctl replay``.

Builds the issue's files (the layout of ``gpuctl.fleet.recording.format``, by the builders of
``gpuctl_tests/fleet/test_record_hostile.py``) and runs, in a fresh process each, for this tree
and (``--old DIR``) another checkout of gpuctl:

- ``gpuctl replay FILE --export-csv OUT``: wall time, peak RSS, CSV bytes, the first line said;
- the replay screen (``ReplayApp``, headless) until its first node is on screen: wall time, peak
  RSS (``--screen``, for the header naming 100,000 nodes).

The files: ``index-bomb`` (an index naming one frame of one sample 4,800,000 times, 8 KB),
``frame-bomb`` (a frame of 64 MiB of "1\\n" lines in 6 KB of zstd), ``nodes-100k`` (a header
naming 100,000 nodes) and ``normal`` (the same frame, read right: the cost of gpuctl itself);
first, ``normal-big`` (a real demo recording's frames repeated): a normal file's export time
old and new, alternated, to show what the checks cost.

Usage: python benchmarks/replay_hostile.py [--old /tmp/old-checkout] [--screen]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import zstandard  # noqa: E402

from gpuctl_tests.fleet.test_record_hostile import (  # noqa: E402
    FRAME,
    PAYLOAD,
    T0,
    TRAILER,
    first_frame_offset,
    header,
    recording,
)

# In a small process of its own: a child's peak RSS does not start at a big parent's.
MEASURE = """
import json, resource, subprocess, sys, time
t = time.monotonic()
r = subprocess.run(sys.argv[1:], capture_output=True, text=True)
wall = time.monotonic() - t
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(json.dumps([r.returncode, r.stderr, wall, peak]))
"""

READ = """
import sys, time
from gpuctl.fleet.recording.reader import RecordingReader
reader = RecordingReader(sys.argv[1])
t = time.perf_counter()
n = sum(1 for _ in reader.records())
print(time.perf_counter() - t, n)
"""

SCREEN = """
import asyncio, sys, tempfile
from pathlib import Path
from gpuctl.fleet.recording.reader import RecordingReader
from gpuctl.fleet.recording.replayer import Replayer
from gpuctl.tui.replay import ReplayApp
async def go():
    state = Path(tempfile.mkdtemp())
    app = ReplayApp(Replayer(RecordingReader(sys.argv[1])), state_dir=state)
    async with app.run_test(size=(120, 36)) as pilot:
        while not app.overview.nodes.lines:
            await pilot.pause(0.05)
asyncio.run(go())
"""


def files(folder: Path) -> dict[str, Path]:
    head = header()
    at = first_frame_offset(head)
    entries = b",".join([b"[%r,%d]" % (T0, at)] * 4_800_000)
    built = {
        "normal": recording(head, [PAYLOAD]),
        "index-bomb": recording(head, [PAYLOAD], b"[" + entries + b"]"),
        "frame-bomb": recording(head, [PAYLOAD + b"1\n" * (32 << 20), PAYLOAD]),
        "nodes-100k": recording(header(["a", *(f"n{i}" for i in range(100_000))]), [PAYLOAD]),
    }
    out = {}
    for name, data in built.items():
        out[name] = folder / f"{name}.gpurec"
        out[name].write_bytes(data)
    return out


def big_normal(folder: Path, copies: int) -> Path:
    """A real recording of the demo (6 nodes, 48 GPUs; 6 s in 1-s frames) with its frames
    repeated ``copies`` times: what a normal file costs to read, old and new alike."""
    small = folder / "demo.gpurec"
    cmd = ["record", str(small), "--demo", "--duration", "6s", "--frame-seconds", "1"]
    subprocess.run(
        [sys.executable, "-m", "gpuctl", *cmd],
        check=True,
        capture_output=True,
        cwd=REPO,
    )
    data = small.read_bytes()
    at = data.index(b"\n") + 1
    head, frames = data[:at], []
    while at + FRAME.size <= len(data):
        tag, length, _, _ = FRAME.unpack_from(data, at)
        if tag != b"GRF1":
            break
        frames.append(data[at : at + FRAME.size + length])
        at += FRAME.size + length
    out = bytearray(head)
    offsets = []
    for _ in range(copies):
        for f in frames:
            offsets.append(len(out))
            out += f
    index = zstandard.ZstdCompressor().compress(json.dumps([[T0, o] for o in offsets]).encode())
    trailer_at = len(out)
    out += FRAME.pack(b"GRI1", len(index), 0, 0) + index + TRAILER.pack(b"GRECEND1", trailer_at)
    path = folder / "normal-big.gpurec"
    path.write_bytes(out)
    return path


def measure(tree: Path, *cmd: str) -> tuple[int, str, float, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    r = subprocess.run(
        [sys.executable, "-c", MEASURE, sys.executable, *cmd],
        capture_output=True,
        text=True,
        cwd=tree,
        env=env,
        check=True,
    )
    rc, err, wall, peak = json.loads(r.stdout)
    return rc, err, wall, peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", type=Path, help="another gpuctl checkout to compare with")
    ap.add_argument("--screen", action="store_true", help="also the screen on nodes-100k")
    ap.add_argument("--copies", type=int, default=50, help="repeats of the demo's frames")
    args = ap.parse_args()
    trees = [("this", REPO)] + ([("old", args.old.resolve())] if args.old else [])
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        big = big_normal(folder, args.copies)
        print(
            f"normal-big: {big.stat().st_size} bytes; reading every record, in the child "
            "(no start-up), alternated, median of 5:"
        )
        walls: dict[str, list[float]] = {label: [] for label, _ in trees}
        for _ in range(5):
            for label, tree in trees:
                env = {**os.environ, "PYTHONPATH": str(tree)}
                r = subprocess.run(
                    [sys.executable, "-c", READ, str(big)],
                    capture_output=True,
                    text=True,
                    cwd=tree,
                    env=env,
                    check=True,
                )
                walls[label].append(float(r.stdout.split()[0]))
                records = r.stdout.split()[1]
        median = {label: sorted(w)[2] for label, w in walls.items()}
        for label, wall in median.items():
            print(
                f"  {label:4} {wall:6.3f} s for {records} records "
                f"({wall / median['this']:.2f} x this)"
            )
        for name, path in files(folder).items():
            print(f"{name}: {path.stat().st_size} bytes")
            for label, tree in trees:
                csv = folder / f"{name}-{label}.csv"
                cmd = ("-m", "gpuctl", "replay", str(path), "--export-csv", str(csv))
                rc, err, wall, peak = measure(tree, *cmd)
                said = err.splitlines()[0] if err else ""
                size = csv.stat().st_size if csv.exists() else 0
                print(
                    f"  {label:4} export-csv: exit {rc}, {wall:6.2f} s, {peak:6.0f} MiB peak, "
                    f"{size} bytes of CSV; {said[:110]}"
                )
            if args.screen and name in ("nodes-100k", "normal"):
                for label, tree in trees:
                    rc, err, wall, peak = measure(tree, "-c", SCREEN, str(path))
                    said = err.strip().splitlines()[-1] if rc else ""
                    print(
                        f"  {label:4} screen:     exit {rc}, {wall:6.2f} s, {peak:6.0f} MiB "
                        f"peak {said[:110]}"
                    )


if __name__ == "__main__":
    main()
