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
* where a poll's time goes (``phases_s_median`` / ``_p95``, and the slowest 5% of polls in
  full; see ``phase_figures``): the stamp query, the metric queries, Prometheus's own time in
  each (its ``execTotalTime``, asked with ``stats=all``), the login side after the last answer,
  publishing; and the last polls asked again one query at a time
  (``polls_replayed_one_query_at_a_time``: Prometheus's own work a poll without concurrency,
  the round trips, gpuctl's decoding),
* the answers' bytes a poll,
* this process's CPU (user + system, threads included; Prometheus is another process) as a
  share of one core and in seconds a poll, and its peak RSS (with ``--baseline``, of both
  variants' fleets together: run without it for this tree's),
* decoding one utilisation answer (all GPUs) with msgspec's typed structs vs ``json.loads``
  into dicts, alternated runs, as a ratio.

With ``--decode-only``, no store: a poll's answers as Prometheus writes them, for every host
(the base's poll) and for the hosts with a new sample (this one's), decoded (msgspec vs
``json.loads``) and grouped, and the moved hosts published into a live fleet, in CPU seconds:
figures that the machine's load disturbs less than the wall times above.

With ``--baseline TREE`` (e.g. ``git worktree add /tmp/base <commit>``), TREE's
``gpuctl/fleet/prom.py`` is measured too, on the same store: ``--rounds`` rounds, each this
tree's then the baseline's, and the ratios printed (baseline over this).

With ``--trees BASE`` (a ``git worktree`` of the base), the whole of each tree's gpuctl is
measured, not its prom.py alone (the fleet, the history, the screen: ``--baseline`` loads the
base's prom.py beside this tree's other modules, and its RSS is both variants' together): one
store, then ``--rounds`` rounds each running this tree, then BASE, in a process of its own
(``--store URL --tree TREE``), so each peak RSS is its own; printed per figure: the median over
the runs, the runs, and base over this. ``store_cpu_share_of_one_core`` is Prometheus's own CPU
(its process's, from /proc) over the measured polls.

Usage: python benchmarks/prom_scale.py [--nodes 2048] [--gpus 8] [--interval 5] [--polls 12]
       [--scrape 15] [--targets 8] [--tui] [--baseline TREE] [--rounds 1]
       [--trees BASE] [--decode-only [--live-objects N]] [--shapes]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

# ``--tree TREE``: gpuctl imported from TREE (a worktree of the base), the whole package, in
# this process of its own (``--trees`` starts one per variant on a shared store)
_TREE = next((sys.argv[i + 1] for i, a in enumerate(sys.argv[:-1]) if a == "--tree"), None)
REPO = Path(_TREE).resolve() if _TREE else Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpuctl.core.deadline import wait_for  # noqa: E402
from gpuctl.core.model import NodeSnapshot  # noqa: E402
from gpuctl.fleet import eventloop  # noqa: E402
from gpuctl.fleet import prom as this_prom  # noqa: E402
from gpuctl.fleet.build import ClusterFleet  # noqa: E402
from gpuctl_tests.harness.prometheus import (  # noqa: E402
    COUNTERS,
    gpu_values,
    prometheus,
    series_labels,
    serve_metrics,
)

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


def render(hosts: list[str], gpus: int, served: set[str] | frozenset[str] = READ) -> bytes:
    """The exporters' text for ``hosts`` with ``gpus`` each: the counters in ``served``."""
    lines = []
    values = gpu_values(42)
    for name, kind, help_text, key in COUNTERS:
        if name not in served:
            continue
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        for h, host in enumerate(hosts):
            for i in range(gpus):
                uuid = f"GPU-{h:08d}-0000-0000-0000-{i:012d}"
                labels = series_labels(host, i, uuid, "NVIDIA H100 80GB HBM3")
                lines.append(f"{name}{{{labels}}} {values[key]}")
    return ("\n".join(lines) + "\n").encode()


def store_cpu_seconds(pid: int) -> float:
    """The CPU seconds (user + system) of process ``pid`` (the store), 0 without one."""
    if not pid:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(p * (len(values) - 1)))]


def server_seconds(body: bytes) -> float:
    """Prometheus's own time for a query (``stats=all``: ``execTotalTime``, its queue,
    preparation, evaluation and sorting; not writing the JSON), -1 when the answer has none."""
    at = body.rfind(b'"stats":')
    if at < 0:
        return -1.0
    try:
        stats = json.loads(body[at + 8 :].rstrip().removesuffix(b"}}"))
        return float(stats["timings"]["execTotalTime"])
    except (ValueError, KeyError, TypeError):
        return -1.0


def phase_figures(
    started: float, calls: list[tuple[float, float, float, str]], polled: float, latency: float
) -> dict[str, float]:
    """Where one poll's time went, in seconds from its start: ``stamp`` (the sample-time
    query's round trip) and ``stamp_server`` (Prometheus's own part of it); ``queries`` (from
    the first metric query sent to the last answer read), ``queries_server_sum`` /
    ``_max`` (Prometheus's own time over them); ``login`` (the last answer read to the poll's
    readings grouped: decoding and grouping not overlapped by the store; with the poll that
    publishes as the answers come, its last group fed too), ``publish`` (then to the last moved
    node's snapshot), ``after_last_answer`` (the last answer read to the last moved node's
    snapshot: what the queries' time does not cover), ``total``."""
    calls = sorted(calls)
    if not calls:
        return {}
    first, rest = calls[0], calls[1:]
    out = {"stamp": first[1] - first[0], "stamp_server": first[2]}
    if rest:
        out["queries"] = max(c[1] for c in rest) - rest[0][0]
        out["queries_server_sum"] = sum(c[2] for c in rest)
        out["queries_server_max"] = max(c[2] for c in rest)
        out["n_queries"] = len(rest)
    last = max(c[1] for c in calls)
    out["login"] = polled - last
    out["publish"] = started + latency - polled
    out["after_last_answer"] = started + latency - last
    out["total"] = latency
    return {k: round(v, 3) for k, v in out.items()}


def one_at_a_time(post: Any, plans: list[list[str]]) -> list[dict[str, float]]:
    """Each of ``plans`` (a poll's queries) asked again one query at a time, nothing else
    asking: Prometheus's own time for the poll's work (``server_s``, the sum of
    ``execTotalTime``), with writing and sending the answers (``round_trips_s``), and gpuctl's
    decoding of them (``decode_s``), a figure each that concurrency and the other side's
    load do not inflate."""
    out = []
    for plan in plans:
        server = trips = decode = 0.0
        for promql in plan:
            t = time.perf_counter()
            body: bytes = post("/api/v1/query", {"query": promql, "stats": "all"})
            trips += time.perf_counter() - t
            server += server_seconds(body)
            t = time.perf_counter()
            this_prom._VECTOR.decode(body)
            decode += time.perf_counter() - t
        out.append(
            {
                "queries": len(plan),
                "server_s": round(server, 3),
                "round_trips_s": round(trips, 3),
                "decode_s": round(decode, 3),
            }
        )
    return out


# the fast gauges a poll asks each in a query of its own (the utilisation and memory apart)
MERGEABLE = (
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_XID_ERRORS",
)


def query_shapes(url: str, rounds: int = 5) -> dict[str, Any]:
    """One metric's query for a third of the hosts (by name) in other shapes, each asked
    alone, alternated ``rounds`` times: Prometheus's own time (median ``execTotalTime``),
    the round trip and the answer's bytes. ``set``: as a poll asks (``max by`` host and gpu,
    the hosts in a set matcher); ``set_at_sample_time``: the same with ``time=`` the hosts'
    newest sample time; ``raw``: no ``max by`` (every label); ``every_host``: no host matcher;
    ``set_of_8_hosts``: 8 of the hosts (the query's cost less its series').
    And the fast gauges (``MERGEABLE``) for those hosts: ``gauges_each`` one query a metric,
    asked one after the other (times summed), ``gauges_merged`` one query of them all by
    ``__name__`` (``max by`` host, gpu and ``__name__``)."""
    client = this_prom.PromClient(this_prom.PromTarget(url))
    stamps = client.run_blocking(lambda: client.query(this_prom.stamp_query("", first_gpu=True)))
    post = blocking_post(client)
    hosts = sorted(s.metric.host() for s in stamps)[::3]
    newest = max(float(s.value.text) for s in stamps)
    where = this_prom.hosts_matcher("Hostname", hosts)
    where8 = this_prom.hosts_matcher("Hostname", hosts[:8])
    name = "DCGM_FI_DEV_GPU_TEMP"
    names = "|".join(MERGEABLE)
    shapes: dict[str, list[dict[str, str]]] = {
        "set": [{"query": f"max by (Hostname, gpu) ({name}{{{where}}})"}],
        "set_at_sample_time": [
            {"query": f"max by (Hostname, gpu) ({name}{{{where}}})", "time": f"{newest:.3f}"}
        ],
        "raw": [{"query": f"{name}{{{where}}}"}],
        "every_host": [{"query": f"max by (Hostname, gpu) ({name})"}],
        "set_of_8_hosts": [{"query": f"max by (Hostname, gpu) ({name}{{{where8}}})"}],
        "gauges_each": [{"query": f"max by (Hostname, gpu) ({n}{{{where}}})"} for n in MERGEABLE],
        "gauges_merged": [
            {"query": f'max by (Hostname, gpu, __name__) ({{__name__=~"{names}", {where}}})'}
        ],
    }
    got: dict[str, list[tuple[float, float, int]]] = {k: [] for k in shapes}
    for _ in range(rounds):
        for key, forms in shapes.items():
            server = trip = 0.0
            size = 0
            for form in forms:
                t = time.perf_counter()
                body = post("/api/v1/query", {**form, "stats": "all"})
                trip += time.perf_counter() - t
                server += server_seconds(body)
                size += len(body)
            got[key].append((server, trip, size))
    return {
        "hosts": len(hosts),
        **{
            key: {
                "server_s": round(statistics.median(g[0] for g in runs), 4),
                "round_trip_s": round(statistics.median(g[1] for g in runs), 4),
                "bytes": runs[0][2],
            }
            for key, runs in got.items()
        },
    }


def blocking_post(client: Any) -> Any:
    """``client``'s POST as a blocking call, ``(path, form) -> bytes``: a baseline's urllib
    ``_post``, or this tree's aiohttp one (``gpuctl.fleet.promhttp``) on a loop of its own."""
    if not hasattr(client, "http"):
        return client._post
    apost = client.http.post

    def post(path: str, form: dict[str, str]) -> bytes:
        body: bytes = client.run_blocking(lambda: client.http.call(apost(path, form)))
        return body

    return post


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def measure(url: str, args: argparse.Namespace, prom: ModuleType) -> dict[str, Any]:
    """``args.polls`` polls of a fleet over ``url`` read by ``prom`` (gpuctl.fleet.prom, or
    the baseline's): the raw figures, summed up by ``summary``."""
    source = prom.PromSource(prom.PromTarget(url), interval=args.interval)
    received = [0]  # the answers' bytes
    post = blocking_post(source.client)
    calls: list[tuple[float, float, float, str]] = []  # a poll's queries: start, end, server s

    def counted(started: float, body: bytes, form: dict[str, str]) -> bytes:
        calls.append((started, time.perf_counter(), server_seconds(body), form.get("query", "")))
        received[0] += len(body)
        return body

    if hasattr(source.client, "http"):  # aiohttp (issue 38): its coroutine wrapped
        apost = source.client.http.post

        async def acounting(path: str, form: dict[str, str], **kw: Any) -> bytes:
            started = time.perf_counter()
            return counted(started, await apost(path, {**form, "stats": "all"}, **kw), form)

        source.client.http.post = acounting
    else:  # a baseline's urllib client

        def counting(path: str, form: dict[str, str]) -> bytes:
            started = time.perf_counter()
            return counted(started, post(path, {**form, "stats": "all"}), form)

        source.client._post = counting
    t = time.perf_counter()
    names = await asyncio.to_thread(source.discover)
    discover_s = time.perf_counter() - t
    print(f"discovered {len(names)} nodes in {discover_s:.1f} s", file=sys.stderr, flush=True)
    source.links = {name: prom.PromLink(source, name) for name in names}
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
    phases: list[dict[str, float]] = []  # per poll, see ``phase_figures``
    plans: list[list[str]] = []  # per poll, its queries (stamp first)

    published_at: dict[str, float] = {}  # each node's newest sample on the screen, when

    def on_snapshot(s: NodeSnapshot) -> None:
        if s.last_sample_t is not None and s.last_sample_t != newest.get(s.name):
            newest[s.name] = s.last_sample_t
            published_at[s.name] = time.perf_counter()
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
            calls.clear()
            try:
                # this tree's poll publishes each group of hosts as its queries answer
                fed = hasattr(source, "poll_once")
                readings = await (source.poll_once() if fed else source.poll())
            except Exception as e:
                print(f"poll failed: {e}", file=sys.stderr, flush=True)
                await asyncio.sleep(args.interval)
                continue
            polled_at = time.perf_counter()
            poll_times.append(polled_at - poll_start[0])
            asked = list(calls)
            plans.append([q for _a, _b, _s, q in sorted(asked)])
            moved = {n for n, r in readings.items() if r.t is not None and r.t != before.get(n)}
            moved_counts.append(len(moved))
            started = poll_start[0]
            pending.clear()  # the moved nodes not published yet (some are, when ``fed``)
            pending.update(n for n in moved if published_at.get(n, -1.0) < started)
            published.clear()
            if not fed:
                source._take(readings, publish=True)
            if moved:  # the fleet's tasks read the fed lines: until each node published
                try:
                    if pending:
                        await wait_for(published.wait(), 60)
                    latencies.append(max(published_at[n] for n in moved) - started)
                    phases.append(phase_figures(started, asked, polled_at, latencies[-1]))
                except TimeoutError:
                    print(f"{len(pending)} nodes never published", file=sys.stderr, flush=True)
            print(
                f"poll {len(poll_times)}: {poll_times[-1]:.2f} s, {len(moved)} nodes moved"
                + (f", {phases[-1]}" if moved and phases else ""),
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
    store0 = store_cpu_seconds(args.store_pid)
    cpu0, wall0, polls0 = cpu_seconds(), time.perf_counter(), len(poll_times)
    lats0, phases0 = len(latencies), len(phases)
    received[0] = 0
    while len(poll_times) - polls0 < args.polls:
        polled.clear()
        await polled.wait()
    cpu = cpu_seconds() - cpu0
    wall = time.perf_counter() - wall0
    store_cpu = store_cpu_seconds(args.store_pid) - store0
    if app is not None and app_task is not None:
        app.exit()
        await app_task
    else:
        await fleet.stop()
    bytes_per_poll = received[0] / args.polls
    alone = await asyncio.to_thread(one_at_a_time, post, plans[-3:])
    body = post("/api/v1/query", {"query": prom.queries("")[1][1]})
    msgspec_s, json_s = [], []
    for _ in range(5):  # alternated: the same answer, one decoder then the other
        t = time.perf_counter()
        prom._VECTOR.decode(body)
        msgspec_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        json.loads(body)
        json_s.append(time.perf_counter() - t)
    return {
        "nodes": len(names),
        "gpus": sum(len(r.gpus) for r in source.latest.values()),
        "scrape_period_s": source.period,
        "discover_s": discover_s,
        "polls": poll_times[polls0:],
        "latencies": latencies[lats0:],
        "phases": phases[phases0:],
        "alone": alone,
        "moved": moved_counts[polls0:],
        "cpu": cpu,
        "store_cpu": store_cpu,
        "wall": wall,
        "bytes_per_poll": bytes_per_poll,
        "answer_bytes": len(body),
        "msgspec_s": msgspec_s,
        "json_s": json_s,
    }


def summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One variant's figures over its rounds."""
    polls = [p for r in rounds for p in r["polls"]]
    latencies = [x for r in rounds for x in r["latencies"]]
    msgspec_s = [x for r in rounds for x in r["msgspec_s"]]
    json_s = [x for r in rounds for x in r["json_s"]]
    phases = [p for r in rounds for p in r["phases"]]
    first = rounds[0]
    worst = sorted(phases, key=lambda p: p.get("total", 0.0))[-max(1, len(phases) // 20) :]
    return {
        "phases_s_median": {
            k: round(statistics.median(p.get(k, 0.0) for p in phases), 3) for k in phases[0]
        }
        if phases
        else {},
        "phases_s_p95": {k: round(pct([p.get(k, 0.0) for p in phases], 0.95), 3) for k in phases[0]}
        if phases
        else {},
        "phases_of_slowest_5pct": worst,
        "polls_replayed_one_query_at_a_time": [a for r in rounds for a in r["alone"]],
        "nodes": first["nodes"],
        "gpus": first["gpus"],
        "scrape_period_s": round(first["scrape_period_s"], 2),
        "discover_s": [round(r["discover_s"], 2) for r in rounds],
        "poll_s_median": round(statistics.median(polls), 3),
        "poll_s_p95": round(pct(polls, 0.95), 3),
        "query_to_published_s_median": round(statistics.median(latencies), 3),
        "query_to_published_s_p95": round(pct(latencies, 0.95), 3),
        "nodes_with_a_new_sample_per_poll": [m for r in rounds for m in r["moved"]],
        "answers_mb_per_poll": round(statistics.mean(r["bytes_per_poll"] for r in rounds) / 1e6, 2),
        "cpu_share_of_one_core": round(
            sum(r["cpu"] for r in rounds) / sum(r["wall"] for r in rounds), 3
        ),
        "cpu_s_per_poll": round(sum(r["cpu"] for r in rounds) / len(polls), 3),
        # the store's own CPU meanwhile (Prometheus's process: evaluating, writing the answers,
        # scraping), with ``--trees`` / ``--store-pid`` only
        "store_cpu_share_of_one_core": round(
            sum(r["store_cpu"] for r in rounds) / sum(r["wall"] for r in rounds), 3
        ),
        "util_answer_bytes": first["answer_bytes"],
        "decode_msgspec_ms": round(1000 * statistics.median(msgspec_s), 1),
        "decode_json_loads_ms": round(1000 * statistics.median(json_s), 1),
        "json_loads_over_msgspec": round(
            statistics.median(json_s) / statistics.median(msgspec_s), 2
        ),
    }


def load_baseline(tree: str) -> ModuleType:
    """``tree``'s gpuctl/fleet/prom.py (e.g. a ``git worktree`` of the commit before a
    change), as a module of its own beside this tree's: the two alternate on one store."""
    path = Path(tree) / "gpuctl" / "fleet" / "prom.py"
    spec = importlib.util.spec_from_file_location("gpuctl_baseline_prom", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"no {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


async def alternate(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """``args.rounds`` rounds, each this tree's prom.py then the baseline's when given."""
    variants: dict[str, ModuleType] = {"this": this_prom}
    if args.baseline:
        variants["baseline"] = load_baseline(args.baseline)
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    for n in range(args.rounds):
        for name, module in variants.items():
            print(f"round {n + 1}: {name}", file=sys.stderr, flush=True)
            rounds[name].append(await measure(url, args, module))
    result: dict[str, Any] = {name: summary(r) for name, r in rounds.items()}
    if args.baseline:
        this, base = result["this"], result["baseline"]
        result["baseline_over_this"] = {
            key: round(base[key] / this[key], 2) if this[key] else None
            for key in (
                "poll_s_median",
                "poll_s_p95",
                "query_to_published_s_median",
                "query_to_published_s_p95",
                "answers_mb_per_poll",
                "cpu_s_per_poll",
            )
        }
    result["rss_peak_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return result


def variant(url: str, pid: int, tree: str, args: argparse.Namespace) -> dict[str, Any]:
    """One run of ``args.polls`` polls by TREE's gpuctl (its whole package) on the store at
    ``url``, in a process of its own: its peak RSS is its own."""
    argv = [sys.executable, __file__, "--store", url, "--store-pid", str(pid), "--tree", tree]
    argv += ["--polls", str(args.polls), "--interval", str(args.interval)]
    argv += ["--tui"] if args.tui else []
    done = subprocess.run(argv, stdout=subprocess.PIPE, text=True, check=True)
    result: dict[str, Any] = json.loads(done.stdout)
    return result


# the figures ``--trees`` prints per variant, medians over its runs, and their ratios
TREE_FIGURES = (
    "query_to_published_s_median",
    "query_to_published_s_p95",
    "poll_s_median",
    "poll_s_p95",
    "cpu_share_of_one_core",
    "cpu_s_per_poll",
    "rss_peak_mb",
    "store_cpu_share_of_one_core",
    "answers_mb_per_poll",
)


def compare_trees(url: str, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    """``--rounds`` rounds, each this tree's run then the base's (``--trees BASE``), every
    run a process of its own on the one store; each figure's median over the runs, its range,
    and the base's median over this one's."""
    trees = {"this": str(Path(__file__).resolve().parent.parent), "base": args.trees}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    for n in range(args.rounds):
        for name, tree in trees.items():
            print(f"round {n + 1}: {name} ({tree})", file=sys.stderr, flush=True)
            got = variant(url, pid, tree, args)
            runs[name].append({**got["this"], "rss_peak_mb": got["rss_peak_mb"]})
            print(json.dumps({k: runs[name][-1][k] for k in TREE_FIGURES}), file=sys.stderr)
    out: dict[str, Any] = {"rounds": args.rounds, "tui": args.tui}
    for name in trees:
        out[name] = {
            k: {
                "median": statistics.median(r[k] for r in runs[name]),
                "runs": [r[k] for r in runs[name]],
            }
            for k in TREE_FIGURES
        }
    out["base_over_this"] = {
        k: round(out["base"][k]["median"] / out["this"][k]["median"], 2)
        if out["this"][k]["median"]
        else None
        for k in TREE_FIGURES
    }
    return out


def serve_exporters(args: argparse.Namespace) -> None:
    """The stand-in exporters, in a process of their own (``--serve``): their CPU and memory
    must not count as gpuctl's. Prints their addresses, one line, then serves until killed."""
    hosts = [f"gpu{n:05d}" for n in range(args.nodes)]
    share = -(-len(hosts) // args.targets)
    bodies = [render(hosts[i : i + share], args.gpus) for i in range(0, len(hosts), share)]
    servers = [serve_metrics(lambda body=body: body) for body in bodies]
    print(" ".join(f"127.0.0.1:{s.server_address[1]}" for s in servers), flush=True)
    threading.Event().wait()


def poll_answers(hosts: range, gpus: int, instance: bool) -> list[tuple[Any, bytes]]:
    """One poll's answers for ``hosts`` as Prometheus writes them (``max by`` labels), made
    here; with ``instance``, each series also has that label (the base's ``by`` kept it)."""
    bodies = []
    for metric, _q in this_prom.queries(""):
        result: list[dict[str, Any]] = []
        # MIG instances' utilisation: no series at a site without MIG, as here
        for h in () if metric is this_prom.MIG else hosts:
            where = {"instance": f"10.0.{h // 256}.{h % 256}:9400"} if instance else {}
            if metric is None:
                labels = {"Hostname": f"gpu{h:05d}", **where}
                result.append({"metric": labels, "value": [1.8e9, "1799999990.1"]})
                continue
            for i in range(gpus):
                k = h * gpus + i  # values as a fleet's vary: integers repeat, floats seldom
                value = str(k * 7 % 101) if metric.integer else f"{k * 37 % 70000 / 3:.3f}"
                labels = {"Hostname": f"gpu{h:05d}", "gpu": str(i), **where}
                if metric.key == "util_gpu":
                    labels.update(
                        UUID=f"GPU-{h:08d}-0000-0000-0000-{i:012d}",
                        modelName="NVIDIA H100 80GB HBM3",
                        DCGM_FI_DRIVER_VERSION="550.54.15",
                    )
                result.append({"metric": labels, "value": [1.8e9, value]})
        answer = {"status": "success", "data": {"resultType": "vector", "result": result}}
        bodies.append((metric, json.dumps(answer).encode()))
    return bodies


def decode_only(args: argparse.Namespace) -> None:
    """A poll's answers made here, decoded (msgspec typed vs ``json.loads``, alternated) and
    grouped per host, in CPU seconds of this process: ``every_host`` is what a poll of the base
    decoded (every GPU, the ``instance`` label kept); ``moved_hosts`` what one decodes now (the
    hosts with a new sample: ``--interval`` / ``--scrape`` of them, host label and gpu); with
    ``--baseline``, ``baseline_every_host`` is the base's poll by the base's code. With
    ``--live-objects N``, N small dicts stay alive meanwhile, as the fleet's objects do in
    gpuctl (the collector's full collections walk them)."""
    live = [{"n": i} for i in range(args.live_objects)]
    moved = max(1, round(args.nodes * min(1.0, args.interval / args.scrape)))
    every = poll_answers(range(args.nodes), args.gpus, instance=True)
    shapes: dict[str, tuple[ModuleType, list[tuple[Any, bytes]]]] = {
        "every_host": (this_prom, every),
        "moved_hosts": (this_prom, poll_answers(range(moved), args.gpus, instance=False)),
    }
    if args.baseline:
        shapes["baseline_every_host"] = (load_baseline(args.baseline), every)
    typed: dict[str, list[float]] = {name: [] for name in shapes}
    grouping: dict[str, list[float]] = {name: [] for name in shapes}
    plain = []
    for _ in range(3):  # alternated
        for name, (module, bodies) in shapes.items():
            t = time.process_time()
            answers = [(m, module._VECTOR.decode(b).data.result) for m, b in bodies]
            typed[name].append(time.process_time() - t)
            t = time.process_time()
            module.group(answers)
            grouping[name].append(time.process_time() - t)
            del answers
        t = time.process_time()
        for _m, b in every:
            json.loads(b)
        plain.append(time.process_time() - t)
    out: dict[str, Any] = {
        "gpus": args.nodes * args.gpus,
        "moved_nodes": moved,
        "live_objects": len(live),
    }
    for name, (_module, bodies) in shapes.items():
        decode, grouped = statistics.median(typed[name]), statistics.median(grouping[name])
        out[name] = {
            "answers_mb": round(sum(len(b) for _m, b in bodies) / 1e6, 1),
            "decode_msgspec_s": round(decode, 3),
            "group_s": round(grouped, 3),
            "cpu_s": round(decode + grouped, 3),
        }
    out["every_host"]["decode_json_loads_s"] = round(statistics.median(plain), 3)
    out["every_host"]["json_loads_over_msgspec"] = round(
        statistics.median(plain) / statistics.median(typed["every_host"]), 2
    )
    out["every_host_over_moved_hosts_cpu"] = round(
        out["every_host"]["cpu_s"] / out["moved_hosts"]["cpu_s"], 2
    )
    if args.baseline:
        out["baseline_every_host_over_moved_hosts_cpu"] = round(
            out["baseline_every_host"]["cpu_s"] / out["moved_hosts"]["cpu_s"], 2
        )
    readings = this_prom.group([(m, this_prom._VECTOR.decode(b).data.result) for m, b in every])
    out["publish_moved_hosts"] = eventloop.run(publish_cpu(readings, moved, args))
    print(json.dumps(out, indent=1))


async def publish_cpu(
    readings: dict[str, Any], moved: int, args: argparse.Namespace
) -> dict[str, float]:
    """A fleet of one ``PromLink`` per host, every node live: the CPU seconds from handing it
    ``moved`` hosts' new readings (``PromSource._take``) to every one of them published (the
    fed lines read, decoded, the snapshots made), median of alternated rounds."""
    source = this_prom.PromSource(this_prom.PromTarget("http://127.0.0.1:9"), interval=5.0)
    source.period = args.scrape
    now = time.time()
    for reading in readings.values():
        reading.t = now
    source.latest = dict(readings)
    names = sorted(readings)
    source.links = {name: this_prom.PromLink(source, name) for name in names}
    fleet = ClusterFleet(dict(source.links), stale_after=60.0)
    waiting: set[str] = set(names)
    done = asyncio.Event()

    def on_snapshot(snap: NodeSnapshot) -> None:
        if snap.gpus and snap.name in waiting and snap.last_sample_t == source.latest[snap.name].t:
            waiting.discard(snap.name)
            if not waiting:
                done.set()

    fleet.subscribe(on_snapshot)
    await fleet.start()
    await wait_for(done.wait(), 120)
    cpu, wall = [], []
    for n in range(5):
        hosts = names[(n * moved) % len(names) :][:moved]
        t = time.time()
        batch = {h: dataclasses.replace(source.latest[h], t=t) for h in hosts}
        waiting.update(hosts)
        done.clear()
        c0, w0 = time.process_time(), time.perf_counter()
        source._take(batch, publish=True)
        await wait_for(done.wait(), 120)
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    await fleet.stop()
    return {
        "nodes": moved,
        "cpu_s": round(statistics.median(cpu), 3),
        "wall_s": round(statistics.median(wall), 3),
    }


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
        "--baseline",
        metavar="TREE",
        help="also measure TREE's gpuctl/fleet/prom.py (a git worktree of the base), alternated",
    )
    p.add_argument("--rounds", type=int, default=1, help="rounds of --polls polls per variant")
    p.add_argument(
        "--trees",
        metavar="BASE",
        help="this tree's gpuctl and BASE's (a git worktree), each whole in a process of its "
        "own, alternated --rounds times on one store: medians, runs, ratios",
    )
    p.add_argument("--tree", help=argparse.SUPPRESS)  # gpuctl imported from there (see top)
    p.add_argument("--store", help=argparse.SUPPRESS)  # a store already running: its URL
    p.add_argument("--store-pid", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument(
        "--live-objects",
        type=int,
        default=0,
        help="--decode-only: objects kept alive meanwhile (the fleet's, in gpuctl)",
    )
    p.add_argument(
        "--decode-only", action="store_true", help="time decoding one poll's answers, no store"
    )
    p.add_argument(
        "--shapes",
        action="store_true",
        help="time one metric's query in other shapes (time=, no max by, every host), --rounds",
    )
    args = p.parse_args()
    if args.decode_only:
        decode_only(args)
        return
    if args.serve:
        serve_exporters(args)
        return
    if args.store:  # one variant of ``--trees``
        out = eventloop.run(alternate(args.store, args))
        print(json.dumps(out, indent=1))
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
            if args.shapes:
                print(json.dumps(query_shapes(prom.url, args.rounds), indent=1))
                return
            if args.trees:
                print(json.dumps(compare_trees(prom.url, prom.proc.pid, args), indent=1))
                return
            # the loop and collector settings ``gpuctl watch`` runs on
            result = eventloop.run(alternate(prom.url, args))
    finally:
        exporters.kill()
        exporters.wait()
    result["tui"] = args.tui
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
