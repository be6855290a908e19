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

Every key of every table is known (``keys.CLUSTER_KEYS``, ``keys.SECTIONS``): its check, its
default and one line of meaning, from which ``gpuctl config init`` writes a commented file. An
unknown key is an error with a "did you mean" when one is close. Every mistake is a ``ConfigError``
whose text is one line: ``path:line: what is wrong``, naming the file that holds the key
(``tomllib`` gives the line of a syntax error; ``gpuctl.tomllines`` the line of each key).
Hostlists are expanded by python-hostlist, never by hand.

The package, one mechanism a module, each importing only those above it in this list:

- ``keys``: every key, its check, default and meaning; hostlists expanded.
- ``model``: what the files say, typed (``Config``, ``ClusterConfig``, ``NodeConfig``, the
  feature tables' ``Section`` classes, ``PrometheusConfig``) and ``ConfigError``.
- ``parse``: a file's text to a ``Config``: TOML, layers merged, each key's line, the checks and
  their words (did you mean).
- ``files``: which files are read, each read safely (owner and mode), and ``load_config``.
- ``nodes``: the nodes named on a command line (``NODES``, ``--hostfile``) and ``select_nodes``.
- ``template``: the commented file ``gpuctl config init`` writes.

What most callers need is importable from ``gpuctl.config`` itself: the model, ``load_config``
and ``parse_config``; the rest from its module.
"""

from gpuctl.config.files import load_config
from gpuctl.config.model import (
    AcceptSettings,
    ClusterConfig,
    Config,
    ConfigError,
    FleetSettings,
    JobsSettings,
    NodeConfig,
    PrometheusConfig,
    Section,
    StressSettings,
    TuiSettings,
)
from gpuctl.config.parse import parse_config

__all__ = [
    "AcceptSettings",
    "ClusterConfig",
    "Config",
    "ConfigError",
    "FleetSettings",
    "JobsSettings",
    "NodeConfig",
    "PrometheusConfig",
    "Section",
    "StressSettings",
    "TuiSettings",
    "load_config",
    "parse_config",
]
