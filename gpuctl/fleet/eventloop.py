"""The event loop the long-running views run on (the screen, ``record``, ``export``).

asyncio's own loop, with one change: before it waits for I/O it lets ``GAP`` seconds pass since
its last wait ended, so that the lines of many nodes are taken in one wake-up. At 512 nodes
sampling at 1 Hz, each line arrives on its own (their phases spread over the second), and a plain
loop wakes ~500 times a second, paying its select call and its own round each time; gathered, it
wakes at most 1 / GAP times a second and takes ~10 lines per wake-up, for ~10 % less CPU on the
login node (``benchmarks/tui_load.py --compare-loop --rounds 3``: 30.9% vs 34.1% of a core).
What it costs: a line, a key or a timer that comes while nothing else is ready waits up to GAP
(20 ms) longer.

Only a wait is delayed, never work: a loop with callbacks ready selects with a timeout of 0 and
does not pause, and a pause never runs past the next timer.

While it runs, the garbage collector's youngest generation is collected after ``YOUNG_GC``
allocations instead of Python's 700: a stream of samples makes tens of thousands of short-lived
containers a second (tuples of GPU values, futures, strips), and at 700 the collector ran ~30
times a second, promoting values that lived a second (a node's snapshot) into the old
generations, whose full collections took ~100 ms each (6 in a 20 s run of the screen at 4,096
GPUs: 1.05 s of collection in all, 0.31 s with this threshold and no full collection; measured
with ``gc.callbacks``).
"""

from __future__ import annotations

import asyncio
import gc
import selectors
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

_T = TypeVar("_T")

GAP = 0.02  # seconds: at most 50 wake-ups a second
YOUNG_GC = 20_000  # allocations between collections of the youngest generation (Python: 700)


class GatheringSelector(selectors.DefaultSelector):
    """The platform's selector, whose ``select`` first lets ``gap`` seconds pass since the last
    one returned (never more than its timeout allows; a timeout of 0 never pauses)."""

    def __init__(
        self,
        gap: float = GAP,
        clock: Callable[[], float] = time.monotonic,
        pause: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__()
        self.gap = gap
        self._clock = clock
        self._pause = pause
        self._last = -float("inf")  # when the last select returned

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        rest = self._last + self.gap - self._clock()
        if rest > 0 and (timeout is None or timeout > 0):
            pause = rest if timeout is None else min(rest, timeout)
            self._pause(pause)  # a rate limit on wake-ups, not a wait for anything
            if timeout is not None:
                timeout = max(0.0, timeout - pause)
        try:
            return super().select(timeout)
        finally:
            self._last = self._clock()


def new_loop(gap: float = GAP) -> asyncio.AbstractEventLoop:
    """A fresh asyncio loop on a GatheringSelector."""
    return asyncio.SelectorEventLoop(GatheringSelector(gap))


def run(main: Coroutine[Any, Any, _T], gap: float = GAP) -> _T:
    """``asyncio.run(main)`` on a gathering loop, with the collector's youngest generation at
    ``YOUNG_GC`` meanwhile (Python 3.10 has no ``asyncio.Runner``: ``_run_310`` does its steps)."""
    threshold = gc.get_threshold()
    if threshold[0]:  # 0: collection turned off, left so
        gc.set_threshold(max(YOUNG_GC, threshold[0]), *threshold[1:])
    try:
        if sys.version_info < (3, 11):
            return _run_310(main, new_loop(gap))
        with asyncio.Runner(loop_factory=lambda: new_loop(gap)) as runner:
            return runner.run(main)
    finally:
        gc.set_threshold(*threshold)


def _run_310(main: Coroutine[Any, Any, _T], loop: asyncio.AbstractEventLoop) -> _T:
    """What ``asyncio.run`` does on Python 3.10, on the loop given: run ``main``, then cancel
    the tasks left, finish async generators and the default executor, and close the loop."""
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main)
    finally:
        try:
            left = asyncio.all_tasks(loop)
            for task in left:
                task.cancel()
            if left:
                loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
            for task in left:
                if not task.cancelled() and task.exception() is not None:
                    loop.call_exception_handler(
                        {
                            "message": "unhandled exception during gpuctl's loop shutdown",
                            "exception": task.exception(),
                            "task": task,
                        }
                    )
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            asyncio.set_event_loop(None)
            loop.close()
