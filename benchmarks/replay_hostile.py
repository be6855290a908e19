"""Hostile recordings benchmark (issue 28, section 3): what crafted files cost ``gpuctl replay``.

Builds the issue's files (the layout of ``gpuctl.fleet.record``, by the builders of
``gpuctl_tests/fleet/test_record_hostile.py``) and runs, in a fresh process each, for this tree
and (``--old DIR``) another checkout of gpuctl:

- ``gpuctl replay FILE --export-csv OUT``: wall time, peak RSS, CSV bytes, the first line said;
- the replay screen (``ReplayApp``, headless) until its first node is on screen: wall time, peak
  RSS (``--screen``, for the header naming 100,000 nodes).

The files: ``index-bomb`` (an index naming one frame of one sample 4,800,000 times, 8 KB),
``frame-bomb`` (a frame of 64 MiB of "1\\n" lines in 6 KB of zstd), ``nodes-100k`` (a header
naming 100,000 nodes) and ``normal`` (the same frame, read right: the cost of gpuctl itself).

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

from gpuctl_tests.fleet.test_record_hostile import (  # noqa: E402
    PAYLOAD,
    T0,
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

SCREEN = """
import asyncio, sys, tempfile
from gpuctl.fleet.record import RecordingReader, Replayer
from gpuctl.tui.replay import ReplayApp
async def go():
    app = ReplayApp(Replayer(RecordingReader(sys.argv[1])), state_dir=tempfile.mkdtemp())
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
    args = ap.parse_args()
    trees = [("this", REPO)] + ([("old", args.old.resolve())] if args.old else [])
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
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
