"""``gpuctl agent-bundle DIR``: write the node bundle and print its path."""

from __future__ import annotations

import argparse
from typing import Any

from gpuctl.bundle import write_bundle


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "agent-bundle", help="write the node agent zipapp (gpuctl-node-<hash>.pyz) into DIR"
    )
    p.add_argument("dir", metavar="DIR", help="folder to write into (created if missing)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    print(write_bundle(args.dir))
    return 0
