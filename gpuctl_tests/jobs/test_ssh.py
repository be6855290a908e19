"""Jobs over real sshd nodes on 127.0.0.1: SFTP upload, ``setsid`` supervisor, reattach.

VENV1 on the node is Python 3.6 (``python3`` on its PATH); VENV2 is built on the node by the
supervisor itself (the session's cached environment, so warm).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from gpuctl.config import load_config
from gpuctl.jobs import EnvSpec, Executor, JobFailed, JobStore, attach
from gpuctl_tests.harness.sshd import SshCluster
from gpuctl_tests.helpers import require_binary, wait_until
from gpuctl_tests.jobs.test_map_cap import run_capped

pytestmark = pytest.mark.sshd

OFFSET = 100


def add_offset(x: int) -> dict[str, Any]:
    import os
    import socket

    return {
        "value": x + OFFSET,
        "node": os.environ.get("GPUCTL_NODE"),
        "host": socket.gethostname(),
    }


@pytest.fixture
def node_config(ssh_cluster: SshCluster, venv1: str, tmp_path: Path) -> Any:
    ssh_cluster.start_node("gpu1", python=venv1)
    path = ssh_cluster.write_config(tmp_path / "config.toml", setup=["export GPUCTL_SETUP_RAN=1"])
    return load_config(path)


def ssh_executor(
    config: Any, env_root: str, tmp_path: Path, env_spec: EnvSpec, **kw: Any
) -> Executor:
    kw.setdefault("env", env_spec)
    return Executor(
        "gpu1",
        config=config,
        env_root=env_root,
        job_root=str(tmp_path / "remote-jobs"),
        store=JobStore(),
        **kw,
    )


def test_roundtrip_failure_and_reattach(
    node_config: Any, env_root: str, venv2: str, env_spec: EnvSpec, tmp_path: Path
) -> None:
    ex = ssh_executor(node_config, env_root, tmp_path, env_spec)
    probe = ex.venv2()
    assert probe["path"] == venv2  # the environment built in the session fixture, reused
    job = ex.submit(add_offset, 1)
    out = job.result(60)
    assert out["value"] == 101 and out["node"] == "gpu1"
    outcome = Path(job.jobdir, "outcome.json").read_text()
    assert '"supervisor_python": "3.6.15"' in outcome
    assert "GPUCTL_SETUP_RAN" not in job.stdout()

    def env_flag() -> str | None:
        import os

        return os.environ.get("GPUCTL_SETUP_RAN")

    assert ex.submit(env_flag).result(60) == "1"  # the cluster's setup lines ran first

    def crash() -> None:
        import ctypes

        ctypes.string_at(0)

    with pytest.raises(JobFailed) as info:
        ex.submit(crash).result(60)
    assert info.value.kind == "crash"
    assert "Fatal Python error: Segmentation fault" in info.value.report.traceback
    assert "gpu1:" in info.value.report.logs["stderr.txt"]

    # gpuctl "restarts": a new store object and a new connection find the job again
    slow = ex.submit(_sleep_then, 1.0, "late")
    ex.backend.host.close()
    rec = JobStore().get(slow.id)
    assert rec is not None and rec.backend["kind"] == "ssh" and rec.backend["node"] == "gpu1"
    again = attach(rec, JobStore(), config=node_config)
    assert again.result(60) == "late"


def _sleep_then(seconds: float, value: str) -> str:
    import time

    time.sleep(seconds)
    return value


def test_cancel_and_user_exception_over_ssh(
    node_config: Any, env_root: str, tmp_path: Path, env_spec: EnvSpec
) -> None:
    ex = ssh_executor(node_config, env_root, tmp_path, env_spec, grace=1)
    job = ex.submit(_sleep_then, 120, "never")
    wait_until(lambda: job.state == "running", 30, "the job to run on the node")
    assert job.cancel()
    with pytest.raises(JobFailed) as info:
        job.result(30)
    assert info.value.kind == "cancelled"

    def bad() -> None:
        raise LookupError("remote lookup failed")

    with pytest.raises(LookupError, match="remote lookup failed"):
        ex.submit(bad).result(60)


def test_version_mismatch_on_the_node_says_how_to_fix(
    node_config: Any, env_root: str, tmp_path: Path, env_spec: EnvSpec
) -> None:
    from gpuctl_tests.helpers import old_python

    ex = ssh_executor(
        node_config, env_root, tmp_path, env_spec, env=None, python=old_python("3.9.18")
    )
    with pytest.raises(JobFailed) as info:
        ex.submit(len, [])
    assert info.value.kind == "python_mismatch"
    assert f"python='{sys.version_info[0]}.{sys.version_info[1]}'" in str(info.value)


@pytest.mark.parametrize(
    "shell",
    [
        pytest.param({"banner": "Welcome! {not json}", "sftp_banner": True}, id="banner"),
        pytest.param({"login_shell": "tcsh", "banner": "tcsh says hi"}, id="tcsh"),
    ],
)
def test_a_job_runs_through_a_chatty_or_tcsh_login_shell(
    ssh_cluster: SshCluster,
    venv1: str,
    venv2: str,
    env_root: str,
    env_spec: EnvSpec,
    tmp_path: Path,
    shell: dict[str, Any],
) -> None:
    """A banner on stdout (which also breaks SFTP: files go through the shell) and a tcsh login
    shell: the job runs all the same, with VENV2 given (probed with a multi-line script: tcsh
    used to end in venv2_wont_start) or built by gpuctl."""
    if "login_shell" in shell:
        require_binary(shell["login_shell"])
    ssh_cluster.start_node("gpu1", python=venv1, **shell)
    config = load_config(ssh_cluster.write_config(tmp_path / "config.toml"))
    for kw in ({"env": None, "python": venv2}, {}):
        ex = ssh_executor(config, env_root, tmp_path, env_spec, **kw)
        try:
            out = ex.submit(add_offset, 5).result(120)
            assert out["value"] == 105 and out["node"] == "gpu1"
        finally:
            ex.backend.host.close()


def test_jobs_honour_the_jump_chain_and_the_host_key_policy(
    ssh_cluster: SshCluster, venv1: str, env_root: str, env_spec: EnvSpec, tmp_path: Path
) -> None:
    """The jobs' SSH used to ignore ``jump`` (it went straight to the node) and
    ``host_key_policy`` (an unknown node was refused under accept-new)."""
    ssh_cluster.start_node("bastion")
    node = ssh_cluster.start_node("gpu1", python=venv1)
    kh = tmp_path / "known_hosts"
    kh.write_text(ssh_cluster["bastion"].known_hosts_line + "\n")  # gpu1 is not known yet
    path = ssh_cluster.write_config(
        tmp_path / "config.toml",
        nodes="gpu1",
        jump="bastion",
        known_hosts=str(kh),
        host_key_policy="accept-new",
    )
    ex = ssh_executor(load_config(path), env_root, tmp_path, env_spec)
    try:
        assert ex.submit(add_offset, 7).result(120)["value"] == 107
    finally:
        ex.backend.host.close()
    assert "Accepted publickey" in ssh_cluster["bastion"].log_path.read_text()
    assert kh.read_text().splitlines() == [
        ssh_cluster["bastion"].known_hosts_line,
        node.known_hosts_line,
    ]


def test_a_capped_map_over_ssh_starts_each_job_as_one_ends(
    node_config: Any, env_root: str, tmp_path: Path, env_spec: EnvSpec
) -> None:
    """The node is this machine (sshd on 127.0.0.1), so the items' marks are seen here."""
    run_capped(ssh_executor(node_config, env_root, tmp_path, env_spec), tmp_path, items=4, cap=2)
