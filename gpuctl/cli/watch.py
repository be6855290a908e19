"""``gpuctl watch`` (and plain ``gpuctl``): the TUI on the configured cluster."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any

from gpuctl.cli.common import load_user_config
from gpuctl.cli.main import UserError


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "watch", help="the live TUI of every GPU of every node (the default command)"
    )
    p.add_argument(
        "--read-only", action="store_true", help="watch only: no stress, no acceptance runs"
    )
    p.set_defaults(func=run)


def require_terminal() -> None:
    """The TUI needs a terminal on both ends; say so in one line rather than draw garbage."""
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UserError("the TUI needs a terminal; for scripts use: gpuctl status --json")


def tui_config(args: argparse.Namespace) -> tuple[dict[str, Any], bool]:
    """The config's ``[tui]`` table and its ``read_only``."""
    config = load_user_config(args)
    return dict(config.tui), bool(config.read_only)


def accept_defaults(table: Mapping[str, Any]) -> dict[str, Any]:
    """The config's ``[accept]`` keys that the TUI's ``a`` passes on (python, floor, ...)."""
    from dataclasses import fields

    from gpuctl.accept.run import AcceptOptions

    known = {f.name for f in fields(AcceptOptions) if not f.name.startswith("test_")}
    known -= {"quick", "device", "extra_args"}  # the key press decides these
    return {k: v for k, v in table.items() if k in known}


def open_job_store() -> Any | None:
    """The user's job store for the jobs pane, or None when it cannot be opened."""
    try:
        from gpuctl.jobs.store import JobStore

        return JobStore()
    except (ImportError, OSError, ValueError):
        return None


def run(args: argparse.Namespace) -> int:
    from gpuctl.cli.common import build_fleet
    from gpuctl.fleet import control

    require_terminal()
    config = load_user_config(args)
    fleet = build_fleet(args)
    control.configure(fleet, config.stress)  # the [stress] defaults apply to the keys too
    from gpuctl.tui import make_app

    app = make_app(
        fleet,
        read_only=bool(getattr(args, "read_only", False)) or config.read_only,
        config_tui=dict(config.tui),
        accept_options=accept_defaults(config.accept),
        job_store=open_job_store(),
    )
    result = app.run()
    return int(result or 0)
