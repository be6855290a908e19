"""SSH options resolved the way ``ssh -G`` resolves them: compared with the real OpenSSH client
for configs with Match, Include, first-value-wins, ProxyJump chains and % tokens; gpuctl's
settings act as ``-o`` options; fallbacks only when nothing says anything."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from gpuctl.config import NodeConfig
from gpuctl.reach import options
from gpuctl.reach.errors import RemoteError
from gpuctl.reach.options import SshSettings, SshTarget, resolve, resolve_many
from gpuctl.reach.pool import connect_options, hop_target
from gpuctl_tests.reach.conftest import SystemSsh


def real_ssh_g(config: Path, host: str, *opts: str) -> dict[str, list[str]]:
    """What the real OpenSSH client resolves for ``host`` with ``-F config``."""
    p = subprocess.run(
        ["ssh", "-G", "-F", str(config), *opts, host],
        capture_output=True,
        text=True,
        check=True,
        stdin=subprocess.DEVNULL,
        timeout=30,
    )
    out: dict[str, list[str]] = {}
    for line in p.stdout.splitlines():
        k, _, v = line.partition(" ")
        out.setdefault(k, []).append(v)
    return out


def assert_same_as_ssh(t: SshTarget, g: dict[str, list[str]]) -> None:
    assert t.hostname == g["hostname"][0]
    assert t.port == int(g["port"][0])
    assert t.user == g["user"][0]
    assert ",".join(t.proxy_jump) == (g.get("proxyjump") or [""])[0]
    assert (t.host_key_alias or "") == (g.get("hostkeyalias") or [""])[0]
    assert t.server_alive_interval == float(g["serveraliveinterval"][0])
    assert t.server_alive_count_max == int(g["serveralivecountmax"][0])
    if g["connecttimeout"][0] != "none":
        assert t.connect_timeout == float(g["connecttimeout"][0])
    assert " ".join(t.user_known_hosts) == g["userknownhostsfile"][0]
    strict = {"true": "yes", "false": "no"}.get(g["stricthostkeychecking"][0])
    assert t.strict_host_key_checking == (strict or g["stricthostkeychecking"][0])


TRICKY = """\
Include {inc}/*.conf
Host n1 n2 !n3
    User first
Host n*
    HostName %h.cluster.test
    IdentityFile /keys/id_%n_%r_%p
    ConnectTimeout 7
Match originalhost n3
    User matched
    HostKeyAlias n3-alias
Match host n4.cluster.test
    Port 4444
Host jumper
    ProxyJump hop1,deploy@hop2:2222
Host hop1
    HostName 10.9.9.1
    User hopper
Host *
    User everyone
    Port 22
    ServerAliveInterval 11
    ServerAliveCountMax 4
    UserKnownHostsFile /kh/one /kh/%h
    StrictHostKeyChecking accept-new
"""


@pytest.fixture
def tricky(tmp_path: Path, system_ssh: SystemSsh) -> Path:
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "a.conf").write_text("Host n2\n    Port 2202\n    User from-include\n")
    cfg = tmp_path / "config"
    cfg.write_text(TRICKY.format(inc=inc))
    return cfg


@pytest.mark.parametrize("host", ["n1", "n2", "n3", "n4", "jumper", "hop1", "other"])
def test_resolution_is_what_ssh_G_says(tricky: Path, host: str) -> None:
    t = resolve(host, SshSettings(ssh_config=str(tricky)))
    assert_same_as_ssh(t, real_ssh_g(tricky, host))
    assert t.via == "ssh -G"


def test_tricky_values_spelled_out(tricky: Path) -> None:
    """The same config, with the values a reader can check by hand."""
    t = {h: resolve(h, SshSettings(ssh_config=str(tricky))) for h in ("n1", "n2", "n3", "n4")}
    assert t["n1"].user == "first"  # the first value wins over Host *'s
    assert (t["n2"].port, t["n2"].user) == (2202, "from-include")  # the Include came first
    assert (t["n3"].user, t["n3"].host_key_alias) == ("matched", "n3-alias")
    assert t["n3"].known_hosts_name == "n3-alias"
    assert t["n4"].port == 4444  # Match host sees the HostName, not the alias
    assert t["n1"].identity_files == ("/keys/id_n1_first_22",)  # % tokens expanded
    assert t["n1"].hostname == "n1.cluster.test"
    assert t["n1"].user_known_hosts == ("/kh/one", "/kh/n1.cluster.test")
    assert t["n1"].host_key_policy == "accept-new"
    assert t["n1"].connect_timeout == 7 and t["n1"].server_alive_interval == 11


def test_two_hop_proxyjump_hops_are_resolved_with_their_own_options(tricky: Path) -> None:
    node = resolve("jumper", SshSettings(ssh_config=str(tricky)))
    assert node.proxy_jump == ("hop1", "deploy@hop2:2222")
    # the last hop is reached through the ones before it, as ``ssh -J hop1 -l deploy -p 2222``
    hop2 = hop_target(node)
    assert_same_as_ssh(hop2, real_ssh_g(tricky, "hop2", "-J", "hop1", "-l", "deploy", "-p", "2222"))
    assert (hop2.alias, hop2.user, hop2.port, hop2.proxy_jump) == (
        "hop2",
        "deploy",
        2222,
        ("hop1",),
    )
    hop1 = hop_target(hop2)
    assert (hop1.hostname, hop1.user, hop1.proxy_jump) == ("10.9.9.1", "hopper", ())
    assert hop1.settings.ssh_config == str(tricky)  # the node's ssh config, for every hop


def test_gpuctl_settings_act_as_dash_o_options(tricky: Path, tmp_path: Path) -> None:
    key = tmp_path / "gpuctl_key"
    s = SshSettings(
        ssh_config=str(tricky),
        user="u",
        port=2022,
        identity=str(key),
        jump="b1",
        connect_timeout=3,
        keepalive_interval=2,
        keepalive_count_max=9,
        known_hosts=str(tmp_path / "kh"),
        host_key_policy="strict",
    )
    t = resolve("n1", s)
    g = real_ssh_g(tricky, "n1", *(f"-o{k}={v}" for k, v in s.ssh_options()))
    assert_same_as_ssh(t, g)
    assert (t.user, t.port, t.proxy_jump, t.connect_timeout) == ("u", 2022, ("b1",), 3)
    assert (t.server_alive_interval, t.server_alive_count_max) == (2, 9)
    assert t.identity_files[0] == str(key)  # first, before the config's
    assert t.user_known_hosts == (str(tmp_path / "kh"),)
    assert t.host_key_policy == "strict"  # over the config's accept-new


def test_unset_node_settings_leave_the_ssh_config_alone(
    tmp_path: Path, system_ssh: SystemSsh
) -> None:
    """A NodeConfig that says nothing of timeouts must not override the ssh config's
    ConnectTimeout and ServerAliveInterval (gpuctl used to send 15 s and 5 s regardless)."""
    cfg = tmp_path / "timeouts"
    cfg.write_text(
        "Host n1\n    ConnectTimeout 7\n    ServerAliveInterval 11\n    ServerAliveCountMax 4\n"
    )
    node = NodeConfig(name="n1", cluster="c", ssh_config=str(cfg))
    t = resolve("n1", SshSettings.from_node(node))
    opts = connect_options(t)
    assert (opts["connect_timeout"], opts["keepalive_interval"]) == (7, 11)
    assert opts["keepalive_count_max"] == 4


def test_fallbacks_only_when_nothing_says_anything(
    tmp_path: Path, system_ssh: SystemSsh, own_home: Path
) -> None:
    cfg = tmp_path / "plain"
    cfg.write_text("Host bare\n    HostName 10.0.0.1\n")
    t = resolve("bare", SshSettings(ssh_config=str(cfg)))
    assert (t.connect_timeout, t.server_alive_interval, t.server_alive_count_max) == (15, 5, 3)
    # known_hosts under the HOME gpuctl sees (ssh itself would take the passwd entry's)
    ssh = own_home / ".ssh"
    assert t.user_known_hosts == (str(ssh / "known_hosts"), str(ssh / "known_hosts2"))
    assert t.host_key_policy == "strict"  # StrictHostKeyChecking ask: gpuctl cannot ask


def test_system_config_is_read_after_the_users(tmp_path: Path, system_ssh: SystemSsh) -> None:
    inc = tmp_path / "sys.d"
    inc.mkdir()
    (inc / "site.conf").write_text("Host *\n    GlobalKnownHostsFile /site/known_hosts\n")
    system_ssh.write(
        f"Include {inc}/*.conf\nHost *\n    User from-system\n    Port 2000\n"
        "    StrictHostKeyChecking accept-new\n    HashKnownHosts yes\n"
    )
    cfg = tmp_path / "user"
    cfg.write_text("Host mine\n    User from-user\n")
    mine = resolve("mine", SshSettings(ssh_config=str(cfg)))
    other = resolve("other", SshSettings(ssh_config=str(cfg)))
    assert (mine.user, mine.port) == ("from-user", 2000)
    assert (other.user, other.port) == ("from-system", 2000)
    assert mine.global_known_hosts == ("/site/known_hosts",)
    assert mine.hash_known_hosts and mine.host_key_policy == "accept-new"


def test_proxycommand_tokens(tmp_path: Path, system_ssh: SystemSsh) -> None:
    cfg = tmp_path / "pc"
    cfg.write_text("Host p\n    HostName 10.1.2.3\n    User r\n    ProxyCommand nc %h %p # %r %%\n")
    t = resolve("p", SshSettings(ssh_config=str(cfg), port=2200))
    assert t.proxy_command == "nc 10.1.2.3 2200 # r %"
    assert connect_options(t)["proxy_command"] == ["/bin/sh", "-c", "exec " + t.proxy_command]


def test_cache_follows_the_files(tmp_path: Path, system_ssh: SystemSsh) -> None:
    inc = tmp_path / "inc.conf"
    inc.write_text("Host c\n    Port 1001\n")
    cfg = tmp_path / "cfg"
    cfg.write_text(f"Include {inc}\nHost c\n    User one\n")
    s = SshSettings(ssh_config=str(cfg))
    assert (resolve("c", s).port, resolve("c", s).user) == (1001, "one")
    cfg.write_text(f"Include {inc}\nHost c\n    User two\n")
    os.utime(cfg, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert resolve("c", s).user == "two"
    inc.write_text("Host c\n    Port 1002\n")
    os.utime(inc, ns=(time.time_ns(), time.time_ns() + 2 * 10**9))
    assert resolve("c", s).port == 1002  # an included file's change counts too


def test_many_hosts_at_once_and_a_bad_one_is_a_value(tricky: Path) -> None:
    hosts = [f"n{i}" for i in range(40)] + ["-oProxyCommand=evil"]
    got = resolve_many(hosts, SshSettings(ssh_config=str(tricky)))
    assert all(isinstance(got[h], SshTarget) for h in hosts[:-1])
    bad = got["-oProxyCommand=evil"]
    assert isinstance(bad, RemoteError) and bad.reason == "config"
    assert bad.message == "bad host name '-oProxyCommand=evil'"


def test_mistakes_are_one_line(tmp_path: Path, system_ssh: SystemSsh) -> None:
    cfg = tmp_path / "bad"
    cfg.write_text("Host x\n    NoSuchKeyword yes\n")
    with pytest.raises(RemoteError) as info:
        resolve("x", SshSettings(ssh_config=str(cfg)))
    assert info.value.reason == "config"
    assert info.value.message.startswith("x: the ssh config is wrong: ")
    assert "line 2: Bad configuration option: nosuchkeyword" in info.value.message
    assert "\n" not in info.value.message
    with pytest.raises(RemoteError) as info:
        resolve("x", SshSettings(ssh_config=str(tmp_path / "missing")))
    assert info.value.message == f"ssh_config {tmp_path / 'missing'} does not exist"


def test_without_an_ssh_binary_asyncssh_parses_the_config(
    tmp_path: Path, system_ssh: SystemSsh, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "simple"
    cfg.write_text(
        "Match originalhost s2\n    Port 2300\n"
        "Host s1 s2\n    HostName 10.0.0.%h\n    User alice\n    Port 2222\n"
        "    IdentityFile /keys/%r\n    ProxyJump gw\n    ConnectTimeout 4\n"
        "    UserKnownHostsFile /kh/a\n"
    )
    s = SshSettings(ssh_config=str(cfg))
    by_ssh = {h: resolve(h, s) for h in ("s1", "s2")}
    monkeypatch.setattr(options, "ssh_binary", lambda: None)
    options.clear_cache()
    by_asyncssh = {h: resolve(h, s) for h in ("s1", "s2")}
    for h in ("s1", "s2"):
        a, b = by_ssh[h], by_asyncssh[h]
        assert b.via == "asyncssh"
        fields = ("hostname", "port", "user", "identity_files", "proxy_jump", "connect_timeout")
        assert [getattr(a, f) for f in fields] == [getattr(b, f) for f in fields]
        assert a.user_known_hosts == b.user_known_hosts
    assert by_asyncssh["s2"].port == 2300
