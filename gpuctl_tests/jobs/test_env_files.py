"""VENV2 from files: a requirements file built by uv for real (uv from PyPI, packages from the
machine's own index when it has one), a pyproject's dependencies, and a conda environment.yml
through the conda family's command lines (no conda here: a stand-in micromamba records its
arguments and makes the environment with venv)."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import cloudpickle
import pytest

from gpuctl.jobs import EnvSpec, Executor, JobStore
from gpuctl.jobs.provision import EnvSpecError
from gpuctl.node.supervisor import conda_create_argv

LOCAL_INDEX = Path("/opt/pypi/simple")  # this machine image's package index (see testbed.md)


def six_version() -> list[str]:
    import sys

    import six

    return [six.__version__, sys.prefix]


@pytest.fixture
def uv_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """uv (installed with the test extra, beside this Python) on PATH; its cache in the test's
    folder; no Python downloads; the machine's own index when there is one."""
    uv = Path(sys.executable).parent / "uv"
    if not uv.exists():
        pytest.fail(f"uv is not installed beside {sys.executable} (it is in the test extra)")
    monkeypatch.setenv("PATH", f"{uv.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    monkeypatch.setenv("UV_PYTHON_DOWNLOADS", "never")
    if LOCAL_INDEX.is_dir():
        monkeypatch.setenv("UV_INDEX_URL", LOCAL_INDEX.as_uri())


def test_requirements_file_built_by_uv(
    uv_env: None, venv1: str, tmp_path: Path, job_root: str
) -> None:
    req = tmp_path / "requirements.txt"
    req.write_text("# what train.py needs\nsix==1.17.0\n")
    spec = EnvSpec.from_requirements(req, methods=("uv",), base_python=sys.executable)
    ex = Executor(
        "local",
        supervisor_python=venv1,
        env=spec,
        env_root=str(tmp_path / "envs"),
        job_root=job_root,
        store=JobStore(),
    )
    probe = ex.venv2()
    assert probe["method"] == "uv"
    assert probe["cloudpickle"] == cloudpickle.__version__
    version, prefix = ex.submit(six_version).result(120)
    assert version == "1.17.0"
    assert Path(prefix).name == probe["env_key"]
    log = Path(str(probe["path"])).parents[2] / f"{probe['env_key']}.log"
    assert "uv pip install" in log.read_text() and "-r" in log.read_text()
    # the file's text is part of the key: another requirement is another environment
    other = EnvSpec.from_requirements(req, methods=("uv",), base_python=sys.executable)
    assert other == spec
    req.write_text("six==1.16.0\n")
    assert EnvSpec.from_requirements(req, methods=("uv",)) != spec


def test_pyproject_dependencies_and_extras(tmp_path: Path) -> None:
    py = tmp_path / "pyproject.toml"
    py.write_text(
        '[project]\nname = "train"\nrequires-python = ">=3.10"\n'
        'dependencies = ["numpy>=1.26", "einops"]\n'
        '[project.optional-dependencies]\nlogging = ["wandb"]\n'
    )
    spec = EnvSpec.from_pyproject(py, extras=["logging"], packages=("rich",))
    assert spec.packages == ("rich", "numpy>=1.26", "einops", "wandb")
    with pytest.raises(EnvSpecError, match=r"no optional dependencies 'gpu' \(has: logging\)"):
        EnvSpec.from_pyproject(py, extras=["gpu"])
    with pytest.raises(EnvSpecError, match=r"requires Python >=3\.10, and the environment asks"):
        EnvSpec.from_pyproject(py, python="3.8")
    py.write_text("[project\n")
    with pytest.raises(EnvSpecError, match="not valid TOML"):
        EnvSpec.from_pyproject(py)
    with pytest.raises(EnvSpecError, match="cannot read requirements file"):
        EnvSpec.from_requirements(tmp_path / "missing.txt")


def test_conda_command_lines() -> None:
    """What each conda-family tool is told (no conda here to run them for real)."""
    env, yml = "/e/abc", "/e/abc.environment.yml"
    assert conda_create_argv("/opt/bin/micromamba", env, "3.11", yml) == [
        "/opt/bin/micromamba", "create", "-y", "-q", "-p", env, "-f", yml]  # fmt: skip
    assert conda_create_argv("/opt/bin/mamba", env, "3.11", yml) == [
        "/opt/bin/mamba", "env", "create", "-q", "-p", env, "-f", yml]  # fmt: skip
    assert conda_create_argv("/opt/bin/conda", env, "3.11", None) == [
        "/opt/bin/conda", "create", "-y", "-q", "-p", env, "python=3.11", "pip"]  # fmt: skip


STAND_IN = """#!{python}
import json, subprocess, sys
args = sys.argv[1:]
with open({record!r}, "a") as f:
    f.write(json.dumps(args) + "\\n")
prefix = args[args.index("-p") + 1]
sys.exit(subprocess.call([{python!r}, "-m", "venv", "--system-site-packages", prefix]))
"""


def test_environment_yml_goes_to_the_conda_tool_the_node_has(
    venv1: str, tmp_path: Path, job_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "conda-bin"
    bin_dir.mkdir()
    record = tmp_path / "calls.jsonl"
    tool = bin_dir / "micromamba"
    tool.write_text(STAND_IN.format(python=sys.executable, record=str(record)))
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    yml = tmp_path / "environment.yml"
    yml.write_text("name: train\ndependencies:\n  - python=3.11\n  - pip\n")
    spec = EnvSpec.from_conda(yml)
    assert spec.methods == ("conda",)
    ex = Executor(
        "local",
        supervisor_python=venv1,
        env=spec,
        env_root=str(tmp_path / "envs"),
        job_root=job_root,
        store=JobStore(),
    )
    probe = ex.venv2()
    assert probe["method"] == "micromamba"
    (call,) = [json.loads(line) for line in record.read_text().splitlines()]
    envdir = str(Path(str(probe["path"])).parents[1])
    assert call == ["create", "-y", "-q", "-p", envdir, "-f", f"{envdir}.environment.yml"]
    assert Path(f"{envdir}.environment.yml").read_text() == yml.read_text()
    assert ex.submit(sum, [1, 2, 3]).result(60) == 6


def test_environment_yml_without_any_conda_tool_says_so(
    venv1: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuctl.jobs import JobFailed

    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    yml = tmp_path / "environment.yml"
    yml.write_text("dependencies:\n  - python=3.11\n")
    ex = Executor(
        "local",
        supervisor_python=venv1,
        env=EnvSpec.from_conda(yml, methods=("conda", "venv")),
        env_root=str(tmp_path / "envs"),
        store=False,
    )
    with pytest.raises(JobFailed) as info:
        ex.venv2()
    assert info.value.kind == "env_build_failed"
    assert "an environment.yml needs the conda method" not in str(info.value)
    assert "micromamba/mamba/conda not found" in str(info.value)
