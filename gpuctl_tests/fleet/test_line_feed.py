"""A node's lines handed on by its transport's callback (``session.LineFeed``): no task woken a
line, for a simulated node (a pipe), a real sshd's channel and real Slurm's srun (one per node,
and one step for many); and the same lines, replies and ends as asyncio's reader gives."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from gpuctl.config import parse_config
from gpuctl.core.model import NodeSnapshot
from gpuctl.fleet.build import fleet_from_config
from gpuctl.fleet.fleet import Fleet, simulated_fleet
from gpuctl.fleet.links import LocalLink
from gpuctl.fleet.session import LineFeed, LineFeedProtocol, LinkError
from gpuctl.fleet.slurm import SrunLink, StepLink
from gpuctl.fleet.ssh import SshLink
from gpuctl_tests.fleet.test_slurm import FAST
from gpuctl_tests.harness.slurm import SlurmCluster
from gpuctl_tests.harness.sshd import SshCluster
from gpuctl_tests.helpers import all_live, wait_fleet, wait_until


def sample_tasks(fleet: Fleet) -> dict[str, list[asyncio.Task[object] | None]]:
    """Node -> the task each of its new samples reached the listeners in (None: a callback)."""
    seen: dict[str, list[asyncio.Task[object] | None]] = {}
    last: dict[str, float | None] = {}

    def listener(snap: NodeSnapshot) -> None:
        if snap.gpus and snap.last_sample_t != last.get(snap.name):  # a sample, not a note
            last[snap.name] = snap.last_sample_t
            seen.setdefault(snap.name, []).append(asyncio.current_task())

    fleet.subscribe(listener)
    return seen


async def wait_no_task_a_line(
    fleet: Fleet, seen: dict[str, list[asyncio.Task[object] | None]]
) -> None:
    """Each node's samples, once one came in a transport's callback, all come so (the lines
    read before its stream was handed on are taken in its task: the first sample or two): 5 of
    them at least. Fails on a node read by a task awaiting each line (12 samples, none from a
    callback)."""
    names = list(fleet.nodes)

    def called_back(name: str) -> int:
        tasks = seen.get(name, [])
        return len(tasks) - tasks.index(None) if None in tasks else 0

    await wait_fleet(
        fleet,
        lambda _s: all(called_back(n) >= 5 or len(seen.get(n, [])) >= 12 for n in names),
        what="samples of each node",
    )
    for name in names:
        tasks = seen[name]
        assert None in tasks, f"{name}: every sample came in a task: {tasks}"
        first = tasks.index(None)
        assert tasks[first:] == [None] * (len(tasks) - first), (name, tasks)


async def lines_by_callback(fleet: Fleet, ping: str) -> None:
    """Start ``fleet``, see each node's samples come from a transport's callback
    (``wait_no_task_a_line``) and ``ping`` answered over the pushed stream, stop it."""
    seen = sample_tasks(fleet)
    await fleet.start()
    try:
        await wait_no_task_a_line(fleet, seen)
        reply = await fleet.request(ping, {"type": "ping"})
        assert reply.get("type") == "pong"
    finally:
        await fleet.stop()


async def test_a_simulated_nodes_samples_wake_no_task() -> None:
    """Each sample reaches the listeners from the pipe's callback, not from a task of the node
    awaiting its next line (a task woken per line per node cost the loop ~20-40 us a line), and
    requests still get their replies over the pushed stream."""
    fleet = simulated_fleet([("a", "2:H100"), ("b", "2:A100")], interval=0.1)
    seen: list[tuple[str, asyncio.Task[object] | None]] = []

    def listener(snap: NodeSnapshot) -> None:
        if snap.gpus:
            seen.append((snap.name, asyncio.current_task()))

    fleet.subscribe(listener)
    await fleet.start()
    try:
        await wait_fleet(fleet, lambda s: all_live(s.values()), what="both nodes live")

        def tasks(node: str) -> list[asyncio.Task[object] | None]:
            return [task for name, task in seen if name == node]

        await wait_fleet(
            fleet,
            lambda _s: len(tasks("a")) >= 5 and len(tasks("b")) >= 5,
            what="samples of both nodes",
        )
        # The lines that came before the stream was handed on are taken in the node's task
        # (its first sample or two); every one after that in the pipe's callback.
        for node in ("a", "b"):
            assert tasks(node)[2:] == [None] * (len(tasks(node)) - 2), node
        reply = await fleet.request("a", {"type": "ping"})
        assert reply.get("type") == "pong"
    finally:
        await fleet.stop()


async def test_the_local_agents_samples_wake_no_task() -> None:
    """The local agent (``gpuctl`` on one machine: a child process of this one) is read from
    its pipes' callbacks too; requests are answered, its stderr is kept for a reason, and it
    ends with the link."""
    fleet = Fleet({"local": LocalLink(simulate="2:H100", interval=0.1)})
    pids: list[int] = []

    def agent(snap: NodeSnapshot) -> None:
        if snap.info is not None and not pids:
            pids.append(int(snap.info.pid))

    fleet.subscribe(agent)
    await lines_by_callback(fleet, "local")
    (pid,) = pids
    wait_until(lambda: not os.path.exists(f"/proc/{pid}"), 10, "the agent to end with the link")


def asyncio_reader(chunks: list[bytes], limit: int) -> asyncio.StreamReader:
    reader = asyncio.StreamReader(limit=limit)
    for chunk in chunks:
        reader.feed_data(chunk)
    reader.feed_eof()
    return reader


CHUNKS = [b'{"a":1}\n{"b"', b":2}\n", b"", b'{"c":3}\n{"d":', b"4}"]  # the last line unended


async def test_line_feed_reads_the_lines_asyncio_reads() -> None:
    """Read with ``readline``, pushed, or read then pushed midway: the lines asyncio's reader
    gives, the unended last line included, then the end."""
    want = []
    reader = asyncio_reader(CHUNKS, 64)
    while line := await reader.readline():
        want.append(line)
    assert want == [b'{"a":1}\n', b'{"b":2}\n', b'{"c":3}\n', b'{"d":4}']

    feed = LineFeed(limit=64)
    for chunk in CHUNKS:
        feed.feed_data(chunk)
    feed.feed_eof()
    got = []
    while line := await feed.readline():
        got.append(line)
    assert got == want

    for split in range(len(CHUNKS) + 1):
        feed = LineFeed(limit=64)
        ends: list[BaseException | None] = []
        for chunk in CHUNKS[:split]:
            feed.feed_data(chunk)
        got = [await feed.readline()] if split >= 2 else []  # the first line read, then push
        feed.push_to(got.append, ends.append)
        for chunk in CHUNKS[split:]:
            feed.feed_data(chunk)
        feed.feed_eof()
        feed.feed_data(b'{"e":5}\n')  # after the end: nothing
        assert got == want, split
        assert ends == [None], split


async def test_line_feed_ends_as_asyncio_reader_on_a_long_line_or_an_error() -> None:
    with pytest.raises(ValueError):
        await asyncio_reader([b"x" * 100], 64).readline()
    feed = LineFeed(limit=64)
    feed.feed_data(b"x" * 100)
    with pytest.raises(ValueError) as too_long:
        await feed.readline()
    # ... and the fleet's words for a link that misbehaved (a ValueError ended the node's task)
    assert isinstance(too_long.value, LinkError) and too_long.value.reason == "protocol"
    assert too_long.value.message == "agent sent a bad line: a line over 64 bytes"

    ends: list[BaseException | None] = []
    got: list[bytes] = []
    feed = LineFeed(limit=64)
    feed.push_to(got.append, ends.append)
    feed.feed_data(b'{"a":1}\n' + b"x" * 100)
    assert got == [b'{"a":1}\n'] and isinstance(ends[0], ValueError)

    lost = ConnectionResetError("gone")
    feed = LineFeed(limit=64)
    feed.set_exception(lost)
    with pytest.raises(ConnectionResetError):
        await feed.readline()
    ends = []
    feed.push_to(got.append, ends.append)
    assert ends == [lost]


@pytest.mark.sshd
async def test_an_ssh_nodes_samples_wake_no_task(ssh_cluster: SshCluster, tmp_path: Path) -> None:
    """Over a real sshd each line goes on from the channel's ``data_received``, not from a task
    of the node awaiting its next line; requests are answered, and the node's agent ends with
    the link."""
    from gpuctl_tests.fleet.test_ssh import _agents_of, configured_fleet

    await asyncio.to_thread(ssh_cluster.start_nodes, ["s1", "s2"])
    fleet = configured_fleet(ssh_cluster, tmp_path, interval=0.1)
    assert all(isinstance(rt.link, SshLink) for rt in fleet.nodes.values())
    await lines_by_callback(fleet, "s2")
    await asyncio.to_thread(
        lambda: wait_until(lambda: not _agents_of(ssh_cluster), 15, "agents to exit")
    )


@pytest.mark.slurm
async def test_an_srun_nodes_samples_wake_no_task(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """Through a real srun (one per node) each line goes on from the pipe's callback."""
    node = slurm_cluster.node
    out = await asyncio.to_thread(
        slurm_cluster.run, ["sbatch", "--parsable", "-J", "lines", "--wrap", "sleep 300"]
    )
    job = out.stdout.strip().split(";")[0]
    text = "\n".join(
        [
            "[clusters.hpc]",
            'via = "srun"',
            f'nodes = "{node}"',
            f"jobid = {job}",
            f'slurm_conf = "{slurm_cluster.conf_path}"',
            f'bundle_dir = "{tmp_path / "shared"}"',
            'simulate = "1:L40S"',
            "interval = 0.1",
        ]
    )
    fleet = fleet_from_config(parse_config(text), **FAST)
    assert isinstance(fleet.nodes[node].link, SrunLink)
    try:
        await lines_by_callback(fleet, node)
    finally:
        await asyncio.to_thread(slurm_cluster.run, ["scancel", job])


@pytest.mark.slurm
async def test_one_steps_nodes_samples_wake_no_task(
    slurm_nodes: SlurmCluster, tmp_path: Path
) -> None:
    """Through one srun step for four nodes each node's lines go on from srun's pipe callback
    (split by task label there), not from a task per node awaiting its share."""
    from gpuctl_tests.fleet.test_srun_step import _held_fleet

    job, fleet = await _held_fleet(slurm_nodes, tmp_path)
    assert all(isinstance(rt.link, StepLink) for rt in fleet.nodes.values())
    try:
        await lines_by_callback(fleet, "node03")
    finally:
        await asyncio.to_thread(slurm_nodes.run, ["scancel", job])


class Watched:
    """A real transport whose pauses and resumes are noted (Python 3.10's pipe transport cannot
    say whether it is reading)."""

    def __init__(self, transport: asyncio.ReadTransport) -> None:
        self.transport = transport
        self.calls: list[str] = []

    def pause_reading(self) -> None:
        self.calls.append("pause")
        self.transport.pause_reading()

    def resume_reading(self) -> None:
        self.calls.append("resume")
        self.transport.resume_reading()


async def test_line_feed_pauses_its_pipe_while_too_much_is_unread() -> None:
    """Before its lines are handed on, a feed holding more than twice its limit unread pauses
    its transport (a real pipe's), and resumes it once ``readline`` took them down to the
    limit; handing the lines on resumes it too."""
    loop = asyncio.get_running_loop()
    for hand_on in (False, True):
        r, w = os.pipe()
        feed = LineFeed(limit=64)
        transport, _ = await loop.connect_read_pipe(
            lambda feed=feed: LineFeedProtocol(feed), os.fdopen(r, "rb", buffering=0)
        )
        assert feed.transport is transport
        watched = feed.transport = Watched(transport)
        try:
            line = b"x" * 31 + b"\n"  # 32 bytes
            os.write(w, line * 5)  # 160 bytes unread: over twice the limit
            first = await feed.peek()  # read in: the transport's callback has run
            assert first == line and watched.calls == ["pause"]
            if hand_on:
                got: list[bytes] = []
                feed.push_to(got.append, lambda _e: None)
                assert got == [line] * 5 and watched.calls == ["pause", "resume"]
                continue
            assert await feed.readline() == line  # 128 held
            assert await feed.readline() == line  # 96
            assert watched.calls == ["pause"]
            assert await feed.readline() == line  # 64: the limit
            assert watched.calls == ["pause", "resume"]
        finally:
            transport.close()
            os.close(w)
