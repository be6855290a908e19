"""``gpuctl completion bash|zsh|fish``: the shell's completion script, generated from gpuctl's
own argument parser by argcomplete (every command and option, as the parser knows them)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuctl.cli.main import Subcommands

SHELLS = ("bash", "zsh", "fish")


def register(sub: Subcommands) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "completion",
        help="print the shell completion script (bash, zsh, fish)",
        description='Load it with: eval "$(gpuctl completion bash)" (zsh: the same in ~/.zshrc; '
        "fish: gpuctl completion fish | source).",
    )
    p.add_argument("shell", choices=SHELLS, help="the shell to complete in")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from argcomplete.shell_integration import shellcode

    print(shellcode(["gpuctl"], shell=args.shell), end="")
    return 0
