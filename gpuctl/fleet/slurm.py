"""Slurm as an inventory source and as a way to reach nodes, and who holds each GPU.

- ``discover(...)``: nodes, partitions, GPU GRES counts and state (idle, mixed, drained, down)
  from ``sinfo``'s plain text format, which reads the same on every Slurm version.
- ``SrunLink``: the agent as a job step, ``srun --overlap --jobid=<id> -w <node> -N1 -n1``, for
  clusters whose compute nodes refuse plain SSH unless you have a job there. The bundle is read
  from a folder shared with the nodes (the home by default): this process writes it there.
- ``JobWatcher``: which Slurm job and user hold each GPU (``squeue --json``; each job's per-node
  GRES index list, from its ``gres_detail`` or else ``scontrol show job -d``), published on the
  fleet as ``fleet.annotate(node, gpu, slurm_job=..., slurm_user=...)``.

Every Slurm client runs with a deadline: ``sinfo`` without a controller retries for ~20 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import json
import logging
import os
import re
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hostlist

from gpuctl.bundle import write_bundle
from gpuctl.config import NodeConfig
from gpuctl.fleet.links import STREAM_LIMIT, NodeLink
from gpuctl.fleet.session import AgentSession, LinkError
from gpuctl.fleet.ssh import DEPLOY_TAG, agent_script

log = logging.getLogger(__name__)

CLIENT_TIMEOUT = 15.0
_IDX = re.compile(r"\bgpu(?::[^:(),]+)?(?::\d+)?\(IDX:([^)]*)\)")


class SlurmError(Exception):
    """A Slurm client failed or is missing; the message is one line."""


@dataclass(frozen=True, slots=True)
class SlurmNode:
    """One node as ``sinfo`` sees it."""

    name: str
    partitions: tuple[str, ...]
    gpus: int  # GPU GRES count (0 when none)
    gpu_type: str | None
    state: str  # sinfo's long state: idle, mixed, allocated, drained, down*, ...
    reason: str | None = None

    @property
    def down(self) -> bool:
        """True when Slurm will run nothing there (down, or not responding)."""
        return self.state.startswith("down") or self.state.endswith("*")

    @property
    def drained(self) -> bool:
        return self.state.startswith(("drain", "drng"))


def slurm_env(slurm_conf: str | None = None) -> dict[str, str]:
    """The environment for Slurm clients: ours, with ``SLURM_CONF`` when configured."""
    env = dict(os.environ)
    if slurm_conf:
        env["SLURM_CONF"] = slurm_conf
    return env


def run_client(
    argv: list[str], env: Mapping[str, str] | None = None, timeout: float = CLIENT_TIMEOUT
) -> str:
    """Run a Slurm client and return its stdout; raises SlurmError with one line."""
    try:
        r = subprocess.run(
            argv,
            env=dict(env) if env is not None else None,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=timeout,
        )
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]} not found: is this a Slurm login node?") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(
            f"{argv[0]} gave no answer in {timeout:g} s: is slurmctld reachable?"
        ) from None
    if r.returncode != 0:
        err = (r.stderr.strip() or r.stdout.strip()).splitlines()
        raise SlurmError(f"{' '.join(argv[:2])} failed: {err[-1] if err else r.returncode}")
    return r.stdout


async def run_client_async(
    argv: list[str], env: Mapping[str, str] | None = None, timeout: float = CLIENT_TIMEOUT
) -> str:
    """``run_client`` without blocking the event loop."""
    return await asyncio.to_thread(run_client, argv, env, timeout)


def parse_gres_gpus(gres: str) -> tuple[int, str | None]:
    """GPU count and type from a GRES string: ``gpu:h100:2`` -> (2, "h100"); (0, None) if none.

    Several entries add up (``gpu:a100:2,gpu:v100:1`` -> 3, type of the first).
    """
    total, kind = 0, None
    for part in re.split(r",(?![^(]*\))", gres or ""):
        part = part.split("(", 1)[0].strip()
        fields = part.split(":")
        if fields[0] != "gpu":
            continue
        count = 1
        if fields[-1].isdigit():
            count = int(fields[-1])
            fields = fields[:-1]
        if len(fields) > 1 and kind is None:
            kind = fields[1]
        total += count
    return total, kind


def parse_sinfo(text: str) -> list[SlurmNode]:
    """Parse ``sinfo -h -N -o '%N|%P|%G|%T|%E'`` (one line per node and partition)."""
    merged: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        parts = line.split("|", 4)
        if len(parts) < 4 or not parts[0].strip():
            continue
        name, partition, gres, state = (p.strip() for p in parts[:4])
        reason = parts[4].strip() if len(parts) > 4 else ""
        entry = merged.setdefault(
            name, {"partitions": [], "gres": gres, "state": state, "reason": reason}
        )
        partition = partition.rstrip("*")
        if partition and partition not in entry["partitions"]:
            entry["partitions"].append(partition)
    nodes = []
    for name, e in merged.items():
        count, kind = parse_gres_gpus(e["gres"])
        why = e["reason"] if e["reason"] not in ("", "none", "(null)") else None
        nodes.append(SlurmNode(name, tuple(e["partitions"]), count, kind, e["state"].lower(), why))
    return nodes


def discover(
    partition: str | None = None,
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = CLIENT_TIMEOUT,
) -> list[SlurmNode]:
    """The nodes Slurm knows (of one partition, or all), with GPUs and state.

    Raises SlurmError when sinfo is missing or fails.
    """
    argv = ["sinfo", "-h", "-N", "-o", "%N|%P|%G|%T|%E"]
    if partition:
        argv += ["-p", partition]
    return parse_sinfo(run_client(argv, env, timeout))


def parse_idx(text: str) -> list[int]:
    """GPU indices of one node from GRES detail text: ``gpu:h100:2(IDX:0-1,3)`` -> [0, 1, 3]."""
    out: list[int] = []
    for m in _IDX.finditer(text):
        for part in m.group(1).split(","):
            part = part.strip()
            lo, _, hi = part.partition("-")
            if lo.isdigit() and (not hi or hi.isdigit()):
                out.extend(range(int(lo), int(hi or lo) + 1))
    return sorted(set(out))


def parse_scontrol_job(text: str) -> dict[str, list[int]]:
    """Per-node GPU indices from ``scontrol show job -d`` (its ``Nodes=... GRES=...`` lines)."""
    out: dict[str, list[int]] = {}
    for line in text.splitlines():
        m = re.match(r"\s*Nodes=(\S+)\s.*\bGRES=(\S+)", line)
        if not m:
            continue
        idx = parse_idx(m.group(2))
        for node in hostlist.expand_hostlist(m.group(1)):
            out.setdefault(node, []).extend(idx)
    return out


@dataclass(frozen=True, slots=True)
class GpuHolder:
    """A running job holding a GPU."""

    job: str
    user: str
    name: str | None = None


def _job_id(job: Mapping[str, Any]) -> str:
    jid = job.get("job_id")
    array = job.get("array_job_id")
    task = job.get("array_task_id")
    if isinstance(array, dict):  # Slurm >= 23: {"set": .., "number": ..}
        array = array.get("number") if array.get("set") else None
    if isinstance(task, dict):
        task = task.get("number") if task.get("set") else None
    if isinstance(array, int) and array and isinstance(task, int):
        return f"{array}_{task}"
    return str(jid)


def _running(job: Mapping[str, Any]) -> bool:
    state = job.get("job_state")
    if isinstance(state, list):
        return "RUNNING" in state
    return state == "RUNNING"


def gpu_holders(
    env: Mapping[str, str] | None = None, timeout: float = CLIENT_TIMEOUT
) -> dict[tuple[str, int], GpuHolder]:
    """Which running job holds each (node, GPU index), from squeue and the jobs' GRES details.

    Raises SlurmError when squeue fails.
    """
    data = json.loads(run_client(["squeue", "--json"], env, timeout) or "{}")
    out: dict[tuple[str, int], GpuHolder] = {}
    for job in data.get("jobs", []):
        if not isinstance(job, dict) or not _running(job):
            continue
        holder = GpuHolder(
            job=_job_id(job), user=str(job.get("user_name") or "?"), name=job.get("name")
        )
        nodes_text = job.get("nodes") or ""
        try:
            nodes = hostlist.expand_hostlist(nodes_text) if nodes_text else []
        except hostlist.BadHostlist:
            continue
        detail = job.get("gres_detail")
        per_node: dict[str, list[int]] = {}
        if isinstance(detail, list) and len(detail) == len(nodes):
            per_node = {n: parse_idx(str(d)) for n, d in zip(nodes, detail, strict=True)}
        elif "gpu" in json.dumps(job.get("tres_per_job", "")) + json.dumps(
            [job.get(k) for k in ("tres_per_node", "tres_alloc_str", "tres_per_task")]
        ):
            try:
                text = run_client(["scontrol", "show", "job", "-d", str(job.get("job_id"))], env)
            except SlurmError:
                continue
            per_node = parse_scontrol_job(text)
        for node, idx in per_node.items():
            for gpu in idx:
                out[(node, gpu)] = holder
    return out


class JobWatcher:
    """Keeps ``slurm_job`` / ``slurm_user`` annotations on the fleet's GPUs current."""

    def __init__(
        self,
        fleet: Any,
        nodes: Iterable[str],
        *,
        env: Mapping[str, str] | None = None,
        interval: float = 10.0,
    ) -> None:
        self.fleet = fleet
        self.nodes = set(nodes)
        self.env = env
        self.interval = interval
        self.shown: dict[tuple[str, int], GpuHolder] = {}
        self.error: str | None = None

    async def poll_once(self) -> None:
        """Query Slurm once and publish changes. Failures are kept in ``error``, not raised."""
        try:
            holders = await asyncio.to_thread(gpu_holders, self.env)
        except (SlurmError, ValueError) as e:
            if str(e) != self.error:
                log.warning("slurm job watcher: %s", e)
            self.error = str(e)
            return
        self.error = None
        holders = {k: v for k, v in holders.items() if k[0] in self.nodes}
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
            await asyncio.sleep(self.interval)  # a polling period, not synchronisation


def find_job(node: str, env: Mapping[str, str] | None = None) -> str | None:
    """The id of a running job of this user that includes ``node``, or None."""
    user = getpass.getuser()
    out = run_client(["squeue", "-h", "-u", user, "-t", "R", "-o", "%i|%N"], env)
    for line in out.splitlines():
        jid, _, nodes = line.partition("|")
        try:
            if node in hostlist.expand_hostlist(nodes.strip()):
                return jid.strip()
        except hostlist.BadHostlist:
            continue
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
    ) -> None:
        self.node = node
        self.read_only = read_only
        self.seed = seed
        self.slurm_node = slurm_node
        self.env = dict(env) if env is not None else slurm_env(node.slurm_conf)
        self._bundle: Path | None = None

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
            except OSError as e:
                raise LinkError("deploy", f"cannot write the agent bundle in {folder}: {e}") from e
        return self._bundle

    async def _jobid(self) -> str:
        if self.node.jobid is not None:
            return str(self.node.jobid)
        try:
            jid = await asyncio.to_thread(find_job, self.node.name, self.env)
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
        script = agent_script(self.node, str(bundle.parent), bundle.name, self.seed, self.read_only)
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

    async def open(self) -> AgentSession:
        if self.slurm_node is not None and self.slurm_node.down:
            why = f": {self.slurm_node.reason}" if self.slurm_node.reason else ""
            raise LinkError("down", f"Slurm has {self.node.name} {self.slurm_node.state}{why}")
        jobid = await self._jobid()
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
        if not first or first.startswith(DEPLOY_TAG):
            err = b""
            with contextlib.suppress(TimeoutError):
                err = await asyncio.wait_for(proc.stderr.read(), 5.0)
            await close()
            if first.startswith(DEPLOY_TAG):
                word = first[len(DEPLOY_TAG) :].decode(errors="replace").strip()
                if word.startswith("no-python"):
                    raise LinkError(
                        "no_python", f"no python at {self.node.python!r} on {self.node.name}"
                    )
                if word.startswith("old-python"):
                    raise LinkError(
                        "no_python", f"{self.node.python} on {self.node.name} is too old ({word})"
                    )
                raise LinkError(
                    "deploy",
                    f"{self.node.name} cannot see {self._bundle_path()}: set bundle_dir to a "
                    "folder shared with the nodes",
                )
            lines = err.decode(errors="replace").strip().splitlines()
            detail = lines[-1] if lines else f"srun exited {proc.returncode}"
            reason = "slurm" if "srun:" in detail else "agent_crashed"
            raise LinkError(reason, f"{self.node.name}: {detail}")

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
