"""What comparing a run with its node's history costs as the history grows.

    python3 benchmarks/accept_history.py [--runs 1000] [--gpus 8]

Records ``--runs`` runs of one node (``--gpus`` GPUs x 3 dtypes of COMPUTE, MEMBW per GPU, busbw;
every 10th run a FAIL, so the healthy-only baseline has to skip rows), then times
``HistoryStore.record`` (compare with the healthy past, the falling check, the missing-GPU check,
and the insert) at 10, 100 and ``--runs`` earlier runs. Prints milliseconds per record.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpuctl.accept.history import HistoryStore  # noqa: E402


def report(t: float, gpus: int, verdict: str) -> dict[str, Any]:
    devices = [
        {
            "label": f"gpu{i}",
            "results": [{"dtype": d, "tflops": 700.0 + i} for d in ("fp32", "tf32", "bf16")],
        }
        for i in range(gpus)
    ]
    return {
        "started": t,
        "device": "cuda",
        "quick": False,
        "verdict": verdict,
        "options": {"dtypes": ["fp32", "tf32", "bf16"]},
        "sections": {
            "compute": {"verdict": "PASS", "devices": devices},
            "membw": {
                "verdict": "PASS",
                "devices": [{"label": f"gpu{i}", "gbps": 3000.0} for i in range(gpus)],
            },
            "ddp_allreduce": {"busbw_gbps": 150.0, "world_size": gpus, "nnodes": 1},
        },
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=1000)
    p.add_argument("--gpus", type=int, default=8)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = HistoryStore(Path(tmp) / "h.sqlite")
        t = 1000.0
        for mark in sorted({10, 100, a.runs}):
            while t - 1000.0 < mark:
                verdict = "FAIL" if int(t) % 10 == 0 else "PASS"
                store.record("gpu01", report(t, a.gpus, verdict))
                t += 1
            times = []
            for _ in range(5):
                t0 = time.perf_counter()
                store.compare("gpu01", report(t, a.gpus, "PASS"))
                times.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            store.record("gpu01", report(t, a.gpus, "PASS"))
            rec = time.perf_counter() - t0
            t += 1
            print(
                f"{mark:5d} earlier runs, {a.gpus} GPUs: compare "
                f"{1000 * statistics.median(times):.1f} ms (median of 5), "
                f"record {1000 * rec:.1f} ms"
            )


if __name__ == "__main__":
    main()
