"""SSH links: one long-lived asyncssh connection per node, the agent deployed and started on it.

On ``open()`` the link connects (or reuses its live connection), then starts the agent with one
``conn.create_process``: a small ``sh`` script finds the node's python, checks that the bundle
``<bundle_dir>/gpuctl-node-<hash>.pyz`` is there and execs it. When the script says the bundle is
missing, the link uploads it over SFTP (to a temporary name, then renamed: a partial upload never
runs) and starts again. Folding the existence check into the start saves a round trip per node;
SFTP is opened only to upload. Nodes of one cluster that share a home upload once: the first
uploader of a (cluster, folder) goes alone, the others wait for it and look again.

Host keys are always checked against known_hosts; ``host_key_policy = "accept-new"`` (the user's
choice) trusts a host never seen before and records its key. Failures become ``LinkError`` with a
reason token (refused, timeout, dns, network, auth, host_key, config, no_python, agent_crashed)
and one line saying what to do.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import re
import shlex
import socket
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import asyncssh

from gpuctl.bundle import bundle_bytes, bundle_name
from gpuctl.config import NodeConfig
from gpuctl.fleet.links import NodeLink
from gpuctl.fleet.session import AgentSession, LinkError
from gpuctl.node import protocol

log = logging.getLogger(__name__)

DEPLOY_TAG = b"gpuctl-deploy:"
STDERR_KEPT = 20

# Runs under the node's python before the bundle: refuses Pythons older than 3.6 in words (this
# line must parse on Python 2), then imports the agent from the zipapp given as argv[1].
_BOOT = (
    "import sys\n"
    "if sys.version_info < (3, 6):\n"
    "    sys.stdout.write('gpuctl-deploy: old-python %d.%d.%d\\n' % tuple(sys.version_info[:3]))\n"
    "    sys.exit(0)\n"
    "sys.path.insert(0, sys.argv[1])\n"
    "from gpuctl.node.__main__ import main\n"
    "sys.exit(main(sys.argv[2:]))\n"
)


def remote_path(path: str) -> str:
    """Shell text for a node-side path: ``~/x`` becomes ``"$HOME"/x``, the rest is quoted."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


# -- ssh config: only the parts that concern one host -----------------------------------------
# asyncssh tokenizes every line of the ssh config for every host it connects to; with one Host
# block per node that is O(nodes) per node. For a big file, gpuctl hands asyncssh a copy that
# keeps everything outside Host blocks, every Match block, and only the Host blocks that match
# the node (OpenSSH's rules: any positive pattern matches and no negated one does).
SSH_CONFIG_FILTER_LINES = 200
_CONFIG_BLOCKS: dict[str, tuple[int, list[tuple[list[str] | None, list[str]]] | None]] = {}
_HOST_LINE = re.compile(r"^\s*(host|match)\b\s*=?\s*(.*)$", re.IGNORECASE)


def _config_blocks(path: str) -> list[tuple[list[str] | None, list[str]]] | None:
    """The file as blocks: (Host patterns, or None for the prelude and Match blocks, lines).

    None when the file should be used as it is (small, or with CanonicalizeHostname, which
    matches Host blocks again against another name)."""
    mtime = os.stat(path).st_mtime_ns
    cached = _CONFIG_BLOCKS.get(path)
    if cached is not None and cached[0] == mtime:
        return cached[1]
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    blocks: list[tuple[list[str] | None, list[str]]] | None = [(None, [])]
    if len(lines) < SSH_CONFIG_FILTER_LINES or any(
        "canonicalizehostname" in ln.lower() for ln in lines
    ):
        blocks = None
    else:
        assert blocks is not None
        for line in lines:
            m = _HOST_LINE.match(line)
            if m and m.group(1).lower() == "host":
                try:
                    patterns = shlex.split(m.group(2))
                except ValueError:
                    blocks = None
                    break
                blocks.append((patterns, [line]))
            elif m:
                blocks.append((None, [line]))  # Match: kept whole, asyncssh evaluates it
            else:
                blocks[-1][1].append(line)
    _CONFIG_BLOCKS[path] = (mtime, blocks)
    return blocks


def _host_matches(patterns: list[str], host: str) -> bool:
    host = host.lower()
    hit = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        body = pattern[1:] if negated else pattern
        regex = "".join(
            ".*" if c == "*" else "." if c == "?" else re.escape(c) for c in body.lower()
        )
        if re.fullmatch(regex, host):
            if negated:
                return False
            hit = True
    return hit


def ssh_config_for(path: str, host: str) -> str | None:
    """The lines of ssh config ``path`` that can concern ``host``, or None to use the file."""
    blocks = _config_blocks(path)
    if blocks is None:
        return None
    out: list[str] = []
    for patterns, lines in blocks:
        if patterns is None or _host_matches(patterns, host):
            out.extend(lines)
    return "\n".join(out) + "\n"


def agent_script(
    node: NodeConfig, bundle_dir: str, bundle_file: str, seed: int = 0, read_only: bool = False
) -> str:
    """The ``sh`` script that starts the agent on a node.

    It runs the node's setup lines, then prints one ``gpuctl-deploy: ...`` line and exits when
    the python (``no-python``) or the bundle (``missing <absolute path>``) is not there; else it
    execs the agent, whose first line is its hello.
    """
    bundle = f"{bundle_dir.rstrip('/')}/{bundle_file}"
    agent = ["agent", "--interval", f"{node.interval:g}"]
    if node.simulate:
        agent += ["--simulate", node.simulate, "--seed", str(seed)]
    if read_only:
        agent.append("--read-only")
    lines = [
        f"PY={remote_path(node.python)}",
        f"B={remote_path(bundle)}",
        *node.setup,
        'command -v "$PY" >/dev/null 2>&1 || { echo "gpuctl-deploy: no-python"; exit 0; }',
        '[ -f "$B" ] || { echo "gpuctl-deploy: missing $B"; exit 0; }',
        f'exec "$PY" -c {shlex.quote(_BOOT)} "$B" {shlex.join(agent)}',
    ]
    return "\n".join(lines)


@dataclass
class BundleStore:
    """The node bundle (built once per process) and who uploaded it where.

    Shared by every link a fleet builds, so that nodes of a cluster on one shared home upload
    the bundle once: ``uploads`` records ``(node, remote path)`` of each upload made.
    """

    _bundle: tuple[str, bytes] | None = None
    uploads: list[tuple[str, str]] = field(default_factory=list)
    _first: dict[tuple[str, str], asyncio.Future[None]] = field(default_factory=dict)
    _unshared: set[tuple[str, str]] = field(default_factory=set)

    @property
    def digest(self) -> str:
        return self._get()[0]

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


class _ChannelReader:
    """Lines from the agent's SSH channel: one already-read line first; a lost connection is
    ``LinkError("lost")`` (the fleet then shows the node stale while it reconnects) and an
    agent that died is ``LinkError("agent_crashed")`` with its exit status and last stderr."""

    def __init__(self, first: bytes, proc: Any, node: str) -> None:
        self._first: bytes | None = first
        self._proc = proc
        self._node = node
        self.session: AgentSession | None = None

    async def readline(self) -> bytes:
        if self._first is not None:
            first, self._first = self._first, None
            return first
        try:
            line: bytes = await self._proc.stdout.readline()
        except asyncssh.DisconnectError as e:
            raise LinkError("lost", f"SSH connection to {self._node} lost: {e.reason}") from None
        except (asyncssh.Error, OSError) as e:
            raise LinkError("lost", f"SSH connection to {self._node} lost: {e}") from None
        if not line:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._proc.wait_closed(), 2.0)
            signal, status = self._proc.exit_signal, self._proc.exit_status
            if signal or (status not in (None, 0)):
                how = f"signal {signal[0]}" if signal else f"status {status}"
                tail = self.session.stderr_tail[-3:] if self.session is not None else []
                detail = f": {' | '.join(tail)}" if tail else ""
                raise LinkError("agent_crashed", f"agent on {self._node} exited ({how}){detail}")
        return line


class _Client(asyncssh.SSHClient):
    """Host key policy hook: with accept-new, trust a host that has no known key at all."""

    def __init__(self, link: SshLink) -> None:
        self.link = link
        self.accepted: tuple[str, int, asyncssh.SSHKey] | None = None

    def validate_host_public_key(
        self, host: str, addr: str, port: int, key: asyncssh.SSHKey
    ) -> bool:
        # Called only when the key matched nothing trusted for this host.
        if self.link.node.host_key_policy != "accept-new":
            return False
        if self.link._known_keys(host, addr, port):
            return False  # a different key is recorded: that is a changed key, never accepted
        self.accepted = (host, port, key)
        return True


class SshLink(NodeLink):
    """The agent on a node reached with asyncssh, honouring the user's ~/.ssh/config."""

    kind = "ssh"

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
        self._conn: asyncssh.SSHClientConnection | None = None
        self._conn_lock = asyncio.Lock()
        self._force_upload = False
        self._resolved: tuple[str, int] | None = None
        self._opts: tuple[Any, asyncssh.SSHClientConnectionOptions] | None = None
        self._jump: SshLink | None = None

    def describe(self) -> str:
        return f"ssh {self.node.name}"

    # -- options ------------------------------------------------------------------------------
    def _ssh_config_paths(self) -> list[str]:
        path = self.node.ssh_config
        if path is not None:
            if not Path(path).is_file():
                raise LinkError("config", f"ssh_config {path} does not exist")
            return [path]
        default = Path("~/.ssh/config").expanduser()
        return [str(default)] if default.is_file() else []

    def _options(self) -> asyncssh.SSHClientConnectionOptions:
        """The node's options from the ssh config and the gpuctl settings, parsed once and kept
        while the ssh config files are unchanged (asyncssh re-reads the whole file per host)."""
        paths = self._ssh_config_paths()
        try:
            stamp = tuple((p, os.stat(p).st_mtime_ns) for p in paths)
        except OSError:
            stamp = ()
        if self._opts is not None and self._opts[0] == stamp:
            return self._opts[1]
        n = self.node
        kwargs: dict[str, Any] = {
            "config": paths,
            "host": n.name,
            "connect_timeout": n.connect_timeout,
            "login_timeout": n.connect_timeout,
            "keepalive_interval": n.keepalive_interval,
            "keepalive_count_max": n.keepalive_count_max,
        }
        if n.user:
            kwargs["username"] = n.user
        if n.port:
            kwargs["port"] = n.port
        if n.identity:
            kwargs["client_keys"] = [n.identity]
        if n.jump:
            kwargs["tunnel"] = n.jump
        try:
            with _filtered_configs(paths, n.name) as config:
                kwargs["config"] = config
                opts = asyncssh.SSHClientConnectionOptions(**kwargs)
        except FileNotFoundError as e:
            raise LinkError("config", f"cannot read {e.filename}: no such file") from None
        except (OSError, ValueError, asyncssh.Error) as e:
            raise LinkError("config", f"bad SSH settings: {e}") from None
        self._opts = (stamp, opts)
        return opts

    def _known_hosts_arg(self, opts: asyncssh.SSHClientConnectionOptions) -> Any:
        # Checking is never off: ``UserKnownHostsFile none`` or a missing file means "nothing is
        # known yet" (every host unknown), not "trust everything" as asyncssh would read None.
        files = [f for f in self._kh_files(opts) if Path(f).is_file()]
        return files or asyncssh.import_known_hosts("")

    def _kh_files(self, opts: asyncssh.SSHClientConnectionOptions) -> list[str]:
        if self.node.known_hosts:
            return [self.node.known_hosts]
        kh = opts.known_hosts
        if isinstance(kh, str):
            return [str(Path(kh).expanduser())]
        if isinstance(kh, Sequence) and kh and all(isinstance(k, str) for k in kh):
            return [str(Path(str(k)).expanduser()) for k in kh]
        return [self._default_kh()]

    @staticmethod
    def _default_kh() -> str:
        return str(Path("~/.ssh/known_hosts").expanduser())

    def known_hosts_files(self) -> list[str]:
        """The known_hosts files this node's host key is checked against (first: where
        accept-new records keys)."""
        if self.node.known_hosts:
            return [self.node.known_hosts]
        try:
            return self._kh_files(self._options())
        except LinkError:
            return [self._default_kh()]

    def _known_keys(self, host: str, addr: str, port: int) -> list[asyncssh.SSHKey]:
        files = [f for f in self.known_hosts_files() if Path(f).is_file()]
        keys: list[asyncssh.SSHKey] = []
        for f in files:
            with contextlib.suppress(Exception):
                found = asyncssh.match_known_hosts(f, host, addr, None if port == 22 else port)
                keys.extend(found[0])
        return keys

    # -- connection ---------------------------------------------------------------------------
    async def connection(self) -> asyncssh.SSHClientConnection:
        """The node's SSH connection, opened if needed. Raises LinkError."""
        async with self._conn_lock:
            conn = self._conn
            if conn is not None and not conn.is_closed():
                return conn
            self._conn = None
            opts = await asyncio.to_thread(self._options)  # parsing ssh_config is slow
            self._resolved = (str(opts.host), int(opts.port or 22))
            client = _Client(self)
            # asyncssh.connect() resets port and tunnel to its own arguments' defaults, and
            # would open a ProxyJump with the default ssh config: pass both, and open the jump
            # host ourselves (same ssh config, same host key policy, same error messages).
            jump = self.node.jump or opts.tunnel
            tunnel: Any = ()
            if isinstance(jump, str) and jump.lower() != "none":
                tunnel = await self._jump_connection(jump)
            try:
                conn = await asyncssh.connect(
                    self.node.name,
                    self.node.port or (),
                    tunnel=tunnel,
                    options=opts,
                    known_hosts=self._known_hosts_arg(opts),
                    client_factory=lambda: client,
                )
            except BaseException as e:
                if isinstance(e, asyncio.CancelledError | KeyboardInterrupt | SystemExit):
                    raise
                raise self._classify(e) from None
            if client.accepted is not None:
                self._record_host_key(*client.accepted)
            self._conn = conn
            return conn

    def _record_host_key(self, host: str, port: int, key: asyncssh.SSHKey) -> None:
        target = Path(self.known_hosts_files()[0])
        entry = host if port == 22 else f"[{host}]:{port}"
        line = f"{entry} {key.export_public_key('openssh').decode().strip()}\n"
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "a", encoding="utf-8") as f:
            f.write(line)
        log.warning("%s: accepted new host key for %s into %s", self.node.name, entry, target)

    def _where(self) -> tuple[str, int]:
        return self._resolved or (self.node.name, self.node.port or 22)

    def _classify(self, e: BaseException) -> LinkError:
        host, port = self._where()
        name = self.node.name
        at = f"{host}:{port}" if host == name else f"{name} ({host}:{port})"
        if isinstance(e, LinkError):
            return e
        if isinstance(e, asyncssh.HostKeyNotVerifiable):
            return self._host_key_error(host, port)
        if isinstance(e, asyncssh.PermissionDenied):
            user = self._user()
            return LinkError(
                "auth",
                f"{user}@{at} refused every key: check IdentityFile in the ssh config, "
                "or load a key with ssh-add",
            )
        if isinstance(e, socket.gaierror):
            return LinkError("dns", f"cannot resolve {host}: {e.strerror or e}")
        if isinstance(e, TimeoutError | asyncio.TimeoutError):
            return LinkError(
                "timeout", f"{at} did not answer within {self.node.connect_timeout:g} s"
            )
        if isinstance(e, ConnectionRefusedError):
            return LinkError("refused", f"{at} refused the connection (is sshd running there?)")
        if isinstance(e, OSError):
            if e.errno in (errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH):
                return LinkError("timeout", f"{at}: {e.strerror or e}")
            if isinstance(e, FileNotFoundError):
                return LinkError("config", f"cannot read {e.filename}: no such file")
            return LinkError("network", f"{at}: {e.strerror or e}")
        if isinstance(e, asyncssh.ConnectionLost):
            return LinkError("refused", f"{at} closed the connection during login")
        if isinstance(e, asyncssh.DisconnectError):
            return LinkError("refused", f"{at} disconnected: {e.reason}")
        if isinstance(e, asyncssh.Error | ValueError):
            return LinkError("config", f"{at}: {e}")
        return LinkError("network", f"{at}: {type(e).__name__}: {e}")

    def _user(self) -> str:
        if self.node.user:
            return self.node.user
        with contextlib.suppress(Exception):
            return str(self._options().username)
        return "?"

    def _host_key_error(self, host: str, port: int) -> LinkError:
        files = self.known_hosts_files()
        kh = files[0]
        entry = host if port == 22 else f"[{host}]:{port}"
        scan = f"ssh-keyscan{'' if port == 22 else f' -p {port}'} {host} >> {kh}"
        try:
            addr = socket.gethostbyname(host)
        except OSError:
            addr = host
        if self._known_keys(host, addr, port):
            return LinkError(
                "host_key",
                f"{self.node.name}: the host key of {entry} CHANGED (it is not the one in {kh}); "
                f"if the node was reinstalled, run: ssh-keygen -R '{entry}' -f {kh} && {scan}",
            )
        return LinkError(
            "host_key",
            f"{self.node.name}: unknown host key for {entry} (not in {', '.join(files)}); "
            f"to trust it, run: {scan}",
        )

    async def _jump_connection(self, spec: str) -> asyncssh.SSHClientConnection:
        """A connection to the jump host (``[user@]host[:port]``, chains ``a,b`` allowed)."""
        *before, last = [p.strip() for p in spec.split(",") if p.strip()]
        user, _, hostport = last.rpartition("@")
        host, _, port = hostport.partition(":")
        jump_node = replace(
            self.node,
            name=host,
            user=user or None,
            port=int(port) if port.isdigit() else None,
            identity=None,
            jump=",".join(before) or "none",
        )
        if self._jump is None or self._jump.node != jump_node:
            if self._jump is not None:
                await self._jump.aclose()
            self._jump = SshLink(jump_node, store=self.store)
        try:
            return await self._jump.connection()
        except LinkError as e:
            raise LinkError(
                e.reason, f"jump host {last} for {self.node.name}: {e.message}"
            ) from None

    async def aclose(self) -> None:
        """Close the SSH connection (the agent stops when its channel closes)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.wait_closed(), 5.0)
        if self._jump is not None:
            await self._jump.aclose()

    def forget_deploy(self) -> None:
        """The agent spoke another protocol: upload the bundle again on the next open."""
        self._force_upload = True

    # -- deploy and start ---------------------------------------------------------------------
    def _script(self) -> str:
        return "sh -c " + shlex.quote(
            agent_script(
                self.node, self.node.bundle_dir, self.store.name, self.seed, self.read_only
            )
        )

    async def open(self) -> AgentSession:
        conn = await self.connection()
        key = (self.node.cluster, self.node.bundle_dir)
        waited = False
        for _ in range(4):
            if self._force_upload:
                path = await self._bundle_path(conn)
                await self._upload(conn, path)
                self._force_upload = False
            proc, first = await self._start(conn)
            if not first.startswith(DEPLOY_TAG):
                return self._session(proc, first)
            word, _, rest = first[len(DEPLOY_TAG) :].decode(errors="replace").strip().partition(" ")
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
            if word != "missing" or not rest:
                raise LinkError("agent_crashed", f"unexpected deploy reply {first[:80]!r}")
            first_upload = self.store._first.get(key)
            if first_upload is not None and not waited and key not in self.store._unshared:
                waited = True
                with contextlib.suppress(Exception):
                    await asyncio.shield(first_upload)
                continue  # look again: on a shared home the file is there now
            if waited:
                self.store._unshared.add(key)
            await self._first_or_own_upload(conn, key, rest)
        raise LinkError("agent_crashed", f"the bundle did not stay in place on {self.node.name}")

    async def _first_or_own_upload(
        self, conn: asyncssh.SSHClientConnection, key: tuple[str, str], path: str
    ) -> None:
        fut: asyncio.Future[None] | None = None
        if key not in self.store._first:
            fut = asyncio.get_running_loop().create_future()
            self.store._first[key] = fut
        try:
            await self._upload(conn, path)
        finally:
            if fut is not None and not fut.done():
                fut.set_result(None)  # waiters wake and look again either way

    async def _bundle_path(self, conn: asyncssh.SSHClientConnection) -> str:
        bundle = f"{self.node.bundle_dir.rstrip('/')}/{self.store.name}"
        res = await conn.run(f"sh -c {shlex.quote('echo ' + remote_path(bundle))}", timeout=30)
        return str(res.stdout).strip()

    async def _upload(self, conn: asyncssh.SSHClientConnection, path: str) -> None:
        data = self.store.data
        folder = os.path.dirname(path)
        tmp = f"{folder}/.{os.path.basename(path)}.{uuid.uuid4().hex[:12]}.tmp"
        t0 = time.monotonic()
        try:
            async with conn.start_sftp_client() as sftp:
                # 0700: this folder holds code that runs as the user; nobody else may write
                await sftp.makedirs(
                    folder, attrs=asyncssh.SFTPAttrs(permissions=0o700), exist_ok=True
                )
                await _make_private(sftp, self.node.name, folder)
                async with sftp.open(tmp, "wb") as f:
                    await f.write(data)
                await sftp.chmod(tmp, 0o644)
                try:
                    await sftp.posix_rename(tmp, path)
                except asyncssh.SFTPOpUnsupported:
                    await sftp.rename(tmp, path)
        except (asyncssh.Error, OSError) as e:
            raise LinkError(
                "deploy", f"cannot upload the agent bundle to {self.node.name}:{path}: {e}"
            ) from None
        self.store.uploads.append((self.node.name, path))
        log.info(
            "%s: uploaded %s (%d bytes, %.2f s)",
            self.node.name,
            path,
            len(data),
            time.monotonic() - t0,
        )

    async def _start(self, conn: asyncssh.SSHClientConnection) -> tuple[Any, bytes]:
        try:
            proc = await conn.create_process(self._script(), encoding=None)
        except asyncssh.ChannelOpenError as e:
            raise LinkError("refused", f"{self.node.name} refused a session: {e.reason}") from None
        except (asyncssh.Error, OSError) as e:
            raise LinkError("closed", f"{self.node.name}: {e}") from None
        try:
            first: bytes = await proc.stdout.readline()
        except (asyncssh.Error, OSError) as e:
            proc.close()
            raise LinkError("closed", f"{self.node.name}: {e}") from None
        except asyncio.CancelledError:
            proc.close()  # the channel closes, and the agent with it
            raise
        if not first:
            err = b""
            with contextlib.suppress(Exception):
                err = await asyncio.wait_for(proc.stderr.read(4096), 2.0)
            proc.close()
            tail = err.decode(errors="replace").strip().splitlines()
            status = proc.exit_status
            detail = " | ".join(tail[-3:]) if tail else f"exit status {status}"
            raise LinkError("agent_crashed", f"agent on {self.node.name} exited: {detail}")
        return proc, first

    def _session(self, proc: Any, first: bytes) -> AgentSession:
        async def close() -> None:
            with contextlib.suppress(Exception):
                proc.stdin.write_eof()
            proc.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proc.wait_closed(), 3.0)

        reader = _ChannelReader(first, proc, self.node.name)
        session = AgentSession(reader, proc.stdin, close=close)
        reader.session = session
        task = asyncio.get_running_loop().create_task(_collect_stderr(proc.stderr, session))
        _keep.add(task)
        task.add_done_callback(_keep.discard)
        return session


_keep: set[asyncio.Task[None]] = set()


@contextlib.contextmanager
def _filtered_configs(paths: list[str], host: str) -> Iterator[list[str]]:
    """``paths`` with big ssh configs replaced by private copies holding only what concerns
    ``host`` (see ``ssh_config_for``); the copies are removed afterwards. Relative Include
    paths still work: asyncssh resolves them against ~/.ssh, not the file's folder."""
    made: list[str] = []
    out: list[str] = []
    try:
        for path in paths:
            text = ssh_config_for(path, host)
            if text is None:
                out.append(path)
                continue
            fd, tmp = tempfile.mkstemp(prefix="gpuctl-ssh-config-")  # 0600, private
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            made.append(tmp)
            out.append(tmp)
        yield out
    finally:
        for tmp in made:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


async def _make_private(sftp: Any, node: str, folder: str) -> None:
    """Make the bundle folder 0700 when it existed with a wider mode (created by hand, or as
    the parent of the job root). A shared folder (sticky, like /tmp) or one gpuctl may not
    change is refused when others can write it: they could replace the code the agent runs."""
    perms = (await sftp.stat(folder)).permissions or 0
    if not perms & 0o077:
        return
    if not perms & 0o1000:
        with contextlib.suppress(asyncssh.SFTPError):
            await sftp.chmod(folder, 0o700)
            return
    if perms & 0o022:
        raise LinkError(
            "deploy",
            f"{node}:{folder} is writable by others: set bundle_dir to a private folder",
        )


async def _collect_stderr(stream: Any, session: AgentSession) -> None:
    with contextlib.suppress(Exception):
        while True:
            line = await stream.readline()
            if not line:
                return
            session.stderr_tail.append(line.decode(errors="replace").rstrip()[: protocol.MAX_LINE])
            del session.stderr_tail[:-STDERR_KEPT]
