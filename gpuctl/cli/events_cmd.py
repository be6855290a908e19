"""``gpuctl events``: the trouble log (``gpuctl.fleet.troublelog``) for scripts and people:
XIDs, thermal and hardware throttles, ECC and row remapping, lost GPUs, unreachable nodes and
failed acceptance runs, newest first; ``gpuctl events ack ID --note TEXT`` acknowledges one."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any

from gpuctl.cli.audit_cmd import add_log_options, print_table, since_of
from gpuctl.core.text import printable

if TYPE_CHECKING:
    from gpuctl.cli.base import Subcommands
    from gpuctl.fleet.troublelog import Trouble, TroubleLog


def register(sub: Subcommands) -> None:
    from gpuctl.fleet.troublelog import KINDS, STATES

    p: argparse.ArgumentParser = sub.add_parser(
        "events",
        help="the trouble log: XIDs, throttles, ECC, lost GPUs, unreachable nodes, newest first",
        description=(
            "Every XID, thermal or hardware throttle, new ECC error or row remapping, lost GPU, "
            "unreachable node and failed acceptance run a gpuctl screen saw, with when it was "
            "first and last seen, how often, and the GPU's readings at the time. Repeats fold "
            "into one event until it is acknowledged. The log is "
            "~/.local/state/gpuctl/events.jsonl."
        ),
    )
    add_log_options(p, "events", "only the events of NODE")
    p.add_argument("--gpu", metavar="N", type=int, help="only the events of GPU N")
    p.add_argument("--kind", choices=KINDS, help="only the events of this kind")
    p.add_argument(
        "--state",
        choices=STATES,
        help=(
            "only the events in this state: active (still going), ended, open (over, its end "
            "unknown), acked, or unacked (any but acked)"
        ),
    )
    p.set_defaults(func=run)
    esub = p.add_subparsers(dest="events_command", metavar="{ack}")
    a = esub.add_parser("ack", help="acknowledge an event (its next occurrence is a new one)")
    a.add_argument("id", metavar="ID", help="the event's id (or the start of it)")
    a.add_argument("--note", default="", metavar="TEXT", help="what was done, for the others")
    a.set_defaults(func=run_ack)


def _open() -> TroubleLog:
    from gpuctl.cli.base import UserError
    from gpuctl.fleet.troublelog import TroubleLog, log_path

    path = log_path()
    try:
        return TroubleLog.open(path)
    except OSError as err:
        raise UserError(f"cannot read the trouble log {path}: {err.strerror or err}") from None


def words(row: Trouble) -> str:
    """What happened, in the screen's words (node text made printable)."""
    from gpuctl.tui.view import trouble_event

    return printable(trouble_event(row.kind, row.subject, row.detail)[0], limit=300)


def run(args: argparse.Namespace) -> int:
    from gpuctl.cli.common import emit_json, session

    session(args)
    since = since_of(args)
    tlog = _open()
    rows = tlog.newest(node=args.node, gpu=args.gpu, kind=args.kind, since=since)
    if args.state is not None:
        rows = [r for r in rows if r.in_state(args.state)]
    rows = rows[: args.limit]
    assert tlog.path is not None
    if args.json:
        events: list[dict[str, Any]] = []
        for r in rows:
            events.append({**r.to_json(), "state": r.state, "words": words(r)})
        emit_json({"log": str(tlog.path), "skipped_lines": tlog.skipped, "events": events})
        return 0
    if tlog.skipped:  # as gpuctl audit says it: a broken log is not silently a short one
        print(
            f"gpuctl events: {tlog.skipped} line(s) of {tlog.path} are not events", file=sys.stderr
        )
    if not rows:
        print(f"no events in {tlog.path}" + (f" in the last {args.since}" if args.since else ""))
        return 0
    table = [("ID", "LAST SEEN", "FIRST SEEN", "COUNT", "NODE", "GPU", "STATE", "WHAT")]
    for r in rows:
        table.append(
            (
                r.id,
                _when(r.last),
                _when(r.first),
                str(r.count),
                printable(r.node, limit=40),
                "-" if r.gpu is None else str(r.gpu),
                r.state,
                words(r) + (f"  [ack: {printable(r.ack_note, limit=80)}]" if r.ack_note else ""),
            )
        )
    print_table(table)
    return 0


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def run_ack(args: argparse.Namespace) -> int:
    from gpuctl import service
    from gpuctl.cli.base import UserError
    from gpuctl.cli.common import session

    session(args)
    tlog = _open()
    try:
        row = tlog.find(args.id)
    except KeyError:
        raise UserError(f"no event {args.id!r} in {tlog.path} (gpuctl events lists them)") from None
    except ValueError as err:
        raise UserError(str(err)) from None
    if row.acked is not None:
        print(f"{row.id} was acknowledged already by {printable(row.ack_by, limit=60)}")
        return 0
    me = service.me()
    tlog.ack(row.id, args.note, by=f"{me.user}@{me.host}")
    if tlog.error is not None:
        why = tlog.error.strerror or tlog.error
        raise UserError(f"cannot write the trouble log {tlog.path}: {why}")
    print(f"{row.id} acknowledged: {words(row)}")
    return 0
