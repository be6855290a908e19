"""A submit refused before its job started leaves nothing behind (issue #40.7): no folder on
the node (it held the payload), no row with Slurm's "pending reason" remedy; a Ctrl-C while the
folder is written removes what was written."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from gpuctl.cli.main import main
from gpuctl.config import load_config
from gpuctl.jobs import EnvSpec, Executor, HostError, JobStore, pickling
from gpuctl_tests.harness.sshd import SshCluster
from gpuctl_tests.jobs.test_ssh import node_config, ssh_executor

__all__ = ["node_config"]  # the sshd node fixture, shared with test_ssh


def job_folders(root: str) -> list[str]:
    """The job folders under a job root (named by a job id; caches are named otherwise)."""
    if not os.path.isdir(root):
        return []
    return [n for n in os.listdir(root) if re.fullmatch(r"[0-9a-f]{32}", n)]


class StopsOnUpload:
    """An argument whose second pickling (the upload's; the first is the measure) is a Ctrl-C."""

    pickled = 0

    def __reduce__(self) -> Any:
        type(self).pickled += 1
        if type(self).pickled == 2:
            raise KeyboardInterrupt
        return (StopsOnUpload, ())


@pytest.fixture(params=["local", pytest.param("ssh", marks=pytest.mark.sshd)])
def make(
    request: pytest.FixtureRequest,
    make_executor: Any,
    job_root: str,
    env_root: str,
    env_spec: EnvSpec,
    tmp_path: Path,
) -> Any:
    """``make(**options)`` → (an Executor on this machine or on an sshd node, its job root)."""
    made: list[Executor] = []

    def build(**kw: Any) -> tuple[Executor, str]:
        if request.param == "local":
            return make_executor(**kw), job_root
        config = request.getfixturevalue("node_config")
        kw.update(env=None, python=request.getfixturevalue("venv2"))  # VENV2 there already
        ex = ssh_executor(config, env_root, tmp_path, env_spec, **kw)
        made.append(ex)
        return ex, str(tmp_path / "remote-jobs")

    yield build
    for ex in made:
        ex.backend.host.close()


def test_a_missing_supervisor_python_leaves_no_row_and_no_folder(make: Any) -> None:
    ex, root = make(supervisor_python="/nonexistent/python3")
    with pytest.raises(HostError, match="no python at '/nonexistent/python3'"):
        ex.submit(len, [1, 2])
    assert JobStore().list() == []
    assert job_folders(root) == []


def test_a_ctrl_c_during_the_upload_removes_the_partial_folder(
    make: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pickling, "KEEP_BELOW", 0)  # the upload pickles the call again
    monkeypatch.setattr(StopsOnUpload, "pickled", 0)
    ex, root = make()
    with pytest.raises(KeyboardInterrupt):
        ex.submit(len, [StopsOnUpload()])
    assert StopsOnUpload.pickled == 2
    assert JobStore().list() == []
    assert job_folders(root) == []


@pytest.mark.sshd
def test_purge_removes_an_ssh_job_s_folder_on_its_node(
    ssh_cluster: SshCluster,
    venv1: str,
    venv2: str,
    env_root: str,
    env_spec: EnvSpec,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Through ``Host.remove_tree``, as a refused submit's folder goes."""
    ssh_cluster.start_node("gpu1", python=venv1)
    path = ssh_cluster.write_config(tmp_path / "config.toml")
    monkeypatch.setenv("GPUCTL_CONFIG", str(path))
    ex = ssh_executor(load_config(path), env_root, tmp_path, env_spec, env=None, python=venv2)
    job = ex.submit(len, [1, 2, 3])
    assert job.result(60) == 3
    ex.backend.host.close()
    assert os.path.isdir(job.jobdir)
    assert main(["jobs", "purge", "--older-than", "0"]) == 0
    assert not os.path.exists(job.jobdir)
    assert JobStore().list() == []
