"""SSH links: the agent on a node, started over the node's pooled connection (``gpuctl.reach``).

On ``open()`` the link gets the node's connection from the connection layer (options as ``ssh
-G`` resolves them, host keys checked, jump hosts hop by hop), then starts the agent with one
launch (``exec /bin/sh -c`` whatever the login shell, any banner left aside by the start
marker): a small ``sh`` script finds the node's python and runs the boot code, which checks that
the bundle folder is private and that ``<bundle_dir>/gpuctl-node-<hash>.pyz`` has the bundle's
sha256, and only then imports the agent from it. When the boot code says the bundle is missing
or is not the right one, the link uploads it (temporary name, then rename: a partial upload
never runs) and starts again. Folding the check into the start saves a round trip per node.
Nodes of one cluster that share a home upload once: the first uploader of a (cluster, folder)
goes alone, the others wait for it and look again.

Failures become ``LinkError`` with a reason token (refused, timeout, dns, network, auth,
host_key, config, shell, deploy, no_python, agent_crashed) and one line saying what to do.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import time
from dataclasses import dataclass, field

import asyncssh

from gpuctl.bundle import bundle_bytes, bundle_name
from gpuctl.config import NodeConfig
from gpuctl.core.deadline import wait_for
from gpuctl.fleet.links import STREAM_LIMIT, NodeLink
from gpuctl.fleet.session import AgentSession, LineFeed, LinkError, keep_stderr, stderr_ended
from gpuctl.reach import launch
from gpuctl.reach.deploy import (
    DEPLOY_TAG,
    boot_line,
    deploy,
    expected_digest,
    parse_reply,
    prepare_folder,
)
from gpuctl.reach.errors import RemoteError
from gpuctl.reach.files import remote_path
from gpuctl.reach.options import SshSettings, SshTarget, resolve
from gpuctl.reach.pool import Pool, pool

__all__ = ["DEPLOY_TAG", "BundleStore", "SshLink", "agent_script", "remote_path"]

log = logging.getLogger(__name__)


def agent_script(
    node: NodeConfig,
    bundle_dir: str,
    bundle_file: str,
    seed: int = 0,
    read_only: bool = False,
    *,
    digest: str | None = None,
    addressed: bool = False,
) -> str:
    """The ``sh`` script that starts the agent on a node (``addressed``: one of many agents of
    one srun step, named by ``$SLURMD_NODENAME``; see ``gpuctl.node.protocol``).

    It runs the node's setup lines, then prints one ``gpuctl-deploy: ...`` line and exits when
    the python is not there (``no-python``), is older than 3.6 (``old-python X.Y.Z``), the
    bundle folder is not private (``unsafe-dir ...``) or the bundle is not there (``missing
    PATH``) or not the right one (``mismatch PATH``: its sha256 is not ``digest``, or when no
    digest is given, does not start with the hash in ``bundle_file``'s name); else it execs the
    agent, whose first line is its hello.
    """
    bundle = f"{bundle_dir.rstrip('/')}/{bundle_file}"
    agent = ["agent", "--interval", f"{node.interval:g}"]
    if node.simulate:
        agent += ["--simulate", node.simulate, "--seed", str(seed)]
    if read_only:
        agent.append("--read-only")
    if addressed:
        agent.append("--addressed")
    lines = [
        f"PY={remote_path(node.python)}",
        f"B={remote_path(bundle)}",
        *node.setup,
        'command -v "$PY" >/dev/null 2>&1 || { echo "gpuctl-deploy: no-python"; exit 0; }',
        # no python started just to say so: on a cold start every node of a shared home asks
        '[ -s "$B" ] || { echo "gpuctl-deploy: missing $B"; exit 0; }',
        boot_line("PY", "B", expected_digest(bundle_file, digest), agent),
    ]
    return "\n".join(lines)


@dataclass
class BundleStore:
    """The node bundle (built once per process) and who uploaded it where.

    Shared by every link a fleet builds, so that nodes of a cluster on one shared home upload
    the bundle once: ``uploads`` records ``(node, remote path)`` of each upload made.
    """

    _bundle: tuple[str, bytes] | None = None
    _sha256: str | None = None
    uploads: list[tuple[str, str]] = field(default_factory=list)
    _first: dict[tuple[str, str], asyncio.Future[None]] = field(default_factory=dict)
    _unshared: set[tuple[str, str]] = field(default_factory=set)

    @property
    def digest(self) -> str:
        """The 16 hex digits of the bundle's sha256 its name carries."""
        return self._get()[0]

    @property
    def sha256(self) -> str:
        """The bundle's full sha256 (the node checks it before running the bundle)."""
        if self._sha256 is None:
            self._sha256 = hashlib.sha256(self.data).hexdigest()
        return self._sha256

    @property
    def data(self) -> bytes:
        return self._get()[1]

    def _get(self) -> tuple[str, bytes]:
        if self._bundle is None:
            self._bundle = bundle_bytes()
        return self._bundle

    @property
    def name(self) -> str:
        return bundle_name(self.digest)


def _ended(node: str, tail: list[str], proc: launch.FedProcess, exc: Exception | None) -> None:
    """How an agent's channel ended (``launch.FedProcess.ended``), onto its feeds: stderr to
    its end first (its last lines, ``tail``, are the reason's); a lost connection is
    ``LinkError("lost")`` (the fleet then shows the node stale while it reconnects), an agent
    that died ``LinkError("agent_crashed")`` with its exit status and last stderr lines, else
    the end of its lines."""
    proc.err.feed_eof()
    if exc is not None:
        why = exc.reason if isinstance(exc, asyncssh.DisconnectError) else exc
        proc.out.set_exception(LinkError("lost", f"SSH connection to {node} lost: {why}"))
        return
    signal, status = proc.exit_signal, proc.exit_status
    if signal or status not in (None, 0):
        how = f"signal {signal}" if signal else f"status {status}"
        detail = f": {' | '.join(tail[-3:])}" if tail else ""
        proc.out.set_exception(
            LinkError("agent_crashed", f"agent on {node} exited ({how}){detail}")
        )
        return
    proc.out.feed_eof()


def _link_error(e: RemoteError, node: str) -> LinkError:
    e = e.for_node(node)
    return LinkError(e.reason, e.message)


class SshLink(NodeLink):
    """The agent on a node reached over SSH, as the user's own ``ssh`` would reach it."""

    kind = "ssh"
    node: NodeConfig  # always built from one

    def __init__(
        self,
        node: NodeConfig,
        *,
        store: BundleStore | None = None,
        seed: int = 0,
        read_only: bool = False,
    ) -> None:
        self.node = node
        self.read_only = read_only
        self.store = store or BundleStore()
        self.seed = seed
        self.settings = SshSettings.from_node(node)
        self._target: SshTarget | None = None
        self._pool: Pool | None = None
        self._conn: asyncssh.SSHClientConnection | None = None
        self._force_upload = False
        # What the node's login shell printed before the agent started (``gpuctl doctor``).
        self.banner = b""
        self._proc: launch.FedProcess | None = None

    @property
    def stderr_banner(self) -> bytes:
        """What the node's login shell printed on stderr before the agent started."""
        return self._proc.stderr_banner if self._proc is not None else b""

    def describe(self) -> str:
        return f"ssh {self.node.name}"

    # -- connection ---------------------------------------------------------------------------
    def target(self) -> SshTarget:
        """The node's resolved SSH options (cached by the connection layer). Raises
        LinkError("config")."""
        try:
            return resolve(self.node.name, self.settings)
        except RemoteError as e:
            raise _link_error(e, self.node.name) from None

    def known_hosts_files(self) -> list[str]:
        """The known_hosts files this node's host key is checked against, user files first
        (the first is where accept-new records keys), then the system's."""
        t = self.target()
        return [*t.user_known_hosts, *t.global_known_hosts]

    async def connection(self) -> asyncssh.SSHClientConnection:
        """The node's SSH connection from the pool of this event loop, opened if needed.
        Raises LinkError."""
        try:
            target = await asyncio.to_thread(resolve, self.node.name, self.settings)
        except RemoteError as e:
            raise _link_error(e, self.node.name) from None
        p = pool()
        moved = self._target is not None and (self._target != target or self._pool is not p)
        if moved and self._target is not None and self._pool is not None:
            self._pool.release(self._target, self)  # the ssh config changed under us
        self._target, self._pool = target, p
        try:
            self._conn = await p.connect(target, self)
        except RemoteError as e:
            raise _link_error(e, self.node.name) from None
        return self._conn

    async def aclose(self) -> None:
        """Give the node's connection back to the pool (closed when nobody else holds it: the
        agent stops when its channel closes)."""
        target, p, conn = self._target, self._pool, self._conn
        self._target = self._pool = self._conn = None
        if target is None or p is None:
            return
        p.release(target, self)
        if conn is not None and target not in p.connections():
            with contextlib.suppress(Exception):
                await wait_for(conn.wait_closed(), 5.0)

    def forget_deploy(self) -> None:
        """The agent spoke another protocol: upload the bundle again on the next open."""
        self._force_upload = True

    # -- deploy and start ---------------------------------------------------------------------
    def _script(self) -> str:
        return agent_script(
            self.node,
            self.node.bundle_dir,
            self.store.name,
            self.seed,
            self.read_only,
            digest=self.store.sha256,
        )

    async def open(self) -> AgentSession:
        conn = await self.connection()
        key = (self.node.cluster, self.node.bundle_dir)
        waited = False
        last = ""
        for _ in range(4):
            if self._force_upload:
                await self._upload(conn)
                self._force_upload = False
            started = await self._start(conn)
            proc, first = started.proc, started.first
            reply = parse_reply(first)
            if reply is None:
                return self._session(started)
            word, rest = reply
            last = f"{word} {rest}".strip()
            proc.close()
            if word == "no-python":
                raise LinkError(
                    "no_python",
                    f"no python at {self.node.python!r} on {self.node.name}: set python = "
                    f'"/path/to/python3" for this node in the gpuctl config',
                )
            if word == "old-python":
                raise LinkError(
                    "no_python",
                    f"{self.node.python} on {self.node.name} is Python {rest}; the agent needs "
                    '3.6 or newer: set python = "/path/to/python3" for this node',
                )
            if word == "unsafe-dir":
                await self._prepare(conn)  # tightens our folder, or refuses in words
                continue
            if word not in ("missing", "mismatch") or not rest:
                raise LinkError("agent_crashed", f"unexpected deploy reply {first[:80]!r}")
            first_upload = self.store._first.get(key)
            if first_upload is not None and not waited and key not in self.store._unshared:
                waited = True
                with contextlib.suppress(Exception):
                    await asyncio.shield(first_upload)
                continue  # look again: on a shared home the file is there now
            if waited:
                self.store._unshared.add(key)
            await self._first_or_own_upload(conn, key)
        raise LinkError(
            "deploy",
            f"the agent bundle did not stay in place on {self.node.name} ({last}): set "
            "bundle_dir to a private folder of yours",
        )

    async def _first_or_own_upload(
        self, conn: asyncssh.SSHClientConnection, key: tuple[str, str]
    ) -> None:
        fut: asyncio.Future[None] | None = None
        if key not in self.store._first:
            fut = asyncio.get_running_loop().create_future()
            self.store._first[key] = fut
        try:
            await self._upload(conn)
        finally:
            if fut is not None and not fut.done():
                fut.set_result(None)  # waiters wake and look again either way

    async def _prepare(self, conn: asyncssh.SSHClientConnection) -> None:
        try:
            await prepare_folder(conn, self.node.bundle_dir, self.node.name)
        except RemoteError as e:
            raise _link_error(e, self.node.name) from None

    async def _upload(self, conn: asyncssh.SSHClientConnection) -> None:
        t0 = time.monotonic()
        data = self.store.data
        try:
            path = await deploy(conn, self.node.bundle_dir, self.store.name, data, self.node.name)
        except RemoteError as e:
            raise _link_error(e, self.node.name) from None
        self.store.uploads.append((self.node.name, path))
        log.info(
            "%s: uploaded %s (%d bytes, %.2f s)",
            self.node.name,
            path,
            len(data),
            time.monotonic() - t0,
        )

    async def _start(self, conn: asyncssh.SSHClientConnection) -> _Started:
        """The agent's script started, and its first line (the hello, or the boot code's
        word), left in its feed: its lines and stderr come from the channel's callback."""
        name = self.node.name
        tail: list[str] = []
        out = LineFeed(limit=STREAM_LIMIT)
        err = LineFeed(limit=STREAM_LIMIT)
        err.push_to(functools.partial(keep_stderr, tail), stderr_ended)
        ended = functools.partial(_ended, name, tail)
        try:
            proc = await launch.start_fed(
                conn, self._script(), node=name, out=out, err=err, ended=ended
            )
        except RemoteError as e:
            raise _link_error(e, name) from None
        out.transport = proc.chan  # too many lines unread: the channel pauses
        self.banner, self._proc = proc.banner, proc
        try:
            first = await out.peek()
        except LinkError as e:
            if e.reason != "agent_crashed":
                proc.close()
                raise LinkError("closed", f"{name}: {e.message}") from None
            first = b""  # the agent died before its first line: said below
        except asyncio.CancelledError:
            proc.close()  # the channel closes, and the agent with it
            raise
        if not first:
            proc.close()
            detail = " | ".join(tail[-3:]) if tail else f"exit status {proc.exit_status}"
            raise LinkError("agent_crashed", f"agent on {name} exited: {detail}")
        return _Started(proc, first, out, tail)

    def _session(self, started: _Started) -> AgentSession:
        proc = started.proc

        async def close() -> None:
            proc.close()  # EOF on the agent's stdin, the channel closed: the agent stops
            with contextlib.suppress(Exception):
                await wait_for(proc.wait_closed(), 3.0)

        # the agent's lines go to the session from the channel's callback (``stream``)
        session = AgentSession(started.out, proc, close=close)
        session.stderr_tail = started.tail
        return session


@dataclass(frozen=True, slots=True)
class _Started:
    """An agent's script started (``SshLink._start``): its first line, its lines' feed and
    its stderr's last lines."""

    proc: launch.FedProcess
    first: bytes
    out: LineFeed
    tail: list[str]
