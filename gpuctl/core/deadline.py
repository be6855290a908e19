"""Waiting with a deadline, the same on every Python gpuctl claims (3.10 and later).

Before Python 3.11, ``asyncio.wait_for`` and ``concurrent.futures.Future.result`` raise their
own ``TimeoutError`` classes (``asyncio.TimeoutError`` is ``concurrent.futures.TimeoutError``),
which an ``except TimeoutError`` does not catch: on 3.10 a deadline that passed ended a command
in "internal error: TimeoutError". From 3.11 on the three are one class. Every wait with a
deadline on the login side goes through here and raises the builtin ``TimeoutError``, so
``except TimeoutError`` and ``contextlib.suppress(TimeoutError)`` are right on every Python.

``asyncio.wait_for`` is banned elsewhere by ruff (TID251 in pyproject.toml); a concurrent
future's ``result(timeout)`` goes through ``result`` below.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")

# The classes a deadline raises on this Python: one class from 3.11 on, three before.
TIMEOUTS: tuple[type[BaseException], ...] = tuple(
    {TimeoutError, asyncio.TimeoutError, concurrent.futures.TimeoutError}
)


async def wait_for(aw: Awaitable[T], timeout: float | None) -> T:
    """``asyncio.wait_for``, raising the builtin ``TimeoutError`` when the deadline passes."""
    try:
        return await asyncio.wait_for(aw, timeout)  # noqa: TID251 - the one place
    except TIMEOUTS as e:
        if isinstance(e, TimeoutError):
            raise
        raise TimeoutError(*e.args) from None


def result(fut: concurrent.futures.Future[T], timeout: float | None = None) -> T:
    """A concurrent future's result, raising the builtin ``TimeoutError`` at the deadline."""
    try:
        return fut.result(timeout)
    except TIMEOUTS as e:
        if isinstance(e, TimeoutError):
            raise
        raise TimeoutError(*e.args) from None
