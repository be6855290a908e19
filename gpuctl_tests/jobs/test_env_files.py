"""VENV2 from files: a requirements file built by uv for real (uv from PyPI; the packages from
a wheelhouse the test makes, named only in pip's configuration), a pyproject's dependencies, and
a conda environment.yml through the conda family's command lines (no conda here: a stand-in
micromamba records its arguments and makes the environment with venv)."""

from __future__ import annotations

import functools
import json
import logging
import os
import stat
import sys
from pathlib import Path

import cloudpickle
import pytest

from gpuctl.jobs import EnvSpec, Executor, JobStore
from gpuctl.jobs.provision import EnvSpecError
from gpuctl.node import envbuild
from gpuctl.node.envbuild import UV_OWN, conda_create_argv
from gpuctl_tests.jobs.wheels import make_wheel, wheel_of


def building(spec: EnvSpec, venv1: str, tmp_path: Path, job_root: str) -> Executor:
    """A local Executor that builds ``spec`` as VENV2 under the test's folder."""
    return Executor(
        "local",
        supervisor_python=venv1,
        env=spec,
        env_root=str(tmp_path / "envs"),
        job_root=job_root,
        store=JobStore(),
    )


MARKER = b'WHERE = "the test\'s own wheelhouse"\n'


def marker_where() -> list[str]:
    import sys

    import gpuctl_test_marker  # type: ignore[import-not-found]

    return [gpuctl_test_marker.WHERE, sys.prefix]


@pytest.fixture
def pip_wheelhouse(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """uv (installed with the test extra, beside this Python) on PATH with no settings of its
    own; a wheelhouse of the test's own making (this cloudpickle, and a package that is on no
    index) that only pip's configuration names (``no-index``, ``find-links``), as on a site
    whose mirror is configured for pip. Nothing depends on what the machine image carries."""
    uv = Path(sys.executable).parent / "uv"
    if not uv.exists():
        pytest.fail(f"uv is not installed beside {sys.executable} (it is in the test extra)")
    monkeypatch.setenv("PATH", f"{uv.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    monkeypatch.setenv("UV_PYTHON_DOWNLOADS", "never")
    for name in list(os.environ):
        if name.startswith("PIP_") or name in UV_OWN or name == "UV_INDEX_STRATEGY":
            monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))  # no user's uv.toml
    monkeypatch.setenv("XDG_CONFIG_DIRS", str(tmp_path / "etc-xdg"))
    house = tmp_path / "wheelhouse"
    wheel_of("cloudpickle", house)
    make_wheel(house, "gpuctl-test-marker", "1.0", {"gpuctl_test_marker.py": MARKER})
    conf = tmp_path / "pip.conf"
    conf.write_text(f"[global]\nno-index = true\nfind-links =\n    {house}\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    return house


def test_requirements_file_built_by_uv_from_pips_package_source(
    pip_wheelhouse: Path, venv1: str, tmp_path: Path, job_root: str
) -> None:
    req = tmp_path / "requirements.txt"
    req.write_text("# what train.py needs\ngpuctl-test-marker==1.0\n")
    spec = EnvSpec.from_requirements(req, methods=("uv",), base_python=sys.executable)
    ex = building(spec, venv1, tmp_path, job_root)
    probe = ex.venv2()
    assert probe["method"] == "uv"
    assert probe["cloudpickle"] == cloudpickle.__version__
    assert probe["notes"] == []
    where, prefix = ex.submit(marker_where).result(120)
    assert where == "the test's own wheelhouse"
    assert Path(prefix).name == probe["env_key"]
    log = (Path(str(probe["path"])).parents[2] / f"{probe['env_key']}.log").read_text()
    assert "uv pip install" in log and "-r" in log
    assert f"# pip's configuration handed to uv: --find-links {pip_wheelhouse}" in log
    assert "--no-index" in log
    # the file's text is part of the key: another requirement is another environment
    other = EnvSpec.from_requirements(req, methods=("uv",), base_python=sys.executable)
    assert other == spec
    req.write_text("gpuctl-test-marker==0.9\n")
    assert EnvSpec.from_requirements(req, methods=("uv",)) != spec


def test_a_cloudpickle_pin_missing_from_the_index_takes_the_same_minor_release(
    pip_wheelhouse: Path,
    venv1: str,
    tmp_path: Path,
    job_root: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """This gpuctl's cloudpickle is a patch release the node's index lacks (the wheelhouse has
    the release before it): VENV2 gets the same minor release, and the build log, the probe
    and a warning say so."""
    real = cloudpickle.__version__
    major, minor, _ = real.split(".", 2)
    login = f"{major}.{minor}.99"
    monkeypatch.setattr(cloudpickle, "__version__", login)
    spec = EnvSpec(methods=("uv",), base_python=sys.executable)
    ex = building(spec, venv1, tmp_path, job_root)
    heard: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = heard.append  # type: ignore[method-assign]
    logger = logging.getLogger("gpuctl.jobs.provision")  # propagation aside (logs.setup)
    logger.addHandler(handler)
    try:
        probe = ex.venv2()
    finally:
        logger.removeHandler(handler)
    assert probe["cloudpickle"] == real
    (note,) = probe["notes"]
    assert note == (
        f"cloudpickle=={login} is not on the node's package index: VENV2 got the same minor "
        f"release (cloudpickle=={major}.{minor}.*): it has cloudpickle {real}"
    )
    assert any(note in r.getMessage() for r in heard)
    log = (Path(str(probe["path"])).parents[2] / f"{probe['env_key']}.log").read_text()
    assert f"# cloudpickle=={login} is not on this node's package index" in log
    assert ex.submit(sum, [1, 2, 3]).result(60) == 6
    # built once: the next executor finds it ready, and hears the same note
    again = building(spec, venv1, tmp_path, job_root)
    assert again.venv2()["notes"] == [note]


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
    ex = building(spec, venv1, tmp_path, job_root)
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


def test_pips_configuration_as_pip_resolves_it_becomes_uvs_flags(tmp_path: Path) -> None:
    """Files in pip's order (global, user, PIP_CONFIG_FILE), [install] over [global], PIP_*
    variables last; uv's own settings win over all of it; os.devnull turns the files off."""
    etc = tmp_path / "xdg" / "pip"
    etc.mkdir(parents=True)
    (etc / "pip.conf").write_text(
        "[global]\nindex-url = https://global.example/simple\n"
        "extra-index-url = https://extra.example/simple\ncert = /etc/site-ca.pem\n"
    )
    home = tmp_path / "home"
    (home / ".config" / "pip").mkdir(parents=True)
    (home / ".config" / "pip" / "pip.conf").write_text(
        "[global]\nindex-url = https://mirror.example/simple\n"
        "[install]\nfind-links =\n    /srv/wheels\n    /srv/more\ntrusted_host = mirror.example\n"
    )
    environ = {"HOME": str(home), "XDG_CONFIG_DIRS": str(tmp_path / "xdg")}
    uv_index_options = functools.partial(envbuild.uv_index_options, etc=str(tmp_path / "etc"))
    flags, env, lines = uv_index_options(environ)
    assert flags == [
        "--index-url", "https://mirror.example/simple",
        "--extra-index-url", "https://extra.example/simple",
        "--find-links", "/srv/wheels", "--find-links", "/srv/more",
        "--allow-insecure-host", "mirror.example",
        "--index-strategy", "unsafe-best-match",
    ]  # fmt: skip
    assert env == {"SSL_CERT_FILE": "/etc/site-ca.pem"}
    assert lines[0].startswith("# pip's configuration handed to uv: --index-url")
    # a variable beats the files
    flags, _, _ = uv_index_options({**environ, "PIP_INDEX_URL": "https://var.example/simple"})
    assert flags[:2] == ["--index-url", "https://var.example/simple"]
    # PIP_CONFIG_FILE that exists replaces the user's file (not the global one)
    named = tmp_path / "named.conf"
    named.write_text("[global]\nno-index = yes\n")
    flags, _, _ = uv_index_options({**environ, "PIP_CONFIG_FILE": str(named)})
    assert flags[:2] == ["--index-url", "https://global.example/simple"]
    assert "--no-index" in flags and "--find-links" not in flags
    # os.devnull: no files at all
    assert uv_index_options({**environ, "PIP_CONFIG_FILE": os.devnull})[0] == []
    # uv configured for itself: pip's settings stay pip's
    flags, env, lines = uv_index_options({**environ, "UV_INDEX_URL": "https://uv.example"})
    assert (flags, env) == ([], {})
    assert lines == [
        "# uv has package index settings of its own (UV_INDEX_URL): pip's are not handed to it"
    ]
    (home / ".config" / "uv").mkdir()
    (home / ".config" / "uv" / "uv.toml").write_text('index-url = "https://uv.example"\n')
    assert uv_index_options(environ)[0] == []
