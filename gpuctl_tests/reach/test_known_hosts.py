"""Host keys against real sshd nodes: @revoked and @cert-authority honoured, accept-new accepts
only a host with no entry at all, system files read, ``UserKnownHostsFile none`` still checks,
accept-new makes ~/.ssh private. Through the fleet's SshLink and the jobs' SshHost alike."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gpuctl.config import NodeConfig
from gpuctl.fleet.session import LinkError
from gpuctl.fleet.ssh import SshLink
from gpuctl.jobs.hosts import HostError, SshHost
from gpuctl_tests.harness.sshd import SshCluster, SshNode, keygen
from gpuctl_tests.reach.conftest import SystemSsh, host_block

pytestmark = pytest.mark.sshd


def key_line(node: SshNode, marker: str = "") -> str:
    keytype, key = node.host_key.split()[:2]
    return f"{marker}[127.0.0.1]:{node.port} {keytype} {key}\n"


async def connect(name: str, cfg: Path, **kw: object) -> None:
    """Connect as the fleet does, then let go."""
    link = SshLink(NodeConfig(name=name, cluster="t", ssh_config=str(cfg), **kw))  # type: ignore[arg-type]
    try:
        await link.connection()
    finally:
        await link.aclose()


@pytest.fixture
def node(ssh_cluster: SshCluster, system_ssh: SystemSsh) -> SshNode:
    return ssh_cluster.start_node("kh")


@pytest.mark.parametrize(
    "policy", ["gpuctl accept-new", "ssh accept-new", "ssh no", "gpuctl strict", "ssh yes"]
)
async def test_revoked_key_is_refused_whatever_the_policy(
    ssh_cluster: SshCluster, node: SshNode, tmp_path: Path, policy: str
) -> None:
    kh = tmp_path / "known_hosts"
    kh.write_text(key_line(node, "@revoked "))
    setting = {"gpuctl accept-new": "accept-new", "gpuctl strict": "strict"}.get(policy)
    ssh_word = policy.split()[1] if policy.startswith("ssh") else "ask"
    cfg = tmp_path / "cfg"
    cfg.write_text(
        host_block(
            "kh",
            node.port,
            ssh_cluster.client_key_path,
            UserKnownHostsFile=str(kh),
            GlobalKnownHostsFile="/dev/null",
            StrictHostKeyChecking=ssh_word,
        )
    )
    with pytest.raises(LinkError) as info:
        await connect("kh", cfg, host_key_policy=setting)
    assert info.value.reason == "host_key"
    assert info.value.message == (
        f"kh: the host key of [127.0.0.1]:{node.port} is REVOKED (@revoked in {kh}); gpuctl "
        "will not connect: ask the node's administrator for its new host key"
    )
    assert kh.read_text() == key_line(node, "@revoked ")  # nothing recorded


async def test_a_host_known_by_its_ca_only_is_not_new(
    ssh_cluster: SshCluster, node: SshNode, tmp_path: Path
) -> None:
    ca = tmp_path / "host_ca"
    ca_pub = keygen(ca, "test-host-ca")
    kh = tmp_path / "known_hosts"
    kh.write_text(f"@cert-authority [127.0.0.1]:{node.port} {ca_pub}\n")
    cfg = tmp_path / "cfg"
    cfg.write_text(
        host_block(
            "kh",
            node.port,
            ssh_cluster.client_key_path,
            UserKnownHostsFile=str(kh),
            GlobalKnownHostsFile="/dev/null",
        )
    )
    with pytest.raises(LinkError) as info:
        await connect("kh", cfg, host_key_policy="accept-new")
    assert info.value.reason == "host_key"
    assert info.value.message == (
        f"kh: [127.0.0.1]:{node.port} offered a plain host key but {kh} trusts only a "
        "certificate authority for it (@cert-authority): give the node a HostCertificate "
        "signed by it"
    )
    assert kh.read_text().count("\n") == 1  # not recorded as a "new" host
    # once the node presents a certificate from that CA, a strict client trusts it
    await asyncio.to_thread(node.certify_host_key, ca)
    await connect("kh", cfg, host_key_policy="strict")
    # and a revoked CA is refused
    kh.write_text(kh.read_text() + f"@revoked * {ca_pub}\n")
    with pytest.raises(LinkError) as info:
        await connect("kh", cfg)
    assert info.value.reason == "host_key" and "REVOKED" in info.value.message


async def test_system_config_and_system_known_hosts_are_honoured(
    ssh_cluster: SshCluster, node: SshNode, system_ssh: SystemSsh, tmp_path: Path
) -> None:
    """No user ssh config at all: the node is reached with what the system config says, its
    key trusted from the system known_hosts file that config names (or the default one)."""
    system_ssh.known_hosts.write_text(key_line(node))
    system_ssh.write(
        host_block(
            "sysnode",
            node.port,
            ssh_cluster.client_key_path,
            User=ssh_cluster.user,
            GlobalKnownHostsFile=str(system_ssh.known_hosts),
            UserKnownHostsFile=str(tmp_path / "empty"),
        )
    )
    link = SshLink(NodeConfig(name="sysnode", cluster="t"))
    try:
        await link.connection()
    finally:
        await link.aclose()
    assert link.known_hosts_files() == [str(tmp_path / "empty"), str(system_ssh.known_hosts)]
    host = SshHost("sysnode")
    try:
        assert await asyncio.to_thread(host.run, ["echo", "jobs too"]) == (0, b"jobs too\n", b"")
    finally:
        host.close()


async def test_user_known_hosts_file_none_still_checks(
    ssh_cluster: SshCluster, node: SshNode, tmp_path: Path
) -> None:
    """``UserKnownHostsFile none`` is "nothing known from that file": the jobs used to read it
    as "do not check" and ran commands on any host."""
    cfg = tmp_path / "cfg"
    cfg.write_text(
        host_block(
            "kh",
            node.port,
            ssh_cluster.client_key_path,
            UserKnownHostsFile="none",
            GlobalKnownHostsFile="/dev/null",
            StrictHostKeyChecking="yes",
        )
    )
    host = SshHost("kh", ssh_config=str(cfg))
    try:
        with pytest.raises(HostError) as info:
            await asyncio.to_thread(host.run, ["true"])
    finally:
        host.close()
    assert str(info.value).startswith(
        f"cannot reach kh: unknown host key for [127.0.0.1]:{node.port} (not in any "
        "known_hosts file: UserKnownHostsFile is none); to trust it, run: ssh-keyscan"
    )
    with pytest.raises(LinkError) as linfo:
        await connect("kh", cfg)
    assert linfo.value.reason == "host_key"
    # accept-new has nowhere to record the key: refused too, never trusted unrecorded
    with pytest.raises(LinkError) as linfo:
        await connect("kh", cfg, host_key_policy="accept-new")
    assert "UserKnownHostsFile is none, so accept-new has nowhere to record it" in (
        linfo.value.message
    )
    # the key in the global file is enough
    gkh = tmp_path / "global"
    gkh.write_text(key_line(node))
    cfg.write_text(
        cfg.read_text().replace("GlobalKnownHostsFile /dev/null", f"GlobalKnownHostsFile {gkh}")
    )
    await connect("kh", cfg)


@pytest.mark.parametrize("hashed", [False, True])
async def test_accept_new_records_the_key_in_a_private_ssh_folder(
    ssh_cluster: SshCluster, node: SshNode, tmp_path: Path, own_home: Path, hashed: bool
) -> None:
    cfg = tmp_path / "cfg"
    more = {"HashKnownHosts": "yes"} if hashed else {}
    cfg.write_text(host_block("kh", node.port, ssh_cluster.client_key_path, **more))
    assert not (own_home / ".ssh").exists()
    await connect("kh", cfg, host_key_policy="accept-new")
    ssh = own_home / ".ssh"
    kh = ssh / "known_hosts"
    assert ssh.stat().st_mode & 0o777 == 0o700
    assert kh.stat().st_mode & 0o777 == 0o600
    text = kh.read_text()
    if hashed:
        assert text.startswith("|1|") and f"{node.port}" not in text
        assert text.split()[1:] == node.host_key.split()[:2]
    else:
        assert text == key_line(node)
    # the recorded key is trusted by a strict client, and a second accept-new adds nothing
    await connect("kh", cfg, host_key_policy="strict")
    await connect("kh", cfg, host_key_policy="accept-new")
    assert kh.read_text() == text
    # an existing ~/.ssh keeps its mode: gpuctl only decides for folders it creates
    ssh.chmod(0o750)
    kh.unlink()
    await connect("kh", cfg, host_key_policy="accept-new")
    assert ssh.stat().st_mode & 0o777 == 0o750


async def test_changed_key_is_refused_under_accept_new_with_the_fix(
    ssh_cluster: SshCluster, node: SshNode, tmp_path: Path
) -> None:
    kh = tmp_path / "known_hosts"
    kh.write_text(key_line(node))
    await asyncio.to_thread(node.rotate_host_key)
    cfg = tmp_path / "cfg"
    cfg.write_text(
        host_block(
            "kh",
            node.port,
            ssh_cluster.client_key_path,
            UserKnownHostsFile=f"{tmp_path / 'first'} {kh}",
            GlobalKnownHostsFile="/dev/null",
            StrictHostKeyChecking="no",  # is accept-new for gpuctl: never a changed key
        )
    )
    with pytest.raises(LinkError) as info:
        await connect("kh", cfg)
    p = node.port
    assert info.value.message == (
        f"kh: the host key of [127.0.0.1]:{p} CHANGED (it is not the one in {kh}); if the node "
        f"was reinstalled, run: ssh-keygen -R '[127.0.0.1]:{p}' -f {kh} && "
        f"ssh-keyscan -p {p} 127.0.0.1 >> {kh}"
    )
    assert not (tmp_path / "first").exists()
