"""A smoke of every command on the demo, as a user runs them: ``python -m gpuctl`` in a process
of its own, a fresh HOME, no cluster configured, no torch needed.

The test command runs this module under every Python gpuctl claims (scripts/test.sh: 3.10 to
3.13) and with the dependencies at their declared floors, besides the unit and full lanes on
the test venv's Python: what breaks on one Python or one dependency version breaks here first
(``gpuctl record --demo`` ended in "internal error: TimeoutError" on 3.10; the demo's nodes all
timed out with msgspec 0.18).

Each command must end with the exit code of the table in docs/exit-codes.md and never print a
traceback.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuctl_tests.helpers import wait_until


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir()
    keep = ("PATH", "LANG", "LC_ALL", "PIP_CONFIG_FILE", "PYTHONPATH")
    e = {k: os.environ[k] for k in keep if k in os.environ}
    e.update(HOME=str(home), TERM="xterm-256color", XDG_CONFIG_HOME=str(home / ".config"))
    return e


def gpuctl(
    env: dict[str, str], *args: str, cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        [sys.executable, "-m", "gpuctl", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd or env["HOME"],  # the installed gpuctl, not a checkout's folder of that name
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    assert "Traceback" not in r.stderr + r.stdout, r.stderr
    assert "internal error" not in r.stderr, r.stderr
    assert "Warning:" not in r.stderr, r.stderr  # a dependency's DeprecationWarning at start
    return r


def test_version_and_help(env: dict[str, str]) -> None:
    r = gpuctl(env, "--version")
    assert r.returncode == 0 and re.fullmatch(r"gpuctl \S+( \(checkout .+\))?\n", r.stdout), r
    r = gpuctl(env, "--help")
    assert r.returncode == 0 and "demo" in r.stdout


def test_status_on_the_demo(env: dict[str, str]) -> None:
    r = gpuctl(env, "status", "--demo")
    assert r.returncode == 0, r.stderr
    rows = r.stdout.splitlines()
    assert rows[0].split()[:2] == ["NODE", "GPU"] and len(rows) > 8, r.stdout
    r = gpuctl(env, "status", "--demo", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["nodes"] and all(n["gpus"] for n in doc["nodes"]), doc


def test_record_then_replay_to_csv(env: dict[str, str], tmp_path: Path) -> None:
    rec = tmp_path / "x.gpurec"
    r = gpuctl(env, "record", str(rec), "--demo", "--duration", "3s")
    assert r.returncode == 0, r.stderr
    assert rec.stat().st_size > 0
    out = tmp_path / "x.csv"
    r = gpuctl(env, "replay", str(rec), "--export-csv", str(out))
    assert r.returncode == 0, r.stderr
    lines = out.read_text().splitlines()
    assert lines[0].startswith("time,") and len(lines) > 6, lines[:3]


def test_config_init_check_and_path(env: dict[str, str], tmp_path: Path) -> None:
    r = gpuctl(env, "config", "path")
    assert r.returncode == 0, r.stderr
    r = gpuctl(env, "config", "init")
    assert r.returncode == 0, r.stderr
    r = gpuctl(env, "config", "check")
    assert r.returncode == 0, r.stderr


def test_doctor_without_a_config(env: dict[str, str]) -> None:
    """No config: the login side and this machine; no GPU here, so its agent check fails (1)."""
    r = gpuctl(env, "doctor")
    assert r.returncode in (0, 1), r.stderr
    assert "login" in r.stdout and "checks:" in r.stdout + r.stderr


def test_audit_with_no_actions_yet(env: dict[str, str]) -> None:
    r = gpuctl(env, "audit")
    assert r.returncode == 0 and r.stdout.startswith("no actions in "), r.stdout + r.stderr
    r = gpuctl(env, "audit", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["entries"] == [], r.stderr


def test_events_with_no_trouble_yet(env: dict[str, str]) -> None:
    r = gpuctl(env, "events")
    assert r.returncode == 0, r.stdout + r.stderr
    r = gpuctl(env, "events", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["events"] == [], r.stderr


def test_stress_status_on_the_demo(env: dict[str, str]) -> None:
    r = gpuctl(env, "stress", "status", "--demo")
    assert r.returncode == 0, r.stderr


def test_jobs_list_bundle_and_completion(env: dict[str, str], tmp_path: Path) -> None:
    r = gpuctl(env, "jobs", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["jobs"] == [], r.stderr
    r = gpuctl(env, "agent-bundle", str(tmp_path / "b"))
    assert r.returncode == 0, r.stderr
    assert list((tmp_path / "b").glob("gpuctl-node-*.pyz"))
    for shell in ("bash", "zsh", "fish"):
        r = gpuctl(env, "completion", shell)
        assert r.returncode == 0 and "gpuctl" in r.stdout, r.stderr


@pytest.fixture
def exporter(env: dict[str, str]) -> Iterator[tuple[subprocess.Popen[str], str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuctl", "export", "--demo", "--listen", "127.0.0.1:0"],
        env=env,
        cwd=env["HOME"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "gpuctl export: http://127.0.0.1:PORT/metrics (...)"
        m = re.search(r"(http://127\.0\.0\.1:\d+/metrics)", line)
        assert m, line
        yield proc, m.group(1)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)


def test_export_on_the_demo_answers_and_stops_on_ctrl_c(
    exporter: tuple[subprocess.Popen[str], str],
) -> None:
    proc, url = exporter

    def gpus_served() -> str:
        with urllib.request.urlopen(url, timeout=10) as answer:  # loopback only
            body: str = answer.read().decode()
        return body if "DCGM_FI_DEV_GPU_UTIL{" in body else ""

    # the demo's first samples arrive within a second
    wait_until(gpus_served, 60, "the demo's GPUs on /metrics", every=0.5)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(30) == 0
    assert proc.stderr is not None
    assert "Traceback" not in proc.stderr.read()


def test_the_demo_screen_opens_and_quits(env: dict[str, str]) -> None:
    """``gpuctl demo`` in a real pseudo-terminal: its first frame, then ``q``."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: gpuctl on the pty
        os.environ.clear()
        os.environ.update(env, COLUMNS="120", LINES="40")
        os.chdir(env["HOME"])
        os.execv(sys.executable, [sys.executable, "-m", "gpuctl", "demo", "--no-story"])
    import fcntl
    import struct
    import termios

    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    seen = b""
    deadline = time.monotonic() + 90
    quit_sent = False
    status = None
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:  # EIO: the child closed the terminal
                    chunk = b""
                if not chunk:
                    break
                seen += chunk
            if not quit_sent and b"SIMULATED" in seen and b"live" in seen:
                os.write(fd, b"q")
                quit_sent = True
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status = st
                break
        if status is None:
            _, status = os.waitpid(pid, 0) if quit_sent else (0, None)
    finally:
        if status is None:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)
    text = seen.decode(errors="replace")
    assert quit_sent, text[-2000:]
    assert status is not None and os.waitstatus_to_exitcode(status) == 0, text[-2000:]
    assert "Traceback" not in text


def test_the_smoke_covers_every_command() -> None:
    """A new subcommand gets a smoke here or is named as left out, with why."""
    from gpuctl.cli.main import build_parser

    parser = build_parser()
    (sub,) = (a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    commands = set(sub.choices)  # type: ignore[attr-defined]
    source = Path(__file__).read_text()
    # a command run here: gpuctl(env, "CMD", ...) or [..., "-m", "gpuctl", "CMD", ...]
    smoked = {c for c in commands if re.search(rf'(env, |"gpuctl", )"{re.escape(c)}"', source)}
    left_out = {
        "watch": "the screen on a configured cluster: the demo screen above is the same app",
        "accept": "needs torch: the full lane (gpuctl_tests/accept)",
        "serve": "needs a browser: the full lane (gpuctl_tests/tui/test_serve.py)",
        "submit": "runs a job in a VENV2 it builds: the full lane (gpuctl_tests/jobs)",
        "logs": "reads a submitted job: the full lane (gpuctl_tests/jobs)",
        "cancel": "cancels a submitted job: the full lane (gpuctl_tests/jobs)",
        "result": "reads a submitted job: the full lane (gpuctl_tests/jobs)",
    }
    assert commands - smoked - set(left_out) == set()
    assert not smoked & set(left_out), "a command smoked here is also named as left out"
