"""The test harness itself: real sshd nodes and a real one-node Slurm behave as promised."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import asyncssh
import pytest

from gpuctl_tests.harness import (
    HarnessError,
    clear_pyenv_lock_after_kill,
    is_alive,
    pids_with_env,
)
from gpuctl_tests.harness.sshd import SshCluster
from gpuctl_tests.helpers import wait_until

pytestmark = pytest.mark.sshd


def _connect(cluster: SshCluster, name: str) -> Any:  # asyncssh's awaitable context manager
    return asyncssh.connect(
        name,
        config=[str(cluster.ssh_config_path)],
        known_hosts=str(cluster.known_hosts_path),
        connect_timeout=10,
    )


async def test_nodes_answer_openssh_and_asyncssh(ssh_cluster: SshCluster) -> None:
    a = ssh_cluster.start_node("nodea", simulate="2:H100")
    b = ssh_cluster.start_node("nodeb", env={"GPUCTL_EXTRA": "x y"})
    assert a.port != b.port
    assert ssh_cluster.ssh("nodea", "true").returncode == 0
    out = ssh_cluster.ssh("nodeb", 'echo "$GPUCTL_NODE|$GPUCTL_SIMULATE|$GPUCTL_EXTRA|$USER"')
    assert out.stdout.strip() == f"nodeb|4|x y|{ssh_cluster.user}", out.stderr
    async with _connect(ssh_cluster, "nodea") as conn:
        r = await conn.run('echo "$GPUCTL_NODE $GPUCTL_SIMULATE"', check=True)
        assert r.stdout == "nodea 2:H100\n"
        # SFTP, as the deploy step uses it
        async with conn.start_sftp_client() as sftp:
            remote = str(ssh_cluster.dir / "sftp-upload.txt")
            async with sftp.open(remote, "w") as f:
                await f.write("hello")
            assert await sftp.exists(remote)
            async with sftp.open(remote) as f:
                assert await f.read() == "hello"


async def test_many_channels_on_one_connection(ssh_cluster: SshCluster) -> None:
    ssh_cluster.start_node("node1")
    async with _connect(ssh_cluster, "node1") as conn:
        procs = [await conn.create_process("cat") for _ in range(12)]  # default sshd: 10
        for i, p in enumerate(procs):
            p.stdin.write(f"{i}\n")
            assert await p.stdout.readline() == f"{i}\n"
            p.stdin.write_eof()
        for p in procs:
            await p.wait(timeout=10)


def test_unknown_node_and_wrong_key_are_refused(ssh_cluster: SshCluster, tmp_path: Path) -> None:
    ssh_cluster.start_node("node1")
    r = ssh_cluster.ssh("nosuchnode", "true")
    assert r.returncode == 255
    # a client key sshd has never seen
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    r = subprocess.run(
        ["ssh", "-F", "/dev/null", "-i", str(other), "-o", "IdentitiesOnly=yes", "-o",
         "BatchMode=yes", "-o", f"UserKnownHostsFile={ssh_cluster.known_hosts_path}",
         "-p", str(ssh_cluster["node1"].port), "127.0.0.1", "true"],
        capture_output=True,
        text=True,
        timeout=30,
    )  # fmt: skip
    assert r.returncode == 255
    assert "Permission denied" in r.stderr


async def test_kill_takes_sessions_down_and_restart_keeps_port_and_key(
    ssh_cluster: SshCluster,
) -> None:
    node = ssh_cluster.start_node("node1")
    port, key = node.port, node.host_key
    async with _connect(ssh_cluster, "node1") as conn:
        # a session child that leaves sshd's process tree (new session, reparented to init)
        await conn.run("setsid sleep 300 </dev/null >/dev/null 2>&1 &", check=True)
        proc = await conn.create_process("sleep 300")
        wait_until(lambda: len(pids_with_env(node.marker)) >= 2, 10, "both sleeps")
        session_pids = node.processes()
        assert node.pid in session_pids
        node.kill()
        assert not any(is_alive(p) for p in session_pids)
        assert not node.running
        await proc.wait(timeout=10)  # the stream ends: the connection died with the node
    assert ssh_cluster.ssh("node1", "true").returncode == 255
    node.restart()
    assert (node.port, node.host_key) == (port, key)
    assert ssh_cluster.ssh("node1", "echo back").stdout == "back\n"


async def test_rotated_host_key_is_refused_until_trusted(ssh_cluster: SshCluster) -> None:
    node = ssh_cluster.start_node("node1")
    old = node.host_key
    assert node.rotate_host_key() != old
    r = ssh_cluster.ssh("node1", "true")
    assert r.returncode == 255
    assert "HOST IDENTIFICATION HAS CHANGED" in r.stderr
    with pytest.raises(asyncssh.HostKeyNotVerifiable):
        async with _connect(ssh_cluster, "node1"):
            pass
    node.trust_host_key()
    assert ssh_cluster.ssh("node1", "true").returncode == 0


async def test_node_python_is_python3_on_that_node(ssh_cluster: SshCluster) -> None:
    node = ssh_cluster.start_node("node1", python=sys.executable)
    ssh_cluster.start_node("node2")
    r = ssh_cluster.ssh("node1", "command -v python3; echo $GPUCTL_NODE")
    assert r.stdout.split() == [str(node.dir / "bin" / "python3"), "node1"], r.stderr
    assert ssh_cluster.ssh("node2", "command -v python3").stdout.strip() != r.stdout.split()[0]
    r = ssh_cluster.ssh("node1", 'python3 -c "import sys; print(sys.prefix)"')
    assert r.stdout.strip() == sys.prefix, r.stderr
    async with _connect(ssh_cluster, "node1") as conn:
        assert (
            (await conn.run("command -v python3", check=True))
            .stdout.strip()
            .endswith("node1/bin/python3")
        )
        async with conn.start_sftp_client() as sftp:  # SFTP on a node with its own PATH
            remote = str(ssh_cluster.dir / "via-node-path.txt")
            async with sftp.open(remote, "w") as f:
                await f.write("ok")
            assert await sftp.exists(remote)


def test_stop_all_leaves_no_process(tmp_path: Path) -> None:
    cluster = SshCluster(tmp_path)
    nodes = cluster.start_nodes(["n1", "n2", "n3"])
    bg = [
        subprocess.Popen(cluster.ssh_argv(n.name, "sleep 300"), stdin=subprocess.DEVNULL)
        for n in nodes
    ]
    wait_until(lambda: all(pids_with_env(n.marker) for n in nodes), 10, "a session on every node")
    pids = cluster.processes()
    assert len(pids) >= 3 * 3  # listener, connection child, sleep on each node
    cluster.stop_all()
    assert cluster.processes() == set()
    assert not any(is_alive(p) for p in pids)
    for p in bg:
        assert p.wait(10) == 255  # each client saw its node go away


def test_write_config_lists_the_nodes(ssh_cluster: SshCluster, tmp_path: Path) -> None:
    ssh_cluster.start_nodes(["gpu1", "gpu2", "gpu3"])
    path = ssh_cluster.write_config(
        tmp_path / "config.toml", simulate=4, python="/usr/bin/python3", interval=0.5,
        extra='[clusters.other]\nnodes = "x1"\nvia = "local"',
    )  # fmt: skip
    tomllib = pytest.importorskip("tomllib")
    data = tomllib.loads(path.read_text())
    test = data["clusters"]["test"]
    assert test == {
        "nodes": "gpu[1-3]",
        "via": "ssh",
        "ssh_config": str(ssh_cluster.ssh_config_path),
        "known_hosts": str(ssh_cluster.known_hosts_path),
        "simulate": 4,
        "python": "/usr/bin/python3",
        "interval": 0.5,
    }
    assert data["clusters"]["other"]["via"] == "local"
    only = tomllib.loads(ssh_cluster.cluster_toml("c 1", ["gpu2"], via=None))
    assert only == {
        "clusters": {
            "c 1": {
                "nodes": "gpu2",
                "ssh_config": str(ssh_cluster.ssh_config_path),
                "known_hosts": str(ssh_cluster.known_hosts_path),
            }
        }
    }


def test_write_config_is_read_by_gpuctl(ssh_cluster: SshCluster, tmp_path: Path) -> None:
    config = pytest.importorskip("gpuctl.config")
    ssh_cluster.start_nodes(["gpu1", "gpu2"], simulate="2:H100")
    path = ssh_cluster.write_config(
        tmp_path / "config.toml",
        simulate="2:H100",
        overrides={"gpu2": {"python": "/opt/py36/bin/python3"}},
    )
    nodes = {n.name: n for n in config.load_config(str(path)).nodes()}
    assert sorted(nodes) == ["gpu1", "gpu2"]
    assert nodes["gpu1"].via == "ssh"
    assert nodes["gpu1"].simulate == "2:H100"
    assert nodes["gpu1"].python == "python3"
    assert nodes["gpu2"].python == "/opt/py36/bin/python3"
    assert nodes["gpu1"].known_hosts == str(ssh_cluster.known_hosts_path)


def test_start_nodes_in_parallel(ssh_cluster: SshCluster) -> None:
    nodes = ssh_cluster.start_nodes([f"n{i}" for i in range(6)], simulate=None)
    assert len({n.port for n in nodes}) == 6
    assert all(n.running for n in nodes)
    text = ssh_cluster.ssh_config_path.read_text()
    assert all(f"Host {n.name}\n" in text for n in nodes)
    assert len(ssh_cluster.known_hosts_path.read_text().splitlines()) == 6
    r = ssh_cluster.ssh("n5", "echo ${GPUCTL_SIMULATE-unset} $GPUCTL_NODE")
    assert r.stdout == "unset n5\n", r.stderr
    with pytest.raises(ValueError, match="exists"):
        ssh_cluster.start_node("n1")


def test_a_node_that_cannot_start_says_why(ssh_cluster: SshCluster) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(HarnessError, match=f"(?s)port {port}.*Address already in use"):
            ssh_cluster.start_node("node1", port=port)
    assert "node1" not in ssh_cluster.nodes
    assert ssh_cluster.processes() == set()


def test_a_killed_pyenv_rehash_leaves_no_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shims = tmp_path / "pyenv" / "shims"
    shims.mkdir(parents=True)
    lock = shims / ".pyenv-shim"
    lock.write_text("#!/bin/sh\n")
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "pyenv"))
    clear_pyenv_lock_after_kill(["sshd: root@notty", "sleep 300"])
    assert lock.exists()  # we killed no rehash: the lock may be someone's
    clear_pyenv_lock_after_kill(["bash /root/.pyenv/libexec/pyenv-rehash"])
    assert not lock.exists()
