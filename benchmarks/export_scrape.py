"""Export scrape benchmark: ``gpuctl export``'s endpoint over N nodes x G GPUs, scraped over HTTP.

The fleet is N nodes whose agents said a hello and one sample each (``ReplayLink``), so this
process does only what a scrape costs: the collector reads every snapshot, prometheus-client
writes the exposition, the HTTP thread sends it. The scraper is a separate process (as
Prometheus is), so this process's CPU (user + system, ``getrusage``) over the scrapes, less the
same wall time idle, is the login side's cost per scrape. It prints

* scrape time (median, p99, as the scraper sees it) and the response size,
* CPU per scrape and the login side's extra CPU share with a scraper every 15 s.

With ``--nvitop`` it does the same against ``nvitop-exporter`` (``pip install nvitop-exporter``)
on the stand-in NVML (``gpuctl_tests/node/nvml_stub``, built with gcc) for one node of G GPUs,
and against gpuctl's endpoint for one node of G GPUs, per GPU per scrape. nvitop-exporter reads
NVML in a background thread every ``--interval`` and serves what it last read; its CPU per scrape
is its process's CPU over the scrapes less the same wall time unscraped.

Usage: python benchmarks/export_scrape.py [--nodes 512] [--gpus 8] [--scrapes 200] [--nvitop]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpuctl.core.model import NodeState  # noqa: E402
from gpuctl.fleet.export import MetricsServer, registry_for  # noqa: E402
from gpuctl.fleet.fleet import Fleet  # noqa: E402
from gpuctl.fleet.links import NodeLink  # noqa: E402
from gpuctl.fleet.replay import ReplayLink, recorded_node  # noqa: E402

SCRAPER = """
import json, sys, time, urllib.request
url, n = sys.argv[1], int(sys.argv[2])
req = urllib.request.Request(url, headers={"Accept": sys.argv[3]})
times, size = [], 0
for _ in range(n):
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=60) as r:
        size = len(r.read())
    times.append(time.perf_counter() - t)
print(json.dumps({"times": times, "bytes": size}))
"""
TEXT = "text/plain"
OPENMETRICS = "application/openmetrics-text; version=1.0.0"
PROMETHEUS_INTERVAL_S = 15.0


def cpu_self() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def cpu_of(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


async def scrape(url: str, n: int, accept: str) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", SCRAPER, url, str(n), accept, stdout=subprocess.PIPE
    )
    out, _ = await proc.communicate()
    result: dict[str, Any] = json.loads(out)
    return result


async def gpuctl_endpoint(nodes: int, gpus: int, scrapes: int, accept: str) -> dict[str, Any]:
    now = time.time()
    links: dict[str, NodeLink] = {
        f"node{i:04d}": ReplayLink(
            recorded_node(f"node{i:04d}", f"{gpus}:H100", seed=i, t0=now, samples=1)
        )
        for i in range(nodes)
    }
    fleet = Fleet(links, stale_after=1e9, concurrency=nodes)
    streaming = asyncio.Event()

    def check(_s: object) -> None:
        if all(s.state is NodeState.LIVE and s.gpus for s in fleet.snapshots()):
            streaming.set()

    fleet.subscribe(check)
    await fleet.start()
    await streaming.wait()
    registry, _ = registry_for(fleet)
    server = MetricsServer(registry, "127.0.0.1", 0)
    try:
        await scrape(server.url(), 3, accept)  # warm up
        cpu0, wall0 = cpu_self(), time.monotonic()
        result = await scrape(server.url(), scrapes, accept)
        cpu1, wall1 = cpu_self(), time.monotonic()
        await asyncio.sleep(wall1 - wall0)  # the same wall time without scrapes: the baseline
        idle = cpu_self() - cpu1
    finally:
        server.close()
        await fleet.stop()
    result["cpu_per_scrape"] = max(0.0, (cpu1 - cpu0) - idle) / scrapes
    return result


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def nvitop_endpoint(gpus: int, scrapes: int, accept: str) -> dict[str, Any] | None:
    exe = Path(sys.executable).with_name("nvitop-exporter")
    if not exe.exists():
        print("nvitop-exporter: not installed (pip install nvitop-exporter); skipped")
        return None
    from gpuctl_tests.helpers import node_env
    from gpuctl_tests.node.nvml_stub import CONFIG_ENV, build

    tmp = Path(tempfile.mkdtemp(prefix="gpuctl-bench-"))
    lib = build(tmp)
    config = tmp / "nvml.conf"
    config.write_text(f"count {gpus}\n")
    env = node_env({CONFIG_ENV: str(config), "LD_LIBRARY_PATH": str(lib)})
    port = free_port()
    proc = subprocess.Popen(
        [str(exe), "--bind-address", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    err = proc.stderr.read().decode() if proc.stderr else ""
                    print(f"nvitop-exporter did not start: {err[-400:]}")
                    return None
                time.sleep(0.1)  # a poll until the port answers
        asyncio.run(scrape(url, 3, accept))
        cpu0, wall0 = cpu_of(proc.pid), time.monotonic()
        result = asyncio.run(scrape(url, scrapes, accept))
        cpu1, wall1 = cpu_of(proc.pid), time.monotonic()
        time.sleep(wall1 - wall0)  # the same wall time without scrapes: its own collection
        idle = cpu_of(proc.pid) - cpu1
    finally:
        proc.terminate()
        proc.wait()
    result["cpu_per_scrape"] = max(0.0, (cpu1 - cpu0) - idle) / scrapes
    return result


def report(what: str, gpus: int, r: dict[str, Any]) -> None:
    times = [t * 1000 for t in r["times"]]
    med, p99 = statistics.median(times), pct(times, 0.99)
    cpu = r["cpu_per_scrape"] * 1000
    print(
        f"{what}: {gpus} GPUs: scrape median {med:.1f} ms, p99 {p99:.1f} ms, "
        f"{r['bytes'] / 1024:.0f} KiB; CPU {cpu:.1f} ms per scrape = "
        f"{cpu / (PROMETHEUS_INTERVAL_S * 10):.3f}% of one core at one scrape per "
        f"{PROMETHEUS_INTERVAL_S:g} s; per GPU per scrape {med * 1000 / gpus:.1f} us, "
        f"CPU {cpu * 1000 / gpus:.1f} us"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=512)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--scrapes", type=int, default=200)
    ap.add_argument("--openmetrics", action="store_true", help="ask for OpenMetrics text")
    ap.add_argument("--nvitop", action="store_true", help="also nvitop-exporter, one node")
    args = ap.parse_args()
    accept = OPENMETRICS if args.openmetrics else TEXT
    r = asyncio.run(gpuctl_endpoint(args.nodes, args.gpus, args.scrapes, accept))
    report(f"gpuctl export, {args.nodes} nodes", args.nodes * args.gpus, r)
    if args.nvitop:
        one = asyncio.run(gpuctl_endpoint(1, args.gpus, args.scrapes, accept))
        report("gpuctl export, 1 node", args.gpus, one)
        nv = nvitop_endpoint(args.gpus, args.scrapes, accept)
        if nv is not None:
            report("nvitop-exporter, 1 node (stand-in NVML)", args.gpus, nv)


if __name__ == "__main__":
    main()
