"""Payload benchmark: a 1 GiB argument's submit and a 1 GiB result's fetch against scp both ways.

    python3 benchmarks/jobs_payload.py [--payload-mb 1024] [--rounds 5] [--old REF]

One loopback sshd node (the test harness's real OpenSSH). Each round runs, one after the other:
``submit(size_of, blob)`` (pickle + upload until ``submit`` returns), ``result()`` of a job that
returned a blob of the same size (download + unpickle, timed once the job is over), ``scp`` up
and ``scp`` down of a file of the same size, and a small job's round trip (submit to result).
The gpuctl measurements (wall time, and the login process's CPU seconds, which the machine's
load changes less) run in a child process per round, one per code version: ``--old REF``
adds the code of git revision REF (``git archive`` of its ``gpuctl/``) measured in the same
rounds, so before and after share the machine's load of the moment (2 shared cores here). The
figures are medians over the rounds, as ratios to scp in the same round.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
VENV1 = Path.home() / ".pyenv" / "versions" / "3.6.15" / "bin" / "python"


def size_of(data: bytes) -> int:
    return len(data)


def make_blob(n: int) -> bytes:
    import os

    return os.urandom(n)


def trivial() -> int:
    return 1


def cpu_s() -> float:
    """This process's CPU seconds (every thread): what the login side spends, load or not."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def child(args: argparse.Namespace) -> int:
    """One round of gpuctl measurements with the code under ``args.code``; prints JSON."""
    sys.path.insert(0, args.code)
    from gpuctl.config import load_config
    from gpuctl.jobs import EnvSpec, Executor

    env = EnvSpec(system_site_packages=True, methods=("venv",), base_python=sys.executable)
    ex = Executor(
        "bench1",
        config=load_config(args.config),
        env=env,
        env_root=args.env_root,
        job_root=args.job_root,
        store=False,
    )
    n = args.payload_mb << 20
    if ex.submit(trivial).result(120) != 1:  # warm connection, VENV2 probe
        raise SystemExit("trivial job failed")
    small = []
    for _ in range(5):
        t0 = time.perf_counter()
        ex.submit(trivial).result(60)
        small.append(time.perf_counter() - t0)
    out: dict[str, Any] = {"small_rt": statistics.median(small)}
    blob = Path(args.blob).read_bytes()
    t0, c0 = time.perf_counter(), cpu_s()
    job = ex.submit(size_of, blob)
    out["submit"] = time.perf_counter() - t0
    out["submit_cpu"] = cpu_s() - c0
    del blob
    if job.result(600) != n:
        raise SystemExit("the payload arrived damaged")
    shutil.rmtree(job.jobdir, ignore_errors=True)
    job = ex.submit(make_blob, n)
    job.wait(600)
    t0, c0 = time.perf_counter(), cpu_s()
    value = job.result(600)
    out["fetch"] = time.perf_counter() - t0
    out["fetch_cpu"] = cpu_s() - c0
    if len(value) != n:
        raise SystemExit("the result arrived damaged")
    del value
    shutil.rmtree(job.jobdir, ignore_errors=True)
    print(json.dumps(out))
    return 0


def _spread(ratios: list[float]) -> str:
    return f"{statistics.median(ratios):.2f} x scp ({min(ratios):.2f}..{max(ratios):.2f})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--payload-mb", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--old", metavar="REF", help="also measure git revision REF's gpuctl")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--code", help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    ap.add_argument("--env-root", help=argparse.SUPPRESS)
    ap.add_argument("--job-root", help=argparse.SUPPRESS)
    ap.add_argument("--blob", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)

    sys.path.insert(0, str(REPO))
    from gpuctl_tests.harness.sshd import SshCluster

    venv1 = str(VENV1) if VENV1.exists() else "python3"
    work = Path(tempfile.mkdtemp(prefix="gpuctl-payload-"))
    os.environ.setdefault("GPUCTL_STATE_DIR", str(work / "state"))
    versions = {"new": str(REPO)}
    if args.old:
        old = work / "old"
        old.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", args.old, "gpuctl"], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
        versions = {f"old ({args.old})": str(old), **versions}
    n = args.payload_mb << 20
    src = work / "blob.bin"
    with open(src, "wb") as f:
        for _ in range(0, n, 1 << 26):
            f.write(os.urandom(min(1 << 26, n - f.tell())))
    down = work / "down.bin"
    times: dict[str, list[float]] = {}
    try:
        with SshCluster(work / "sshd") as cluster:
            cluster.start_node("bench1", python=venv1)
            config = cluster.write_config(work / "config.toml")
            scp = ["scp", "-q", "-F", str(cluster.ssh_config_path)]
            remote = work / "scp-dst"
            remote.mkdir()
            for r in range(args.rounds):
                for name, code in versions.items():
                    argv = [
                        *(sys.executable, __file__, "--child", "--code", code),
                        *("--config", str(config), "--blob", str(src)),
                        *("--env-root", str(work / "envs"), "--job-root", str(work / "jobs")),
                        *("--payload-mb", str(args.payload_mb)),
                    ]
                    res = subprocess.run(argv, check=True, capture_output=True, text=True)
                    for k, v in json.loads(res.stdout.splitlines()[-1]).items():
                        times.setdefault(f"{name} {k}", []).append(v)
                t0 = time.perf_counter()
                subprocess.run([*scp, str(src), f"bench1:{remote}/blob.bin"], check=True)
                times.setdefault("scp up", []).append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                subprocess.run([*scp, f"bench1:{remote}/blob.bin", str(down)], check=True)
                times.setdefault("scp down", []).append(time.perf_counter() - t0)
                down.unlink()
                print(
                    f"round {r + 1}: "
                    + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in times.items() if v),
                    flush=True,
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    mib = n / (1 << 20)
    up, dn = statistics.median(times["scp up"]), statistics.median(times["scp down"])
    print(f"\n{mib:.0f} MiB, medians of {args.rounds} rounds (each: min..max):")
    print(f"  scp up   {up:6.2f} s  {mib / up:5.0f} MiB/s")
    print(f"  scp down {dn:6.2f} s  {mib / dn:5.0f} MiB/s")
    for name in versions:
        s, f = statistics.median(times[f"{name} submit"]), statistics.median(times[f"{name} fetch"])
        ups = [a / b for a, b in zip(times["scp up"], times[f"{name} submit"], strict=True)]
        dns = [a / b for a, b in zip(times["scp down"], times[f"{name} fetch"], strict=True)]
        small = statistics.median(times[f"{name} small_rt"]) * 1000
        print(
            f"  {name}: submit {s:6.2f} s = {mib / s:5.0f} MiB/s -> {_spread(ups)}; "
            f"fetch {f:6.2f} s = {mib / f:5.0f} MiB/s -> {_spread(dns)}; "
            f"small job round trip {small:.0f} ms; login-side CPU: submit "
            f"{statistics.median(times[f'{name} submit_cpu']):.2f} s, fetch "
            f"{statistics.median(times[f'{name} fetch_cpu']):.2f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
