"""The user's configuration: clusters of nodes, how to reach them, and feature tables.

``~/.config/gpuctl/config.toml`` (``gpuctl.paths``), or ``$GPUCTL_CONFIG``, or ``--config PATH``::

    read_only = false              # true: no stress, no jobs, no acceptance runs

    [defaults]                     # any cluster key, for every cluster
    interval = 1.0

    [clusters.lab]
    nodes = "node[1-4],dgx-a"      # Slurm hostlists (a string or a list of strings); without
                                   # nodes, via = "srun" or a partition = "..." asks sinfo
    via = "ssh"                    # ssh | srun | local
    ssh_config = "~/.ssh/config"   # the OpenSSH client config to read (the default), then
                                   # /etc/ssh/ssh_config, as ``ssh`` reads them
    known_hosts = "~/.ssh/known_hosts"   # SSH keys below: unset = as the ssh config says
    host_key_policy = "accept-new" # strict | accept-new (unset: StrictHostKeyChecking)
    python = "python3"             # the node's system interpreter (VENV1)
    workload_python = "/opt/envs/torch/bin/python"   # VENV2, for burners and the suite
    simulate = 8                   # optional: simulated GPUs ("8" or "8:H100") on these nodes
    interval = 1.0

    [clusters.lab.override."node4"]  # per-node settings, keyed by a hostlist
    python = "/usr/bin/python3.6"

    [tui] / [stress] / [accept] / [jobs]   # passed through raw to those features

Every mistake is a ``ConfigError`` whose text is one line: ``path:line: what is wrong``.
Hostlists are expanded by python-hostlist, never by hand.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import hostlist

from gpuctl import paths

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

VIAS = ("ssh", "srun", "local")
HOST_KEY_POLICIES = ("strict", "accept-new")
MAX_NODES = 100_000
DEFAULT_BUNDLE_DIR = "~/.cache/gpuctl"
TOP_KEYS = ("read_only", "defaults", "clusters", "fleet", "tui", "stress", "accept", "jobs")
FLEET_KEYS = ("concurrency", "connect_timeout", "stale_after", "backoff_base", "backoff_max")


class ConfigError(Exception):
    """A mistake in the config file; ``str()`` is one line: ``path:line: what is wrong``."""

    def __init__(self, path: str | None, line: int | None, message: str) -> None:
        where = path or "<config>"
        if line is not None:
            where += f":{line}"
        super().__init__(f"{where}: {message}")
        self.path = path
        self.line = line
        self.message = message


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """Everything needed to reach one node and run its agent (hostlists already expanded)."""

    name: str
    cluster: str
    via: str = "ssh"
    python: str = "python3"
    workload_python: str | None = None
    simulate: str | None = None  # a --simulate spec ("8", "8:H100") or None for real GPUs
    interval: float = 1.0
    # ssh: like ``ssh -o`` options, each wins over the ssh config when set; None means "as the
    # ssh config says" (gpuctl.remote.options; its fallbacks when neither says anything:
    # ConnectTimeout 15, ServerAliveInterval 5, host keys strict)
    ssh_config: str | None = None
    known_hosts: str | None = None  # UserKnownHostsFile
    host_key_policy: str | None = None  # StrictHostKeyChecking: strict (yes) | accept-new
    user: str | None = None
    port: int | None = None
    identity: str | None = None
    jump: str | None = None  # ProxyJump
    connect_timeout: float | None = None  # ConnectTimeout
    keepalive_interval: float | None = None  # ServerAliveInterval
    keepalive_count_max: int | None = None  # ServerAliveCountMax
    setup: tuple[str, ...] = ()  # shell lines run before the agent (``module load python``)
    bundle_dir: str = DEFAULT_BUNDLE_DIR  # on the node; ``~`` is the node's $HOME
    # slurm
    partition: str | None = None
    jobid: int | None = None
    slurm_conf: str | None = None
    slurm: bool = False  # annotate GPUs with the Slurm job holding them

    def describe(self) -> str:
        """A short human line: how this node is reached."""
        extra = []
        if self.via == "ssh":
            if self.user:
                extra.append(f"user={self.user}")
            if self.port:
                extra.append(f"port={self.port}")
            if self.jump:
                extra.append(f"jump={self.jump}")
        if self.via == "srun" and self.jobid is not None:
            extra.append(f"job={self.jobid}")
        if self.simulate:
            extra.append(f"simulate={self.simulate}")
        extra.append(f"python={self.python}")
        return " ".join([self.via, *extra])


# Cluster keys: name -> (checker, NodeConfig field or None). Checkers return the clean value or
# raise _Bad(message).
class _Bad(Exception):
    pass


def _str(v: Any) -> str:
    if not isinstance(v, str) or not v.strip():
        raise _Bad(f"expected a non-empty string, got {_show(v)}")
    return v


def _choice(*choices: str) -> Callable[[Any], str]:
    def check(v: Any) -> str:
        if v not in choices:
            raise _Bad(f"must be one of {', '.join(choices)}; got {_show(v)}")
        return str(v)

    return check


def _number(lo: float, hi: float) -> Callable[[Any], float]:
    def check(v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise _Bad(f"expected a number, got {_show(v)}")
        if not lo <= v <= hi:
            raise _Bad(f"must be within {lo:g}..{hi:g}; got {v:g}")
        return float(v)

    return check


def _integer(lo: int, hi: int) -> Callable[[Any], int]:
    def check(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise _Bad(f"expected a whole number, got {_show(v)}")
        if not lo <= v <= hi:
            raise _Bad(f"must be within {lo}..{hi}; got {v}")
        return v

    return check


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise _Bad(f"expected true or false, got {_show(v)}")
    return v


def _lines(v: Any) -> tuple[str, ...]:
    if isinstance(v, str):
        return (v,)
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise _Bad(f"expected a string or a list of strings, got {_show(v)}")
    return tuple(v)


def _simulate(v: Any) -> str:
    from gpuctl.node.readers.sim import parse_spec

    if isinstance(v, bool) or not isinstance(v, int | str):
        raise _Bad(f'expected a GPU count or a spec like "8:H100", got {_show(v)}')
    spec = str(v).strip()
    try:
        models = parse_spec(spec)
    except ValueError as e:
        raise _Bad(str(e).replace("--simulate", "simulate")) from None
    if not models:
        raise _Bad("must simulate at least one GPU")
    return spec


def _hostlists(v: Any) -> tuple[str, ...]:
    parts = [v] if isinstance(v, str) else v
    if not isinstance(parts, list) or not all(isinstance(p, str) for p in parts):
        raise _Bad(f'expected a hostlist like "node[1-4]" or a list of them, got {_show(v)}')
    names: list[str] = []
    for part in parts:
        names.extend(expand_hostlist(part))
    if not names:
        raise _Bad("names no node")
    return tuple(names)


def expand_hostlist(text: str) -> list[str]:
    """Expand a Slurm hostlist (``gpu[01-16],dgx-a``) with python-hostlist.

    Raises ``_Bad`` (inside this module) with the reason for a malformed one.
    """
    try:
        names = hostlist.expand_hostlist(text)
    except hostlist.BadHostlist as e:
        raise _Bad(f"bad hostlist {text!r}: {e}") from None
    if len(names) > MAX_NODES:
        raise _Bad(f"hostlist {text!r} names {len(names)} nodes (at most {MAX_NODES})")
    for n in names:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", n):
            raise _Bad(f"hostlist {text!r} gives a bad node name {n!r}")
    return list(names)


CLUSTER_KEYS: dict[str, Callable[[Any], Any]] = {
    "nodes": _hostlists,
    "via": _choice(*VIAS),
    "ssh_config": _str,
    "known_hosts": _str,
    "host_key_policy": _choice(*HOST_KEY_POLICIES),
    "user": _str,
    "port": _integer(1, 65535),
    "identity": _str,
    "jump": _str,
    "python": _str,
    "workload_python": _str,
    "simulate": _simulate,
    "interval": _number(0.1, 3600),
    "connect_timeout": _number(0.5, 600),
    "keepalive_interval": _number(0, 3600),
    "keepalive_count_max": _integer(1, 100),
    "setup": _lines,
    "bundle_dir": _str,
    "partition": _str,
    "jobid": _integer(1, 2**62),
    "slurm_conf": _str,
    "slurm": _bool,
}
NODE_KEYS = tuple(k for k in CLUSTER_KEYS if k != "nodes")  # allowed in an override
LOCAL_PATH_KEYS = ("ssh_config", "known_hosts", "identity", "slurm_conf")


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """One ``[clusters.NAME]`` table, nodes expanded, overrides applied per node."""

    name: str
    via: str
    nodes: tuple[NodeConfig, ...]
    partition: str | None = None
    slurm_conf: str | None = None
    discover: bool = False  # via srun without ``nodes``: the node list comes from sinfo
    template: NodeConfig | None = None  # settings for discovered nodes


@dataclass(frozen=True, slots=True)
class Config:
    """The whole configuration. Empty (no clusters) means "watch this machine"."""

    path: str | None = None
    clusters: Mapping[str, ClusterConfig] = field(default_factory=dict)
    read_only: bool = False
    fleet: Mapping[str, float] = field(default_factory=dict)
    tui: Mapping[str, Any] = field(default_factory=dict)
    stress: Mapping[str, Any] = field(default_factory=dict)
    accept: Mapping[str, Any] = field(default_factory=dict)
    jobs: Mapping[str, Any] = field(default_factory=dict)

    def nodes(self) -> list[NodeConfig]:
        """Every configured node, cluster by cluster, in hostlist order."""
        return [n for c in self.clusters.values() for n in c.nodes]

    @property
    def empty(self) -> bool:
        """True when no cluster is configured: gpuctl then watches this machine."""
        return not self.clusters


def default_path() -> Path:
    """The user's config file (``gpuctl.paths.config_file()``), whether or not it exists."""
    return paths.config_file()


def load_config(path: str | os.PathLike[str] | None = None) -> Config:
    """Read and validate the config.

    ``path`` None means ``$GPUCTL_CONFIG``, else the XDG default; a missing default file gives an
    empty Config (this machine). A named file that is missing, or any mistake, raises
    ConfigError with one line ``path:line: message``.
    """
    if path is None:
        env = os.environ.get("GPUCTL_CONFIG")
        if env:
            path = env
        else:
            p = default_path()
            if not p.exists():
                return Config()
            path = p
    spath = str(path)
    try:
        text = Path(spath).expanduser().read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(spath, None, "no such file") from None
    except IsADirectoryError:
        raise ConfigError(spath, None, "is a directory, not a config file") from None
    except PermissionError:
        raise ConfigError(spath, None, "cannot read it: permission denied") from None
    except UnicodeDecodeError:
        raise ConfigError(spath, None, "is not UTF-8 text") from None
    return parse_config(text, spath)


_TOML_AT = re.compile(r"\s*\(at line (\d+), column \d+\)\s*$")
_TOML_EOF = re.compile(r"\s*\(at end of document\)\s*$")


def parse_config(text: str, path: str | None = None) -> Config:
    """Validate config text (see ``load_config``); ``path`` is used in messages and to resolve
    relative local paths."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        msg = str(e)
        m = _TOML_AT.search(msg)
        if m:
            raise ConfigError(path, int(m.group(1)), f"TOML syntax: {msg[: m.start()]}") from None
        m = _TOML_EOF.search(msg)
        line = text.count("\n") + 1
        raise ConfigError(
            path, line if m else None, f"TOML syntax: {msg[: m.start()] if m else msg}"
        ) from None
    return _Builder(data, text, path).build()


class _Builder:
    def __init__(self, data: dict[str, Any], text: str, path: str | None) -> None:
        self.data = data
        self.lines = _key_lines(text)
        self.path = path
        self.base = Path(path).expanduser().resolve().parent if path else Path.cwd()

    def fail(self, keys: tuple[str, ...], message: str) -> ConfigError:
        label = ".".join(_quote_key(k) for k in keys)
        return ConfigError(self.path, self._line(keys), f"{label}: {message}" if keys else message)

    def _line(self, keys: tuple[str, ...]) -> int | None:
        for n in range(len(keys), 0, -1):
            line = self.lines.get(keys[:n])
            if line is not None:
                return line
        return None

    def unknown(self, keys: tuple[str, ...], key: str, known: tuple[str, ...]) -> ConfigError:
        hint = _close(key, known)
        return self.fail(
            (*keys, key),
            f"unknown key{hint}; known keys: {', '.join(known)}",
        )

    def table(self, v: Any, keys: tuple[str, ...]) -> dict[str, Any]:
        if not isinstance(v, dict):
            raise self.fail(keys, f"expected a table ([{'.'.join(keys)}]), got {_show(v)}")
        return v

    def build(self) -> Config:
        for key in self.data:
            if key not in TOP_KEYS:
                if key in CLUSTER_KEYS:
                    raise self.fail(
                        (key,),
                        "cluster settings go in a [clusters.NAME] table (or [defaults])",
                    )
                raise self.unknown((), key, TOP_KEYS)
        read_only = self.check(("read_only",), self.data.get("read_only", False), _bool)
        raw: dict[str, dict[str, Any]] = {}
        for name in ("tui", "stress", "accept", "jobs"):
            raw[name] = dict(self.table(self.data.get(name, {}), (name,)))
        fleet = self.build_fleet()
        defaults = self.table(self.data.get("defaults", {}), ("defaults",))
        base = self.settings(defaults, ("defaults",), NODE_KEYS)
        clusters_raw = self.table(self.data.get("clusters", {}), ("clusters",))
        clusters: dict[str, ClusterConfig] = {}
        owner: dict[str, str] = {}
        for cname, ctable in clusters_raw.items():
            cluster = self.build_cluster(cname, ctable, base)
            for node in cluster.nodes:
                if node.name in owner:
                    where = (
                        f"clusters {owner[node.name]!r} and {cname!r}"
                        if owner[node.name] != cname
                        else f"cluster {cname!r} twice"
                    )
                    raise self.fail(
                        ("clusters", cname, "nodes"), f"node {node.name!r} is in {where}"
                    )
                owner[node.name] = cname
            clusters[cname] = cluster
        return Config(
            path=self.path,
            clusters=clusters,
            read_only=read_only,
            fleet=fleet,
            tui=raw["tui"],
            stress=raw["stress"],
            accept=raw["accept"],
            jobs=raw["jobs"],
        )

    def build_fleet(self) -> dict[str, float]:
        table = self.table(self.data.get("fleet", {}), ("fleet",))
        checks: dict[str, Callable[[Any], Any]] = {
            "concurrency": _integer(1, 4096),
            "connect_timeout": _number(0.5, 600),
            "stale_after": _number(0.5, 3600),
            "backoff_base": _number(0.01, 600),
            "backoff_max": _number(0.01, 3600),
        }
        out: dict[str, float] = {}
        for key, v in table.items():
            if key not in checks:
                raise self.unknown(("fleet",), key, FLEET_KEYS)
            out[key] = self.check(("fleet", key), v, checks[key])
        return out

    def check(self, keys: tuple[str, ...], v: Any, checker: Callable[[Any], Any]) -> Any:
        try:
            return checker(v)
        except _Bad as e:
            raise self.fail(keys, str(e)) from None

    def settings(
        self, table: dict[str, Any], keys: tuple[str, ...], allowed: tuple[str, ...]
    ) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, v in table.items():
            if key == "nodes" and key not in allowed:
                raise self.fail(
                    (*keys, key),
                    "nodes are named in [clusters.NAME] (an override's by its own key)",
                )
            if key not in allowed:
                raise self.unknown(keys, key, allowed)
            value = self.check((*keys, key), v, CLUSTER_KEYS[key])
            if key in LOCAL_PATH_KEYS:
                value = self.local_path(value)
            out[key] = value
        return out

    def local_path(self, p: str) -> str:
        """A login-side path: ``~`` expanded, relative to the config file's folder."""
        q = Path(p).expanduser()
        return str(q if q.is_absolute() else self.base / q)

    def build_cluster(self, cname: str, table: Any, base: dict[str, Any]) -> ClusterConfig:
        keys = ("clusters", cname)
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", cname):
            raise self.fail(keys, "a cluster name is letters, digits, '.', '_' or '-'")
        table = self.table(table, keys)
        overrides = self.table(table.get("override", {}), (*keys, "override"))
        own = self.settings(
            {k: v for k, v in table.items() if k != "override"}, keys, (*CLUSTER_KEYS, "override")
        )
        settings = {**base, **own}
        via = settings.get("via", "ssh")
        names: tuple[str, ...] | None = settings.pop("nodes", None)
        if names is None:
            if via == "local":
                names = ("localhost",)
            elif via != "srun" and "partition" not in settings:
                raise self.fail(
                    keys,
                    'no nodes: set nodes = "host[1-4]" (a Slurm hostlist), or partition = "..." '
                    "to take them from sinfo",
                )
        if via == "srun":
            settings.setdefault("slurm", True)
        if via == "local" and "python" not in settings:
            settings["python"] = sys.executable
        template = NodeConfig(name="", cluster=cname, **settings)
        per_node: dict[str, dict[str, Any]] = {}
        for pattern, otable in overrides.items():
            okeys = (*keys, "override", pattern)
            try:
                targets = expand_hostlist(pattern)
            except _Bad as e:
                raise self.fail(okeys, str(e)) from None
            if names is not None:
                missing = [t for t in targets if t not in names]
                if missing:
                    raise self.fail(okeys, f"node {missing[0]!r} is not in this cluster's nodes")
            values = self.settings(self.table(otable, okeys), okeys, NODE_KEYS)
            if values.get("via", via) != via:
                raise self.fail((*okeys, "via"), "a node cannot change its cluster's via")
            for t in targets:
                per_node.setdefault(t, {}).update(values)
        nodes = tuple(replace(template, name=n, **per_node.get(n, {})) for n in (names or ()))
        return ClusterConfig(
            name=cname,
            via=via,
            nodes=nodes,
            partition=settings.get("partition"),
            slurm_conf=settings.get("slurm_conf"),
            discover=names is None,
            template=template,
        )


def _show(v: Any) -> str:
    if isinstance(v, dict):
        return "a table"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, bool):
        return "true" if v else "false"
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _close(key: str, known: tuple[str, ...]) -> str:
    import difflib

    match = difflib.get_close_matches(key, known, n=1)
    return f" (did you mean {match[0]!r}?)" if match else ""


def _quote_key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else f'"{k}"'


# -- where a key is defined: line numbers for semantic errors (tomllib gives none) -------------
_KEY_PART = re.compile(r"\s*(?:\"((?:[^\"\\]|\\.)*)\"|'([^']*)'|([A-Za-z0-9_-]+))\s*")


def _split_key(text: str) -> tuple[tuple[str, ...], int] | None:
    """Parse a dotted TOML key at the start of ``text``; returns (parts, chars consumed)."""
    parts: list[str] = []
    pos = 0
    while True:
        m = _KEY_PART.match(text, pos)
        if not m:
            return None
        if m.group(1) is not None:
            parts.append(m.group(1).encode().decode("unicode_escape"))
        else:
            parts.append(m.group(2) if m.group(2) is not None else m.group(3))
        pos = m.end()
        if pos < len(text) and text[pos] == ".":
            pos += 1
            continue
        return tuple(parts), pos


def _key_lines(text: str) -> dict[tuple[str, ...], int]:
    """Map each table header and key path to its (first) line number, best effort.

    Multi-line strings and arrays are skipped so their contents are not read as keys.
    """
    found: dict[tuple[str, ...], int] = {}
    table: tuple[str, ...] = ()
    depth = 0  # open brackets of a multi-line array
    in_string: str | None = None
    for no, line in enumerate(text.splitlines(), 1):
        if in_string is not None:
            if line.count(in_string) % 2 == 1:
                in_string = None
            continue
        stripped = line.strip()
        if depth > 0:
            depth += _bracket_balance(stripped)
            continue
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith("["):
            inner = stripped[2:] if stripped.startswith("[[") else stripped[1:]
            parsed = _split_key(inner)
            if parsed:
                table = parsed[0]
                found.setdefault(table, no)
            continue
        parsed = _split_key(stripped)
        if not parsed or not stripped[parsed[1] :].startswith("="):
            continue
        keys, end = parsed
        found.setdefault((*table, *keys), no)
        value = stripped[end + 1 :].strip()
        for quote in ('"""', "'''"):
            if value.startswith(quote) and value.count(quote) == 1:
                in_string = quote
        if value.startswith("["):
            depth = _bracket_balance(value)
    return found


def _bracket_balance(s: str) -> int:
    s = re.sub(r"\"(?:[^\"\\]|\\.)*\"|'[^']*'", "", s).split("#", 1)[0]
    return s.count("[") - s.count("]")
