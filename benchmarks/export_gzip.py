"""Export gzip benchmark: the CPU and bytes of gzipping ``gpuctl export``'s whole text at each
level, and by ISA-L (``isal``) and zlib-ng (``zlib-ng``) where they are importable (neither is a
dependency of gpuctl: ``pip install isal zlib-ng`` in another environment to compare).

The text is the exposition of N nodes x G GPUs whose agents said a hello and one sample each (as
``benchmarks/export_scrape.py`` builds it). Each compressor runs ``--rounds`` times, alternated
with the others; it prints the median ms of CPU (``time.process_time``) and the bytes.

Usage: python benchmarks/export_gzip.py [--nodes 512] [--gpus 8] [--rounds 7]
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import statistics
import time
import zlib
from collections.abc import Callable

from gpuctl.core.model import NodeState
from gpuctl.fleet.export import GZIP_LEVEL, FleetExporter
from gpuctl.fleet.fixed_links import ReplayLink, recorded_node
from gpuctl.fleet.fleet import Fleet
from gpuctl.fleet.links import NodeLink


async def exposition(nodes: int, gpus: int) -> bytes:
    now = time.time()
    links: dict[str, NodeLink] = {
        f"node{i:04d}": ReplayLink(
            recorded_node(f"node{i:04d}", f"{gpus}:H100", seed=i, t0=now, samples=1)
        )
        for i in range(nodes)
    }
    fleet = Fleet(links, stale_after=1e9, concurrency=nodes)
    live = asyncio.Event()

    def check(_s: object) -> None:
        if all(s.state is NodeState.LIVE and s.gpus for s in fleet.snapshots()):
            live.set()

    fleet.subscribe(check)
    await fleet.start()
    await live.wait()
    try:
        return b"".join(FleetExporter(fleet, clock=lambda: now).body())
    finally:
        await fleet.stop()


def compressors() -> dict[str, Callable[[bytes], bytes]]:
    found: dict[str, Callable[[bytes], bytes]] = {}
    for level in (1, 2, 3, 6):
        mark = " (gpuctl's)" if level == GZIP_LEVEL else ""
        found[f"zlib {zlib.ZLIB_RUNTIME_VERSION} level {level}{mark}"] = lambda text, level=level: (
            gzip.compress(text, level, mtime=0)
        )
    try:
        from isal import igzip  # type: ignore[import-not-found]

        for level in (0, 1, 2):
            found[f"isal igzip level {level}"] = lambda text, level=level: igzip.compress(
                text, level
            )
    except ImportError:
        print("isal: not importable; skipped")
    try:
        from zlib_ng import gzip_ng  # type: ignore[import-not-found]

        for level in (1, 2):
            found[f"zlib-ng level {level}"] = lambda text, level=level: gzip_ng.compress(
                text, level, mtime=0
            )
    except ImportError:
        print("zlib-ng: not importable; skipped")
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=512)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    text = asyncio.run(exposition(args.nodes, args.gpus))
    found = compressors()
    times: dict[str, list[float]] = {name: [] for name in found}
    sizes: dict[str, int] = {}
    for _ in range(args.rounds):
        for name, compress in found.items():
            start = time.process_time()
            out = compress(text)
            times[name].append(time.process_time() - start)
            sizes[name] = len(out)
    gpus = args.nodes * args.gpus
    print(f"text of {gpus} GPUs: {len(text) / 1e6:.1f} MB; median of {args.rounds} rounds")
    for name in found:
        ms = statistics.median(times[name]) * 1000
        print(
            f"  {name:32s} {ms:6.1f} ms of CPU, {sizes[name] / 1e3:6.0f} kB "
            f"({len(text) / sizes[name]:.1f}x), {sizes[name] / gpus:.0f} bytes per GPU"
        )


if __name__ == "__main__":
    main()
