"""``gpuctl export [--listen HOST:PORT] [--allow-remote] [--auth-file FILE] [--demo]``: the
cluster as one Prometheus / OpenMetrics endpoint, fed by the same fleet as the screen."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from gpuctl.cli.base import UserError
from gpuctl.cli.common import add_demo_option
from gpuctl.fleet import eventloop

if TYPE_CHECKING:
    from gpuctl.cli.base import Subcommands
    from gpuctl.fleet.export import Credential
    from gpuctl.fleet.fleet import Fleet


def register(sub: Subcommands) -> None:
    from gpuctl.fleet.export import DEFAULT_LISTEN

    p: argparse.ArgumentParser = sub.add_parser(
        "export", help="serve every GPU of every node as Prometheus metrics"
    )
    p.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        metavar="HOST:PORT",
        help=f"where to serve /metrics (default {DEFAULT_LISTEN}; port 0: any free port)",
    )
    p.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow a --listen address other than loopback (the metrics name your nodes, "
        "jobs and users: anyone who reaches the port reads them)",
    )
    p.add_argument(
        "--auth-file",
        metavar="FILE",
        help="serve only requests that carry the secret FILE holds (Authorization: Bearer, or "
        "as the basic-auth password; Prometheus reads the same file); FILE must not be "
        "readable by others",
    )
    add_demo_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace, *, read_timeout: float | None = None) -> int:
    """``read_timeout``: how long a connection may take to send its request head (default
    ``READ_TIMEOUT``, 10 s). Not an option: a scraper sends its request at once; the tests pass
    a short one to see idle connections closed without waiting 10 s of it."""
    from gpuctl.cli.common import build_fleet, listen_address

    host, port = listen_address(
        args.listen,
        allow_remote=args.allow_remote,
        why_local="the metrics name your nodes, jobs and users",
    )
    credential = None
    if args.auth_file is not None:
        from gpuctl.fleet.export import AuthFileError, Credential

        try:
            credential = Credential.load(args.auth_file)
        except AuthFileError as e:
            raise UserError(str(e)) from None
    args.read_only = True  # an exporter only watches: its agents refuse stress and acceptance
    fleet = build_fleet(args)
    return eventloop.run(
        serve(
            fleet,
            host,
            port,
            listen=args.listen,
            demo=args.demo,
            credential=credential,
            read_timeout=read_timeout,
        )
    )


async def serve(
    fleet: Fleet,
    host: str,
    port: int,
    *,
    listen: str,
    demo: bool = False,
    credential: Credential | None = None,
    read_timeout: float | None = None,
) -> int:
    """Serve ``fleet`` at ``host:port`` until SIGINT or SIGTERM; 0 then."""
    from gpuctl.cli.common import running_fleet
    from gpuctl.fleet.export import READ_TIMEOUT, FleetExporter, MetricsServer

    try:
        server = MetricsServer(
            FleetExporter(fleet),
            host,
            port,
            credential=credential,
            read_timeout=READ_TIMEOUT if read_timeout is None else read_timeout,
        )
    except OSError as e:
        raise UserError(f"cannot listen on {listen}: {e.strerror or e}") from None
    try:
        async with running_fleet(fleet, demo=demo) as stop:
            print(
                f"gpuctl export: {server.url()} ({len(fleet.names)} nodes; "
                f"{'requests need the --auth-file secret; ' if credential else ''}Ctrl-C stops)",
                flush=True,
            )
            await stop.wait()
    finally:
        server.close()
    return 0
