"""The built wheel carries everything a user needs: the node side, the themes, the stylesheet,
the page of ``gpuctl serve``."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from gpuctl_tests.helpers import REPO, clean_copy

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Build from a clean copy: setuptools reuses a checkout's build/ folder, which can hold
    # modules the source no longer would ship (a package that lost its __init__.py).
    src = clean_copy(tmp_path_factory.mktemp("src") / "gpuctl-src")
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out)],
        cwd=src,
        check=True,
        capture_output=True,
        timeout=300,
    )
    (whl,) = out.glob("gpuctl-*.whl")
    return whl


def test_wheel_contents(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    themes = {n for n in names if n.startswith("gpuctl/themes/") and n.endswith(".toml")}
    assert {"gpuctl/themes/dark.toml", "gpuctl/themes/light.toml"} <= themes, themes
    assert any(n.startswith("gpuctl/themes/high") for n in themes), themes
    assert "gpuctl/node/agent.py" in names and "gpuctl/node/protocol.py" in names
    assert any(n.startswith("gpuctl/tui/") and n.endswith(".tcss") for n in names)
    assert "gpuctl/tui/web/app_index.html" in names  # gpuctl serve's page
    assert not any(n.startswith("gpuctl_tests/") for n in names)
    # Every module of the source tree ships: a folder without __init__.py is silently dropped.
    source = {
        p.relative_to(REPO).as_posix()
        for p in (REPO / "gpuctl").rglob("*.py")
        if "__pycache__" not in p.parts
    }
    assert source - names == set()


def test_themes_load_from_the_installed_wheel(wheel: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    # A venv of its own with the wheel and its dependencies installed, as a user's would be:
    # nothing borrowed from this interpreter or a base one, gpuctl never imported from here.
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "-q", str(wheel)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    probe = (
        "import gpuctl, importlib.resources as r, tomllib\n"
        "assert 'site-packages' in gpuctl.__file__, gpuctl.__file__\n"
        "d = r.files('gpuctl.themes')\n"
        "names = sorted(p.name for p in d.iterdir() if p.name.endswith('.toml'))\n"
        "for n in names: tomllib.loads(d.joinpath(n).read_text())\n"
        "from gpuctl.tui.themes import load_themes\n"
        "print(' '.join(sorted(t.name for t in load_themes())))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run(
        [str(py), "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    loaded = r.stdout.split()
    assert len(loaded) >= 3, loaded
