"""A call that cannot be pickled is refused with one line that names the culprit (which
global, variable or argument, what it is, what to pass instead), as the payload guard names
the biggest parts; a function whose call only makes something to run later (``async def``, a
generator function) is refused before anything is pickled. Nothing is written either way."""

from __future__ import annotations

import asyncio
import pickle
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuctl.jobs import Executor, Unpicklable

LOCK = threading.Lock()


def uses_the_lock(x: int) -> int:
    with LOCK:
        return x


def logs_to(x: int) -> int:
    LOG.write(f"{x}\n")
    return x


LOG: Any = None


async def fetch() -> int:
    await asyncio.sleep(0)
    return 1


def numbers() -> Iterator[int]:
    yield 1


def takes(value: object) -> object:
    return value


@pytest.fixture
def ex(tmp_path: Path) -> Executor:
    return Executor("local", store=False, job_root=str(tmp_path / "jobs"))


def refused(tmp_path: Path, call: Any, *args: Any) -> str:
    with pytest.raises(Unpicklable) as caught:
        call(*args)
    assert isinstance(caught.value, TypeError) and isinstance(caught.value, pickle.PicklingError)
    assert not (tmp_path / "jobs").exists() or not any((tmp_path / "jobs").iterdir())
    text = str(caught.value)
    assert "\n" not in text
    return text


def test_a_global_lock_is_named(ex: Executor, tmp_path: Path) -> None:
    text = refused(tmp_path, ex.submit, uses_the_lock, 1)
    assert "global `LOCK` that uses_the_lock uses is a lock (_thread.lock)" in text
    assert "create it inside the function" in text
    text = refused(tmp_path, ex.map_jobs, uses_the_lock, [1, 2])
    assert "global `LOCK` that uses_the_lock uses is a lock" in text


def test_an_append_mode_file_is_named(
    ex: Executor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open(tmp_path / "log.txt", "a") as f:
        monkeypatch.setitem(globals(), "LOG", f)
        text = refused(tmp_path, ex.submit, logs_to, 1)
    assert "global `LOG` that logs_to uses is an open file (" in text and "mode 'a'" in text
    assert "pass its path and open it inside the function" in text


def test_a_socket_and_a_generator_argument_are_named(ex: Executor, tmp_path: Path) -> None:
    with socket.socket() as sock:
        text = refused(tmp_path, ex.submit, takes, sock)
    assert "argument 0 is a socket" in text and "connect inside the function" in text
    text = refused(tmp_path, ex.submit, takes, (i for i in range(3)))
    assert "argument 0 is a generator" in text and "pass a list" in text
    text = refused(tmp_path, ex.map_jobs, takes, [1, threading.RLock()])
    assert "item 1 is a lock (_thread.RLock)" in text


@pytest.mark.parametrize(
    ("fn", "says"),
    [
        (fetch, "`fetch` is an async def function"),
        (numbers, "`numbers` is a generator function"),
    ],
)
def test_a_function_that_only_makes_something_to_run_later_is_refused(
    ex: Executor, tmp_path: Path, fn: Any, says: str
) -> None:
    for call in (ex.submit, ex.map_jobs):
        with pytest.raises(TypeError) as caught:
            call(fn, *([[1]] if call == ex.map_jobs else []))
        text = str(caught.value)
        assert text.startswith(says) and "submit a plain function: `lambda: " in text
    assert "asyncio.run(fetch())" in text or "list(numbers())" in text
    assert not (tmp_path / "jobs").exists()
