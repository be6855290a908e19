"""One srun step for all nodes against one srun per node, on the test Slurm of N nodes.

Starts the multi-node test Slurm (``SlurmCluster(nodes=N)``: one slurmd per network namespace on
this machine), holds all N nodes with one job, then for each ``srun_step`` mode ("shared": one
``srun`` over every node, "per-node": one ``srun`` per node) builds the real fleet from a config
(simulated GPUs, 1 Hz) and measures on the login side:

- time from fleet start to every node's first sample ("all live");
- CPU (this process + its srun children: user + system) spent connecting, and per second while
  streaming at 1 Hz for ``--stream`` seconds;
- processes on the login side (this one and every descendant: the sruns and their helpers);
- time to stop the fleet, and that no agent is left on any node.

The nodes share this machine's two cores with the login side: the agents' own work slows both.

    python3 benchmarks/srun_fanout.py                 # 64 nodes x 8 simulated GPUs
    python3 benchmarks/srun_fanout.py --nodes 16 --stream 10
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpuctl.config import parse_config  # noqa: E402
from gpuctl.fleet.build import fleet_from_config  # noqa: E402
from gpuctl_tests.harness import descendants  # noqa: E402
from gpuctl_tests.harness.slurm import SlurmCluster  # noqa: E402


def _proc_cpu(pid: int) -> float:
    """CPU seconds of one process, in nanoseconds' precision (schedstat: a process that runs
    0.1 ms a second never moves its clock-tick counters in /proc/PID/stat)."""
    total = 0
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():  # every thread: srun's I/O has its own
            with contextlib.suppress(OSError, IndexError, ValueError):
                total += int((task / "schedstat").read_text().split()[0])
    except OSError:
        pass
    return total / 1e9


def login_side(cluster: SlurmCluster) -> set[int]:
    """This process and its descendants, the test Slurm's daemons (the "nodes") left out."""
    return descendants([os.getpid()]) - cluster.processes()


class LoginCpu:
    """CPU seconds of the login side: this process and the sruns it started, read live from
    /proc (an srun that ended keeps its last reading)."""

    def __init__(self, cluster: SlurmCluster) -> None:
        self.cluster = cluster
        self.seen: dict[int, float] = {}

    def __call__(self) -> tuple[float, float]:
        """(this process, its sruns) CPU seconds so far."""
        me = resource.getrusage(resource.RUSAGE_SELF)
        for pid in login_side(self.cluster) - {os.getpid()}:
            self.seen[pid] = _proc_cpu(pid)
        return me.ru_utime + me.ru_stime, sum(self.seen.values())


def agents_left(job: str) -> int:
    n = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"\0agent\0" in cmd and f"SLURM_JOB_ID={job}\0".encode() in env:
            n += 1
    return n


async def measure(cluster: SlurmCluster, text: str, stream: float, job: str) -> dict[str, float]:
    nodes = len(cluster.nodes)
    fleet = fleet_from_config(parse_config(text))
    cpu = LoginCpu(cluster)
    c0, t0 = cpu(), time.monotonic()
    await fleet.start()
    while sum(1 for s in fleet.snapshots() if s.last_sample_t is not None) < nodes:
        await asyncio.sleep(0.05)  # a polling period: the figure is the time itself
        if time.monotonic() - t0 > 120:
            raise SystemExit("not all nodes live after 120 s")
    live = time.monotonic() - t0
    c1 = cpu()
    procs = len(login_side(cluster))
    await asyncio.sleep(2)  # let connection work settle before the steady window
    c2, t2 = cpu(), time.monotonic()
    await asyncio.sleep(stream)
    c3 = cpu()
    took = time.monotonic() - t2
    t3 = time.monotonic()
    await fleet.stop()
    stopped = time.monotonic() - t3
    for _ in range(200):
        if not agents_left(job):
            break
        await asyncio.sleep(0.1)  # a polling period, bounded
    return {
        "live": live,
        "cpu_connect": sum(c1) - sum(c0),
        "cpu_per_s": (sum(c3) - sum(c2)) / took,
        "gpuctl_per_s": (c3[0] - c2[0]) / took,
        "srun_per_s": (c3[1] - c2[1]) / took,
        "procs": procs,
        "stop": stopped,
        "left": agents_left(job),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--gpus", type=int, default=8, help="simulated GPUs per node")
    ap.add_argument("--stream", type=float, default=10.0, help="seconds of steady streaming")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="srun-fanout-") as tmp:
        t = time.monotonic()
        slurm = SlurmCluster(Path(tmp) / "slurm", nodes=args.nodes, cpus=2)
        print(f"test Slurm of {args.nodes} nodes up in {time.monotonic() - t:.1f} s")
        try:
            out = slurm.run(["sbatch", "--parsable", f"-N{args.nodes}", "--wrap", "sleep 3600"])
            job = out.stdout.strip().split(";")[0]
            while slurm.run(["squeue", "-h", "-j", job, "-o", "%T"]).stdout.strip() != "RUNNING":
                time.sleep(0.1)
            width = len(slurm.nodes[0]) - 4
            rows = {}
            for mode in ("shared", "per-node"):
                text = "\n".join(
                    [
                        "[clusters.hpc]",
                        'via = "srun"',
                        f'nodes = "node[{1:0{width}d}-{args.nodes:0{width}d}]"',
                        f"jobid = {job}",
                        f'slurm_conf = "{slurm.conf_path}"',
                        f'bundle_dir = "{Path(tmp) / "shared"}"',
                        f'simulate = "{args.gpus}:H100"',
                        "interval = 1.0",
                        f'srun_step = "{mode}"',
                    ]
                )
                rows[mode] = asyncio.run(measure(slurm, text, args.stream, job))
                print(f"{mode}: {rows[mode]}", flush=True)
        finally:
            slurm.stop()
    print()
    print(f"{args.nodes} nodes x {args.gpus} GPUs, 1 Hz, streaming window {args.stream:g} s")
    print(
        f"{'srun_step':<10} {'all live':>9} {'CPU connect':>12} {'CPU/s stream':>13} "
        f"{'(gpuctl + srun)':>16} {'login procs':>12} {'stop':>6} {'agents left':>12}"
    )
    for mode, r in rows.items():
        print(
            f"{mode:<10} {r['live']:>8.2f}s {r['cpu_connect']:>11.2f}s {r['cpu_per_s']:>12.3f}s "
            f"{r['gpuctl_per_s']:>8.3f} + {r['srun_per_s']:.3f} "
            f"{r['procs']:>12.0f} {r['stop']:>5.2f}s {r['left']:>12.0f}"
        )


if __name__ == "__main__":
    main()
