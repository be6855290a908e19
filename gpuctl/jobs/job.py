"""A submitted job as its submitter sees it: ``Job`` (state, polling, result, cancel).

A ``Job`` reads its folder on the target's host (``outcome.json``, heartbeats, status lines) and
asks its backend what the scheduler knows; once the job is over it classifies what happened
(``gpuctl.jobs.classify``) and keeps the end in the job store. ``JobFailed`` is a system failure
(its message is the report); ``RemoteTraceback`` is the node's traceback attached to a user
exception raised again here (both in ``gpuctl.jobs.errors``). Reading the folder's outputs and
the result is ``gpuctl.jobs.jobfolder``'s part of the ``Job``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from gpuctl import service
from gpuctl.core import wire
from gpuctl.jobs import _chunk, targets
from gpuctl.jobs.backends import Backend, SlurmBackend
from gpuctl.jobs.classify import (
    JobFiles,
    classify,
    combine_ranks,
    parse_status,
    unreachable_report,
)
from gpuctl.jobs.errors import JobCancelled, JobFailed
from gpuctl.jobs.evidence import end_notes, shm_note
from gpuctl.jobs.hosts import HostError, LocalHost
from gpuctl.jobs.jobfolder import JobFolder
from gpuctl.jobs.jobqueue import owner_gone
from gpuctl.jobs.records import (
    Attempt,
    BackendInfo,
    FailedItems,
    Handle,
    Heartbeat,
    JobMeta,
    Outcome,
    QueuedBy,
    ResultInfo,
    SchedulerState,
    WorkerError,
)
from gpuctl.jobs.report import REMEDIES, FailureReport
from gpuctl.jobs.store import (
    FINAL_STATES,
    ITEMS_FAILED,
    PARTIAL,
    JobRecord,
    JobStore,
    JobUpdate,
    StoreError,
    shown_state,
)
from gpuctl.jobs.watcher import WATCHER
from gpuctl.node import jobfiles

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack from Python 3.11

    from gpuctl.config import Config

T = TypeVar("T")

# the job API's log name since before executor.py was split: log filters and readers know it
log = logging.getLogger("gpuctl.jobs.executor")

SUBMITTER_PYTHON = sys.version.split()[0]
UNREACHABLE_AFTER = 60.0  # seconds a node may stay unreachable before result() reports it
BEAT_EVERY = 3.0  # seconds between heartbeat reads while a job runs
SLURM_VERDICT_WAIT = 30.0  # seconds to wait for Slurm's final state after a signalled stop
_RAISED = ("user_exception", "gpu_out_of_memory")  # kinds that are the function's own exception


class Job(JobFolder, concurrent.futures.Future[Any]):
    """A submitted function call: a ``concurrent.futures.Future`` that explains failures.

    ``as_completed``, ``wait`` and ``asyncio.wrap_future`` take it as it is: a watcher thread
    completes it when its job ends. ``result()`` and ``exception()`` are gpuctl's (below), and
    ``cancel()`` asks the job to stop wherever it runs (the Future counts as done once it has).

    When the job's node stops answering, ``state`` is "unreachable" and ``result()`` keeps trying
    for ``unreachable_after`` seconds (or until its timeout), then raises ``JobFailed`` of kind
    ``node_unreachable``: not a verdict, the job may still run there, and a later ``result()``
    (or ``gpuctl result ID``) picks up the real outcome once the node is back.

    A job of several tasks (``handle["tasks"]``, Slurm's nodes x tasks_per_node) reads each
    rank's folder through a ``Job`` of its own (``ranks``); it is over once every rank is, and
    fails when any rank failed (the report names the ranks). ``result()`` is rank 0's value,
    ``results()`` every rank's; its logs are rank 0's.
    """

    unreachable_after = UNREACHABLE_AFTER
    ranks: list[Job]
    cancel_on_interrupt = False  # a Ctrl-C while waiting cancels it (set by the Executor)

    def __init__(
        self,
        job_id: str,
        name: str,
        target: str,
        backend: Backend,
        jobdir: str,
        handle: Handle,
        store: JobStore | None,
        created_at: float | None = None,
        *,
        watch: bool = True,
    ) -> None:
        super().__init__()
        self.id = job_id
        self.name = name
        self.target = target
        self.backend = backend
        self.jobdir = jobdir
        self.handle = handle
        self.store = store
        self.created_at = created_at or time.time()
        self._files: JobFiles | None = None
        self._report: FailureReport | None = None
        self._final = False
        self._cancel_requested = False
        self._stored_state = "submitted"
        self._lock = threading.Lock()
        self._host_error: str | None = None
        self._unreachable_since: float | None = None  # wall clock of the first failed poll
        self._unreachable_mono: float | None = None
        self._beat: Heartbeat | None = None
        self._beat_read_at: float | None = None  # monotonic time of the last heartbeat read
        self._outcome_seen_at: float | None = None
        self._store_warned = False
        self._queued_by: QueuedBy | None = None  # the process whose JobQueue holds it
        self.failed_items: FailedItems | None = None  # a map's chunk that ended: its failures
        self.tasks = int(handle.get("tasks") or 1)
        rank_handle = handle.copy()
        rank_handle.pop("tasks", None)
        self.ranks = [
            Job(
                job_id,
                name,
                target,
                backend,
                jobfiles.task_folder(jobdir, rank),
                rank_handle,
                None,
                created_at,
                watch=False,
            )
            for rank in range(self.tasks if self.tasks > 1 else 0)
        ]
        self._lead_rank: int | None = None  # the failed rank the report is about
        self._preloaded: tuple[Any] | None = None  # the result, read before a callback runs
        self._callbacks = False  # a done-callback was added (see _settle)
        self._watch = watch
        if watch and handle:  # completed as a Future in the background (a caller that polls
            WATCHER.add(self)  # itself opts out); a job waiting for its turn once it starts

    def add_done_callback(self, fn: Callable[[concurrent.futures.Future[Any]], object]) -> None:
        self._callbacks = True
        super().add_done_callback(fn)

    def __repr__(self) -> str:
        return f"<Job {self.id} {self.name} on {self.target}: {self.state}>"

    @property
    def _logs_job(self) -> Job:
        """Whose files are this job's logs and result: its own, or rank 0's."""
        return self.ranks[0] if self.ranks else self

    def __reduce__(self) -> tuple[Any, ...]:
        """A Job pickles as a handle (its id, target, backend, folder and job store's path):
        unpickled in another process it is that job again, read from its folder and its row."""
        store = str(self.store.path) if self.store is not None else None
        backend = {**self.backend.describe(), "handle": self.handle}
        return (
            _handle,
            (self.id, self.name, self.target, backend, self.jobdir, self.created_at, store),
        )

    # --- state ---------------------------------------------------------------------------

    def _poll(self) -> bool:
        """Read the folder; True once the job is over (outcome written, or can never be).

        A node that cannot be reached is remembered (``_host_error``, since when) and reads as
        "not over yet": the job may well be running there.
        """
        try:
            over = self._poll_files()
        except HostError as e:
            self._host_error = str(e)
            if self._unreachable_since is None:
                self._unreachable_since = time.time()
                self._unreachable_mono = time.monotonic()
            return False
        self._host_error = None
        self._unreachable_since = self._unreachable_mono = None
        return over

    @property
    def unreachable_for(self) -> float | None:
        """Seconds the node has been unreachable (None while it answers)."""
        if self._unreachable_mono is None:
            return None
        return time.monotonic() - self._unreachable_mono

    def _note_beat(self) -> None:
        """Read heartbeat.json now and then, so an unreachable node's report can say when the
        job was last seen alive."""
        now = time.monotonic()
        if self._beat_read_at is not None and now - self._beat_read_at < BEAT_EVERY:
            return
        self._beat_read_at = now
        beat = self._json(Heartbeat, jobfiles.HEARTBEAT)
        if beat is not None and beat != self._beat:
            self._beat = beat
            self._remember(heartbeat=beat)  # for a later gpuctl that finds the node gone

    @property
    def last_heartbeat(self) -> Heartbeat | None:
        """The supervisor's last heartbeat this process read (``t``, ``elapsed_s``, ``rss_kb``)."""
        return self._beat

    def unreachable_report(self) -> FailureReport | None:
        """The ``node_unreachable`` report while the node does not answer, else None (on this
        machine, where nothing is unreachable, the ``job_files_unreadable`` one)."""
        if self._host_error is None or self._unreachable_since is None:
            return None
        host = self.backend.host
        if isinstance(host, LocalHost):
            return FailureReport(
                kind="job_files_unreadable",
                phase="unknown",
                evidence=(self._host_error, f"job folder: {self.jobdir}"),
                remedy=REMEDIES["job_files_unreadable"],
                logs=self.logs(),
                job_id=self.id,
            )
        return unreachable_report(
            job_id=self.id,
            node=host.name,
            jobdir=self.jobdir,
            error=self._host_error,
            since=self._unreachable_since,
            now=time.time(),
            beat=self._beat,
            beat_seen_at=self._beat_read_at,
            logs=self.logs(),
        )

    def _poll_files(self) -> bool:
        if self.ranks:
            return self._poll_ranks()
        if not self.handle:
            return self._unstarted_over()
        with self._lock:
            if self._final:
                return True
            if isinstance(self.backend, SlurmBackend) and self.backend.pending(self.handle):
                return False  # nothing in its folder yet: Slurm has not started it
            outcome = self._json(Outcome, jobfiles.OUTCOME)
            sched: SchedulerState | None = None
            if outcome is None:
                self._note_beat()
                if not self.backend.finished_without_outcome(self.handle, self.jobdir):
                    return False
                # the supervisor may have written it just before it went away
                outcome = self._json(Outcome, jobfiles.OUTCOME)
                if outcome is None:
                    sched = self.backend.scheduler_state(self.handle) or {}
                    # a cancel from elsewhere (another gpuctl, a cancel as it started) left its file
                    if self._cancel_requested or self.backend.host.exists(
                        f"{self.jobdir}/{jobfiles.CANCEL}"
                    ):
                        sched["cancelled"] = True
                    beat = self._json(Heartbeat, jobfiles.HEARTBEAT)
                    self._beat = beat or self._beat  # its last sign of life: when it ended
                    t = beat.get("t") if beat else None
                    if t is not None:
                        sched["heartbeat_age"] = time.time() - float(t)
                    free = self._disk_free_kb()
                    if free is not None:  # a full disk is why a supervisor cannot write it
                        sched["disk_free_kb"] = free
            elif isinstance(self.backend, SlurmBackend) and not _clean_end(outcome):
                # (a clean end needs no verdict of Slurm's: not asking spares a map of
                # hundreds of jobs a lookup each once they have left squeue)
                sched = self.backend.scheduler_state(self.handle)
                if self._await_slurm_verdict(outcome, sched):
                    return False
            self._files = self._collect(outcome)
            self._report = classify(
                self._files,
                job_id=self.id,
                logs=self.logs(),
                scheduler=sched,
                submitter_python=SUBMITTER_PYTHON,
            )
            shm = shm_note(self._files.outcome or {})
            if self._report is not None and shm:  # a failure's report names them too
                self._report = dataclasses.replace(
                    self._report, evidence=(*self._report.evidence, shm)
                )
            if self._report is None and self.name.startswith("map:"):
                self.failed_items = self._json(FailedItems, _chunk.FAILED_ITEMS)
            self._final = True
            # under the lock: another thread that finds the job final finds its row final too
            self._store_final()
        self.backend.forget(self.handle)
        self._settle()
        return True

    def _poll_ranks(self) -> bool:
        """A job of several tasks: over once every rank is; its report names the failed ranks."""
        with self._lock:
            if self._final:
                return True
            if not all([job._poll_files() for job in self.ranks]):  # each rank polled
                return False
            self._files = self.ranks[0]._files
            self._report, self._lead_rank = combine_ranks(
                [job._report for job in self.ranks],
                [job._files for job in self.ranks],
                job_id=self.id,
                cancel_requested=self._cancel_requested,
            )
            self._final = True
        self._store_final()
        self._settle()
        return True

    def _disk_free_kb(self) -> int | None:
        """KiB available on the job folder's file system (``df -Pk``), or None."""
        try:
            rc, out, _ = self.backend.host.run(["df", "-Pk", self.jobdir], timeout=30)
        except HostError:
            return None
        rows = out.decode("utf-8", "replace").strip().splitlines()
        try:
            return int(rows[-1].split()[3]) if rc == 0 and len(rows) > 1 else None
        except (ValueError, IndexError):
            return None

    def _settle(self) -> None:
        """Mark the Future finished (once): waiters and done-callbacks see it. What it holds is
        a marker; ``result()``/``exception()`` read the job's own outcome."""
        report = self._report
        if report is None and self._callbacks and self._preloaded is None:
            # A done-callback may read the result in its own thread: asyncio.wrap_future's
            # reads it in the event loop, where fetching a result over SSH would block every
            # other task. It is read here first (the watcher's thread, or the caller's), kept,
            # and handed out by result(); one that fails to load is read again there, to raise.
            with contextlib.suppress(Exception):
                self._preloaded = (self._logs_job._load_result(),)
        if report is not None and report.kind == "cancelled":
            # a cancelled Future, as concurrent.futures has it: waiters and callbacks see it
            # cancelled (the base class's cancel, then its notice to as_completed and wait)
            if concurrent.futures.Future.cancel(self):
                concurrent.futures.Future.set_running_or_notify_cancel(self)
            return
        try:
            if report is None:
                concurrent.futures.Future.set_result(self, None)
            else:
                concurrent.futures.Future.set_exception(self, JobFailed(report))
        except concurrent.futures.InvalidStateError:
            pass  # settled already (two threads saw the end together)

    def _await_slurm_verdict(self, outcome: Outcome, sched: SchedulerState | None) -> bool:
        """True while a Slurm job whose supervisor was stopped by a signal gpuctl did not send
        (Slurm's time limit, preemption, an admin's scancel) is still in the queue: its final
        state says which, so wait for it (at most SLURM_VERDICT_WAIT s)."""
        if not (sched or {}).get("queued") or self._cancel_requested:
            return False
        if outcome.get("stop_reason") != "cancelled" or os.path.exists(
            jobfiles.JobPaths(self.jobdir).cancel
        ):
            return False
        now = time.monotonic()
        if self._outcome_seen_at is None:
            self._outcome_seen_at = now
        return now - self._outcome_seen_at < SLURM_VERDICT_WAIT

    def _collect(self, outcome: Outcome | None) -> JobFiles:
        return JobFiles(
            outcome=outcome,
            status=parse_status((self._read(jobfiles.STATUS) or b"").decode("utf-8", "replace")),
            error=self._json(WorkerError, jobfiles.ERROR),
            result_info=self._json(ResultInfo, jobfiles.RESULT_INFO),
            stderr_tail=self._tail(jobfiles.STDERR),
            setup_tail=self._tail(jobfiles.SETUP_LOG, 3000),
            meta=self._json(JobMeta, jobfiles.META),
            attempts=self._attempts(),
        )

    def _attempts(self) -> list[Attempt]:
        text = (self._read(jobfiles.ATTEMPTS) or b"").decode("utf-8", "replace")
        return wire.parse_list(Attempt, jobfiles.parse_lines(text))

    def attempts(self) -> list[Attempt]:
        """The attempts of this job that ended in a requeue (a checkpoint, or the scheduler's
        own requeue), oldest first; empty for a job that ran once."""
        return self._attempts()

    def _remember(self, **values: Unpack[JobUpdate]) -> bool:
        """Write to the job store; False when the row's state may not become ``state`` (see
        ``gpuctl.jobs.store.TRANSITIONS``). A store that stopped being writable costs the
        record, never the job (its folder keeps the truth): said once in the log."""
        if self.store is None:
            return True
        try:
            return self.store.update(self.id, **values)
        except StoreError as e:
            if not self._store_warned:
                self._store_warned = True
                log.warning("job %s: %s", self.id, e)
            return True

    def _store_final(self, *, seen: bool = True) -> bool:
        """Write the end to the row: the outcome's end time; for a job that ended with no
        outcome (its supervisor died), its last heartbeat's; else now (``seen``), or none when
        that is not known (the row's age is then its creation's)."""
        if self.store is None:
            return True
        state = "done" if self.state == PARTIAL else self.state
        r = self._report
        o: Outcome = (self._files.outcome if self._files else None) or {}
        ended = o.get("ended_at")
        if ended is None and self._files is not None and self._files.outcome is None:
            ended, seen = (self._beat or {}).get("t"), False
        kind, summary = (r.kind, r.evidence[0] if r.evidence else None) if r else (None, None)
        items = self.failed_items
        if r is None and items and items.get("count"):  # done, and some of its items failed
            named = ", ".join(items.get("failed") or ())
            more = ", ..." if int(items["count"]) > len(items.get("failed") or ()) else ""
            kind = ITEMS_FAILED
            summary = (
                f"{items['count']} of {items.get('items', '?')} items failed ({named}{more}): "
                f"{items.get('first', '')}"
            )
        return self._remember(
            state=state,
            kind=kind,
            # a success's own notes (processes it left running) where a failure has its why
            summary=summary if r is not None or kind else "; ".join(end_notes(o)) or None,
            started_at=o.get("started_at"),
            ended_at=ended or (time.time() if seen else None),
            report=r.to_dict() if r else None,
            threads=(o.get("threads") or {}).get("count"),
        )

    @property
    def state(self) -> str:
        """submitted | pending | running | unreachable | done | partial | failed | cancelled
        (partial: a ``map``'s chunk that ran to its end with some items failed,
        ``failed_items`` says which; ``gpuctl jobs`` says the same)."""
        if self._final or self._poll():
            if self._report is None:
                items = self.failed_items
                return shown_state("done", ITEMS_FAILED if items and items.get("count") else None)
            return "cancelled" if self._report.kind == "cancelled" else "failed"
        state = self._live_state()
        if state != self._stored_state and self.store is not None:
            self._stored_state = state
            self._remember(state=state)
        return state

    def _live_state(self) -> str:
        if self._host_error is not None:
            return "unreachable"
        if not self.handle:  # not started: its folder is being written, or it waits for its
            return "preparing" if self._stored_state == "preparing" else "pending"  # turn
        if self.ranks:  # running once one rank runs
            states = [job._live_state() for job in self.ranks]
            return "running" if "running" in states else states[0]
        try:
            if isinstance(self.backend, SlurmBackend):
                info = self.backend.scheduler_state(self.handle) or {}
                if info.get("state") == "PENDING":
                    return "pending"
            if self._beat or self._read(jobfiles.STATUS) or self._read(jobfiles.HEARTBEAT):
                return "running"
        except HostError as e:
            self._host_error = str(e)
            if self._unreachable_since is None:
                self._unreachable_since = time.time()
                self._unreachable_mono = time.monotonic()
            return "unreachable"
        return "submitted"

    def done(self) -> bool:
        """True once the job finished, failed or was cancelled."""
        return self._poll()

    def running(self) -> bool:
        """True while the function runs (``state == "running"``)."""
        return self.state == "running"

    def cancelled(self) -> bool:
        """True once the job ended because it was cancelled."""
        return self._poll() and self._report is not None and self._report.kind == "cancelled"

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until done; False at the timeout, or once the node has not answered for
        ``unreachable_after`` seconds (then ``unreachable_report()`` says so). A Ctrl-C while
        it waits raises KeyboardInterrupt after a line on stderr that says the job keeps
        running, or cancels the job (``cancel_on_interrupt``): ``gpuctl.jobs.interrupt``."""
        try:
            return self._wait(timeout)
        except KeyboardInterrupt:
            from gpuctl.jobs.interrupt import interrupted

            raise interrupted(self) from None

    def _wait(self, timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.005
        while not self._poll():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            gone = self.unreachable_for
            if gone is not None and gone >= self.unreachable_after:
                return False
            step = delay if left is None else min(delay, left)
            self.backend.wait_hint(self.handle, step)
            delay = min(delay * 1.5, 0.5 if isinstance(self.backend.host, LocalHost) else 1.0)
        return True

    @property
    def notes(self) -> list[str]:
        """What the job's end left to know beside its result, once it is over ([] before): the
        processes the function left running, which gpuctl stopped (a sidecar, a server), and
        the files that appeared in ``/dev/shm`` and outlive it (their memory). ``gpuctl jobs``
        shows the same in WHY."""
        if not self._poll() or self._files is None:
            return []
        return end_notes(self._files.outcome or {})

    def report(self) -> FailureReport | None:
        """The failure report once the job is over (None while running or after success); while
        the node does not answer, the ``node_unreachable`` report."""
        if not self._poll():
            return self.unreachable_report()
        return self._report

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The exception ``result()`` would raise, or None on success; raises
        ``TimeoutError`` and, for a cancelled job, ``concurrent.futures.CancelledError``."""
        try:
            self.result(timeout)
        except (TimeoutError, concurrent.futures.CancelledError):
            raise
        except BaseException as e:
            return e
        return None

    def result(self, timeout: float | None = None) -> Any:
        """The function's return value.

        Raises the function's own exception (its class when importable here, with the remote
        traceback as ``__cause__``; a ``KeyboardInterrupt`` or other ``BaseException`` that is not
        an ``Exception`` comes as the ``__cause__`` of a ``JobFailed`` instead, so that it never
        passes for a Ctrl-C here), ``JobFailed`` for any other failure (its message is the
        report; kind ``node_unreachable`` when the node stopped answering: call again once it
        is back), ``TimeoutError``, or ``JobCancelled`` (a ``concurrent.futures.CancelledError``)
        for a job that was cancelled (``cancelled()`` is True).
        """
        if not self.wait(timeout):
            lost = self.unreachable_report()
            if lost is not None:
                raise JobFailed(lost)
            raise TimeoutError(f"job {self.id} not finished after {timeout} s")
        r = self._report
        if r is not None and r.kind == "cancelled":
            raise JobCancelled(r)
        if self.ranks and r is not None:
            # the failed rank's own exception is the cause; the failure is the whole job's
            lead = self.ranks[self._lead_rank or 0]
            raised = lead._report is not None and lead._report.kind in _RAISED
            raise JobFailed(r) from (lead._load_exception() if raised else None)
        try:
            if r is None:
                preloaded = self._preloaded
                if preloaded is not None:
                    return preloaded[0]
                return self._logs_job._load_result()
            exc = self._load_exception() if r.kind in _RAISED else None
        except HostError as e:  # the node went away between the outcome and the result
            self._host_error = str(e)
            self._unreachable_since = time.time()
            self._unreachable_mono = time.monotonic()
            lost = self.unreachable_report()
            assert lost is not None
            raise JobFailed(lost) from None
        if isinstance(exc, Exception):
            raise exc
        # A KeyboardInterrupt (or another BaseException) raised on the node is the job's failure,
        # not this process's Ctrl-C: raised as such it would stop the caller as if interrupted.
        raise JobFailed(r) from exc

    def results(self, timeout: float | None = None) -> list[Any]:
        """Every rank's return value, in rank order (one value for a job of one task). Raises
        what ``result()`` raises."""
        first = self.result(timeout)
        return [first, *(job._load_result() for job in self.ranks[1:])]

    def cancel(self, *, read_only: bool | None = None) -> bool:
        """Ask the job to stop (TERM, grace, KILL on the node); False if it had finished.

        Raises ``gpuctl.service.ReadOnlyError`` in read-only mode (``read_only``: the caller's
        decision; None: ``$GPUCTL_READ_ONLY`` and the config, ConfigError when it cannot be
        read)."""
        service.check("cancelling jobs", read_only=read_only)
        if self._poll():
            return False
        if not self.handle:
            return self._cancel_unstarted()
        self._cancel_requested = True
        for job in self.ranks:
            job._cancel_requested = True
        self.backend.cancel(self.handle, self.jobdir)
        return True

    def _cancel_unstarted(self) -> bool:
        """Cancel a job still waiting for its turn (``max_running``): it ends here, cancelled,
        and never starts. Its row goes from "pending" to "cancelled" only while it is pending:
        when its queue (another gpuctl) claimed it meanwhile, the cancel file stops it as it
        starts, like any job."""
        self._cancel_requested = True
        report = FailureReport(
            kind="cancelled",
            phase="not started",
            evidence=("cancelled while it waited for its turn (max_running): it never ran",),
            remedy=REMEDIES["cancelled"],
            logs={},
            job_id=self.id,
        )
        if self.store is not None:
            try:
                ended = self.store.update(
                    self.id,
                    only_from=("preparing", "pending"),
                    state="cancelled",
                    kind="cancelled",
                    summary=report.evidence[0],
                    ended_at=time.time(),
                    report=report.to_dict(),
                )
            except StoreError:
                ended = False
            if not ended:
                if self._unstarted_over():
                    return False  # it ended first
                self.backend.cancel(self.handle, self.jobdir)  # it is starting: the file stops it
                return True
        self._end_unstarted(report, store=False)
        return True

    def _started(self, handle: Handle) -> None:
        """A job that waited for its turn (``JobQueue``) was started: ``handle`` is its
        backend's; from now on it is watched like any other."""
        self.handle.update(handle)
        if self._watch:
            WATCHER.add(self)

    def _start_failed(self, why: str) -> None:
        """Starting a job that waited for its turn failed (``why``: one line): it is over, as
        ``never_started`` with that line, and its row says so."""
        self._end_unstarted(
            FailureReport(
                kind="never_started",
                phase="not started",
                evidence=(why,),
                remedy="fix what the line above says, then submit the items again",
                logs=self.logs(),
                job_id=self.id,
            )
        )

    @classmethod
    def of_record(
        cls,
        record: JobRecord,
        store: JobStore | None,
        config: Config | None = None,
        *,
        watch: bool = True,
    ) -> Job:
        """The ``Job`` of a stored record, its backend rebuilt from the record
        (``targets.backend_of``: ``config``'s nodes, else the session's); what
        ``executor.attach`` and an unpickled Job build."""
        job = cls(
            record.id,
            record.name,
            record.target,
            targets.backend_of(record.backend, record.id, config),
            record.jobdir,
            record.backend.get("handle", Handle()).copy(),
            store,
            record.created_at,
            watch=watch,
        )
        job._restore(record)
        return job

    def _restore(self, record: JobRecord) -> None:
        """Take what the store knows of the job: the state last seen, the last heartbeat, the
        process whose queue holds it. A job that ended before it started (``never_started``, or
        cancelled while it waited for its turn) has no folder to tell: its row is the truth,
        and this Job is over as the row says."""
        self._stored_state = record.state
        self._beat = record.heartbeat
        self._queued_by = record.backend.get("queued_by")
        if not self.handle and record.state in FINAL_STATES:
            self._end_unstarted(_stored_report(record), store=False)

    def _end_unstarted(
        self, report: FailureReport | None, *, store: bool = True, seen: bool = True
    ) -> None:
        """End a job that never started with ``report``, its row too (``store``; ``seen``: it
        ended now, else at a time not known). A row that ended meanwhile (another gpuctl
        cancelled it) keeps its end, and so does this Job."""
        with self._lock:
            if self._final:
                return
            self._report = report
            self._final = True
            if store and not self._store_final(seen=seen):
                rec = self._row()
                if rec is not None and rec.state in FINAL_STATES:
                    self._report = _stored_report(rec)
        self._settle()

    def _row(self) -> JobRecord | None:
        """The job's row in the store (None: no store, no row, or a store that cannot be read)."""
        if self.store is None:
            return None
        try:
            return self.store.get(self.id)
        except StoreError:
            return None

    def _unstarted_over(self) -> bool:
        """A job not started yet (waiting for its turn in a ``JobQueue``): over once its row
        ended (cancelled, or ended by another gpuctl), or once the process holding it in its
        queue is gone (then it never will start). A row that gained a handle meanwhile (its
        queue, in another process, started it) gives this Job the handle: it is polled as any."""
        if self._final:
            return True
        rec = self._row()
        if rec is not None and rec.state in FINAL_STATES:
            self._end_unstarted(_stored_report(rec), store=False)
            return True
        handle = (rec.backend.get("handle") if rec is not None else None) or {}
        if handle:
            self._started(handle)
            return False
        owner = (rec.backend.get("queued_by") if rec is not None else None) or self._queued_by
        if owner is None or not owner_gone(owner):
            return False
        self._end_unstarted(
            FailureReport(
                kind="never_started",
                phase="not started",
                evidence=(
                    f"the gpuctl process that was to start it (pid {owner.get('pid')} on "
                    f"{owner.get('host')}) ended before it did: it never ran",
                ),
                remedy="submit the items again",
                logs={},
                job_id=self.id,
            ),
            seen=False,  # when that process went is not known
        )
        return True

    def _claim(self) -> bool:
        """Its turn came (``JobQueue``): True when it may start. Its row becomes "submitted"
        first, so that a ``gpuctl cancel`` from another process either comes before (this Job
        ends as cancelled, never starting: False) or finds a job to stop (the cancel file)."""
        if self._final:
            return False
        if self.store is None:
            return True
        try:
            claimed = self.store.update(self.id, state="submitted")
        except StoreError:
            return True  # a store that cannot be written costs the record, never the job
        if not claimed:
            self._unstarted_over()  # the row ended: so does this Job
        return claimed

    def dump_stacks(self) -> None:
        """Ask VENV2 to write every thread's stack to stderr (for a job that makes no progress)."""
        import signal

        self.backend.signal(self.handle, self.jobdir, signal.SIGUSR2)


def _handle(
    job_id: str,
    name: str,
    target: str,
    backend: BackendInfo,
    jobdir: str,
    created_at: float,
    store_path: str | None,
) -> Job:
    """A pickled Job unpickled: attached again, from its row when the store has it (the row
    knows more: the handle a queued job got since, its end), else from what was pickled."""
    store = JobStore(store_path) if store_path else None
    rec = store.get(job_id) if store is not None else None
    if rec is not None and rec.jobdir != jobdir:  # a rank of a job of several tasks: the row
        store = rec = None  # is the whole job's, not the rank's
    if rec is None or rec.id != job_id:
        rec = JobRecord(job_id, name, target, backend, jobdir, "submitted", created_at)
    return Job.of_record(rec, store)


def _stored_report(record: JobRecord) -> FailureReport | None:
    """The report a row keeps (a row written when a start failed has its kind and line only)."""
    if record.report and record.report.get("kind"):
        return FailureReport.from_dict(record.report)
    if record.state == "done":
        return None
    kind = record.kind or ("cancelled" if record.state == "cancelled" else "never_started")
    return FailureReport(
        kind=kind,
        phase="not started",
        evidence=(record.summary or "it ended before it started",),
        remedy=REMEDIES.get(kind, ""),
        logs={},
        job_id=record.id,
    )


def _clean_end(outcome: Outcome) -> bool:
    """True when the supervisor saw VENV2 exit 0 with nothing stopping it."""
    return outcome.get("exit_code") == 0 and outcome.get("stop_reason") is None
