"""``gpuctl`` entry point: parse, dispatch, turn user errors into one line (no traceback)."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from gpuctl import __version__

# Subcommand modules, in the order ``gpuctl --help`` lists them. Each has
# ``register(subparsers)`` which adds its parser and sets ``func(args) -> int``.
COMMANDS = (
    "gpuctl.cli.watch",
    "gpuctl.cli.demo",
    "gpuctl.cli.status",
    "gpuctl.cli.config_cmd",
    "gpuctl.cli.stress",
    "gpuctl.cli.accept",
    "gpuctl.cli.jobs",
    "gpuctl.cli.bundle",
)


class UserError(Exception):
    """A mistake the user can fix; printed as ``gpuctl: <message>`` with exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuctl",
        description="Watch, stress and accept every GPU of a cluster from one terminal screen.",
    )
    parser.add_argument("--version", action="version", version=f"gpuctl {__version__}")
    parser.add_argument(
        "--config", metavar="PATH", help="config file (default: $GPUCTL_CONFIG, else XDG)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:  # a real import error inside the module must surface
                raise
            continue
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        # Plain ``gpuctl`` opens the TUI on the configured cluster when the TUI exists.
        default = parser._subparsers._group_actions[0].choices.get("watch")  # type: ignore[union-attr]
        if default is None:
            parser.print_help()
            return 0
        args = parser.parse_args([*(argv or sys.argv[1:]), "watch"])
        func = args.func
    try:
        return int(func(args))
    except UserError as e:
        print(f"gpuctl: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `gpuctl status | head` is not an error
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("gpuctl: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
