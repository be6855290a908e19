"""What one oversized answer costs ``gpuctl status --prometheus`` (issue 38): a stand-in store
answers every query with ``--mib`` MiB of valid series (one GPU's, repeated), and the command's
peak RSS (``wait4``'s ``ru_maxrss``), wall time and last line are printed. With ``--tree`` the
command runs from another source tree (the baseline: ``git archive BASE | tar -x -C DIR``).

Usage: python benchmarks/prom_bounds.py [--mib 256] [--tree DIR]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpuctl_tests.harness.prometheus import StandInStore  # noqa: E402

SERIES = b'{"metric":{"Hostname":"node-a","gpu":"0"},"value":[1700000000.0,"1"]},'
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"


def oversized(mib: int) -> StandInStore:
    """A store whose first answer (a poll's stamp query) is ``mib`` MiB of series, its length
    unsaid; the others one series. (Every answer that large, 8 of them read at once by the
    code before, took it past 23 GB here: one is the attack measured.)"""
    block = SERIES * ((1 << 20) // len(SERIES))
    asked = [0]

    def answer(conn: socket.socket, query: str) -> None:
        asked[0] += 1
        conn.sendall(HEAD + b'{"status":"success","data":{"resultType":"vector","result":[')
        for _ in range(mib if asked[0] == 1 else 0):
            conn.sendall(block)
        conn.sendall(SERIES[:-1] + b"]}}")

    return StandInStore(answer)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=256, help="MiB of each answer (256)")
    ap.add_argument("--tree", default=str(REPO), help="the source tree gpuctl runs from")
    args = ap.parse_args()
    store = oversized(args.mib)
    env = dict(os.environ, PYTHONPATH=args.tree)
    started = time.monotonic()
    p = subprocess.Popen(
        [sys.executable, "-m", "gpuctl", "status", "--prometheus", store.url, "--timeout", "120"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        cwd="/",
    )
    assert p.stderr is not None
    err = p.stderr.read().decode(errors="replace")
    _pid, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - started
    store.close()
    last = err.strip().splitlines()[-1] if err.strip() else ""
    print(f"tree: {args.tree}")
    print(f"answer: {args.mib} MiB")
    print(f"exit: {p.returncode}  wall: {wall:.1f} s  peak RSS: {usage.ru_maxrss / 1024:.0f} MiB")
    print(f"line: {last[:300]}")


if __name__ == "__main__":
    main()
