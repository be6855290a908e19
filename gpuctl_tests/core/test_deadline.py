"""One way to wait with a deadline on every Python gpuctl claims (gpuctl.core.deadline).

These run under every claimed Python in the test command (scripts/test.sh runs the unit lane
under 3.10 too), where ``asyncio.wait_for``'s own TimeoutError is not the builtin one."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import subprocess
import sys
from pathlib import Path

import pytest

from gpuctl.core import deadline

REPO = Path(__file__).resolve().parents[2]
PROBE = "gpuctl/probe.py"  # a product file's name: the project's ruff settings apply to it


async def test_wait_for_raises_the_builtin_timeout_error() -> None:
    never = asyncio.Event()
    with pytest.raises(TimeoutError) as caught:
        await deadline.wait_for(never.wait(), 0.01)
    assert type(caught.value) is TimeoutError
    # and what a caller writes catches it on every Python
    with contextlib.suppress(TimeoutError):
        await deadline.wait_for(never.wait(), 0.01)


async def test_wait_for_passes_the_value_and_other_errors() -> None:
    async def value() -> int:
        return 7

    async def boom() -> None:
        raise ValueError("x")

    assert await deadline.wait_for(value(), 1) == 7
    with pytest.raises(ValueError):
        await deadline.wait_for(boom(), 1)


def test_result_raises_the_builtin_timeout_error() -> None:
    fut: concurrent.futures.Future[int] = concurrent.futures.Future()
    with pytest.raises(TimeoutError) as caught:
        deadline.result(fut, 0.01)
    assert type(caught.value) is TimeoutError
    fut.set_result(3)
    assert deadline.result(fut, 0) == 3


def test_asyncio_wait_for_is_refused_by_the_linter() -> None:
    """The lint rule that keeps the 3.10 bug from coming back: ruff, with the project's
    settings, refuses ``asyncio.wait_for`` in product code."""
    ruff = Path(sys.executable).with_name("ruff")
    if not ruff.exists():
        pytest.skip("ruff is not installed in this venv")
    probe = "import asyncio\n\n\nasync def f(x):\n    await asyncio.wait_for(x, 1)\n"
    out = subprocess.run(
        [str(ruff), "check", "--no-cache", "--select", "TID251", "--stdin-filename", PROBE, "-"],
        cwd=REPO,
        input=probe,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert "gpuctl.core.deadline.wait_for" in out.stdout
