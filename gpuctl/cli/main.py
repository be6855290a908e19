"""``gpuctl`` entry point: parse, dispatch, turn user errors into one line (no traceback)."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from gpuctl import __version__, logs, service
from gpuctl.core.text import CleanText

log = logging.getLogger("gpuctl.cli")

# Subcommand modules, in the order ``gpuctl --help`` lists them. Each has
# ``register(subparsers)`` which adds its parser and sets ``func(args) -> int``.
COMMANDS = (
    "gpuctl.cli.watch",
    "gpuctl.cli.demo",
    "gpuctl.cli.status",
    "gpuctl.cli.export",
    "gpuctl.cli.record",
    "gpuctl.cli.config_cmd",
    "gpuctl.cli.doctor",
    "gpuctl.cli.stress",
    "gpuctl.cli.accept",
    "gpuctl.cli.serve",
    "gpuctl.cli.jobs",
    "gpuctl.cli.bundle",
    "gpuctl.cli.completion",
)


class UserError(Exception):
    """A mistake the user can fix; printed as ``gpuctl: <message>`` with exit code 2."""


if TYPE_CHECKING:
    # what each command module's ``register`` gets: the top-level parser's add_subparsers()
    Subcommands = argparse._SubParsersAction[argparse.ArgumentParser]

READ_ONLY_ENV = service.READ_ONLY_ENV
F = TypeVar("F", bound=Callable[..., Any])

# Commands of modules that do not mark themselves with ``mutating``: (module, function) -> what
# the command does, for the one-line refusal. Everything that loads GPUs, starts or stops work
# belongs here or is marked: ``_run`` asks ``gpuctl.service`` before such a command runs (the
# API the command then calls asks again, with the decision made here).
MUTATING_FUNCS = {
    ("gpuctl.cli.stress", "run_start"): "stress",
    ("gpuctl.cli.stress", "run_stop"): "stress",
    ("gpuctl.cli.stress", "run_here"): "stress",
    ("gpuctl.cli.jobs", "run_submit"): "submitting jobs",
    ("gpuctl.cli.jobs", "run_cancel"): "cancelling jobs",
}


def mutating(what: str) -> Callable[[F], F]:
    """Mark a command's ``run`` as changing nodes (``what`` it does: "stress", for the refusal)."""

    def mark(fn: F) -> F:
        fn.mutates = what  # type: ignore[attr-defined]
        return fn

    return mark


def mutation(func: Any) -> str | None:
    """What the command ``func`` would change, or None when it only reads."""
    what = getattr(func, "mutates", None)
    if what is None:
        what = MUTATING_FUNCS.get((getattr(func, "__module__", ""), getattr(func, "__name__", "")))
    return what


def read_only_source(args: argparse.Namespace, *, strict: bool = False) -> str | None:
    """Why this run is read-only (how to lift it, in words), or None when it is not: the
    decision of the command's session (``gpuctl.cli.common.session``: the top-level
    ``--read-only``, a command's own ``--read-only``, ``$GPUCTL_READ_ONLY`` and the config
    named by ``--config``; the demo cluster's ignores the config's). A broken config raises
    UserError when ``strict`` (a command that changes nodes must not run when it cannot
    tell), else it is left to the command, which reports it as one line.
    """
    from gpuctl.cli.common import session

    try:
        return session(args).read_only_why
    except UserError:
        if strict:
            raise
        return None


class Parser(argparse.ArgumentParser):
    """argparse with gpuctl's one-line errors: ``gpuctl: <what>; see gpuctl CMD --help``.

    Subcommand parsers are made by ``add_subparsers`` with the parent's class, so every
    command, nested ones too, reports a usage mistake the same way. ``after_dashes="dest"``:
    the words after the first ``--`` go to ``args.dest`` as they are (a command to run, whose
    options are its own), and ``args.dest`` is None when there is no ``--``.
    """

    def __init__(self, *args: Any, after_dashes: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.after_dashes = after_dashes

    def parse_known_args(  # type: ignore[override]  # typeshed overloads it on namespace
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if self.after_dashes is None:
            return super().parse_known_args(args, namespace)
        words = list(sys.argv[1:] if args is None else args)
        rest = None
        if "--" in words:
            at = words.index("--")
            words, rest = words[:at], words[at + 1 :]
        ns, extras = super().parse_known_args(words, namespace)
        setattr(ns, self.after_dashes, rest)
        return ns, extras

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("gpuctl").strip()
        where = f"{command}: " if command else ""
        self.exit(2, f"gpuctl: {where}{message}; see: {self.prog} --help\n")


def _options_everywhere(parser: argparse.ArgumentParser) -> None:
    """Accept the global options after the command as well (``gpuctl status --config c.toml
    -v``), without letting a subcommand's default reset them."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        for sub in set(action.choices.values()):
            known = {o for a in sub._actions for o in a.option_strings}
            if "--config" not in known:
                sub.add_argument(
                    "--config", metavar="PATH", default=argparse.SUPPRESS, help=argparse.SUPPRESS
                )
            if "--read-only" not in known:
                sub.add_argument(
                    "--read-only",
                    dest="global_read_only",
                    action="store_true",
                    default=argparse.SUPPRESS,
                    help=argparse.SUPPRESS,
                )
            if "--verbose" not in known:
                sub.add_argument(
                    "-v",
                    "--verbose",
                    action="count",
                    default=argparse.SUPPRESS,
                    help=argparse.SUPPRESS,
                )
            if "--log-file" not in known:
                sub.add_argument(
                    "--log-file", metavar="PATH", default=argparse.SUPPRESS, help=argparse.SUPPRESS
                )
            _options_everywhere(sub)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="gpuctl",
        description="Watch, stress and accept every GPU of a cluster from one terminal screen.",
    )
    parser.add_argument("--version", action="version", version=f"gpuctl {__version__}")
    parser.add_argument(
        "--config", metavar="PATH", help="config file (default: $GPUCTL_CONFIG, else XDG)"
    )
    parser.add_argument(
        "--read-only",
        dest="global_read_only",  # a subcommand's own --read-only default must not reset it
        action="store_true",
        help=f"refuse everything that changes nodes: stress, jobs, acceptance runs "
        f"(also ${READ_ONLY_ENV}=1 or read_only = true in the config)",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="say what gpuctl does on stderr (-vv: more); the log file has it in any case",
    )
    parser.add_argument(
        "--log-file",
        metavar="PATH",
        help="write gpuctl's log here (default: gpuctl.log in the state folder's logs/)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(name).register(sub)
    _options_everywhere(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; every failure a user can meet ends in one ``gpuctl: ...`` line."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is None:  # started with the descriptor closed (`gpuctl >&-`)
            setattr(sys, name, open(os.devnull, "w"))  # noqa: SIM115 - lives as long as gpuctl
        elif not isinstance(stream, CleanText):  # a terminal or a pipe: no node's escapes
            setattr(sys, name, CleanText(stream))
    try:
        return _run(argv)
    except (UserError, service.ReadOnlyError) as e:
        print(f"gpuctl: {one_line(str(e))}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `gpuctl status | head` is not an error
        # keep the interpreter's final flush of stdout from failing again
        with contextlib.suppress(OSError, ValueError):
            fd = os.open(os.devnull, os.O_WRONLY)
            os.dup2(fd, sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("gpuctl: interrupted", file=sys.stderr)
        return 130
    except OSError as e:  # a file, folder or connection the command needed
        log.info("failed: %s", os_error(e), exc_info=True)
        print(f"gpuctl: {os_error(e)}{logs.where()}", file=sys.stderr)
        return 1
    except Exception as e:
        store = sys.modules.get("gpuctl.jobs.store")  # loaded by any command that used it
        if store is not None and isinstance(e, store.StoreError):
            log.info("job store: %s", e)  # its one line says which file and what to do
            print(f"gpuctl: {e}", file=sys.stderr)
            return 1
        log.error("internal error", exc_info=True)
        if os.environ.get("GPUCTL_DEBUG"):
            raise
        where = logs.log_file()
        how = f"it with the traceback in {where}" if where else "it; GPUCTL_DEBUG=1 shows it"
        text = f"internal error: {type(e).__name__}: {e} (a bug in gpuctl: please report {how})"
        print(f"gpuctl: {text}".replace("\n", " "), file=sys.stderr)
        return 70


def one_line(text: str) -> str:
    """A message that came with a tool's multi-line stderr, as one line: the first line (what
    failed) and the last (the tool's final word, usually its ``fatal:``)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else text.strip()
    return f"{lines[0]} ... {lines[-1]}"


def os_error(e: OSError) -> str:
    """One line for an OSError: what failed on which path, without Python's repr."""
    what = e.strerror or str(e) or type(e).__name__
    paths = [p for p in (e.filename, e.filename2) if p is not None]
    if paths:
        return f"{' -> '.join(str(p) for p in paths)}: {what}"
    return what


def _run(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    if "_ARGCOMPLETE" in os.environ:  # a shell asking for completions (gpuctl completion)
        import argcomplete

        from gpuctl.cli.completion import attach_completers

        attach_completers(parser)
        argcomplete.autocomplete(parser)  # answers and exits
    args = parser.parse_args(argv)
    logs.setup(getattr(args, "verbose", 0) or 0, getattr(args, "log_file", None))
    log.info("gpuctl %s: %s", __version__, getattr(args, "command", None) or "watch")
    func = getattr(args, "func", None)
    if func is None:  # plain ``gpuctl`` opens the TUI on the configured cluster
        args = parser.parse_args([*(argv or sys.argv[1:]), "watch"])
        func = args.func
    what = mutation(func)
    if what is not None or getattr(args, "global_read_only", False) or READ_ONLY_ENV in os.environ:
        why = read_only_source(args, strict=what is not None)
        if why is not None and what is not None:
            raise service.ReadOnlyError(what, why)
        # The decision, for the command to hand to the API it calls (which then reads nothing
        # again) and to commands that check their own --read-only (the TUI).
        args.read_only = why is not None
    return int(func(args))


if __name__ == "__main__":
    sys.exit(main())
