"""``gpuctl status [--json] [--demo]``: one snapshot of every node, table or JSON."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import TYPE_CHECKING

import hostlist

from gpuctl.cli.common import build_fleet, emit_json
from gpuctl.core.format import gpu_table_rows, reader_text
from gpuctl.core.model import NodeSnapshot, NodeState
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
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gpuctl.cli.main import UserError

    if not 0 < args.timeout <= 3600:
        raise UserError(f"--timeout must be within 0..3600 seconds, e.g. 20 (not {args.timeout:g})")
    fleet = build_fleet(args)
    snaps = asyncio.run(collect(fleet, args.timeout))
    no_driver = [s for s in snaps if s.info is not None and s.info.reader is None]
    if args.json:
        emit_json({"nodes": [node_to_json(s) for s in snaps]})
    elif len(no_driver) < len(snaps):  # a table of nothing but "no driver" rows says nothing
        print(render_table(snaps))
        print(render_readers(snaps))
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


def render_table(snaps: list[NodeSnapshot]) -> str:
    header = ("NODE", "GPU", "MODEL", "UTIL", "MEMORY", "TEMP", "POWER", "SM MHz", "FLAGS")
    rows: list[tuple[str, ...]] = []
    for s in snaps:
        if s.state is not NodeState.LIVE or not s.gpus:
            # The reason goes to stderr, one line per node: here it would widen every column.
            why = "no GPU reader" if s.info is not None and s.info.reader is None else "no GPUs"
            state = s.state.value if s.state is not NodeState.LIVE else why
            rows.append((s.name, "-", state, "", "", "", "", "", ""))
            continue
        rows.extend((s.name, *r) for r in gpu_table_rows(s))
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in (header, *rows)
    )
