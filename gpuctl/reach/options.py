"""SSH options for a host, resolved once, the way ``ssh -G`` resolves them.

OpenSSH itself does the resolving: ``ssh -G -F <wrapper> [-o ...] -- <host>``, where the small
private wrapper file ``Include``s the user's config (the node's ``ssh_config`` setting, else
``~/.ssh/config``) and then the system's (``/etc/ssh/ssh_config``, or
``$GPUCTL_SSH_SYSTEM_CONFIG``), which is the order ``ssh`` reads them in without ``-F``. So
Host and Match blocks, Include, first-value-wins, ProxyJump, % tokens and every later OpenSSH
feature behave exactly as they do for the user's own ``ssh``; gpuctl parses the ``keyword
value`` lines ``-G`` prints into an ``SshTarget``. gpuctl's per-node settings (``SshSettings``)
go on that command line as ``-o`` options: like the user's own ``ssh -o``, they win when set,
and say nothing when unset.

The wrapper ends with a ``Host *`` block holding gpuctl's fallbacks (what applies when neither
gpuctl nor any ssh config says anything): ``ConnectTimeout 15``, ``ServerAliveInterval 5``, and
``UserKnownHostsFile`` under ``$HOME`` (``ssh`` itself would take the passwd entry's home, which
is not the home gpuctl, its tests and its users' ``~`` see).

Results are cached per (host, settings, config files and their modification times). Without an
``ssh`` binary, asyncssh's own parser stands in (no ``StrictHostKeyChecking`` there: the
``host_key_policy`` setting, else strict).
"""

from __future__ import annotations

import atexit
import getpass
import glob
import hashlib
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuctl.reach.errors import RemoteError

if TYPE_CHECKING:
    from gpuctl.config import NodeConfig

SYSTEM_CONFIG_ENV = "GPUCTL_SSH_SYSTEM_CONFIG"
DEFAULT_SYSTEM_CONFIG = "/etc/ssh/ssh_config"
FALLBACK_CONNECT_TIMEOUT = 15
FALLBACK_KEEPALIVE_INTERVAL = 5
SSH_G_TIMEOUT = 30.0
HOST_KEY_POLICIES = ("strict", "accept-new")
# OpenSSH's words for StrictHostKeyChecking, as ``ssh -G`` prints them, to gpuctl's.
_STRICT_WORDS = {"true": "yes", "yes": "yes", "false": "no", "no": "no", "ask": "ask"}
_BAD_NAME = re.compile(r"[\s\x00-\x1f\x7f\"'\\]")


@dataclass(frozen=True, slots=True)
class SshSettings:
    """gpuctl's own SSH settings for one node: each acts like an ``ssh -o`` option, winning over
    the ssh config when set and saying nothing when None."""

    ssh_config: str | None = None  # the user's ssh config file; None: ~/.ssh/config
    user: str | None = None
    port: int | None = None
    identity: str | None = None
    jump: str | None = None  # ProxyJump: "[user@]host[:port][,...]" or "none"
    connect_timeout: float | None = None
    keepalive_interval: float | None = None
    keepalive_count_max: int | None = None
    known_hosts: str | None = None  # UserKnownHostsFile
    host_key_policy: str | None = None  # "strict" | "accept-new"; None: StrictHostKeyChecking

    @classmethod
    def from_node(cls, node: NodeConfig) -> SshSettings:
        """The settings of a configured node."""
        return cls(
            ssh_config=node.ssh_config,
            user=node.user,
            port=node.port,
            identity=node.identity,
            jump=node.jump,
            connect_timeout=node.connect_timeout,
            keepalive_interval=node.keepalive_interval,
            keepalive_count_max=node.keepalive_count_max,
            known_hosts=node.known_hosts,
            host_key_policy=node.host_key_policy,
        )

    def for_hop(self, user: str | None, port: int | None, jump: str | None) -> SshSettings:
        """The settings for a jump host: the same ssh config, timeouts and host key policy, but
        not the node's own user, port, key or jump (``ssh`` does not pass ``-o`` on either)."""
        return replace(self, user=user, port=port, identity=None, jump=jump)

    def ssh_options(self) -> list[tuple[str, str]]:
        """These settings as ``ssh -o`` keyword/value pairs (only those that are set)."""
        out: list[tuple[str, str]] = []
        if self.user is not None:
            out.append(("User", self.user))
        if self.port is not None:
            out.append(("Port", str(self.port)))
        if self.identity is not None:
            out.append(("IdentityFile", os.path.expanduser(self.identity)))
        if self.jump is not None:
            out.append(("ProxyJump", self.jump))
        if self.connect_timeout is not None:
            out.append(("ConnectTimeout", str(max(1, round(self.connect_timeout)))))
        if self.keepalive_interval is not None:
            out.append(("ServerAliveInterval", str(round(self.keepalive_interval))))
        if self.keepalive_count_max is not None:
            out.append(("ServerAliveCountMax", str(self.keepalive_count_max)))
        if self.known_hosts is not None:
            out.append(("UserKnownHostsFile", os.path.expanduser(self.known_hosts)))
        if self.host_key_policy is not None:
            if self.host_key_policy not in HOST_KEY_POLICIES:
                raise RemoteError(
                    "config",
                    f"host_key_policy {self.host_key_policy!r}: use one of "
                    + ", ".join(HOST_KEY_POLICIES),
                )
            strict = "yes" if self.host_key_policy == "strict" else "accept-new"
            out.append(("StrictHostKeyChecking", strict))
        return out


@dataclass(frozen=True, slots=True)
class SshTarget:
    """Everything needed to connect to one host, as ``ssh`` would (values, no I/O).

    Paths are absolute (``~`` and % tokens expanded). ``proxy_jump`` lists the hops first to
    last; ``strict_host_key_checking`` is OpenSSH's word (yes, ask, accept-new, no).
    """

    alias: str  # the name asked for: the node's name, or a jump host's
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...] = ()
    identities_only: bool = False
    identity_agent: str | None = None  # agent socket; None: no agent
    certificate_files: tuple[str, ...] = ()
    proxy_jump: tuple[str, ...] = ()
    proxy_command: str | None = None  # tokens expanded; run by /bin/sh
    connect_timeout: float = FALLBACK_CONNECT_TIMEOUT
    server_alive_interval: float = FALLBACK_KEEPALIVE_INTERVAL
    server_alive_count_max: int = 3
    user_known_hosts: tuple[str, ...] = ()
    global_known_hosts: tuple[str, ...] = ()
    strict_host_key_checking: str = "ask"
    host_key_alias: str | None = None
    hash_known_hosts: bool = False
    ciphers: tuple[str, ...] | None = None  # None: the config chose none (OpenSSH's default)
    default_identities: bool = True  # identity_files are OpenSSH's defaults, none configured
    settings: SshSettings = field(default_factory=SshSettings)  # hops are resolved with these
    via: str = "ssh -G"  # or "asyncssh" (no ssh binary here)

    @property
    def host_key_policy(self) -> str:
        """``strict`` (StrictHostKeyChecking yes or ask: gpuctl cannot ask) or ``accept-new``
        (accept-new, or no: a changed or revoked key is refused all the same)."""
        return "accept-new" if self.strict_host_key_checking in ("accept-new", "no") else "strict"

    @property
    def known_hosts_name(self) -> str:
        """The name this host's key is filed under in known_hosts: HostKeyAlias as it is, else
        the host name, ``[host]:port`` for a port other than 22 (what ``ssh`` looks up)."""
        if self.host_key_alias:
            return self.host_key_alias
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"

    def describe(self) -> str:
        """``user@host:port`` (and the alias when the host name differs)."""
        where = f"{self.user}@{self.hostname}:{self.port}"
        return where if self.hostname == self.alias else f"{self.alias} ({where})"


# -- config files ---------------------------------------------------------------------------
def system_config_path() -> str:
    """The system-wide ssh config: ``$GPUCTL_SSH_SYSTEM_CONFIG``, else /etc/ssh/ssh_config."""
    return os.path.expanduser(os.environ.get(SYSTEM_CONFIG_ENV) or DEFAULT_SYSTEM_CONFIG)


def user_config_path(settings: SshSettings) -> str:
    """The user's ssh config: the ``ssh_config`` setting (which must exist), else
    ``~/.ssh/config`` (which may not). Raises RemoteError("config")."""
    if settings.ssh_config is not None:
        path = os.path.expanduser(settings.ssh_config)
        if not os.path.isfile(path):
            raise RemoteError("config", f"ssh_config {path} does not exist")
        return path
    return str(Path.home() / ".ssh" / "config")


def _quote(value: str, what: str) -> str:
    if '"' in value or "\n" in value:
        raise RemoteError("config", f"{what} {value!r}: an ssh config value cannot hold '\"'")
    return f'"{value}"' if any(c.isspace() for c in value) or not value else value


_INCLUDE = re.compile(r"^\s*include\s*=?\s*(.+)$", re.IGNORECASE)


def _config_files(roots: Iterable[tuple[str, str]], depth: int = 0) -> list[str]:
    """The config files and the files their Include lines name (for the cache stamp)."""
    out: list[str] = []
    for path, base in roots:
        if not os.path.isfile(path):
            out.append(path)  # its appearance must invalidate the cache too
            continue
        out.append(path)
        if depth >= 4:
            continue
        found: list[tuple[str, str]] = []
        for word in _includes(path):
            pattern = word if os.path.isabs(word) else os.path.join(base, word)
            found.extend((p, base) for p in sorted(glob.glob(pattern)))
        out.extend(_config_files(found, depth + 1))
    return out


_INCLUDES: dict[str, tuple[int, list[str]]] = {}


def _includes(path: str) -> list[str]:
    """The Include patterns of one config file, read once per modification time (a big config
    is not scanned again for every host)."""
    try:
        mtime = os.stat(path).st_mtime_ns
    except OSError:
        return []
    cached = _INCLUDES.get(path)
    if cached is not None and cached[0] == mtime:
        return cached[1]
    words: list[str] = []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                m = _INCLUDE.match(line)
                if m:
                    words += [os.path.expanduser(w.strip('"')) for w in m.group(1).split()]
    except OSError:
        return []
    _INCLUDES[path] = (mtime, words)
    return words


def _stamp(files: Sequence[str]) -> tuple[tuple[str, int], ...]:
    out = []
    for f in files:
        try:
            out.append((f, os.stat(f).st_mtime_ns))
        except OSError:
            out.append((f, -1))
    return tuple(out)


class _Wrappers:
    """Private wrapper configs (folder 0700, files 0600), one per (user config, system config,
    home), removed when the process exits."""

    def __init__(self) -> None:
        self._dir: str | None = None
        self._made: dict[tuple[str, str, str], str] = {}
        self._lock = threading.Lock()

    def path(self, user_cfg: str, system_cfg: str) -> str:
        home = str(Path.home())
        key = (user_cfg, system_cfg, home)
        with self._lock:
            made = self._made.get(key)
            if made is not None and os.path.exists(made):
                return made
            if self._dir is None or not os.path.isdir(self._dir):
                self._dir = tempfile.mkdtemp(prefix="gpuctl-ssh-")
                atexit.register(shutil.rmtree, self._dir, True)
            kh = " ".join(
                _quote(os.path.join(home, ".ssh", n).replace("%", "%%"), "home")
                for n in ("known_hosts", "known_hosts2")
            )
            text = (
                "# gpuctl: the user's ssh config, then the system's (ssh's order without -F),\n"
                "# then gpuctl's fallbacks for what neither sets.\n"
                f"Include {_quote(user_cfg, 'ssh_config')}\n"
                + (
                    f"Include {_quote(system_cfg, 'system ssh config')}\n"
                    if system_cfg != os.devnull  # ssh refuses to Include a world-writable file
                    else ""
                )
                + "Host *\n"
                f"    UserKnownHostsFile {kh}\n"
                f"    ConnectTimeout {FALLBACK_CONNECT_TIMEOUT}\n"
                f"    ServerAliveInterval {FALLBACK_KEEPALIVE_INTERVAL}\n"
            )
            fd, path = tempfile.mkstemp(prefix="wrapper-", suffix=".conf", dir=self._dir)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            self._made[key] = path
            return path


_WRAPPERS = _Wrappers()
_CACHE: dict[tuple[Any, ...], SshTarget] = {}
_CACHE_LOCK = threading.Lock()
_DEFAULT_CIPHERS: dict[str, tuple[str, ...]] = {}


def clear_cache() -> None:
    """Forget every resolved target (the next ``resolve`` asks ``ssh -G`` again)."""
    with _CACHE_LOCK:
        _CACHE.clear()


def ssh_binary() -> str | None:
    """The OpenSSH client used to resolve options, or None when there is none."""
    return shutil.which("ssh")


def check_host_name(host: str) -> None:
    """Refuse a host name ``ssh`` would read as an option or that no config can name."""
    if not host or host.startswith("-") or _BAD_NAME.search(host):
        raise RemoteError("config", f"bad host name {host!r}")


def resolve(host: str, settings: SshSettings | None = None) -> SshTarget:
    """The options for ``host`` as ``ssh -G`` resolves them with ``settings`` as ``-o`` options.

    Cached per (host, settings, config files and their modification times). Raises
    RemoteError("config") when the ssh config is wrong or ``ssh -G`` fails.
    """
    settings = settings or SshSettings()
    check_host_name(host)
    user_cfg = user_config_path(settings)
    system_cfg = system_config_path()
    files = _config_files(
        [(user_cfg, str(Path.home() / ".ssh")), (system_cfg, os.path.dirname(system_cfg))]
    )
    ssh = ssh_binary()
    key = (host, settings, _stamp(files), str(Path.home()), ssh)
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
    if hit is not None:
        return hit
    if ssh is not None:
        target = _resolve_with_ssh(ssh, host, settings, user_cfg, system_cfg)
    else:
        target = _resolve_with_asyncssh(host, settings, user_cfg, system_cfg)
    with _CACHE_LOCK:
        _CACHE[key] = target
    return target


def resolve_many(
    hosts: Sequence[str], settings: Mapping[str, SshSettings] | SshSettings | None = None
) -> dict[str, SshTarget | RemoteError]:
    """Resolve many hosts in parallel (a few ``ssh -G`` at a time); a host that fails maps to
    its RemoteError instead of stopping the others."""

    def one(host: str) -> SshTarget | RemoteError:
        s = settings.get(host) if isinstance(settings, Mapping) else settings
        try:
            return resolve(host, s)
        except RemoteError as e:
            return e

    workers = max(1, min(8, len(hosts), (os.cpu_count() or 2) * 2))
    with ThreadPoolExecutor(max_workers=workers) as ex:
        return dict(zip(hosts, ex.map(one, hosts), strict=True))


def ssh_g(
    host: str, settings: SshSettings | None = None, *, ssh: str | None = None
) -> dict[str, list[str]]:
    """``ssh -G`` for ``host`` through gpuctl's wrapper config: each keyword (lower case) with
    its values in order. Raises RemoteError("config")."""
    settings = settings or SshSettings()
    check_host_name(host)
    binary = ssh or ssh_binary()
    if binary is None:
        raise RemoteError("config", "no ssh client (OpenSSH) on this machine")
    wrapper = _WRAPPERS.path(user_config_path(settings), system_config_path())
    return _run_ssh_g(binary, ["-F", wrapper], host, settings.ssh_options())


def _run_ssh_g(
    ssh: str, config_args: list[str], host: str, options: Sequence[tuple[str, str]]
) -> dict[str, list[str]]:
    argv = [ssh, "-G", *config_args]
    for keyword, value in options:
        argv += ["-o", f"{keyword}={_quote(value, keyword)}"]
    argv += ["--", host]
    try:
        p = subprocess.run(
            argv,
            capture_output=True,
            stdin=subprocess.DEVNULL,
            timeout=SSH_G_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise RemoteError(
            "config",
            f"ssh -G {host} took more than {SSH_G_TIMEOUT:g} s (a slow Match exec in the ssh "
            "config?)",
        ) from None
    except OSError as e:
        raise RemoteError("config", f"cannot run {ssh}: {e.strerror or e}") from None
    if p.returncode != 0:
        lines = [ln for ln in p.stderr.decode(errors="replace").splitlines() if ln.strip()]
        why = lines[0] if lines else f"exit status {p.returncode}"
        raise RemoteError("config", f"{host}: the ssh config is wrong: {why}")
    out: dict[str, list[str]] = {}
    for line in p.stdout.decode(errors="replace").splitlines():
        keyword, _, value = line.partition(" ")
        if keyword:
            out.setdefault(keyword.lower(), []).append(value.strip())
    return out


def _default_ciphers(ssh: str) -> tuple[str, ...]:
    cached = _DEFAULT_CIPHERS.get(ssh)
    if cached is None:
        try:
            g = _run_ssh_g(ssh, ["-F", "none"], "gpuctl-default-ciphers", [])
            cached = tuple(g.get("ciphers", [""])[0].split(","))
        except RemoteError:
            cached = ()
        _DEFAULT_CIPHERS[ssh] = cached
    return cached


def _resolve_with_ssh(
    ssh: str, host: str, settings: SshSettings, user_cfg: str, system_cfg: str
) -> SshTarget:
    g = ssh_g(host, settings, ssh=ssh)

    def one(keyword: str, default: str = "") -> str:
        values = g.get(keyword)
        return values[0] if values else default

    hostname = one("hostname", host)
    user = one("user", _local_user())
    try:
        port = int(one("port", "22"))
    except ValueError:
        port = 22
    tokens = _Tokens(host, hostname, port, user, one("hostkeyalias") or None, one("proxyjump"))
    identities = tuple(tokens.path(p) for p in g.get("identityfile", []))
    certs = tuple(tokens.path(p) for p in g.get("certificatefile", []))
    agent = one("identityagent") or "SSH_AUTH_SOCK"
    ciphers: tuple[str, ...] | None = tuple(one("ciphers").split(",")) if one("ciphers") else None
    if ciphers == _default_ciphers(ssh):
        ciphers = None
    return SshTarget(
        alias=host,
        hostname=hostname,
        port=port,
        user=user,
        identity_files=identities,
        identities_only=one("identitiesonly") == "yes",
        identity_agent=_agent_path(agent, tokens),
        certificate_files=certs,
        proxy_jump=_hops(one("proxyjump")),
        proxy_command=tokens.command(one("proxycommand")),
        connect_timeout=_seconds(one("connecttimeout"), FALLBACK_CONNECT_TIMEOUT),
        server_alive_interval=_seconds(one("serveraliveinterval"), 0),
        server_alive_count_max=int(_seconds(one("serveralivecountmax"), 3)),
        user_known_hosts=_files(g.get("userknownhostsfile", [])),
        global_known_hosts=_files(g.get("globalknownhostsfile", [])),
        strict_host_key_checking=_STRICT_WORDS.get(
            one("stricthostkeychecking", "ask"), one("stricthostkeychecking", "ask")
        ),
        host_key_alias=one("hostkeyalias") or None,
        hash_known_hosts=one("hashknownhosts") == "yes",
        ciphers=ciphers,
        default_identities=_are_default_identities(g.get("identityfile", [])),
        settings=settings,
        via="ssh -G",
    )


_DEFAULT_IDENTITY_NAMES = (
    "id_rsa",
    "id_ecdsa",
    "id_ecdsa_sk",
    "id_ed25519",
    "id_ed25519_sk",
    "id_xmss",
    "id_dsa",
)


def _are_default_identities(raw: Sequence[str]) -> bool:
    names = {os.path.basename(p) for p in raw}
    return all(p.startswith("~/.ssh/") for p in raw) and names <= set(_DEFAULT_IDENTITY_NAMES)


def _resolve_with_asyncssh(
    host: str, settings: SshSettings, user_cfg: str, system_cfg: str
) -> SshTarget:
    """Without an ``ssh`` binary: asyncssh's config parser (Host, Match, Include, tokens;
    not StrictHostKeyChecking or HashKnownHosts, which it does not read)."""
    from asyncssh.config import SSHClientConfig

    local = _local_user()
    paths = [p for p in (user_cfg, system_cfg) if os.path.isfile(p)]
    try:
        cfg = SSHClientConfig.load(
            None,
            paths,
            False,
            False,
            False,
            local,
            settings.user if settings.user is not None else (),
            host,
            settings.port if settings.port is not None else (),
        )
    except Exception as e:  # asyncssh raises its ConfigParseError, OSError, ValueError
        raise RemoteError("config", f"{host}: the ssh config is wrong: {e}") from None

    def get(option: str, default: Any = None) -> Any:
        return cfg.get(option, default)

    hostname = str(get("Hostname", host))
    port = int(get("Port", 22) or 22)
    user = str(get("User", local))
    jump = settings.jump if settings.jump is not None else str(get("ProxyJump", "") or "")
    tokens = _Tokens(host, hostname, port, user, get("HostKeyAlias"), jump)
    configured = [str(p) for p in (get("IdentityFile", ()) or ())]
    raw_ids = ([settings.identity] if settings.identity else []) + configured
    default_ids = not raw_ids
    if default_ids:
        raw_ids = [f"~/.ssh/{n}" for n in _DEFAULT_IDENTITY_NAMES]
    ukh = (
        [settings.known_hosts]
        if settings.known_hosts is not None
        else [str(p) for p in (get("UserKnownHostsFile") or ())]
    )
    if not ukh:
        ukh = [str(Path.home() / ".ssh" / n) for n in ("known_hosts", "known_hosts2")]
    gkh = [str(p) for p in (get("GlobalKnownHostsFile") or ())] or [
        "/etc/ssh/ssh_known_hosts",
        "/etc/ssh/ssh_known_hosts2",
    ]
    policy = settings.host_key_policy
    strict = "accept-new" if policy == "accept-new" else "yes" if policy == "strict" else "ask"
    ciphers = get("Ciphers")

    def number(setting: float | None, option: str, fallback: float) -> float:
        if setting is not None:
            return float(setting)
        value = get(option)
        return float(value) if value is not None else fallback

    return SshTarget(
        alias=host,
        hostname=hostname,
        port=port,
        user=user,
        identity_files=tuple(tokens.path(p) for p in raw_ids),
        identities_only=bool(get("IdentitiesOnly", False)),
        identity_agent=_agent_path(str(get("IdentityAgent", "SSH_AUTH_SOCK")), tokens),
        certificate_files=tuple(tokens.path(str(p)) for p in (get("CertificateFile", ()) or ())),
        proxy_jump=_hops(jump),
        proxy_command=None
        if jump and jump != "none"
        else tokens.command(" ".join(get("ProxyCommand", ()) or ())),
        connect_timeout=number(
            settings.connect_timeout, "ConnectTimeout", FALLBACK_CONNECT_TIMEOUT
        ),
        server_alive_interval=number(
            settings.keepalive_interval, "ServerAliveInterval", FALLBACK_KEEPALIVE_INTERVAL
        ),
        server_alive_count_max=int(number(settings.keepalive_count_max, "ServerAliveCountMax", 3)),
        user_known_hosts=_files([" ".join(ukh)]),
        global_known_hosts=_files([" ".join(gkh)]),
        strict_host_key_checking=strict,
        host_key_alias=get("HostKeyAlias"),
        hash_known_hosts=False,
        ciphers=tuple(str(ciphers).split(",")) if ciphers else None,
        default_identities=default_ids,
        settings=settings,
        via="asyncssh",
    )


# -- values ---------------------------------------------------------------------------------
def _local_user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry and no $USER: what ssh would also fail on
        return str(os.getuid())


def _seconds(value: str, default: float) -> float:
    if not value or value == "none":
        return default
    try:
        return float(value)
    except ValueError:
        return default


def _files(values: Sequence[str]) -> tuple[str, ...]:
    words: list[str] = []
    for v in values:
        words.extend(v.split())
    if words == ["none"] or not words:
        return ()
    return tuple(os.path.expanduser(w) for w in words if w != "none")


def _hops(value: str) -> tuple[str, ...]:
    if not value or value.lower() == "none":
        return ()
    return tuple(h.strip() for h in value.split(",") if h.strip())


def _agent_path(value: str, tokens: _Tokens) -> str | None:
    if value == "none":
        return None
    if value == "SSH_AUTH_SOCK":
        return os.environ.get("SSH_AUTH_SOCK") or None
    if value.startswith("$"):
        return os.environ.get(value[1:].strip("{}")) or None
    return tokens.path(value)


def parse_hop(spec: str) -> tuple[str | None, str, int | None]:
    """A ProxyJump hop ``[user@]host[:port]`` or ``ssh://[user@]host[:port]`` as
    ``(user, host, port)``. Raises RemoteError("config")."""
    body = spec[len("ssh://") :] if spec.startswith("ssh://") else spec
    user, at, hostport = body.rpartition("@")
    port: str = ""
    if hostport.startswith("["):
        host, _, rest = hostport[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif hostport.count(":") == 1:
        host, _, port = hostport.partition(":")
    else:
        host = hostport
    if not host or (port and not port.isdigit()) or (at and not user):
        raise RemoteError("config", f"bad ProxyJump host {spec!r}: use [user@]host[:port]")
    check_host_name(host)
    return (user or None), host, (int(port) if port else None)


class _Tokens:
    """OpenSSH's % tokens (ssh_config(5), TOKENS) for the values ``ssh -G`` leaves as written."""

    def __init__(
        self, alias: str, hostname: str, port: int, user: str, key_alias: str | None, jump: str
    ) -> None:
        local = socket.gethostname()
        self.values = {
            "%": "%",
            "d": str(Path.home()),
            "h": hostname,
            "i": str(os.getuid()),
            "j": jump if jump and jump != "none" else "",
            "k": key_alias or alias,
            "L": local.split(".")[0],
            "l": local,
            "n": alias,
            "p": str(port),
            "r": user,
            "u": _local_user(),
        }
        self.values["C"] = hashlib.sha1(
            (local + hostname + str(port) + user + self.values["j"]).encode()
        ).hexdigest()

    def expand(self, text: str, allowed: str | None = None) -> str:
        def sub(m: re.Match[str]) -> str:
            t = m.group(1)
            if allowed is not None and t not in allowed:
                return m.group(0)
            return self.values.get(t, m.group(0))

        text = re.sub(r"%(.)", sub, text)
        return re.sub(
            r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: os.environ.get(m.group(1), ""), text
        )

    def path(self, value: str) -> str:
        return os.path.expanduser(self.expand(value))

    def command(self, value: str) -> str | None:
        if not value or value == "none":
            return None
        return self.expand(value, allowed="%hnpr")
