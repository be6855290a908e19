"""Ctrl-C while this process waits for a job (``Job.wait``, ``result()``, ``gpuctl result``).

The job runs on without this process (it holds its GPU until it ends), so a Ctrl-C that only
stopped the waiting would leave it running unseen. ``interrupted(job)`` says so on stderr in one
line, "job ID keeps running on TARGET: `gpuctl cancel ID` stops it", or cancels it when the
Executor was made with ``cancel_on_interrupt=True`` (or the config's ``[jobs]
cancel_on_interrupt``), and returns the KeyboardInterrupt to raise, so that a script stops as
on any Ctrl-C (exit status 130 through the shell), whose traceback, when nothing catches it,
shows the caller's frames and not gpuctl's own.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import sys
import types
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuctl.jobs.job import Job

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def said(interrupt: BaseException) -> bool:
    """Whether ``interrupt`` is one ``interrupted`` returned (its line is on stderr already)."""
    return bool(getattr(interrupt, "gpuctl_job_id", None))


def interrupted(job: Job) -> KeyboardInterrupt:
    """Cancel ``job`` (its ``cancel_on_interrupt``) or say that it keeps running, on stderr;
    return the KeyboardInterrupt to raise in place of the Ctrl-C: a plain one (Python ends a
    script that does not catch it by SIGINT, as the shell expects, only for that very class),
    whose ``gpuctl_job_id`` and ``gpuctl_cancelled`` say which job and what became of it."""
    short = job.id[:12]
    cancelled = False
    if getattr(job, "cancel_on_interrupt", False):
        try:
            cancelled = job.cancel()
            line = (
                f"job {short} on {job.target} is cancelled (cancel_on_interrupt)"
                if cancelled
                else f"job {short} on {job.target} had ended already"
            )
        except Exception as e:  # the node went away, read-only mode: the job may run on
            line = (
                f"job {short} keeps running on {job.target}: cancelling it failed ({e}); "
                f"`gpuctl cancel {short}` stops it"
            )
    else:
        line = (
            f"job {short} keeps running on {job.target}: `gpuctl cancel {short}` stops it "
            f"(`gpuctl result {short}` waits for it again)"
        )
    print(f"gpuctl: {line}", file=sys.stderr, flush=True)
    _install_hook()
    interrupt = KeyboardInterrupt(line)
    interrupt.gpuctl_job_id = job.id  # type: ignore[attr-defined]
    interrupt.gpuctl_cancelled = cancelled  # type: ignore[attr-defined]
    return interrupt


def rest_of_map(jobs: Sequence[Job], waited: Job, cancel: bool) -> None:
    """After ``interrupted(waited)`` in a ``map``: the map's other jobs that started and have
    not ended are cancelled too (``cancel``), or a line says they keep running; those still
    waiting for their turn never start once this process exits (``JobQueue``)."""
    running = [
        j for j in jobs if j is not waited and j.handle and not concurrent.futures.Future.done(j)
    ]
    waiting = sum(1 for j in jobs if not j.handle)
    if not running and not waiting:
        return
    if cancel:
        ended = 0
        for job in running:
            with contextlib.suppress(Exception):  # one that cannot be reached runs on
                ended += bool(job.cancel())
        line = f"{ended} more job(s) of this map on {waited.target} are cancelled too"
    else:
        # one command for them all, the job waited for included (its own line named it alone)
        ids = " ".join(j.id[:12] for j in ([waited] if waited.handle else []) + running)
        line = (
            f"{len(running)} more job(s) of this map keep running on {waited.target}: "
            f"`gpuctl cancel {ids}` stops them all"
        )
    if waiting:
        line += f"; {waiting} waiting for their turn never start once this process exits"
    print(f"gpuctl: {line}", file=sys.stderr, flush=True)


_PREVIOUS: list[Any] = []


def _install_hook() -> None:
    """Show an uncaught interrupt of ``interrupted`` without gpuctl's frames (once; only over
    Python's own hook: an IDE's or IPython's stays as it is)."""
    if _PREVIOUS or sys.excepthook is not sys.__excepthook__:
        return
    _PREVIOUS.append(sys.excepthook)
    sys.excepthook = _hook


def _hook(kind: type[BaseException], value: BaseException, tb: types.TracebackType | None) -> None:
    if said(value):
        tb = without_own_frames(tb)
        value = value.with_traceback(tb)  # what Python's hook prints
    _PREVIOUS[0](kind, value, tb)


def without_own_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """``tb`` without the entries of gpuctl's own files."""
    kept = []
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(_PACKAGE):
            kept.append(tb)
        tb = tb.tb_next
    out = None
    for entry in reversed(kept):
        out = types.TracebackType(out, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return out
