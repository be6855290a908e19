"""``gpuctl config check [--json]``, ``config path`` and ``config init``: validate the
configuration and show the inventory it expands to, say which files are read, write a commented
starting file."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import stat
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from gpuctl import paths
from gpuctl.cli.base import ExitCode
from gpuctl.cli.common import emit_json, load_user_config
from gpuctl.config import Config, NodeConfig
from gpuctl.config.files import config_files, default_path
from gpuctl.config.template import template

if TYPE_CHECKING:
    from gpuctl.cli.base import Subcommands


def register(sub: Subcommands) -> None:
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
    path = csub.add_parser("path", help="print which config files gpuctl reads")
    path.set_defaults(func=run_path)
    init = csub.add_parser(
        "init",
        help="write a commented config (every key, its default, its meaning); "
        "with Slurm, the nodes come from sinfo",
    )
    init.add_argument("--force", action="store_true", help="replace an existing file")
    init.add_argument("--stdout", action="store_true", help="print it instead of writing it")
    init.add_argument("--partition", help="take the nodes of this Slurm partition only")
    init.add_argument("--cluster", default=None, help="the cluster's name in the file")
    init.set_defaults(func=run_init)
    p.set_defaults(func=run_check, json=False, no_discover=False)


def config_source(args: argparse.Namespace) -> str:
    """Which file gpuctl reads, and why (for messages)."""
    if getattr(args, "config", None):
        return str(args.config)
    env = os.environ.get(paths.CONFIG_ENV)
    if env:
        return env
    return str(default_path())


def run_path(args: argparse.Namespace) -> int:
    files = config_files(getattr(args, "config", None))
    for name, _required in files:
        print(name if Path(name).expanduser().exists() else f"{name} (missing)")
    if not files:
        print(f"{config_source(args)} (missing: gpuctl watches this machine)")
    return 0


def _slurm_nodes(partition: str | None) -> tuple[str | None, str, str]:
    """(hostlist of Slurm's GPU nodes or None, cluster name, a note for the file)."""
    import shutil

    import hostlist

    from gpuctl.reach.slurm import SlurmClient, SlurmError

    if shutil.which("sinfo") is None:
        return None, "main", "No Slurm here (no sinfo): fill in the nodes and uncomment."
    client = SlurmClient(timeout=10)
    try:
        found = client.nodes(partition)
    except SlurmError as e:
        return None, "main", f"Slurm did not answer ({e}): fill in the nodes and uncomment."
    gpu = [n.name for n in found if n.gpus] or [n.name for n in found]
    if not gpu:
        where = f"partition {partition}" if partition else "this Slurm cluster"
        return None, "main", f"sinfo lists no node in {where}: fill in the nodes."
    name = "main"
    with contextlib.suppress(SlurmError):
        name = client.config_value("ClusterName") or name
    kind = "GPU nodes" if any(n.gpus for n in found) else "nodes"
    where = f" of partition {partition}" if partition else ""
    note = f"The {len(gpu)} {kind}{where} sinfo listed when this file was written."
    return hostlist.collect_hostlist(gpu), name, note


def run_init(args: argparse.Namespace) -> int:
    from gpuctl.cli.base import UserError

    nodes, name, note = _slurm_nodes(args.partition)
    text = template(cluster=args.cluster or name, nodes=nodes, note=note)
    if args.stdout:
        sys.stdout.write(text)
        return 0
    target = Path(config_source(args)).expanduser()
    if target.exists() and not args.force:
        raise UserError(f"{target} exists: --force replaces it, --stdout prints the new one")
    tmp = target.with_name(f".{target.name}.tmp")
    try:
        # the XDG config folder is gpuctl's own; a folder --config names keeps its mode
        paths.private_dir(target.parent, ours=target == paths.config_file())
        tmp.write_text(text, encoding="utf-8")
    except OSError as e:  # the file the user named (--config, $GPUCTL_CONFIG): a mistake
        from gpuctl.cli.base import os_error

        raise UserError(f"cannot write the config: {os_error(e)}") from None
    # writable by you alone whatever the umask (002 on many sites): gpuctl refuses a config
    # others can write, since its setup lines run on every node (config.files.unsafe_owner_or_mode)
    tmp.chmod(stat.S_IMODE(tmp.stat().st_mode) & ~0o022)
    os.replace(tmp, target)
    found = f"{nodes} from sinfo" if nodes else "no nodes yet: fill them in"
    print(f"wrote {target} ({found}); check it with: gpuctl config check")
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
            emit_json(
                {"path": config.path, "sources": list(config.sources), "nodes": [], "local": True}
            )
        else:
            print(f"{where}: no clusters configured: gpuctl watches this machine")
        return 0
    nodes, errors, warnings, slurm = _inventory(config, discover=not args.no_discover)
    if args.json:
        doc = {
            "path": config.path,
            "sources": list(config.sources),
            "read_only": config.read_only,
            "clusters": {
                name: {
                    "via": c.via,
                    "discover": c.discover,
                    "partition": c.partition,
                    "prometheus": c.prometheus.url if c.prometheus else None,
                }
                for name, c in config.clusters.items()
            },
            "nodes": [{**dataclasses.asdict(n), "slurm_state": slurm.get(n.name)} for n in nodes],
            "errors": errors,
            "warnings": warnings,
        }
        emit_json(doc)
    else:
        print(render_inventory(nodes, slurm))
        for c in config.clusters.values():
            if c.prometheus is not None:
                match = f" {c.prometheus.match}" if c.prometheus.match else ""
                how = "acting via its nodes" if c.nodes or c.discover else "read-only"
                print(f"cluster {c.name}: watched through {c.prometheus.url}{match} ({how})")
        ro = ", read-only" if config.read_only else ""
        print(
            f"{', '.join(config.sources)}: {len(config.clusters)} cluster(s), "
            f"{len(nodes)} node(s){ro}",
            file=sys.stderr,
        )
    for w in warnings:
        print(f"gpuctl: warning: {w}", file=sys.stderr)
    for e in errors:
        print(f"gpuctl: {e}", file=sys.stderr)
    return ExitCode.FAILED if errors else ExitCode.OK


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
            if n.host_key_policy not in (None, "strict"):  # unset: as the ssh config says
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
