"""Fixtures for the connection layer: ssh configs of the test's own, system files overridden."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuctl.reach import options


@dataclass
class SystemSsh:
    """The "system" ssh config gpuctl reads (``$GPUCTL_SSH_SYSTEM_CONFIG``) and a system
    known_hosts file for it to name."""

    config: Path
    known_hosts: Path

    def write(self, text: str) -> None:
        self.config.write_text(text)
        options.clear_cache()


@pytest.fixture
def system_ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SystemSsh]:
    """An empty system ssh config of this test's own, in place of /etc/ssh/ssh_config."""
    d = tmp_path / "etc-ssh"
    d.mkdir()
    sys_ssh = SystemSsh(d / "ssh_config", d / "ssh_known_hosts")
    sys_ssh.config.write_text("")
    monkeypatch.setenv(options.SYSTEM_CONFIG_ENV, str(sys_ssh.config))
    options.clear_cache()
    yield sys_ssh
    options.clear_cache()


@pytest.fixture
def own_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A HOME of this test's own that does not exist yet (nor its ~/.ssh)."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    options.clear_cache()
    yield home
    options.clear_cache()


def host_block(name: str, port: int, key: Path, **more: str) -> str:
    """An ssh config ``Host`` block for a harness node on 127.0.0.1."""
    lines = [
        f"Host {name}",
        "    HostName 127.0.0.1",
        f"    Port {port}",
        f"    IdentityFile {key}",
        "    IdentitiesOnly yes",
        "    BatchMode yes",
    ]
    lines += [f"    {k} {v}" for k, v in more.items()]
    return "\n".join(lines) + "\n"
