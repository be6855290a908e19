"""``gpuctl config init``'s file: every key of every table with its default (else an example of
the right form) and its meaning, commented out."""

from __future__ import annotations

from typing import Any

from gpuctl.config.keys import CLUSTER_KEYS, PROMETHEUS_KEYS, SECTIONS, Key


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
