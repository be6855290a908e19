"""A config file's text to a ``Config``: TOML read (a syntax error's line from ``tomllib``),
layers merged key by key, each key's file and line (``gpuctl.tomllines``), every value checked
by its ``Key`` (``gpuctl.config.keys``), an unknown key said with the one meant (did you mean),
and every mistake one ``ConfigError`` line: ``path:line: key: what is wrong``."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpuctl import paths
from gpuctl.config.keys import (
    CLUSTER_KEYS,
    NODE_KEYS,
    PROMETHEUS_KEYS,
    SECTIONS,
    TOP_KEYS,
    _Bad,
    _bool,
    _show,
    _str,
    expand_hostlist,
    option_name,
)
from gpuctl.config.model import (
    AcceptSettings,
    ClusterConfig,
    Config,
    ConfigError,
    FleetSettings,
    JobsSettings,
    NodeConfig,
    PrometheusConfig,
    StressSettings,
    TuiSettings,
)
from gpuctl.tomllines import key_lines

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


class PrometheusKeyError(ValueError):
    """A mistake in a store's settings taken together; ``key`` is the one the line is about."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def prometheus_target(values: dict[str, Any], *, options: bool = False) -> PrometheusConfig:
    """A store's settings from its ``prometheus*`` keys' values (each already checked by its
    ``Key``, paths absolute), checked together: the one check for a cluster's table and for
    ``--prometheus`` with its options (``options``: the lines and the client's name the
    options, not the keys). Raises PrometheusKeyError with one line: a URL holding a
    password or not http(s)://host, a user without the file of its password or the reverse
    (basic auth with an empty password is a mistake far more often than a site's choice), a
    token file beside a user (the client would send the token alone).
    The files are read by the client (``gpuctl.fleet.prom.PromClient``), which says in one
    line which one it cannot read."""
    name = option_name if options else str
    values = dict(values)
    url = values.pop("prometheus")
    if re.match(r"https?://[^/\s]*@", url):  # not repeated: it holds a password
        raise PrometheusKeyError(
            "prometheus",
            f"the URL must not hold a user or password: set {name('prometheus_user')} and "
            f"{name('prometheus_password_file')} (or {name('prometheus_token_file')}) instead",
        )
    if not re.fullmatch(r"https?://[^/\s]+(/\S*)?", url):
        raise PrometheusKeyError("prometheus", f"expected http(s)://host:port, got {url!r}")
    if "prometheus_token_file" in values and "prometheus_user" in values:
        raise PrometheusKeyError(
            "prometheus_token_file",
            f"and {name('prometheus_user')} both set: a store takes a bearer token or a user "
            "and password, not both (which one the site expects decides)",
        )
    if "prometheus_user" in values and "prometheus_password_file" not in values:
        raise PrometheusKeyError(
            "prometheus_user",
            f"needs {name('prometheus_password_file')}, the file holding its password",
        )
    if "prometheus_password_file" in values and "prometheus_user" not in values:
        raise PrometheusKeyError(
            "prometheus_password_file", f"needs {name('prometheus_user')}, whose password it holds"
        )
    return PrometheusConfig(
        url, **{k.removeprefix("prometheus_"): v for k, v in values.items()}, options=options
    )


_TOML_AT = re.compile(r"\s*\(at line (\d+), column \d+\)\s*$")
_TOML_EOF = re.compile(r"\s*\(at end of document\)\s*$")

Origin = tuple[str | None, int | None]  # (file, line) where a key or table was written


def parse_config(text: str, path: str | None = None) -> Config:
    """Validate one file's text (see ``load_config``); ``path`` is used in messages and to
    resolve relative local paths."""
    return parse_layers([(path, text)])


def _toml(text: str, path: str | None) -> dict[str, Any]:
    try:
        data: dict[str, Any] = tomllib.loads(text)
        return data
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


def parse_layers(layers: Sequence[tuple[str | None, str]]) -> Config:
    merged: dict[str, Any] = {}
    origins: dict[tuple[str, ...], Origin] = {}
    for path, text in layers:
        data = _toml(text, path)
        _merge(merged, data)
        for keys, line in key_lines(text).items():
            origins[keys] = (path, line)
        for keys in _all_keys(data):  # keys the line finder missed still name their file
            if origins.get(keys, (None, None))[0] != path:
                origins[keys] = (path, None)
    primary = layers[-1][0]
    sources = tuple(p for p, _ in layers if p is not None)
    return _Builder(merged, origins, primary, sources).build()


def _merge(into: dict[str, Any], over: Mapping[str, Any]) -> None:
    """``over`` onto ``into`` key by key: tables merge, other values replace."""
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def _all_keys(data: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for key, value in data.items():
        out.append((*prefix, key))
        if isinstance(value, dict):
            out.extend(_all_keys(value, (*prefix, key)))
    return out


class _Builder:
    def __init__(
        self,
        data: dict[str, Any],
        origins: dict[tuple[str, ...], Origin],
        path: str | None,
        sources: tuple[str, ...],
    ) -> None:
        self.data = data
        self.origins = origins
        self.path = path
        self.sources = sources

    def where(self, keys: tuple[str, ...]) -> Origin:
        """The file and line that set ``keys`` (or the nearest enclosing table)."""
        for n in range(len(keys), 0, -1):
            found = self.origins.get(keys[:n])
            if found is not None:
                return found
        return self.path, None

    def fail(self, keys: tuple[str, ...], message: str) -> ConfigError:
        label = ".".join(_quote_key(k) for k in keys)
        path, line = self.where(keys)
        return ConfigError(path, line, f"{label}: {message}" if keys else message)

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
        audit_log = (
            self.check(("audit_log",), self.data["audit_log"], _str)
            if "audit_log" in self.data
            else None
        )
        sections = {name: self.section(name) for name in SECTIONS}
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
            audit_log=audit_log,
            fleet=FleetSettings(**sections["fleet"], given=frozenset(sections["fleet"])),
            tui=TuiSettings(**sections["tui"], given=frozenset(sections["tui"])),
            stress=StressSettings(**sections["stress"], given=frozenset(sections["stress"])),
            accept=AcceptSettings(**sections["accept"], given=frozenset(sections["accept"])),
            jobs=JobsSettings(**sections["jobs"], given=frozenset(sections["jobs"])),
            sources=self.sources,
        )

    def section(self, name: str) -> dict[str, Any]:
        """The checked keys a feature table (``[stress]``, ...) sets; unknown keys are errors."""
        keys = SECTIONS[name]
        table = self.table(self.data.get(name, {}), (name,))
        out: dict[str, Any] = {}
        for key, v in table.items():
            spec = keys.get(key)
            if spec is None:
                raise self.unknown((name,), key, tuple(keys))
            value = self.check((name, key), v, spec.check)
            out[key] = self.local_path((name, key), value) if spec.local_path else value
        for warn, critical in (("temp_warn", "temp_critical"), ("mem_warn", "mem_critical")):
            if name != "tui":
                break
            w = out.get(warn, keys[warn].default)
            c = out.get(critical, keys[critical].default)
            if c is not None and w >= c:
                at = critical if critical in out else warn
                raise self.fail((name, at), f"{warn} ({w:g}) must be below {critical} ({c:g})")
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
            spec = CLUSTER_KEYS[key]
            value = self.check((*keys, key), v, spec.check)
            if spec.local_path:
                value = self.local_path((*keys, key), value)
            out[key] = value
        return out

    def local_path(self, keys: tuple[str, ...], p: str) -> str:
        """A login-side path: ``~`` expanded, relative to the folder of the file that set it."""
        q = paths.expand(p)
        if q.is_absolute():
            return str(q)
        origin = self.where(keys)[0]
        base = paths.expand(origin).resolve().parent if origin else Path.cwd()
        return str(base / q)

    def build_cluster(self, cname: str, table: Any, base: dict[str, Any]) -> ClusterConfig:
        keys = ("clusters", cname)
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", cname):
            raise self.fail(keys, "a cluster name is letters, digits, '.', '_' or '-'")
        table = self.table(table, keys)
        prometheus = self.prometheus(table, keys)
        table = {k: v for k, v in table.items() if k not in PROMETHEUS_KEYS}
        overrides = self.table(table.get("override", {}), (*keys, "override"))
        own = self.settings(
            {k: v for k, v in table.items() if k != "override"}, keys, (*CLUSTER_KEYS, "override")
        )
        settings = {**base, **own}
        via = settings.get("via", "ssh")
        names: tuple[str, ...] | None = settings.pop("nodes", None)
        if prometheus is not None and names is None and via == "ssh" and "partition" not in own:
            names = ()  # every host the store holds, read-only; with nodes: mixed
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
            prometheus=prometheus,
        )

    def prometheus(self, table: dict[str, Any], keys: tuple[str, ...]) -> PrometheusConfig | None:
        """The cluster's ``prometheus*`` keys, checked; None without ``prometheus``."""
        values: dict[str, Any] = {}
        for key, spec in PROMETHEUS_KEYS.items():
            if key in table:
                value = self.check((*keys, key), table[key], spec.check)
                values[key] = self.local_path((*keys, key), value) if spec.local_path else value
        if not values:
            return None
        if "prometheus" not in values:
            raise self.fail((*keys, next(iter(values))), 'needs prometheus = "http://host:9090"')
        try:
            return prometheus_target(values)
        except PrometheusKeyError as e:
            raise self.fail((*keys, e.key), str(e)) from None


def _close(key: str, known: tuple[str, ...]) -> str:
    import difflib

    match = difflib.get_close_matches(key, known, n=1)
    return f" (did you mean {match[0]!r}?)" if match else ""


def _quote_key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else f'"{k}"'
