"""Bytes a ``map`` writes on the node when its function closes over a large tensor.

    python3 benchmarks/map_shared.py [--mib 64] [--items 16]

Maps a function that closes over a ``--mib`` MiB torch tensor over ``--items`` items, one item
per chunk, on the local target (VENV1 pyenv's 3.6.15 when present, VENV2 this Python, which
needs torch), checks the results, and prints the bytes of every payload file under the job
root (the chunks' ``payload.pkl`` and the map's ``shared/`` file) and how long ``map_jobs``
took. Before the shared part went once per map this was ``--items`` copies of the tensor.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpuctl.jobs import Executor  # noqa: E402

VENV1 = Path.home() / ".pyenv" / "versions" / "3.6.15" / "bin" / "python"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=64, help="size of the tensor closed over")
    p.add_argument("--items", type=int, default=16, help="items (one chunk each)")
    args = p.parse_args()
    import torch

    weights = torch.randn(args.mib << 18)  # float32: 4 bytes each

    def score(i: int) -> float:
        return float(weights[i])

    root = tempfile.mkdtemp(prefix="map-shared-")  # removed at the end
    supervisor = str(VENV1) if VENV1.exists() else "python3"
    ex = Executor("local", supervisor_python=supervisor, python=sys.executable, job_root=root)
    t = time.monotonic()
    jobs = ex.map_jobs(score, range(args.items), chunksize=1)
    took = time.monotonic() - t
    got = [job.result(600)[0][1] for job in jobs]
    assert got == [float(weights[i]) for i in range(args.items)]
    total = 0
    for folder, _, names in os.walk(root):
        for name in names:
            if name == "payload.pkl" or os.path.basename(folder) == "shared":
                total += os.path.getsize(os.path.join(folder, name))
    shutil.rmtree(root, ignore_errors=True)
    print(
        f"{args.items} chunks over a {args.mib} MiB tensor: {total / 2**20:.1f} MiB of payload "
        f"on the node, map_jobs {took:.2f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
