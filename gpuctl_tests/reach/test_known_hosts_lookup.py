"""``reach.known_hosts.lookup`` on files alone (no sshd): what asyncssh's own readers would
change (docs/notes/houselib.md, issue 41.6c). asyncssh's ``read_known_hosts`` refuses a whole
file for one malformed line, and its ``match_known_hosts`` retries the bare host name for a port
other than 22, dropping the ``@revoked`` keys of the port's entry."""

from __future__ import annotations

from pathlib import Path

import asyncssh

from gpuctl.reach.known_hosts import lookup
from gpuctl.reach.options import SshTarget


def public_key() -> str:
    key = asyncssh.generate_private_key("ssh-ed25519")
    return key.export_public_key("openssh").decode().strip()


def target(kh: Path, port: int) -> SshTarget:
    return SshTarget(
        alias="node", hostname="10.0.0.7", port=port, user="u", user_known_hosts=(str(kh),)
    )


def test_a_malformed_line_is_skipped_not_the_whole_file(tmp_path: Path) -> None:
    """As ``ssh`` does: a line that is no entry is passed over, the host's key still found."""
    kh = tmp_path / "known_hosts"
    key = public_key()
    kh.write_text(f"garbage-without-a-key\n@unknown-marker x {key}\n[10.0.0.7]:2222 {key}\n")
    keys = lookup(target(kh, 2222))
    assert [k.export_public_key("openssh").decode().strip() for k in keys.trusted] == [key]
    assert keys.where == {"trusted": str(kh)}


def test_a_revoked_key_of_a_port_stays_revoked_when_the_bare_host_has_none(
    tmp_path: Path,
) -> None:
    """The port's ``@revoked`` entry is kept: a lookup that retried the bare name would find
    nothing, and accept-new would then take the revoked key for a new host's."""
    kh = tmp_path / "known_hosts"
    key = public_key()
    kh.write_text(f"@revoked [10.0.0.7]:2222 {key}\n")
    keys = lookup(target(kh, 2222))
    assert len(keys.revoked) == 1 and not keys.unknown_host
    assert keys.where == {"revoked": str(kh)}
    assert lookup(target(kh, 22)).unknown_host  # port 22 is another entry: [host]:2222 is not it
