"""Slurm as an inventory source and as a way to reach nodes, and who holds each GPU.

- ``discover(...)``: nodes, partitions, GPU GRES counts and state (idle, mixed, drained, down)
  from ``sinfo``.
- ``SrunLink``: the agent as a job step, ``srun --overlap --jobid=<id> -w <node> -N1 -n1``, for
  clusters whose compute nodes refuse plain SSH unless you have a job there. The bundle is read
  from a folder shared with the nodes (the home by default): this process writes it there.
- ``JobWatcher``: which Slurm job and user hold each GPU, published on the fleet as
  ``fleet.annotate(node, gpu, slurm_job=..., slurm_user=...)``: one ``squeue`` filtered to the
  watched nodes and running jobs per poll, plus ``scontrol show job -d`` once per new GPU job (a
  running job's GPUs do not change); polls slow down while Slurm fails or answers slowly.

Every Slurm command goes through ``gpuctl.reach.slurm.SlurmClient``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gpuctl.bundle import write_bundle
from gpuctl.config import NodeConfig
from gpuctl.fleet.fleet import Fleet
from gpuctl.fleet.links import STREAM_LIMIT, NodeLink
from gpuctl.fleet.session import AgentSession, LinkError
from gpuctl.fleet.ssh import agent_script
from gpuctl.reach.bundle import parse_reply
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
    "SrunLink",
    "discover",
    "find_job",
    "gpu_holders",
    "next_delay",
]

log = logging.getLogger(__name__)

SLOW_QUERY = 2.0  # seconds: an squeue slower than this means a loaded controller
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
        return [
            "srun",
            "--overlap",
            f"--jobid={jobid}",
            "-w",
            self.node.name,
            "-N1",
            "-n1",
            "--quiet",
            "--kill-on-bad-exit=1",
            "sh",
            "-c",
            script,
        ]

    async def _still_down(self) -> bool:
        """True when Slurm (asked again: what discovery saw may be old) has the node down."""
        if self.slurm_node is None or not self.slurm_node.down:
            return False
        with contextlib.suppress(SlurmError):
            fresh = await self.client.nodes_async(names=[self.node.name])
            self.slurm_node = next((n for n in fresh if n.name == self.node.name), None)
        return self.slurm_node is not None and self.slurm_node.down

    def _deploy_error(self, word: str, rest: str) -> LinkError:
        """The one line for the boot code's word (see ``gpuctl.reach.bundle``)."""
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

    async def _start(
        self, jobid: str
    ) -> tuple[asyncio.subprocess.Process, bytes, Callable[[], Awaitable[None]]]:
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.argv(jobid),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self.env,
                limit=STREAM_LIMIT,
                start_new_session=True,  # a Ctrl-C in the terminal is gpuctl's, not srun's
            )
        except FileNotFoundError:
            raise LinkError("slurm", "srun not found: is this a Slurm login node?") from None
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None

        async def close() -> None:
            if proc.stdin is not None and not proc.stdin.is_closing():
                proc.stdin.close()  # EOF: the agent stops and the step ends
            try:
                await asyncio.wait_for(proc.wait(), 5.0)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()
                try:
                    await asyncio.wait_for(proc.wait(), 5.0)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()

        try:
            first = await proc.stdout.readline()
        except asyncio.CancelledError:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()  # srun signals its step, which ends
            raise
        return proc, first, close

    async def open(self) -> AgentSession:
        if await self._still_down():
            assert self.slurm_node is not None
            why = f": {self.slurm_node.reason}" if self.slurm_node.reason else ""
            raise LinkError("down", f"Slurm has {self.node.name} {self.slurm_node.state}{why}")
        jobid = await self._jobid()
        for attempt in range(2):
            proc, first, close = await self._start(jobid)
            reply = parse_reply(first)
            if first and reply is None:
                break
            err = b""
            assert proc.stderr is not None
            with contextlib.suppress(TimeoutError):
                err = await asyncio.wait_for(proc.stderr.read(), 5.0)
            await close()
            if reply is None:  # srun or the agent ended before a word
                lines = err.decode(errors="replace").strip().splitlines()
                detail = lines[-1] if lines else f"srun exited {proc.returncode}"
                reason = "slurm" if "srun:" in detail else "agent_crashed"
                raise LinkError(reason, f"{self.node.name}: {detail}")
            word, rest = reply
            if word == "mismatch" and attempt == 0:
                self._bundle = None  # written again from this gpuctl, never run as it was
                continue
            raise self._deploy_error(word, rest)
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        session = AgentSession(_First(first, proc.stdout), proc.stdin, close=close)
        task = asyncio.get_running_loop().create_task(_stderr_tail(proc.stderr, session))
        _keep.add(task)
        task.add_done_callback(_keep.discard)
        return session


_keep: set[asyncio.Task[None]] = set()


class _First:
    def __init__(self, first: bytes, reader: asyncio.StreamReader) -> None:
        self._first: bytes | None = first
        self._reader = reader

    async def readline(self) -> bytes:
        if self._first is not None:
            first, self._first = self._first, None
            return first
        return await self._reader.readline()


async def _stderr_tail(stream: asyncio.StreamReader, session: AgentSession) -> None:
    with contextlib.suppress(Exception):
        while line := await stream.readline():
            session.stderr_tail.append(line.decode(errors="replace").rstrip())
            del session.stderr_tail[:-20]
