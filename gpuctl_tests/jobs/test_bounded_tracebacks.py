"""A job's traceback is bounded: a RecursionError through two functions (which Python's own
traceback does not fold: it grew to 122 K characters) shows its cycle once and counts the rest,
for a submitted function and for a map's item; and a traceback's source lines that cannot be
read never replace the exception (``jobfiles.format_exception``)."""

from __future__ import annotations

import linecache
from typing import Any

import pytest

from gpuctl.jobs import RemoteTraceback
from gpuctl.node import jobfiles


def ping(n: int) -> int:
    return pong(n + 1)


def pong(n: int) -> int:
    return ping(n + 1)


def check(tb: str) -> None:
    assert len(tb) < 4000, len(tb)
    assert "more frames repeating the 2 frames above" in tb
    assert "test_bounded_tracebacks.py:" in tb
    assert tb.rstrip().endswith("RecursionError: maximum recursion depth exceeded")


def test_a_recursion_through_two_functions_is_folded(make_executor: Any) -> None:
    ex = make_executor()
    with pytest.raises(RecursionError) as caught:
        ex.submit(ping, 0).result(120)
    cause = caught.value.__cause__
    assert isinstance(cause, RemoteTraceback)
    check(cause.tb)
    (item,) = ex.map_jobs(ping, [0])[0].result(120)
    assert item[0] == "err" and isinstance(item[1], RecursionError)
    check(item[2])


def test_a_traceback_whose_lines_cannot_be_read_still_names_its_frames(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As when a signal handler raises while ``linecache`` reads a file: the frames without
    their lines, and the exception itself."""
    try:
        ping(0)
    except RecursionError as e:
        exc = e

    def interrupted(*args: Any, **kwargs: Any) -> str:
        raise RuntimeError("DataLoader worker (pid 1) is killed by signal: Killed.")

    monkeypatch.setattr(linecache, "getline", interrupted)
    monkeypatch.setattr(linecache, "updatecache", interrupted)
    tb = jobfiles.format_exception(exc)
    assert "RecursionError: maximum recursion depth exceeded" in tb
    assert "in ping" in tb and "DataLoader" not in tb
    assert tb.count("\n") <= jobfiles.TRACEBACK_FRAMES + 3
