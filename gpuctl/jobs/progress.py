"""Progress of a job being waited for, for a terminal: state changes and the elapsed time.

``gpuctl submit --wait`` calls ``wait_with_progress(job, sys.stderr)`` only when stderr is a
terminal, so a script that reads stderr gets nothing extra.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from gpuctl.jobs.job import Job

CLEAR = "\r\x1b[K"  # back to the start of the line and clear it


def control(stream: TextIO, sequence: str) -> None:
    """Write gpuctl's own control sequence: past the CLI's filter, which lets no escape
    sequence of a node through (``gpuctl.core.text.CleanText``)."""
    raw = getattr(stream, "control", None)
    if callable(raw):
        raw(sequence)
    else:
        stream.write(sequence)


def _elapsed(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def wait_with_progress(job: Job, stream: TextIO, *, every: float = 0.5) -> str:
    """Wait until ``job`` is over (or its node has been unreachable for its
    ``unreachable_after``), keeping one live line on ``stream``: elapsed time and state. Each
    state change leaves a line behind (``0:03 running``). Returns the last state seen."""
    t0 = time.monotonic()
    shown: str | None = None
    state = job.state
    while True:
        elapsed = _elapsed(time.monotonic() - t0)
        if state != shown:
            if shown is not None:
                stream.write("\n")
            shown = state
        extra = ""
        gone = getattr(job, "unreachable_for", None)
        if state == "unreachable" and gone is not None:
            extra = f" (no answer from {job.target} for {gone:.0f} s)"
        control(stream, CLEAR)
        stream.write(f"{elapsed} job {job.id[:12]} {state}{extra}")
        stream.flush()
        if job.wait(every):
            state = job.state
            break
        gone = getattr(job, "unreachable_for", None)
        if gone is not None and gone >= job.unreachable_after:
            break
        state = job.state
    if state != shown:
        stream.write(f"\n{_elapsed(time.monotonic() - t0)} job {job.id[:12]} {state}")
    stream.write("\n")
    stream.flush()
    return str(state)
