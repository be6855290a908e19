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

With ``--against OLD`` (a checkout of an older gpuctl, e.g. ``git worktree add /tmp/old-export
3285137``) it runs the same measurement on OLD's code and on this checkout's, alternated
``--rounds`` times, each in a fresh process, and prints each run and the ratios. ``--same`` scrapes
one unchanging set of samples (what a cache saves); by default every scrape sees a new snapshot
of every node, equal in value to the last (new objects: nothing is known unchanged by identity);
``--changing``: a new snapshot of every node whose readings moved as a busy GPU's do within one
scrape interval (utilisation, memory used, temperature, power, SM clock, PCIe traffic; totals,
limits, ECC counts, retired pages, remapped rows, throttle reasons, pstate stay): the fleet at 1 Hz
scraped every 15 s. ``--gzip`` asks for gzip, as Prometheus does on every scrape.

``--server aiohttp`` serves the same body through aiohttp.web instead of ``MetricsServer``.

Usage: python benchmarks/export_scrape.py [--nodes 512] [--gpus 8] [--scrapes 200] [--nvitop]
       python benchmarks/export_scrape.py --against /tmp/old-export [--rounds 3] [--scrapes 30]
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
# A child of --against runs the older checkout's code: the checkout comes first on the path.
sys.path.insert(0, os.environ.get("GPUCTL_BENCH_REPO", str(REPO)))

import copy  # noqa: E402
import dataclasses  # noqa: E402
import itertools  # noqa: E402

import msgspec  # noqa: E402

from gpuctl.core.model import NodeSnapshot, NodeState  # noqa: E402
from gpuctl.fleet import export  # noqa: E402
from gpuctl.fleet.fixed_links import ReplayLink, recorded_node  # noqa: E402
from gpuctl.fleet.fleet import Fleet  # noqa: E402
from gpuctl.fleet.links import NodeLink  # noqa: E402

SCRAPER = """
import json, sys, time, urllib.request
url, n = sys.argv[1], int(sys.argv[2])
req = urllib.request.Request(url, headers={"Accept": sys.argv[3], "Accept-Encoding": sys.argv[4]})
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


async def scrape(url: str, n: int, accept: str, encoding: str = "identity") -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", SCRAPER, url, str(n), accept, encoding, stdout=subprocess.PIPE
    )
    out, _ = await proc.communicate()
    result: dict[str, Any] = json.loads(out)
    return result


class AiohttpServer:
    """The same exposition served by aiohttp.web (in a thread's own loop, as ``MetricsServer``
    is): what moving the endpoint to aiohttp would cost per scrape (``--server aiohttp``)."""

    def __init__(self, exporter: Any) -> None:
        import threading

        from aiohttp import web

        async def metrics(request: web.Request) -> web.StreamResponse:
            om = export.wants_openmetrics(request.headers.get("Accept", ""))
            gz = export.wants_gzip(request.headers.get("Accept-Encoding", ""))
            chunks = exporter.body(openmetrics=om, gzipped=gz)
            resp = web.StreamResponse(
                headers={"Content-Type": export.OPENMETRICS_TYPE if om else export.TEXT_TYPE}
            )
            if gz:
                resp.headers["Content-Encoding"] = "gzip"
            resp.content_length = sum(map(len, chunks))
            await resp.prepare(request)
            for chunk in chunks:
                await resp.write(chunk)
            return resp

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        self.loop = asyncio.new_event_loop()
        self.runner = web.AppRunner(app, access_log=None)
        self.port = free_port()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(self.runner.setup())
            site = web.TCPSite(self.runner, "127.0.0.1", self.port)
            self.loop.run_until_complete(site.start())
            ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        ready.wait(30)

    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)


SERVER = "gpuctl"  # --server


def start_server(fleet: Fleet) -> Any:
    """The endpoint over ``fleet`` with this checkout's API, or the older one's (a
    prometheus-client registry) when the code under test predates ``FleetExporter``."""
    if SERVER == "aiohttp":
        return AiohttpServer(export.FleetExporter(fleet))
    if hasattr(export, "FleetExporter"):
        return export.MetricsServer(export.FleetExporter(fleet), "127.0.0.1", 0)
    registry, _ = export.registry_for(fleet)  # type: ignore[attr-defined]
    return export.MetricsServer(registry, "127.0.0.1", 0)


async def gpuctl_endpoint(
    nodes: int,
    gpus: int,
    scrapes: int,
    accept: str,
    *,
    fresh: bool = False,
    changing: bool = False,
    encoding: str = "identity",
) -> dict[str, Any]:
    """Scrape N nodes x G GPUs; ``fresh``: every scrape reads a new snapshot of every node (a
    copy, equal in value, as the fleet makes one per sample), so nothing per snapshot is reused;
    ``changing``: new snapshots whose busy readings moved (``moved``)."""
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
    snapshots = fleet.snapshots
    if fresh:

        def new_snapshots() -> list[NodeSnapshot]:
            return [copy.copy(s) for s in snapshots()]

        fleet.snapshots = new_snapshots  # type: ignore[method-assign]
    if changing:
        # four sets of readings per node, made before the scrapes: one per scrape in turn
        variants = [
            [dataclasses.replace(s, gpus=tuple(moved(g, k) for g in s.gpus)) for s in snapshots()]
            for k in range(1, 5)
        ]
        turn = itertools.count()

        def changed_snapshots() -> list[NodeSnapshot]:
            return [copy.copy(s) for s in variants[next(turn) % len(variants)]]

        fleet.snapshots = changed_snapshots  # type: ignore[method-assign]
    server = start_server(fleet)
    try:
        await scrape(server.url(), 3, accept, encoding)  # warm up
        cpu0, wall0 = cpu_self(), time.monotonic()
        result = await scrape(server.url(), scrapes, accept, encoding)
        cpu1, wall1 = cpu_self(), time.monotonic()
        await asyncio.sleep(wall1 - wall0)  # the same wall time without scrapes: the baseline
        idle = cpu_self() - cpu1
    finally:
        server.close()
        await fleet.stop()
    result["cpu_per_scrape"] = max(0.0, (cpu1 - cpu0) - idle) / scrapes
    return result


def moved(g: Any, k: int) -> Any:
    """GPU reading ``g`` as a busy GPU's may read one scrape interval later (``k``: which)."""

    def step(v: Any, by: float, low: float, high: float) -> Any:
        if v is None:
            return None
        x = min(high, max(low, v + by * (1 if k % 2 else -1) * k))
        return type(v)(x)

    mem = g.mem_total or 80 << 30
    return msgspec.structs.replace(
        g,
        util_gpu=step(g.util_gpu, 3, 0, 100),
        util_mem=step(g.util_mem, 2, 0, 100),
        mem_used=step(g.mem_used, 1 << 24, 0, mem),
        temp=step(g.temp, 1, 20, 95),
        power=step(g.power, 7.3, 50.0, 700.0),
        sm_clock=step(g.sm_clock, 15, 210, 1980),
        pcie_tx=step(g.pcie_tx, 123457, 0, 10**12),
        pcie_rx=step(g.pcie_rx, 234567, 0, 10**12),
    )


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
        f"CPU {cpu * 1000 / gpus:.1f} us, {r['bytes'] / gpus:.0f} bytes"
    )


def summary(r: dict[str, Any]) -> tuple[float, float, float]:
    """Median and p99 scrape time and CPU per scrape, in ms."""
    times = [t * 1000 for t in r["times"]]
    return statistics.median(times), pct(times, 0.99), r["cpu_per_scrape"] * 1000


def against(args: argparse.Namespace) -> None:
    """Old and new code alternated, each run in a fresh process; each run's figures, then the
    medians over the runs and new / old."""
    old = str(Path(args.against).resolve())
    child = [
        sys.executable,
        __file__,
        "--child",
        "--nodes",
        str(args.nodes),
        "--gpus",
        str(args.gpus),
        "--scrapes",
        str(args.scrapes),
        *(["--openmetrics"] if args.openmetrics else []),
        *(["--same"] if args.same else []),
        *(["--changing"] if args.changing else []),
        *(["--gzip"] if args.gzip else []),
    ]
    runs: dict[str, list[tuple[float, float, float]]] = {"old": [], "new": []}
    sizes: dict[str, int] = {}
    for k in range(args.rounds):
        for which, repo in (("old", old), ("new", str(REPO))):
            env = {**os.environ, "GPUCTL_BENCH_REPO": repo}
            out = subprocess.run(child, env=env, capture_output=True, text=True, check=True)
            r = json.loads(out.stdout)
            med, p99, cpu = summary(r)
            runs[which].append((med, p99, cpu))
            sizes[which] = r["bytes"]
            print(
                f"round {k + 1} {which} ({repo}): scrape median {med:.1f} ms, p99 {p99:.1f} ms, "
                f"CPU {cpu:.1f} ms per scrape, {r['bytes'] / 1024:.0f} KiB",
                flush=True,
            )
    what = (
        "same samples"
        if args.same
        else "readings changed every scrape"
        if args.changing
        else "new snapshots every scrape"
    )
    print(
        f"{args.nodes} nodes x {args.gpus} GPUs, {args.scrapes} scrapes per run, {what}"
        f"{', gzip' if args.gzip else ''}{', OpenMetrics' if args.openmetrics else ''}:"
    )
    gpus = args.nodes * args.gpus
    for i, name in enumerate(("scrape median", "scrape p99", "CPU per scrape")):
        o = statistics.median(x[i] for x in runs["old"])
        n = statistics.median(x[i] for x in runs["new"])
        print(
            f"  {name}: old {o:.1f} ms, new {n:.1f} ms: new/old {n / o:.3f}; per GPU: "
            f"old {o * 1000 / gpus:.2f} us, new {n * 1000 / gpus:.2f} us"
        )
    o, n = sizes["old"], sizes["new"]
    print(
        f"  body: old {o / 1024:.0f} KiB, new {n / 1024:.0f} KiB: new/old {n / o:.3f}; per GPU: "
        f"old {o / gpus:.0f} bytes, new {n / gpus:.0f} bytes"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=512)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--scrapes", type=int, default=200)
    ap.add_argument("--openmetrics", action="store_true", help="ask for OpenMetrics text")
    ap.add_argument("--nvitop", action="store_true", help="also nvitop-exporter, one node")
    ap.add_argument("--against", metavar="OLD", help="alternate with an older checkout's code")
    ap.add_argument("--rounds", type=int, default=3, help="old/new pairs with --against")
    ap.add_argument("--same", action="store_true", help="every scrape reads the same samples")
    ap.add_argument(
        "--changing",
        action="store_true",
        help="every scrape reads new samples whose busy readings moved (a fleet at 1 Hz)",
    )
    ap.add_argument("--gzip", action="store_true", help="ask for gzip, as Prometheus does")
    ap.add_argument(
        "--server",
        choices=("gpuctl", "aiohttp"),
        default="gpuctl",
        help="the HTTP server: gpuctl's own (MetricsServer) or aiohttp.web over the same body",
    )
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    global SERVER
    SERVER = args.server
    accept = OPENMETRICS if args.openmetrics else TEXT
    encoding = "gzip" if args.gzip else "identity"
    if args.against:
        against(args)
        return
    r = asyncio.run(
        gpuctl_endpoint(
            args.nodes,
            args.gpus,
            args.scrapes,
            accept,
            fresh=not args.same,
            changing=args.changing,
            encoding=encoding,
        )
    )
    if args.child:
        print(json.dumps(r))
        return
    report(f"gpuctl export, {args.nodes} nodes", args.nodes * args.gpus, r)
    if args.nvitop:
        one = asyncio.run(gpuctl_endpoint(1, args.gpus, args.scrapes, accept, fresh=not args.same))
        report("gpuctl export, 1 node", args.gpus, one)
        nv = nvitop_endpoint(args.gpus, args.scrapes, accept)
        if nv is not None:
            report("nvitop-exporter, 1 node (stand-in NVML)", args.gpus, nv)


if __name__ == "__main__":
    main()
