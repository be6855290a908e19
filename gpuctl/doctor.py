"""``gpuctl doctor``: every step gpuctl takes to reach a node, checked one by one, each answer one
line with what to do when it fails.

The checks take the same paths gpuctl does (the connection layer's option resolution, host keys,
pooled connection and launch; the real agent started by the real link; the Slurm client), so a
node that passes here works for ``gpuctl``, and one that fails says where and why:

============  ===============================================================================
login side    gpuctl and its Python, the config files read, the ``ssh`` client, Slurm's clients
ssh config    what ``ssh -G`` makes of the node: HostName, Port, User, ProxyJump, keys
host key      the node's key in known_hosts (and whether it still matches once connected)
login         a non-interactive login (keys or agent; a password is never asked)
login shell   nothing printed to stdout before a command runs (a banner breaks scp and
              sftp-server, and used to break gpuctl)
python        the node's ``python`` setting exists and is Python 3.6 or newer
bundle dir    the agent's folder on the node is the user's and private (0700)
agent         the agent starts and reads the GPUs: NVML or nvidia-smi, the driver's version
NVML          the agent reads through NVML, with which pynvml (bundled or the node's own);
              on the nvidia-smi fallback, why NVML could not be used
jobs VENV2    the Python jobs run in: the login side's minor version, with cloudpickle
Slurm         the node's state in Slurm (drained, down, ... with the reason)
============  ===============================================================================

A check that cannot run because an earlier one failed is ``skip`` with the reason. Nothing here
changes a node beyond what watching it does (the agent's bundle is deployed as ``gpuctl`` would).
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import asyncssh

from gpuctl import __version__
from gpuctl.config import Config, NodeConfig
from gpuctl.core.deadline import wait_for
from gpuctl.core.format import reader_text
from gpuctl.core.model import NodeInfo
from gpuctl.core.text import printable
from gpuctl.fleet.links import NodeLink
from gpuctl.fleet.session import LinkError
from gpuctl.fleet.ssh import BundleStore
from gpuctl.reach import launch
from gpuctl.reach.errors import RemoteError
from gpuctl.reach.files import remote_path
from gpuctl.reach.known_hosts import HostKeys, _scan, lookup
from gpuctl.reach.options import SshSettings, SshTarget, resolve, ssh_binary
from gpuctl.reach.pool import Holder, pool
from gpuctl.reach.slurm import SlurmClient, SlurmError

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
LOGIN = "login"  # the "node" of the checks about this machine
THIS_MACHINE = "(this machine)"  # the cluster of ``local_node``: gpuctl's own machine
NO_SLURM_CONF = "Could not establish a configuration source"  # sinfo without any slurm.conf
CONCURRENCY = 16
STEP_TIMEOUT = 60.0  # one remote command; a login has its own (ConnectTimeout)
AGENT_TIMEOUT = 60.0


@dataclass(frozen=True, slots=True)
class Check:
    """One answer: ``state`` is ok, warn (works, but something is off), fail, or skip (could
    not be checked: ``detail`` says why); ``fix`` says what to do when it is not ok."""

    node: str
    name: str
    state: str
    detail: str
    fix: str | None = None

    def to_json(self) -> dict[str, str | None]:
        """The check as a JSON object."""
        return {
            "node": self.node,
            "check": self.name,
            "state": self.state,
            "detail": self.detail,
            "fix": self.fix,
        }


def passed(checks: Iterable[Check]) -> bool:
    """True when no check failed or warned (skips do not count against it)."""
    return all(c.state in (OK, SKIP) for c in checks)


# -- the login side ------------------------------------------------------------------------------
def login_checks(config: Config, config_error: str | None = None) -> list[Check]:
    """gpuctl itself, the config files, the ssh client, Slurm's clients."""
    out = [
        Check(
            LOGIN,
            "gpuctl",
            OK,
            f"gpuctl {__version__} on Python {sys.version.split()[0]} ({sys.executable})",
        )
    ]
    if config_error is not None:
        out.append(Check(LOGIN, "config", FAIL, config_error, "fix the line it names"))
    elif not config.sources:
        out.append(
            Check(
                LOGIN,
                "config",
                OK,
                "no config file: gpuctl watches this machine only (gpuctl config init writes "
                "one, with the nodes from sinfo on a Slurm cluster)",
            )
        )
    else:
        n = len(config.nodes())
        out.append(
            Check(LOGIN, "config", OK, f"{', '.join(config.sources)}: {n} node(s) configured")
        )
    ssh = ssh_binary()
    if ssh is None:
        out.append(
            Check(
                LOGIN,
                "ssh client",
                WARN,
                "no ssh on PATH: the ssh config is read by asyncssh, which ignores "
                "StrictHostKeyChecking and HashKnownHosts",
                "install the OpenSSH client (apt install openssh-client / dnf install openssh)",
            )
        )
    else:
        version = _ssh_version(ssh)
        out.append(Check(LOGIN, "ssh client", OK, f"{ssh} ({version}): options as ssh -G says"))
    if shutil.which("sinfo") is None:
        out.append(Check(LOGIN, "Slurm", SKIP, "no Slurm clients here (sinfo is not on PATH)"))
    else:
        named = sorted({n.slurm_conf for n in config.nodes() if n.slurm_conf})
        confs: list[str | None] = [*named] if named else [None]
        for conf in confs:
            client = SlurmClient(conf, timeout=20)
            try:
                nodes = client.nodes()
            except SlurmError as e:
                if conf is None and NO_SLURM_CONF in str(e):
                    out.append(Check(LOGIN, "Slurm", SKIP, "Slurm clients, but no slurm.conf here"))
                else:
                    out.append(Check(LOGIN, "Slurm", FAIL, str(e), "scontrol ping says more"))
                continue
            where = f" ({conf})" if conf else ""
            out.append(Check(LOGIN, "Slurm", OK, f"sinfo answers{where}: {len(nodes)} node(s)"))
    return out


def _ssh_version(ssh: str) -> str:
    try:
        r = subprocess.run(
            [ssh, "-V"], capture_output=True, text=True, timeout=10, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired):
        return "version unknown"
    return (r.stderr or r.stdout).strip().split(",")[0] or "version unknown"


# -- one node ------------------------------------------------------------------------------------
class _NodeDoctor:
    """The checks of one node, in order; each later one skips when what it needs failed."""

    def __init__(self, node: NodeConfig, store: BundleStore, slurm: bool) -> None:
        self.node = node
        self.store = store
        self.slurm = slurm
        self.out: list[Check] = []
        self.holder = Holder()

    def add(self, name: str, state: str, detail: str, fix: str | None = None) -> Check:
        check = Check(self.node.name, name, state, printable(detail, limit=2000), fix)
        self.out.append(check)
        return check

    def skip(self, names: Sequence[str], why: str) -> None:
        for name in names:
            self.add(name, SKIP, why)

    async def run(self) -> list[Check]:
        if self.node.via == "ssh":
            await self._ssh()
        else:
            await self._agent(self._link(), "python")
            target = "local" if self.node.cluster == THIS_MACHINE else self.node.name
            self.skip(
                ["jobs VENV2"],
                f"reached via {self.node.via}: the jobs' Python answers "
                f"gpuctl submit --target {target} --wait -- python -V",
            )
        if self.slurm or self.node.slurm:
            await self._slurm_state()
        return self.out

    def _link(self) -> NodeLink:
        from gpuctl.fleet.build import link_for

        return link_for(self.node, store=self.store)

    # -- over SSH --------------------------------------------------------------------------------
    async def _ssh(self) -> None:
        rest = ["host key", "login", "login shell", "python", "bundle dir", "agent", "jobs VENV2"]
        try:
            target = await asyncio.to_thread(
                resolve, self.node.name, SshSettings.from_node(self.node)
            )
        except RemoteError as e:
            self.add("ssh config", FAIL, e.message, "fix the node's Host entry in the ssh config")
            self.skip(rest, "the ssh config cannot be read")
            return
        self.add("ssh config", OK, _describe(target))
        keys = await asyncio.to_thread(lookup, target)
        known = f"{keys.name} in {keys.where.get('trusted') or keys.where.get('ca')}"
        try:
            conn = await wait_for(pool().connect(target, self.holder), target.connect_timeout + 10)
        except RemoteError as e:
            e = e.for_node(self.node.name)
            if e.reason == "host_key":
                self.add("host key", FAIL, e.message)
                self.skip(rest[1:], "the host key is not trusted")
            else:
                self._host_key_before_login(keys, known, target)
                self.add("login", FAIL, e.message, _login_fix(e.reason, target))
                self.skip(rest[2:], "no login")
            return
        except TimeoutError:
            self._host_key_before_login(keys, known, target)
            self.add("login", FAIL, f"{target.describe()}: no answer", "is the node up?")
            self.skip(rest[2:], "no login")
            return
        try:
            if keys.trusted or keys.cas:
                self.add("host key", OK, f"{known} ({target.host_key_policy} checking)")
            else:
                self.add(
                    "host key",
                    WARN,
                    f"{keys.name} was not known: accept-new recorded it in "
                    f"{target.user_known_hosts[0] if target.user_known_hosts else '?'}",
                    "check its fingerprint with the node's administrator",
                )
            self.add("login", OK, f"{target.describe()} without a password")
            await self._on(conn, target)
        finally:
            pool().release(target, self.holder)

    def _host_key_before_login(self, keys: HostKeys, known: str, target: SshTarget) -> None:
        if keys.trusted or keys.cas:
            self.add("host key", OK, f"{known} (not yet compared: no login)")
        elif target.host_key_policy == "accept-new":
            self.add("host key", SKIP, f"{keys.name} is not known yet (accept-new records it)")
        else:
            into = target.user_known_hosts[0] if target.user_known_hosts else None
            self.add(
                "host key",
                FAIL,
                f"{keys.name} is not in {', '.join(keys.files) or 'any known_hosts file'}",
                "once its fingerprint is checked with the node's administrator, run: "
                + _scan(target, into or str(Path.home() / ".ssh" / "known_hosts")),
            )

    async def _on(self, conn: asyncssh.SSHClientConnection, target: SshTarget) -> None:
        later = ["python", "bundle dir", "agent", "jobs VENV2"]
        try:
            r = await launch.run(conn, "true", node=self.node.name, timeout=STEP_TIMEOUT)
        except RemoteError as e:
            self.add("login shell", FAIL, e.message)
            self.skip(later, "commands do not run")
            return
        if r.banner.strip():
            first = r.banner.decode(errors="replace").strip().splitlines()[0]
            self.add(
                "login shell",
                WARN,
                f"prints {len(r.banner)} bytes on stdout before any command: {first[:80]!r}",
                "print only in interactive shells (in ~/.bashrc: [ -t 1 ] || return, or "
                "case $- in *i*) ... esac): gpuctl skips it, scp and sftp-server do not",
            )
        else:
            self.add("login shell", OK, "prints nothing before a command runs")
        if not await self._python(conn):
            self.skip(later[1:], f"no usable {self.node.python}")
            return
        if await self._bundle_dir(conn):
            await self._agent(self._link(), None)
        else:
            self.skip(["agent"], "the agent's folder cannot be used")
        await self._venv2(conn)

    async def _run(
        self, conn: asyncssh.SSHClientConnection, script: str
    ) -> launch.RunResult | None:
        try:
            return await launch.run(conn, script, node=self.node.name, timeout=STEP_TIMEOUT)
        except RemoteError:
            return None

    async def _python(self, conn: asyncssh.SSHClientConnection) -> bool:
        py = self.node.python
        probe = "import sys; print('%d.%d.%d' % sys.version_info[:3]); print(sys.executable)"
        script = (
            f"PY={remote_path(py)}\n"
            'command -v "$PY" >/dev/null 2>&1 || exit 127\n'
            f'exec "$PY" -c {shlex.quote(probe)}'
        )
        r = await self._run(conn, script)
        fix = f'set python = "/path/to/python3" (3.6 or newer) for {self.node.name}'
        if r is None or r.status == 127:
            self.add("python", FAIL, f"no python at {py!r} on {self.node.name}", fix)
            return False
        words = r.stdout.decode(errors="replace").split()
        if r.status != 0 or not words:
            err = r.stderr.decode(errors="replace").strip().splitlines()
            said = err[-1] if err else f"exit status {r.status}"
            self.add("python", FAIL, f"{py} on {self.node.name} does not run: {said}", fix)
            return False
        version = tuple(int(x) for x in words[0].split(".")[:2] if x.isdigit())
        where = words[1] if len(words) > 1 else py
        if version < (3, 6):
            self.add("python", FAIL, f"{py} is Python {words[0]}: the agent needs 3.6+", fix)
            return False
        self.add("python", OK, f"{py} is Python {words[0]} ({where})")
        return True

    async def _bundle_dir(self, conn: asyncssh.SSHClientConnection) -> bool:
        """The agent's folder: True when gpuctl can use it (as it is, or made private)."""
        folder = self.node.bundle_dir
        probe = (
            "import os, sys, stat\n"
            "p = sys.argv[1]\n"
            "try:\n"
            "    st = os.stat(p)\n"
            "except OSError:\n"
            "    print('missing'); sys.exit(0)\n"
            "print(st.st_uid == os.getuid(), oct(stat.S_IMODE(st.st_mode)), st.st_uid,"
            " bool(st.st_mode & stat.S_ISVTX))\n"
        )
        script = (
            f"exec {remote_path(self.node.python)} -c {shlex.quote(probe)} {remote_path(folder)}"
        )
        r = await self._run(conn, script)
        words = r.stdout.decode(errors="replace").split() if r is not None else []
        fix = (
            f'set bundle_dir to a folder of yours (default "~/.cache/gpuctl") for {self.node.name}'
        )
        if not words:
            self.add("bundle dir", WARN, f"{folder}: could not look at it", None)
        elif words[0] == "missing":
            self.add("bundle dir", OK, f"{folder}: not there yet (gpuctl creates it, mode 0700)")
        elif words[0] != "True":
            self.add("bundle dir", FAIL, f"{folder} belongs to uid {words[2]}, not you", fix)
            return False
        elif words[1] == "0o700":
            self.add("bundle dir", OK, f"{folder}: yours, mode 0700")
        elif words[3] == "True" and int(words[1], 8) & 0o022:
            self.add("bundle dir", FAIL, f"{folder} is a shared folder others may write", fix)
            return False
        else:
            self.add(
                "bundle dir",
                WARN,
                f"{folder}: yours, mode {words[1][2:]}: others could replace the agent",
                f"chmod 700 {folder} (gpuctl does it when it deploys)",
            )
        return True

    async def _venv2(self, conn: asyncssh.SSHClientConnection) -> None:
        py = self.node.workload_python or "python3"
        want = f"{sys.version_info[0]}.{sys.version_info[1]}"
        probe = (
            "import sys; print('%d.%d.%d' % sys.version_info[:3])\n"
            "try:\n    import cloudpickle; print(cloudpickle.__version__)\n"
            "except Exception:\n    print('-')\n"
        )
        script = (
            f"PY={remote_path(py)}\n"
            'command -v "$PY" >/dev/null 2>&1 || exit 127\n'
            f'exec "$PY" -c {shlex.quote(probe)}'
        )
        r = await self._run(conn, script)
        words = r.stdout.decode(errors="replace").split() if r is not None else []
        env_fix = f"env=EnvSpec(python='{want}', ...) lets gpuctl build one on the node"
        if r is None or r.status != 0 or not words:
            self.add(
                "jobs VENV2",
                WARN,
                f"no python at {py!r} for jobs",
                f"set workload_python to a Python {want} with cloudpickle, or {env_fix}",
            )
            return
        have = ".".join(words[0].split(".")[:2])
        if have != want:
            self.add(
                "jobs VENV2",
                WARN,
                f"{py} is Python {words[0]}, this gpuctl runs {sys.version.split()[0]}: "
                "functions pickled here would not load there, so jobs are refused",
                f"set workload_python to a Python {want}, or {env_fix}",
            )
        elif len(words) < 2 or words[1] == "-":
            import cloudpickle

            self.add(
                "jobs VENV2",
                WARN,
                f"{py} (Python {words[0]}) has no cloudpickle",
                f"{py} -m pip install cloudpickle=={cloudpickle.__version__}",
            )
        else:
            self.add("jobs VENV2", OK, f"{py} is Python {words[0]} with cloudpickle {words[1]}")

    # -- the agent, whatever the link ------------------------------------------------------------
    async def _agent(self, link: NodeLink, python_check: str | None) -> None:
        try:
            session = await wait_for(link.open(), AGENT_TIMEOUT)
            try:
                info = await session.handshake(timeout=AGENT_TIMEOUT)
            finally:
                with contextlib.suppress(Exception):
                    await wait_for(session.close(), 10)
        except (LinkError, TimeoutError) as e:
            message = getattr(e, "message", None) or f"no answer in {AGENT_TIMEOUT:g} s"
            if python_check is not None:
                self.add(python_check, SKIP, "the agent did not start: see the next line")
            self.add("agent", FAIL, message)
            return
        finally:
            with contextlib.suppress(Exception):
                await link.aclose()
        if python_check is not None:
            self.add(python_check, OK, f"Python {info.python}")
        gpus = len(info.gpus)
        if info.reader is None:
            self.add(
                "agent",
                FAIL,
                f"the agent runs (Python {info.python}) but reads no GPU: {info.reader_error}",
                "install the NVIDIA driver (libnvidia-ml.so.1, nvidia-smi) on the node",
            )
            self.add("NVML", SKIP, "no GPU reader: see the line above")
        elif info.reader == "simulated":
            self.add("agent", OK, f"{gpus} simulated GPU(s) (Python {info.python})")
            self.add("NVML", SKIP, "simulated GPUs")
        else:
            how = "NVML" if info.reader == "nvml" else info.reader
            self.add("agent", OK, f"{gpus} GPU(s) through {how}, driver {info.driver or '?'}")
            self._nvml(info)

    def _nvml(self, info: NodeInfo) -> None:
        if info.reader == "nvml":
            self.add("NVML", OK, reader_text(info))
            return
        self.add(
            "NVML",
            WARN,
            f"{reader_text(info)}: a process per sample, no XID events",
            "make libnvidia-ml.so.1 loadable for the node's python3 (ldconfig -p | grep nvidia-ml)",
        )

    async def _slurm_state(self) -> None:
        if shutil.which("sinfo") is None:
            self.add("Slurm", SKIP, "no Slurm clients on this login node")
            return
        client = SlurmClient(self.node.slurm_conf, timeout=20)
        try:
            found = await client.nodes_async(names=[self.node.name])
        except SlurmError as e:
            if "not found" in str(e).lower() or "invalid node name" in str(e).lower():
                self.add("Slurm", SKIP, f"{self.node.name} is not a node of this Slurm")
            else:
                self.add("Slurm", FAIL, str(e), "scontrol ping says whether slurmctld answers")
            return
        if not found:
            self.add("Slurm", SKIP, f"{self.node.name} is not a node of this Slurm")
            return
        sn = found[0]
        why = f": {sn.reason}" if sn.reason else ""
        gpus = f", {sn.gpus} GPU(s) in its GRES" if sn.gpus else ""
        if sn.down:
            self.add(
                "Slurm",
                FAIL,
                f"Slurm has {self.node.name} {sn.state}{why}",
                f"scontrol update nodename={self.node.name} state=resume (an admin)",
            )
        elif sn.drained:
            self.add("Slurm", WARN, f"Slurm has {self.node.name} {sn.state}{why}", None)
        else:
            self.add("Slurm", OK, f"{sn.state} in {', '.join(sn.partitions) or '-'}{gpus}")


def _describe(t: SshTarget) -> str:
    jump = ",".join(t.proxy_jump) or "none"
    keys = ", ".join(t.identity_files) if not t.default_identities else "the default keys"
    agent = " and the agent" if t.identity_agent else ""
    return (
        f"HostName {t.hostname}, Port {t.port}, User {t.user}, ProxyJump {jump}, "
        f"keys: {keys}{agent} ({t.via})"
    )


def _login_fix(reason: str, t: SshTarget) -> str | None:
    return {
        "auth": f"ssh-copy-id {t.user}@{t.alias}, or IdentityFile in the ssh config, or ssh-add",
        "refused": "is sshd running there, on that port?",
        "timeout": "is the node up, and the port open from here?",
        "dns": "HostName in the ssh config, or /etc/hosts",
        "network": "is the node up, and the network between here and there?",
    }.get(reason)


async def run_doctor(
    nodes: Sequence[NodeConfig], *, slurm: bool = False, concurrency: int = CONCURRENCY
) -> list[Check]:
    """Check every node (``concurrency`` at a time), and each node's Slurm state when ``slurm``;
    the checks come back node by node, each node's in order. Never raises for a node's failure:
    it is a check."""
    store = BundleStore()
    sem = asyncio.Semaphore(concurrency)

    async def one(node: NodeConfig) -> list[Check]:
        async with sem:
            try:
                return await _NodeDoctor(node, store, slurm).run()
            except Exception as e:  # a bug in a check must not hide the other nodes
                return [Check(node.name, "doctor", FAIL, f"{type(e).__name__}: {e}")]

    results = await asyncio.gather(*(one(n) for n in nodes))
    await pool().aclose()
    return [c for r in results for c in r]


def local_node() -> NodeConfig:
    """This machine, as ``gpuctl`` watches it when nothing is configured."""
    return NodeConfig(name="localhost", cluster=THIS_MACHINE, via="local", python=sys.executable)
