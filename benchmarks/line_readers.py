"""Line readers benchmark: the event loop's CPU per agent line, a task per node against one reader.

What the screen pays per line before it decodes it (issue 42's first step: "one reader for many
nodes' lines per loop pass instead of a task per node"). ``--nodes`` pipes, each written one line
of ~4.5 KB (an 8-GPU sample's size) a second by a thread of this process, phases spread over the
second, read on gpuctl's event loop (``gpuctl.fleet.eventloop``) in one of two ways:

* task: a task per pipe awaiting ``asyncio.StreamReader.readline`` (what each node's task does
  under ``AgentSession.messages``, without the session's own frames),
* one: a protocol per pipe whose ``data_received`` cuts the complete lines off and adds them to
  one list, which one callback per loop pass takes (a loop pass takes ~10 nodes' lines: the loop
  gathers I/O for 20 ms).

Each handler only counts the line. Prints the loop thread's CPU (``time.thread_time``: the
writing thread is left out) per line and as a share of one core, alternating the two
``--rounds`` times, and the medians.

``--ssh K``: the whole login side over real SSH instead: K OpenSSH servers on 127.0.0.1 (the test
harness), each running the real agent (``--gpus`` simulated GPUs, a sample every
``--interval`` s), reached by the real ``Fleet`` over ``SshLink`` on gpuctl's event loop, in a
child process per run; prints the loop thread's CPU per sample (SSH decryption, reading, decoding
and the fleet's bookkeeping: all of it in that thread) and as a share of a core, for this tree
and, with ``--base TREE`` (another revision's files: ``git archive af2f7f2 | tar -x -C TREE``),
for that tree, alternated ``--rounds`` times, and the medians.

``--local`` (with ``--ssh``): the same agents over local pipes too (``via = "local"``), alternated:
what SSH itself adds to a sample.

``--srun K``: the same through one srun step over a test Slurm of K nodes (one slurmd per
network namespace: root) and a job holding them.

Usage: python benchmarks/line_readers.py [--nodes 512] [--seconds 8] [--rounds 3]
       python benchmarks/line_readers.py --ssh 32 [--base /tmp/base] [--local] [--interval 0.25]
       python benchmarks/line_readers.py --srun 16 --base /tmp/base [--interval 0.25]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
# ``--tree T`` (a child of ``--ssh``): gpuctl imported from T's files
TREE = Path(sys.argv[sys.argv.index("--tree") + 1]) if "--tree" in sys.argv else HERE
sys.path.insert(0, str(TREE))

from gpuctl.fleet.eventloop import run  # noqa: E402

LINE = b'{"type":"sample","t":1,"gpus":[' + b"0" * 4400 + b"]}\n"


def feeder(fds: list[int], stop: threading.Event) -> None:
    """One line a second on each pipe, pipe i at phase i/N."""
    n = len(fds)
    start = time.monotonic()
    seq = 0
    while not stop.is_set():
        for i, fd in enumerate(fds):
            delay = start + seq + i / n - time.monotonic()
            if delay > 0:
                time.sleep(delay)  # the feeder's cadence: a simulated clock
            if stop.is_set():
                return
            os.write(fd, LINE)
        seq += 1


async def task_per_pipe(fds: list[int], count: list[int]) -> list[asyncio.Task[None]]:
    loop = asyncio.get_running_loop()

    async def node(fd: int) -> None:
        reader = asyncio.StreamReader(limit=1 << 22)
        await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0)
        )
        while await reader.readline():
            count[0] += 1

    return [asyncio.create_task(node(fd)) for fd in fds]


class Batch:
    """The lines of every pipe that came in one loop pass, taken by one callback."""

    def __init__(self, loop: asyncio.AbstractEventLoop, count: list[int]) -> None:
        self.loop = loop
        self.items: list[tuple[object, bytes]] = []
        self.count = count

    def put(self, source: object, chunk: bytes) -> None:
        if not self.items:
            self.loop.call_soon(self.take)
        self.items.append((source, chunk))

    def take(self) -> None:
        items, self.items = self.items, []
        for _source, chunk in items:
            for _line in chunk.splitlines():
                self.count[0] += 1


class Lines(asyncio.Protocol):
    def __init__(self, batch: Batch) -> None:
        self.rest = b""
        self.batch = batch

    def data_received(self, data: bytes) -> None:
        buf = self.rest + data if self.rest else data
        end = buf.rfind(b"\n")
        if end < 0:
            self.rest = buf
            return
        self.rest = buf[end + 1 :]
        self.batch.put(self, buf[: end + 1])


async def one_reader(fds: list[int], count: list[int]) -> list[asyncio.Task[None]]:
    loop = asyncio.get_running_loop()
    batch = Batch(loop, count)
    for fd in fds:
        await loop.connect_read_pipe(lambda: Lines(batch), os.fdopen(fd, "rb", buffering=0))
    return []


async def measure(kind: str, nodes: int, seconds: float) -> tuple[float, float]:
    pipes = [os.pipe() for _ in range(nodes)]
    count = [0]
    start = task_per_pipe if kind == "task" else one_reader
    tasks = await start([r for r, _ in pipes], count)
    stop = threading.Event()
    writer = threading.Thread(target=feeder, args=([w for _, w in pipes], stop), daemon=True)
    writer.start()
    await asyncio.sleep(2.0)  # warm up: every pipe has sent a line
    cpu0, n0 = time.thread_time(), count[0]
    await asyncio.sleep(seconds)  # the measured time
    cpu1, n1 = time.thread_time(), count[0]
    stop.set()
    writer.join()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for _, w in pipes:
        os.close(w)
    return 1e6 * (cpu1 - cpu0) / max(1, n1 - n0), (cpu1 - cpu0) / seconds


async def ssh_child(config: Path, seconds: float) -> dict[str, float]:
    """The fleet of ``config`` started; once every node sampled and 2 s more, the loop thread's
    CPU per new sample over ``seconds``."""
    from gpuctl.config import load_config
    from gpuctl.core.deadline import wait_for
    from gpuctl.fleet.build import fleet_from_config

    fleet = fleet_from_config(load_config(config))
    n = len(fleet.names)
    count = [0]
    last: dict[str, float] = {}
    ready = asyncio.Event()

    def listener(snap: Any) -> None:
        if snap.last_sample_t is not None and last.get(snap.name) != snap.last_sample_t:
            last[snap.name] = snap.last_sample_t
            count[0] += 1
            if len(last) == n:
                ready.set()

    fleet.subscribe(listener)
    await fleet.start()
    try:
        await wait_for(ready.wait(), 300)
        await asyncio.sleep(2.0)  # warm up
        cpu0, n0, t0 = time.thread_time(), count[0], time.monotonic()
        await asyncio.sleep(seconds)  # the measured time
        cpu1, n1, t1 = time.thread_time(), count[0], time.monotonic()
    finally:
        await fleet.stop()
    return {"us": 1e6 * (cpu1 - cpu0) / max(1, n1 - n0), "share": (cpu1 - cpu0) / (t1 - t0)}


def fleet_compare(args: argparse.Namespace) -> None:
    """``--ssh K`` or ``--srun K``: this tree against ``--base``, alternated."""
    sys.path.insert(0, str(HERE))
    trees = {"this": HERE}
    if args.base:
        trees = {"base": Path(args.base).resolve(), **trees}
    if args.local:
        trees["local"] = HERE  # this tree, its agents over pipes: what SSH adds
    results: dict[str, list[float]] = {k: [] for k in trees}
    nodes = args.ssh or args.srun
    with tempfile.TemporaryDirectory() as tmp_name, contextlib.ExitStack() as stack:
        tmp = Path(tmp_name)
        if args.ssh:
            what = f"{nodes} sshd nodes"
            configs = ssh_configs(stack, tmp, args, [k for k in trees if k != "local"])
            if args.local:
                configs["local"] = local_config(tmp, args)
        else:
            what = f"{nodes} Slurm nodes through one srun step"
            configs = srun_configs(stack, tmp, args, list(trees))
        for _ in range(args.rounds):
            for kind, tree in trees.items():
                argv = [
                    sys.executable,
                    __file__,
                    "--tree",
                    str(tree),
                    "--child",
                    str(configs[kind]),
                ]
                out = subprocess.run(
                    [*argv, "--seconds", str(args.seconds)],
                    capture_output=True,
                    text=True,
                    check=True,
                    cwd=tree,
                )
                got = json.loads(out.stdout.strip().splitlines()[-1])
                results[kind].append(got["us"])
                print(
                    f"{kind:>4}: {got['us']:6.1f} us of the loop's CPU a sample "
                    f"({100 * got['share']:.2f}% of a core)",
                    flush=True,
                )
    med = {k: statistics.median(v) for k, v in results.items()}
    rate = nodes / args.interval
    print(
        f"medians over {what}, {rate:g} samples a second: "
        + ", ".join(
            f"{k} {v:.1f} us a sample ({0.1 * rate * v / 1000:.2f}% of a core)"
            for k, v in med.items()
        )
        + (f"; this/base {med['this'] / med['base']:.2f}" if "base" in med else "")
        + (f"; ssh/local {med['this'] / med['local']:.2f}" if "local" in med else "")
    )


def ssh_configs(
    stack: contextlib.ExitStack, tmp: Path, args: argparse.Namespace, kinds: list[str]
) -> dict[str, Path]:
    """K sshd nodes started; a config for each tree (its own bundle folder)."""
    from gpuctl_tests.harness.sshd import SshCluster

    cluster = stack.enter_context(SshCluster(tmp / "sshd"))
    cluster.start_nodes([f"n{i:03d}" for i in range(args.ssh)])
    return {
        kind: cluster.write_config(
            tmp / f"{kind}.toml",
            simulate=args.gpus,
            interval=args.interval,
            bundle_dir=str(tmp / f"bundles-{kind}"),
        )
        for kind in kinds
    }


def local_config(tmp: Path, args: argparse.Namespace) -> Path:
    """The ``--ssh`` nodes' agents (as many, as simulated, as often) started on this machine
    over pipes (``via = "local"``): the same lines without SSH."""
    path = tmp / "local.toml"
    path.write_text(
        "\n".join(
            [
                "[clusters.local]",
                f'nodes = "n[000-{args.ssh - 1:03d}]"',
                'via = "local"',
                f'python = "{sys.executable}"',
                f'simulate = "{args.gpus}:H100"',
                f"interval = {args.interval}",
            ]
        )
        + "\n"
    )
    path.chmod(0o600)
    return path


def srun_configs(
    stack: contextlib.ExitStack, tmp: Path, args: argparse.Namespace, kinds: list[str]
) -> dict[str, Path]:
    """A test Slurm of K nodes (one slurmd per network namespace) and a job holding them all;
    a config for each tree reaching them through one srun step of that job."""
    from gpuctl_tests.harness.slurm import SlurmCluster

    slurm = SlurmCluster(tmp / "slurm", nodes=args.srun, cpus=2)
    stack.callback(slurm.stop)
    out = slurm.run(["sbatch", "--parsable", f"-N{args.srun}", "--wrap", "sleep 3600"])
    job = out.stdout.strip().split(";")[0]
    while slurm.run(["squeue", "-h", "-j", job, "-o", "%T"]).stdout.strip() != "RUNNING":
        time.sleep(0.1)  # a polling period: the job starts
    configs = {}
    for kind in kinds:
        text = "\n".join(
            [
                "[clusters.hpc]",
                'via = "srun"',
                f'nodes = "{",".join(slurm.nodes)}"',
                f"jobid = {job}",
                f'slurm_conf = "{slurm.conf_path}"',
                f'bundle_dir = "{tmp / f"bundles-{kind}"}"',
                f'simulate = "{args.gpus}:H100"',
                f"interval = {args.interval}",
            ]
        )
        path = tmp / f"{kind}.toml"
        path.write_text(text + "\n")
        path.chmod(0o600)
        configs[kind] = path
    return configs


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=512)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ssh", type=int, default=0, metavar="K", help="K real sshd nodes instead")
    p.add_argument("--srun", type=int, default=0, metavar="K", help="K test Slurm nodes instead")
    p.add_argument("--base", help="with --ssh/--srun: another tree to alternate with")
    p.add_argument(
        "--local",
        action="store_true",
        help="with --ssh: the same agents over local pipes (via = local) too, alternated",
    )
    p.add_argument("--gpus", type=int, default=8, help="with --ssh/--srun: simulated GPUs a node")
    p.add_argument(
        "--interval", type=float, default=0.25, help="with --ssh/--srun: a node's period"
    )
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--tree", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.local and not args.ssh:
        p.error("--local goes with --ssh K (the same agents over pipes, beside SSH)")
    if args.child:
        import gpuctl

        assert Path(gpuctl.__file__).resolve().is_relative_to(TREE.resolve()), gpuctl.__file__
        print(json.dumps(run(ssh_child(Path(args.child), args.seconds))))
        return
    if args.ssh or args.srun:
        fleet_compare(args)
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4 * args.nodes + 256
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
    results: dict[str, list[float]] = {"task": [], "one": []}
    for _ in range(args.rounds):
        for kind in results:
            us, share = run(measure(kind, args.nodes, args.seconds))
            results[kind].append(us)
            print(
                f"{kind:>4}: {us:5.1f} us of the loop's CPU a line ({100 * share:.2f}% of a core)",
                flush=True,
            )
    med: dict[str, Any] = {k: statistics.median(v) for k, v in results.items()}
    print(
        f"medians: a task per pipe {med['task']:.1f} us a line, one reader {med['one']:.1f} us"
        f" ({med['task'] / med['one']:.1f}x); at {args.nodes} lines a second that is "
        f"{0.1 * args.nodes * (med['task'] - med['one']) / 1000:.2f}% of a core"
    )


if __name__ == "__main__":
    main()
