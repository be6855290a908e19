"""``gpuctl record FILE [--duration 60s] [--demo]`` and ``gpuctl replay FILE [--speed 10]
[--from T] [--export-csv OUT]``: the fleet's stream into a file, and back onto the screen or into
a spreadsheet."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from gpuctl.cli.base import UserError
from gpuctl.cli.common import add_ascii_option, add_demo_option
from gpuctl.core.deadline import wait_for
from gpuctl.fleet import eventloop

if TYPE_CHECKING:
    from gpuctl.cli.base import Subcommands
    from gpuctl.fleet.fleet import Fleet
    from gpuctl.fleet.recording.reader import RecordingReader
    from gpuctl.fleet.recording.writer import Recorder


def _duration(text: str) -> float:
    from gpuctl.fleet.recording.times import parse_duration

    value = parse_duration(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 90, 60s, 5m, 1h30m)")
    return value


def _speed(text: str) -> float:
    try:
        value = float(text.removeprefix("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a speed: {text!r} (e.g. 10)") from None
    if not 0.01 <= value <= 1e6:
        raise argparse.ArgumentTypeError(f"must be within 0.01..1000000, not {text}")
    return value


def register(sub: Subcommands) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "record", help="record every node's stream (samples, events) into a file to replay"
    )
    p.add_argument("file", metavar="FILE", help="the recording to write (must not exist)")
    p.add_argument(
        "--duration", type=_duration, metavar="D", help="stop after D (60s, 5m, 2h; default: ^C)"
    )
    add_demo_option(p)
    p.add_argument(
        "--frame-seconds",
        type=_duration,
        default=None,
        metavar="S",
        help="seconds of stream per compressed frame: the replay's seek step and the most a "
        "killed recording loses (default 10)",
    )
    p.set_defaults(func=run_record)

    r: argparse.ArgumentParser = sub.add_parser(
        "replay", help="the screen on a recording, with its time and seek keys; or CSV"
    )
    r.add_argument("file", metavar="FILE", help="a recording made by gpuctl record or R")
    r.add_argument("--speed", type=_speed, default=1.0, help="times real time (default 1)")
    r.add_argument(
        "--from",
        dest="start",
        metavar="T",
        help="start at T: seconds into the recording (90, 5m), a time (03:12) or a date and "
        "time (2026-11-24T03:12)",
    )
    r.add_argument(
        "--export-csv",
        metavar="OUT",
        help="write one row per node x GPU x sample to OUT (- for stdout) instead of the screen",
    )
    add_ascii_option(r)
    r.set_defaults(func=run_replay)


def run_record(args: argparse.Namespace) -> int:
    from gpuctl.cli.common import build_fleet

    path = Path(args.file)
    if path.exists():
        raise UserError(f"{path} exists: give a new file name (a recording is never overwritten)")
    args.read_only = True  # a recorder only watches: its agents refuse stress and acceptance
    fleet = build_fleet(args)
    recorder = eventloop.run(record(fleet, path, args))
    size = os.path.getsize(path)
    print(
        f"gpuctl record: wrote {path}: {recorder.seconds:.0f} s, {recorder.samples} samples, "
        f"{size / 1024:.0f} KiB",
        flush=True,
    )
    return 0


async def record(fleet: Fleet, path: Path, args: argparse.Namespace) -> Recorder:
    """Record ``fleet`` into ``path`` for ``args.duration`` or until SIGINT/SIGTERM."""
    from gpuctl.cli.common import running_fleet
    from gpuctl.fleet.recording.writer import FRAME_SECONDS, Recorder

    try:
        recorder = Recorder(fleet, path, frame_seconds=args.frame_seconds or FRAME_SECONDS)
    except OSError as e:
        raise UserError(f"cannot write {path}: {e.strerror or e}") from None
    try:
        async with running_fleet(fleet, demo=args.demo) as stop:
            until = f"for {args.duration:g} s" if args.duration else "until Ctrl-C"
            print(f"gpuctl record: {path}: {len(fleet.names)} nodes, {until}", flush=True)
            with contextlib.suppress(TimeoutError):
                await wait_for(stop.wait(), args.duration)
    finally:
        recorder.close()
    return recorder


def _open(path: str) -> RecordingReader:
    from gpuctl.fleet.recording.format import RecordingError
    from gpuctl.fleet.recording.reader import RecordingReader

    try:
        return RecordingReader(path)
    except RecordingError as e:
        raise UserError(str(e)) from None
    except OSError as e:  # missing, unreadable, a folder: the user's input, as any file's
        from gpuctl.cli.base import os_error

        raise UserError(f"cannot read the recording {os_error(e)}") from None


def run_replay(args: argparse.Namespace) -> int:
    from gpuctl.fleet.recording.csvexport import export_csv
    from gpuctl.fleet.recording.times import format_time, parse_position

    reader = _open(args.file)
    start = None
    if args.start is not None:
        try:
            start = parse_position(args.start, reader)
        except ValueError as e:
            raise UserError(str(e)) from None
        if not reader.start - 1 <= start <= reader.end + 1:
            raise UserError(
                f"--from {args.start}: {format_time(start)} is outside the recording "
                f"({format_time(reader.start)} to {format_time(reader.end)})"
            )
    if reader.damaged is not None:
        print(
            f"gpuctl: {args.file}: damaged index ({reader.damaged}): reading frames in order",
            file=sys.stderr,
        )
    elif not reader.complete:
        print(
            f"gpuctl: {args.file} has no index (the recording was cut short): "
            f"replaying its {len(reader.frames)} complete frames",
            file=sys.stderr,
        )
    told = _tell_problems(args.file, reader, 0)
    if args.export_csv is not None:
        if args.export_csv == "-":
            rows = export_csv(reader, sys.stdout, start=start)
        else:
            try:
                out = open(args.export_csv, "w", newline="", encoding="utf-8")  # noqa: SIM115
            except OSError as e:
                raise UserError(f"--export-csv {args.export_csv}: {e.strerror or e}") from None
            with out:
                rows = export_csv(reader, out, start=start)
            print(f"gpuctl replay: wrote {rows} rows to {args.export_csv}", file=sys.stderr)
        _tell_problems(args.file, reader, told)
        return 0
    from gpuctl.cli.watch import require_terminal, run_tui, tui_config
    from gpuctl.fleet.recording.replayer import Replayer
    from gpuctl.tui.replay import ReplayApp

    require_terminal()
    tui, _ = tui_config(args)
    app = ReplayApp(Replayer(reader, speed=args.speed, start=start), tui=tui)
    return run_tui(app)


def _tell_problems(file: str, reader: RecordingReader, told: int) -> int:
    """One line for what of the recording could not be read since the first ``told`` of
    ``reader.problems`` (the first of them and how many more); returns how many are told."""
    new = reader.problems[told:]
    if new:
        more = f" (and {len(new) - 1} more)" if len(new) > 1 else ""
        print(f"gpuctl: {file}: {new[0]}{more}", file=sys.stderr)
    return len(reader.problems)
