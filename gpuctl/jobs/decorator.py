"""``@remote``: a function whose call runs on a target, through an ``Executor`` made at its
first call (``f(...)`` waits for the result, ``f.submit(...)`` returns the ``Job``,
``f.local(...)`` calls it here). Pickled, it is the plain function again.

(Not ``jobs/remote.py``: a submodule of that name would replace the ``remote`` that
``gpuctl.jobs`` exports once imported.)
"""

from __future__ import annotations

import copy
import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar, overload

from gpuctl.jobs.executor import Executor
from gpuctl.jobs.job import Job

R = TypeVar("R")


@overload
def remote(fn: Callable[..., R], /) -> Callable[..., R]: ...


@overload
def remote(
    *, target: str = ..., **options: Any
) -> Callable[[Callable[..., R]], Callable[..., R]]: ...


def remote(fn: Any = None, /, *, target: str = "local", **options: Any) -> Any:
    """Decorator: calling the function runs it on ``target`` and returns its result.

    ``@remote(target="gpu01", mem="8G")``; ``f.submit(...)`` returns the ``Job`` instead, and
    ``f.local(...)`` calls the undecorated function. Options are those of ``Executor``.
    """

    def wrap(func: Callable[..., Any]) -> RemoteFunction:
        return RemoteFunction(func, target, options)

    if fn is not None:
        return wrap(fn)
    return wrap


class RemoteFunction:
    """What ``@remote`` makes of a function (see ``remote``).

    Pickled, it is the plain function again: a job that calls another ``@remote`` function runs
    it in its own process (VENV2 has no gpuctl to submit with), and nothing of this side's
    executor (its locks, its connections) travels.
    """

    def __init__(self, func: Callable[..., Any], target: str, options: dict[str, Any]) -> None:
        functools.update_wrapper(self, func)
        self.local = func
        self._target = target
        self._options = options
        self._executor: Executor | None = None
        self._lock = threading.Lock()

    def executor(self) -> Executor:
        """The Executor it submits through, made at the first call."""
        with self._lock:
            if self._executor is None:
                self._executor = Executor(self._target, **self._options)
            return self._executor

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.executor().submit(self.local, *args, **kwargs).result()

    def submit(self, *args: Any, **kwargs: Any) -> Job:
        """Run it on the target; returns the ``Job`` at once."""
        return self.executor().submit(self.local, *args, **kwargs)

    def __reduce__(self) -> tuple[Any, tuple[Any]]:
        # copy.copy of a function is the function: the standard library rebuilds it in VENV2
        return copy.copy, (self.local,)
