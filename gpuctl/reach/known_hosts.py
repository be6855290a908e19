"""Host keys: what the user's and the system's known_hosts files say of a host, the policy that
decides on a key they do not vouch for, and the one-line messages that say what to do.

gpuctl does the known_hosts lookup itself (asyncssh parses the files and matches the patterns,
hashed names, ``@cert-authority`` and ``@revoked`` markers) under the name ``ssh`` uses:
HostKeyAlias as it is, else the host name, ``[host]:port`` for a port other than 22, with no
fallback to the bare host name for another port (asyncssh's own lookup has one, and it drops the
``@revoked`` entries of the port it tried first). asyncssh then gets the keys as lists.

Policy (``SshTarget.host_key_policy``): ``strict`` accepts only a trusted key (or a certificate
from a trusted CA); ``accept-new`` also accepts the key of a host that has no entry at all (no
key, no CA, no revoked key) and records it in the first user known_hosts file (``~/.ssh`` made
0700 and the file 0600 when gpuctl creates them). A changed or revoked key is always refused.
``UserKnownHostsFile none`` means nothing is known from that file, never "do not check".
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncssh

from gpuctl.reach.errors import RemoteError
from gpuctl.reach.options import SshTarget

log = logging.getLogger(__name__)

_PARSED: dict[str, tuple[int, int, asyncssh.SSHKnownHosts]] = {}
_PARSED_LOCK = threading.Lock()
_RECORD_LOCK = threading.Lock()


@dataclass(frozen=True, slots=True)
class HostKeys:
    """What the known_hosts files say of one host name."""

    name: str  # the name looked up (``SshTarget.known_hosts_name``)
    trusted: tuple[asyncssh.SSHKey, ...] = ()
    cas: tuple[asyncssh.SSHKey, ...] = ()
    revoked: tuple[asyncssh.SSHKey, ...] = ()
    # the file of each kind of entry, first found: "trusted", "ca", "revoked" -> path
    where: dict[str, str] = field(default_factory=dict)
    files: tuple[str, ...] = ()  # the files consulted (user, then global), existing or not

    @property
    def unknown_host(self) -> bool:
        """True when no file has any entry for the host: the only case accept-new accepts."""
        return not (self.trusted or self.cas or self.revoked)

    def host_key_algs(self) -> list[str]:
        """The host key algorithms to offer, as ``ssh`` orders them: those of the known keys
        first (and certificates when a CA is known), then every other plain key algorithm,
        so that an unknown or changed key gets to the policy (and its clear message) instead
        of failing the key exchange."""
        from asyncssh.public_key import (
            get_default_certificate_algs,
            get_default_public_key_algs,
        )

        first: list[bytes] = []
        if self.cas:
            first += get_default_certificate_algs()
        for key in self.trusted:
            first += key.sig_algorithms
        out: list[str] = []
        for alg in [*first, *get_default_public_key_algs()]:
            name = alg.decode()
            if name not in out:
                out.append(name)
        return out

    def asyncssh_known_hosts(self) -> tuple[list[asyncssh.SSHKey], ...]:
        """The ``known_hosts`` argument for asyncssh: trusted keys, CA keys, revoked keys."""
        return (list(self.trusted), list(self.cas), list(self.revoked))


def _parse(path: str) -> asyncssh.SSHKnownHosts | None:
    """The file's entries, parsed once per (size, mtime); a malformed line is skipped (as
    ``ssh`` does), not a reason to ignore the whole file."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    with _PARSED_LOCK:
        cached = _PARSED.get(path)
        if cached is not None and cached[:2] == (st.st_mtime_ns, st.st_size):
            return cached[2]
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    try:
        parsed = asyncssh.import_known_hosts(text)
    except (ValueError, asyncssh.KeyImportError):
        parsed = asyncssh.SSHKnownHosts()
        for line in text.splitlines():
            try:
                parsed.load(line)
            except (ValueError, asyncssh.KeyImportError):
                log.warning("%s: skipped a malformed known_hosts line", path)
    with _PARSED_LOCK:
        _PARSED[path] = (st.st_mtime_ns, st.st_size, parsed)
    return parsed


def lookup(target: SshTarget) -> HostKeys:
    """The entries for ``target`` in its user known_hosts files, then its global ones."""
    name = target.known_hosts_name
    files = (*target.user_known_hosts, *target.global_known_hosts)
    trusted: list[asyncssh.SSHKey] = []
    cas: list[asyncssh.SSHKey] = []
    revoked: list[asyncssh.SSHKey] = []
    where: dict[str, str] = {}
    for path in files:
        parsed = _parse(path)
        if parsed is None:
            continue
        # port None: ``name`` already carries it, and no retry without it (see the module doc)
        found = parsed.match(name, "", None)
        for kind, keys, out in (
            ("trusted", found[0], trusted),
            ("ca", found[1], cas),
            ("revoked", found[2], revoked),
        ):
            if keys:
                out.extend(keys)
                where.setdefault(kind, path)
    return HostKeys(name, tuple(trusted), tuple(cas), tuple(revoked), where, files)


class HostKeyClient(asyncssh.SSHClient):
    """asyncssh's host key hooks with gpuctl's policy. asyncssh has already refused a revoked
    key and accepted a trusted one; these run for a key (or CA) the files do not vouch for."""

    def __init__(self, target: SshTarget, keys: HostKeys) -> None:
        self.target = target
        self.keys = keys
        self.presented: asyncssh.SSHKey | None = None
        self.accepted: asyncssh.SSHKey | None = None
        self.no_file = False

    def validate_host_public_key(
        self, host: str, addr: str, port: int, key: asyncssh.SSHKey
    ) -> bool:
        self.presented = key
        if self.target.host_key_policy != "accept-new" or not self.keys.unknown_host:
            return False  # strict, or a changed key / a host known by its CA only
        if not self.target.user_known_hosts:
            self.no_file = True  # nowhere to record it: trusting it unrecorded is no check
            return False
        record(self.target, key)
        self.accepted = key
        return True

    def validate_host_ca_key(self, host: str, addr: str, port: int, key: asyncssh.SSHKey) -> bool:
        return False  # a CA is trusted only through @cert-authority, never by accept-new


def _hashed(name: str) -> str:
    salt = os.urandom(20)
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


def record(target: SshTarget, key: asyncssh.SSHKey) -> str:
    """Append ``key`` for ``target`` to its first user known_hosts file (hashed when
    HashKnownHosts says so); a missing folder is created 0700, a new file 0600. Returns the
    file. Raises RemoteError("host_key") when it cannot be written."""
    path = Path(target.user_known_hosts[0])
    name = target.known_hosts_name
    entry = _hashed(name) if target.hash_known_hosts else name
    keytype, blob = key.export_public_key("openssh").decode().split()[:2]
    line = f"{entry} {keytype} {blob}\n"
    with _RECORD_LOCK:
        try:
            missing = []
            parent = path.parent
            while not parent.exists():
                missing.append(parent)
                parent = parent.parent
            for folder in reversed(missing):
                folder.mkdir(mode=0o700)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            with os.fdopen(fd, "a", encoding="utf-8") as f:
                f.write(line)
        except OSError as e:
            raise RemoteError(
                "host_key", f"cannot record the host key of {name} in {path}: {e.strerror or e}"
            ) from None
    with _PARSED_LOCK:
        _PARSED.pop(str(path), None)
    log.warning("%s: accepted new host key for %s into %s", target.alias, name, path)
    return str(path)


def _scan(target: SshTarget, into: str) -> str:
    if target.proxy_jump:  # ssh-keyscan cannot go through a jump host; ssh itself can
        return (
            f"ssh -o StrictHostKeyChecking=accept-new -o UserKnownHostsFile={into} "
            f"{target.alias} true (once the key's fingerprint is checked)"
        )
    port = "" if target.port == 22 else f" -p {target.port}"
    scan = f"ssh-keyscan{port} {target.hostname}"
    if target.host_key_alias:
        scan += f" | sed 's/^[^ ]*/{target.host_key_alias}/'"
    return f"{scan} >> {into}"


def host_key_error(
    node: str, target: SshTarget, keys: HostKeys, client: HostKeyClient | None, detail: str
) -> RemoteError:
    """The one line for a host key asyncssh refused (``detail`` is its text): revoked, changed,
    only a CA trusted, or unknown, with the command that fixes it where one does."""
    entry = keys.name
    user_file = target.user_known_hosts[0] if target.user_known_hosts else None
    kh = user_file or str(Path.home() / ".ssh" / "known_hosts")
    if "revoked" in detail.lower():
        src = keys.where.get("revoked", "known_hosts")
        return RemoteError(
            "host_key",
            f"{node}: the host key of {entry} is REVOKED (@revoked in {src}); gpuctl will not "
            "connect: ask the node's administrator for its new host key",
        )
    if keys.trusted:
        src = keys.where["trusted"]
        return RemoteError(
            "host_key",
            f"{node}: the host key of {entry} CHANGED (it is not the one in {src}); "
            f"if the node was reinstalled, run: ssh-keygen -R '{entry}' -f {src} && "
            f"{_scan(target, src)}",
        )
    if keys.cas:
        src = keys.where["ca"]
        if client is not None and client.presented is None:
            return RemoteError(
                "host_key",
                f"{node}: the host certificate of {entry} was refused ({detail}); check its "
                f"HostCertificate against the @cert-authority in {src}",
            )
        return RemoteError(
            "host_key",
            f"{node}: {entry} offered a plain host key but {src} trusts only a certificate "
            "authority for it (@cert-authority): give the node a HostCertificate signed by it",
        )
    if client is not None and client.no_file:
        return RemoteError(
            "host_key",
            f"{node}: unknown host key for {entry} and UserKnownHostsFile is none, so accept-new "
            f"has nowhere to record it: set known_hosts = {Path.home()!s}/.ssh/known_hosts "
            "for this node",
        )
    files = [f for f in keys.files if f != os.devnull and (f == user_file or os.path.exists(f))]
    where = ", ".join(files) if files else "any known_hosts file: UserKnownHostsFile is none"
    return RemoteError(
        "host_key",
        f"{node}: unknown host key for {entry} (not in {where}); "
        f"to trust it, run: {_scan(target, kh)}",
    )


def describe_policy(target: SshTarget) -> dict[str, Any]:
    """The host key policy of ``target`` and the files it reads, for ``gpuctl doctor``."""
    return {
        "policy": target.host_key_policy,
        "strict_host_key_checking": target.strict_host_key_checking,
        "name": target.known_hosts_name,
        "user_files": list(target.user_known_hosts),
        "global_files": list(target.global_known_hosts),
    }
