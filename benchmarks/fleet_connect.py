"""How fast the fleet reaches K real sshd nodes, and how fresh their samples stay.

For each K (default 8, 32, 64) this starts K OpenSSH servers on 127.0.0.1 (the test harness),
then measures, with the real ``Fleet`` and ``SshLink``:

- cold: fleet start -> every node live (hello) and -> every node's first sample, with the
  bundle missing (one SFTP upload: the nodes share this machine's disk, as a shared home);
- warm: the same again with the bundle in place (the usual case);
- p95 sample age over ~10 s with the agents sampling at 1 Hz (ages read every 0.25 s);
- login-side CPU (this process: user + system) spent connecting (readiness is counted from the
  fleet's own updates, O(1) each), the samples the fleet took in meanwhile from the nodes
  already live, and the connections' own CPU (the login CPU less those samples at the CPU a
  sample costs while streaming); the node side's CPU over the same time (sshd, sessions,
  agents: every process below this one); login-side CPU per second while streaming (nodes and
  login side share this machine's cores: node-side work slows both);
- K sequential ``ssh -F ssh_config node true`` with the OpenSSH client, for comparison.

Targets (issue 3): 64 nodes live in < 5 s; p95 sample age < 1.5 s. Issue 16: 512 nodes.

    python3 benchmarks/fleet_connect.py            # K = 8, 32, 64
    python3 benchmarks/fleet_connect.py 8 16 --stream 5
    python3 benchmarks/fleet_connect.py 128 256 512 --stream 10 --no-seq
    python3 benchmarks/fleet_connect.py 256 --stream 0 --no-seq --profile 40   # where it goes
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import os
import pstats
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpuctl.config import load_config  # noqa: E402
from gpuctl.core.deadline import wait_for  # noqa: E402
from gpuctl.core.model import NodeSnapshot, NodeState  # noqa: E402
from gpuctl.fleet.build import fleet_from_config  # noqa: E402
from gpuctl_tests.harness import descendants  # noqa: E402
from gpuctl_tests.harness.sshd import SshCluster  # noqa: E402


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def node_cpu_seconds() -> float:
    """CPU of the node side so far: every process below this one (the sshd listeners, their
    sessions, the agents) with the children each has reaped, and this process's reaped
    children (``ssh -G``). The login process itself is not in it."""
    tick = os.sysconf("SC_CLK_TCK")
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = r.ru_utime + r.ru_stime
    me = os.getpid()
    for pid in descendants([me]) - {me}:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        total += sum(int(f) for f in fields[11:15]) / tick  # utime stime cutime cstime
    return total


def dump_tasks() -> None:
    """Where the event loop's tasks wait, counted by their innermost frame (a hang's map)."""
    where: collections.Counter[str] = collections.Counter()
    for task in asyncio.all_tasks():
        frames = task.get_stack()
        if frames:
            f = frames[-1]
            where[f"{f.f_code.co_filename.rsplit('/', 2)[-1]}:{f.f_lineno} {f.f_code.co_name}"] += 1
    for line, n in where.most_common(12):
        print(f"#   {n:4d} tasks at {line}", flush=True)


def p95(values: list[float]) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, round(0.95 * (len(s) - 1)))]


async def connect_once(
    config_path: Path, stream: float, profile: cProfile.Profile | None = None
) -> dict[str, float]:
    fleet = fleet_from_config(load_config(config_path))
    live_at: float | None = None
    sampled_at: float | None = None
    n_start = node_cpu_seconds()
    t0 = time.monotonic()
    c_start = cpu_seconds()
    done = asyncio.Event()
    # Readiness from the fleet's own updates, O(1) each: the names that went live and that
    # sampled so far (a scan of every snapshot per update would be O(K) per update, O(K^2) in
    # all, and count in the login CPU figure as if it were gpuctl's).
    n = len(fleet.names)
    live: set[str] = set()
    sampled: set[str] = set()
    last_t: dict[str, float] = {}
    samples = 0  # samples the fleet took in (the streaming work done while others connect)

    def check(s: NodeSnapshot) -> None:
        nonlocal live_at, sampled_at, samples
        if s.last_sample_t is not None and last_t.get(s.name) != s.last_sample_t:
            last_t[s.name] = s.last_sample_t
            samples += 1
        if s.state is NodeState.LIVE and s.name not in live:
            live.add(s.name)
            if len(live) == n:
                live_at = time.monotonic() - t0
        if s.last_sample_t is not None and s.name not in sampled:
            sampled.add(s.name)
            if len(sampled) == n:
                sampled_at = time.monotonic() - t0
                done.set()

    fleet.subscribe(check)
    if profile is not None:
        profile.enable()
    await fleet.start()
    out: dict[str, float] = {}
    try:
        try:
            await wait_for(done.wait(), 600)
        except TimeoutError:
            states = collections.Counter(s.state.value for s in fleet.snapshots())
            reasons = collections.Counter(s.reason for s in fleet.snapshots() if s.reason)
            print(f"# not ready in 600 s: {dict(states)}; {reasons.most_common(3)}", flush=True)
            dump_tasks()
            raise
        if profile is not None:
            profile.disable()
        out = {
            "live_s": live_at or float("nan"),
            "sampled_s": sampled_at or float("nan"),
            "connect_cpu_s": cpu_seconds() - c_start,
            "connect_samples": samples,
        }
        out["node_cpu_s"] = node_cpu_seconds() - n_start
        if stream > 0:
            ages: list[float] = []
            samples0 = samples
            c0, w0 = cpu_seconds(), time.monotonic()
            end = w0 + stream
            while time.monotonic() < end:
                await asyncio.sleep(0.25)  # the reading period of the measurement
                now = time.time()
                ages.extend(now - s.last_sample_t for s in fleet.snapshots() if s.last_sample_t)
            wall = time.monotonic() - w0
            out["p95_age_s"] = p95(ages)
            out["max_age_s"] = max(ages) if ages else float("nan")
            out["cpu_per_s"] = (cpu_seconds() - c0) / wall
            # what one sample costs while streaming, to tell the connections' own CPU from
            # the streaming of the nodes already live while the others connect
            out["cpu_per_sample"] = (cpu_seconds() - c0) / max(1, samples - samples0)
            out["connections_cpu_s"] = (
                out["connect_cpu_s"] - out["connect_samples"] * out["cpu_per_sample"]
            )
            out["not_live"] = sum(s.state is not NodeState.LIVE for s in fleet.snapshots())
        out["uploads"] = len(fleet.store.uploads) if fleet.store else 0
    finally:
        try:
            await wait_for(fleet.stop(), 120)
        except TimeoutError:
            print("# fleet.stop() took more than 120 s", flush=True)
            dump_tasks()
            raise
    return out


def sequential_ssh(cluster: SshCluster) -> float:
    t0 = time.monotonic()
    for name in cluster.nodes:
        r = subprocess.run(
            cluster.ssh_argv(name, "true"),
            capture_output=True,
            stdin=subprocess.DEVNULL,
            timeout=60,
        )
        if r.returncode != 0:
            raise SystemExit(f"ssh {name} true failed: {r.stderr.decode(errors='replace')}")
    return time.monotonic() - t0


def run_k(
    k: int, stream: float, workdir: Path, gpus: int = 8, profile: int = 0, seq: bool = True
) -> dict[str, float]:
    with SshCluster(workdir / f"k{k}") as cluster:
        t0 = time.monotonic()
        cluster.start_nodes([f"n{i:03d}" for i in range(k)])
        sshd_start = time.monotonic() - t0
        bundles = workdir / f"k{k}" / "bundles"
        config = cluster.write_config(
            workdir / f"k{k}" / "config.toml", simulate=gpus, interval=1.0, bundle_dir=str(bundles)
        )
        cold = asyncio.run(connect_once(config, 0))
        # CPU time, not wall time: the machine is shared, and waiting is not cost
        prof = cProfile.Profile(time.process_time) if profile else None
        warm = asyncio.run(connect_once(config, stream, prof))
        if prof is not None:
            print(f"# profile of the warm connect of {k} nodes (this process), top {profile}:")
            stats = pstats.Stats(prof, stream=sys.stdout)
            stats.sort_stats("tottime").print_stats(profile)
            stats.sort_stats("cumulative").print_stats(profile)
        seq_s = sequential_ssh(cluster) if seq else float("nan")
    return {
        "k": k,
        "sshd_start_s": sshd_start,
        "cold_live_s": cold["live_s"],
        "cold_sampled_s": cold["sampled_s"],
        "cold_uploads": cold["uploads"],
        "warm_live_s": warm["live_s"],
        "warm_sampled_s": warm["sampled_s"],
        "warm_cpu_s": warm["connect_cpu_s"],
        "warm_samples": warm["connect_samples"],
        "node_cpu_s": warm["node_cpu_s"],
        "conn_cpu_s": warm.get("connections_cpu_s", float("nan")),
        "p95_age_s": warm.get("p95_age_s", float("nan")),
        "max_age_s": warm.get("max_age_s", float("nan")),
        "cpu_per_s": warm.get("cpu_per_s", float("nan")),
        "not_live": warm.get("not_live", 0),
        "seq_ssh_s": seq_s,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("k", nargs="*", type=int, default=[8, 32, 64], help="node counts")
    ap.add_argument("--stream", type=float, default=10.0, help="seconds of streaming to measure")
    ap.add_argument("--gpus", type=int, default=8, help="simulated GPUs per node (8)")
    ap.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="profile the warm connect (cProfile, CPU time) and print the top N functions by own "
        "and cumulative time; the profiler slows the login side many times over, so a profiled "
        "run's figures say where the time goes, not how much there is",
    )
    ap.add_argument(
        "--no-seq", action="store_true", help="skip the K sequential `ssh true` comparison"
    )
    args = ap.parse_args()
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print(f"# machine: {os.cpu_count()} cores, load average {' '.join(load)}")
    cols = (
        "K", "cold live", "cold 1st sample", "uploads", "warm live", "warm 1st sample", "login CPU",
        "samples meanwhile", "connections' CPU", "node-side CPU", "p95 age", "max age", "CPU/s",
        "not live", f"{'K'} x ssh true",
    )  # fmt: skip
    print(" | ".join(cols))
    with tempfile.TemporaryDirectory(prefix="gpuctl-bench-") as tmp:
        for k in args.k:
            with open("/proc/loadavg") as f:
                load = f.read().split()[:3]
            print(f"# K={k}: load average before {' '.join(load)}", flush=True)
            r = run_k(k, args.stream, Path(tmp), args.gpus, args.profile, not args.no_seq)
            print(
                f"{r['k']:>3} | {r['cold_live_s']:.2f} s | {r['cold_sampled_s']:.2f} s | "
                f"{r['cold_uploads']:.0f} | {r['warm_live_s']:.2f} s | "
                f"{r['warm_sampled_s']:.2f} s | {r['warm_cpu_s']:.2f} s | "
                f"{r['warm_samples']:.0f} | {r['conn_cpu_s']:.2f} s | {r['node_cpu_s']:.1f} s | "
                f"{r['p95_age_s']:.2f} s | {r['max_age_s']:.2f} s | {r['cpu_per_s'] * 100:.1f}% | "
                f"{r['not_live']:.0f} | {r['seq_ssh_s']:.2f} s",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
