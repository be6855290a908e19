"""Shared fixtures. Test helpers live in gpuctl_tests/helpers.py."""

from __future__ import annotations

import os
import signal
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from gpuctl_tests.helpers import AgentProcess, unavailable

# The unit and full lanes (``--unit``, the markers tests get from their fixtures).
pytest_plugins = ["gpuctl_tests.lanes"]

if TYPE_CHECKING:
    from gpuctl_tests.harness.slurm import SlurmCluster
    from gpuctl_tests.harness.sshd import SshCluster
    from gpuctl_tests.processes import Start


# Variables of the developer's own environment that would change what gpuctl does under test.
# COLUMNS and LINES (set by pytest-xdist's workers, exported by some shells) would make every
# screen a test starts in a real terminal (tmux) that size instead of the terminal's.
_FOREIGN_ENV = (
    "GPUCTL_CONFIG",
    "GPUCTL_STATE_DIR",
    "GPUCTL_READ_ONLY",
    "SSH_AUTH_SOCK",
    "COLUMNS",
    "LINES",
)


@pytest.fixture(autouse=True)
def _fresh_session() -> Iterator[None]:
    """Each test is a process's session of its own: the context a test's CLI run installed, or
    the one built from the environment and config the test set, does not reach the next
    (``gpuctl.context.current`` keeps one per process)."""
    from gpuctl import context

    context.install(None)
    yield
    context.install(None)


@pytest.fixture(scope="session", autouse=True)
def _default_signals() -> None:
    """Children see SIGINT and SIGQUIT as a terminal's Ctrl-C and Ctrl-\\ deliver them.

    A shell without job control starts a background command (``cmd &``, as CI runners and
    ``nohup`` lines do) with both ignored, and an ignored signal stays ignored across exec: every
    gpuctl the tests start would then shrug off the Ctrl-C they send it. A handler is reset to
    the default at exec, so one installed here reaches the children as the default.
    """
    for sig in (signal.SIGINT, signal.SIGQUIT):
        if signal.getsignal(sig) == signal.SIG_IGN:
            handler = signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL
            signal.signal(sig, handler)


@pytest.fixture(scope="session", autouse=True)
def _hermetic_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The whole session sees a home, XDG folders and a TMPDIR of its own, so no test reads the
    machine user's config or leaves state, job folders or temporary files outside pytest's
    folder. pip keeps the user's configuration (its package index): tests install packages."""
    root = tmp_path_factory.mktemp("home")
    saved = dict(os.environ)
    user_pip = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "pip"
    pip_conf = next(
        (p for p in (user_pip / "pip.conf", Path.home() / ".pip" / "pip.conf") if p.is_file()), None
    )
    for name in _FOREIGN_ENV:
        os.environ.pop(name, None)
    if pip_conf is not None and "PIP_CONFIG_FILE" not in os.environ:
        os.environ["PIP_CONFIG_FILE"] = str(pip_conf)
    dirs = {
        "HOME": root,
        "XDG_CONFIG_HOME": root / ".config",
        "XDG_CONFIG_DIRS": root / "etc-xdg",
        "XDG_STATE_HOME": root / ".local" / "state",
        "XDG_CACHE_HOME": root / ".cache",
        "XDG_DATA_HOME": root / ".local" / "share",
        "TMPDIR": root / "tmp",
    }
    for name, path in dirs.items():
        path.mkdir(parents=True, exist_ok=True)
        os.environ[name] = str(path)
    # The machine's /etc/ssh/ssh_config (HashKnownHosts, GSSAPI, its Includes) must not change
    # what the tests see: gpuctl reads this empty one instead (tests of the system config set
    # their own).
    system_ssh_config = root / "etc-ssh_config"
    system_ssh_config.write_text("")
    os.environ["GPUCTL_SSH_SYSTEM_CONFIG"] = str(system_ssh_config)
    tempfile.tempdir = None  # computed again from TMPDIR
    try:
        yield root
    finally:
        os.environ.clear()
        os.environ.update(saved)
        tempfile.tempdir = None


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port on 127.0.0.1 that refuses connections: bound (so no other server can take it)
    but not listening."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])


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
        unavailable(reason)
    cluster = SshCluster(tmp_path_factory.mktemp("sshd"))
    try:
        yield cluster
    finally:
        cluster.stop_all()


@pytest.fixture(scope="session")
def _slurm_one(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    from gpuctl_tests.harness.slurm import running_cluster

    with running_cluster(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def _slurm_four(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    from gpuctl_tests.harness.slurm import running_cluster

    with running_cluster(tmp_path_factory.mktemp("slurm4"), nodes=4) as cluster:
        yield cluster


def _as_found_idle(cluster: SlurmCluster) -> SlurmCluster:
    """The session's cluster as a test expects to find it: no job left by an earlier test, none
    completing (a node stays "completing" a while after its job is cancelled) and no node left
    drained. "mixed" is taken as idle: after some cancelled jobs sinfo said "mixed" for a
    minute with no job left in squeue (cause not found; no test needs the node "idle")."""
    cluster.cancel_all()
    cluster.wait_idle(60, node_idle=False)
    return cluster


@pytest.fixture
def slurm_cluster(_slurm_one: SlurmCluster) -> SlurmCluster:
    """A real one-node Slurm (munged, slurmctld, slurmd; partition ``debug``; GRES gpu:h100:2)
    shared by the whole session, idle with no job as each test gets it; clients need
    ``env=slurm_cluster.env``. Skips locally, fails in CI, when slurm-wlm or munge is missing."""
    return _as_found_idle(_slurm_one)


@pytest.fixture
def slurm_nodes(_slurm_four: SlurmCluster) -> SlurmCluster:
    """A real four-node Slurm (``node01`` .. ``node04``, one slurmd per network namespace, each
    with GRES gpu:h100:2; partition ``debug``) shared by the whole session, idle with no job as
    each test gets it. Skips locally, fails in CI, when slurm-wlm, munge or network namespaces
    (root) are missing."""
    return _as_found_idle(_slurm_four)


@pytest.fixture(scope="session")
def nvml_lib_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of the stand-in ``libnvidia-ml.so.1``, compiled once per session."""
    from gpuctl_tests.node.nvml_stub import build

    return build(tmp_path_factory.getbasetemp())


@pytest.fixture
def procs() -> Iterator[Start]:
    """Starts real processes (``sleep``s, as this user or another) and ends them afterwards."""
    from gpuctl_tests.processes import started_processes

    yield from started_processes()
