"""What GPU processes and the host figures cost the agent: CPU per sample with and without them.

The real agent over the stand-in libnvidia-ml.so.1 (8 GPUs), first with no processes, then with
``--procs`` real ``sleep`` processes spread over the GPUs (each with a per-process utilization
sample, and half of them under one ``sh`` launcher so the sample carries parents): every sample
then reads /proc/PID/stat for each of them, and the host's four /proc files. The agent's CPU is
measured as ``benchmarks/agent_cpu.py`` does (its main thread's schedstat across a window of
samples, start-up excluded); the line size is the mean sample line in bytes.

Usage: python3 benchmarks/gpu_processes.py [--procs 64] [--samples 200] [--interval 0.1]
       [--python PATH]   (e.g. ~/.pyenv/versions/3.6.15/bin/python: the bundle, as on a node)
Target (issue 2): < 5 ms of CPU per sample at 1 Hz.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.agent_cpu import Agent, cpu_ns  # noqa: E402
from gpuctl.bundle import write_bundle  # noqa: E402
from gpuctl.node.proc import descendants  # noqa: E402
from gpuctl_tests.node.nvml_stub import CONFIG_ENV, build  # noqa: E402

GPUS = 8


def run(
    command: list[str], env: dict[str, str], interval: float, samples: int
) -> tuple[float, int, int, int]:
    """The agent's CPU ms per sample, the last sample's line size, its processes and parents."""
    agent = Agent(command, ["--interval", str(interval)], env)
    try:
        hello = agent.next_message()
        if not hello.get("reader"):
            raise RuntimeError(f"no reader: {hello.get('reader_error')}")
        for _ in range(3):
            agent.next_sample()
        first = agent.next_sample()
        start = cpu_ns(agent.proc.pid)
        last = first
        for _ in range(samples):
            last = agent.next_sample()
        used = cpu_ns(agent.proc.pid) - start
        count = int(str(last["seq"])) - int(str(first["seq"]))
        line = len(json.dumps(last, separators=(",", ":")))
        gpus: list[dict[str, list[object]]] = last["gpus"]  # type: ignore[assignment]
        procs = sum(len(g["processes"]) for g in gpus)
        parents: list[object] = last.get("parents") or []  # type: ignore[assignment]
        return used / count / 1e6, line, procs, len(parents)
    finally:
        agent.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--procs", type=int, default=64, help="sleep processes on the GPUs")
    p.add_argument("--samples", type=int, default=200)
    p.add_argument("--interval", type=float, default=0.1, help="seconds (>= 0.1)")
    p.add_argument("--python", default=sys.executable, help="the agent's interpreter")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gpuctl-bench-"))
    lib = build(tmp)
    config = tmp / "nvml.conf"
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = str(lib)
    env[CONFIG_ENV] = str(config)
    if args.python == sys.executable:
        command = [args.python, "-m", "gpuctl.node"]
        env["PYTHONPATH"] = str(REPO)
    else:
        command = [args.python, str(write_bundle(tmp / "bundle"))]
        env.pop("PYTHONPATH", None)
    half = args.procs // 2
    launcher = subprocess.Popen(
        ["sh", "-c", " & ".join(["sleep 600"] * half) + " & wait"], start_new_session=True
    )
    lone = [
        subprocess.Popen(["sleep", "600"], start_new_session=True) for _ in range(args.procs - half)
    ]
    try:
        deadline = time.monotonic() + 10
        while True:
            kids = descendants(launcher.pid)
            if len(kids) >= half or time.monotonic() > deadline:
                break
            time.sleep(0.05)  # a poll interval while the shell forks its children
        pids = kids + [p.pid for p in lone]
        print(
            f"agent {' '.join(command)}; {GPUS} GPUs; {args.samples} samples at {args.interval} s"
        )
        print(f"{'case':<28} {'procs':>6} {'parents':>8} {'CPU/sample':>12} {'line bytes':>11}")
        for label, script in (
            ("no processes", f"count {GPUS}\n"),
            (
                f"{len(pids)} processes",
                f"count {GPUS}\n"
                + "".join(f"proc {i % GPUS} {pid} {256 + i}\n" for i, pid in enumerate(pids))
                + "".join(f"procutil {i % GPUS} {pid} {i % 100} 5\n" for i, pid in enumerate(pids)),
            ),
        ):
            config.write_text(script)
            ms, line, procs, parents = run(command, env, args.interval, args.samples)
            print(f"{label:<28} {procs:>6} {parents:>8} {ms:>9.3f} ms {line:>11}", flush=True)
    finally:
        for proc in [launcher, *lone]:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            proc.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
