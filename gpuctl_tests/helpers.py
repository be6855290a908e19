"""Test utilities shared across gpuctl_tests: waiting with deadlines, real agents, old Pythons."""

from __future__ import annotations

import json
import os
import selectors
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import pytest

REPO = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
# Read once at import, before the session's own HOME is set (conftest ``_hermetic_home``).
PYENV = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"


def unavailable(reason: str) -> NoReturn:
    """A part a test needs is missing: skip it here, fail it in CI (where the test command
    installs every part, so a missing one is a broken install, not a reason to pass)."""
    if IN_CI:
        pytest.fail(reason)
    pytest.skip(reason)


def wait_until(pred: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    """Poll ``pred`` until it returns something truthy; fail the test at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.02)  # a poll interval, not synchronisation: the deadline decides


def old_python(version: str) -> str:
    """Path of a pyenv interpreter (e.g. "3.6.15"); skips locally, fails in CI, when missing."""
    path = PYENV / version / "bin" / "python"
    if not path.exists():
        unavailable(f"Python {version} not found at {path}")
    return str(path)


def require_binary(path: str) -> str:
    """Skip locally / fail in CI when a system binary is missing."""
    if not Path(path).exists() and not any(
        (Path(d) / path).exists() for d in os.environ.get("PATH", "").split(os.pathsep)
    ):
        unavailable(f"{path} missing: scripts/test.sh installs it")
    return path


def clean_copy(dest: Path) -> Path:
    """Copy this checkout's source to ``dest`` as a fresh clone would have it (no venv, no
    build or cache folders), for tests that build or install gpuctl as a user would."""
    shutil.copytree(
        REPO,
        dest,
        ignore=shutil.ignore_patterns(
            ".git",
            ".venv",
            "build",
            "dist",
            "*.egg-info",
            "__pycache__",
            ".*_cache",
            ".hypothesis",
        ),
    )
    return dest


class Tmux:
    """A private tmux server (own socket) running one shell command in a 160×48 pane."""

    def __init__(
        self, tmp: Path, command: str, env: dict[str, str], cwd: Path | None = None
    ) -> None:
        self.tmux = require_binary("tmux")
        self.socket = str(tmp / "tmux.sock")
        self.env = {k: v for k, v in env.items() if k != "TMUX"}
        self.cwd = cwd
        self.run("new-session", "-d", "-x", "160", "-y", "48", "-s", "t", command)
        self.run("set-option", "-t", "t", "remain-on-exit", "on")

    def run(self, *args: str) -> str:
        out = subprocess.run(
            [self.tmux, "-S", self.socket, *args],
            env=self.env,
            cwd=self.cwd,
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        )
        return out.stdout

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", "t")

    def show(self, fmt: str) -> str:
        return self.run("display-message", "-p", "-t", "t", fmt).strip()

    def keys(self, *keys: str) -> None:
        self.run("send-keys", "-t", "t", *keys)

    def close(self) -> None:
        subprocess.run([self.tmux, "-S", self.socket, "kill-server"], capture_output=True)


def shell_then_report(command: str) -> str:
    """``sh -c`` text running ``command``, printing ``gpuctl-exited=<status>`` after it and
    keeping the pane open, so that the terminal's state after the exit can be read."""
    script = f'{command}; echo "gpuctl-exited=$?"; exec sleep 300'
    return "sh -c " + shlex.quote(script)


def node_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a node-side subprocess importing gpuctl from this checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env.update(extra or {})
    return env


class AgentProcess:
    """A real agent subprocess with line-oriented, deadline-bounded reads."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env or node_env(),
        )
        assert self.proc.stdout is not None
        os.set_blocking(self.proc.stdout.fileno(), False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.proc.stdout, selectors.EVENT_READ)
        self._buf = b""

    @classmethod
    def start(cls, *args: str, python: str = sys.executable) -> AgentProcess:
        return cls([python, "-m", "gpuctl.node", "agent", *args])

    def send(self, msg: dict[str, Any] | bytes) -> None:
        assert self.proc.stdin is not None
        data = msg if isinstance(msg, bytes) else (json.dumps(msg) + "\n").encode()
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def read(self, timeout: float = 10.0) -> dict[str, Any]:
        """The next message; fails the test at the deadline or if the agent exits."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(f"agent sent no line within {timeout:g} s")
            if self._sel.select(left):
                assert self.proc.stdout is not None
                chunk = self.proc.stdout.read(1 << 16)
                if chunk == b"":
                    err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                    pytest.fail(f"agent exited ({self.proc.poll()}): {err[-2000:]}")
                self._buf += chunk or b""
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)  # type: ignore[no-any-return]

    def read_until(
        self, pred: Callable[[dict[str, Any]], bool], timeout: float = 10.0, limit: int = 10_000
    ) -> dict[str, Any]:
        """Skip messages until one matches ``pred``."""
        deadline = time.monotonic() + timeout
        for _ in range(limit):
            msg = self.read(max(0.01, deadline - time.monotonic()))
            if pred(msg):
                return msg
        pytest.fail("no matching message")

    def close(self) -> int:
        if self.proc.poll() is None:
            if self.proc.stdin:
                self.proc.stdin.close()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
