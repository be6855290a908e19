"""``gpuctl doctor [NODES] [--json]``: what stands between this machine and each node, one line
per check with what to do where one fails (see ``gpuctl.doctor``)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import TYPE_CHECKING

from gpuctl.cli.base import ExitCode
from gpuctl.cli.common import emit_json
from gpuctl.config import Config, ConfigError, NodeConfig, load_config
from gpuctl.config.nodes import parse_nodes

if TYPE_CHECKING:
    from gpuctl.cli.base import Subcommands

STATE_WORDS = {"ok": "ok", "warn": "WARN", "fail": "FAIL", "skip": "skip"}


def register(sub: Subcommands) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "doctor",
        help="check every step to each node (ssh config, host key, login, shell, python, "
        "agent, GPUs, jobs' Python, Slurm) and say what to fix",
    )
    p.add_argument(
        "nodes",
        nargs="?",
        metavar="NODES",
        help="a hostlist (default: every configured node, or this machine); names not in the "
        "config are reached as your ssh config says",
    )
    p.add_argument("--json", action="store_true", help="JSON for scripts (an object: checks)")
    p.set_defaults(func=run)


def _nodes(config: Config, hostlist: str | None) -> list[NodeConfig]:
    from gpuctl.cli.base import UserError
    from gpuctl.doctor import local_node

    if hostlist is None:
        return config.nodes() or [local_node()]
    try:
        names = parse_nodes(hostlist)
    except ConfigError as e:
        raise UserError(str(e)) from None
    known = {n.name: n for n in config.nodes()}
    return [known.get(n) or NodeConfig(name=n, cluster="(not configured)") for n in names]


def run(args: argparse.Namespace) -> int:
    from gpuctl.doctor import login_checks, passed, run_doctor

    config_error = None
    try:
        config = load_config(getattr(args, "config", None))
    except ConfigError as e:
        config, config_error = Config(), str(e)
    nodes = _nodes(config, args.nodes)
    checks = login_checks(config, config_error)
    slurm = any(c.name == "Slurm" and c.state == "ok" for c in checks)  # it answers from here
    checks += asyncio.run(run_doctor(nodes, slurm=slurm))
    ok = passed(checks)
    if args.json:
        emit_json({"ok": ok, "checks": [c.to_json() for c in checks]})
        return ExitCode.OK if ok else ExitCode.FAILED
    width = max(len(c.node) for c in checks)
    name_width = max(len(c.name) for c in checks)
    for c in checks:
        line = f"{c.node:<{width}}  {c.name:<{name_width}}  {STATE_WORDS[c.state]:<4}  {c.detail}"
        if c.fix and c.state not in ("ok", "skip"):
            line += f"; fix: {c.fix}"
        print(line)
    bad = [c for c in checks if c.state in ("warn", "fail")]
    summary = ", ".join(
        f"{sum(1 for c in checks if c.state == s)} {w}"
        for s, w in (("ok", "ok"), ("warn", "warn"), ("fail", "failed"), ("skip", "skipped"))
    )
    where = f"; look at: {', '.join(sorted({c.node for c in bad}))}" if bad else ""
    print(f"{len(checks)} checks: {summary}{where}", file=sys.stderr)
    return ExitCode.OK if ok else ExitCode.FAILED
