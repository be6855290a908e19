"""What ``gpuctl serve`` holds in memory with 1 and with 10 browser tabs, and with one tab that
asks for a 20000 x 20000 terminal (clamped to ``MAX_WIDTH`` x ``MAX_HEIGHT`` since #28).

Each tab is a websocket (aiohttp, read continuously like a browser would) with the size a
1920 x 1080 browser window asks for at the default font (200 x 55), or the oversized one. After
``--warmup`` seconds, the resident memory (RSS, from /proc, of the server and every process it
started: each tab is a whole ``gpuctl`` screen) is summed, the server's own apart.

Usage: python benchmarks/serve_sessions.py [--nodes 6] [--gpus 8] [--warmup 15]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from serve_cpu import tree  # noqa: E402


def rss_mb(pid: int) -> float:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    m = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
    return int(m.group(1)) / 1024 if m else 0.0


async def with_tabs(
    ws_url: str, sizes: list[tuple[int, int]], warmup: float, server: int
) -> tuple[float, float]:
    """Open the tabs, wait ``warmup``, measure: (the server's RSS, the whole tree's) in MB."""
    import aiohttp

    async def drain(ws: aiohttp.ClientWebSocketResponse) -> None:
        async for msg in ws:
            if msg.type not in (aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.TEXT):
                break

    async with aiohttp.ClientSession() as client:
        sockets = [
            await client.ws_connect(f"{ws_url}&width={w}&height={h}", max_msg_size=0)
            for w, h in sizes
        ]
        readers = [asyncio.create_task(drain(ws)) for ws in sockets]
        await asyncio.sleep(warmup)  # the screens start and draw; measured with the tabs open
        figures = rss_mb(server), sum(rss_mb(p) for p in tree(server))
        for ws in sockets:
            await ws.close()
        for r in readers:
            r.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
    return figures


def measure(args: argparse.Namespace, sizes: list[tuple[int, int]]) -> tuple[float, float]:
    demo = ["--demo", "--nodes", str(args.nodes), "--gpus", str(args.gpus)]
    limits = ["--listen", "127.0.0.1:0", "--max-sessions", "10"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuctl", "serve", *demo, *limits],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
    )
    try:
        assert proc.stdout is not None
        url = re.search(r"(http://\S+)", proc.stdout.readline())
        assert url is not None, "gpuctl serve printed no URL"
        base, token = url.group(1).split("/?token=")
        ws_url = base.replace("http://", "ws://") + "/ws?token=" + token
        return asyncio.run(with_tabs(ws_url, sizes, args.warmup, proc.pid))
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)
        if proc.poll() is None:
            proc.kill()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=6)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--warmup", type=float, default=15.0)
    args = ap.parse_args()
    print(f"demo {args.nodes} nodes x {args.gpus} GPUs; measured after {args.warmup:g} s")
    one = None
    for name, sizes in (
        ("1 tab 200x55", [(200, 55)]),
        ("10 tabs 200x55", [(200, 55)] * 10),
        ("1 tab asking 20000x20000", [(20000, 20000)]),
    ):
        server, total = measure(args, sizes)
        one = one or total
        print(
            f"{name:26} server {server:7.1f} MB   server+screens {total:8.1f} MB"
            f"   x{total / one:.2f} of 1 tab"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
