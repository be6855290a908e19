"""A capped ``map`` on a backend without a scheduler of its own (local, SSH): ``JobQueue``
starts its jobs at most ``limit`` at a time, the next as one ends, and ends those still
waiting when this process exits. The process that holds a queue is named in each waiting
job's row (``queue_owner``), so that another process can tell when it is gone
(``owner_gone``) and the jobs it held will never start.
"""

from __future__ import annotations

import atexit
import collections
import concurrent.futures
import os
import socket
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from gpuctl.jobs.records import QueuedBy
from gpuctl.node import proc

if TYPE_CHECKING:
    from gpuctl.jobs.job import Job


class JobQueue:
    """Starts jobs at most ``limit`` at a time, the next as one ends: a capped ``map`` on a
    backend without a scheduler of its own (local, SSH; Slurm caps arrays itself, ``%K``).

    It has no polling of its own: the job that ends starts the next from its done-callback,
    and jobs end when the watcher (or a caller's ``result()``) polls them, like every job.
    ``start(job)`` starts one job and calls its ``_started``; an exception it raises ends that
    job as ``never_started`` with the error's line, and the next job takes the turn. When the
    very first start fails, the constructor raises that error (every job ends with it): a
    backend that cannot start a job says so at once, as ``submit`` does. Jobs still waiting
    when this process exits never start: their rows end so, with why.
    """

    def __init__(self, jobs: Sequence[Job], limit: int, start: Callable[[Job], None]) -> None:
        self._waiting = collections.deque(jobs)
        self._start = start
        self._lock = threading.Lock()
        self._turns = 0  # free slots not yet given to a job
        self._busy = False  # a thread is giving turns out (callbacks may come inside it)
        while self._waiting and not self._waiting[0]._claim():
            self._waiting.popleft()  # cancelled before its turn came
        if self._waiting:
            first = self._waiting.popleft()
            try:
                start(first)
            except Exception as e:
                self._waiting.appendleft(first)
                self.abandon(f"starting it failed: {e}")
                raise
            # the base method: a queue's callback reads no result (Job.add_done_callback would)
            concurrent.futures.Future.add_done_callback(first, self._ended)
        _QUEUES.add(self)
        self._free(limit - 1)

    def _free(self, slots: int) -> None:
        with self._lock:
            self._turns += slots
            if self._busy:  # the thread giving turns out takes these too: no recursion
                return
            self._busy = True
        while True:
            with self._lock:
                if not self._waiting or self._turns <= 0:
                    self._busy = False
                    return
                self._turns -= 1
                job = self._waiting.popleft()
            if not job._claim():  # it was cancelled while it waited: the turn is the next one's
                with self._lock:
                    self._turns += 1
                continue
            try:
                self._start(job)
            except Exception as e:
                job._start_failed(f"starting it failed: {e}")
                with self._lock:
                    self._turns += 1
                continue
            concurrent.futures.Future.add_done_callback(job, self._ended)

    def _ended(self, _: concurrent.futures.Future[Any]) -> None:
        self._free(1)

    def abandon(self, why: str) -> None:
        """End every job still waiting as ``never_started`` with ``why``."""
        with self._lock:
            left = list(self._waiting)
            self._waiting.clear()
        for job in left:
            job._start_failed(why)


_QUEUES: weakref.WeakSet[JobQueue] = weakref.WeakSet()


@atexit.register
def _abandon_queues() -> None:
    for queue in list(_QUEUES):
        queue.abandon("gpuctl exited before its turn came (max_running): it never ran")


def queue_owner() -> QueuedBy:
    """This process, as the one whose ``JobQueue`` holds the jobs it has not started yet."""
    me = os.getpid()
    owner: QueuedBy = {"pid": me, "host": socket.gethostname()}
    stat = proc.read_stat(me)
    if stat is not None:
        owner["start_ticks"] = stat.start_ticks
    return owner


def owner_gone(owner: QueuedBy) -> bool:
    """True when the process that queued a job is known to be gone: on this machine, no such
    process, a zombie, or another process under its pid. False while alive, or not known here."""
    pid = owner.get("pid")
    if not pid or owner.get("host") != socket.gethostname():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's process: the pid was given to someone else
        return True
    stat = proc.read_stat(pid)
    if stat is None:  # no /proc here: alive as far as can be told
        return False
    ticks = owner.get("start_ticks")
    return stat.state == "Z" or (ticks is not None and stat.start_ticks != ticks)
