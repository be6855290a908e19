"""Prometheus source at scale: gpuctl reading N nodes x G GPUs from a real Prometheus.

Debian's ``/usr/bin/prometheus`` scrapes ``--targets`` stand-in DCGM exporters (each serves its
share of the nodes in DCGM exporter's format and labels, the text rendered once: the values do
not matter, the sample times move with every scrape) every ``--scrape`` seconds. Once every
GPU's utilisation series is in, this process builds the fleet from ``--prometheus`` as
``gpuctl watch --prometheus`` does (``PromSource`` polling every ``--interval`` s, a
``ClusterFleet`` with one ``PromLink`` per node; with ``--tui`` also the screen, headless) and
measures over ``--polls`` polls:

* a poll's wall time (all queries at once, decoded, grouped per host), median and p95,
* query to published: from a poll's start to the last node's snapshot with that poll's sample
  (polls that brought new samples), median and p95,
* this process's CPU (user + system, threads included; Prometheus is another process) as a
  share of one core, and its peak RSS,
* decoding one utilisation answer (all GPUs) with msgspec's typed structs vs ``json.loads``
  into dicts, alternated runs, as a ratio.

With ``--decode-only``, no store: one poll's answers for N x G GPUs as Prometheus writes them,
decoded (msgspec vs ``json.loads``) and grouped, in CPU seconds.

Usage: python benchmarks/prom_scale.py [--nodes 2048] [--gpus 8] [--interval 5] [--polls 12]
       [--scrape 15] [--targets 8] [--tui] [--decode-only]
"""

from __future__ import annotations

import argparse
import asyncio
import http.server
import json
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpuctl.core.model import NodeSnapshot  # noqa: E402
from gpuctl.fleet.build import ClusterFleet  # noqa: E402
from gpuctl.fleet.prom import _VECTOR, PromLink, PromSource, PromTarget  # noqa: E402
from gpuctl_tests.harness.prometheus import COUNTERS, gpu_values, prometheus  # noqa: E402

# The counters of DCGM exporter's default set that gpuctl reads (the rest only cost the store).
READ = {
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
}


def render(hosts: list[str], gpus: int) -> bytes:
    lines = []
    values = gpu_values(42)
    for name, kind, help_text, key in COUNTERS:
        if name not in READ:
            continue
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        for h, host in enumerate(hosts):
            for i in range(gpus):
                lines.append(
                    f'{name}{{gpu="{i}",UUID="GPU-{h:08d}-0000-0000-0000-{i:012d}",'
                    f'pci_bus_id="00000000:{i + 7:02X}:00.0",device="nvidia{i}",'
                    f'modelName="NVIDIA H100 80GB HBM3",Hostname="{host}",'
                    f'DCGM_FI_DRIVER_VERSION="550.54.15"}} {values[key]}'
                )
    return ("\n".join(lines) + "\n").encode()


def serve(body: bytes) -> http.server.ThreadingHTTPServer:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(p * (len(values) - 1)))]


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    source = PromSource(PromTarget(url), interval=args.interval)
    t = time.perf_counter()
    names = await asyncio.to_thread(source.discover)
    discover_s = time.perf_counter() - t
    print(f"discovered {len(names)} nodes in {discover_s:.1f} s", file=sys.stderr, flush=True)
    source.links = {name: PromLink(source, name) for name in names}
    fleet = ClusterFleet(dict(source.links), stale_after=3.0)
    poll_times: list[float] = []
    moved_counts: list[int] = []
    latencies: list[float] = []
    poll_start = [0.0]
    newest: dict[str, float] = {}
    pending: set[str] = set()
    published = asyncio.Event()  # every node of ``pending`` published its new sample
    all_live = asyncio.Event()
    polled = asyncio.Event()  # set after each poll

    def on_snapshot(s: NodeSnapshot) -> None:
        if s.last_sample_t is not None and s.last_sample_t != newest.get(s.name):
            newest[s.name] = s.last_sample_t
            pending.discard(s.name)
            if not pending:
                published.set()
            if len(newest) == len(names):
                all_live.set()

    fleet.subscribe(on_snapshot)

    async def timed_run() -> None:
        while True:
            poll_start[0] = time.perf_counter()
            before = {n: r.t for n, r in source.latest.items()}
            try:
                readings = await source.poll()
            except Exception as e:
                print(f"poll failed: {e}", file=sys.stderr, flush=True)
                await asyncio.sleep(args.interval)
                continue
            poll_times.append(time.perf_counter() - poll_start[0])
            moved = {n for n, r in readings.items() if r.t is not None and r.t != before.get(n)}
            moved_counts.append(len(moved))
            pending.clear()
            pending.update(moved)
            published.clear()
            source._take(readings, publish=True)
            started = poll_start[0]
            if moved:  # the fleet's tasks read the fed lines: until each node published
                try:
                    await asyncio.wait_for(published.wait(), 60)
                    latencies.append(time.perf_counter() - started)
                except TimeoutError:
                    print(f"{len(pending)} nodes never published", file=sys.stderr, flush=True)
            print(
                f"poll {len(poll_times)}: {poll_times[-1]:.2f} s, {len(moved)} nodes moved",
                file=sys.stderr,
                flush=True,
            )
            polled.set()
            await asyncio.sleep(max(0.0, args.interval - (time.perf_counter() - started)))

    fleet.services.append(timed_run)
    app = None
    app_task = None
    if args.tui:
        from gpuctl.tui import GpuctlApp

        app = GpuctlApp(fleet, read_only=True)
        app_task = asyncio.create_task(app.run_async(headless=True, size=(200, 60)))
    else:
        await fleet.start()
    # warm: every node live once, then measure whole polls
    await all_live.wait()
    print("every node live", file=sys.stderr, flush=True)
    cpu0, wall0, polls0 = cpu_seconds(), time.perf_counter(), len(poll_times)
    while len(poll_times) - polls0 < args.polls:
        polled.clear()
        await polled.wait()
    cpu = cpu_seconds() - cpu0
    wall = time.perf_counter() - wall0
    if app is not None and app_task is not None:
        app.exit()
        await app_task
    else:
        await fleet.stop()
    body = source.client._post("/api/v1/query", {"query": source.queries[1][1]})
    msgspec_s, json_s = [], []
    for _ in range(5):  # alternated: the same answer, one decoder then the other
        t = time.perf_counter()
        _VECTOR.decode(body)
        msgspec_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        json.loads(body)
        json_s.append(time.perf_counter() - t)
    return {
        "nodes": len(names),
        "gpus": sum(len(r.gpus) for r in source.latest.values()),
        "scrape_period_s": source.period,
        "discover_s": round(discover_s, 2),
        "poll_s_median": round(statistics.median(poll_times[polls0:]), 3),
        "poll_s_p95": round(pct(poll_times[polls0:], 0.95), 3),
        "query_to_published_s_median": round(statistics.median(latencies), 3),
        "query_to_published_s_p95": round(pct(latencies, 0.95), 3),
        "nodes_with_a_new_sample_per_poll": moved_counts[polls0:],
        "cpu_share_of_one_core": round(cpu / wall, 3),
        "rss_peak_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "answer_bytes": len(body),
        "decode_msgspec_ms": round(1000 * statistics.median(msgspec_s), 1),
        "decode_json_loads_ms": round(1000 * statistics.median(json_s), 1),
        "json_loads_over_msgspec": round(
            statistics.median(json_s) / statistics.median(msgspec_s), 2
        ),
    }


def serve_exporters(args: argparse.Namespace) -> None:
    """The stand-in exporters, in a process of their own (``--serve``): their CPU and memory
    must not count as gpuctl's. Prints their addresses, one line, then serves until killed."""
    hosts = [f"gpu{n:05d}" for n in range(args.nodes)]
    share = -(-len(hosts) // args.targets)
    servers = [serve(render(hosts[i : i + share], args.gpus)) for i in range(0, len(hosts), share)]
    print(" ".join(f"127.0.0.1:{s.server_address[1]}" for s in servers), flush=True)
    threading.Event().wait()


def decode_only(args: argparse.Namespace) -> None:
    """One poll's answers as Prometheus writes them (``max by`` labels only), made here:
    decoding them (msgspec typed vs ``json.loads``, alternated) and grouping them per host, as
    CPU seconds of this process."""
    from gpuctl.fleet.prom import group, queries

    bodies = []
    for metric, _q in queries(""):
        if metric is None:
            result: list[dict[str, Any]] = [
                {"metric": {"Hostname": f"gpu{h:05d}"}, "value": [1.8e9, "1799999990.1"]}
                for h in range(args.nodes)
            ]
        else:
            result = []
            for h in range(args.nodes):
                for i in range(args.gpus):
                    labels = {"Hostname": f"gpu{h:05d}", "gpu": str(i)}
                    if metric.key == "util_gpu":
                        labels.update(
                            UUID=f"GPU-{h:08d}-0000-0000-0000-{i:012d}",
                            modelName="NVIDIA H100 80GB HBM3",
                            DCGM_FI_DRIVER_VERSION="550.54.15",
                        )
                    result.append({"metric": labels, "value": [1.8e9, "42"]})
        answer = {"status": "success", "data": {"resultType": "vector", "result": result}}
        bodies.append((metric, json.dumps(answer).encode()))
    typed, plain, grouping = [], [], []
    for _ in range(3):
        t = time.process_time()
        answers = [(m, _VECTOR.decode(b).data.result) for m, b in bodies]
        typed.append(time.process_time() - t)
        t = time.process_time()
        group(answers)
        grouping.append(time.process_time() - t)
        t = time.process_time()
        for _m, b in bodies:
            json.loads(b)
        plain.append(time.process_time() - t)
    m, j = statistics.median(typed), statistics.median(plain)
    print(
        json.dumps(
            {
                "gpus": args.nodes * args.gpus,
                "answers_mb": round(sum(len(b) for _m, b in bodies) / 1e6, 1),
                "decode_msgspec_s": round(m, 3),
                "decode_json_loads_s": round(j, 3),
                "json_loads_over_msgspec": round(j / m, 2),
                "group_s": round(statistics.median(grouping), 3),
            }
        )
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=2048)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--interval", type=float, default=5.0)
    p.add_argument("--polls", type=int, default=12)
    p.add_argument("--scrape", type=float, default=15.0)
    p.add_argument("--targets", type=int, default=8)
    p.add_argument("--tui", action="store_true", help="run the screen too (headless)")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument(
        "--decode-only", action="store_true", help="time decoding one poll's answers, no store"
    )
    args = p.parse_args()
    if args.decode_only:
        decode_only(args)
        return
    if args.serve:
        serve_exporters(args)
        return
    exporters = subprocess.Popen(
        [sys.executable, __file__, "--serve", *sys.argv[1:]], stdout=subprocess.PIPE, text=True
    )
    try:
        assert exporters.stdout is not None
        targets = exporters.stdout.readline().split()
        print(f"exporters at {' '.join(targets)}", file=sys.stderr, flush=True)
        with prometheus(targets, scrape_interval=args.scrape) as prom:
            prom.wait_for(
                f"count(DCGM_FI_DEV_GPU_UTIL) >= {args.nodes * args.gpus}", 1, timeout=900
            )
            prom.wait_for(  # two scrapes in, so the scrape period can be read
                "count(count_over_time(DCGM_FI_DEV_GPU_UTIL[5m]) >= 2) >= "
                f"{args.nodes * args.gpus}",
                1,
                timeout=900,
            )
            print(f"{prom.url} holds every GPU; measuring", file=sys.stderr, flush=True)
            result = asyncio.run(measure(prom.url, args))
    finally:
        exporters.kill()
        exporters.wait()
    result["tui"] = args.tui
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
