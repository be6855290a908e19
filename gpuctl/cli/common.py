"""Pieces several subcommands share: the configuration and which fleet to talk to."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping
from typing import Any

from gpuctl.config import Config, ConfigError, load_config
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


def load_user_config(args: argparse.Namespace) -> Config:
    """The config named by ``--config``, else ``$GPUCTL_CONFIG``, else the XDG file, else empty.

    A broken config raises UserError with its one line ``path:line: message``.
    """
    from gpuctl.cli.main import UserError

    try:
        return load_config(getattr(args, "config", None))
    except ConfigError as e:
        raise UserError(str(e)) from None


def add_interval_option(p: argparse.ArgumentParser) -> None:
    """``--interval SECONDS``: every node samples this often (over the config's ``interval``)."""

    def seconds(text: str) -> float:
        from gpuctl.config import check_interval

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


def build_fleet(args: argparse.Namespace) -> Fleet:
    """The fleet the command works on: the demo cluster with ``--demo``, else the configured
    nodes, else this machine. Raises UserError for a broken config or a failed discovery."""
    read_only = bool(getattr(args, "read_only", False))
    interval: float | None = getattr(args, "interval", None)
    if getattr(args, "demo", False):
        return simulated_fleet(demo_nodes(), read_only=read_only, interval=interval or 1.0)
    from gpuctl.cli.main import UserError
    from gpuctl.fleet.build import fleet_from_config
    from gpuctl.fleet.slurm import SlurmError

    config = load_user_config(args)
    try:
        return fleet_from_config(config, read_only=read_only or config.read_only, interval=interval)
    except SlurmError as e:
        raise UserError(str(e)) from None
