"""The gathering event loop: a wait for I/O first lets the gap pass since the last one, so the
lines that come meanwhile are taken in one wake-up; work and timers are never delayed by it."""

from __future__ import annotations

import asyncio
import os
import selectors
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuctl.core.deadline import wait_for
from gpuctl.fleet import eventloop
from gpuctl.fleet.eventloop import GatheringSelector


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.pauses: list[float] = []

    def __call__(self) -> float:
        return self.now

    def pause(self, seconds: float) -> None:
        self.pauses.append(round(seconds, 6))
        self.now += seconds


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    r, w = os.pipe()
    yield r, w
    os.close(r)
    os.close(w)


def test_a_wait_soon_after_the_last_first_lets_the_gap_pass(pipe: tuple[int, int]) -> None:
    clock = FakeClock()
    sel = GatheringSelector(0.02, clock=clock, pause=clock.pause)
    os.write(pipe[1], b"x")  # always readable: each select returns at once
    sel.register(pipe[0], selectors.EVENT_READ)
    assert len(sel.select(0.5)) == 1  # the first wait: no pause
    assert clock.pauses == []
    clock.now += 0.005  # 5 ms of work after it
    assert len(sel.select(0.5)) == 1
    clock.now += 0.5  # long after the last: no pause
    assert len(sel.select(0.5)) == 1
    sel.close()
    assert clock.pauses == [0.015]


def test_a_pause_never_runs_past_the_timeout_and_a_zero_timeout_never_pauses() -> None:
    clock = FakeClock()
    sel = GatheringSelector(0.02, clock=clock, pause=clock.pause)
    sel.select(0)  # sets "last"
    sel.select(0)  # callbacks are ready: no pause at all
    sel.select(0.004)  # a timer is due in 4 ms: the pause ends then
    assert clock.pauses == [0.004]
    sel.close()


def test_lines_that_come_during_the_gap_are_taken_in_one_wake_up() -> None:
    """A real loop on a GatheringSelector reading 8 pipes: while it pauses, a line comes on
    each of them (the pause writes them); one select returns them all, and the readers get
    every line."""
    pipes = [os.pipe() for _ in range(8)]
    selects: list[int] = []
    wrote = [False]

    def pause(seconds: float) -> None:
        assert 0 < seconds <= 0.02
        if not wrote[0]:
            wrote[0] = True
            for _, w in pipes:
                os.write(w, b"line\n")

    class Counting(GatheringSelector):
        def select(self, timeout: float | None = None) -> list:  # type: ignore[type-arg]
            ready = super().select(timeout)
            selects.append(len(ready))
            return ready

    async def read_all() -> list[bytes]:
        loop = asyncio.get_running_loop()
        got: list[bytes] = []
        done = loop.create_future()

        def on_ready(fd: int) -> None:
            got.append(os.read(fd, 100))
            loop.remove_reader(fd)
            if len(got) == len(pipes) and not done.done():
                done.set_result(None)

        for r, _ in pipes:
            loop.add_reader(r, on_ready, r)
        await wait_for(done, 10)
        return got

    loop = asyncio.SelectorEventLoop(Counting(0.02, pause=pause))
    try:
        got = loop.run_until_complete(read_all())
    finally:
        loop.close()
        for r, w in pipes:
            os.close(r)
            os.close(w)
    assert got == [b"line\n"] * 8
    assert wrote[0] and 8 in selects  # all eight in one wake-up


def test_asyncio_code_runs_on_it_as_on_asyncios_own_loop() -> None:
    """Timers fire, another thread's call wakes it, a subprocess is read, the result comes
    back; the loop is the gathering one."""

    async def main() -> tuple[str, bytes, str]:
        loop = asyncio.get_running_loop()
        selector = type(loop._selector).__name__  # type: ignore[attr-defined]
        woken = loop.create_future()
        wake = threading.Thread(target=loop.call_soon_threadsafe, args=(woken.set_result, "woken"))
        wake.start()
        await asyncio.sleep(0.05)
        proc = await asyncio.create_subprocess_exec("echo", "hello", stdout=asyncio.subprocess.PIPE)
        out, _ = await proc.communicate()
        wake.join()
        return await wait_for(woken, 10), out, selector

    assert eventloop.run(main()) == ("woken", b"hello\n", "GatheringSelector")


def test_the_screen_runs_on_the_gathering_loop(tmp_path: Path) -> None:
    from gpuctl.cli.watch import run_tui
    from gpuctl.fleet.demo import demo_nodes
    from gpuctl.fleet.fleet import simulated_fleet
    from gpuctl.tui import make_app

    fleet = simulated_fleet(demo_nodes(2, 2), interval=0.2)
    app = make_app(fleet, simulated=True, state_dir=tmp_path / "state")
    seen: list[str] = []

    async def look() -> None:
        loop = asyncio.get_running_loop()
        seen.append(type(loop._selector).__name__)  # type: ignore[attr-defined]
        deadline = loop.time() + 60
        while not (app.is_running and app.overview.ready) and loop.time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)  # a flag of the app, no event to wait on
        app.exit(0)

    app.background.append(look)
    assert run_tui(app, headless=True, size=(100, 30)) == 0
    assert seen == ["GatheringSelector"]
