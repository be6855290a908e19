"""``gpuctl status [--json] [--demo]``: one snapshot of every node, table or JSON."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import TYPE_CHECKING, TextIO

import hostlist

from gpuctl.cli.common import add_nodes_arguments, add_prometheus_options, build_fleet, emit_json
from gpuctl.core.format import STATUS_TITLES, gpu_table_rows, reader_text
from gpuctl.core.model import NodeSnapshot, NodeState
from gpuctl.core.text import printable
from gpuctl.fleet.status import collect, node_to_json

if TYPE_CHECKING:
    from gpuctl.cli.main import Subcommands


def register(sub: Subcommands) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "status", help="print one snapshot of every GPU of every node"
    )
    p.add_argument("--json", action="store_true", help="JSON for scripts (an object: nodes)")
    p.add_argument("--demo", action="store_true", help="simulated nodes instead of real ones")
    p.add_argument("--timeout", type=float, default=20.0, help="seconds to wait per node")
    add_nodes_arguments(p)
    add_prometheus_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gpuctl.cli.main import UserError

    if not 0 < args.timeout <= 3600:
        raise UserError(f"--timeout must be within 0..3600 seconds, e.g. 20 (not {args.timeout:g})")
    fleet = build_fleet(args, prometheus_timeout=args.timeout)
    snaps = asyncio.run(collect(fleet, args.timeout))
    no_driver = [s for s in snaps if s.info is not None and s.info.reader is None]
    if args.json:
        emit_json({"nodes": [node_to_json(s) for s in snaps]})
    elif use_color(sys.stdout) and hasattr(sys.stdout, "control"):
        # a terminal's stream lets no escape through; the table's cells are made printable
        # (what a node sent) and only gpuctl's own colours go out as control sequences
        sys.stdout.control(render_table(snaps, color=True) + "\n")
        readers = render_readers(snaps)
        if readers:
            print(readers)
    else:
        print(render_table(snaps))
        readers = render_readers(snaps)
        if readers:
            print(readers)
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


def render_readers(snaps: list[NodeSnapshot]) -> str:
    """One line per way of reading GPUs, with its nodes as a hostlist: on NVML (and with which
    pynvml) or on the nvidia-smi fallback and why. Nodes without a reader are on stderr."""
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
RED, YELLOW, DIM, BOLD, RESET = "\x1b[31m", "\x1b[33m", "\x1b[2m", "\x1b[1m", "\x1b[0m"


def use_color(stream: TextIO) -> bool:
    """Colour only on a terminal (there stdout is ``main.TerminalText``, which writes our own
    sequences through ``control``), and never with NO_COLOR set (https://no-color.org)."""
    return stream.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


def _paint(badges: str) -> str:
    out = []
    for b in badges.split():
        code = RED if b in FAULTS else YELLOW if b == "THERM" else DIM if b == "PWRCAP" else ""
        out.append(f"{code}{b}{RESET}" if code else b)
    return " ".join(out)


def render_table(snaps: list[NodeSnapshot], *, color: bool = False) -> str:
    """The table of every GPU (a node without GPUs to show gets one row saying why); with
    ``color``, badges and node trouble in ANSI colours (column widths as without)."""
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
        rows.extend((s.name, *r) for r in gpu_table_rows(s))
    if color:  # what a node sent must not act on the terminal: the colours are ours alone
        rows = [tuple(printable(c) for c in r) for r in rows]
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    top = "  ".join(c.ljust(w) for c, w in zip(header, widths, strict=True)).rstrip()
    lines = [f"{BOLD}{top}{RESET}" if color else top]
    for i, r in enumerate(rows):
        cells = [c.ljust(w) for c, w in zip(r, widths, strict=True)]
        if color:
            cells[-1] = _paint(r[-1])
            if i in trouble:
                cells[2] = f"{RED}{cells[2]}{RESET}"
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)
