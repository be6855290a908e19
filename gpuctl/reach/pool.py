"""SSH connections: one per target per event loop, jump hosts opened hop by hop.

``pool()`` is the pool of the running event loop (the TUI's fleet runs on the app's loop, the
synchronous jobs API on one private loop thread: each has its own). ``Pool.connect(target,
owner)`` returns the live connection to ``target``, opening it when there is none or it died;
whoever asked holds it until ``release``; the last holder's release closes it. A ProxyJump chain
``a,b`` is opened the way ``ssh`` does it: ``b`` through ``a``, the node through ``b``, each hop
resolved with its own ssh config options and the same host key policy, each hop's connection
pooled too (nodes behind one bastion share it). A failure on the way names the hop.

This module is the only place that calls ``asyncssh.connect`` (ruff's banned-api rule and a test
keep it so).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket
import weakref
from dataclasses import dataclass

import asyncssh

from gpuctl.core.deadline import wait_for
from gpuctl.reach.errors import RemoteError
from gpuctl.reach.known_hosts import HostKeyClient, host_key_error, lookup
from gpuctl.reach.options import SshTarget, parse_hop, resolve

MAX_HOPS = 8
# AES-GCM first: with AES-NI it moves payloads ~1.5x faster than asyncssh's default
# chacha20-poly1305 (benchmarks/jobs_roundtrip.py); used when the ssh config chooses no Ciphers.
DEFAULT_CIPHERS = (
    "aes128-gcm@openssh.com",
    "aes256-gcm@openssh.com",
    "chacha20-poly1305@openssh.com",
    "aes128-ctr",
    "aes192-ctr",
    "aes256-ctr",
)


class Holder:
    """A token that holds a pooled connection: a jump host's, on behalf of the connection that
    goes through it, or anyone's who has no object of its own (owners must be weak-referable:
    a holder that is garbage-collected lets go)."""


@dataclass
class _Entry:
    conn: asyncssh.SSHClientConnection
    hop: SshTarget | None
    holder: Holder
    owners: weakref.WeakSet[object]


class Pool:
    """One SSH connection per target on one event loop, shared by its owners."""

    def __init__(self) -> None:
        self._entries: dict[SshTarget, _Entry] = {}
        self._locks: dict[SshTarget, asyncio.Lock] = {}
        self.opened = 0  # connections opened so far (tests and benchmarks read it)
        self._until_sweep = 0  # connects left before the next sweep (see ``_sweep``)

    async def connect(
        self, target: SshTarget, owner: object, *, _chain: tuple[SshTarget, ...] = ()
    ) -> asyncssh.SSHClientConnection:
        """The live connection to ``target``, opened (with its jump hosts) when there is none
        or it died; ``owner`` (weak-referable, e.g. a ``Holder``) holds it until
        ``release(target, owner)``.

        Raises RemoteError; a failure on the way to ``target`` has ``hop`` set to the jump host
        that failed (``RemoteError.for_node`` words it for the node)."""
        self._sweep()
        lock = self._locks.setdefault(target, asyncio.Lock())
        async with lock:
            entry = self._entries.get(target)
            owners: weakref.WeakSet[object] = weakref.WeakSet()
            if entry is not None:
                entry.owners.add(owner)
                if not entry.conn.is_closed():
                    return entry.conn
                owners = entry.owners
                self._forget(target, entry)
            owners.add(owner)
            holder = Holder()
            hop: SshTarget | None = None
            tunnel: asyncssh.SSHClientConnection | None = None
            if target.proxy_jump:
                if len(_chain) >= MAX_HOPS or target in _chain:
                    raise RemoteError(
                        "config",
                        f"{target.alias}: ProxyJump goes round in circles or through more than "
                        f"{MAX_HOPS} hosts",
                    )
                spec = target.proxy_jump[-1]
                try:
                    hop = await asyncio.to_thread(hop_target, target)
                    tunnel = await self.connect(hop, holder, _chain=(*_chain, target))
                except RemoteError as e:
                    raise (e if e.hop else RemoteError(e.reason, e.message, hop=spec)) from None
            try:
                conn = await open_connection(target, tunnel)
            except BaseException:
                if hop is not None:
                    self.release(hop, holder)
                raise
            self.opened += 1
            self._entries[target] = _Entry(conn, hop, holder, owners)
            return conn

    def release(self, target: SshTarget, owner: object) -> None:
        """``owner`` no longer needs the connection; the last owner's release closes it (and
        releases its jump hosts)."""
        entry = self._entries.get(target)
        if entry is None:
            return
        entry.owners.discard(owner)
        if not entry.owners:
            self._forget(target, entry)

    def invalidate(self, target: SshTarget, conn: asyncssh.SSHClientConnection) -> None:
        """``conn`` is broken: close it; the next ``connect`` opens a new one for its owners."""
        entry = self._entries.get(target)
        if entry is not None and entry.conn is conn:
            conn.close()

    def connections(self) -> dict[SshTarget, asyncssh.SSHClientConnection]:
        """The live pooled connections (for tests and ``gpuctl doctor``)."""
        return {t: e.conn for t, e in self._entries.items() if not e.conn.is_closed()}

    async def aclose(self) -> None:
        """Close every connection of this pool."""
        for target, entry in list(self._entries.items()):
            self._forget(target, entry)

    def _forget(self, target: SshTarget, entry: _Entry) -> None:
        if self._entries.get(target) is entry:
            del self._entries[target]
        entry.conn.close()
        if entry.hop is not None:
            self.release(entry.hop, entry.holder)

    def _sweep(self) -> None:
        # owners that were garbage-collected without releasing (a forgotten SshHost). A sweep
        # reads every entry, so it runs once per as many connects as there are entries: O(1)
        # per connect (a fleet of K nodes connecting would otherwise read K^2/2 entries).
        if self._until_sweep > 0:
            self._until_sweep -= 1
            return
        self._until_sweep = len(self._entries)
        for target, entry in list(self._entries.items()):
            if not entry.owners:
                self._forget(target, entry)


_POOLS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Pool] = weakref.WeakKeyDictionary()


def pool() -> Pool:
    """The pool of the running event loop."""
    loop = asyncio.get_running_loop()
    found = _POOLS.get(loop)
    if found is None:
        found = _POOLS[loop] = Pool()
    return found


def hop_target(target: SshTarget) -> SshTarget:
    """The last jump host of ``target``, resolved as ``ssh`` resolves it: its own ssh config
    options, the hops before it as its ProxyJump (the first hop keeps its config's own).
    Raises RemoteError."""
    *before, spec = target.proxy_jump
    user, host, port = parse_hop(spec)
    settings = target.settings.for_hop(user, port, ",".join(before) if before else None)
    return resolve(host, settings)


def connect_options(target: SshTarget) -> dict[str, object]:
    """The keyword arguments for ``asyncssh.connect`` that ``target`` implies (host keys
    excepted). Raises RemoteError("config") when no configured identity file exists and
    there is no agent to fall back on."""
    paths = [p for p in target.identity_files if os.path.isfile(p)]
    if not paths and not target.default_identities and not target.identity_agent:
        missing = target.identity_files[0] if target.identity_files else "?"
        raise RemoteError(
            "config",
            f"cannot read {missing}: no such file (IdentityFile for {target.alias} in the ssh "
            "config, or identity in the gpuctl config)",
        )
    certs = [p for p in target.certificate_files if os.path.isfile(p)]
    # As ssh does: a key file that cannot be loaded (not a key, or it wants a passphrase nobody
    # can type here) is skipped, not a reason to give up on the others or on the agent.
    keys = asyncssh.load_keypairs(paths, None, certs, True, True) if paths else []
    client_keys: object = keys
    if not keys:
        # nothing loaded: OpenSSH's default files (and the agent) when nothing was configured,
        # the agent alone when it is there, else no key at all (the server then says no)
        client_keys = () if target.default_identities or target.identity_agent else None
    opts: dict[str, object] = {
        "username": target.user,
        "config": None,  # everything comes from ``target``: asyncssh must not read a config
        "client_keys": client_keys,
        "ignore_encrypted": True,  # nobody can type a passphrase: such a key is skipped
        "agent_path": target.identity_agent,
        "password_auth": False,
        "kbdint_auth": False,
        "connect_timeout": target.connect_timeout,
        "login_timeout": target.connect_timeout,
        "keepalive_interval": target.server_alive_interval,
        "keepalive_count_max": target.server_alive_count_max,
        "host_key_alias": target.host_key_alias,
    }
    if target.identities_only and target.identity_agent:
        opts["agent_identities"] = paths
    if target.ciphers is None:
        opts["encryption_algs"] = DEFAULT_CIPHERS
    else:
        supported = {a.decode() for a in asyncssh.encryption.get_encryption_algs()}
        chosen = [c for c in target.ciphers if c in supported]
        if not chosen:
            raise RemoteError(
                "config",
                f"{target.alias}: none of the Ciphers in the ssh config "
                f"({','.join(target.ciphers)}) is one gpuctl (asyncssh) supports",
            )
        opts["encryption_algs"] = chosen
    if target.proxy_command and not target.proxy_jump:
        # as ssh runs it: through /bin/sh, exec'd
        opts["proxy_command"] = ["/bin/sh", "-c", "exec " + target.proxy_command]
    return opts


async def open_connection(
    target: SshTarget, tunnel: asyncssh.SSHClientConnection | None = None
) -> asyncssh.SSHClientConnection:
    """A new connection to ``target`` (through ``tunnel`` when it is behind a jump host), host
    key checked by gpuctl's policy. Not pooled: use ``pool().connect``. Raises RemoteError."""
    keys = await asyncio.to_thread(lookup, target)
    client = HostKeyClient(target, keys)
    opts = await asyncio.to_thread(connect_options, target)  # reads key files
    try:
        return await asyncssh.connect(
            target.hostname,
            target.port,
            tunnel=tunnel if tunnel is not None else (),
            known_hosts=keys.asyncssh_known_hosts(),
            server_host_key_algs=keys.host_key_algs(),
            client_factory=lambda: client,
            **opts,
        )
    except asyncssh.HostKeyNotVerifiable as e:
        raise host_key_error(target.alias, target, keys, client, str(e)) from None
    except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:
        raise classify(e, target) from None


def classify(e: BaseException, target: SshTarget) -> RemoteError:
    """A connection failure as one line with a reason token."""
    host, port = target.hostname, target.port
    at = f"{host}:{port}" if host == target.alias else f"{target.alias} ({host}:{port})"
    if isinstance(e, RemoteError):
        return e
    if isinstance(e, asyncssh.PermissionDenied):
        return RemoteError(
            "auth",
            f"{target.user}@{at} refused every key: check IdentityFile in the ssh config, "
            "or load a key with ssh-add",
        )
    if isinstance(e, socket.gaierror):
        return RemoteError("dns", f"cannot resolve {host}: {e.strerror or e}")
    if isinstance(e, TimeoutError | asyncio.TimeoutError):
        return RemoteError("timeout", f"{at} did not answer within {target.connect_timeout:g} s")
    if isinstance(e, ConnectionRefusedError):
        return RemoteError("refused", f"{at} refused the connection (is sshd running there?)")
    if isinstance(e, OSError):
        if e.errno in (errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH):
            return RemoteError("timeout", f"{at}: {e.strerror or e}")
        if isinstance(e, FileNotFoundError):
            return RemoteError("config", f"cannot read {e.filename}: no such file")
        return RemoteError("network", f"{at}: {e.strerror or e}")
    if isinstance(e, asyncssh.ConnectionLost):
        return RemoteError("refused", f"{at} closed the connection during login")
    if isinstance(e, asyncssh.DisconnectError):
        return RemoteError("refused", f"{at} disconnected: {e.reason}")
    if isinstance(e, asyncssh.ChannelOpenError):
        return RemoteError("refused", f"{at}: the jump host could not reach it: {e.reason}")
    if isinstance(e, asyncssh.Error | ValueError):
        return RemoteError("config", f"{at}: {e}")
    return RemoteError("network", f"{at}: {type(e).__name__}: {e}")


async def close_quietly(conn: asyncssh.SSHClientConnection, timeout: float = 5.0) -> None:
    """Close ``conn`` and wait (bounded) for it to be closed."""
    conn.close()
    with contextlib.suppress(Exception):
        await wait_for(conn.wait_closed(), timeout)
