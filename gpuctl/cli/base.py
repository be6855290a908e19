"""What every command module shares and needs below ``gpuctl.cli.main``: the exit statuses, the
user's-mistake error, the subparsers type, one line for an OSError. A command module imports
these from here, so that no command module and ``main`` import each other (``main`` imports the
commands)."""

from __future__ import annotations

import argparse
import enum
from typing import TYPE_CHECKING


class ExitCode(enum.IntEnum):
    """gpuctl's exit statuses, the one table of them (``docs/exit-codes.md`` explains each):
    every command returns one of these, and ``main`` turns what it raises into one."""

    OK = 0
    FAILED = 1  # the command ran and what it checked or did failed: a node, a test, a job
    USAGE = 2  # bad input or usage: an option, an argument, a file, the config
    INTERNAL = 70  # a bug in gpuctl (sysexits' EX_SOFTWARE); the log has the traceback
    INTERRUPTED = 130  # Ctrl-C (128 + SIGINT, as shells report it)

    def __str__(self) -> str:  # the number on every Python (3.10's IntEnum says its name)
        return str(int(self))

    def __format__(self, spec: str) -> str:
        return format(int(self), spec)


class UserError(Exception):
    """A mistake the user can fix; printed as ``gpuctl: <message>`` with ``ExitCode.USAGE``."""


if TYPE_CHECKING:
    # what each command module's ``register`` gets: the top-level parser's add_subparsers()
    Subcommands = argparse._SubParsersAction[argparse.ArgumentParser]


def os_error(e: OSError) -> str:
    """One line for an OSError: what failed on which path, without Python's repr."""
    what = e.strerror or str(e) or type(e).__name__
    paths = [p for p in (e.filename, e.filename2) if p is not None]
    if paths:
        return f"{' -> '.join(str(p) for p in paths)}: {what}"
    return what
