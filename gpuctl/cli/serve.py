"""``gpuctl serve``: the screen in a browser (textual-serve), read-only unless --allow-actions.

Each browser session runs its own ``gpuctl`` screen on this machine with the same cluster (or
the demo), so what the browser shows is what the terminal would. Listens on 127.0.0.1 by
default; the URL printed at start carries the token that every request needs. At most
--max-sessions tabs at once (each is a whole screen with its own agents on the nodes).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
from typing import TYPE_CHECKING

from gpuctl.cli.base import UserError
from gpuctl.cli.common import add_demo_option

if TYPE_CHECKING:
    from gpuctl.cli.base import Subcommands

DEFAULT_LISTEN = "127.0.0.1:8000"


def register(sub: Subcommands) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "serve", help="the screen in a browser (read-only unless --allow-actions)"
    )
    p.add_argument(
        "--listen",
        metavar="HOST:PORT",
        default=DEFAULT_LISTEN,
        help=f"address to listen on ({DEFAULT_LISTEN}; port 0 picks a free one)",
    )
    p.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow an address other than loopback (anyone who can reach it and has the token "
        "gets the screen; prefer ssh -L)",
    )
    p.add_argument(
        "--allow-actions",
        action="store_true",
        help="let the browser stress GPUs and start acceptance runs (default: read-only)",
    )
    p.add_argument(
        "--max-sessions",
        type=int,
        default=None,
        metavar="N",
        help="browser tabs open at once (default 4): each is a gpuctl screen with one agent per "
        "node; the next is refused",
    )
    add_demo_option(p)
    p.add_argument("--nodes", type=int, default=6, metavar="N", help="demo nodes (6)")
    p.add_argument("--gpus", type=int, default=8, metavar="G", help="demo GPUs per node (8)")
    p.set_defaults(func=run)


def session_argv(args: argparse.Namespace) -> list[str]:
    """The command each browser session runs: this gpuctl's screen on the same cluster."""
    argv = [sys.executable, "-m", "gpuctl"]
    if getattr(args, "config", None):
        argv += ["--config", args.config]
    if not args.allow_actions:
        argv.append("--read-only")
    if args.demo:
        argv += ["demo", "--nodes", str(args.nodes), "--gpus", str(args.gpus)]
        if not args.allow_actions:
            argv.append("--read-only")
    else:
        argv.append("watch")
    return argv


def run(args: argparse.Namespace) -> int:
    from gpuctl.cli.common import listen_address
    from gpuctl.tui import serve

    host, port = listen_address(
        args.listen,
        allow_remote=args.allow_remote,
        why_local="anyone who can reach it and has the token gets the screen",
    )
    if args.demo and not (1 <= args.nodes <= 4096 and 1 <= args.gpus <= 64):
        raise UserError("--nodes must be within 1..4096 and --gpus within 1..64")
    most = serve.DEFAULT_MAX_SESSIONS if args.max_sessions is None else args.max_sessions
    if not 1 <= most <= 64:
        raise UserError("--max-sessions must be within 1..64")
    if getattr(args, "read_only", False) and args.allow_actions:
        raise UserError("--allow-actions in read-only mode: the browser would be refused anyway")
    if not args.demo:  # a broken config fails here in one line, not in every browser session
        from gpuctl.cli.common import load_user_config

        load_user_config(args)
    token = serve.new_token()
    mode = "actions allowed" if args.allow_actions else "read-only"

    def ready(bound_host: str, bound_port: int) -> None:
        url = f"http://{serve.url_host(bound_host)}:{bound_port}/?token={token}"
        print(f"gpuctl serve: the screen is at {url} ({mode}; Ctrl+C stops it)", flush=True)
        if bound_host in ("127.0.0.1", "::1", "localhost"):
            print(
                f"from your laptop: ssh -N -L {bound_port}:127.0.0.1:{bound_port} "
                f"{socket.gethostname()}   then open the URL above",
                flush=True,
            )

    try:
        asyncio.run(
            serve.serve(
                session_argv(args),
                host=host,
                port=port,
                token=token,
                max_sessions=most,
                ready=ready,
            )
        )
    except OSError as e:
        raise UserError(f"cannot listen on {args.listen}: {e.strerror or e}") from None
    return 0
