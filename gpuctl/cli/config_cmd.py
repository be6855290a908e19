"""``gpuctl config check [--json]`` and ``gpuctl config path``: validate the configuration and
show the inventory it expands to."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

from gpuctl.cli.common import load_user_config
from gpuctl.config import Config, NodeConfig, default_path


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "config", help="check the configuration and print the nodes it names"
    )
    csub = p.add_subparsers(dest="config_command", metavar="ACTION")
    check = csub.add_parser("check", help="validate and print the expanded inventory")
    check.add_argument("--json", action="store_true", help="the inventory as JSON")
    check.add_argument(
        "--no-discover", action="store_true", help="do not ask sinfo for discovered clusters"
    )
    check.set_defaults(func=run_check)
    path = csub.add_parser("path", help="print which config file gpuctl reads")
    path.set_defaults(func=run_path)
    p.set_defaults(func=run_check, json=False, no_discover=False)


def config_source(args: argparse.Namespace) -> str:
    """Which file gpuctl reads, and why (for messages)."""
    if getattr(args, "config", None):
        return str(args.config)
    env = os.environ.get("GPUCTL_CONFIG")
    if env:
        return env
    return str(default_path())


def run_path(args: argparse.Namespace) -> int:
    path = config_source(args)
    exists = Path(path).expanduser().exists()
    print(path if exists else f"{path} (missing: gpuctl watches this machine)")
    return 0


def _problems(node: NodeConfig) -> tuple[list[str], list[str]]:
    """(errors, warnings) about login-side files a node's settings name."""
    errors: list[str] = []
    warnings: list[str] = []
    for key in ("ssh_config", "identity", "slurm_conf"):
        value = getattr(node, key)
        if value and not Path(value).is_file():
            errors.append(f"clusters.{node.cluster}.{key}: {value} does not exist")
    if node.via == "ssh" and node.known_hosts and not Path(node.known_hosts).is_file():
        warnings.append(
            f"clusters.{node.cluster}.known_hosts: {node.known_hosts} does not exist: every "
            "node will be refused as unknown"
            + (
                ""
                if node.host_key_policy == "accept-new"
                else ' (or set host_key_policy = "accept-new")'
            )
        )
    return errors, warnings


def run_check(args: argparse.Namespace) -> int:
    config = load_user_config(args)
    if config.empty:
        where = config.path or config_source(args)
        if args.json:
            json.dump({"path": config.path, "nodes": [], "local": True}, sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            print(f"{where}: no clusters configured: gpuctl watches this machine")
        return 0
    nodes, errors, warnings, slurm = _inventory(config, discover=not args.no_discover)
    if args.json:
        doc = {
            "path": config.path,
            "read_only": config.read_only,
            "clusters": {
                name: {"via": c.via, "discover": c.discover, "partition": c.partition}
                for name, c in config.clusters.items()
            },
            "nodes": [{**dataclasses.asdict(n), "slurm_state": slurm.get(n.name)} for n in nodes],
            "errors": errors,
            "warnings": warnings,
        }
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(render_inventory(nodes, slurm))
        ro = ", read-only" if config.read_only else ""
        print(
            f"{config.path}: {len(config.clusters)} cluster(s), {len(nodes)} node(s){ro}",
            file=sys.stderr,
        )
    for w in warnings:
        print(f"gpuctl: warning: {w}", file=sys.stderr)
    for e in errors:
        print(f"gpuctl: {e}", file=sys.stderr)
    return 1 if errors else 0


def _inventory(
    config: Config, *, discover: bool
) -> tuple[list[NodeConfig], list[str], list[str], dict[str, str]]:
    from gpuctl.fleet.build import cluster_nodes
    from gpuctl.fleet.slurm import SlurmError

    nodes: list[NodeConfig] = []
    errors: list[str] = []
    warnings: list[str] = []
    slurm: dict[str, str] = {}
    seen: set[tuple[str, str]] = set()
    for cluster in config.clusters.values():
        if cluster.discover and not discover:
            warnings.append(f"clusters.{cluster.name}: nodes come from sinfo (not asked)")
            continue
        try:
            found, known = cluster_nodes(cluster)
        except SlurmError as e:
            errors.append(f"clusters.{cluster.name}: {e}")
            continue
        for name, sn in known.items():
            why = f" ({sn.reason})" if sn.reason else ""
            slurm[name] = f"{sn.state}{why}"
        nodes.extend(found)
        for node in found:
            errs, warns = _problems(node)
            for msg in errs + warns:
                key = (node.cluster, msg)
                if key in seen:
                    continue
                seen.add(key)
                (errors if msg in errs else warnings).append(msg)
    return nodes, errors, warnings, slurm


def render_inventory(nodes: list[NodeConfig], slurm: dict[str, str]) -> str:
    """The expanded inventory as an aligned table."""
    header = ("NODE", "CLUSTER", "VIA", "PYTHON", "SIMULATE", "INTERVAL", "DETAILS")
    rows = []
    for n in nodes:
        details = []
        if n.via == "ssh":
            details += [f"{k}={getattr(n, k)}" for k in ("user", "port", "jump") if getattr(n, k)]
            if n.host_key_policy != "strict":
                details.append(f"host_keys={n.host_key_policy}")
        if n.via == "srun":
            details.append(f"job={n.jobid}" if n.jobid else "job=(yours, found by squeue)")
        if n.name in slurm:
            details.append(f"slurm={slurm[n.name]}")
        if n.workload_python:
            details.append(f"workload_python={n.workload_python}")
        rows.append(
            (
                n.name,
                n.cluster,
                n.via,
                n.python,
                n.simulate or "-",
                f"{n.interval:g}s",
                " ".join(details),
            )
        )
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in (header, *rows)
    )
