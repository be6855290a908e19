"""``gpuctl audit``: the actions that changed nodes (stress, signals, acceptance runs, drains),
newest first, from the audit log (``gpuctl.audit``): this user's, or the site's shared one."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING

from gpuctl import audit
from gpuctl.core.text import printable

if TYPE_CHECKING:
    from gpuctl.cli.base import Subcommands


def register(sub: Subcommands) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "audit",
        help="the actions that changed nodes (stress, signals, acceptance, drains), newest first",
        description=(
            "Every stress start and stop, signal to a GPU process, acceptance run and Slurm "
            "drain or resume is written to the audit log: who, when, from which login host, "
            "on which node, and how it ended (ok, refused in read-only mode, failed). The log "
            "is ~/.local/state/gpuctl/audit.jsonl, or the shared file the config's audit_log "
            "names."
        ),
    )
    add_log_options(p, "entries", "only the actions on NODE")
    p.set_defaults(func=run)


def add_log_options(p: argparse.ArgumentParser, what: str, node: str) -> None:
    """``--since``, ``--limit``, ``--node`` and ``--json`` of a command that prints a log
    newest first (``audit``, ``events``); ``what`` names its entries, ``node`` what
    ``--node`` keeps."""
    p.add_argument("--since", metavar="AGE", help="only the last AGE (90m, 12h, 7d)")
    p.add_argument(
        "--limit", metavar="N", type=int, default=50, help=f"the newest N {what} (default 50)"
    )
    p.add_argument("--node", metavar="NODE", help=node)
    p.add_argument("--json", action="store_true", help="a JSON document for scripts")


def since_of(args: argparse.Namespace) -> float | None:
    """The Unix time ``--since`` names (None: not given); checks ``--limit`` too. Raises
    UserError for a mistake."""
    from gpuctl.cli.base import UserError
    from gpuctl.node.protocol import parse_seconds

    if args.limit < 1:
        raise UserError(f"--limit {args.limit}: give a number of entries, 1 or more")
    if not args.since:
        return None
    seconds = parse_seconds(args.since)
    if seconds is None or seconds <= 0:
        raise UserError(f"--since {args.since!r}: give an age such as 90m, 12h or 7d")
    return time.time() - seconds


def _names(nodes: str) -> list[str]:
    """The node names of an entry's ``node``: one name, or the hostlist of an action on several
    (``gpu[01-02]``: an acceptance run, a drain), so that ``--node gpu01`` finds them."""
    import hostlist

    try:
        return list(hostlist.expand_hostlist(nodes))
    except hostlist.BadHostlist:
        return nodes.split(",")


def print_table(rows: Sequence[Sequence[str]]) -> None:
    """Rows (the first: the titles) as columns two spaces apart, the last one unpadded."""
    n = len(rows[0]) - 1
    widths = [max(len(r[i]) for r in rows) for i in range(n)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r[:n], widths, strict=True)) + "  " + r[n])


def run(args: argparse.Namespace) -> int:
    from gpuctl.cli.base import UserError
    from gpuctl.cli.common import emit_json, session

    session(args)  # the config says where a shared log is
    since = since_of(args)
    path = audit.log_path()
    try:
        entries, skipped = audit.read(path, since=since)
    except OSError as err:
        raise UserError(f"cannot read the audit log {path}: {err.strerror or err}") from None
    if args.node:
        entries = [x for x in entries if args.node in _names(x.node) or x.node == args.node]
    entries = entries[: args.limit]
    if args.json:
        emit_json(
            {"log": str(path), "skipped_lines": skipped, "entries": [asdict(e) for e in entries]}
        )
        return 0
    if not entries:
        print(f"no actions in {path}" + (f" in the last {args.since}" if args.since else ""))
        return 0
    rows = [("WHEN", "WHO", "ACTION", "NODE", "TARGET", "OUTCOME")]
    for e in entries:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.at))
        rows.append(
            (
                when,
                printable(f"{e.user}@{e.login}", limit=40),
                printable(e.action, limit=14),
                printable(e.node, limit=40),
                printable(e.target, limit=60),
                printable(e.outcome, limit=200),
            )
        )
    print_table(rows)
    if skipped:
        import sys

        print(f"gpuctl audit: {skipped} line(s) of {path} are not entries", file=sys.stderr)
    return 0
