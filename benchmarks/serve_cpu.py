"""What one browser session of ``gpuctl serve`` costs the login node, against the same screen in a
terminal, measured in the same run.

1. ``gpuctl demo --nodes N --gpus G --read-only`` in a tmux terminal: its CPU share (the baseline:
   what a user at a terminal costs);
2. ``gpuctl serve --demo`` with nobody connected: the server's idle CPU;
3. the same server with one headless chromium on the page: the server process (websocket relay)
   and the session's screen process, each and summed; chromium's own CPU apart (on a real
   cluster the browser runs on the laptop, not on the login node).

CPU share = (user + system time) / wall time of the process and its live descendants, 100% = one
core. Usage: python benchmarks/serve_cpu.py [--nodes 128] [--gpus 8] [--seconds 60]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")


def tree(pid: int) -> list[int]:
    parents: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            parents[int(d.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, todo = [pid], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parents.items() if pp == p]
        found += kids
        todo += kids
    return found


def cpu_s(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / TICK
    return total


def share(pids_of: dict[str, list[int]], seconds: float) -> dict[str, float]:
    before = {k: cpu_s(v) for k, v in pids_of.items()}
    t0 = time.monotonic()
    time.sleep(seconds)  # the measuring window
    wall = time.monotonic() - t0
    return {k: 100 * (cpu_s(v) - before[k]) / wall for k, v in pids_of.items()}


def session_pids(server: int) -> list[int]:
    return [p for p in tree(server) if p != server]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=128)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--warmup", type=float, default=15.0)
    a = ap.parse_args()
    demo = ["--demo", "--nodes", str(a.nodes), "--gpus", str(a.gpus)]
    gpuctl = [sys.executable, "-m", "gpuctl"]
    print(f"{a.nodes} nodes x {a.gpus} GPUs = {a.nodes * a.gpus} GPUs, {a.seconds:g} s windows")

    # 1. the terminal baseline, in tmux at the browser's size
    name = f"serve-bench-{os.getpid()}"
    cmd = " ".join([*gpuctl, "demo", *demo[1:], "--read-only"])
    subprocess.run(["tmux", "new-session", "-d", "-s", name, "-x", "170", "-y", "50", cmd])
    try:
        pane = subprocess.run(
            ["tmux", "list-panes", "-t", name, "-F", "#{pane_pid}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()[0]
        time.sleep(a.warmup)  # let the fleet connect and the screen settle: not measured
        term = share({"terminal": tree(int(pane))}, a.seconds)["terminal"]
    finally:
        subprocess.run(["tmux", "kill-session", "-t", name], check=False)
    print(f"  the screen in a terminal (tmux 170x50):     {term:6.1f}% of one core")

    # 2./3. the server, idle and with one browser session
    server = subprocess.Popen(
        [*gpuctl, "serve", *demo, "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    assert server.stdout is not None
    m = re.search(r"(http://\S+)", server.stdout.readline())
    assert m, "gpuctl serve printed no URL"
    from selenium import webdriver

    try:
        idle = share({"server": [server.pid]}, min(a.seconds, 20.0))["server"]
        print(f"  gpuctl serve, nobody connected:            {idle:6.1f}%")
        options = webdriver.ChromeOptions()
        options.binary_location = "/usr/bin/chromium"
        for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,900"):
            options.add_argument(arg)
        service = webdriver.ChromeService(executable_path="/usr/bin/chromedriver")
        driver = webdriver.Chrome(options=options, service=service)
        try:
            driver.get(m.group(1))
            deadline = time.monotonic() + 60
            while not session_pids(server.pid) and time.monotonic() < deadline:
                time.sleep(0.1)  # poll for the session's process
            time.sleep(a.warmup)  # connect and settle: not measured
            browser = tree(driver.service.process.pid)
            got = share(
                {
                    "server": [server.pid],
                    "session": session_pids(server.pid),
                    "chromium": browser,
                },
                a.seconds,
            )
        finally:
            driver.quit()
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(30)
    login = got["server"] + got["session"]
    print(f"  gpuctl serve with one browser session:     {got['server']:6.1f}% (relay)")
    print(f"  that session's screen process:             {got['session']:6.1f}%")
    ratio = login / term
    print(f"  one browser session on the login node:     {login:6.1f}% = {ratio:.2f}x terminal")
    print(f"  chromium itself (on the user's laptop):    {got['chromium']:6.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
