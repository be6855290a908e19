"""The release's artifacts: ``python -m build`` gives a wheel and an sdist that pass ``twine check
--strict``, under the distribution's own name with its license; the wheel carries everything a
user needs (the node side, the themes, the stylesheet, the page of ``gpuctl serve``), and once
installed into a clean venv it says its version, runs the demo and deploys an agent to a real
sshd node, from the wheel and not from this checkout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import venv
import zipfile
from pathlib import Path
from typing import Any

import pytest

from gpuctl_tests.helpers import REPO, clean_copy

pytestmark = pytest.mark.slow


DIST = "gpuctl_cluster"  # the distribution's name on the package index, normalized


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist and the wheel, built as a release is: ``python -m build`` (the sdist first,
    the wheel from it) in a clean copy of this checkout, its git folder included (the version
    comes from git tags)."""
    src = clean_copy(tmp_path_factory.mktemp("src") / "gpuctl-src")
    out = tmp_path_factory.mktemp("dist")
    r = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out)],
        cwd=src,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def wheel(dist: Path) -> Path:
    (whl,) = dist.glob(f"{DIST}-*.whl")
    return whl


@pytest.fixture(scope="module")
def checkout_version() -> str:
    """The version setuptools-scm gives this checkout, as the build saw it."""
    r = subprocess.run(
        [sys.executable, "-m", "setuptools_scm"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return r.stdout.strip().splitlines()[-1]


def test_the_artifacts_pass_twine_check_strict(dist: Path) -> None:
    files = sorted(str(p) for p in dist.iterdir())
    assert sorted(Path(f).suffix for f in files) == [".gz", ".whl"], files
    r = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *files],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("PASSED") == 2, r.stdout


def test_the_metadata_names_the_distribution_its_license_and_pythons(wheel: Path) -> None:
    z = zipfile.ZipFile(wheel)
    (meta,) = (n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    text = z.read(meta).decode()
    headers = [line for line in text.split("\n\n", 1)[0].splitlines()]
    assert "Name: gpuctl-cluster" in headers
    assert "License-Expression: MIT" in headers
    assert "License-File: LICENSE" in headers
    for minor in (10, 11, 12, 13):
        assert f"Classifier: Programming Language :: Python :: 3.{minor}" in headers
    assert "Requires-Python: >=3.10" in headers
    (lic,) = (n for n in z.namelist() if n.endswith(".dist-info/licenses/LICENSE"))
    assert z.read(lic).decode() == (REPO / "LICENSE").read_text()
    assert z.read(lic).decode().startswith("MIT License")


def test_the_sdist_holds_the_source_tests_and_license(dist: Path) -> None:
    (sdist,) = dist.glob(f"{DIST}-*.tar.gz")
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    assert {"LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml", "setup.py"} <= names
    assert "gpuctl/_version.py" in names  # the version travels without git
    tracked = subprocess.run(
        ["git", "ls-files", "gpuctl", "gpuctl_tests", "themes"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert set(tracked) - names == set()


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


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clean venv with the wheel and its dependencies: its ``bin`` folder."""
    env_dir = tmp_path_factory.mktemp("wheel-venv") / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    r = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "-q", str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return env_dir / "bin"


def user_env(home: Path, bindir: Path) -> dict[str, str]:
    """A user's environment: the venv's bin first, no PYTHONPATH, this checkout nowhere."""
    home.mkdir(parents=True, exist_ok=True)
    env = {
        "HOME": str(home),
        "PATH": f"{bindir}:/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "XDG_CONFIG_HOME": str(home / ".config"),
    }
    return env


def run_installed(
    installed: Path, cwd: Path, env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    """A program of the installed venv (``gpuctl``, ``python``), as the user runs it."""
    return subprocess.run(
        [str(installed / args[0]), *args[1:]],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_the_installed_wheel_says_its_version_and_runs_the_demo(
    installed: Path, checkout_version: str, tmp_path: Path
) -> None:
    env = user_env(tmp_path / "home", installed)
    r = run_installed(installed, tmp_path, env, "gpuctl", "--version")
    assert r.returncode == 0, r.stderr
    # an installed copy: the version alone (no checkout), the one the build gave
    (word, version) = r.stdout.split()
    assert word == "gpuctl" and version.split("+")[0] == checkout_version.split("+")[0], r.stdout
    where = run_installed(
        installed, tmp_path, env, "python", "-c", "import gpuctl; print(gpuctl.__file__)"
    )
    assert str(installed.parent) in where.stdout, where.stdout
    rec = tmp_path / "demo.gpurec"
    r = run_installed(
        installed, tmp_path, env, "gpuctl", "record", str(rec), "--demo", "--duration", "2s"
    )
    assert r.returncode == 0 and rec.stat().st_size > 0, r.stderr
    r = run_installed(installed, tmp_path, env, "gpuctl", "status", "--demo")
    assert r.returncode == 0 and r.stdout.startswith("NODE"), r.stderr


def test_the_installed_wheel_deploys_an_agent_to_an_sshd_node(
    installed: Path, ssh_cluster: Any, nvml_lib_dir: Path, tmp_path: Path
) -> None:
    """From the wheel alone: the bundle the installed gpuctl builds reaches a real sshd node,
    its agent starts there and reads the node's GPUs through the real nvidia-ml-py bindings
    (the wheel vendors them into the bundle) from the stand-in ``libnvidia-ml.so.1``."""
    from gpuctl_tests.node.nvml_stub import CONFIG_ENV, NvmlStub

    stub = NvmlStub(nvml_lib_dir, tmp_path / "nvml.conf", "count 2\n")
    ssh_cluster.start_node(
        "wheelnode",
        simulate=None,
        env={"LD_LIBRARY_PATH": str(stub.lib_dir), CONFIG_ENV: str(stub.config)},
    )
    config = tmp_path / "gpuctl.toml"
    config.write_text(ssh_cluster.cluster_toml("c", ["wheelnode"], interval=0.5))
    env = user_env(tmp_path / "home", installed)
    argv = ["--config", str(config), "status", "--json", "--timeout", "60"]
    r = run_installed(installed, tmp_path, env, "gpuctl", *argv)
    assert r.returncode == 0, r.stderr
    (node,) = json.loads(r.stdout)["nodes"]
    assert node["name"] == "wheelnode" and len(node["gpus"]) == 2, node
    assert node["reader"].startswith("nvml"), node
