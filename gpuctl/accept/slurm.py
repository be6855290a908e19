"""Acceptance through Slurm: gpuctl writes the batch script, submits it and gathers the verdicts.

The job folder (on a file system the nodes share: the default is under the user's state dir in
$HOME) holds the node bundle, ``job.sh``, and what the nodes write back: ``nodes.txt`` (the
allocation), ``events/<node>.jsonl`` (progress, tailed here while the job runs),
``reports/<node>.json`` and ``exit_code``. The job asks for ``nodes × gpus_per_node`` tasks;
``srun`` starts one suite per node, and each suite's DDP part is one torchrun per node joined by a
c10d rendezvous on the first node, so all-reduce and DDP training span the nodes.

Every value in ``job.sh`` is checked first (``SlurmJobSpec``, ``start_slurm_run``): node lists
parse as Slurm hostlists of plain names, the partition is a plain name, the job folder a path
sbatch reads as written; the shell part quotes with ``shlex``. Slurm commands go through
``gpuctl.reach.slurm.SlurmClient``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

from gpuctl import audit, paths, service
from gpuctl.accept.history import HistoryStore
from gpuctl.accept.run import (
    ERROR,
    PENDING,
    AcceptOptions,
    AcceptRun,
    NodeOutcome,
    outcome_from_report,
)
from gpuctl.bundle import write_bundle
from gpuctl.core import wire
from gpuctl.node.messages import AcceptEvent
from gpuctl.reach.slurm import (
    SlurmClient,
    SlurmError,
    SlurmValueError,
    check_hostlist,
    check_name,
    nodelist,
    pyxis_args,
    sbatch_path,
)
from gpuctl.workloads.accept_suite.schema import SECTIONS

log = logging.getLogger(__name__)

POLL_S = 0.5  # how often the job folder and squeue are looked at while the job runs


class SlurmJobSpec:
    """What to ask Slurm for; every value checked here (SlurmValueError, one line naming the
    option) so that nothing unchecked reaches the batch script."""

    def __init__(
        self,
        *,
        nnodes: int = 1,
        gpus_per_node: int = 2,
        nodelist: str | None = None,
        partition: str | None = None,
        time_limit_min: int = 30,
        exclusive: bool = False,
        container: str | None = None,
    ) -> None:
        for what, n in (
            ("--nnodes", nnodes),
            ("--gpus-per-node", gpus_per_node),
            ("time limit", time_limit_min),
        ):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise SlurmValueError(f"{what} must be a whole number of at least 1, not {n!r}")
        self.nnodes = nnodes
        self.gpus_per_node = gpus_per_node
        self.nodelist = _nodelist(nodelist) if nodelist is not None else None
        self.partition = check_name(partition, "--partition") if partition is not None else None
        self.time_limit_min = time_limit_min
        self.exclusive = exclusive
        self.container = container  # a Pyxis image: the suite runs inside it (srun)
        if container is not None:
            pyxis_args(container)  # checked now: SlurmValueError before anything is written


def _nodelist(text: str) -> str:
    return nodelist(check_hostlist(text, "--nodes"))


def job_root() -> Path:
    """Default parent of job folders: ``<state dir>/accept-jobs``."""
    return paths.state_dir() / paths.ACCEPT_JOBS


def batch_script(
    job: Path, bundle: Path, python: str, spec: SlurmJobSpec, options: AcceptOptions
) -> str:
    """The ``sbatch`` script for one acceptance job (bash)."""
    q = shlex.quote
    lines = [
        "#!/bin/bash",
        "#SBATCH --job-name=gpuctl-accept",
        f"#SBATCH --nodes={int(spec.nnodes)}",
        f"#SBATCH --ntasks-per-node={int(spec.gpus_per_node)}",
        f"#SBATCH --output={sbatch_path(job / 'slurm-%j.out', 'job folder', pattern=True)}",
        f"#SBATCH --time={int(spec.time_limit_min)}",
    ]
    if spec.partition:
        lines.append(f"#SBATCH --partition={check_name(spec.partition, '--partition')}")
    if spec.nodelist:
        lines.append(f"#SBATCH --nodelist={_nodelist(spec.nodelist)}")
    if options.device == "cuda":
        lines.append(f"#SBATCH --gpus-per-node={int(spec.gpus_per_node)}")
    if spec.exclusive:
        lines.append("#SBATCH --exclusive")
    suite = [
        q(python),
        "-m",
        "gpuctl.workloads.accept_suite",
        *(q(a) for a in options.suite_args()),
        "--report-dir",
        '"$JOB/reports"',
        "--report-name",
        "'{node}.json'",
        "--events",
        '"$JOB/events/{node}.jsonl"',
        "--ddp-nnodes",
        '"$SLURM_JOB_NUM_NODES"',
        "--ddp-procs",
        str(spec.gpus_per_node),
        "--rdzv-endpoint",
        '"$HEAD:$PORT"',
        "--rdzv-id",
        '"gpuctl-$SLURM_JOB_ID"',
    ]
    # the job folder (bundle, reports, events) at the same path inside the container
    srun_extra = pyxis_args(spec.container, [job]) if spec.container else []
    # the port helper runs on the batch host, outside any container
    host_python = "python3" if spec.container else python
    free_port = "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"
    lines += [
        "set -u",
        f"JOB={q(str(job))}",
        'scontrol show hostnames "$SLURM_JOB_NODELIST" > "$JOB/nodes.txt"',
        'HEAD=$(head -n 1 "$JOB/nodes.txt")',
        "# this script runs on the first node: the rendezvous port is free here",
        f"PORT=$({q(host_python)} -c {q(free_port)})",
        f"export PYTHONPATH={q(str(bundle))}${{PYTHONPATH:+:$PYTHONPATH}}",
        "export PYTHONUNBUFFERED=1",
        'srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks="$SLURM_JOB_NUM_NODES" '
        "--ntasks-per-node=1 --kill-on-bad-exit=0 \\",
        *(f"    {q(a)} \\" for a in srun_extra),
        "    " + " ".join(suite),
        "rc=$?",
        'echo "$rc" > "$JOB/exit_code.tmp" && mv "$JOB/exit_code.tmp" "$JOB/exit_code"',
        'exit "$rc"',
        "",
    ]
    return "\n".join(lines)


class _Tail:
    """Reads the new complete lines of a growing file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.buf = b""

    def lines(self) -> list[str]:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        self.buf += data
        *complete, self.buf = self.buf.split(b"\n")
        return [c.decode(errors="replace") for c in complete if c.strip()]


@audit.audited_async(
    lambda a: (
        "accept",
        a.arguments["spec"].nodelist or f"{a.arguments['spec'].nnodes} node(s) Slurm picks",
        "the suite via sbatch",
    )
)
async def start_slurm_run(
    options: AcceptOptions,
    spec: SlurmJobSpec,
    *,
    python: str | None = None,
    job_dir: str | os.PathLike[str] | None = None,
    client: SlurmClient | None = None,
    report_dir: str | os.PathLike[str] | None = None,
    history: HistoryStore | None = None,
    read_only: bool | None = None,
) -> AcceptRun:
    """Write the job folder and script, ``sbatch`` it, and follow it; returns the run at once.

    ``python`` is the VENV2 interpreter on the nodes (default: this one, which works where the
    login node and the nodes share an installation). ``client`` reaches the cluster (default:
    ``$SLURM_CONF``). ``read_only`` is the caller's decision on read-only mode (None:
    ``$GPUCTL_READ_ONLY`` and the config). Raises ``gpuctl.service.ReadOnlyError`` in read-only
    mode and SlurmValueError for a job folder a batch script cannot name, both before anything
    is written, and SlurmError when sbatch refuses.
    """
    service.check("the acceptance suite", read_only=read_only)
    client = client or SlurmClient()
    root = _checked_root(job_dir)
    if spec.container:  # job folders are mounted into the container: refuse before writing
        pyxis_args(spec.container, [root / "accept-x"])
    root.mkdir(parents=True, exist_ok=True)
    job = Path(tempfile.mkdtemp(prefix=time.strftime("accept-%Y%m%d-%H%M%S-"), dir=root))  # 0700
    (job / "events").mkdir()
    (job / "reports").mkdir()
    bundle = write_bundle(job)
    script = job / "job.sh"
    script.write_text(batch_script(job, bundle, python or sys.executable, spec, options))
    script.chmod(0o700)
    try:
        job_id = await client.submit_async(script)
    except SlurmError:  # refused: no job will read the folder (its bundle is ~0.3 MB)
        shutil.rmtree(job, ignore_errors=True)
        raise
    nodes_file = job / "nodes.txt"

    run = AcceptRun([], options, "slurm")
    run.job_id = job_id

    async def wait_nodes() -> list[str]:
        deadline = time.monotonic() + options.timeout
        while time.monotonic() < deadline:
            if nodes_file.exists():
                names = nodes_file.read_text().split()
                if names:
                    return names
            if not await _queued(job_id, client):
                return []
            await asyncio.sleep(POLL_S)
        return []

    async def body() -> None:
        names = await wait_nodes()
        if not names:  # no node ever started the script: one placeholder row says why
            tail = _slurm_out_tail(job, job_id)
            placeholder = f"job-{job_id}"
            run.nodes.append(placeholder)
            run.status[placeholder] = dict.fromkeys(SECTIONS, PENDING)
            run.lines[placeholder] = []
            run.finish_node(
                NodeOutcome(placeholder, ERROR, reason=f"Slurm job {job_id} never ran: {tail}")
            )
            return
        for n in names:
            run.nodes.append(n)
            run.status[n] = dict.fromkeys(SECTIONS, PENDING)
            run.lines[n] = []
        tails = {n: _Tail(job / "events" / f"{n}.jsonl") for n in names}
        deadline = time.monotonic() + options.timeout + 120
        while True:
            for n, t in tails.items():
                for line in t.lines():
                    with contextlib.suppress(ValueError):
                        detail = wire.parse(AcceptEvent, json.loads(line))
                        if detail is not None:
                            run.relay(n, detail)
            if (job / "exit_code").exists():
                break
            if not await _queued(job_id, client):
                break  # the job left the queue without the script's last line: killed
            if time.monotonic() > deadline:
                with contextlib.suppress(SlurmError):
                    await client.cancel_async(job_id)
                break
            await asyncio.sleep(POLL_S)
        for n, t in tails.items():  # what arrived between the last look and the end
            for line in t.lines():
                with contextlib.suppress(ValueError):
                    detail = wire.parse(AcceptEvent, json.loads(line))
                    if detail is not None:
                        run.relay(n, detail)
        for n in names:
            path = job / "reports" / f"{n}.json"
            try:
                report = json.loads(path.read_text())
            except (OSError, ValueError):
                tail = _slurm_out_tail(job, job_id)
                run.finish_node(
                    NodeOutcome(n, ERROR, reason=f"no report from {n} (job {job_id}): {tail}")
                )
                continue
            run.finish_node(outcome_from_report(n, report, None))

    async def cancel() -> None:
        await client.cancel_async(job_id)

    run._start(body(), cancel, report_dir, history)
    return run


def _checked_root(job_dir: str | os.PathLike[str] | None) -> Path:
    """The absolute parent of job folders; SlurmValueError when job.sh could not name it."""
    root = job_root() if job_dir is None else Path(os.path.abspath(Path(job_dir).expanduser()))
    sbatch_path(root / "accept-x" / "slurm-%j.out", "--job-dir", pattern=True)
    return root


async def _queued(job_id: str, client: SlurmClient) -> bool:
    """True while squeue still lists the job (pending, running or completing), and while Slurm
    does not answer (the caller's deadline bounds that)."""
    try:
        return bool(await client.jobs_async(job_ids=[job_id]))
    except SlurmError as e:
        log.warning("squeue for accept job %s: %s", job_id, e)
        return True


def _slurm_out_tail(job: Path, job_id: str) -> str:
    path = job / f"slurm-{job_id}.out"
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no Slurm output"
    return " | ".join(lines[-3:])
