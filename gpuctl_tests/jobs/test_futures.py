"""A ``Job`` is a ``concurrent.futures.Future``: ``as_completed``, ``wait``, done-callbacks and
``asyncio.wrap_future`` work on real jobs, completed by the watcher thread alone."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from pathlib import Path
from typing import Any

import pytest

from gpuctl.core.deadline import wait_for
from gpuctl.jobs import JobFailed
from gpuctl_tests.helpers import wait_until


def naps(seconds: float, value: int) -> int:
    import time

    time.sleep(seconds)
    return value


def fails(value: int) -> int:
    raise ValueError(f"bad {value}")


def waits_for(path: str) -> int:
    import os
    import time

    while not os.path.exists(path):
        time.sleep(0.05)
    return -1


def test_as_completed_over_100_jobs_yields_each_once_as_it_ends(
    make_executor: Any, tmp_path: Path
) -> None:
    ex = make_executor(store=False)
    gate = tmp_path / "gate"
    # the first job ends only once the test has seen the 99 others: as_completed must not wait
    # for it, and nothing but the watcher thread polls them
    jobs = [ex.submit(waits_for, str(gate))] + [ex.submit(naps, 0.0, i) for i in range(99)]
    seen = []
    for job in concurrent.futures.as_completed(jobs, timeout=600):
        seen.append(job.result())
        if len(seen) == 99:
            gate.touch()
    assert seen[-1] == -1 and sorted(seen[:-1]) == list(range(99))


def test_wait_first_exception_and_done_callbacks(make_executor: Any) -> None:
    ex = make_executor(store=False)
    slow = ex.submit(naps, 60.0, 1)
    bad = ex.submit(fails, 7)
    called = threading.Event()
    bad.add_done_callback(lambda f: called.set())
    done, pending = concurrent.futures.wait(
        [slow, bad], timeout=120, return_when=concurrent.futures.FIRST_EXCEPTION
    )
    assert done == {bad} and pending == {slow}
    assert called.wait(10)
    with pytest.raises(ValueError, match="bad 7"):  # the function's own exception
        bad.result()
    assert isinstance(bad.exception(), ValueError)
    wait_until(slow.running, 60, "the slow job to run")
    assert slow.cancel()
    with pytest.raises(concurrent.futures.CancelledError) as info:  # as any cancelled Future's
        slow.result(60)
    assert slow.cancelled() and isinstance(info.value, JobFailed)
    assert info.value.report is slow.report() and slow.report().kind == "cancelled"  # type: ignore[union-attr]
    with pytest.raises(concurrent.futures.CancelledError):
        slow.exception()


def test_asyncio_wrap_future_awaits_a_job(make_executor: Any) -> None:
    ex = make_executor(store=False)

    async def main() -> list[int]:
        futures = [asyncio.wrap_future(ex.submit(naps, 0.0, i)) for i in range(3)]
        return list(await wait_for(asyncio.gather(*futures), 120))

    assert asyncio.run(main()) == [0, 1, 2]


def _note_the_unpickling_thread(value: int) -> int:
    """Rebuilds a result here and writes down which thread did it (the environment is the one
    place a by-value function shares with the test)."""
    import os
    import threading

    os.environ["GPUCTL_TEST_RESULT_READ_IN"] = threading.current_thread().name
    return value


class Traced:
    def __init__(self, value: int) -> None:
        self.value = value

    def __reduce__(self) -> tuple[Any, tuple[int]]:
        return (_note_the_unpickling_thread, (self.value,))


def traced(value: int) -> Traced:
    return Traced(value)


def test_awaiting_a_job_reads_its_result_outside_the_event_loop(
    make_executor: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A result is fetched (over SSH: a file transfer) and unpickled before the Future settles,
    in the watcher's thread: the event loop only gets the value."""
    monkeypatch.delenv("GPUCTL_TEST_RESULT_READ_IN", raising=False)
    ex = make_executor(store=False)

    async def main() -> int:
        return int(await wait_for(asyncio.wrap_future(ex.submit(traced, 7)), 120))

    assert asyncio.run(main()) == 7
    import os

    read_in = os.environ["GPUCTL_TEST_RESULT_READ_IN"]
    assert read_in == "gpuctl-jobs", read_in  # the watcher's thread, not MainThread's loop
