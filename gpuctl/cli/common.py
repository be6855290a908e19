"""Pieces several subcommands share: the configuration and which fleet to talk to."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import time
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from gpuctl.config import Config, ConfigError, load_config

if TYPE_CHECKING:
    from gpuctl.context import Context
    from gpuctl.jobs.store import JobStore
from gpuctl.fleet.demo import demo_nodes
from gpuctl.fleet.fleet import Fleet, simulated_fleet

JSON_VERSION = 1  # the layout of --json documents; changes when a field loses its meaning


def emit_json(body: Mapping[str, Any]) -> None:
    """Write one ``--json`` document on stdout: an object with ``version`` (of this layout,
    ``JSON_VERSION``), ``gpuctl`` (the program's version) and ``generated_at`` (UTC, ISO 8601)
    beside the command's own keys, so that scripts can rely on it as it evolves."""
    from gpuctl import __version__

    doc = {
        "version": JSON_VERSION,
        "gpuctl": __version__,
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **body,
    }
    json.dump(doc, sys.stdout, indent=2)
    sys.stdout.write("\n")


def positive_seconds(text: str) -> float:
    """An argparse type: a number of seconds above zero (argparse turns the error into one line)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text}")
    return value


def listen_address(text: str, *, allow_remote: bool, why_local: str) -> tuple[str, int]:
    """``--listen HOST:PORT`` (``[v6]:PORT``; port 0: any free one) of a command that serves
    something (``export``, ``serve``), as (host, port). A mistake, or an address other than
    loopback without ``--allow-remote``, is a UserError of one line; ``why_local`` says what
    the command would expose."""
    import ipaddress

    from gpuctl.cli.base import UserError

    host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise UserError(f"--listen must be HOST:PORT with a port within 0..65535, not {text!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False  # a name other than localhost may resolve to anything
    if not loopback and not allow_remote:
        raise UserError(
            f"--listen {text} is not a loopback address: {why_local}; add --allow-remote to "
            f"serve beyond this machine (or keep 127.0.0.1 and reach it with ssh -L)"
        )
    return host, int(port_text)


def session(args: argparse.Namespace) -> Context:
    """This command's ``gpuctl.context.Context``, built once (at its first use, by
    ``gpuctl.cli.main`` before the command runs when read-only mode matters) and installed as
    the process's: the config named by ``--config``, else ``$GPUCTL_CONFIG``, else the XDG
    file, else empty, and the read-only decision from ``--read-only`` (the top-level one or
    the command's), ``$GPUCTL_READ_ONLY`` and the config (not for the demo's simulated nodes).

    A broken config raises UserError with its one line ``path:line: message`` (nothing kept).
    """
    from gpuctl.cli.base import UserError
    from gpuctl.context import Context, install

    found = getattr(args, "context", None)
    if isinstance(found, Context):
        return found
    try:
        config = load_config(getattr(args, "config", None))
    except ConfigError as e:
        raise UserError(str(e)) from None
    flag = bool(getattr(args, "global_read_only", False) or getattr(args, "read_only", False))
    context = Context.of(config, flag=flag, use_config=not getattr(args, "demo", False))
    args.context = context
    install(context)
    return context


def job_store(args: argparse.Namespace) -> JobStore:
    """The command's session's job store (``gpuctl.context.Context.job_store``: opened once,
    shared by all the command does). Listing and reading jobs needs no config: when it cannot
    be read, the state folder's store all the same (what needs the config says so when it reads
    it). Raises StoreError (one line) when the store cannot be opened."""
    from gpuctl.cli.base import UserError
    from gpuctl.context import Context

    try:
        context = session(args)
    except UserError:  # a broken config: not kept, so the command's own reading refuses
        context = Context()
    return context.job_store()


def load_user_config(args: argparse.Namespace) -> Config:
    """The config named by ``--config``, else ``$GPUCTL_CONFIG``, else the XDG file, else empty:
    the command's session's (``session``), read once. A broken config raises UserError with its
    one line ``path:line: message``."""
    return session(args).config


# ``--demo``'s one meaning wherever a command has it: the simulated cluster ``gpuctl demo``
# shows (``gpuctl.fleet.demo``) instead of the configured nodes; no config is read for it.
DEMO_HELP = (
    "run against the simulated cluster (gpuctl demo's) instead of the configured nodes: "
    "no config, no GPUs needed"
)


def add_demo_option(p: argparse.ArgumentParser) -> None:
    """``--demo``, the same on every command that has it (``DEMO_HELP``)."""
    p.add_argument("--demo", action="store_true", help=DEMO_HELP)


def add_interval_option(p: argparse.ArgumentParser) -> None:
    """``--interval SECONDS``: every node samples this often (over the config's ``interval``)."""

    def seconds(text: str) -> float:
        from gpuctl.config.keys import check_interval

        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected seconds between samples (e.g. 0.5), got {text!r}"
            ) from None
        try:
            return check_interval(value)
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"{e} (seconds between samples)") from None

    p.add_argument(
        "--interval",
        type=seconds,
        metavar="S",
        help="seconds between samples on every node (default: the config's interval, 1)",
    )


def add_nodes_arguments(p: argparse.ArgumentParser) -> None:
    """``NODES`` (a hostlist) and ``--hostfile FILE``: nodes for this command only, without
    writing a config (configured ones keep their settings, others get the defaults)."""
    p.add_argument(
        "nodes",
        nargs="?",
        metavar="NODES",
        help="a hostlist, e.g. 'gpu[01-04]' (default: the configured nodes, or this machine); "
        "names not in the config are reached over ssh as your ssh config says",
    )
    p.add_argument(
        "--hostfile",
        metavar="FILE",
        help="more nodes: one name or hostlist per line (an MPI hostfile works), # comments",
    )
    p.set_defaults(adhoc_nodes=True)  # other commands' own NODES (stress) are not these


def add_prometheus_options(p: argparse.ArgumentParser) -> None:
    """``--prometheus URL`` and ``--prometheus-match SELECTOR``: read the nodes' GPUs from the
    site's Prometheus (DCGM exporter's series) instead of agents (``gpuctl.fleet.prom``)."""
    p.add_argument(
        "--prometheus",
        metavar="URL",
        help="read every GPU from this Prometheus (DCGM exporter's series), no agents; "
        "read-only (a cluster's prometheus key in the config does the same)",
    )
    p.add_argument(
        "--prometheus-match",
        metavar="SELECTOR",
        default="",
        help="with --prometheus: label matchers every query carries, e.g. '{cluster=\"a\"}'",
    )
    p.add_argument(
        "--prometheus-ca",
        metavar="FILE",
        help="with --prometheus: the CA bundle (PEM) to check its https certificate against "
        "instead of the system's (the config's prometheus_ca)",
    )
    p.add_argument(
        "--prometheus-token-file",
        metavar="FILE",
        help="with --prometheus: a file holding a bearer token to send it",
    )
    p.add_argument(
        "--prometheus-user",
        metavar="USER",
        help="with --prometheus: a basic-auth user; its password in --prometheus-password-file",
    )
    p.add_argument(
        "--prometheus-password-file",
        metavar="FILE",
        help="with --prometheus-user: the file holding its password (never the password "
        "itself: a command line shows in ps)",
    )
    p.add_argument(
        "--prometheus-forget-after",
        metavar="S",
        type=forget_after,
        help="a host read from Prometheus whose newest sample is older than this (90, 10m, "
        "1h; 0: never) leaves the screen; added again if it comes back (default: the "
        "config's prometheus_forget_after, 10m)",
    )


def forget_after(text: str) -> float:
    """An argparse type: ``--prometheus-forget-after``, in gpuctl's duration grammar."""
    from gpuctl.config.keys import check_forget_after
    from gpuctl.node.protocol import parse_seconds

    seconds = parse_seconds(text)
    if seconds is None:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (90, 10m, 1h)")
    try:
        return check_forget_after(seconds)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def chosen_nodes(args: argparse.Namespace) -> list[str] | None:
    """The nodes named by ``NODES`` and ``--hostfile`` (None: neither was given); UserError with
    one line for a bad hostlist or an unreadable file."""
    from gpuctl.cli.base import UserError
    from gpuctl.config.nodes import parse_nodes, read_hostfile

    text, hostfile = getattr(args, "nodes", None), getattr(args, "hostfile", None)
    if not getattr(args, "adhoc_nodes", False) or (text is None and hostfile is None):
        return None
    try:
        names = parse_nodes(text) if text is not None else []
        if hostfile is not None:
            names += read_hostfile(hostfile)
    except ConfigError as e:
        raise UserError(str(e)) from None
    return names


def build_fleet(args: argparse.Namespace, *, prometheus_timeout: float | None = None) -> Fleet:
    """The fleet the command works on: the demo cluster with ``--demo``, else the nodes named
    by ``NODES``/``--hostfile``, else the configured nodes, else this machine. Raises UserError
    for a broken config, a bad hostlist or a failed discovery. ``prometheus_timeout``: the
    seconds a store's poll may take (``status --timeout``), else its own (30 s)."""
    interval: float | None = getattr(args, "interval", None)
    from gpuctl.cli.base import UserError

    if getattr(args, "demo", False):  # reads no config: the flags decide (gpuctl.cli.main)
        read_only = bool(getattr(args, "read_only", False))
        return simulated_fleet(demo_of(args), read_only=read_only, interval=interval or 1.0)
    from gpuctl.config.keys import PROMETHEUS_OPTIONS, option_name
    from gpuctl.config.nodes import select_nodes
    from gpuctl.fleet.build import fleet_from_config
    from gpuctl.fleet.slurm import SlurmError

    context = session(args)
    config = context.config
    names = chosen_nodes(args)
    url = getattr(args, "prometheus", None)
    if url is not None:
        config = prometheus_config(config, url, args, names)
    elif given := [k for k in PROMETHEUS_OPTIONS if getattr(args, k, None) is not None]:
        raise UserError(
            f"{option_name(given[0])} goes with --prometheus URL (a configured cluster's "
            f"store takes {given[0]} in its table)"
        )
    elif names is not None:
        config = select_nodes(config, names)
    forget = getattr(args, "prometheus_forget_after", None)
    changes: dict[str, float] = {}
    if forget is not None:  # every cluster read from a store, --prometheus's or the config's
        changes["forget_after"] = forget
    if prometheus_timeout is not None:
        changes["timeout"] = prometheus_timeout
    if changes:
        from dataclasses import replace

        config = replace(
            config,
            clusters={
                name: c
                if c.prometheus is None
                else replace(c, prometheus=replace(c.prometheus, **changes))  # type: ignore[arg-type]
                for name, c in config.clusters.items()
            },
        )
    try:
        # the session's decision: --read-only, $GPUCTL_READ_ONLY, the config's read_only
        return fleet_from_config(config, read_only=context.read_only, interval=interval)
    except SlurmError as e:
        raise UserError(str(e)) from None


def demo_of(args: argparse.Namespace) -> list[tuple[str, str]]:
    """``--demo``'s nodes: the simulated cluster, or those of it that ``NODES`` and
    ``--hostfile`` name (as they name configured nodes without it); UserError for a name it
    does not have, or for ``--prometheus`` (another source of nodes)."""
    from gpuctl.cli.base import UserError

    if getattr(args, "prometheus", None) is not None:
        raise UserError("--demo runs the simulated cluster: leave out --prometheus")
    nodes = demo_nodes()
    names = chosen_nodes(args)
    if names is None:
        return nodes
    known = dict(nodes)
    missing = [n for n in names if n not in known]
    if missing:
        raise UserError(
            f"{missing[0]} is not a node of the simulated cluster (--demo: "
            f"{nodes[0][0]} to {nodes[-1][0]})"
        )
    return [(n, known[n]) for n in dict.fromkeys(names)]


def prometheus_config(
    config: Config, url: str, args: argparse.Namespace, names: list[str] | None
) -> Config:
    """``config`` with its clusters replaced by one read from ``url`` (``--prometheus``), with
    ``--prometheus-match`` and the TLS and credential options: checked as a cluster's
    ``prometheus*`` keys are (``gpuctl.config.parse.prometheus_target``), files relative to the
    working folder; a mistake is one line naming the option."""
    from dataclasses import replace

    from gpuctl import paths
    from gpuctl.cli.base import UserError
    from gpuctl.config import ClusterConfig
    from gpuctl.config.keys import PROMETHEUS_KEYS, PROMETHEUS_OPTIONS, option_name
    from gpuctl.config.parse import PrometheusKeyError, prometheus_target

    if names is not None:
        raise UserError(
            "--prometheus takes its nodes from the store: leave out NODES and --hostfile"
        )
    values: dict[str, Any] = {"prometheus": url}
    match = getattr(args, "prometheus_match", "")
    if match:
        values["prometheus_match"] = match
    for key in PROMETHEUS_OPTIONS:
        value = getattr(args, key, None)
        if value is None:
            continue
        if not value:
            raise UserError(f"{option_name(key)}: empty")
        if PROMETHEUS_KEYS[key].local_path:  # as the config's: ~ expanded, made absolute
            value = str(paths.expand(value).absolute())
        values[key] = value
    try:
        target = prometheus_target(values, options=True)
    except PrometheusKeyError as e:
        raise UserError(f"{option_name(e.key)}: {e}") from None
    cluster = ClusterConfig(name="prometheus", via="ssh", nodes=(), prometheus=target)
    return replace(config, clusters={cluster.name: cluster})


@contextlib.asynccontextmanager
async def running_fleet(fleet: Fleet, *, demo: bool = False) -> AsyncIterator[asyncio.Event]:
    """Start ``fleet`` (and, with ``demo``, the demo's story) for a command that runs until it
    is stopped (``export``, ``record``); yield an event that SIGINT or SIGTERM sets; on the way
    out stop the story and the fleet (which stops the agents)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    background: list[asyncio.Task[None]] = []
    try:
        await fleet.start()
        if demo:
            from gpuctl.fleet.demo import story

            background.append(asyncio.create_task(story(fleet)))
        yield stop
    finally:
        from gpuctl.fleet.fleet import end_tasks

        await end_tasks(background)  # cancelled again while running: a lost cancel (3.11)
        for task in background:  # its failure is not the command's: retrieved, not raised
            if not task.cancelled():
                task.exception()
        await fleet.stop()
