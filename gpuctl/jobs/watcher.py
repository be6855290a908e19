"""The watcher: one daemon thread per process that polls the unfinished jobs now and then, so
that a ``Job`` completes as a ``concurrent.futures.Future`` without anyone calling its
methods (``Job._poll``, the same a caller's ``wait`` uses). It backs off per job, and looks at
each less often when it watches hundreds.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import TYPE_CHECKING

from gpuctl.jobs.hosts import LocalHost

if TYPE_CHECKING:
    from gpuctl.jobs.job import Job

# the job API's log name since before executor.py was split: log filters and readers know it
log = logging.getLogger("gpuctl.jobs.executor")


WATCH_CROWD_MOST = 4.0  # the watcher's slowest pace per job, times this at most, with many jobs


class _Watcher:
    """One daemon thread that polls every unfinished ``Job`` of this process now and then, so
    that a job completes as a ``Future`` (``as_completed``, ``wait``, callbacks,
    ``asyncio.wrap_future``) without anyone calling its methods. Polls back off from 0.1 s to
    ``slowest`` seconds per job (local files are cheap, a node's are a round trip)."""

    def __init__(self) -> None:
        self._jobs: weakref.WeakSet[Job] = weakref.WeakSet()
        self._due: weakref.WeakKeyDictionary[Job, tuple[float, float]] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, job: Job) -> None:
        with self._lock:
            self._jobs.add(job)
            self._due[job] = (0.0, 0.1)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="gpuctl-jobs", daemon=True)
                self._thread.start()
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.clear()  # before looking: a job added from now on wakes the wait below
            now = time.monotonic()
            with self._lock:
                jobs = [j for j in self._jobs if self._due.get(j, (0.0, 0.1))[0] <= now]
                # hundreds of jobs (a map): each is looked at less often, so that watching
                # them costs about what a hundred do (a caller's wait still polls its own)
                crowd = min(WATCH_CROWD_MOST, max(1.0, len(self._jobs) / 100))
            for job in jobs:
                try:
                    over = job._poll()  # settles the Future when the job is over
                except Exception:  # the job's own calls report it; the watcher goes on
                    log.debug("watching job %s", job.id, exc_info=True)
                    over = False
                with self._lock:
                    if over:
                        self._jobs.discard(job)
                        self._due.pop(job, None)
                    else:
                        slowest = 1.0 if isinstance(job.backend.host, LocalHost) else 3.0
                        slowest *= crowd
                        step = min(self._due.get(job, (0.0, 0.1))[1] * 1.5, slowest)
                        self._due[job] = (time.monotonic() + step, step)
            with self._lock:
                if not self._jobs:
                    self._thread = None
                    return
                nxt = min(due for due, _ in self._due.values())
            self._wake.wait(max(0.01, nxt - time.monotonic()))


WATCHER = _Watcher()
