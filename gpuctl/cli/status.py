"""``gpuctl status [--json] [--demo]``: one snapshot of every node, table or JSON."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
from typing import TYPE_CHECKING, Any, TextIO

import hostlist
import msgspec

from gpuctl.cli.common import (
    JSON_VERSION,
    add_nodes_arguments,
    add_prometheus_options,
    build_fleet,
    emit_json,
)
from gpuctl.core.format import (
    STATUS_TITLES,
    fmt_age,
    gpu_table_rows,
    reader_text,
    short_model,
)
from gpuctl.core.model import NodeSnapshot, NodeState
from gpuctl.core.text import printable
from gpuctl.fleet import myjobs
from gpuctl.fleet.idle import IdleTracker
from gpuctl.fleet.status import collect, node_schema, node_to_json

if TYPE_CHECKING:
    from gpuctl.cli.base import Subcommands


def register(sub: Subcommands) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "status", help="print one snapshot of every GPU of every node"
    )
    p.add_argument("--json", action="store_true", help="JSON for scripts (an object: nodes)")
    from gpuctl.cli.common import add_demo_option  # local: the module's imports are busy

    add_demo_option(p)
    p.add_argument(
        "--json-schema",
        action="store_true",
        help="print the JSON Schema of --json's document (docs/status.schema.json) and exit",
    )
    p.add_argument("--timeout", type=float, default=20.0, help="seconds to wait per node")
    mine = p.add_mutually_exclusive_group()
    mine.add_argument(
        "--mine",
        action="store_true",
        help="only the GPUs of your running Slurm jobs, with each job's totals",
    )
    mine.add_argument(
        "--job", metavar="ID", help="only the GPUs of this Slurm job, with its totals"
    )
    add_nodes_arguments(p)
    add_prometheus_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gpuctl.cli.base import UserError

    if args.json_schema:
        print(json.dumps(status_schema(), indent=2))
        return 0
    if not 0 < args.timeout <= 3600:
        raise UserError(f"--timeout must be within 0..3600 seconds, e.g. 20 (not {args.timeout:g})")
    if args.job is not None and not args.job.replace("_", "").isdigit():
        raise UserError(f"--job takes a Slurm job id, e.g. --job 4242 (not {args.job!r})")
    fleet = build_fleet(args, prometheus_timeout=args.timeout)
    snaps = asyncio.run(collect(fleet, args.timeout))
    jobs_only = args.mine or args.job is not None
    if jobs_only:
        user = myjobs.user_name() if args.mine else None
        snaps = myjobs.select(snaps, user=user, job=args.job)
        if not snaps:
            whose = f"of yours ({user})" if args.mine else f"{args.job}"
            print(f"gpuctl: no GPU of a running Slurm job {whose} on these nodes", file=sys.stderr)
    jobs = myjobs.totals(snaps, fleet.idle)
    no_driver = [s for s in snaps if s.info is not None and s.info.reader is None]
    # stdout holds the rows (and the header row) only: `gpuctl status | awk` reads no other
    # line; what is said about them goes to stderr
    if args.json:  # the readers are in each node's fields; "xids_watched" says the rest
        emit_json(
            {
                "nodes": [node_to_json(s, idle=fleet.idle) for s in snaps],
                "jobs": [msgspec.to_builtins(j) for j in jobs],
                "xids_watched": False,
                "idle_watched": False,
            }
        )
    else:
        idle = fleet.idle
        if use_color(sys.stdout) and hasattr(sys.stdout, "control"):
            # the stream lets no escape through; the table's cells are made printable (what a
            # node sent) and only gpuctl's own colours go out as control sequences
            table = render_table(snaps, color=True, width=table_width(), idle=idle)
            sys.stdout.control(table + "\n")
        else:
            print(render_table(snaps, width=table_width(), idle=idle))
        for j in jobs if jobs_only else ():
            print(f"gpuctl: {printable(j.text())}", file=sys.stderr)
        readers = render_readers(snaps)
        if readers:
            print(readers, file=sys.stderr)
        if any(s.state is NodeState.LIVE and s.gpus for s in snaps):
            print(f"gpuctl: {NO_XIDS}", file=sys.stderr)
        if any(notes.get("slurm_job") for s in snaps for notes in s.annotations.values()):
            print(f"gpuctl: {no_idle(fleet.idle.after)}", file=sys.stderr)
    failed = [s for s in snaps if s.state is NodeState.UNREACHABLE]
    for s in failed:
        print(f"gpuctl: {s.name} did not answer: {s.reason}", file=sys.stderr)
    for s in no_driver:
        print(
            f"gpuctl: {s.name}: {s.info.reader_error if s.info else ''}; "
            "to see gpuctl on simulated GPUs, run: gpuctl demo",
            file=sys.stderr,
        )
    return 1 if failed or no_driver else 0


def status_schema() -> dict[str, Any]:
    """The JSON Schema (2020-12) of ``status --json``'s document: ``emit_json``'s envelope,
    the nodes (made from the model: ``gpuctl.fleet.status.node_schema``), ``xids_watched`` and
    ``idle_watched``.
    ``docs/status.schema.json`` is this, and a test holds them equal."""
    node, defs = node_schema()
    body = {
        "version": {"const": JSON_VERSION, "description": "The layout of this document."},
        "gpuctl": {"type": "string", "description": "The version of gpuctl that wrote it."},
        "generated_at": {"type": "string", "description": "When, UTC, ISO 8601."},
        "nodes": {"type": "array", "items": node},
        "jobs": {
            "type": "array",
            "description": "The Slurm jobs of the GPUs shown, each with its totals.",
            "items": msgspec.json.schema(myjobs.JobTotals),
        },
        "xids_watched": {
            "type": "boolean",
            "description": "false: a one-shot status does not see XIDs (watch, export do).",
        },
        "idle_watched": {
            "type": "boolean",
            "description": "false: a one-shot status watches seconds, not [fleet] idle_after: "
            "its alloc_idle_s is at most those seconds and it finds no GPU allocated but idle "
            "(watch, export do).",
        },
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "gpuctl status --json",
        "type": "object",
        "properties": body,
        "required": list(body),
        "$defs": defs,
    }


# A one-shot starts its agents and stops them after one sample: NVML hands an XID only to a
# reader registered when it happens, so one that happened before the snapshot is not seen. The
# agent keeps none between runs; the kernel log keeps them (acceptance's [HEALTH] reads it).
# The table says so on stderr, --json as "xids_watched": false.
NO_XIDS = (
    "XIDs: a one-shot status does not see them (NVML tells only a reader running when one "
    "happens); gpuctl watch, export and record do"
)


def no_idle(after: float) -> str:
    """Said (stderr) when a GPU shown is in a Slurm job: allocated but idle is a span of
    ``after`` seconds (``gpuctl.fleet.idle``) that a one-shot does not watch; --json says it as
    ``"idle_watched": false``."""
    return (
        f"allocated but idle: a one-shot status watches seconds, not the {fmt_age(after)} "
        "([fleet] idle_after) a GPU "
        "of a job must idle to be flagged IDLE; gpuctl watch, export and record do"
    )


def render_readers(snaps: list[NodeSnapshot]) -> str:
    """One line per way of reading GPUs, with its nodes as a hostlist: on NVML (and with which
    pynvml) or on the nvidia-smi fallback and why (stderr: stdout holds only the table's
    rows). Nodes without a reader have their own line."""
    groups: dict[str, list[str]] = {}
    for s in snaps:
        if s.info is not None and s.info.reader is not None:
            groups.setdefault(reader_text(s.info), []).append(s.name)
    return "\n".join(
        f"reader {hostlist.collect_hostlist(names)}: {text}" for text, names in groups.items()
    )


# The colour of a badge on a terminal: faults red, thermal slowdown yellow, a power cap (normal
# under full load) dim.
FAULTS = frozenset({"LOST", "XID", "ECC", "REMAP", "HWSLOW", "HWTHERM", "PWRBRAKE"})
IDLE_BADGE = "IDLE"  # a GPU of a Slurm job allocated but idle (``gpuctl.fleet.idle``)
RED, YELLOW, DIM, BOLD, RESET = "\x1b[31m", "\x1b[33m", "\x1b[2m", "\x1b[1m", "\x1b[0m"


def use_color(stream: TextIO) -> bool:
    """Colour only on a terminal (stdout is ``core.text.CleanText``, which writes our own
    sequences through ``control``), and never with NO_COLOR set (https://no-color.org)."""
    return stream.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


def _paint(badges: str) -> str:
    out = []
    for b in badges.split():
        code = (
            RED
            if b in FAULTS
            else YELLOW
            if b in ("THERM", IDLE_BADGE)
            else DIM
            if b == "PWRCAP"
            else ""
        )
        out.append(f"{code}{b}{RESET}" if code else b)
    return " ".join(out)


# The width the table fits in: the terminal's, else ``$COLUMNS``, else 120 (a pipe, cron's mail).
WIDTH = 120
# When the table is wider, these columns go, a pair at a time, in this order (a health check
# needs UTIL, MEMORY, TEMP, POWER, USER and FLAGS); the codec and PCIe readings are what the
# screen is for.
DROPPED_FIRST = (("ENC", "DEC"), ("PCIe TX", "PCIe RX"), ("SM MHz",))
USER_WIDTH = 16  # the USER cell at most: "alice,bob,chen,…"
GAP = "  "


def table_width() -> int:
    """The columns the table may take: ``$COLUMNS``, the terminal's, else ``WIDTH``."""
    return shutil.get_terminal_size((WIDTH, 24)).columns


def render_table(
    snaps: list[NodeSnapshot],
    *,
    color: bool = False,
    width: int | None = None,
    idle: IdleTracker | None = None,
) -> str:
    """The table of every GPU (a node without GPUs to show gets one row saying why); with
    ``color``, badges and node trouble in ANSI colours (column widths as without). The model is
    its short name (no vendor); with ``width``, the columns of ``DROPPED_FIRST`` go, a pair at
    a time, while a line would be wider; with ``idle``, a GPU allocated but idle has IDLE."""
    header = ("NODE", "GPU", "MODEL", *STATUS_TITLES, "USER", "FLAGS")
    rows: list[tuple[str, ...]] = []
    trouble: set[int] = set()
    for s in snaps:
        if s.state is not NodeState.LIVE or not s.gpus:
            # The reason goes to stderr, one line per node: here it would widen every column.
            no_reader = s.info is not None and s.info.reader is None
            why = "no GPU driver" if no_reader else "no GPUs"
            state = s.state.value if s.state is not NodeState.LIVE else why
            if s.state is not NodeState.LIVE or no_reader:
                trouble.add(len(rows))
            rows.append((s.name, "-", state, *[""] * (len(header) - 3)))
            continue
        for index, name, *rest in gpu_table_rows(s):
            if idle is not None and idle.idle_for(s.name, int(index)) is not None:
                rest[-1] = f"{rest[-1]} {IDLE_BADGE}".lstrip()
            rows.append((s.name, index, short_model(name), *rest))
    # what a node sent is one line of text (a tab or line break would make two rows of one)
    user = header.index("USER")
    rows = [
        tuple(printable(c, limit=USER_WIDTH if i == user else None) for i, c in enumerate(r))
        for r in rows
    ]
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    keep = list(range(len(header)))
    for titles in DROPPED_FIRST:
        if width is None or sum(widths[i] for i in keep) + len(GAP) * (len(keep) - 1) <= width:
            break
        for title in titles:
            keep.remove(header.index(title))
    top = GAP.join(header[i].ljust(widths[i]) for i in keep).rstrip()
    lines = [f"{BOLD}{top}{RESET}" if color else top]
    flags, model = header.index("FLAGS"), header.index("MODEL")
    for n, r in enumerate(rows):
        cells = {i: r[i].ljust(widths[i]) for i in keep}
        if color:
            cells[flags] = _paint(r[flags])
            if n in trouble:
                cells[model] = f"{RED}{cells[model]}{RESET}"
        lines.append(GAP.join(cells[i] for i in keep).rstrip())
    return "\n".join(lines)
