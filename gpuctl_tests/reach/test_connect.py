"""Connections against real sshd nodes: the user's ConnectTimeout and ServerAliveInterval reach
the connection, one pooled connection per node and loop, ProxyJump chains opened hop by hop
with errors naming the hop, and ``asyncssh.connect`` living in gpuctl/reach/ only."""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuctl.config import NodeConfig
from gpuctl.core.deadline import wait_for
from gpuctl.fleet.session import LinkError
from gpuctl.fleet.ssh import BundleStore, SshLink
from gpuctl.jobs.hosts import SshHost
from gpuctl.reach.options import SshSettings, resolve
from gpuctl.reach.pool import pool
from gpuctl_tests.harness import kill_pids
from gpuctl_tests.harness.sshd import SshCluster, SshNode
from gpuctl_tests.helpers import REPO
from gpuctl_tests.reach.conftest import SystemSsh, host_block

pytestmark = pytest.mark.sshd


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts TCP connections (the kernel's backlog) and never says a word."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield int(s.getsockname()[1])


async def test_connect_timeout_comes_from_the_users_ssh_config(
    ssh_cluster: SshCluster, system_ssh: SystemSsh, silent_port: int, tmp_path: Path
) -> None:
    """gpuctl used to send its own 15 s whatever the ssh config said."""
    cfg = tmp_path / "cfg"
    cfg.write_text(host_block("mute", silent_port, ssh_cluster.client_key_path, ConnectTimeout="1"))
    link = SshLink(NodeConfig(name="mute", cluster="t", ssh_config=str(cfg)))
    t0 = time.monotonic()
    with pytest.raises(LinkError) as info:
        await link.connection()
    assert time.monotonic() - t0 < 6
    assert info.value.reason == "timeout"
    assert info.value.message == f"mute (127.0.0.1:{silent_port}) did not answer within 1 s"
    # gpuctl's own setting still wins when it is set
    link = SshLink(NodeConfig(name="mute", cluster="t", ssh_config=str(cfg), connect_timeout=2.0))
    with pytest.raises(LinkError) as info:
        await link.connection()
    assert info.value.message.endswith("did not answer within 2 s")


@contextlib.contextmanager
def frozen(node: SshNode) -> Iterator[None]:
    """SIGSTOP every process of the node: its TCP stays open but nothing answers."""
    pids = node.processes()
    kill_pids(pids, signal.SIGSTOP)
    try:
        yield
    finally:
        kill_pids(pids, signal.SIGCONT)


async def test_server_alive_interval_comes_from_the_users_ssh_config(
    ssh_cluster: SshCluster, system_ssh: SystemSsh, tmp_path: Path
) -> None:
    """A frozen node is given up after ServerAliveInterval x ServerAliveCountMax of the user's
    ssh config (1 s x 1 here), not gpuctl's own 5 s x 3."""
    node = await asyncio.to_thread(ssh_cluster.start_node, "frozen")
    cfg = tmp_path / "cfg"
    cfg.write_text(
        host_block(
            "frozen",
            node.port,
            ssh_cluster.client_key_path,
            UserKnownHostsFile=str(ssh_cluster.known_hosts_path),
            ServerAliveInterval="1",
            ServerAliveCountMax="1",
        )
    )
    link = SshLink(NodeConfig(name="frozen", cluster="t", ssh_config=str(cfg)))
    conn = await link.connection()
    try:
        with frozen(node):
            t0 = time.monotonic()
            await wait_for(conn.wait_closed(), 8)
            assert time.monotonic() - t0 < 6
    finally:
        await link.aclose()


async def test_one_pooled_connection_per_node_and_loop(
    ssh_cluster: SshCluster, tmp_path: Path
) -> None:
    await asyncio.to_thread(ssh_cluster.start_node, "pooled")
    node = NodeConfig(
        name="pooled",
        cluster="t",
        ssh_config=str(ssh_cluster.ssh_config_path),
        bundle_dir=str(tmp_path / "b"),
        simulate="1",
    )
    p = pool()
    before = p.opened
    a, b = SshLink(node), SshLink(node)
    conn_a = await a.connection()
    conn_b = await b.connection()
    assert conn_a is conn_b and p.opened == before + 1
    await a.aclose()
    assert not conn_b.is_closed()  # b still holds it
    await b.aclose()
    await wait_for(conn_b.wait_closed(), 5)  # the last holder's release closes it

    # the synchronous jobs API has its own loop and pool; its hosts share one connection
    def jobs_side() -> tuple[bool, str]:
        h1, h2 = SshHost.for_node(node), SshHost.for_node(node)
        try:
            h1.run(["true"])
            h2.run(["true"])
            return h1._conn is h2._conn, h1.home()
        finally:
            h1.close()
            h2.close()

    same, home = await asyncio.to_thread(jobs_side)
    assert same and home == str(ssh_cluster.home)


def two_hop_config(cluster: SshCluster, tmp_path: Path, inner_port: int) -> Path:
    """A custom ssh config in which ``inner`` is reached through ``hop1`` then ``hop2``, each
    hop's port only in this file."""
    key = cluster.client_key_path
    kh = str(cluster.known_hosts_path)
    cfg = tmp_path / "two_hops"
    cfg.write_text(
        host_block("hop1", cluster["hop1"].port, key, UserKnownHostsFile=kh)
        + host_block("hop2", cluster["hop2"].port, key, UserKnownHostsFile=kh)
        + host_block("inner", inner_port, key, UserKnownHostsFile=kh, ProxyJump="hop1,hop2")
    )
    return cfg


def accepted(node: SshNode) -> int:
    return node.log_path.read_text().count("Accepted publickey")


async def test_two_hop_proxyjump_with_a_custom_config(
    ssh_cluster: SshCluster, system_ssh: SystemSsh, tmp_path: Path
) -> None:
    await asyncio.to_thread(ssh_cluster.start_nodes, ["hop1", "hop2", "inner"])
    cfg = two_hop_config(ssh_cluster, tmp_path, ssh_cluster["inner"].port)
    node = NodeConfig(
        name="inner",
        cluster="t",
        ssh_config=str(cfg),
        bundle_dir=str(tmp_path / "b"),
        simulate="1",
    )
    link = SshLink(node, store=BundleStore())
    try:
        session = await link.open()
        info = await session.handshake(30)
        assert info.protocol is not None and len(info.gpus) == 1
        await session.close()
    finally:
        await link.aclose()
    assert accepted(ssh_cluster["hop1"]) == 1 and accepted(ssh_cluster["hop2"]) == 1
    # the hop that fails is the one named, with its own address
    await asyncio.to_thread(ssh_cluster["hop2"].kill)
    with pytest.raises(LinkError) as e2:
        await SshLink(node).connection()
    assert e2.value.reason == "refused"
    assert e2.value.message.startswith(
        f"jump host hop2 for inner: hop2 (127.0.0.1:{ssh_cluster['hop2'].port})"
    ), e2.value.message
    await asyncio.to_thread(ssh_cluster["hop1"].kill)
    with pytest.raises(LinkError) as e1:
        await SshLink(node).connection()
    assert e1.value.message.startswith(
        f"jump host hop1 for inner: hop1 (127.0.0.1:{ssh_cluster['hop1'].port}) refused the "
        "connection"
    ), e1.value.message


async def test_nodes_behind_one_bastion_share_its_connection(
    ssh_cluster: SshCluster, tmp_path: Path
) -> None:
    await asyncio.to_thread(ssh_cluster.start_nodes, ["bastion", "w1", "w2"])
    p = pool()
    before = p.opened
    links = [
        SshLink(
            NodeConfig(
                name=n, cluster="t", ssh_config=str(ssh_cluster.ssh_config_path), jump="bastion"
            )
        )
        for n in ("w1", "w2")
    ]
    try:
        await asyncio.gather(*(link.connection() for link in links))
        assert p.opened == before + 3  # bastion once, then w1 and w2 through it
        assert accepted(ssh_cluster["bastion"]) == 1
        bastion = resolve("bastion", SshSettings(ssh_config=str(ssh_cluster.ssh_config_path)))
        assert bastion in p.connections()
    finally:
        for link in links:
            await link.aclose()
    assert not p.connections()  # the hop went with its last user


def test_asyncssh_connect_lives_in_gpuctl_remote_only() -> None:
    """The grep fallback of ruff's banned-api rule (TID251) that names gpuctl.reach."""
    offenders = []
    for path in sorted((REPO / "gpuctl").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith("gpuctl/reach/"):
            continue
        text = path.read_text()
        if re.search(
            r"asyncssh\s*\.\s*connect\s*\(|from\s+asyncssh\s+import[^\n]*\bconnect\b", text
        ):
            offenders.append(rel)
    assert offenders == []
    pyproject = (REPO / "pyproject.toml").read_text()
    assert '"asyncssh.connect" = { msg = "use gpuctl.reach" }' in pyproject
    assert re.search(r'select = \[[^\]]*"TID"', pyproject)
