"""``gpuctl watch`` / ``gpuctl demo`` argument and environment mistakes: one line, exit 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpuctl_tests.helpers import node_env


def gpuctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuctl", *args],
        env=node_env({"GPUCTL_CONFIG": "/nonexistent/gpuctl.toml"}),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("demo", "--nodes", "0"), "--nodes must be within 1..4096"),
        (("demo", "--gpus", "99"), "--gpus must be within 1..64"),
        (("demo",), "the TUI needs a terminal"),
        (("watch", "--read-only"), "the TUI needs a terminal"),
    ],
)
def test_mistakes_are_one_line(args: tuple[str, ...], says: str) -> None:
    out = gpuctl(*args)
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and says in out.stderr
    assert "Traceback" not in out.stderr
