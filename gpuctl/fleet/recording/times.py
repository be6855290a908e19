"""Recorded time: ``--from`` positions into a recording and the time as shown."""

from __future__ import annotations

import time

from gpuctl.fleet.recording.reader import RecordingReader


def parse_position(text: str, reader: RecordingReader) -> float:
    """``--from``: seconds into the recording (``90``, ``90s``, ``5m``, ``1h2m3s``), a clock time
    (``03:12``, ``03:12:30``: the first such moment of the recording, local time) or a date and
    time (``2026-11-24T03:12:30``). Raises ValueError with one line."""
    from datetime import datetime, timedelta

    text = text.strip()
    offset = parse_duration(text, allow_zero=True)
    if offset is not None:
        return reader.start + offset
    span = f"the recording runs from {format_time(reader.start)} to {format_time(reader.end)}"
    try:
        # Python 3.10's fromisoformat reads no "Z" (3.11 does)
        when = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    except ValueError:
        when = None
    if when is not None:
        return when.timestamp()
    parts = text.split(":")
    if 2 <= len(parts) <= 3 and all(p.isdigit() for p in parts):
        h, m, s = (int(p) for p in (*parts, "0")[:3])
        if h < 24 and m < 60 and s < 60:
            day = datetime.fromtimestamp(reader.start).replace(hour=h, minute=m, second=s)
            while day.timestamp() < reader.start - 1:
                day += timedelta(days=1)
            return day.timestamp()
    raise ValueError(
        f"--from {text!r}: give seconds into the recording (90, 5m), a time (03:12) or a date "
        f"and time (2026-11-24T03:12); {span}"
    )


def parse_duration(text: str, *, allow_zero: bool = False) -> float | None:
    """``90``, ``+90``, ``90s``, ``1.5m``, ``2h``, ``1h2m3s`` as seconds (``protocol``'s one
    duration grammar); None when ``text`` is not one, or is zero unless ``allow_zero``."""
    from gpuctl.node.protocol import parse_seconds

    value = parse_seconds(text.removeprefix("+"))
    if value is None or (value == 0 and not allow_zero):
        return None
    return value


def format_time(t: float) -> str:
    """A recorded time as the screen and the CSV show it: local date and time."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
