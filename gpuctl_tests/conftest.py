"""Shared fixtures. Test helpers live in gpuctl_tests/helpers.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from gpuctl_tests.helpers import IN_CI, AgentProcess

if TYPE_CHECKING:
    from gpuctl_tests.harness.slurm import SlurmCluster
    from gpuctl_tests.harness.sshd import SshCluster


@pytest.fixture
def agents() -> Iterator[list[AgentProcess]]:
    """A list to put AgentProcess objects in; every one is closed after the test."""
    started: list[AgentProcess] = []
    yield started
    for a in started:
        a.close()


@pytest.fixture
def ssh_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshCluster]:
    """Real sshd nodes on 127.0.0.1 (``ssh_cluster.start_node("node1")``); all killed after
    the test. Skips locally, fails in CI, when openssh-server is missing."""
    from gpuctl_tests.harness.sshd import SshCluster, missing_parts

    reason = missing_parts()
    if reason:
        if IN_CI:
            pytest.fail(reason)
        pytest.skip(reason)
    cluster = SshCluster(tmp_path_factory.mktemp("sshd"))
    try:
        yield cluster
    finally:
        cluster.stop_all()


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A real one-node Slurm (munged, slurmctld, slurmd; partition ``debug``; GRES gpu:h100:2)
    shared by the whole session; clients need ``env=slurm_cluster.env``. Skips locally, fails
    in CI, when slurm-wlm or munge is missing."""
    from gpuctl_tests.harness.slurm import SlurmCluster, missing_parts

    reason = missing_parts()
    if reason:
        if IN_CI:
            pytest.fail(reason)
        pytest.skip(reason)
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        yield cluster
    finally:
        cluster.stop()
