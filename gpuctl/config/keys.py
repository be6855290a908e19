"""Every key of the configuration: its check, its default and one line of meaning.

``CLUSTER_KEYS`` (a ``[clusters.NAME]`` table, ``[defaults]`` and an override), ``PROMETHEUS_KEYS``
(a cluster read from a site's store), ``SECTIONS`` (the feature tables ``[fleet]``, ``[tui]``,
``[stress]``, ``[accept]``, ``[jobs]``) and ``TOP_KEYS``. A checker returns the clean value or
raises ``_Bad`` with the words of the mistake; ``gpuctl.config.parse`` says where it is.
Hostlists are expanded by python-hostlist, never by hand (``expand_hostlist``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import hostlist

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
        "idle_after": Key(
            _number(1, _WEEK), 1800.0, "seconds a GPU in a Slurm job idles: allocated but idle"
        ),
        "idle_below": Key(_number(0, 100), 5.0, "% of utilization and memory traffic: idle"),
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


def _show(v: Any) -> str:
    if isinstance(v, dict):
        return "a table"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, bool):
        return "true" if v else "false"
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."
