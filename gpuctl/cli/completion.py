"""``gpuctl completion bash|zsh|fish``: the shell's completion script, generated from gpuctl's
own argument parser by argcomplete (every command and option, as the parser knows them); node
names complete from the config and job ids from the job store (``attach_completers``)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuctl.cli.base import Subcommands

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


def _actions(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    for action in parser._actions:
        yield action
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                yield from _actions(sub)


def attach_completers(parser: argparse.ArgumentParser) -> None:
    """Node arguments (``NODES``, ``--nodes HOSTLIST``) complete node names; a job's ``id``
    completes job ids. (argcomplete reads an action's ``completer``.)"""
    for action in _actions(parser):
        if action.dest == "nodes" and action.type is not int:
            action.completer = complete_nodes  # type: ignore[attr-defined]
        elif action.dest == "id":
            action.completer = complete_job_ids  # type: ignore[attr-defined]


def complete_nodes(prefix: str, parsed_args: argparse.Namespace, **_: Any) -> list[str]:
    """The configured node names that start with ``prefix`` (none when the config is broken:
    completion never prints an error into the user's command line)."""
    from gpuctl.config import ConfigError, load_config

    try:
        config = load_config(getattr(parsed_args, "config", None))
    except ConfigError:
        return []
    return [n.name for n in config.nodes() if n.name.startswith(prefix)]


def complete_job_ids(prefix: str, **_: Any) -> list[str]:
    """The ids of the newest jobs in the store that start with ``prefix``."""
    from gpuctl.jobs.store import JobStore, StoreError

    try:
        records = JobStore().list(limit=500)
    except StoreError:
        return []
    return [r.id for r in records if r.id.startswith(prefix)]
