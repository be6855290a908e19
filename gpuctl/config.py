"""The configuration: clusters of nodes, how to reach them, and feature tables.

Files, read in this order, each overriding the ones before key by key (tables merge, other
values replace): the site's ``<each of $XDG_CONFIG_DIRS>/gpuctl/config.toml`` (default
``/etc/xdg/gpuctl/config.toml``: a cluster's admins name the nodes once for everybody), then the
user's ``~/.config/gpuctl/config.toml`` (``$XDG_CONFIG_HOME``), or the file named by
``$GPUCTL_CONFIG`` or ``--config PATH`` instead of the user's. Each must be owned by this
user or root and writable by nobody else (``unsafe_owner_or_mode``): it is code run on every
node. See ``gpuctl.paths``::

    read_only = false              # true: no stress, no jobs, no acceptance runs

    [defaults]                     # any cluster key, for every cluster
    interval = 1.0

    [clusters.lab]
    nodes = "node[1-4],dgx-a"      # Slurm hostlists (a string or a list of strings); without
                                   # nodes, via = "srun" or a partition = "..." asks sinfo
    via = "ssh"                    # ssh | srun | local
    python = "python3"             # the node's system interpreter (VENV1)
    workload_python = "/opt/envs/torch/bin/python"   # VENV2, for burners and the suite

    [clusters.lab.override."node4"]  # per-node settings, keyed by a hostlist
    python = "/usr/bin/python3.6"

    [fleet] / [tui] / [stress] / [accept] / [jobs]

Every key of every table is known here (``CLUSTER_KEYS``, ``SECTIONS``): its check, its default
and one line of meaning, from which ``gpuctl config init`` writes a commented file. An unknown
key is an error with a "did you mean" when one is close. Every mistake is a ``ConfigError``
whose text is one line: ``path:line: what is wrong``, naming the file that holds the key
(``tomllib`` gives the line of a syntax error; ``gpuctl.tomllines`` the line of each key).
Hostlists are expanded by python-hostlist, never by hand.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import hostlist

from gpuctl import paths
from gpuctl.tomllines import key_lines

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

VIAS = ("ssh", "srun", "local")
SRUN_STEPS = ("shared", "per-node")
HOST_KEY_POLICIES = ("strict", "accept-new")
MAX_NODES = 100_000
DEFAULT_BUNDLE_DIR = "~/.cache/gpuctl"
TOP_KEYS = (
    "read_only",
    "defaults",
    "clusters",
    "fleet",
    "tui",
    "stress",
    "accept",
    "jobs",
    "audit_log",
)


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
    # ssh config says" (gpuctl.reach.options; its fallbacks when neither says anything:
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
    srun_step: str = "shared"  # via srun: one step for all nodes of a job, or one per node
    slurm: bool = False  # annotate GPUs with the Slurm job holding them
    expect_gpus: int | None = None  # acceptance: GPUs this node must show (gpuctl.accept.expect)

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


def _size(v: Any) -> int | str:
    """Bytes: a whole number, or "512M", "4G", "1.5GiB" (the unit's K, M, G, T are 1024s)."""
    ok = isinstance(v, int) and not isinstance(v, bool) and v >= 1
    if ok or (isinstance(v, str) and re.fullmatch(r"\s*\d+(\.\d+)?\s*([KMGT]i?)?B?\s*", v, re.I)):
        return v  # type: ignore[no-any-return]
    raise _Bad(f'expected a size in bytes (1073741824, "4G"), got {_show(v)}')


def _liveness(v: Any) -> float:
    seconds = _number(0, 86400)(v)
    if 0 < seconds < 1:
        raise _Bad(f"must be 0 (never) or within 1..86400 seconds; got {seconds:g}")
    return seconds


# A host of a cluster read from Prometheus whose newest sample is older than this leaves the
# fleet (gpuctl.fleet.prom): twice Prometheus's own lookback (5 min), so a node is seen
# unreachable a while first, and one rebooting may come back before.
PROM_FORGET_AFTER_S = 600.0
# Bounds of what one store may make gpuctl hold (gpuctl.fleet.promhttp, gpuctl.fleet.prom):
# a poll at 16,384 GPUs answers 6.3 MB in all, its largest answer (the utilisation's, every
# label kept) under 8 MB, a MIG fleet's 7 instances a GPU 115,000 series: 64 MiB, 262,144
# series an answer and 16,384 hosts (a GPU each) leave several times that room, and bound the
# memory an answer takes (a 256 MiB one took 1.6 GB before, 300,000 hosts 5.6 GB).
PROM_MAX_ANSWER = 64 << 20
PROM_MAX_SERIES = 1 << 18
PROM_MAX_HOSTS = 16384


def _forget_after(v: Any) -> float:
    seconds = _number(0, 7 * 86400)(v)
    if 0 < seconds < 1:
        raise _Bad(f"must be 0 (never) or within 1..604800 seconds; got {seconds:g}")
    return seconds


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


@dataclass(frozen=True, slots=True)
class Key:
    """One config key: how its value is checked, its default (None: unset, "as the node or the
    ssh config says"), and one line of meaning (``gpuctl config init`` writes them out)."""

    check: Callable[[Any], Any]
    default: Any
    help: str
    local_path: bool = False  # a login-side path: ``~`` expanded, relative to its file's folder


CLUSTER_KEYS: dict[str, Key] = {
    "nodes": Key(_hostlists, None, 'the nodes, as Slurm hostlists ("gpu[01-16],dgx-a")'),
    "via": Key(_choice(*VIAS), "ssh", "how nodes are reached: ssh, srun (a job step), local"),
    "ssh_config": Key(
        _str, None, "OpenSSH client config (default ~/.ssh/config, then /etc/ssh)", True
    ),
    "known_hosts": Key(_str, None, "known_hosts file (default: as the ssh config says)", True),
    "host_key_policy": Key(
        _choice(*HOST_KEY_POLICIES),
        None,
        "strict, or accept-new to record unseen hosts (default: StrictHostKeyChecking)",
    ),
    "user": Key(_str, None, "login name (default: as the ssh config says)"),
    "port": Key(_integer(1, 65535), None, "SSH port (default: as the ssh config says)"),
    "identity": Key(_str, None, "private key file (default: the ssh config's, or the agent)", True),
    "jump": Key(_str, None, "ProxyJump host(s), [user@]host[:port],... (default: ssh config)"),
    "python": Key(_str, "python3", "the node's system Python (>= 3.6) that runs the agent"),
    "workload_python": Key(
        _str, None, "a Python with torch on the nodes, for burners and the acceptance suite"
    ),
    "simulate": Key(_simulate, None, 'simulated GPUs on these nodes ("8" or "8:H100")'),
    "interval": Key(_number(0.1, 3600), 1.0, "seconds between samples"),
    "connect_timeout": Key(
        _number(0.5, 600), None, "seconds for a node to answer (default: ConnectTimeout, or 15)"
    ),
    "keepalive_interval": Key(
        _number(0, 3600), None, "seconds between keepalives (default: ServerAliveInterval, or 5)"
    ),
    "keepalive_count_max": Key(
        _integer(1, 100), None, "keepalives unanswered before giving up (default: ssh config)"
    ),
    "setup": Key(_lines, [], 'shell lines run on the node first ("module load cuda/12.1")'),
    "bundle_dir": Key(
        _str, DEFAULT_BUNDLE_DIR, "folder on the node (private, 0700) for the agent bundle"
    ),
    "partition": Key(_str, None, "Slurm partition whose nodes these are (sinfo lists them)"),
    "jobid": Key(_integer(1, 2**62), None, "via srun: the job whose nodes to watch"),
    "slurm_conf": Key(_str, None, "slurm.conf for this cluster's Slurm clients", True),
    "srun_step": Key(
        _choice(*SRUN_STEPS),
        "shared",
        "via srun: one srun step for all nodes of a job (shared), or one srun per node",
    ),
    "slurm": Key(_bool, False, "show which Slurm job and user hold each GPU"),
    "expect_gpus": Key(
        _integer(0, 1024),
        None,
        "GPUs each node must show in acceptance (default: [accept] expect_gpus, else Slurm's gres)",
    ),
}
NODE_KEYS = tuple(k for k in CLUSTER_KEYS if k != "nodes")  # allowed in an override
# A cluster's store of DCGM exporter series (gpuctl.fleet.prom): cluster keys, not per node.
PROMETHEUS_KEYS: dict[str, Key] = {
    "prometheus": Key(
        _str, None, 'the site\'s Prometheus, read instead of agents ("http://prom:9090")'
    ),
    "prometheus_match": Key(_str, None, "label matchers every query carries ('{cluster=\"a\"}')"),
    "prometheus_token_file": Key(
        _str, None, "file holding a bearer token for it (or a user and password)", True
    ),
    "prometheus_user": Key(_str, None, "basic-auth user for it"),
    "prometheus_password_file": Key(_str, None, "file holding that user's password", True),
    "prometheus_ca": Key(_str, None, "CA bundle to check its https certificate", True),
    "prometheus_forget_after": Key(
        _forget_after,
        PROM_FORGET_AFTER_S,
        "seconds without a sample after which a host leaves the screen (0: never)",
    ),
    "prometheus_max_answer": Key(
        _integer(1 << 16, 1 << 34),
        PROM_MAX_ANSWER,
        "bytes of one answer read at most; a larger one is refused, never held whole",
    ),
    "prometheus_max_series": Key(
        _integer(1, 1 << 24),
        PROM_MAX_SERIES,
        "series in one answer at most; an answer with more is refused",
    ),
    "prometheus_max_hosts": Key(
        _integer(1, 1 << 20),
        PROM_MAX_HOSTS,
        "hosts read from the store at most; more are left out, saying so",
    ),
    "prometheus_allow_plain_http_credentials": Key(
        _bool,
        False,
        "send the token or password over plain http:// to a host not on loopback",
    ),
}


# The store's settings a command line gives too, for ``--prometheus URL``: ``--prometheus-ca``,
# ``--prometheus-token-file``, ... (the key's name with dashes, the same meaning; files only:
# a password or token on the command line would show in ``ps`` and the shell's history).
PROMETHEUS_OPTIONS = (
    "prometheus_ca",
    "prometheus_token_file",
    "prometheus_user",
    "prometheus_password_file",
)


def option_name(key: str) -> str:
    """A ``prometheus*`` key's command-line option: ``prometheus_ca`` -> ``--prometheus-ca``."""
    return "--" + key.replace("_", "-")


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


def check_forget_after(value: Any) -> float:
    """Seconds as ``prometheus_forget_after`` takes them (config and
    ``--prometheus-forget-after``); raises ValueError with one line."""
    try:
        return float(PROMETHEUS_KEYS["prometheus_forget_after"].check(value))
    except _Bad as e:
        raise ValueError(str(e)) from None


def check_interval(value: Any) -> float:
    """Seconds between samples as ``interval`` takes them (config and ``--interval``); raises
    ValueError with one line."""
    try:
        return float(CLUSTER_KEYS["interval"].check(value))
    except _Bad as e:
        raise ValueError(str(e)) from None


def _keymap(v: Any) -> dict[str, str]:
    if not isinstance(v, dict) or not all(isinstance(x, str) for x in v.values()):
        raise _Bad(f'expected a table of binding id = "key", got {_show(v)}')
    return dict(v)


_DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp64")


def _floors(v: Any) -> dict[str, dict[str, float]]:
    from gpuctl.workloads.accept_suite.peaks import check_floor

    if not isinstance(v, dict) or not all(isinstance(t, dict) for t in v.values()):
        raise _Bad(f"expected tables of dtype = fraction per GPU model, got {_show(v)}")
    try:
        return {
            key: {dtype: check_floor(key, dtype, x) for dtype, x in table.items()}
            for key, table in v.items()
        }
    except ValueError as e:
        raise _Bad(str(e)) from None


def _gemm_dtypes(v: Any) -> tuple[str, ...]:
    from gpuctl.workloads.accept_suite.peaks import DTYPE_COLUMN

    names = _lines(v)
    bad = [d for d in names if d not in DTYPE_COLUMN]
    if bad or not names:
        known = ", ".join(DTYPE_COLUMN)
        raise _Bad(f"unknown dtype {bad[0]!r} (known: {known})" if bad else "names no dtype")
    return names


_WEEK = 7 * 86400.0

# The feature tables: [name] -> key -> Key. What reads each: fleet/ (fleet), tui/ (tui),
# fleet/control.py and cli/stress.py (stress), cli/accept.py and the TUI's a key (accept),
# jobs/executor.py (jobs).
SECTIONS: dict[str, dict[str, Key]] = {
    "fleet": {
        "concurrency": Key(_integer(1, 4096), 32, "nodes connecting at once"),
        "connect_timeout": Key(_number(0.5, 600), 20.0, "seconds for an agent to say hello"),
        "stale_after": Key(_number(0.5, 3600), 3.0, "seconds without a sample: the node is stale"),
        "backoff_base": Key(_number(0.01, 600), 1.0, "first reconnect delay, seconds"),
        "backoff_max": Key(_number(0.01, 3600), 8.0, "longest reconnect delay, seconds"),
        "liveness_timeout": Key(
            _liveness, 30.0, "an agent that hears nothing this long stops its burns (0: never)"
        ),
    },
    "tui": {
        "theme": Key(_str, None, "dark, light or high-contrast (else the last one chosen)"),
        "keys": Key(_keymap, {}, 'remapped keys by binding id: { stress_gpu = "x" } (see ?)'),
        "confirm_burn": Key(
            _bool,
            True,
            "s asks before it burns one GPU (false: only over other users' processes;"
            " S and B always ask)",
        ),
        "temp_warn": Key(_number(0, 200), 75.0, "°C from which a temperature shows warm (yellow)"),
        "temp_critical": Key(_number(0, 200), 85.0, "°C from which it shows hot (red)"),
        "mem_warn": Key(_number(0, 100), 80.0, "% of GPU memory from which it shows nearly full"),
        "mem_critical": Key(
            _number(0, 100), None, "% of GPU memory shown red (default: never: full is no fault)"
        ),
        "ascii": Key(
            _bool,
            None,
            "draw only ASCII (default: when the locale is C/POSIX or cannot encode the glyphs)",
        ),
    },
    "stress": {
        "duration": Key(_number(0.5, _WEEK), None, "seconds a burn lasts (default: max_duration)"),
        "max_duration": Key(_number(1, _WEEK), 3600.0, "longest burn a node allows, seconds"),
        "engine": Key(_choice("auto", "torch", "gpu-burn"), "auto", "auto, torch or gpu-burn"),
        "dtype": Key(_choice(*_DTYPES), None, "fp32, tf32, bf16, fp16 or fp64 (default bf16)"),
        "mem_fraction": Key(_number(0.05, 0.99), 0.9, "share of free GPU memory a burner uses"),
        "gpu_burn": Key(_str, None, "path of a gpu_burn binary on the nodes"),
        "gpu_burn_source": Key(_str, None, "gpu-burn source folder on the nodes, to build from"),
        "workload_python": Key(_str, None, "Python with torch on the nodes (default: cluster's)"),
    },
    "accept": {
        "python": Key(_str, None, "Python with torch on the nodes (default: workload_python)"),
        "expect_gpus": Key(_integer(0, 1024), None, "GPUs each node must show"),
        "allow_no_gpu": Key(_bool, False, "pass a node without GPUs (CPU-only runs)"),
        "floor": Key(
            _number(0.01, 1.0),
            None,
            "one share of the reference peak for every GEMM (default: per model and dtype)",
        ),
        "floors": Key(_floors, {}, "floors per model and dtype: [accept.floors.L40S] fp32 = 0.35"),
        "dtypes": Key(_gemm_dtypes, None, 'GEMM dtypes checked (default ["fp32", "tf32", "bf16"])'),
        "timeout": Key(_number(1, _WEEK), 3600.0, "seconds before a node's suite is stopped"),
        "threshold": Key(_number(0.0, 1.0), 0.1, "drop below the node's history that fails it"),
        "expect_model": Key(_str, None, "[SHAPE]: every GPU's name contains this, e.g. H100"),
        "expect_nvlinks": Key(_integer(0, 64), None, "[SHAPE]: active NVLinks per GPU"),
        "expect_mig": Key(_choice("on", "off"), "off", "[SHAPE]: the MIG mode of every GPU"),
        "memtest_mb": Key(_integer(1, 1 << 20), None, "MiB [MEMTEST] tests (default: 90% of free)"),
        "gpus_per_node": Key(_integer(1, 1024), None, "via slurm: tasks (GPUs) per node"),
        "partition": Key(_str, None, "via slurm: the partition to submit to"),
        "slurm_conf": Key(
            _str, None, "via slurm: slurm.conf to submit with (default: the Slurm cluster's)", True
        ),
        "job_dir": Key(_str, None, "via slurm: folder shared with the nodes for the job", True),
    },
    "jobs": {
        "dir": Key(_str, None, "job folders under <dir>/<user> (shared by Slurm nodes)", True),
        "partition": Key(_str, None, "target slurm: the partition to submit to"),
        "slurm_conf": Key(
            _str,
            None,
            "target slurm: slurm.conf to submit with (default: the Slurm cluster's)",
            True,
        ),
        "env_root": Key(_str, None, "where VENV2 environments are built on the nodes"),
        "setup": Key(_lines, [], "shell lines run before every job's VENV2 starts"),
        "max_payload": Key(_size, None, 'largest pickled payload a submit or map sends ("1G")'),
        "cancel_on_interrupt": Key(
            _bool, False, "Ctrl-C while waiting for a job cancels it (else it keeps running)"
        ),
    },
}


# -- typed settings: one class per feature table, its fields the table's keys -------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class Section:
    """The checked keys of one feature table, typed: each field is a key of ``SECTIONS[name]``
    with that key's default (a test holds the two equal), and ``given`` names the keys the
    files set. Consumers read the fields; what passes a table on as options where the
    receiver has defaults of its own (``[stress]`` to ``stress_start``, ``[accept]`` to the
    TUI's runs) takes ``given_values()``, so an unset key leaves the receiver's default."""

    name = ""  # the table's name, ``[fleet]``
    given: frozenset[str] = frozenset()

    def given_values(self) -> dict[str, Any]:
        """The keys the config files set, with their checked values."""
        return {k: getattr(self, k) for k in SECTIONS[self.name] if k in self.given}


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetSettings(Section):
    """``[fleet]``: how the login side keeps its agents (``gpuctl.fleet.fleet.Fleet``)."""

    name = "fleet"
    concurrency: int = 32
    connect_timeout: float = 20.0
    stale_after: float = 3.0
    backoff_base: float = 1.0
    backoff_max: float = 8.0
    liveness_timeout: float = 30.0


@dataclass(frozen=True, slots=True, kw_only=True)
class TuiSettings(Section):
    """``[tui]``: the screen's theme, remapped keys (binding id -> key), whether ``s`` asks
    before it burns one GPU (``confirm_burn``), and where a temperature (°C) and a GPU's memory
    (% used) turn warm and hot on the screen (``mem_critical`` None: memory is never red),
    and whether it draws only ASCII (``ascii`` None: as the locale allows: ``tui.glyphs``)."""

    name = "tui"
    theme: str | None = None
    keys: Mapping[str, str] = field(default_factory=dict)
    confirm_burn: bool = True
    temp_warn: float = 75.0
    temp_critical: float = 85.0
    mem_warn: float = 80.0
    mem_critical: float | None = None
    ascii: bool | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class StressSettings(Section):
    """``[stress]``: the defaults of a burn (``stress_start`` fields)."""

    name = "stress"
    duration: float | None = None
    max_duration: float = 3600.0
    engine: str = "auto"
    dtype: str | None = None
    mem_fraction: float = 0.9
    gpu_burn: str | None = None
    gpu_burn_source: str | None = None
    workload_python: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class AcceptSettings(Section):
    """``[accept]``: the acceptance suite's expectations and where it runs."""

    name = "accept"
    python: str | None = None
    expect_gpus: int | None = None
    allow_no_gpu: bool = False
    floor: float | None = None
    floors: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    dtypes: tuple[str, ...] | None = None
    timeout: float = 3600.0
    threshold: float = 0.1
    expect_model: str | None = None
    expect_nvlinks: int | None = None
    expect_mig: str = "off"
    memtest_mb: int | None = None
    gpus_per_node: int | None = None
    partition: str | None = None
    slurm_conf: str | None = None
    job_dir: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class JobsSettings(Section):
    """``[jobs]``: the job runner's folders, environments and limits."""

    name = "jobs"
    dir: str | None = None
    partition: str | None = None
    slurm_conf: str | None = None
    env_root: str | None = None
    setup: tuple[str, ...] = ()
    max_payload: int | str | None = None
    cancel_on_interrupt: bool = False


@dataclass(frozen=True, slots=True)
class PrometheusConfig:
    """A cluster's ``prometheus*`` keys (see ``PROMETHEUS_KEYS``), checked: where the store is
    and how to ask it (``gpuctl.fleet.prom`` reads it as is). ``url``
    (http(s)://host:port[/prefix]), ``match`` (label matchers every query carries:
    ``cluster="a"``, braces optional), a bearer token file, or a user with a password file
    (basic auth), a CA bundle for TLS, and how old a host's newest sample may be before it
    leaves the fleet (``forget_after``)."""

    url: str
    match: str = ""
    token_file: str | None = None
    user: str | None = None
    password_file: str | None = None
    ca: str | None = None
    forget_after: float = PROM_FORGET_AFTER_S  # s without a sample: the host leaves (0: never)
    max_answer: int = PROM_MAX_ANSWER  # bytes of one answer read at most
    max_series: int = PROM_MAX_SERIES  # series of one answer at most
    max_hosts: int = PROM_MAX_HOSTS  # hosts held at most
    allow_plain_http_credentials: bool = False  # a secret over http:// to a non-loopback host
    timeout: float = 30.0  # per query: a busy store answers 16,384 GPUs' series in seconds
    options: bool = False  # given as ``--prometheus`` and its options: lines name those

    def name(self, key: str) -> str:
        """How a line names the setting ``key`` (``prometheus_ca``): as it was given, the
        config's key or the command line's option (``--prometheus-ca``)."""
        return option_name(key) if self.options else key

    def matchers(self) -> str:
        """``match`` without its braces: the matchers to put inside a query's selector."""
        m = self.match.strip()
        if m.startswith("{") and m.endswith("}"):
            m = m[1:-1].strip()
        return m


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
    prometheus: PrometheusConfig | None = None  # the nodes come from this store, not agents


@dataclass(frozen=True, slots=True)
class Config:
    """The whole configuration. Empty (no clusters) means "watch this machine".

    ``path`` is the most specific file read (the user's, else the site's); ``sources`` every
    file read, site files first. The feature tables are typed settings (``Section``): every
    key with its checked value or its default, and which keys the files set.
    """

    path: str | None = None
    clusters: Mapping[str, ClusterConfig] = field(default_factory=dict)
    read_only: bool = False
    audit_log: str | None = None  # a shared audit log (gpuctl.audit); None: the state folder's
    fleet: FleetSettings = FleetSettings()
    tui: TuiSettings = TuiSettings()
    stress: StressSettings = StressSettings()
    accept: AcceptSettings = AcceptSettings()
    jobs: JobsSettings = JobsSettings()
    sources: tuple[str, ...] = ()

    def nodes(self) -> list[NodeConfig]:
        """Every configured node, cluster by cluster, in hostlist order."""
        return [n for c in self.clusters.values() for n in c.nodes]

    @property
    def empty(self) -> bool:
        """True when no cluster is configured: gpuctl then watches this machine."""
        return not self.clusters


COMMAND_LINE = "(command line)"  # the cluster of nodes named on the command line only


def select_nodes(config: Config, names: Sequence[str]) -> Config:
    """``config`` narrowed to the nodes ``names`` (``gpuctl watch gpu[01-04]``): a configured
    node keeps its settings; any other is reached over SSH with the defaults (and the user's ssh
    config), as cluster ``(command line)``."""
    known = {n.name: n for n in config.nodes()}
    wanted = list(dict.fromkeys(names))
    clusters: dict[str, ClusterConfig] = {}
    for cluster in config.clusters.values():
        mine = tuple(n for n in cluster.nodes if n.name in wanted)
        if mine:
            clusters[cluster.name] = replace(cluster, nodes=mine, discover=False)
    others = tuple(NodeConfig(name=n, cluster=COMMAND_LINE) for n in wanted if n not in known)
    if others:
        clusters[COMMAND_LINE] = ClusterConfig(name=COMMAND_LINE, via="ssh", nodes=others)
    return replace(config, clusters=clusters)


def read_hostfile(path: str) -> list[str]:
    """The node names of a hostfile: one name or hostlist per line (``gpu[01-04]``), the first
    word of a line only (an MPI hostfile's ``gpu01 slots=8`` works), ``#`` comments. Raises
    ConfigError with one line (``FILE:LINE: ...``)."""
    try:
        with open(os.path.expanduser(path), "rb") as f:
            # the same rule as the config's: the nodes it names are where stress, acceptance
            # runs and jobs go
            why = unsafe_owner_or_mode(os.fstat(f.fileno()), HOSTFILE_RISK) or unsafe_folder(path)
            if why is not None:
                raise ConfigError(f"--hostfile {path}", None, why)
            lines = f.read().decode("utf-8").splitlines()
    except FileNotFoundError:
        raise ConfigError(f"--hostfile {path}", None, "no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        error = getattr(e, "strerror", None) or e
        raise ConfigError(f"--hostfile {path}", None, f"cannot read it: {error}") from None
    names: list[str] = []
    for number, line in enumerate(lines, 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        try:
            names.extend(expand_hostlist(words[0]))
        except _Bad as e:
            raise ConfigError(path, number, str(e)) from None
    if not names:
        raise ConfigError(f"--hostfile {path}", None, "names no node")
    return names


def parse_nodes(text: str) -> list[str]:
    """A NODES hostlist of the command line, expanded; ConfigError with one line otherwise."""
    try:
        return expand_hostlist(text)
    except _Bad as e:
        raise ConfigError("NODES", None, str(e)) from None


def default_path() -> Path:
    """The user's config file (``gpuctl.paths.config_file()``), whether or not it exists."""
    return paths.config_file()


def config_files(path: str | os.PathLike[str] | None = None) -> list[tuple[str, bool]]:
    """The files ``load_config(path)`` reads, lowest precedence first, as ``(path, required)``:
    the site's files that exist, then ``path``, ``$GPUCTL_CONFIG`` or the user's file (required
    when named explicitly; the user's default file only when it exists)."""
    files = [(str(p), False) for p in reversed(paths.site_config_files()) if p.is_file()]
    if path is None:
        env = os.environ.get(paths.CONFIG_ENV)
        if env:
            files.append((env, True))
        elif default_path().is_file():
            files.append((str(default_path()), False))
    else:
        files.append((os.fspath(path), True))
    return files


def load_config(path: str | os.PathLike[str] | None = None) -> Config:
    """Read, merge and validate the config files (see the module docstring).

    ``path`` None means ``$GPUCTL_CONFIG``, else the user's file. No file at all gives an empty
    Config (this machine). A named file that is missing, or any mistake, raises ConfigError with
    one line ``path:line: message``.
    """
    layers = [(name, _read(name)) for name, _required in config_files(path)]
    if not layers:
        return Config()
    return _parse_layers(layers)


def _read(name: str) -> str:
    try:
        with open(paths.expand(name), "rb") as f:
            why = unsafe_owner_or_mode(os.fstat(f.fileno())) or unsafe_folder(name)
            if why is not None:
                raise ConfigError(name, None, why)
            return f.read().decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(name, None, "no such file") from None
    except IsADirectoryError:
        raise ConfigError(name, None, "is a directory, not a config file") from None
    except PermissionError:
        raise ConfigError(name, None, "cannot read it: permission denied") from None
    except UnicodeDecodeError:
        raise ConfigError(name, None, "is not UTF-8 text") from None


CONFIG_RISK = "another user could run commands on every node through it"
HOSTFILE_RISK = "another user could choose the nodes gpuctl acts on through it"


def unsafe_owner_or_mode(st: os.stat_result, risk: str = CONFIG_RISK) -> str | None:
    """Why a config file (or a hostfile: ``risk`` says what is at stake) with this owner and
    mode may not be used, or None.

    The config is code: its ``setup`` lines, ``python`` and ``[jobs] setup`` run as this user
    on every node. So, like OpenSSH for its own config (``Bad owner or permissions``), a file
    must be owned by this user or root and writable by nobody else (no group or other write
    bit): on a shared login node another user who can write it runs commands as this user
    everywhere. Checked on the open file (``fstat``), so it is the file that is read."""
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid not in (0, os.geteuid()):
        who = f"owned by uid {st.st_uid}, neither you nor root"
    elif mode & 0o022:
        who = "writable by " + (
            "group and others"
            if mode & 0o022 == 0o022
            else "its group"
            if mode & 0o020
            else "others"
        )
    else:
        return None
    return (
        f"Bad owner or permissions (mode {mode:04o}, {who}): {risk}; it must be yours or "
        "root's, writable only by its owner (chmod go-w)"
    )


def unsafe_secret(st: os.stat_result, path: str) -> str | None:
    """Why a file holding a secret (``export --auth-file``, a store's token or password file)
    with this type, owner and mode may not be used, or None: not a regular file, owned by
    another user than this one or root, or readable or writable by others, or writable by its
    group (``mode & 0o026``; a group may read it: the group that scrapes). Checked on the open
    file (``fstat``), so it is the file that is read."""
    mode = stat.S_IMODE(st.st_mode)
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_uid not in (os.getuid(), 0):
        return f"owned by uid {st.st_uid}, not by you or root"
    if mode & 0o026:
        return (
            f"bad permissions {mode:04o}, other users could read or change the secret "
            f"(chmod 600 {path}, or 640 for a group that scrapes)"
        )
    return None


def unsafe_folder(name: str) -> str | None:
    """Why the folders holding a config file make it unsafe, or None: a folder on its path
    (links resolved, up to ``/``) that another user owns, or that its group or others may
    write without the sticky bit, lets them replace the file (renaming theirs over it), which
    its own mode cannot stop. Root's folders and the user's own pass; a sticky folder (``/tmp``)
    lets nobody rename another's file."""
    folder = os.path.dirname(os.path.realpath(paths.expand(name)))
    while True:
        try:
            st = os.stat(folder)
        except OSError:
            return None  # the file was read: a folder that cannot be looked at is not ours to judge
        mode = stat.S_IMODE(st.st_mode)
        if st.st_uid not in (0, os.geteuid()):
            return (
                f"Bad owner or permissions: its folder {folder} is owned by uid {st.st_uid}, "
                "neither you nor root, who could replace the file; keep the file in a folder "
                "of yours"
            )
        if mode & 0o022 and not mode & stat.S_ISVTX:
            return (
                f"Bad owner or permissions: its folder {folder} (mode {mode:04o}) is writable by "
                "others than you, who could replace the file (chmod go-w the folder)"
            )
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent


_TOML_AT = re.compile(r"\s*\(at line (\d+), column \d+\)\s*$")
_TOML_EOF = re.compile(r"\s*\(at end of document\)\s*$")

Origin = tuple[str | None, int | None]  # (file, line) where a key or table was written


def parse_config(text: str, path: str | None = None) -> Config:
    """Validate one file's text (see ``load_config``); ``path`` is used in messages and to
    resolve relative local paths."""
    return _parse_layers([(path, text)])


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


def _parse_layers(layers: Sequence[tuple[str | None, str]]) -> Config:
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


def toml_value(value: Any) -> str:
    """A TOML literal for a default shown by ``config init`` (str, bool, number, list, table)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no TOML form for {value!r}")


# What ``gpuctl config init`` writes for a key that is unset by default: a value of the right
# form, so that uncommenting the line gives valid TOML that gpuctl accepts (a test checks it).
EXAMPLES: dict[str, Any] = {
    "ssh_config": "~/.ssh/config",
    "known_hosts": "~/.ssh/known_hosts",
    "host_key_policy": "accept-new",
    "user": "alice",
    "port": 22,
    "identity": "~/.ssh/id_ed25519",
    "jump": "bastion.example.org",
    "workload_python": "/opt/conda/bin/python3",
    "python": "/opt/conda/bin/python3",
    "simulate": "8:H100",
    "prometheus": "http://prometheus.example.org:9090",
    "prometheus_match": '{cluster="a"}',
    "prometheus_token_file": "~/.config/gpuctl/prometheus.token",
    "prometheus_user": "alice",
    "prometheus_password_file": "~/.config/gpuctl/prometheus.password",
    "prometheus_ca": "/etc/ssl/certs/site-ca.pem",
    "connect_timeout": 15.0,
    "keepalive_interval": 5.0,
    "keepalive_count_max": 3,
    "partition": "gpu",
    "jobid": 123456,
    "slurm_conf": "/etc/slurm/slurm.conf",
    "expect_gpus": 8,
    "theme": "dark",
    "mem_critical": 99.0,
    "ascii": True,
    "duration": 600.0,
    "dtype": "bf16",
    "gpu_burn": "/opt/gpu-burn/gpu_burn",
    "gpu_burn_source": "/opt/gpu-burn",
    "floor": 0.6,
    "dtypes": ["fp32", "tf32", "bf16"],
    "expect_model": "H100",
    "expect_nvlinks": 18,
    "memtest_mb": 4096,
    "gpus_per_node": 8,
    "job_dir": "/shared/gpuctl-accept",
    "dir": "/shared/gpuctl-jobs",
    "env_root": "~/.cache/gpuctl/envs",
    "max_payload": "4G",
}


def _default_line(name: str, key: Key) -> str:
    """``name = value`` for the template: the default, else an example marked as one."""
    if key.default is not None:
        return f"{name} = {toml_value(key.default)}"
    return f"{name} = {toml_value(EXAMPLES[name])}  # unset by default; an example"


def template(*, cluster: str = "main", nodes: str | None = None, note: str | None = None) -> str:
    """A commented config file: every key of every table with its default and its meaning.

    With ``nodes`` (a hostlist) the cluster table is active; without, it is commented out and
    the file configures nothing (gpuctl watches this machine) until its nodes are filled in.
    """
    out = [
        "# gpuctl configuration (written by `gpuctl config init`).",
        "# Every key is shown with its default; uncomment a line to change it.",
        "# `gpuctl config check` shows what gpuctl understood. Site-wide settings may also",
        "# come from /etc/xdg/gpuctl/config.toml; this file overrides them key by key.",
        "",
        "# refuse everything that changes nodes: stress, jobs, acceptance runs",
        "# read_only = false",
        "",
        "# the audit log of actions that change nodes (gpuctl audit): a file the site's admins",
        "# share, e.g. /shared/gpuctl/audit.jsonl; default: ~/.local/state/gpuctl/audit.jsonl",
        '# audit_log = "/shared/gpuctl/audit.jsonl"',
        "",
    ]
    if note:
        out += [f"# {line}" for line in note.splitlines()] + [""]
    active = nodes is not None
    c = "" if active else "# "
    out.append(f"{c}[clusters.{cluster}]")
    for name, key in CLUSTER_KEYS.items():
        out.append(f"{c}# {key.help}")
        if name == "nodes":
            out.append(f"{c}nodes = {toml_value(nodes or 'gpu[01-04]')}")
        else:
            out.append(f"{c}# {_default_line(name, key)}")
    for name, key in PROMETHEUS_KEYS.items():  # past one login node's reach: the site's store
        out.append(f"{c}# {key.help}")
        out.append(f"{c}# {_default_line(name, key)}")
    out.append("")
    for section, keys in SECTIONS.items():
        out.append(f"[{section}]")
        for name, key in keys.items():
            out.append(f"# {key.help}")
            out.append(f"# {_default_line(name, key)}")
        out.append("")
    return "\n".join(out)
