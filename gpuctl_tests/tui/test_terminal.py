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


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env["GPUCTL_STATE_DIR"] = str(tmp_path / "state")
    env["GPUCTL_CONFIG"] = str(tmp_path / "config.toml")
    (tmp_path / "config.toml").write_text("")
    return env


def _exit_status(t: Tmux) -> list[str]:
    return wait_until(
        lambda: [x for x in t.screen().split() if x.startswith("gpuctl-exited=")],
        timeout=30,
        what="gpuctl to exit",
    )


@pytest.mark.slow
def test_demo_opens_over_a_damaged_job_store(tmp_path: Path) -> None:
    """A junk jobs.sqlite used to end ``gpuctl demo`` with exit 70: the screen opens, the jobs
    pane says which file and what to do."""
    env = _env(tmp_path)
    (tmp_path / "state").mkdir(mode=0o700)
    (tmp_path / "state" / "jobs.sqlite").write_bytes(b"junk, not SQLite\x00\xff" * 64)
    demo = [sys.executable, "-m", "gpuctl", "demo", "--nodes", "2", "--gpus", "2", "--no-story"]
    t = Tmux(tmp_path, shell_then_report(shlex.join(demo)), env)
    try:
        wait_until(lambda: "sim-02" in t.screen(), timeout=30, what="the demo's screen")
        t.keys("2")
        wait_until(lambda: "is damaged" in t.screen(), what="the jobs pane's reason")
        screen = t.screen()
        assert "jobs.sqlite is damaged (file is not a database): move it away" in screen
        t.keys("q")
        assert _exit_status(t) == ["gpuctl-exited=0"]
    finally:
        t.close()


# ``gpuctl watch`` over a fleet whose GPU history raises: the screen crashes on its first paint.
CRASHING_WATCH = """
import sys
import gpuctl.cli.common
from gpuctl_tests.tui.hostile import crashing_fleet
gpuctl.cli.common.build_fleet = lambda args: crashing_fleet()
from gpuctl.cli.main import main
sys.exit(main(["watch"]))
"""


@pytest.mark.slow
def test_a_crashed_screen_exits_non_zero_with_one_line_naming_the_log(tmp_path: Path) -> None:
    t = Tmux(
        tmp_path,
        shell_then_report(shlex.join([sys.executable, "-c", CRASHING_WATCH])),
        _env(tmp_path),
    )
    try:
        assert _exit_status(t) == ["gpuctl-exited=1"]
        log = tmp_path / "state" / "logs" / "gpuctl.log"
        joined = t.run("capture-pane", "-p", "-J", "-t", "t")  # wrapped lines joined
        lines = [line.rstrip() for line in joined.splitlines() if line.strip()]
        assert lines[-1] == "gpuctl-exited=1"
        # The terminal is back (main screen) and the last line before the status says it all.
        assert t.show("#{alternate_on}") == "0"
        assert lines[-2] == (
            "gpuctl: the screen crashed: RuntimeError: history is broken [bold]on purpose[/  "
            f"(traceback in {log})"
        )
        assert not any("Traceback" in line for line in lines)
        assert "Traceback (most recent call last)" in log.read_text()
    finally:
        t.close()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("lang", "flags", "ascii"),
    [("C", [], True), ("C.UTF-8", [], False), ("C.UTF-8", ["--ascii"], True)],
)
def test_a_c_locale_gets_an_ascii_screen_by_itself(
    tmp_path: Path, lang: str, flags: list[str], ascii: bool
) -> None:
    """Issue 39.11: ``gpuctl demo`` under ``LANG=C`` draws only ASCII in a real terminal, with
    no flag and no config (``tui.glyphs.wanted``), and so does ``--ascii`` under UTF-8; the same
    terminal under a UTF-8 locale shows the glyphs otherwise, so the capture could see them."""
    env = _env(tmp_path)
    env.pop("LC_ALL", None)
    env.pop("LC_CTYPE", None)
    demo = [
        sys.executable,
        "-m",
        "gpuctl",
        "demo",
        "--nodes",
        "1",
        "--gpus",
        "4",
        "--no-story",
        *flags,
    ]
    command = f"LANG={lang} {shlex.join(demo)}"  # the locale of gpuctl, not of tmux
    t = Tmux(tmp_path, shell_then_report(command), env)
    try:
        wait_until(
            lambda: "sim-01" in (s := t.screen()) and "processes on sim-01" in s,
            timeout=30,
            what="the demo's screen with its process panel",
        )
        odd = sorted({c for c in t.screen() if not c.isascii()})
        assert (odd == []) is ascii, odd
        t.keys("q")
        assert _exit_status(t) == ["gpuctl-exited=0"]
    finally:
        t.close()


@pytest.mark.slow
def test_the_demos_burns_are_no_record_in_the_audit_log(tmp_path: Path) -> None:
    """Every ``gpuctl demo`` wrote ``stress_start sim-01 GPU 6`` (its story's burn) into the
    user's audit log: ``gpuctl audit`` listed simulated nodes, and the user's real screens said
    it as another session's burn. The demo's actions stay out of the log."""
    env = _env(tmp_path)
    demo = [sys.executable, "-m", "gpuctl", "demo", "--nodes", "2"]
    t = Tmux(tmp_path, shell_then_report(shlex.join(demo)), env)
    try:
        wait_until(lambda: "BURN" in t.screen(), timeout=60, what="the story's burn on screen")
        t.keys("q")
        assert _exit_status(t) == ["gpuctl-exited=0"]
    finally:
        t.close()
    log = tmp_path / "state" / "audit.jsonl"
    assert not log.exists() or not log.read_text(), log.read_text()
