"""``gpuctl demo`` in a real terminal (tmux): draws, answers keys, quits cleanly."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuctl_tests.helpers import REPO, require_binary, wait_until


class Tmux:
    """A private tmux server (own socket) running one command in a 160×48 pane."""

    def __init__(self, tmp: Path, command: list[str]) -> None:
        self.tmux = require_binary("tmux")
        self.socket = str(tmp / "tmux.sock")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
        env["XDG_STATE_HOME"] = str(tmp / "state")  # the remembered theme stays in the test
        env["GPUCTL_CONFIG"] = str(tmp / "config.toml")
        (tmp / "config.toml").write_text("")
        env.pop("TMUX", None)
        self.env = env
        shell = " ".join(shlex.quote(c) for c in command)
        self.run("new-session", "-d", "-x", "160", "-y", "48", "-s", "t", shell)
        self.run("set-option", "-t", "t", "remain-on-exit", "on")

    def run(self, *args: str) -> str:
        out = subprocess.run(
            [self.tmux, "-S", self.socket, *args],
            env=self.env,
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


@pytest.fixture
def tmux_demo(tmp_path: Path) -> Iterator[Tmux]:
    demo = [sys.executable, "-m", "gpuctl", "demo", "--nodes", "3", "--gpus", "4"]
    # The shell outlives gpuctl so that the terminal's state after the exit can be read.
    script = " ".join(shlex.quote(c) for c in demo) + '; echo "gpuctl-exited=$?"; exec sleep 120'
    t = Tmux(tmp_path, ["sh", "-c", script])
    yield t
    t.close()


@pytest.mark.slow
def test_demo_draws_answers_keys_and_restores_the_terminal(tmux_demo: Tmux) -> None:
    t = tmux_demo
    wait_until(
        lambda: "SIMULATED" in (s := t.screen()) and "sim-03" in s and "live" in s,
        timeout=30,
        what="the demo's first screen",
    )
    assert t.show("#{alternate_on}") == "1"
    t.keys("m")
    wait_until(lambda: "heatmap: utilization" in t.screen(), what="the heatmap")
    t.keys("Right")
    wait_until(lambda: "sim-01 GPU 1" in t.screen(), what="the heatmap cursor's GPU")
    t.keys("Escape")
    wait_until(lambda: "heatmap:" not in t.screen(), what="back to the list")
    t.keys("?")
    wait_until(lambda: "stress_cluster" in t.screen(), what="the help screen")
    t.keys("Escape")
    wait_until(lambda: "stress_cluster" not in t.screen(), what="help closed")
    t.keys("q")
    exited = wait_until(
        lambda: [x for x in t.screen().split() if x.startswith("gpuctl-exited=")],
        timeout=20,
        what="gpuctl to exit",
    )
    assert exited == ["gpuctl-exited=0"]
    # The terminal is handed back as it was: main screen, cursor shown, no mouse reporting.
    assert t.show("#{alternate_on}") == "0"
    assert t.show("#{cursor_flag}") == "1"
    assert t.show("#{mouse_any_flag}") == "0"
    assert "SIMULATED" not in t.screen()
