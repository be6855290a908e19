"""``gpuctl demo``: the TUI on a simulated cluster, nothing to configure.

The story the demo tells is ``gpuctl.fleet.demo.story``.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from gpuctl.cli.base import UserError
from gpuctl.cli.common import add_ascii_option, add_interval_option
from gpuctl.fleet.demo import story

if TYPE_CHECKING:
    from gpuctl.cli.base import Subcommands

__all__ = ["register", "run", "story"]


def register(sub: Subcommands) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "demo", help="the TUI on a simulated cluster (no configuration, no GPUs needed)"
    )
    p.add_argument("--nodes", type=int, default=6, metavar="N", help="simulated nodes (6)")
    p.add_argument("--gpus", type=int, default=8, metavar="G", help="GPUs per node (8)")
    p.add_argument("--read-only", action="store_true", help="no stress, no acceptance runs")
    p.add_argument(
        "--no-story", action="store_true", help="no throttling GPU, XID or stalling node"
    )
    add_interval_option(p)
    add_ascii_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gpuctl.cli.watch import open_job_store, require_terminal, run_tui, tui_config
    from gpuctl.fleet.demo import DEMO_IDLE_AFTER_S, demo_nodes
    from gpuctl.fleet.fleet import simulated_fleet

    if not 1 <= args.nodes <= 4096:
        raise UserError(f"--nodes must be within 1..4096, not {args.nodes}")
    if not 1 <= args.gpus <= 64:
        raise UserError(f"--gpus must be within 1..64, not {args.gpus}")
    require_terminal()
    from gpuctl import audit

    audit.keep(False)  # the simulated cluster's burns and signals are no record of actions
    tui, _ = tui_config(args)
    fleet = simulated_fleet(
        demo_nodes(args.nodes, args.gpus),
        read_only=args.read_only,
        interval=args.interval or 1.0,
        idle_after=DEMO_IDLE_AFTER_S,  # the story's idle job shows in a minute, not 30
    )
    from gpuctl.context import Context
    from gpuctl.tui import GpuctlApp

    # the demo's session: no config (the flags decide), the state folder's job store
    job_store, job_store_error = open_job_store(Context())
    app = GpuctlApp(
        fleet,
        read_only=args.read_only,
        simulated=True,
        tui=tui,
        job_store=job_store,
        job_store_error=job_store_error,
        # ``a`` runs the suite simulated on the simulated GPUs: the demo needs no torch
        accept_options={"device": "sim"},
    )
    if not args.no_story:
        app.background.append(lambda: story(fleet, burns=app.stress_flow.own_burns))
    return run_tui(app)
