"""A node that goes away mid-job, comes back, and a gpuctl that restarts: real sshd, real
subprocesses, no mocks.

The harness's ``node.kill()`` SIGKILLs sshd and every process the node started (the job's
supervisor included), like a node that crashed; ``node.restart()`` brings sshd back on the same
port and key with the job folders still on disk (the loopback nodes share this file system).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpuctl.config import load_config
from gpuctl.jobs import EnvSpec, Executor, JobFailed, JobStore
from gpuctl_tests.harness.sshd import SshCluster
from gpuctl_tests.helpers import wait_until

pytestmark = pytest.mark.sshd


def add_two(x: int) -> int:
    return x + 2


def sleep_then(seconds: float, value: str) -> str:
    time.sleep(seconds)
    return value


def gpuctl(config: Path, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The real CLI in a new process (a gpuctl that has just started)."""
    return subprocess.run(
        [sys.executable, "-m", "gpuctl", "--config", str(config), *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env=os.environ.copy(),
    )


@pytest.fixture
def node(ssh_cluster: SshCluster, venv1: str) -> Any:
    return ssh_cluster.start_node("gpu1", python=venv1)


@pytest.fixture
def config_path(ssh_cluster: SshCluster, node: Any, tmp_path: Path) -> Path:
    root = tmp_path / "remote-jobs"
    return ssh_cluster.write_config(tmp_path / "config.toml", extra=f'\n[jobs]\ndir = "{root}"\n')


@pytest.mark.slow
def test_node_unreachable_mid_job_then_back(
    node: Any, config_path: Path, env_root: str, env_spec: EnvSpec
) -> None:
    ex = Executor(
        "gpu1", config=load_config(str(config_path)), env=env_spec, env_root=env_root, grace=1
    )
    finished = ex.submit(add_two, 40)
    running = ex.submit(sleep_then, 300, "never")
    # the first is over on the node (outcome on disk); nobody but the watcher asked for it
    wait_until(lambda: Path(finished.jobdir, "outcome.json").exists(), 30, "the first job to end")
    wait_until(
        lambda: running.state == "running" and running.last_heartbeat is not None,
        30,
        "a heartbeat of the running job",
    )

    node.kill()

    # the running job: reported after unreachable_after, not at the 30 s timeout, not HostError
    running.unreachable_after = 2.0
    t0 = time.monotonic()
    with pytest.raises(JobFailed) as info:
        running.result(30)
    assert time.monotonic() - t0 < 15
    report = info.value.report
    text = str(info.value)
    assert report.kind == "node_unreachable"
    assert text.startswith(f"job {running.id}: outcome unknown, the node cannot be reached")
    assert "cannot reach gpu1 since " in text
    assert "last heartbeat seen: written " in text and "s ago (VENV2 running for" in text
    assert f"job folder on gpu1: {running.jobdir}" in text
    assert "may still be running on gpu1" in text
    assert f"gpuctl result {running.id}" in report.remedy
    assert running.state == "unreachable"
    rec = JobStore().get(running.id)
    assert rec is not None and rec.state == "unreachable"

    # the finished job: whether or not this process's watcher read its outcome before the node
    # went away, its result is on the node -> the same report (not a HostError, not a guess)
    with pytest.raises(JobFailed) as info:
        finished.result(1)
    assert info.value.kind == "node_unreachable"
    assert f"job folder on gpu1: {finished.jobdir}" in str(info.value)

    # a new gpuctl process while the node is still away: the report, exit 3 (not finished)
    r = gpuctl(config_path, "result", finished.id)
    assert r.returncode == 3, r.stderr
    assert "[node_unreachable]" in r.stderr and "Traceback" not in r.stderr
    r = gpuctl(config_path, "result", running.id)  # the heartbeat this process saw is stored
    assert r.returncode == 3 and "last heartbeat seen: written " in r.stderr, r.stderr
    assert f"job folder on gpu1: {running.jobdir}" in r.stderr
    r = gpuctl(config_path, "logs", running.id)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "cannot reach gpu1" in r.stderr and "try again once the node is back" in r.stderr

    node.restart()

    # the real outcomes, from new processes and from the same Job objects
    r = gpuctl(config_path, "result", finished.id, "--timeout", "30")
    assert (r.returncode, r.stdout.strip()) == (0, "42"), r.stderr
    assert finished.result(30) == 42
    r = gpuctl(config_path, "result", running.id, "--timeout", "30")
    assert r.returncode == 1 and "[lost]" in r.stderr, r.stderr  # it died with the node
    assert "last heartbeat" in r.stderr
    with pytest.raises(JobFailed) as info:
        running.result(30)
    assert info.value.kind == "lost"
    listed = json.loads(gpuctl(config_path, "jobs", "--json").stdout)["jobs"]
    assert {j["id"]: j["state"] for j in listed} == {finished.id: "done", running.id: "failed"}


SUBMIT = """
import sys
from gpuctl.config import load_config
from gpuctl.jobs import Executor
from {module} import sleep_then

ex = Executor("gpu1", config=load_config(sys.argv[1]), python=sys.argv[2])
print(ex.submit(sleep_then, 1.0, "from the first process").id)
"""


@pytest.mark.slow
def test_reattach_from_a_new_process(config_path: Path, venv2: str) -> None:
    """Submit from one Python process that exits at once; fetch with `gpuctl result ID`."""
    first = subprocess.run(
        [sys.executable, "-c", SUBMIT.format(module=__name__), str(config_path), venv2],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        env=os.environ.copy(),
        cwd=str(Path(__file__).resolve().parents[2]),
    )
    assert first.returncode == 0, first.stderr
    job_id = first.stdout.strip().splitlines()[-1]
    rec = JobStore().get(job_id)
    assert rec is not None and rec.backend["kind"] == "ssh" and rec.state == "submitted"
    r = gpuctl(config_path, "result", job_id, "--timeout", "60")
    assert (r.returncode, r.stdout.strip()) == (0, repr("from the first process")), r.stderr
    rec = JobStore().get(job_id)
    assert rec is not None and rec.state == "done"
