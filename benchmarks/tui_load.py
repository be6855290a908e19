"""TUI load benchmark: the real app, headless, over N simulated nodes x G GPUs sampling at 1 Hz.

The GPUs are simulated in a separate feeder process (one process for all nodes, writing protocol
lines to one pipe per node, phases spread over the second), so the app's process does exactly
what gpuctl does on a login node: read lines, decode, keep history, update the screen. Each run
is a process of its own (its memory is its own), and reports

* the app process's CPU share (user + system time over wall time, 100% = one core),
* the delay from a sample's arrival in the app to the paint of its node's lines, and from the
  sample's time stamp to that paint (p50/p95/max), for the nodes on screen (the list shows a
  few; the heatmap shows them all),
* its RSS every ``--rss-every`` seconds: first, last, peak, and the slope over the last two
  thirds of the run (MB per minute; flat is about 0),
* the quit time: from ``app.exit()`` to the end of the process (the fleet's links closed and
  every object freed: the terminal is the user's again only then).

``--compare REV`` runs every case twice in one go, with this checkout's gpuctl and with the
gpuctl of git revision REV (``--compare`` given again: each revision's too, in the same
alternation) (extracted to a temporary folder; the feeder and this script are the
same for both), one after the other, and prints the ratios; ``--compare-loop`` compares this
checkout on gpuctl's event loop (``gpuctl.fleet.eventloop``, what the screen runs on) with the
same on asyncio's plain loop. ``--rounds K`` alternates the two K times and prints the median CPU
of each: on a shared machine the CPU a run takes drifts by several points within minutes, so
only alternated runs compare.

``--full-history`` fills every node's history to its full size (4 hours and 15 minutes of
samples) once the fleet is up, so that the RSS is the one hours of watching come to: without it
a run's minutes hold a few minutes of history (its rings grow as samples come).

``--layers`` runs this checkout four ways, alternated, each one layer less than the one
before (``LAYERS``): the whole screen; the screen given each node's first sample only (no
store, flush or paint after it: what the fleet costs); the fleet keeping each node's first
sample only (no history, bookkeeping or snapshot after it, no staleness watch: what reading
and decoding cost); the lines dropped once read (a link's first three decoded: what the pipes,
the loop and an idle Textual cost). Each layer's share of a core is the difference between two
neighbours: where the CPU goes, measured by taking it away, not by a profiler.

``--interval S`` has every node sample each S seconds (its hello says so, as an agent's
``interval`` does): the screen's CPU at a slower cadence.

``--parts`` adds, per run, where the app's CPU went without a profiler's distortion: the thread
time of each of ``PARTS`` (calls, microseconds a call, share of the run's CPU), of the garbage
collector's collections of each generation (``gc.callbacks``) and how many
compositor updates painted the header's row alone (issue 27: at 512 nodes they were 180 of 316
before the header's figures moved per round of samples).

Usage: python benchmarks/tui_load.py [--nodes 512] [--gpus 8] [--minutes 5] [--mode list|heatmap]
                                     [--compare REV | --compare-loop] [--rounds K] [--json]
                                     [--profile FILE] [--cycle K] [--parts] [--full-history]
                                     [--layers] [--interval S]
16,384 GPUs (issue 27): --nodes 2048 --cycle 10 (the feeder cannot simulate them live on a core).
Without --nodes it runs the issue's set: 512x8 (4,096 GPUs) and 128x8 (1,024 GPUs).
Targets (issue 15, over 30 minutes at 4,096 GPUs): < 25% of one core, sample->paint p95
< 300 ms, RSS < 300 MB and flat over the last 20 minutes, quit < 1 s.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

try:
    from gpuctl.core.deadline import wait_for
except ImportError:  # --compare REV of a gpuctl before it (410797c): only to end the app's run
    from asyncio import wait_for  # noqa: TID251

REPO = Path(__file__).resolve().parent.parent
# The gpuctl the app runs (--compare points a run at another revision's); the feeder always
# runs this checkout's simulated GPUs, so both see the same numbers.
TREE = Path(os.environ.get("GPUCTL_BENCH_TREE") or REPO)
sys.path.insert(0, str(TREE))


# -- feeder (child process) -----------------------------------------------------------------------
def wire_of(tree: Path) -> int:
    """The protocol version the agents of ``tree``'s gpuctl speak (2: samples leave out what the
    hello holds), so that each tree under ``--compare`` reads lines of its own agents' shape."""
    session = (tree / "gpuctl" / "fleet" / "session.py").read_text()
    return 2 if "READS = (1, 2)" in session else 1


def sample_line(protocol: Any, msg: dict[str, Any], hello: dict[str, Any], wire: int) -> bytes:
    if wire == 2:
        msg = {**msg, "gpus": protocol.compact_gpus(msg["gpus"], hello["gpus"])}
    return bytes(protocol.encode(msg))


def feeder(fds: list[int], gpus: int, interval: float, cycle: int = 0, wire: int = 2) -> None:
    """Write a hello, then one sample per node per interval, node i at phase i/N, in the shape
    of protocol ``wire``.

    ``cycle`` > 0: each node's first ``cycle`` simulated samples are encoded once and written
    over and over with a fresh time and sequence number (the values repeat every ``cycle``
    seconds). Simulating 16,384 GPUs live takes more than one core; the app's work per line
    (read, decode, keep, paint) is the same either way."""
    if cycle > 0:
        cycled_feeder(fds, gpus, interval, cycle, wire)
        return
    from gpuctl.fleet.fixed_links import recorded_node
    from gpuctl.node import protocol
    from gpuctl.node.readers.sim import SimReader

    models = ("H100", "A100", "H200", "L40S")
    outs = [os.fdopen(fd, "wb", buffering=0) for fd in fds]
    readers = []
    hellos = []
    for i, out in enumerate(outs):
        spec = f"{gpus}:{models[i % len(models)]}"
        hello = {
            **recorded_node(f"bench-{i:03d}", spec, samples=0)[0],
            "protocol": wire,
            "interval": interval,
        }
        hellos.append(hello)
        out.write(protocol.encode(hello))
        readers.append(SimReader.from_spec(spec, seed=i))
    n = len(outs)
    start = time.monotonic()
    seq = 0
    while True:
        for i, (out, reader, hello) in enumerate(zip(outs, readers, hellos, strict=True)):
            due = start + seq * interval + interval * i / n
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)  # the feeder's cadence: a simulated clock, not synchronisation
            msg = {"type": "sample", "t": time.time(), "seq": seq, "gpus": reader.sample()}
            try:
                out.write(sample_line(protocol, msg, hello, wire))
            except BrokenPipeError:
                return
        seq += 1


def cycled_feeder(fds: list[int], gpus: int, interval: float, cycle: int, wire: int) -> None:
    from gpuctl.fleet.fixed_links import recorded_node
    from gpuctl.node import protocol
    from gpuctl.node.readers.sim import SimReader

    models = ("H100", "A100", "H200", "L40S")
    outs = [os.fdopen(fd, "wb", buffering=0) for fd in fds]
    lines: list[list[tuple[bytes, bytes, bytes]]] = []
    for i, out in enumerate(outs):
        spec = f"{gpus}:{models[i % len(models)]}"
        hello = {
            **recorded_node(f"bench-{i:03d}", spec, samples=0)[0],
            "protocol": wire,
            "interval": interval,
        }
        out.write(protocol.encode(hello))
        reader = SimReader.from_spec(spec, seed=i)
        node = []
        for _ in range(cycle):  # time and seq as markers, replaced at each write
            msg = {"type": "sample", "t": "@T@", "seq": "@S@", "gpus": reader.sample()}
            head, rest = sample_line(protocol, msg, hello, wire).split(b'"@T@"', 1)
            mid, tail = rest.split(b'"@S@"', 1)
            node.append((head, mid, tail))
        lines.append(node)
    n = len(outs)
    start = time.monotonic()
    seq = 0
    while True:
        for i, out in enumerate(outs):
            due = start + seq * interval + interval * i / n
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)  # the feeder's cadence: a simulated clock, not synchronisation
            head, mid, tail = lines[i][seq % cycle]
            try:
                out.write(b"%s%r%s%d%s" % (head, time.time(), mid, seq, tail))
            except BrokenPipeError:
                return
        seq += 1


def raise_open_files(needed: int) -> None:
    """Two descriptors per node (a pipe's ends) and the app's own: lift the soft limit."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed + 256:
        target = needed + 256 if hard == resource.RLIM_INFINITY else min(hard, needed + 256)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


# -- app side -------------------------------------------------------------------------------------
def pipe_link(fd: int) -> Any:
    try:
        from gpuctl.fleet.fixed_links import _Discard
    except ImportError:  # --compare REV of a gpuctl before the module's rename
        from gpuctl.fleet.replay import _Discard  # type: ignore[import-not-found,no-redef]
    from gpuctl.fleet import session
    from gpuctl.fleet.links import STREAM_LIMIT, NodeLink
    from gpuctl.fleet.session import AgentSession

    feed = session if hasattr(session, "LineFeed") else None

    class PipeLink(NodeLink):
        kind = "simulated"

        async def open(self) -> AgentSession:
            loop = asyncio.get_running_loop()
            # As the tree's own pipe links read (``ThreadSimLink``): a ``LineFeed`` where it
            # has one (its lines handed on by the transport's callback), else asyncio's reader.
            if feed is not None:
                reader: Any = feed.LineFeed(limit=STREAM_LIMIT)
                protocol: Any = lambda: feed.LineFeedProtocol(reader)  # noqa: E731
            else:
                reader = asyncio.StreamReader(limit=STREAM_LIMIT)
                protocol = lambda: asyncio.StreamReaderProtocol(reader)  # noqa: E731
            transport, _ = await loop.connect_read_pipe(protocol, os.fdopen(fd, "rb", buffering=0))

            async def close() -> None:
                transport.close()

            return AgentSession(reader, _Discard(), close=close)

    return PipeLink()


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def rss_mb() -> float:
    """This process's resident set, in MB (10^6 bytes)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 1e6


def slope_per_min(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MB) points, in MB per minute."""
    if len(points) < 2:
        return float("nan")
    mt = statistics.fmean(t for t, _ in points)
    mv = statistics.fmean(v for _, v in points)
    den = sum((t - mt) ** 2 for t, _ in points)
    return 60 * sum((t - mt) * (v - mv) for t, v in points) / den if den else float("nan")


def loop_runner() -> Any:
    """What runs the app's event loop: gpuctl's own (``gpuctl.fleet.eventloop``, as the screen
    runs), or asyncio's plain loop for ``--compare-loop`` and for a gpuctl from before it."""
    if os.environ.get("GPUCTL_BENCH_LOOP") == "plain":
        return asyncio.run
    try:
        from gpuctl.fleet.eventloop import run
    except ImportError:
        return asyncio.run
    return run


# ``--layers``: the variants, each without the layers before it (``strip_layers``).
LAYERS = ("whole", "no screen", "no fleet", "no decode")


def strip_layers(variant: str) -> None:
    """Take layers away in this process (``--layers``), cumulatively: ``no screen`` (the
    screen takes a node's first sample only), ``no fleet`` (the fleet too, and it watches no
    staleness: a node that stops moving on would go stale), ``no decode`` (a link decodes its
    first three lines only: the hello and a sample; the rest are read and dropped)."""
    if variant == "whole":
        return
    from gpuctl.core.model import NodeState
    from gpuctl.fleet.fleet import Fleet
    from gpuctl.fleet.session import AgentSession
    from gpuctl.tui.app import GpuctlApp

    on_snapshot = GpuctlApp._on_snapshot

    def first_only(app: Any, snapshot: Any) -> None:
        if not (snapshot.name in app.store.snaps and snapshot.gpus):
            on_snapshot(app, snapshot)

    GpuctlApp._on_snapshot = first_only  # type: ignore[method-assign]
    if variant == "no screen":
        return
    on_sample = Fleet._on_sample

    def first_sample(fleet: Any, rt: Any, sample: Any) -> None:
        if not (rt.snapshot.state is NodeState.LIVE and len(rt.history)):
            on_sample(fleet, rt, sample)

    async def no_watch(_fleet: Any) -> None:
        await asyncio.Event().wait()

    Fleet._on_sample = first_sample  # type: ignore[method-assign]
    Fleet._watch_stale = no_watch  # type: ignore[method-assign]
    if variant == "no fleet":
        return
    take = AgentSession._take
    seen: dict[int, int] = {}

    def first_lines(session: Any, line: Any) -> Any:
        n = seen[id(session)] = seen.get(id(session), 0) + 1
        return take(session, line) if n <= 3 else None

    AgentSession._take = first_lines  # type: ignore[method-assign]


# ``--parts``: (module, class or "", function) of the parts timed; one a tree lacks is left out.
PARTS = (
    ("gpuctl.fleet.session", "", "decode_line"),
    ("gpuctl.fleet.fleet", "Fleet", "_on_sample"),
    ("gpuctl.fleet.gpu_history", "NodeHistory", "add"),
    ("gpuctl.fleet.troublelog", "TroubleLog", "_on_snapshot"),
    ("gpuctl.fleet.idle", "IdleTracker", "observe"),
    ("gpuctl.tui.app", "GpuctlApp", "_on_snapshot"),
    ("gpuctl.tui.fleet_store", "FleetStore", "offer"),
    ("gpuctl.tui.app", "GpuctlApp", "_flush_pending"),
    ("gpuctl.tui.fleet_store", "FleetStore", "take_pending"),
    ("gpuctl.tui.widgets.overview", "NodeList", "nodes_changed"),
    ("gpuctl.tui.screens.overview", "OverviewScreen", "update_header"),
    ("textual.screen", "Screen", "_compositor_refresh"),
)


class Parts:
    """The thread time of each of ``PARTS`` and the compositor's updates, counted while
    ``on`` (the measured time). A part called inside another counts in both."""

    def __init__(self) -> None:
        import importlib

        self.on = False
        self.times: dict[str, list[float]] = {}
        self.updates = [0, 0]  # compositor updates: all, the header's row alone
        for module, owner, name in PARTS:
            try:
                where: Any = importlib.import_module(module)
                if owner:
                    where = getattr(where, owner)
                getattr(where, name)
            except (ImportError, AttributeError):
                continue
            setattr(where, name, self._timed(getattr(where, name), f"{owner or module}.{name}"))
        from textual._compositor import Compositor

        update = Compositor.render_partial_update

        def counted(compositor: Any) -> Any:
            if self.on and compositor._dirty_regions:
                self.updates[0] += 1
                self.updates[1] += all(
                    r.y == 0 and r.height == 1 for r in compositor._dirty_regions
                )
            return update(compositor)

        Compositor.render_partial_update = counted  # type: ignore[method-assign]
        # The garbage collector's time, per generation: a part that no function's time shows
        # (it runs inside whatever allocation triggers it).
        self.gc = {g: [0, 0.0] for g in range(3)}
        self._gc_start = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if not self.on:
            return
        if phase == "start":
            self._gc_start = time.thread_time()
        else:
            kept = self.gc[info["generation"]]
            kept[0] += 1
            kept[1] += time.thread_time() - self._gc_start

    def _timed(self, f: Any, label: str) -> Any:
        clock = time.thread_time
        kept = self.times.setdefault(label, [0, 0.0])

        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.on:
                return f(*args, **kwargs)
            t0 = clock()
            try:
                return f(*args, **kwargs)
            finally:
                kept[0] += 1
                kept[1] += clock() - t0

        return timed

    def result(self) -> dict[str, Any]:
        return {
            "parts": {
                **{k: {"calls": n, "s": t} for k, (n, t) in self.times.items() if n},
                **{
                    f"gc, generation {g}": {"calls": n, "s": t}
                    for g, (n, t) in self.gc.items()
                    if n
                },
            },
            "compositor_updates": self.updates[0],
            "header_only_updates": self.updates[1],
        }


def parts_report(r: dict[str, Any]) -> str:
    busy = r["cpu_share"] * r["seconds"]
    lines = [
        f"    compositor updates {r['compositor_updates']}, of the header's row alone "
        f"{r['header_only_updates']}"
    ]
    for label, p in sorted(r["parts"].items(), key=lambda kv: -kv[1]["s"]):
        lines.append(
            f"    {label:<34} {p['calls']:>7} calls {1e6 * p['s'] / p['calls']:8.1f} us a call"
            f"  {100 * p['s'] / busy:5.1f}% of the run's CPU"
        )
    return "\n".join(lines)


def run_once(nodes: int, gpus: int, seconds: float, mode: str, rss_every: float) -> dict[str, Any]:
    """Start the feeder, measure the app over its pipes, stop the feeder (in the run's process)."""
    raise_open_files(2 * nodes)
    pipes = [os.pipe() for _ in range(nodes)]
    cycle = os.environ.get("GPUCTL_BENCH_CYCLE", "0")
    child = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--feeder",
            json.dumps([w for _, w in pipes]),
            str(gpus),
            cycle,
            str(wire_of(TREE)),
        ],
        pass_fds=[w for _, w in pipes],
        env={**os.environ, "PYTHONPATH": str(REPO), "GPUCTL_BENCH_TREE": str(REPO)},
    )
    for _, w in pipes:
        os.close(w)
    try:
        result: dict[str, Any] = loop_runner()(
            measure([r for r, _ in pipes], gpus, seconds, mode, rss_every)
        )
        return result
    finally:
        child.kill()
        child.wait()


async def fill_histories(fleet: Any) -> None:
    """Give every node the history it has after hours (``--full-history``): its history is
    cleared (its buffers freed, so that the new ones can take their place: a fresh history
    beside the old one left the old one's 467 MB as holes, 1,187 MB at af2f7f2) and filled with
    its GPUs' latest sample at past times (one a minute for the older means, then one a
    second); node by node, each without a pause, so the screen runs on. Works with any
    revision's ``Fleet`` (``history_*``, ``NodeHistory.clear``)."""
    for rt in list(fleet.nodes.values()):
        gpus = rt.snapshot.gpus
        if not gpus:
            continue
        fresh = rt.history
        fresh.clear()
        now = time.time() - 1.0
        recent = int(fleet.history_len)
        start = now - recent - fleet.history_step * (fleet.history_older + 1)
        for k in range(fleet.history_older + 1):
            fresh.add(start + fleet.history_step * k, gpus)
        for k in range(recent):
            fresh.add(now - recent + k, gpus)
        await asyncio.sleep(0)  # the screen's turn between nodes


async def measure(
    fds: list[int], gpus: int, seconds: float, mode: str, rss_every: float
) -> dict[str, Any]:
    import gpuctl
    from gpuctl.core.model import NodeState
    from gpuctl.fleet.fleet import Fleet
    from gpuctl.tui import make_app

    nodes = len(fds)
    strip_layers(os.environ.get("GPUCTL_BENCH_LAYER") or "whole")
    parts = Parts() if os.environ.get("GPUCTL_BENCH_PARTS") else None
    fleet = Fleet({f"bench-{i:03d}": pipe_link(r) for i, r in enumerate(fds)})
    app = make_app(fleet, simulated=True, state_dir=Path(tempfile.mkdtemp()))
    arrival_paint: list[float] = []
    sample_paint: list[float] = []
    flushes = [0]
    measuring = [False]

    def on_paint(node: str, arrived: float) -> None:
        if measuring[0]:
            arrival_paint.append(time.monotonic() - arrived)
            t = app.store.snaps[node].last_sample_t
            if t is not None:
                sample_paint.append(time.time() - t)

    def on_flush(_names: set[str], _arrivals: dict[str, float]) -> None:
        if measuring[0]:
            flushes[0] += 1

    started = time.monotonic()
    rss: list[tuple[float, float]] = []
    task = asyncio.create_task(app.run_async(headless=True, size=(160, 48)))
    try:
        deadline = time.monotonic() + 120
        while not (
            app.is_running
            and app.overview.ready
            and all(s.state is NodeState.LIVE for s in app.store.snaps.values())
        ):
            if time.monotonic() > deadline or task.done():
                raise SystemExit("the benchmark fleet did not come up")
            await asyncio.sleep(0.1)
        first_frame_s = time.monotonic() - started
        if os.environ.get("GPUCTL_BENCH_FULL_HISTORY"):
            await fill_histories(fleet)
            await asyncio.sleep(10.0)  # the lines that came meanwhile read (a benchmark's wait)
        if mode == "heatmap":
            app.overview.action_heatmap()
        app.overview.nodes.on_paint = on_paint
        app.overview.heatmap.on_paint = on_paint
        app.on_flush = on_flush
        await asyncio.sleep(3.0)  # warm up: layout, caches
        measuring[0] = True
        profile = os.environ.get("GPUCTL_BENCH_PROFILE")
        prof = None
        if profile:  # the measured time under cProfile (slower: where the time goes, not figures)
            import cProfile

            prof = cProfile.Profile()
            prof.enable()
        if parts is not None:
            parts.on = True
        cpu0, wall0 = os.times(), time.monotonic()
        while (now := time.monotonic()) < wall0 + seconds:
            rss.append((now - wall0, rss_mb()))
            await asyncio.sleep(min(rss_every, wall0 + seconds - now))  # the sampling period
        rss.append((time.monotonic() - wall0, rss_mb()))
        cpu1, wall1 = os.times(), time.monotonic()
        if parts is not None:
            parts.on = False
        if prof is not None:
            prof.disable()
            prof.dump_stats(profile)
        measuring[0] = False
    finally:
        exit_called_at = time.time()
        app.exit(0)
        await wait_for(task, 120)
        app_exit_s = time.time() - exit_called_at
    busy = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    wall = wall1 - wall0
    tail = [(t, v) for t, v in rss if t >= wall / 3]
    return {
        "nodes": nodes,
        "gpus": gpus,
        "mode": mode,
        "gpuctl": str(Path(gpuctl.__file__).parent.parent),
        "seconds": wall,
        "first_frame_s": first_frame_s,
        "cpu_share": busy / wall,
        "paints": len(arrival_paint),
        "arrival_paint_p50_ms": 1000 * statistics.median(arrival_paint) if arrival_paint else None,
        "arrival_paint_p95_ms": 1000 * pct(arrival_paint, 0.95),
        "arrival_paint_max_ms": 1000 * max(arrival_paint, default=float("nan")),
        "sample_paint_p95_ms": 1000 * pct(sample_paint, 0.95),
        "flushes_per_s": flushes[0] / wall,
        "rss_mb": [round(v, 1) for _, v in rss],
        "rss_first_mb": rss[0][1],
        "rss_last_mb": rss[-1][1],
        "rss_peak_mb": max(v for _, v in rss),
        "rss_tail_slope_mb_per_min": slope_per_min(tail),
        "exit_called_at": exit_called_at,
        "app_exit_s": app_exit_s,  # of quit_s: until the app's run ended (links closed)
        **(parts.result() if parts is not None else {}),
    }


def run_process(
    nodes: int,
    gpus: int,
    seconds: float,
    mode: str,
    rss_every: float,
    tree: Path,
    loop: str = "",
    layer: str = "",
) -> dict[str, Any]:
    """One run in a process of its own, with ``tree``'s gpuctl (``layer``: one of ``LAYERS``);
    adds its quit time."""
    args = json.dumps([nodes, gpus, seconds, mode, rss_every])
    proc = subprocess.run(
        [sys.executable, __file__, "--run", args],
        env={
            **os.environ,
            "GPUCTL_BENCH_TREE": str(tree),
            "PYTHONPATH": str(tree),
            "GPUCTL_BENCH_LOOP": loop,
            "GPUCTL_BENCH_LAYER": layer,
        },
        stdout=subprocess.PIPE,
        check=True,
    )
    ended = time.time()
    r: dict[str, Any] = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    r["quit_s"] = ended - r.pop("exit_called_at")
    return r


def old_tree(rev: str) -> Path:
    """gpuctl of git revision ``rev``, extracted to a temporary folder."""
    folder = Path(tempfile.mkdtemp(prefix="gpuctl-bench-"))
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev, "gpuctl"], stdout=subprocess.PIPE, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder


def report(r: dict[str, Any], label: str = "") -> str:
    return (
        f"{label}{r['nodes']:>4}x{r['gpus']} ({r['nodes'] * r['gpus']} GPUs) {r['mode']:<7} "
        f"{r['seconds'] / 60:.1f} min: CPU {100 * r['cpu_share']:5.1f}% of one core"
        f"  sample->paint p95 {r['sample_paint_p95_ms']:6.1f} ms"
        f"  arrival->paint p50 {r['arrival_paint_p50_ms'] or float('nan'):6.1f} ms p95 "
        f"{r['arrival_paint_p95_ms']:6.1f} ms max {r['arrival_paint_max_ms']:6.1f} ms"
        f" (n={r['paints']})\n    RSS {r['rss_first_mb']:.0f} -> {r['rss_last_mb']:.0f} MB"
        f" (peak {r['rss_peak_mb']:.0f}, last 2/3: {r['rss_tail_slope_mb_per_min']:+.1f} MB/min)"
        f"  quit {r['quit_s']:.2f} s (app {r['app_exit_s']:.2f} s)"
        f"  first frame {r['first_frame_s']:.1f} s"
        f"  flushes {r['flushes_per_s']:.1f}/s\n    RSS every period (MB): {r['rss_mb']}"
    )


def ratios(old: dict[str, Any], new: dict[str, Any]) -> str:
    def ratio(key: str) -> str:
        a, b = old[key], new[key]
        return f"{a / b:.1f}x" if b else "-"

    growth_old = old["rss_last_mb"] - old["rss_first_mb"]
    growth_new = new["rss_last_mb"] - new["rss_first_mb"]
    return (
        f"    old/new: CPU {ratio('cpu_share')}  sample->paint p95 {ratio('sample_paint_p95_ms')}"
        f"  RSS at the end {ratio('rss_last_mb')}  quit {ratio('quit_s')}"
        f"  RSS growth {growth_old:+.0f} MB vs {growth_new:+.0f} MB"
    )


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--feeder":
        interval = float(os.environ.get("GPUCTL_BENCH_INTERVAL") or 1.0)
        feeder(
            json.loads(sys.argv[2]), int(sys.argv[3]), interval, int(sys.argv[4]), int(sys.argv[5])
        )
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "--run":
        nodes, gpus, seconds, mode, rss_every = json.loads(sys.argv[2])
        r = run_once(nodes, gpus, seconds, mode, rss_every)
        print(json.dumps(r), flush=True)
        return 0
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--nodes", type=int)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--minutes", type=float, default=1.0, help="measured time per run")
    p.add_argument("--seconds", type=float, help="measured time per run (instead of --minutes)")
    p.add_argument("--mode", choices=("list", "heatmap"), default="list")
    p.add_argument("--rss-every", type=float, default=10.0, help="seconds between RSS readings")
    p.add_argument(
        "--compare",
        metavar="REV",
        action="append",
        help="also run git revision REV's gpuctl (given twice or more: each, in one alternation)",
    )
    p.add_argument(
        "--compare-loop",
        action="store_true",
        help="also run this checkout on asyncio's plain event loop (not gpuctl's gathering one)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="with a comparison: alternate the two this many times, report medians",
    )
    p.add_argument(
        "--cycle",
        type=int,
        default=0,
        metavar="K",
        help="the feeder writes each node's first K simulated samples over and over (for "
        "fleets too large to simulate live on one core: 2,048 nodes)",
    )
    p.add_argument(
        "--layers",
        action="store_true",
        help="run this checkout whole and with the screen, the fleet and the decoding taken "
        "away in turn (LAYERS), alternated: each layer's CPU is a difference",
    )
    p.add_argument(
        "--interval",
        type=float,
        default=1.0,
        metavar="S",
        help="seconds between a node's samples (its agent's interval: 1 by default)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per run")
    p.add_argument(
        "--profile", metavar="FILE", help="cProfile the app's measured time into FILE (pstats)"
    )
    p.add_argument(
        "--parts",
        action="store_true",
        help="also the thread time of each of PARTS and the compositor's updates",
    )
    p.add_argument(
        "--full-history",
        action="store_true",
        help="before measuring, fill every node's history as hours of samples would (its "
        "memory is then what it holds at its full size, not after the run's minutes)",
    )
    args = p.parse_args()
    os.environ["GPUCTL_BENCH_CYCLE"] = str(args.cycle)
    os.environ["GPUCTL_BENCH_INTERVAL"] = str(args.interval)
    if args.full_history:
        os.environ["GPUCTL_BENCH_FULL_HISTORY"] = "1"
    if args.parts:
        os.environ["GPUCTL_BENCH_PARTS"] = "1"
    if args.profile:
        os.environ["GPUCTL_BENCH_PROFILE"] = str(Path(args.profile).resolve())
    seconds = args.seconds if args.seconds is not None else 60 * args.minutes
    sizes = [args.nodes] if args.nodes else [512, 128]
    trees = [("new", REPO, "")]
    for rev in args.compare or ():
        trees.append((f"old ({rev})", old_tree(rev), ""))
    if args.compare_loop and not args.compare:
        trees.append(("plain loop", REPO, "plain"))
    if args.layers:
        return run_layers(sizes, args)
    compare = len(trees) > 1
    for n in sizes:
        results: dict[str, list[dict[str, Any]]] = {label: [] for label, _, _ in trees}
        # Alternated, so that a machine that slows down or speeds up meanwhile (a shared host
        # does, by several points) weighs on both alike.
        for _ in range(args.rounds if compare else 1):
            for label, tree, loop in trees:
                r = run_process(n, args.gpus, seconds, args.mode, args.rss_every, tree, loop)
                results[label].append(r)
                line = json.dumps({"code": label, **r}) if args.json else report(r, f"{label}: ")
                print(line if compare or args.json else report(r), flush=True)
                if args.parts and not args.json:
                    print(parts_report(r), flush=True)
        if compare and not args.json:
            new = results["new"]
            for label, _, _ in trees[1:]:
                old = results[label]
                if len(new) > 1:
                    print(medians(old, new, label), flush=True)
                print(f"  against {label}:", flush=True)
                print(ratios(middle(old), middle(new)), flush=True)
    return 0


def run_layers(sizes: list[int], args: argparse.Namespace) -> int:
    """``--layers``: each of ``LAYERS`` a run of this checkout, alternated ``--rounds`` times;
    prints each variant's median CPU and each layer's share (the difference of neighbours)."""
    seconds = args.seconds if args.seconds is not None else 60 * args.minutes
    for n in sizes:
        shares: dict[str, list[float]] = {v: [] for v in LAYERS}
        for _ in range(args.rounds):
            for variant in LAYERS:
                r = run_process(n, args.gpus, seconds, args.mode, args.rss_every, REPO, "", variant)
                shares[variant].append(100 * r["cpu_share"])
                print(f"{variant:>10}: {report(r).splitlines()[0]}", flush=True)
        med = {v: statistics.median(x) for v, x in shares.items()}
        print(f"  {n} nodes x {args.gpus} GPUs, CPU of one core (median of {args.rounds}):")
        for v in LAYERS:
            runs = ", ".join(f"{x:.1f}" for x in shares[v])
            print(f"    {v:>10}: {med[v]:5.2f} %   (runs: {runs})")
        names = ("the screen (store, flushes, paints)", "the fleet (history, bookkeeping)")
        names += ("decoding the lines", "reading them, the loop, an idle screen")
        below = [*LAYERS[1:], None]
        for name, v, under in zip(names, LAYERS, below, strict=True):
            own = med[v] - (med[under] if under else 0.0)
            print(f"    {name:>40}: {own:5.2f} % ({100 * own / med['whole']:.0f} % of the whole)")
    return 0


def middle(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median CPU share (the upper one of an even count)."""
    return sorted(runs, key=lambda r: r["cpu_share"])[len(runs) // 2]


def medians(old: list[dict[str, Any]], new: list[dict[str, Any]], label: str) -> str:
    def cpu(runs: list[dict[str, Any]]) -> str:
        shares = [100 * r["cpu_share"] for r in runs]
        each = ", ".join(f"{x:.1f}" for x in shares)
        return f"median {statistics.median(shares):.1f}% (runs: {each})"

    def others(runs: list[dict[str, Any]]) -> str:
        def med(key: str) -> float:
            return statistics.median(r[key] for r in runs)

        return (
            f"sample->paint p95 {med('sample_paint_p95_ms'):.0f} ms, RSS peak "
            f"{med('rss_peak_mb'):.0f} MB, first frame {med('first_frame_s'):.1f} s"
        )

    return (
        f"    CPU of one core, new: {cpu(new)}; {label}: {cpu(old)}\n"
        f"    medians, new: {others(new)}; {label}: {others(old)}"
    )


if __name__ == "__main__":
    sys.exit(main())
