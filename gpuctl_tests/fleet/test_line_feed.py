"""A simulated node's lines handed on by its pipe's callback (``session.LineFeed``): no task woken
a line, and the same lines, replies and ends as asyncio's reader gives."""

from __future__ import annotations

import asyncio

import pytest

from gpuctl.core.model import NodeSnapshot
from gpuctl.fleet.fleet import simulated_fleet
from gpuctl.fleet.session import LineFeed
from gpuctl_tests.helpers import all_live, wait_fleet


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
    with pytest.raises(ValueError):
        await feed.readline()

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
