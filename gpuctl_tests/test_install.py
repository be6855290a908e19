"""The README's "Try it" line, pasted as is on a stock login node, installs gpuctl and opens
the demo; a login node whose Python is too old gets one message saying what to do."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuctl_tests.helpers import (
    REPO,
    Tmux,
    clean_copy,
    old_python,
    shell_then_report,
    unavailable,
    wait_until,
)

pytestmark = pytest.mark.slow

# What a stock Debian login node's PATH holds: the system python3, no pyenv, no venv.
STOCK_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SYSTEM_PYTHON = Path("/usr/bin/python3")


def try_it_line() -> str:
    """The command of README.md's "Try it" section, exactly as a user would paste it."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Try it") :]
    m = re.search(r"```sh\n(.+?)\n```", section, re.S)
    assert m is not None, "README's Try it section has no sh block"
    (line,) = m.group(1).strip().splitlines()
    return line


def stock_env(home: Path, path: str = STOCK_PATH) -> dict[str, str]:
    env = {"HOME": str(home), "PATH": path, "LANG": "C.UTF-8", "TERM": "xterm-256color"}
    if "PIP_CONFIG_FILE" in os.environ:  # this machine's package index (conftest sets it)
        env["PIP_CONFIG_FILE"] = os.environ["PIP_CONFIG_FILE"]
    return env


@pytest.fixture
def system_python() -> Path:
    """Debian's own python3 (3.11, PEP 668 externally managed)."""
    if not SYSTEM_PYTHON.exists():
        unavailable(f"{SYSTEM_PYTHON} missing: this is not the Debian 12 image")
    return SYSTEM_PYTHON


@pytest.fixture
def fresh_clone(tmp_path: Path) -> Path:
    return clean_copy(tmp_path / "gpuctl")


@pytest.fixture
def home(tmp_path: Path) -> Path:
    h = tmp_path / "home"
    h.mkdir()
    return h


@pytest.fixture
def tmux(tmp_path: Path, fresh_clone: Path, home: Path) -> Iterator[Tmux]:
    t = Tmux(tmp_path, shell_then_report(try_it_line()), stock_env(home), cwd=fresh_clone)
    yield t
    t.close()


def test_the_readme_line_installs_on_the_system_python_and_opens_the_demo(
    system_python: Path, home: Path, tmux: Tmux
) -> None:
    pep668 = subprocess.run(
        [str(system_python), "-c", "import sysconfig; print(sysconfig.get_path('stdlib'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    # the point of the exercise: pip would refuse to install into this interpreter
    assert (Path(pep668.stdout.strip()) / "EXTERNALLY-MANAGED").exists()
    wait_until(
        lambda: "SIMULATED" in (s := tmux.screen()) and "live" in s,
        timeout=240,
        what="the demo to open after the install",
    )
    venv_python = home / ".local" / "share" / "gpuctl" / "venv" / "bin" / "python"
    assert venv_python.exists()
    tmux.keys("q")
    exited = wait_until(
        lambda: [x for x in tmux.screen().split() if x.startswith("gpuctl-exited=")],
        timeout=30,
        what="gpuctl to exit",
    )
    assert exited == ["gpuctl-exited=0"]
    assert (home / ".local" / "bin" / "gpuctl").resolve() == (
        venv_python.parent / "gpuctl"
    ).resolve()


def test_a_login_node_with_an_old_python_is_told_what_to_do(
    tmp_path: Path, fresh_clone: Path, home: Path
) -> None:
    """RHEL 8: python3 is 3.6 and nothing newer is on PATH."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python3").symlink_to(old_python("3.6.15"))
    for tool in ("dirname", "mkdir", "ln"):
        (bindir / tool).symlink_to(
            f"/usr/bin/{tool}" if Path(f"/usr/bin/{tool}").exists() else f"/bin/{tool}"
        )
    r = subprocess.run(
        ["/bin/sh", "scripts/install.sh"],
        cwd=fresh_clone,
        env=stock_env(home, str(bindir)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1
    assert "needs Python 3.10 or newer (python3 here: 3.6)" in r.stderr
    assert "module load python" in r.stderr and "GPUCTL_PYTHON=" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (home / ".local" / "share" / "gpuctl").exists()


def test_installing_again_after_a_module_was_deleted_leaves_it_out(
    tmp_path: Path, fresh_clone: Path, home: Path
) -> None:
    """The README's upgrade (run install.sh again in the updated checkout) replaces the install:
    a module the checkout no longer has is gone from it. setuptools' build folder kept every
    module it ever copied, so each later wheel (install.sh, ``pipx install .``, ``uv tool
    install .``) shipped deleted modules again."""
    venv_dir = tmp_path / "venv"
    env = stock_env(home, f"{Path(sys.executable).parent}:{STOCK_PATH}")
    env.update(GPUCTL_VENV=str(venv_dir), GPUCTL_BIN_DIR=str(tmp_path / "bin"))
    gone = fresh_clone / "gpuctl" / "zz_removed_later.py"
    gone.write_text('"""A module this checkout has now and deletes before the upgrade."""\n')

    def install() -> set[str]:
        r = subprocess.run(
            ["/bin/sh", "scripts/install.sh"],
            cwd=fresh_clone,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert r.returncode == 0, r.stdout + r.stderr
        (site,) = venv_dir.glob("lib/python3.*/site-packages")
        return {p.name for p in (site / "gpuctl").iterdir()}

    assert gone.name in install()
    gone.unlink()
    assert gone.name not in install()
