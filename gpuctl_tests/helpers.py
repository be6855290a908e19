"""Test utilities shared across gpuctl_tests: waiting with deadlines, real agents, old Pythons."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import selectors
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

from gpuctl.core.deadline import wait_for

if TYPE_CHECKING:
    from textual.pilot import Pilot

    from gpuctl.core.model import NodeSnapshot
    from gpuctl.fleet.fleet import Fleet
    from gpuctl.fleet.recording.writer import Recorder

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


TORCH_MISSING = (
    "torch is not installed: the full lane installs its CPU wheel (scripts/test.sh: "
    "pip install torch==2.13.0, from the machine's wheels); the unit lane runs without it"
)


def need_torch(*, module: bool = False) -> Any:
    """``torch`` for a test that needs it. Without torch: skipped in the unit lane (``--unit``:
    its venv has no torch), else as ``unavailable`` (skip here, fail in CI's full lane).
    ``module=True`` at a module's top level skips the whole module."""
    try:
        import torch
    except ImportError:
        from gpuctl_tests import lanes

        if lanes.UNIT_LANE:
            pytest.skip(TORCH_MISSING, allow_module_level=module)
        if IN_CI:
            pytest.fail(TORCH_MISSING, pytrace=False)
        pytest.skip(TORCH_MISSING, allow_module_level=module)
    return torch


# -- waiting: the one mechanism every test uses to wait for something --------------------------
# A test waits for a condition with a deadline, never for a time: ``pred`` is tried again until
# it returns something truthy (which is returned), and the test fails at the deadline, naming
# ``what`` it waited for and, when ``now`` is given, what it saw instead. Between two tries a
# thread sleeps ``every`` seconds; a coroutine awaits ``wake(seconds_left)``: a short sleep by
# default, ``fleet_changes`` to be woken by a fleet's updates, ``pilot.pause`` on a screen.
Wake = Callable[[float], Awaitable[object]]


def _timed_out(timeout: float, what: str, now: Callable[[], object] | None) -> NoReturn:
    seen = f"; now {now()}" if now is not None else ""
    pytest.fail(f"timed out after {timeout:g} s waiting for {what}{seen}")


def wait_until(
    pred: Callable[[], Any],
    timeout: float = 10.0,
    what: str = "condition",
    *,
    every: float = 0.02,
    now: Callable[[], object] | None = None,
) -> Any:
    """Try ``pred`` until it returns something truthy; fail the test at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            _timed_out(timeout, what, now)
        time.sleep(every)  # a poll interval, not synchronisation: the deadline decides


async def wait_until_async(
    pred: Callable[[], Any],
    timeout: float = 10.0,
    what: str = "condition",
    *,
    wake: Wake | None = None,
    now: Callable[[], object] | None = None,
) -> Any:
    """``wait_until`` on an event loop; ``pred`` may be a coroutine function. Between two tries
    it awaits ``wake(seconds left)`` (default: a 0.02 s sleep, a poll interval)."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        left = deadline - time.monotonic()
        if left <= 0:
            _timed_out(timeout, what, now)
        await (wake(left) if wake is not None else asyncio.sleep(min(left, 0.02)))


def fleet_changes(fleet: Fleet) -> Wake:
    """A ``wake`` for ``wait_until_async`` that returns when ``fleet`` publishes a change (or
    after half a second at most: a condition on the clock needs no change to come true)."""
    changed = asyncio.Event()
    fleet.subscribe(lambda _snapshot: changed.set())

    async def wake(left: float) -> None:
        changed.clear()
        with contextlib.suppress(TimeoutError):
            await wait_for(changed.wait(), min(left, 0.5))

    return wake


def all_live(snaps: Iterable[NodeSnapshot], gpus: int | None = None) -> bool:
    """Every node live with its GPUs (``gpus`` of them, when given): what a test that starts
    a fleet waits for before it looks."""
    from gpuctl.core.model import NodeState

    return all(
        s.state is NodeState.LIVE and (len(s.gpus) == gpus if gpus is not None else s.gpus)
        for s in snaps
    )


async def wait_fleet(
    fleet: Fleet,
    pred: Callable[[dict[str, NodeSnapshot]], Any],
    timeout: float = 30.0,
    what: str = "the fleet state",
) -> dict[str, NodeSnapshot]:
    """Wait until ``pred({name: snapshot})`` holds, woken by the fleet's own updates; the
    snapshots it held for."""

    def snapshots() -> dict[str, NodeSnapshot]:
        return {s.name: s for s in fleet.snapshots()}

    def now() -> object:
        return {n: (s.state.value, s.reason, dict(s.annotations)) for n, s in snapshots().items()}

    await wait_until_async(
        lambda: pred(snapshots()), timeout, what, wake=fleet_changes(fleet), now=now
    )
    return snapshots()


@contextlib.asynccontextmanager
async def recording_fleet(
    fleet: Fleet, path: Path, frame_seconds: float = 0.5
) -> AsyncIterator[Recorder]:
    """``fleet`` started with a recording of it into ``path`` from its first hello (frames of
    ``frame_seconds``, short: a few seconds of test make several frames); on the way out, also
    when the test failed, the fleet is stopped and the recording closed, so the file is
    complete to read back."""
    from gpuctl.fleet.recording.writer import Recorder

    recorder = Recorder(fleet, path, frame_seconds=frame_seconds)
    try:
        await fleet.start()
        yield recorder
    finally:
        await fleet.stop()
        recorder.close()


async def until(
    pilot: Pilot[Any], pred: Callable[[], Any], what: str = "condition", timeout: float = 15.0
) -> Any:
    """``wait_until_async`` on a Textual screen: the app runs between two tries, and an app
    that crashed fails the test at once, saying so."""

    def screen_pred() -> Any:
        crashed = pilot.app._exception
        assert crashed is None, f"the app crashed waiting for {what}: {crashed!r}"
        return pred()

    return await wait_until_async(screen_pred, timeout, what, wake=lambda _left: pilot.pause(0.05))


async def open_detail(pilot: Pilot[Any], node: str, gpu: int | None) -> Any:
    """GPU ``gpu`` of ``node`` selected in the list and opened with Enter: its detail screen,
    once it shows."""
    from gpuctl.tui.screens.detail import DetailScreen

    app: Any = pilot.app
    app.overview.nodes.select(node, gpu)
    await pilot.press("enter")
    return await until(
        pilot,
        lambda: isinstance(app.screen, DetailScreen) and app.screen,
        f"the detail screen of {node} GPU {gpu}",
    )


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
    build or cache folders, its git folder kept: the version comes from git tags), for tests
    that build or install gpuctl as a user would."""
    shutil.copytree(
        REPO,
        dest,
        ignore=shutil.ignore_patterns(
            ".venv*",
            "site",
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


def assert_reader_keeps_all(schema: Any, written: dict[str, Any], what: str) -> None:
    """``written`` (a message or a file as its writer wrote it), decoded as the login side
    decodes it (``gpuctl.core.wire.parse(schema, ...)``), is what was written: no key unknown
    to ``schema``, none dropped or changed for its value's type, nested ones included."""
    from typing import get_type_hints

    from gpuctl.core.wire import parse

    unknown = sorted(written.keys() - get_type_hints(schema).keys())
    assert not unknown, f"{what} keys the reader does not know: {unknown}"
    read = parse(schema, written)
    assert read is not None, f"{what}: the reader refused it whole: {written}"
    dropped = {k: v for k, v in written.items() if read.get(k) != v}
    assert not dropped, f"{what} fields the reader dropped or changed: {dropped}"
