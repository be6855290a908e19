"""Fixtures for the job runner: VENV1 = a real Python 3.6, VENV2 = a venv gpuctl builds."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuctl.jobs import EnvSpec, Executor, JobStore, jobenv
from gpuctl_tests.helpers import old_python


@pytest.fixture(autouse=True)
def _state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own job store (GPUCTL_STATE_DIR)."""
    d = tmp_path / "state"
    monkeypatch.setenv("GPUCTL_STATE_DIR", str(d))
    return d


class _Told(set[tuple[str, ...]]):
    """Every set of names told already."""

    def __contains__(self, names: object) -> bool:
        return True


@pytest.fixture(autouse=True)
def _env_notice_said(monkeypatch: pytest.MonkeyPatch) -> None:
    """The line naming the variables a job will not see (``Executor.passed_env``) depends on
    the machine's environment: said already in these tests, but in ``test_job_env``'s."""
    monkeypatch.setattr(jobenv, "_TOLD_UNSEEN", _Told())


@pytest.fixture(scope="session")
def venv1() -> str:
    return old_python("3.6.15")


@pytest.fixture(scope="session")
def env_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("envs"))


@pytest.fixture(scope="session")
def env_spec() -> EnvSpec:
    """VENV2 = ``venv --system-site-packages`` of this interpreter, cloudpickle pinned."""
    return EnvSpec(system_site_packages=True, methods=("venv",), base_python=sys.executable)


@pytest.fixture(scope="session")
def venv2(venv1: str, env_root: str, env_spec: EnvSpec) -> str:
    """A VENV2 built by gpuctl itself (``python3.X -m venv --system-site-packages``), once."""
    ex = Executor(
        "local",
        supervisor_python=venv1,
        env=env_spec,
        env_root=env_root,
        store=False,
    )
    probe = ex.venv2()
    return str(probe["path"])


@pytest.fixture
def job_root(tmp_path: Path) -> str:
    d = tmp_path / "jobs"
    return str(d)


@pytest.fixture
def make_executor(venv1: str, venv2: str, job_root: str) -> Iterator[Any]:
    """``make_executor(**options)`` → a local Executor with VENV1 3.6 and the session VENV2."""
    made: list[Executor] = []

    def make(**options: Any) -> Executor:
        options.setdefault("supervisor_python", venv1)
        options.setdefault("python", venv2)
        options.setdefault("job_root", job_root)
        options.setdefault("store", JobStore())
        ex = Executor(options.pop("target", "local"), **options)
        made.append(ex)
        return ex

    yield make


def executor_on(cluster: Any, venv1: str, venv2: str, tmp_path: Path, **kw: Any) -> Executor:
    """An Executor on the test Slurm ``cluster``: VENV1 3.6, the session VENV2, job folders
    under ``tmp_path``, the default job store; ``kw``: more Executor options."""
    kw.setdefault("supervisor_python", venv1)
    kw.setdefault("python", venv2)
    return Executor(
        "slurm",
        partition=cluster.partition,
        slurm_conf=str(cluster.conf_path),
        job_root=str(tmp_path / "shared-jobs"),
        store=JobStore(),
        **kw,
    )


@pytest.fixture
def slurm_executor(slurm_cluster: Any, venv1: str, venv2: str, tmp_path: Path) -> Any:
    """``slurm_executor(**options)`` → an Executor on the session's one-node Slurm."""
    yield functools.partial(executor_on, slurm_cluster, venv1, venv2, tmp_path)
    slurm_cluster.cancel_all()


def no_process_with_env(token: str) -> bool:
    """True when no live process carries ``token`` in its environment."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if token.encode() in f.read():
                    with open(f"/proc/{pid}/stat") as s:
                        if s.read().rsplit(")", 1)[1].split()[0] != "Z":
                            return False
        except OSError:
            continue
    return True


def mount_tmpfs(mnt: Path, options: str) -> Iterator[Path]:
    """A tmpfs on ``mnt`` mounted with ``options`` while the generator is suspended (root can
    write nowhere on a read-only one); skips the test where mounting is not allowed."""
    mnt.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs; skipped where mounting is not allowed."""
    yield from mount_tmpfs(tmp_path / "small", "size=4m,mode=0700")


@pytest.fixture
def read_only_fs(tmp_path: Path) -> Iterator[Path]:
    """An empty read-only tmpfs; skipped where mounting is not allowed."""
    yield from mount_tmpfs(tmp_path / "ro", "ro,size=1m,mode=0700")
