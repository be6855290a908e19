"""``gpuctl demo`` in a real terminal (tmux): draws, answers keys, quits cleanly."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuctl_tests.helpers import REPO, Tmux, shell_then_report, wait_until


@pytest.fixture
def tmux_demo(tmp_path: Path) -> Iterator[Tmux]:
    demo = [sys.executable, "-m", "gpuctl", "demo", "--nodes", "3", "--gpus", "4"]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env["XDG_STATE_HOME"] = str(tmp_path / "state")  # the remembered theme stays in the test
    env["GPUCTL_CONFIG"] = str(tmp_path / "config.toml")
    (tmp_path / "config.toml").write_text("")
    t = Tmux(tmp_path, shell_then_report(shlex.join(demo)), env)
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
