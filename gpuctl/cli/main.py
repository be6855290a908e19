"""``gpuctl`` entry point: parse, dispatch, turn user errors into one line (no traceback)."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from gpuctl import __version__, logs, readonly, service
from gpuctl.cli.base import ExitCode as ExitCode
from gpuctl.cli.base import UserError as UserError
from gpuctl.cli.base import os_error as os_error
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
    "gpuctl.cli.audit_cmd",
    "gpuctl.cli.events_cmd",
    "gpuctl.cli.bundle",
    "gpuctl.cli.completion",
)


if TYPE_CHECKING:
    from gpuctl.cli.base import Subcommands as Subcommands

READ_ONLY_ENV = readonly.READ_ONLY_ENV
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


def _audit_refusal(args: argparse.Namespace, refusal: Exception) -> None:
    """A command read-only mode refused before it knew its nodes: kept in the audit log as
    the screen's and the API's refusals are (``stress_start`` on ``gpu[01-04]``: the command's
    words and its ``--nodes`` as given). The demo's are not: it writes no audit entries."""
    if getattr(args, "demo", False):
        return
    from gpuctl import audit

    command = str(getattr(args, "command", None) or "watch")
    sub = getattr(args, f"{command}_command", None)
    action = command if not isinstance(sub, str) else f"{command}_{sub}"
    nodes = getattr(args, "nodes", None)
    node = nodes if isinstance(nodes, str) else "local" if getattr(args, "local", False) else ""
    audit.record(action, node, "", f"refused: {refusal}")


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


CHOSEN = "_gpuctl_chosen"  # the namespace's note of the command parsed (``Parser.parse_args``)


class Parser(argparse.ArgumentParser):
    """argparse with gpuctl's one-line errors: ``gpuctl: CMD: <what>; see: gpuctl CMD --help``.

    Subcommand parsers are made by ``add_subparsers`` with the parent's class, so every
    command, nested ones too, reports a usage mistake the same way, and the one that reports
    it is the command the user chose (an unknown option of ``gpuctl status`` names ``gpuctl
    status --help``, not the top-level one). A mistyped command, choice or option comes with
    the closest one (``did you mean``), found here for every Python gpuctl runs on.
    ``after_dashes="dest"``: the words after the first ``--`` go to ``args.dest`` as they are
    (a command to run, whose options are its own), and ``args.dest`` is None when there is no
    ``--``.
    """

    def __init__(self, *args: Any, after_dashes: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.after_dashes = after_dashes
        self.parent: Parser | None = None  # the command this one is a subcommand of

    def add_subparsers(self, **kwargs: Any) -> Any:
        action = super().add_subparsers(**kwargs)
        add_parser = action.add_parser

        def add_child(name: str, **kw: Any) -> argparse.ArgumentParser:
            child: argparse.ArgumentParser = add_parser(name, **kw)
            if isinstance(child, Parser):
                child.parent = self  # for a mistyped word that is a command beside this one
            return child

        action.add_parser = add_child  # type: ignore[method-assign]
        return action

    def parse_known_args(  # type: ignore[override]  # typeshed overloads it on namespace
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        # Which command was chosen: set before parsing, so that a subcommand's (copied into
        # this namespace when argparse reaches it) wins, the deepest one last.
        namespace = argparse.Namespace() if namespace is None else namespace
        setattr(namespace, CHOSEN, self)
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

    def parse_args(  # type: ignore[override]  # typeshed overloads it on namespace
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        ns, extras = self.parse_known_args(args, namespace)
        chosen = vars(ns).pop(CHOSEN, self)
        if extras:  # said by the command that was chosen, which knows the options meant
            chosen.error(chosen.unrecognized(extras))
        return ns

    def option_names(self) -> list[str]:
        """The options worth suggesting: those ``--help`` lists and the global ones."""
        root = self
        while root.parent is not None:
            root = root.parent
        shown = {o for a in root._actions for o in a.option_strings}
        return [
            o
            for a in self._actions
            for o in a.option_strings
            if a.help is not argparse.SUPPRESS or o in shown
        ]

    def unrecognized(self, words: Sequence[str]) -> str:
        """The message for ``words`` this command does not take, with the option meant."""
        text = f"unrecognized arguments: {' '.join(words)}"
        options = self.option_names()
        for word in words:
            name = word.split("=", 1)[0]
            if not name.startswith("-"):
                continue
            if name in options:  # given before the command it belongs to
                return f"{text} ({name} goes after {self.prog})"
            meant = did_you_mean(name, options)
            if meant is not None:
                return f"{text} (did you mean {meant}?)"
        return text

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        # argparse's own check, with the closest choice (a command, a shell, an engine, ...)
        if action.choices is None or value in action.choices:
            return
        meant = self._meant_choice(action, str(value))
        hint = (
            f" (did you mean {meant}?)"
            if meant is not None
            else f" (choose from {', '.join(map(repr, action.choices))})"
        )
        raise argparse.ArgumentError(action, f"invalid choice: {value!r}{hint}")

    def _meant_choice(self, action: argparse.Action, value: str) -> str | None:
        assert action.choices is not None
        match = did_you_mean(value, [str(c) for c in action.choices])
        if isinstance(action, argparse._SubParsersAction):
            return f"'{self.prog} {match}'" if match is not None else None
        if match is not None:
            return f"'{action.option_strings[0]} {match}'" if action.option_strings else repr(match)
        # no choice of this command's, but perhaps a command beside it (`gpuctl jobs lgs`)
        if not action.option_strings and self.parent is not None:
            for up in self.parent._actions:
                if isinstance(up, argparse._SubParsersAction):
                    match = did_you_mean(value, list(up.choices))
                    if match is not None:
                        return f"'{self.parent.prog} {match}'"
        return None

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("gpuctl").strip()
        where = f"{command}: " if command else ""
        self.exit(ExitCode.USAGE, f"gpuctl: {where}{message}; see: {self.prog} --help\n")


def did_you_mean(word: str, candidates: Sequence[str]) -> str | None:
    """The candidate closest to the mistyped ``word``, or None when none is close (difflib's
    ratio 0.6 and up: ``stauts`` -> ``status``, ``--hostfle`` -> ``--hostfile``)."""
    found = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return found[0] if found else None


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


class _VersionAction(argparse.Action):
    """``--version``: the version, and the commit when run from a checkout (asks git only then)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(
            option_strings, dest, nargs=0, default=argparse.SUPPRESS, help="show the version"
        )

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        from gpuctl.version import version_text

        print(version_text())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="gpuctl",
        description="Watch, stress and accept every GPU of a cluster from one terminal screen.",
    )
    parser.add_argument("--version", action=_VersionAction)
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
    if os.environ.get("NO_COLOR") == "":
        # https://no-color.org: set and not empty turns colour off; empty is as unset. Textual
        # takes any NO_COLOR, empty too, for monochrome: gone, every part of gpuctl agrees.
        del os.environ["NO_COLOR"]
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
        return ExitCode.USAGE
    except BrokenPipeError:  # `gpuctl status | head` is not an error
        # keep the interpreter's final flush of stdout from failing again
        with contextlib.suppress(OSError, ValueError):
            fd = os.open(os.devnull, os.O_WRONLY)
            os.dup2(fd, sys.stdout.fileno())
        return ExitCode.OK
    except KeyboardInterrupt:
        print("gpuctl: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except OSError as e:  # a file, folder or connection the command needed
        log.info("failed: %s", os_error(e), exc_info=True)
        print(f"gpuctl: {os_error(e)}{logs.where()}", file=sys.stderr)
        return ExitCode.FAILED
    except Exception as e:
        store = sys.modules.get("gpuctl.jobs.store")  # loaded by any command that used it
        if store is not None and isinstance(e, store.StoreError):
            log.info("job store: %s", e)  # its one line says which file and what to do
            print(f"gpuctl: {e}", file=sys.stderr)
            return ExitCode.FAILED
        log.error("internal error", exc_info=True)
        if os.environ.get("GPUCTL_DEBUG"):
            raise
        where = logs.log_file()
        how = f"it with the traceback in {where}" if where else "it; GPUCTL_DEBUG=1 shows it"
        text = f"internal error: {type(e).__name__}: {e} (a bug in gpuctl: please report {how})"
        print(f"gpuctl: {text}".replace("\n", " "), file=sys.stderr)
        return ExitCode.INTERNAL


def one_line(text: str) -> str:
    """A message that came with a tool's multi-line stderr, as one line: the first line (what
    failed) and the last (the tool's final word, usually its ``fatal:``)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else text.strip()
    return f"{lines[0]} ... {lines[-1]}"


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
            refusal = service.ReadOnlyError(what, why)
            _audit_refusal(args, refusal)
            raise refusal
        # The decision, for the command to hand to the API it calls (which then reads nothing
        # again) and to commands that check their own --read-only (the TUI).
        args.read_only = why is not None
    return int(func(args))


if __name__ == "__main__":
    sys.exit(main())
