"""``map`` through Slurm with a cap of 64 running: gpuctl's chunks against one task per item.

    python3 benchmarks/map_cap.py [--items 1000 10000] [--cap 64] [--baseline-limit 600]

Starts the test harness's one-node Slurm (declared with ``--cap`` CPUs, so the cap and not the
node decides how many run) and, for each item count, maps ``x + 1`` over the items:

- gpuctl: ``Executor("slurm", max_running=cap).map(...)``: chunks of ``chunk_size(items, cap)``,
  one array ``--array=0-N%cap``;
- one array task per item (what submitit does): submitit's ``map_array`` with
  ``slurm_array_parallelism=cap`` when submitit imports here, else gpuctl itself with
  ``chunksize=1`` (said in the output).

Prints wall time and this (login) process's CPU time (user + system, its own and that of the
Slurm commands it ran), for each. The one-task-per-item run is skipped for an item count whose
estimate (from the smaller counts' run, linearly) passes ``--baseline-limit`` seconds, or that
is over Slurm's default MaxArraySize (1001): the output says so. VENV1 is pyenv's 3.6.15 when
present, VENV2 is this Python.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpuctl.jobs import Executor  # noqa: E402
from gpuctl.jobs.executor import chunk_size  # noqa: E402
from gpuctl_tests.harness.slurm import SlurmCluster  # noqa: E402

VENV1 = Path.home() / ".pyenv" / "versions" / "3.6.15" / "bin" / "python"
MAX_ARRAY_SIZE = 1001  # Slurm's default: an array index above 1000 is refused


def plus_one(x: int) -> int:
    return x + 1


def cpu_seconds() -> float:
    """User + system CPU time of this process and of the children it waited for."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def measure(run: Callable[[], list[int]], items: int) -> tuple[float, float]:
    """(wall seconds, login-side CPU seconds) of ``run``; checks its results."""
    c0, t0 = cpu_seconds(), time.perf_counter()
    out = run()
    wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    if out != [i + 1 for i in range(items)]:
        raise SystemExit(f"wrong results for {items} items")
    return wall, cpu


def submitit_way(folder: Path, slurm: SlurmCluster, cap: int) -> Callable[[int], list[int]]:
    import logging

    import submitit

    # no accounting in the test Slurm: submitit says so at each sacct, and reads result files
    logging.getLogger("submitit").setLevel(logging.ERROR)

    def run(items: int) -> list[int]:
        ex = submitit.SlurmExecutor(folder=str(folder / f"submitit-{items}"))
        ex.update_parameters(
            partition=slurm.partition, array_parallelism=cap, cpus_per_task=1, time=60
        )
        jobs = ex.map_array(plus_one, range(items))
        return [j.result() for j in jobs]

    return run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--cap", type=int, default=64)
    ap.add_argument("--baseline-limit", type=float, default=600.0)
    args = ap.parse_args()
    venv1 = str(VENV1) if VENV1.exists() else "python3"
    work = Path(tempfile.mkdtemp(prefix="gpuctl-mapcap-"))
    slurm = SlurmCluster(work / "slurm", cpus=args.cap)
    os.environ["SLURM_CONF"] = str(slurm.conf_path)  # for submitit's sbatch
    try:
        ex = Executor(
            "slurm",
            supervisor_python=venv1,
            python=sys.executable,
            partition=slurm.partition,
            slurm_conf=str(slurm.conf_path),
            job_root=str(work / "jobs"),
            store=False,
            max_running=args.cap,
        )
        ex.submit(plus_one, 0).result(120)  # VENV2 probed, Slurm's first pass: not timed
        try:
            baseline: Callable[[int], list[int]] = submitit_way(work, slurm, args.cap)
            how = "submitit map_array"
        except ImportError:

            def baseline(items: int) -> list[int]:
                return list(ex.map(plus_one, range(items), chunksize=1))

            how = "gpuctl chunksize=1 (submitit does not import here)"
        per_item: float | None = None  # seconds per item of the one-task-per-item way
        print(f"Slurm: 1 node, {args.cap} CPUs, cap {args.cap}; VENV1 {venv1}")
        for n in sorted(args.items):
            wall, cpu = measure(lambda n=n: list(ex.map(plus_one, range(n))), n)
            tasks = -(-n // chunk_size(n, args.cap))
            print(
                f"{n:>6} items, gpuctl ({tasks} array tasks of {chunk_size(n, args.cap)}): "
                f"wall {wall:7.1f} s, login CPU {cpu:6.1f} s"
            )
            if per_item is not None and per_item * n > args.baseline_limit:
                print(
                    f"{n:>6} items, one task per item: skipped (estimate "
                    f"{per_item * n:.0f} s > {args.baseline_limit:.0f} s)"
                )
                continue
            if n > MAX_ARRAY_SIZE - 1:
                print(f"{n:>6} items, one task per item: skipped (over MaxArraySize)")
                continue
            bwall, bcpu = measure(lambda n=n: baseline(n), n)
            per_item = bwall / n
            print(
                f"{n:>6} items, one task per item ({how}): wall {bwall:7.1f} s, login CPU "
                f"{bcpu:6.1f} s (one-per-item / gpuctl: wall {bwall / wall:.2f}x, login CPU "
                f"{bcpu / max(cpu, 1e-3):.2f}x)"
            )
    finally:
        slurm.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
