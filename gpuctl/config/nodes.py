"""The nodes a command acts on when named on its command line: ``NODES`` hostlists, a
``--hostfile``, and the config narrowed to them (``select_nodes``)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace

from gpuctl.config.files import HOSTFILE_RISK, unsafe_folder, unsafe_owner_or_mode
from gpuctl.config.keys import _Bad, expand_hostlist
from gpuctl.config.model import ClusterConfig, Config, ConfigError, NodeConfig

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
