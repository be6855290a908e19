"""``gpuctl watch`` (and plain ``gpuctl``): the TUI on the configured cluster."""

from __future__ import annotations

import argparse
import io
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gpuctl import logs
from gpuctl.cli.base import UserError
from gpuctl.cli.common import (
    add_ascii_option,
    add_interval_option,
    add_nodes_arguments,
    add_prometheus_options,
    load_user_config,
)
from gpuctl.core.text import printable
from gpuctl.fleet import eventloop

if TYPE_CHECKING:
    from gpuctl.cli.base import Subcommands
    from gpuctl.config import AcceptSettings, Config, TuiSettings
    from gpuctl.context import Context
    from gpuctl.jobs.store import JobStore
    from gpuctl.tui import GpuctlApp


def register(sub: Subcommands) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "watch", help="the live TUI of every GPU of every node (the default command)"
    )
    p.add_argument(
        "--read-only", action="store_true", help="watch only: no stress, no acceptance runs"
    )
    add_interval_option(p)
    add_ascii_option(p)
    add_nodes_arguments(p)
    add_prometheus_options(p)
    p.set_defaults(func=run)


def require_terminal() -> None:
    """The TUI needs a terminal on both ends (or a browser: ``gpuctl serve`` runs it with
    Textual's web driver); say so in one line rather than draw garbage."""
    from gpuctl.tui.serve import served

    if served():
        from gpuctl.tui.serve import bind_session_to_server

        bind_session_to_server()
        return
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UserError("the TUI needs a terminal; for scripts use: gpuctl status --json")


def tui_config(args: argparse.Namespace) -> tuple[TuiSettings, bool]:
    """The config's ``[tui]`` settings (``--ascii`` over its ``ascii``) and its ``read_only``."""
    from dataclasses import replace

    config = load_user_config(args)
    tui = config.tui
    if getattr(args, "ascii", None):
        tui = replace(tui, ascii=True)
    return tui, bool(config.read_only)


def accept_defaults(
    settings: AcceptSettings, config: Config | None = None, names: Sequence[str] = ()
) -> dict[str, Any]:
    """The ``[accept]`` keys the config sets that the TUI's ``a`` passes on (python, floor, ...).

    With ``config``, also each of ``names``' expected GPU count (``gpuctl.accept.expect``: the
    cluster's ``expect_gpus``, ``[accept] expect_gpus``, else Slurm's gres when run)."""
    from dataclasses import fields

    from gpuctl.accept.run import AcceptOptions

    known = {f.name for f in fields(AcceptOptions) if not f.name.startswith("test_")}
    known -= {"quick", "device", "extra_args"}  # the key press decides these
    out = {k: v for k, v in settings.given_values().items() if k in known}
    if config is not None:
        from gpuctl.accept.expect import from_config

        out.pop("expect_gpus", None)  # not typed: a cluster's own count wins over it
        out["expected"], out["gres_from"] = from_config(config, names)
    return out


def open_job_store(context: Context) -> tuple[JobStore | None, str | None]:
    """The session's job store for the jobs pane (``Context.job_store``: the one the jobs it
    attaches write to), or None and why it cannot be opened (one line naming the file and what
    to do). The screen opens either way."""
    from gpuctl.jobs.store import StoreError

    try:
        return context.job_store(), None
    except StoreError as e:  # damaged, unreadable, unwritable: the store's own one line
        return None, printable(e)


def run_tui(app: GpuctlApp, *, headless: bool = False, size: tuple[int, int] | None = None) -> int:
    """Run the TUI and return its exit status: 0, or non-zero when the screen crashed.
    (``headless`` and ``size``, columns and lines, are for tests.)

    Nothing is printed while the screen is drawn (log lines go to the log file only). A crash
    ends in one line on stderr, after the terminal is restored, naming the log file that holds
    its traceback.
    """
    logs.quiet_terminal()
    where = logs.log_file()
    if where is not None:  # Textual's own traceback: the log file has ours
        app.error_console.file = io.StringIO()
    eventloop.run(app.run_async(headless=headless, size=size))  # what app.run does, gathered
    code = app.return_code or 0
    if app.crash is None:
        return code
    error = app.crash
    how = f"traceback in {where}" if where else "no log file: the traceback is above"
    print(
        f"gpuctl: the screen crashed: {type(error).__name__}: {printable(error, limit=300)} "
        f"({how})",
        file=sys.stderr,
    )
    return code or 1


def run(args: argparse.Namespace) -> int:
    from gpuctl.cli.common import build_fleet, chosen_nodes, session
    from gpuctl.fleet import control

    chosen_nodes(args)  # a bad NODES or --hostfile says so before anything else
    require_terminal()
    context = session(args)  # the config read once, read-only decided once
    config = context.config
    fleet = build_fleet(args)
    # the [stress] defaults apply to the keys too
    control.configure(fleet, config.stress.given_values())
    from gpuctl.service import read_only_link_why
    from gpuctl.tui import GpuctlApp

    job_store, job_store_error = open_job_store(context)
    app = GpuctlApp(
        fleet,
        read_only=context.read_only
        or read_only_link_why(fleet) is not None,  # nodes seen through Prometheus
        tui=config.tui,
        state_dir=context.state_dir,
        accept_options=accept_defaults(config.accept, config, list(fleet.nodes)),
        job_store=job_store,
        job_store_error=job_store_error,
    )
    return run_tui(app)
