"""Real OpenSSH servers on 127.0.0.1, one per test "node".

``SshCluster(tmpdir)`` makes one client key and, per node, a host key and a private
``sshd_config``; ``start_node(name)`` runs ``/usr/sbin/sshd -D`` on a free port and adds the node
to an OpenSSH ``ssh_config`` (``Host <name>``) and to ``known_hosts``. Both files work for the
``ssh`` command and for ``asyncssh.connect(name, config=[ssh_config], known_hosts=...)``.

Every session on a node carries ``GPUCTL_NODE=<name>``, ``GPUCTL_SIMULATE=<spec>`` and a private
marker in its environment (sshd ``SetEnv``), so a test can tell nodes apart and ``kill()`` finds
every process a node started, even those that left sshd's process tree.

Things to know when writing tests against these nodes:
- All nodes log in as the current user (root in CI) and share one home (``SshCluster.home``, a
  folder of the test's own set as ``$HOME`` by sshd), like a cluster with a shared home: a bundle
  uploaded to one node is there for all of them, and nothing lands in the real home.
- Sessions run the user's login shell with ``SHLVL=1`` set by sshd, so bash skips ~/.bashrc
  (root's here runs ``pyenv init``: 0.1 s per session, and a killed ``pyenv rehash`` left a lock
  that stalled every later shell for 60 s). ``start_node(..., rc_files=True)`` keeps the rc files.
- ``python3`` on a node is whatever sshd's default PATH finds (/usr/local/bin, /usr/bin), unless
  ``start_node(python=PATH)`` puts PATH first as ``python3`` (also ``$GPUCTL_PYTHON``). For a
  gpuctl config, ``write_config(..., python=...)`` sets it per cluster and
  ``overrides={"node2": {"python": ...}}`` per node.
- ``kill()`` is SIGKILL of sshd and of every session process (a vanished node); ``restart()``
  comes back on the same port with the same host key; ``rotate_host_key()`` does not touch
  known_hosts (``trust_host_key()`` does).
- A node's "login shell" can be made another one, and chatty: ``start_node(login_shell="tcsh",
  banner="Welcome ...")``. sshd's ``ForceCommand`` runs a wrapper that prints the banner (on
  stdout and stderr, like an ``echo`` in ``.bashrc``) and then runs the client's command
  (``$SSH_ORIGINAL_COMMAND``) with ``<login_shell> -c``, as sshd would with that login shell.
  The SFTP subsystem is the external ``sftp-server`` started by that wrapper, like on a real
  cluster; ``sftp_banner=True`` prints the banner before it too (a hostile ``.bashrc`` that
  breaks SFTP).
"""

from __future__ import annotations

import atexit
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
import uuid
import weakref
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gpuctl_tests.harness import (
    HarnessError,
    clear_pyenv_lock_after_kill,
    cmdline,
    descendants,
    is_alive,
    kill_pids,
    log_tail,
    pids_with_env,
    wait_gone,
)

SSHD = "/usr/sbin/sshd"
SFTP_SERVER = "/usr/lib/openssh/sftp-server"
SSH_KEYGEN = "ssh-keygen"
START_TIMEOUT = 10.0
# The PATH sshd gives a session (its default for root; a superset of the one for users).
NODE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


_LIVE: weakref.WeakSet[SshCluster] = weakref.WeakSet()


@atexit.register
def _stop_leftovers() -> None:
    # a test run cut short (Ctrl-C twice, pytest -x inside a fixture) still leaves no sshd
    for cluster in list(_LIVE):
        cluster.stop_all()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def missing_parts() -> str | None:
    """Why real sshd cannot run here, or None when it can."""
    if not Path(SSHD).exists():
        return f"{SSHD} missing (apt-get install openssh-server)"
    for tool in (SSH_KEYGEN, "ssh"):
        if shutil.which(tool) is None:
            return f"{tool} missing (apt-get install openssh-client)"
    privsep = Path("/run/sshd")
    if not privsep.is_dir():
        try:
            privsep.mkdir(mode=0o755, parents=True, exist_ok=True)
        except OSError as e:
            return f"sshd needs /run/sshd and it cannot be created: {e.strerror}"
    return None


def keygen(path: Path, comment: str) -> str:
    """Write a new ed25519 key without passphrase at ``path``; returns the public key line."""
    for p in (path, path.with_name(path.name + ".pub")):
        p.unlink(missing_ok=True)
    subprocess.run(
        [SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=30,
    )
    return path.with_name(path.name + ".pub").read_text().strip()


def _setenv_value(name: str, value: str) -> str:
    if any(c in value for c in '"\n\\'):
        raise ValueError(f"sshd SetEnv cannot carry {name}={value!r}")
    return f'"{name}={value}"'


class SshNode:
    """One real sshd on 127.0.0.1: a "node" the client reaches as ``Host <name>``."""

    def __init__(
        self,
        cluster: SshCluster,
        name: str,
        port: int,
        simulate: str | None,
        python: str | None,
        env: Mapping[str, str],
        rc_files: bool = False,
        login_shell: str | None = None,
        banner: str | None = None,
        sftp_banner: bool = False,
    ) -> None:
        self.cluster = cluster
        self.login_shell = login_shell
        self.banner = banner
        self.sftp_banner = sftp_banner
        self.name = name
        self.port = port
        self.simulate = simulate
        self.python = python
        self.dir = cluster.dir / "nodes" / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.host_key_path = self.dir / "ssh_host_ed25519_key"
        self.config_path = self.dir / "sshd_config"
        self.log_path = self.dir / "sshd.log"
        self.pid_path = self.dir / "sshd.pid"
        # Every session of this node carries this in its environment; kill() looks for it.
        self.marker = f"GPUCTL_TEST_SSHD={uuid.uuid4().hex}"
        # a /tmp of its own: what a node's processes leave there stays in the test's folder
        self.tmp = self.dir / "tmp"
        self.tmp.mkdir(exist_ok=True)
        self.env: dict[str, str] = {
            "GPUCTL_NODE": name,
            "TMPDIR": str(self.tmp),
            "HOME": str(cluster.home),
        }
        if simulate is not None:
            self.env["GPUCTL_SIMULATE"] = str(simulate)
        if not rc_files:
            # bash reads ~/.bashrc when started by sshd, unless it is not a top-level shell.
            # Root's ~/.bashrc here runs `pyenv init` (0.1 s per session, and a session killed
            # during its `pyenv rehash` leaves a lock that stalls every later shell for 60 s).
            self.env["SHLVL"] = "1"
        if python is not None:
            # "python3" on this node is ``python``: first on the PATH of its sessions.
            bindir = self.dir / "bin"
            bindir.mkdir(exist_ok=True)
            # A wrapper, not a symlink: a venv's python found through a symlink in another
            # folder loses its venv (pyvenv.cfg is looked up beside the path it was run as).
            link = bindir / "python3"
            link.unlink(missing_ok=True)
            link.write_text(f'#!/bin/sh\nexec "{python}" "$@"\n')
            link.chmod(0o755)
            self.env["PATH"] = f"{bindir}:{NODE_PATH}"
            self.env["GPUCTL_PYTHON"] = python
        self.env.update(env)
        self.login_path: Path | None = None
        if login_shell is not None or banner is not None or sftp_banner:
            self.login_path = self.dir / "login"
            self._write_login()
        self.host_key = keygen(self.host_key_path, f"gpuctl-test-host-{name}")
        self.host_cert_path: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.start_seconds: float | None = None

    def _write_login(self) -> None:
        """The ForceCommand wrapper: the banner, then the command under the login shell."""
        assert self.login_path is not None
        shell = shutil.which(self.login_shell or "bash")
        if shell is None:
            raise HarnessError(f"login shell {self.login_shell} missing (apt-get install it)")
        say = ""
        if self.banner is not None:
            say = f"printf '%s\\n' {_sh_quote(self.banner)}\n"
            say += f"printf '%s\\n' {_sh_quote(self.banner)} >&2\n"
        sftp_say = say if self.sftp_banner else ""
        self.login_path.write_text(
            "#!/bin/sh\n"
            "# gpuctl test node: what a login shell with a chatty rc file does with a command\n"
            'case "$SSH_ORIGINAL_COMMAND" in\n'
            f"*sftp-server*|internal-sftp)\n{sftp_say}    exec {SFTP_SERVER} ;;\n"
            "esac\n"
            f"{say}"
            f"SHELL={shell}; export SHELL\n"
            f'exec {shell} -c "$SSH_ORIGINAL_COMMAND"\n'
        )
        self.login_path.chmod(0o755)

    # --- lifecycle -------------------------------------------------------------------------

    def _write_config(self) -> None:
        name, value = self.marker.split("=", 1)
        setenv = " ".join(_setenv_value(k, v) for k, v in {**self.env, name: value}.items())
        lines = [
            f"Port {self.port}",
            "ListenAddress 127.0.0.1",
            f"HostKey {self.host_key_path}",
            f"AuthorizedKeysFile {self.cluster.authorized_keys_path}",
            f"PidFile {self.pid_path}",
            "StrictModes no",
            "UsePAM no",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PubkeyAuthentication yes",
            "PermitRootLogin prohibit-password",
            f"Subsystem sftp {SFTP_SERVER if self.login_path else 'internal-sftp'}",
            "AcceptEnv GPUCTL_*",
            f"SetEnv {setenv}",
            "MaxSessions 100",
            "MaxStartups 200",
            "PrintMotd no",
            "PrintLastLog no",
            "UseDNS no",
            "LogLevel INFO",
        ]
        if self.login_path is not None:
            lines.append(f"ForceCommand {self.login_path}")
        if self.host_cert_path is not None:
            lines.append(f"HostCertificate {self.host_cert_path}")
        self.config_path.write_text("\n".join(lines) + "\n")

    def start(self, timeout: float = START_TIMEOUT) -> None:
        """Run sshd and wait until it listens; raises HarnessError with its log tail if not."""
        if self.running:
            return
        self._write_config()
        self.log_path.unlink(missing_ok=True)
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [SSHD, "-D", "-f", str(self.config_path), "-E", str(self.log_path)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        if self not in self.cluster._started:
            self.cluster._started.append(self)
        deadline = t0 + timeout
        while True:
            log = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
            if "Server listening on" in log:
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                why = "exited" if self.proc.poll() is not None else f"not listening in {timeout} s"
                self._reap(signal.SIGKILL)
                raise HarnessError(
                    f"sshd for node {self.name} on port {self.port} {why}:\n"
                    + log_tail(self.log_path)
                )
            time.sleep(0.005)  # poll interval; the deadline decides
        self.starts += 1
        self.start_seconds = time.monotonic() - t0

    @property
    def running(self) -> bool:
        """True while this node's sshd listener is alive."""
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The sshd listener's process id, or None when it is not running."""
        return self.proc.pid if self.running and self.proc else None

    def processes(self) -> set[int]:
        """Every live process of this node: sshd, its connection children and their sessions."""
        roots = [self.proc.pid] if self.proc is not None else []
        found = descendants(roots) | pids_with_env(self.marker)
        return {p for p in found if is_alive(p)}

    def _reap(self, sig: int) -> None:
        pids = self.processes()
        cmdlines = [cmdline(p) for p in pids]
        # sshd first: a vanished node says nothing more, while a session's sshd that outlived
        # its program for a moment would still send the client that program's exit signal
        daemons = {p for p, c in zip(pids, cmdlines, strict=True) if c.startswith(("sshd", SSHD))}
        kill_pids(daemons, sig)
        kill_pids(pids, sig)
        if self.proc is not None:
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        left = wait_gone(pids, 5)
        if left:
            kill_pids(left, signal.SIGKILL)
            wait_gone(left, 5)
        clear_pyenv_lock_after_kill(cmdlines)

    def kill(self) -> None:
        """SIGKILL sshd and everything its sessions started: the node vanishes mid-stream."""
        self._reap(signal.SIGKILL)

    def stop(self) -> None:
        """SIGTERM sshd and its sessions, SIGKILL what remains."""
        self._reap(signal.SIGTERM)

    def restart(self) -> None:
        """Kill the node (if running) and start it again on the same port with the same key."""
        self.kill()
        self.start()

    def rotate_host_key(self) -> str:
        """Give the node a new host key and restart it; known_hosts keeps the old key, so a
        client that checks host keys must refuse this node. Returns the new public key line."""
        self.kill()
        self.host_key = keygen(self.host_key_path, f"gpuctl-test-host-{self.name}-rotated")
        self.start()
        return self.host_key

    def certify_host_key(self, ca_key: Path, principals: str = "127.0.0.1") -> Path:
        """Sign the node's host key with the CA private key ``ca_key`` (``ssh-keygen -s -h``),
        make sshd present the certificate and restart. Returns the certificate's path."""
        pub = self.host_key_path.with_name(self.host_key_path.name + ".pub")
        ident = f"gpuctl-test-{self.name}"
        subprocess.run(
            [SSH_KEYGEN, "-q", "-s", str(ca_key), "-I", ident, "-h", "-n", principals, str(pub)],
            check=True,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=30,
        )
        self.host_cert_path = self.host_key_path.with_name(self.host_key_path.name + "-cert.pub")
        self.kill()
        self.start()
        return self.host_cert_path

    def trust_host_key(self) -> None:
        """Put the node's current host key in known_hosts (after ``rotate_host_key``)."""
        self.cluster._write_known_hosts()

    @property
    def known_hosts_line(self) -> str:
        """This node's line for an OpenSSH known_hosts file."""
        keytype, key = self.host_key.split()[:2]
        return f"[127.0.0.1]:{self.port} {keytype} {key}"

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<SshNode {self.name} 127.0.0.1:{self.port} {state}>"


class SshCluster:
    """Real sshd "nodes" on 127.0.0.1 plus the client files to reach them.

    Attributes: ``ssh_config_path``, ``known_hosts_path``, ``client_key_path``, ``user``,
    ``home`` (the real home of ``user``: all nodes share it, like a cluster's shared home),
    ``nodes`` (name -> SshNode).
    """

    def __init__(self, tmpdir: str | os.PathLike[str]) -> None:
        reason = missing_parts()
        if reason:
            raise HarnessError(reason)
        self.dir = Path(tmpdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        # the account sshd logs us in as: from the uid, not from $USER (CI may set that oddly)
        entry = pwd.getpwuid(os.getuid())
        self.user = entry.pw_name
        # The nodes' home, shared by all of them like a cluster's shared home: a folder of the
        # test's own (sshd's SetEnv HOME wins over the account's), so that what gpuctl leaves
        # in a node's ~ (the agent bundle, job folders) never lands in the real one.
        self.home = self.dir / "home"
        self.home.mkdir(mode=0o700, exist_ok=True)
        self.client_key_path = self.dir / "id_ed25519"
        self.authorized_keys_path = self.dir / "authorized_keys"
        self.ssh_config_path = self.dir / "ssh_config"
        self.known_hosts_path = self.dir / "known_hosts"
        client_pub = keygen(self.client_key_path, "gpuctl-test-client")
        self.authorized_keys_path.write_text(client_pub + "\n")
        self.nodes: dict[str, SshNode] = {}
        self._started: list[SshNode] = []
        _LIVE.add(self)
        self._write_ssh_config()
        self._write_known_hosts()

    # --- nodes -----------------------------------------------------------------------------

    def start_node(
        self,
        name: str,
        *,
        simulate: str | int | None = "4",
        python: str | None = None,
        env: Mapping[str, str] | None = None,
        port: int | None = None,
        rc_files: bool = False,
        login_shell: str | None = None,
        banner: str | None = None,
        sftp_banner: bool = False,
    ) -> SshNode:
        """Start a node named ``name`` (its ``Host`` alias) and add it to ssh_config and
        known_hosts. ``simulate`` goes to the node's sessions as ``GPUCTL_SIMULATE``, ``env`` as
        further variables; ``python`` is put first on the node's PATH as ``python3``.
        Sessions skip the user's shell rc files (~/.bashrc) unless ``rc_files``.
        ``login_shell`` (e.g. "tcsh"), ``banner`` and ``sftp_banner``: see the module doc."""
        node = self._launch(
            name, simulate, python, env, port, rc_files, login_shell, banner, sftp_banner
        )
        self._register([node])
        return node

    def start_nodes(self, names: Iterable[str], **kwargs: Any) -> list[SshNode]:
        """Start several nodes with the same options (see ``start_node``), in parallel."""
        names = list(names)
        if len(set(names)) != len(names):
            raise ValueError("node names repeat")
        with ThreadPoolExecutor(max_workers=min(16, max(1, len(names)))) as pool:
            futures = [pool.submit(self._launch, n, **kwargs) for n in names]
            nodes = []
            errors = []
            for f in futures:
                try:
                    nodes.append(f.result())
                except (HarnessError, ValueError) as e:
                    errors.append(e)
        self._register(nodes)
        if errors:
            raise errors[0]
        return nodes

    def _launch(
        self,
        name: str,
        simulate: str | int | None = "4",
        python: str | None = None,
        env: Mapping[str, str] | None = None,
        port: int | None = None,
        rc_files: bool = False,
        login_shell: str | None = None,
        banner: str | None = None,
        sftp_banner: bool = False,
    ) -> SshNode:
        if name in self.nodes:
            raise ValueError(f"node {name} exists already")
        if not name or any(c.isspace() or c in "*?!,[]#\"'" for c in name):
            raise ValueError(f"bad node name {name!r}")
        sim = None if simulate is None else str(simulate)
        for attempt in range(5):
            node = SshNode(
                self,
                name,
                port or free_port(),
                sim,
                python,
                dict(env or {}),
                rc_files,
                login_shell,
                banner,
                sftp_banner,
            )
            try:
                node.start()
                return node
            except HarnessError as e:
                # another process took the free port between the probe and sshd's bind
                if port is not None or "Bind to port" not in str(e) or attempt == 4:
                    raise
        raise AssertionError("unreachable")

    def _register(self, nodes: Iterable[SshNode]) -> None:
        for node in nodes:
            self.nodes[node.name] = node
        self._write_ssh_config()
        self._write_known_hosts()

    def __getitem__(self, name: str) -> SshNode:
        return self.nodes[name]

    def stop_all(self) -> None:
        """Kill every sshd this cluster started and every process their sessions left."""
        for node in self._started:
            node.kill()

    def processes(self) -> set[int]:
        """Live processes of all nodes (empty after ``stop_all``)."""
        found: set[int] = set()
        for node in self._started:
            found |= node.processes()
        return found

    # --- client files ----------------------------------------------------------------------

    def _write_ssh_config(self) -> None:
        out = [
            "# written by gpuctl_tests.harness.sshd",
        ]
        for node in self.nodes.values():
            out += [
                f"Host {node.name}",
                "    HostName 127.0.0.1",
                f"    Port {node.port}",
                f"    User {self.user}",
                f"    IdentityFile {self.client_key_path}",
                "    IdentitiesOnly yes",
                f"    UserKnownHostsFile {self.known_hosts_path}",
                "    GlobalKnownHostsFile /dev/null",
                "    StrictHostKeyChecking yes",
                "    BatchMode yes",
                "    ConnectTimeout 10",
                "",
            ]
        tmp = self.ssh_config_path.with_suffix(".tmp")
        tmp.write_text("\n".join(out) + "\n")
        tmp.replace(self.ssh_config_path)

    def _write_known_hosts(self) -> None:
        lines = [n.known_hosts_line for n in self.nodes.values()]
        tmp = self.known_hosts_path.with_suffix(".tmp")
        tmp.write_text("".join(line + "\n" for line in lines))
        tmp.replace(self.known_hosts_path)

    def ssh_argv(self, name: str, *command: str) -> list[str]:
        """argv for the real OpenSSH client to run ``command`` on node ``name``."""
        return ["ssh", "-F", str(self.ssh_config_path), name, *command]

    def ssh(
        self, name: str, *command: str, timeout: float = 30
    ) -> subprocess.CompletedProcess[str]:
        """Run ``command`` on node ``name`` with the real ``ssh`` client (not checked)."""
        return subprocess.run(
            self.ssh_argv(name, *command),
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=timeout,
        )

    # --- gpuctl config ---------------------------------------------------------------------

    def cluster_toml(
        self,
        cluster: str = "test",
        nodes: Iterable[str] | str | None = None,
        *,
        overrides: Mapping[str, Mapping[str, Any]] | None = None,
        **keys: Any,
    ) -> str:
        """One ``[clusters.<cluster>]`` table for ``nodes`` (default: every node started).

        ``via``, ``ssh_config`` and ``known_hosts`` are filled in; ``keys`` add or override
        (``simulate=4``, ``python="..."``, ``interval=0.2``); a value of None leaves a key out.
        ``overrides`` maps a node hostlist to per-node keys (``[clusters.C.override."node2"]``).
        """
        if nodes is None:
            names = list(self.nodes)
        elif isinstance(nodes, str):
            names = [nodes]
        else:
            names = list(nodes)
        import hostlist  # python-hostlist

        table: dict[str, Any] = {
            "nodes": hostlist.collect_hostlist(names) if names else "",
            "via": "ssh",
            "ssh_config": str(self.ssh_config_path),
            "known_hosts": str(self.known_hosts_path),
        }
        table.update(keys)
        body = "".join(f"{k} = {toml_value(v)}\n" for k, v in table.items() if v is not None)
        text = f"[clusters.{toml_key(cluster)}]\n{body}"
        for pattern, values in (overrides or {}).items():
            text += f"\n[clusters.{toml_key(cluster)}.override.{toml_value(pattern)}]\n"
            text += "".join(f"{k} = {toml_value(v)}\n" for k, v in values.items() if v is not None)
        return text

    def write_config(
        self,
        path: str | os.PathLike[str],
        *,
        cluster: str = "test",
        nodes: Iterable[str] | str | None = None,
        overrides: Mapping[str, Mapping[str, Any]] | None = None,
        extra: str = "",
        **keys: Any,
    ) -> Path:
        """Write a gpuctl ``config.toml`` with one cluster of these nodes (see
        ``cluster_toml``); ``extra`` is appended verbatim (more tables). Returns the path."""
        text = self.cluster_toml(cluster, nodes, overrides=overrides, **keys)
        if extra:
            text += "\n" + extra.rstrip("\n") + "\n"
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        return p

    def __enter__(self) -> SshCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()


def _sh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def toml_key(key: str) -> str:
    """A TOML key, quoted unless bare."""
    if key and all(c.isalnum() or c in "-_" for c in key):
        return key
    return toml_value(key)


def toml_value(value: Any) -> str:
    """A TOML literal for str, bool, int, float, Path, list or dict (inline table)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, str):
        escaped = (
            value.replace("\\", "\\\\")
            .replace('"', '\\"')
            .replace("\n", "\\n")
            .replace("\t", "\\t")
        )
        return f'"{escaped}"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no TOML form for {value!r}")
