"""``gpuctl agent-bundle DIR``: write the node bundle and print its path."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from gpuctl.bundle import write_bundle

if TYPE_CHECKING:
    from gpuctl.cli.base import Subcommands


def register(sub: Subcommands) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "agent-bundle", help="write the node agent zipapp (gpuctl-node-<hash>.pyz) into DIR"
    )
    p.add_argument("dir", metavar="DIR", help="folder to write into (created if missing)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gpuctl.cli.base import UserError

    try:
        path = write_bundle(args.dir)
    except OSError as e:
        raise UserError(
            f"cannot write the bundle into {args.dir}: {e.strerror or e}; "
            "name a folder you can write"
        ) from None
    print(path)
    return 0
