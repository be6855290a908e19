"""Slurm as an inventory source and as a way to reach nodes, and who holds each GPU.

- ``discover(...)``: nodes, partitions, GPU GRES counts and state (idle, mixed, drained, down)
  from ``sinfo``.
- ``SrunLink``: the agent as a job step, ``srun --overlap --jobid=<id> -w <node> -N1 -n1``, for
  clusters whose compute nodes refuse plain SSH unless you have a job there. The bundle is read
  from a folder shared with the nodes (the home by default): this process writes it there.
- ``JobWatcher``: which Slurm job and user hold each GPU, published on the fleet as
  ``fleet.annotate(node, gpu, slurm_job=..., slurm_user=...)``: one ``squeue`` filtered to the
  watched nodes and running jobs per poll, plus ``scontrol show job -d`` once per new GPU job (a
  running job's GPUs do not change); polls slow down while Slurm fails or answers slowly. Where
  a node's agent tells a GPU process's job from its cgroup, that wins (``prefer_cgroups``).

Every Slurm command goes through ``gpuctl.reach.slurm.SlurmClient``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import os
import re
import signal
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from gpuctl.bundle import write_bundle
from gpuctl.config import NodeConfig
from gpuctl.core.deadline import wait_for
from gpuctl.core.model import NodeSnapshot
from gpuctl.fleet.fleet import Fleet
from gpuctl.fleet.links import STREAM_LIMIT, NodeLink
from gpuctl.fleet.session import (
    AgentSession,
    LineFeed,
    LinkError,
    Piped,
    keep_stderr,
    settle,
    start_piped,
    stderr_ended,
)
from gpuctl.fleet.ssh import agent_script
from gpuctl.node import protocol
from gpuctl.reach.deploy import parse_reply
from gpuctl.reach.slurm import (
    DEFAULT_TIMEOUT,
    SlurmClient,
    SlurmError,
    SlurmJob,
    SlurmNode,
    current_user,
    nodelist,
)

__all__ = [
    "GpuHolder",
    "JobWatcher",
    "SlurmError",
    "SlurmNode",
    "SrunFanout",
    "SrunLink",
    "StepLink",
    "discover",
    "find_job",
    "gpu_holders",
    "next_delay",
    "prefer_cgroups",
]

log = logging.getLogger(__name__)

SLOW_QUERY = 2.0  # seconds: an squeue slower than this means a loaded controller
STDERR_END_S = 2.0  # a step's srun exited: how long its stderr is read on for its last words
MAX_INTERVAL = 300.0  # the watcher's longest wait between polls while Slurm fails or is slow
DETAILS_PER_POLL = 50  # new GPU jobs asked about (scontrol) per poll; the rest wait a poll


def discover(
    partition: str | None = None,
    *,
    client: SlurmClient | None = None,
    slurm_conf: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> list[SlurmNode]:
    """The nodes Slurm knows (of one partition, or all), with GPUs and state.

    Raises SlurmError when sinfo is missing or fails (SlurmValueError for a bad partition name).
    """
    client = client or SlurmClient(slurm_conf, timeout)
    return client.nodes(partition)


@dataclass(frozen=True, slots=True)
class GpuHolder:
    """A running job holding a GPU."""

    job: str
    user: str


def gpu_holders(
    client: SlurmClient,
    nodes: Iterable[str],
    cache: dict[str, dict[str, list[int]]] | None = None,
) -> dict[tuple[str, int], GpuHolder]:
    """Which running job holds each (node, GPU index) of ``nodes``: ``squeue`` filtered to those
    nodes, then ``scontrol show job -d`` for each GPU job not in ``cache`` (unique job id ->
    per-node indices, filled here). Raises SlurmError when squeue fails."""
    names = sorted(set(nodes))
    jobs = client.jobs(nodes=names, states=("RUNNING",))
    cache = {} if cache is None else cache
    for job in _new_gpu_jobs(jobs, cache)[:DETAILS_PER_POLL]:
        with contextlib.suppress(SlurmError):
            cache[job.unique_id] = client.job_gpus(job.unique_id)
    return _holders(jobs, cache, set(names))


def _new_gpu_jobs(jobs: list[SlurmJob], cache: Mapping[str, object]) -> list[SlurmJob]:
    return [j for j in jobs if j.gpus and j.unique_id not in cache]


def _holders(
    jobs: list[SlurmJob], cache: Mapping[str, dict[str, list[int]]], watched: set[str]
) -> dict[tuple[str, int], GpuHolder]:
    out: dict[tuple[str, int], GpuHolder] = {}
    for job in jobs:
        per_node = cache.get(job.unique_id)
        if not per_node:
            continue
        holder = GpuHolder(job=job.job_id, user=job.user)
        allocated = set(job.node_names())  # scontrol's lines only count on the job's own nodes
        for node, idx in per_node.items():
            if node in allocated and node in watched:
                for gpu in idx:
                    out[(node, gpu)] = holder
    return out


def prefer_cgroups(
    holders: dict[tuple[str, int], GpuHolder],
    jobs: list[SlurmJob],
    snaps: Iterable[NodeSnapshot],
    watched: set[str],
) -> dict[tuple[str, int], GpuHolder]:
    """``holders`` (the controller's view) with the nodes' own over it: a GPU whose process
    sits in a Slurm job's cgroup (``GpuProcess.slurm_job``, the job's own number, read by the
    node's agent) is that job's, whatever squeue's GPU indices said (Slurm's numbering and the
    node's can differ). A job the controller does not list as running keeps its number and the
    process's user."""
    by_number = {j.unique_id: j for j in jobs}
    out = dict(holders)
    for s in snaps:
        if s.name not in watched:
            continue
        for g in s.gpus:
            for p in g.processes:
                if p.slurm_job:
                    job = by_number.get(p.slurm_job)
                    out[(s.name, g.index)] = (
                        GpuHolder(job=job.job_id, user=job.user)
                        if job is not None
                        else GpuHolder(job=p.slurm_job, user=p.user or "")
                    )
                    break
    return out


def next_delay(interval: float, previous: float, ok: bool, took: float) -> float:
    """Seconds until the watcher's next poll.

    ``interval`` after a quick answer; after a slow one (``took`` > SLOW_QUERY seconds) ten
    times as long as it took, so a loaded controller is asked a tenth of the time at most; after
    a failure, twice the previous wait. Never more than MAX_INTERVAL (nor less than
    ``interval``).
    """
    if not ok:
        wait = max(interval, previous) * 2
    elif took > SLOW_QUERY:
        wait = 10 * took
    else:
        wait = interval
    return max(interval, min(MAX_INTERVAL, wait))


class JobWatcher:
    """Keeps ``slurm_job`` / ``slurm_user`` annotations on the fleet's GPUs current.

    Asks only about ``nodes`` (a node Slurm does not know is dropped from the query, with a
    warning, instead of failing it every time) and waits ``delay`` seconds between polls:
    ``interval`` normally, longer while Slurm fails or is slow (``next_delay``).
    """

    def __init__(
        self,
        fleet: Fleet,
        nodes: Iterable[str],
        *,
        client: SlurmClient | None = None,
        interval: float = 10.0,
    ) -> None:
        self.fleet = fleet
        self.nodes = set(nodes)
        self.client = client or SlurmClient()
        self.interval = interval
        self.delay = interval
        self.unknown: set[str] = set()  # watched names Slurm says it does not know
        self.shown: dict[tuple[str, int], GpuHolder] = {}
        self.error: str | None = None
        self.took: float | None = None  # seconds the last squeue took
        self._gpus: dict[str, dict[str, list[int]]] = {}
        self.polled = asyncio.Event()  # set once a poll has ended (a one-shot status waits)

    async def _jobs(self) -> list[SlurmJob]:
        names = sorted(self.nodes - self.unknown)
        for attempt in range(2):
            if not names:
                break
            t0 = time.monotonic()
            try:
                jobs = await self.client.jobs_async(nodes=names, states=("RUNNING",))
            except SlurmError as e:
                # squeue refuses the whole query for one name it does not know (and names only
                # the first); sinfo lists the known ones of a list without complaint
                if attempt or "Invalid node name" not in str(e):
                    raise
                known = {n.name for n in await self.client.nodes_async(names=names)}
                gone = set(names) - known
                if not gone:
                    raise
                log.warning(
                    "slurm job watcher: Slurm knows no node %s: not asking about it",
                    nodelist(sorted(gone)),
                )
                self.unknown |= gone
                names = [n for n in names if n in known]
                continue
            self.took = time.monotonic() - t0
            return jobs
        self.took = 0.0
        return []

    async def poll_once(self) -> None:
        """Query Slurm once and publish changes. Failures are kept in ``error``, not raised."""
        try:
            await self._poll()
        finally:
            self.polled.set()

    async def _poll(self) -> None:
        try:
            jobs = await self._jobs()
            running = {j.unique_id for j in jobs}
            for uid in set(self._gpus) - running:
                del self._gpus[uid]  # ended: forget its GPUs
            for job in _new_gpu_jobs(jobs, self._gpus)[:DETAILS_PER_POLL]:
                with contextlib.suppress(SlurmError):
                    self._gpus[job.unique_id] = await self.client.job_gpus_async(job.unique_id)
        except SlurmError as e:
            if str(e) != self.error:
                log.warning("slurm job watcher: %s", e)
            self.error = str(e)
            self.delay = next_delay(self.interval, self.delay, False, 0.0)
            return
        self.error = None
        self.delay = next_delay(self.interval, self.delay, True, self.took or 0.0)
        holders = _holders(jobs, self._gpus, self.nodes)
        snapshots = getattr(self.fleet, "snapshots", None)  # a test's recorder has none
        if snapshots is not None:
            holders = prefer_cgroups(holders, jobs, snapshots(), self.nodes)
        for key in set(self.shown) - set(holders):
            self.fleet.annotate(key[0], key[1], slurm_job=None, slurm_user=None)
        for key, h in holders.items():
            if self.shown.get(key) != h:
                self.fleet.annotate(key[0], key[1], slurm_job=h.job, slurm_user=h.user)
        self.shown = holders

    async def run(self) -> None:
        """Poll until cancelled."""
        while True:
            await self.poll_once()
            await asyncio.sleep(self.delay)  # a polling period, not synchronisation


def find_job(node: str, client: SlurmClient | None = None) -> str | None:
    """The id of a running job of this user that includes ``node``, or None.

    Raises SlurmError when squeue fails (a node Slurm does not know included).
    """
    client = client or SlurmClient()
    for job in client.jobs(nodes=[node], user=current_user(), states=("RUNNING",)):
        if node in job.node_names():
            return job.job_id
    return None


class SrunLink(NodeLink):
    """The agent as a step of a running job: ``srun --overlap --jobid=J -w NODE -N1 -n1``."""

    kind = "srun"
    node: NodeConfig  # always built from one

    def __init__(
        self,
        node: NodeConfig,
        *,
        seed: int = 0,
        slurm_node: SlurmNode | None = None,
        env: Mapping[str, str] | None = None,
        read_only: bool = False,
        client: SlurmClient | None = None,
    ) -> None:
        self.node = node
        self.read_only = read_only
        self.seed = seed
        self.slurm_node = slurm_node
        self.client = client or SlurmClient(
            node.slurm_conf, origin=f"[clusters.{node.cluster}] slurm_conf"
        )
        self.env = dict(env) if env is not None else self.client.env()
        self._bundle: Path | None = None
        self._digest: str | None = None  # the bundle's full sha256, checked on the node

    def describe(self) -> str:
        job = self.node.jobid
        return f"srun {self.node.name}" + (f" (job {job})" if job else "")

    def _bundle_path(self) -> Path:
        if self._bundle is None or not self._bundle.exists():
            folder = Path(self.node.bundle_dir).expanduser()
            try:
                # 0700: this folder holds code that runs as the user; nobody else may write
                folder.mkdir(mode=0o700, parents=True, exist_ok=True)
                mode = folder.stat().st_mode
                if mode & 0o077 and not mode & 0o1000 and folder.stat().st_uid == os.getuid():
                    folder.chmod(0o700)  # made wider by hand, or as the job root's parent
                elif mode & 0o022:
                    raise LinkError(
                        "deploy",
                        f"{folder} is writable by others: set bundle_dir to a private folder",
                    )
                self._bundle = write_bundle(folder)
                self._digest = hashlib.sha256(self._bundle.read_bytes()).hexdigest()
            except OSError as e:
                raise LinkError("deploy", f"cannot write the agent bundle in {folder}: {e}") from e
        return self._bundle

    async def _jobid(self) -> str:
        if self.node.jobid is not None:
            return str(self.node.jobid)
        try:
            jid = await asyncio.to_thread(find_job, self.node.name, self.client)
        except SlurmError as e:
            raise LinkError("slurm", str(e)) from None
        if jid is None:
            raise LinkError(
                "no_job",
                f"no running Slurm job of yours on {self.node.name}: start one "
                f"(salloc -w {self.node.name} ...) or set jobid = N for this cluster",
            )
        return jid

    def argv(self, jobid: str) -> list[str]:
        """The srun command line that starts the agent on the node."""
        bundle = self._bundle_path()
        script = agent_script(
            self.node,
            str(bundle.parent),
            bundle.name,
            self.seed,
            self.read_only,
            digest=self._digest,
        )
        return self.client.step_argv(jobid, [self.node.name], ["sh", "-c", script])

    async def _still_down(self) -> bool:
        """True when Slurm (asked again: what discovery saw may be old) has the node down."""
        if self.slurm_node is None or not self.slurm_node.down:
            return False
        with contextlib.suppress(SlurmError):
            fresh = await self.client.nodes_async(names=[self.node.name])
            self.slurm_node = next((n for n in fresh if n.name == self.node.name), None)
        return self.slurm_node is not None and self.slurm_node.down

    def _deploy_error(self, word: str, rest: str) -> LinkError:
        """The one line for the boot code's word (see ``gpuctl.reach.deploy``)."""
        name, py = self.node.name, self.node.python
        if word == "no-python":
            return LinkError("no_python", f"no python at {py!r} on {name}")
        if word == "old-python":
            return LinkError("no_python", f"{py} on {name} is Python {rest}: the agent needs 3.6+")
        if word == "unsafe-dir":
            return LinkError(
                "deploy", f"{name}: the agent's folder {rest}: set bundle_dir to a private folder"
            )
        return LinkError(
            "deploy",
            f"{name} cannot see the right bundle at {self._bundle_path()} ({word}): set "
            "bundle_dir to a folder of yours shared with the nodes",
        )

    async def _start(self, jobid: str) -> tuple[Piped, bytes, Callable[[], Awaitable[None]]]:
        srun = await start_srun(self.argv(jobid), self.env)

        async def close() -> None:
            await end_srun(srun.proc)

        try:
            first = await srun.out.peek()  # the hello (the session reads it) or a deploy word
        except asyncio.CancelledError:
            with contextlib.suppress(ProcessLookupError):
                srun.proc.terminate()  # srun signals its step, which ends
            raise
        return srun, first, close

    async def open(self) -> AgentSession:
        if await self._still_down():
            assert self.slurm_node is not None
            why = f": {self.slurm_node.reason}" if self.slurm_node.reason else ""
            raise LinkError("down", f"Slurm has {self.node.name} {self.slurm_node.state}{why}")
        jobid = await self._jobid()
        for attempt in range(2):
            srun, first, close = await self._start(jobid)
            reply = parse_reply(first)
            if first and reply is None:
                break
            err: list[bytes] = []
            with contextlib.suppress(TimeoutError):
                await wait_for(_read_all(srun.err, err), 5.0)
            await close()
            if reply is None:  # srun or the agent ended before a word
                lines = b"".join(err).decode(errors="replace").strip().splitlines()
                detail = lines[-1] if lines else f"srun exited {srun.proc.returncode}"
                reason = "slurm" if "srun:" in detail else "agent_crashed"
                raise LinkError(reason, f"{self.node.name}: {detail}")
            word, rest = reply
            if word == "mismatch" and attempt == 0:
                self._bundle = None  # written again from this gpuctl, never run as it was
                continue
            raise self._deploy_error(word, rest)
        assert srun.proc.stdin is not None
        # the agent's lines go to the session from the pipe's callback (``AgentSession.stream``)
        session = AgentSession(srun.out, srun.proc.stdin, close=close)
        srun.err.push_to(functools.partial(keep_stderr, session.stderr_tail), stderr_ended)
        return session


async def start_srun(argv: list[str], env: Mapping[str, str]) -> Piped:
    """Start an srun step with pipes on all three streams, its output read into feeds
    (``session.start_piped``). Raises LinkError when srun is not there."""
    try:
        # a Ctrl-C in the terminal is gpuctl's, not srun's
        return await start_piped(argv, env, limit=STREAM_LIMIT, start_new_session=True)
    except FileNotFoundError:
        raise LinkError("slurm", "srun not found: is this a Slurm login node?") from None


async def end_srun(proc: asyncio.subprocess.Process) -> None:
    """EOF on the step's stdin (its agents stop and the step ends); TERM, then KILL, when srun
    is still there 5 s later."""
    if proc.stdin is not None and not proc.stdin.is_closing():
        proc.stdin.close()
    try:
        await wait_for(proc.wait(), 5.0)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            await wait_for(proc.wait(), 5.0)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()


async def _read_all(feed: LineFeed, into: list[bytes]) -> None:
    """What is left on ``feed`` to its end, into ``into`` (an srun that failed: its words)."""
    with contextlib.suppress(Exception):
        while line := await feed.readline():
            into.append(line)


# -- one srun step for many nodes --------------------------------------------------------------

_LABEL = re.compile(rb" *(\d+): ")
_TASK_EXIT = re.compile(r"srun: error: (\S+): tasks? ([\d,-]+): (.*)")
TASK_TAG = b"gpuctl-task: "  # each task's first line: its node's Slurm name
EXIT_TAG = b"gpuctl-exit: "  # each task's last line: the agent's exit status


def step_script(agent: str) -> str:
    """The ``sh`` script of each task of a shared step: say which node this is, run the agent
    script (``agent``, which may ``exec`` or ``exit``: it runs in a subshell), then say how the
    agent ended."""
    return (
        f'echo "{TASK_TAG.decode()}$SLURMD_NODENAME"\n'
        f"(\n{agent}\n)\n"
        f'rc=$?\necho "{EXIT_TAG.decode()}$rc"\nexit $rc'
    )


def exit_words(status: int) -> str:
    """How a shell's exit status reads: "exited with status 3", "killed by SIGKILL"."""
    if status > 128:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(status - 128).name}"
    return f"exited with status {status}"


class _Task:
    """One node's share of a shared step: its lines (whole messages) in a ``LineFeed`` (its
    session's reader: once pushed, each goes on from srun's pipe callback), its end, its
    stderr."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.state = "waiting"  # waiting (not claimed yet) | claimed | gone
        # no transport to pause: the pipe is every node's (a node not claimed yet holds its
        # lines until it is, or the step ends)
        self.feed = LineFeed(limit=STREAM_LIMIT)
        self.joiner = protocol.Joiner()
        self.ended = asyncio.Event()
        self.stderr_tail: list[str] = []

    def finish(self, error: LinkError | None) -> None:
        """The agent ended: normally (None: its lines end) or as ``error`` says (its reader
        raises it after the lines read before)."""
        if not self.ended.is_set():
            self.ended.set()
            if error is None:
                self.feed.feed_eof()
            else:
                self.feed.set_exception(error)

    def note(self, text: str) -> None:
        self.stderr_tail.append(text)
        del self.stderr_tail[:-20]


class _Addressed:
    """Writes one node's requests onto the step's shared stdin, addressed to that node."""

    def __init__(self, step: _Step, name: str) -> None:
        self.step = step
        self.prefix = b"@" + name.encode() + b" "

    def write(self, data: bytes) -> None:
        stdin = self.step.proc.stdin
        if stdin is None or stdin.is_closing():
            raise ConnectionError("the srun step's stdin is closed")
        stdin.write(self.prefix + data)

    async def drain(self) -> None:
        assert self.step.proc.stdin is not None
        await self.step.proc.stdin.drain()


class _Step:
    """One running ``srun`` whose tasks are the agents of ``names`` (one each)."""

    def __init__(self, jobid: str, names: list[str], srun: Piped) -> None:
        self.jobid = jobid
        self.proc = srun.proc
        self.tasks = {n: _Task(n) for n in names}
        self._by_id: dict[int, _Task] = {}
        self.errors: list[str] = []  # srun's own lines, for a step that failed as a whole
        self.done = asyncio.Event()  # srun exited
        loop = asyncio.get_running_loop()
        self._out_end: asyncio.Future[None] = loop.create_future()
        self._err_end: asyncio.Future[None] = loop.create_future()
        # srun's lines are split among the nodes from its pipes' callbacks (``_on_out``,
        # ``_on_err``); one task waits for the step's end
        srun.out.push_to(self._on_out, functools.partial(settle, self._out_end))
        srun.err.push_to(self._on_err, functools.partial(settle, self._err_end))
        self._ending = loop.create_task(self._end())
        self._closing: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return not self.done.is_set()

    def _task_of(self, line: bytes) -> tuple[_Task | None, int, bytes]:
        m = _LABEL.match(line)
        if m is None:
            return None, -1, line
        tid = int(m.group(1))
        return self._by_id.get(tid), tid, line[m.end() :]

    def _on_out(self, line: bytes) -> None:
        """A line of srun's stdout: a task's name, exit, or a piece of its agent's message."""
        task, tid, body = self._task_of(line)
        if task is None:
            if tid >= 0 and body.startswith(TASK_TAG):
                name = body[len(TASK_TAG) :].strip().decode(errors="replace")
                if name in self.tasks:
                    self._by_id[tid] = self.tasks[name]
            return
        if body.startswith(EXIT_TAG):
            self._exited(task, body[len(EXIT_TAG) :].strip())
            return
        whole = task.joiner.feed(body.rstrip(b"\n"))
        if whole is not None:
            task.feed.feed_data(whole + b"\n")  # to its session, in this callback once pushed

    async def _end(self) -> None:
        """srun's stdout ended: once srun exited and its stderr is read to its end (srun's own
        last words are there: a loaded machine once named the reason before reading them),
        end every task still running, saying why."""
        with contextlib.suppress(Exception):
            await self._out_end
        await self.proc.wait()
        with contextlib.suppress(Exception):
            await wait_for(asyncio.shield(self._err_end), STDERR_END_S)
        why = self.errors[-1] if self.errors else f"srun exited {self.proc.returncode}"
        started = set(self._by_id.values())
        for task in self.tasks.values():
            reason = "lost" if task in started else "slurm"  # srun could not start it at all
            task.finish(LinkError(reason, f"{task.name}: the shared srun step ended: {why}"))
        self.done.set()

    def _exited(self, task: _Task, status: bytes) -> None:
        try:
            code = int(status)
        except ValueError:
            code = -1
        if code == 0:
            task.finish(None)
            return
        tail = " | ".join(task.stderr_tail[-3:])
        task.finish(
            LinkError(
                "agent_crashed",
                f"{task.name}: agent {exit_words(code)}" + (f": {tail}" if tail else ""),
            )
        )

    def _on_err(self, line: bytes) -> None:
        """A line of srun's stderr: a task's (kept for its reason) or srun's own."""
        task, _tid, body = self._task_of(line)
        text = body.decode(errors="replace").rstrip()
        if task is not None:
            task.note(text)
            return
        m = _TASK_EXIT.match(text)
        if m is not None and m.group(1) in self.tasks:
            self.tasks[m.group(1)].note(text)
        else:
            self.errors.append(text)
            del self.errors[:-20]

    def in_use(self) -> bool:
        """True while a task may still be claimed or is someone's session."""
        return any(
            t.state == "claimed" or (t.state == "waiting" and not t.ended.is_set())
            for t in self.tasks.values()
        )

    async def release(self, name: str) -> None:
        """The node's session closed (its ``shutdown`` was sent): wait a little for its agent
        to end, then end the step when no node uses it any more."""
        task = self.tasks[name]
        with contextlib.suppress(TimeoutError):
            await wait_for(task.ended.wait(), 5.0)
        task.state = "gone"
        if not self.in_use():
            await self.close()

    async def close(self) -> None:
        """EOF on the shared stdin (every agent stops), then TERM and KILL if srun lingers."""
        if self._closing is None:
            self._closing = asyncio.get_running_loop().create_task(self._close())
        await asyncio.shield(self._closing)

    async def _close(self) -> None:
        await end_srun(self.proc)
        with contextlib.suppress(TimeoutError):
            await wait_for(self.done.wait(), 5.0)


class SrunFanout:
    """The agents of several nodes of one job as ONE srun step (``srun --overlap --jobid=J -w
    NODES -N K --ntasks-per-node=1 --label --input=all``) instead of one srun per node: Slurm's
    own I/O forwarding carries every node's lines, and the login node runs one srun.

    Each node still gets its own ``AgentSession`` (``StepLink``): its lines are picked out of
    the step's output by their task label, its requests are addressed to it (``@NODE``) on the
    shared stdin, and it is pinged on its own. A node whose agent ended while the step runs
    goes on with an srun of its own (``SrunLink``) from then on; the other nodes carry on.
    Nodes are grouped by the job that holds them (their ``jobid``, else ``squeue``).
    """

    def __init__(self, links: Mapping[str, SrunLink], client: SlurmClient) -> None:
        self.links = dict(links)
        self.client = client
        self.solo: set[str] = set()  # nodes that went on with their own srun
        self.steps: list[_Step] = []
        self._step_of: dict[str, _Step] = {}
        self._why: dict[str, LinkError] = {}
        self._lock = asyncio.Lock()

    async def _jobs(self, names: list[str]) -> dict[str, str]:
        """Node -> the running job of ours that holds it (the one holding most of ``names``)."""
        fixed = {n: str(self.links[n].node.jobid) for n in names if self.links[n].node.jobid}
        rest = [n for n in names if n not in fixed]
        if not rest:
            return fixed
        try:
            jobs = await self.client.jobs_async(
                nodes=rest, user=current_user(), states=("RUNNING",)
            )
        except SlurmError as e:
            raise LinkError("slurm", str(e)) from None
        jobs.sort(key=lambda j: -len(set(j.node_names()) & set(rest)))
        for name in rest:
            job = next((j for j in jobs if name in j.node_names()), None)
            if job is not None:
                fixed[name] = job.job_id
        return fixed

    def _free(self, name: str) -> bool:
        """True when no running step carries (or is about to carry) the node's agent."""
        step = self._step_of.get(name)
        if name in self.solo:
            return False
        return step is None or not step.running or step.tasks[name].state == "gone"

    async def _start_steps(self) -> None:
        names = [n for n in self.links if self._free(n) and not self._carried_before(n)]
        jobs = await self._jobs(names)
        for name in names:
            if name not in jobs:
                self._why[name] = LinkError(
                    "no_job",
                    f"no running Slurm job of yours on {name}: start one "
                    f"(salloc -w {name} ...) or set jobid = N for this cluster",
                )
        groups: dict[tuple[str, str], list[str]] = {}
        for name, jobid in jobs.items():
            groups.setdefault((jobid, self._script(name)), []).append(name)
        for (jobid, script), members in groups.items():
            argv = self.client.step_argv(
                jobid, members, ["sh", "-c", step_script(script)], shared=True
            )
            srun = await start_srun(argv, self.links[members[0]].env)
            step = _Step(jobid, members, srun)
            self.steps = [s for s in self.steps if s.running] + [step]
            for name in members:
                self._step_of[name] = step
                self._why.pop(name, None)

    def _carried_before(self, name: str) -> bool:
        """The node's agent ended while its step still runs: it goes on alone."""
        step = self._step_of.get(name)
        if step is not None and step.running and step.tasks[name].state == "gone":
            self.solo.add(name)
            return True
        return False

    def _script(self, name: str) -> str:
        link = self.links[name]
        bundle = link._bundle_path()
        return agent_script(
            replace(link.node, name=""),
            str(bundle.parent),
            bundle.name,
            0,
            link.read_only,
            digest=link._digest,
            addressed=True,
        )

    async def open(self, name: str) -> AgentSession | None:
        """The node's session out of a shared step (started when none carries it), or None
        when the node must use an srun of its own. Raises LinkError (no job, srun failed,
        the agent could not start)."""
        async with self._lock:
            if name in self.solo or self._carried_before(name):
                return None
            step = self._step_of.get(name)
            if step is None or not step.running or step.tasks[name].state != "waiting":
                await self._start_steps()
                step = self._step_of.get(name)
                if step is None or step.tasks[name].state != "waiting":
                    raise self._why.get(name) or LinkError("slurm", f"{name}: no srun step")
            task = step.tasks[name]
            task.state = "claimed"
        try:
            first = await task.feed.peek()  # the hello (the session reads it) or a deploy word
        except BaseException:  # the step ended, or the fleet gave up waiting (cancelled)
            task.state = "gone"
            with contextlib.suppress(ConnectionError, RuntimeError):
                _Addressed(step, name).write(protocol.encode({"type": "shutdown"}))
            raise
        reply = parse_reply(first)
        if reply is not None:
            task.state = "gone"
            word, rest = reply
            if word == "mismatch":
                self.solo.add(name)  # its own srun writes the bundle again and retries
                return None
            raise self.links[name]._deploy_error(word, rest)
        session = AgentSession(
            task.feed,  # its lines go on from srun's pipe callback (``AgentSession.stream``)
            _Addressed(step, name),
            close=functools.partial(step.release, name),
        )
        session.stderr_tail = task.stderr_tail
        return session

    async def aclose(self) -> None:
        """End every step (the fleet stops)."""
        steps, self.steps = self.steps, []
        self._step_of.clear()
        await asyncio.gather(*(s.close() for s in steps), return_exceptions=True)


class StepLink(NodeLink):
    """One node of a ``SrunFanout``: its agent is a task of a step shared with other nodes of
    the job, or (after that agent ended) a step of its own (``SrunLink``)."""

    kind = "srun"
    node: NodeConfig  # always built from one

    def __init__(self, fanout: SrunFanout, own: SrunLink) -> None:
        self.fanout = fanout
        self.own = own
        self.node = own.node

    def describe(self) -> str:
        if self.node.name in self.fanout.solo:
            return self.own.describe()
        return f"srun {self.node.name} (one step for {len(self.fanout.links)} nodes)"

    async def open(self) -> AgentSession:
        session = await self.fanout.open(self.node.name)
        if session is None:
            return await self.own.open()
        return session

    async def aclose(self) -> None:
        await self.fanout.aclose()
