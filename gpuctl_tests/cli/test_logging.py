"""``-v`` and ``--log-file``: every command logs to a private rotating file in the state folder;
``-v`` copies the lines to stderr; a log that cannot be written never stops a command."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

from gpuctl_tests.helpers import node_env


def gpuctl(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = node_env({"GPUCTL_STATE_DIR": str(tmp_path / "state")})
    env["GPUCTL_CONFIG"] = str(tmp_path / "config.toml")
    (tmp_path / "config.toml").write_text("")
    return subprocess.run(
        [sys.executable, "-m", "gpuctl", *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )


def test_every_command_logs_to_a_private_file_in_the_state_folder(tmp_path: Path) -> None:
    r = gpuctl(tmp_path, "status", "--demo")
    assert r.returncode == 0, r.stderr
    log = tmp_path / "state" / "logs" / "gpuctl.log"
    assert "INFO gpuctl.cli: gpuctl " in log.read_text() and ": status" in log.read_text()
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    assert stat.S_IMODE(log.parent.stat().st_mode) == 0o700
    assert "INFO" not in r.stderr  # quiet on the terminal without -v


def test_verbose_copies_log_lines_to_stderr_before_or_after_the_command(tmp_path: Path) -> None:
    for argv in (["-v", "status", "--demo"], ["status", "--demo", "-v"]):
        r = gpuctl(tmp_path, *argv)
        assert r.returncode == 0, r.stderr
        assert "gpuctl: INFO gpuctl.cli: gpuctl " in r.stderr, argv


def test_log_file_option_and_an_unwritable_log(tmp_path: Path) -> None:
    mine = tmp_path / "elsewhere" / "my.log"
    r = gpuctl(tmp_path, "--log-file", str(mine), "status", "--demo")
    assert r.returncode == 0 and ": status" in mine.read_text()
    # a log folder that cannot exist (its parent is a file: even root cannot make it)
    (tmp_path / "a-file").write_text("")
    r = gpuctl(tmp_path, "--log-file", str(tmp_path / "a-file" / "x.log"), "config", "path")
    assert r.returncode == 0, r.stderr
    assert r.stderr == "" and "config.toml" in r.stdout


def test_a_log_file_in_an_existing_folder_leaves_the_folder_as_it_is(tmp_path: Path) -> None:
    """``--log-file ~/gpuctl.log`` must not make the home folder 0700 (issue 38.8): a folder the
    user names keeps its mode; the folders it lacks are made private."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    r = gpuctl(tmp_path, "--log-file", str(shared / "x.log"), "config", "path")
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(shared.stat().st_mode) == 0o755
    assert stat.S_IMODE((shared / "x.log").stat().st_mode) == 0o600
    r = gpuctl(tmp_path, "--log-file", str(shared / "new" / "deeper" / "x.log"), "config", "path")
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(shared.stat().st_mode) == 0o755
    for made in (shared / "new", shared / "new" / "deeper"):
        assert stat.S_IMODE(made.stat().st_mode) == 0o700, made


def test_a_failure_that_is_not_a_mistake_names_the_log(tmp_path: Path) -> None:
    """An OSError a command did not foresee: one line, exit 1, and where the log is."""
    code = (
        "import sys, errno\n"
        "from gpuctl.cli import jobs, main\n"
        "def boom(args):\n"
        "    raise PermissionError(errno.EACCES, 'Permission denied', '/srv/x')\n"
        "jobs.run_jobs = boom\n"
        "sys.exit(main.main(['jobs']))\n"
    )
    env = node_env({"GPUCTL_STATE_DIR": str(tmp_path / "state")})
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    log = tmp_path / "state" / "logs" / "gpuctl.log"
    assert r.returncode == 1
    assert r.stderr == f"gpuctl: /srv/x: Permission denied (log: {log})\n"
    assert "PermissionError" in log.read_text()
