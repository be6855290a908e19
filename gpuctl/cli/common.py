"""Pieces several subcommands share: which fleet to talk to."""

from __future__ import annotations

import argparse

from gpuctl.fleet.demo import demo_nodes
from gpuctl.fleet.fleet import Fleet, simulated_fleet
from gpuctl.fleet.links import LocalLink


def build_fleet(args: argparse.Namespace) -> Fleet:
    """The fleet the command works on: the demo cluster, else this machine."""
    if getattr(args, "demo", False):
        return simulated_fleet(demo_nodes())
    return Fleet({"localhost": LocalLink()})
