"""The Slurm client: the one place gpuctl runs ``squeue``, ``sinfo``, ``scontrol``, ``sbatch``,
``sacct`` and ``scancel``, and the one place that checks the names and paths gpuctl writes into a
batch script.

``SlurmClient(slurm_conf)`` runs every command on this (login) machine with a deadline (without a
controller, Slurm's clients retry for 10-60 s), ``SLURM_CONF`` set when configured, and raises
``SlurmError`` with one line that names the command and says what to do. Queries are filtered on
Slurm's side of the pipe (``squeue -w NODES``, ``-j IDS``, ``-u USER``; ``sinfo -p``, ``-n``).

Why text and not ``--json``: Slurm 22.05's ``squeue --json`` and ``sinfo --json`` ignore every
filter (their man pages say so, and a test cluster with 3000 queued jobs gave 9 MB of JSON in
0.4-0.5 s for ``squeue --json -w one-node``, against 114 bytes in 20 ms for the same question in
text), and their schema changes with every release. The text formats below hold no free text a
user chooses (job names are never asked for: Slurm accepts newlines in them), so a line is a
record; the one exception, ``scontrol show job -d``, is read defensively (``parse_scontrol_job``).

The checks (``check_hostlist``, ``check_name``, ``job_name``, ``sbatch_path``, ``sbatch_arg``)
raise ``SlurmValueError`` (a ``SlurmError`` and a ``ValueError``) before anything is written or
submitted: ``--nodes: bad hostlist 'gpu1\\n#SBATCH ...': ...``.
"""

from __future__ import annotations

import asyncio
import functools
import getpass
import logging
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import hostlist

from gpuctl import audit

if TYPE_CHECKING:
    from gpuctl.config import Config

log = logging.getLogger(__name__)

COMMANDS = ("squeue", "sinfo", "scontrol", "sbatch", "sacct", "scancel")
DEFAULT_TIMEOUT = 15.0
REASON_LIMIT = 200  # characters of a drain reason: sinfo -R shows it on one line
SUBMIT_TIMEOUT = 60.0  # sbatch is not retried (a retry could submit twice): give it longer
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_IDX = re.compile(r"\bgpu(?::[^:(),]+)?(?::\d+)?\(IDX:([^)]*)\)")
_JOB_ID = re.compile(r"\d+(?:_\d+)?")
T = TypeVar("T")


class SlurmError(Exception):
    """A Slurm command failed, gave no answer, or is missing; ``str()`` is one line."""


class SlurmValueError(SlurmError, ValueError):
    """A value for Slurm (node list, partition, path, option) that gpuctl refuses to write."""


# --- checking what goes into a batch script or a command line ---------------------------------


def _show(text: str, limit: int = 60) -> str:
    shown = repr(text)
    return shown if len(shown) <= limit else shown[: limit - 4] + "...'"


def check_hostlist(text: str, what: str = "--nodes") -> list[str]:
    """The node names of a Slurm hostlist (``gpu[01-04],dgx-a``), each ``[A-Za-z0-9_.-]+``
    (not starting with ``.`` or ``-``).

    Raises SlurmValueError (``--nodes: bad hostlist ...``) for anything else: unbalanced
    brackets, whitespace, newlines, shell characters, no node at all.
    """
    if not isinstance(text, str):
        raise SlurmValueError(f"{what}: expected a hostlist like gpu[01-04], not {text!r}")
    try:
        names: list[str] = hostlist.expand_hostlist(text)
    except hostlist.BadHostlist as e:
        raise SlurmValueError(f"{what}: bad hostlist {_show(text)}: {e}") from None
    if not names:
        raise SlurmValueError(f"{what}: {_show(text)} names no node")
    for name in names:
        if not _NAME.fullmatch(name):
            raise SlurmValueError(
                f"{what}: bad hostlist {_show(text)}: node name {_show(name)} is not letters, "
                "digits, '.', '_' and '-'"
            )
    return names


def nodelist(names: Iterable[str]) -> str:
    """The short hostlist for node names (``gpu[01-03],dgx-a``); names are checked first."""
    names = list(names)
    for name in names:
        check_hostlist(name, "node")
    return str(hostlist.collect_hostlist(names))


def check_name(value: str, what: str) -> str:
    """A partition or account name: letters, digits, ``.``, ``_``, ``-`` (not first: ``.-``).

    Raises SlurmValueError naming ``what`` (``--partition``, ``[accept] partition``).
    """
    if not isinstance(value, str) or not _NAME.fullmatch(value) or len(value) > 200:
        raise SlurmValueError(
            f"{what}: bad name {_show(str(value))}: use letters, digits, '.', '_' and '-'"
        )
    return value


def job_name(text: str, prefix: str = "gpuctl-", limit: int = 64) -> str:
    """A job name Slurm and the batch script read as written: ``prefix`` plus ``text`` with
    every run of characters other than ``[A-Za-z0-9_.-]`` made one ``_``, at most ``limit``
    characters in all (``map:train.<lambda>`` -> ``gpuctl-map_train._lambda``)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "job"
    return (prefix + safe)[:limit]


# characters an #SBATCH line cannot carry inside its double quotes, or that Slurm reads itself
_PATH_BAD = re.compile(r'[\x00-\x1f\x7f"\\]')


def sbatch_path(path: str | os.PathLike[str], what: str, *, pattern: bool = False) -> str:
    """``path`` double-quoted for an ``#SBATCH --output=`` / ``--chdir=`` line (sbatch reads the
    quotes; spaces, ``$``, ``#``, ``'`` are then plain characters).

    ``pattern``: the value is a Slurm filename pattern (``--output``), so the folder part may
    not hold ``%`` either. Raises SlurmValueError for control characters (newlines), ``"``,
    ``\\`` and a relative path.
    """
    text = os.fspath(path)
    if not os.path.isabs(text):
        raise SlurmValueError(f"{what}: {_show(text)} is not an absolute path")
    bad = _PATH_BAD.search(text)
    if bad:
        raise SlurmValueError(
            f"{what}: {_show(text)} holds {bad.group()!r}, which a batch script cannot carry: "
            "choose a folder without it"
        )
    if pattern and "%" in os.path.dirname(text):
        raise SlurmValueError(
            f"{what}: {_show(text)} holds '%', which Slurm reads as a file name pattern: "
            "choose a folder without it"
        )
    return f'"{text}"'


_OPTION = re.compile(r"--?[A-Za-z][A-Za-z0-9-]*")


def sbatch_arg(arg: str, what: str = "sbatch_args") -> str:
    """One sbatch option (``--begin=now+60``, ``--qos=high``) as an ``#SBATCH`` line's text; a
    value with spaces is double-quoted. Raises SlurmValueError for anything that is not one
    option (no leading ``-``, control characters, ``"`` or ``\\``)."""
    if not isinstance(arg, str):
        raise SlurmValueError(f"{what}: {arg!r} is not an option string")
    option, eq, value = arg.partition("=")
    if not _OPTION.fullmatch(option) or _PATH_BAD.search(arg):
        raise SlurmValueError(
            f"{what}: {_show(arg)} is not one sbatch option like --qos=high (no newlines, "
            "quotes or backslashes)"
        )
    if eq and re.search(r"\s", value):
        return f'{option}="{value}"'
    return arg


# Pyxis image references: "nvcr.io#nvidia/pytorch:24.05-py3", "docker://ubuntu:22.04", a
# squashfs path. No spaces, quotes, commas or "=": nothing srun or a batch script would split.
_IMAGE = re.compile(r"[A-Za-z0-9/][A-Za-z0-9._/:@#+-]*")


def pyxis_args(image: str, mounts: Sequence[str | os.PathLike[str]] = ()) -> list[str]:
    """``srun`` options that run a step's tasks inside ``image`` through Pyxis and enroot
    (``--container-image=IMAGE``, ``--container-mounts=P:P,...``: each folder at the same
    path inside). Needs the Pyxis SPANK plugin on the cluster.

    Raises SlurmValueError (``--container: ...``) for an image or folder that srun could not
    take as one value.
    """
    if not isinstance(image, str) or not _IMAGE.fullmatch(image) or len(image) > 500:
        raise SlurmValueError(
            f"--container: bad image {_show(str(image))}: use a reference like "
            "nvcr.io#nvidia/pytorch:24.05-py3 or a squashfs path"
        )
    args = [f"--container-image={image}"]
    folders = [os.fspath(m) for m in mounts]
    for folder in folders:
        if not os.path.isabs(folder) or re.search(r"[,:\s\x00-\x1f\x7f\"'\\]", folder):
            raise SlurmValueError(
                f"--container: the folder {_show(folder)} cannot be mounted into the container "
                "(an absolute path without ',', ':', spaces or quotes)"
            )
    if folders:
        args.append("--container-mounts=" + ",".join(f"{f}:{f}" for f in folders))
    return args


# --- parsers (pure; the tests feed them what a real Slurm 22.05 printed) ----------------------


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
        """True when the node takes no new jobs (drained or draining)."""
        return self.state.startswith(("drain", "drng"))


SINFO_FORMAT = "%N|%P|%G|%T|%E"  # the reason (free text an admin wrote) last


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
        if len(parts) < 4 or not _NAME.fullmatch(parts[0].strip()):
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
    """Per-node GPU indices from ``scontrol show job -d JOB`` (its ``Nodes=... GRES=...`` lines).

    The detail lines sit between the job's one ``NumNodes=`` line and its one ``MinCPUsNode=``
    line. Slurm prints a job's name, comment and paths raw, newlines included, so a job can
    carry Slurm-looking lines of its own: when either marker appears more than once, which lines
    are Slurm's cannot be told, and the answer is {} (no GPU claimed) rather than a guess.
    """
    lines = text.splitlines()
    starts = [i for i, ln in enumerate(lines) if ln.lstrip().startswith("NumNodes=")]
    ends = [i for i, ln in enumerate(lines) if ln.lstrip().startswith("MinCPUsNode=")]
    if len(starts) > 1 or len(ends) > 1:
        return {}
    lo = starts[0] + 1 if starts else 0
    hi = ends[0] if ends else len(lines)
    out: dict[str, list[int]] = {}
    for line in lines[lo:hi]:
        m = re.match(r"\s*Nodes=(\S+)\s.*\bGRES=(\S+)", line)
        if not m:
            continue
        idx = parse_idx(m.group(2))
        try:
            names = hostlist.expand_hostlist(m.group(1))
        except hostlist.BadHostlist:
            continue
        for node in names:
            out.setdefault(node, []).extend(idx)
    return {n: sorted(set(i)) for n, i in out.items()}


@dataclass(frozen=True, slots=True)
class SlurmJob:
    """One line of ``squeue -r``: a job, or one task of an array."""

    job_id: str  # what Slurm's commands take and users see: "123", or "120_3" for an array task
    unique_id: str  # the task's own number ("123"; "126" for 120_3): for scontrol
    state: str  # RUNNING, PENDING, COMPLETING, ...
    user: str
    nodes: str  # hostlist; "" while pending
    gpus: bool  # the job asked for GPUs (per job, node, task or socket)
    reason: str | None  # why it is pending ("Resources", "BeginTime"), None when "None"

    def node_names(self) -> list[str]:
        """The job's nodes (empty while it waits, or when Slurm's list does not parse)."""
        if not self.nodes:
            return []
        try:
            return list(hostlist.expand_hostlist(self.nodes))
        except hostlist.BadHostlist:
            return []


# Every field but the last is a number, a state word, a user or node name, or a TRES string:
# none may hold "|" or a newline. The last (the pending reason) is Slurm's own words.
SQUEUE_FIELDS = (
    "JobID",
    "JobArrayID",
    "State",
    "UserName",
    "NodeList",
    "tres-per-job",
    "tres-per-node",
    "tres-per-task",
    "tres-per-socket",
    "Reason",
)
SQUEUE_FORMAT = ",".join(f"{f}:|" for f in SQUEUE_FIELDS[:-1]) + f",{SQUEUE_FIELDS[-1]}:"


def parse_squeue(text: str) -> list[SlurmJob]:
    """Parse ``squeue -h -r -O SQUEUE_FORMAT``; lines that are not a well-formed record (ids,
    state, user) are skipped."""
    jobs = []
    n = len(SQUEUE_FIELDS)
    for line in text.splitlines():
        parts = line.split("|", n - 1)
        if len(parts) != n:
            continue
        uid, jid, state, user, nodes, *tres, reason = (p.strip() for p in parts)
        if not (uid.isdigit() and _JOB_ID.fullmatch(jid) and state.isalpha() and state.isupper()):
            continue
        gpus = any(re.search(r"\bgpu\b", t) for t in tres)
        why = None if reason in ("", "None", "(null)") else reason
        jobs.append(SlurmJob(jid, uid, state, user, "" if nodes == "N/A" else nodes, gpus, why))
    return jobs


def parse_sbatch(out: str) -> str:
    """The job id from ``sbatch --parsable`` (``123`` or ``123;cluster``).

    Raises SlurmError when the answer is no job id.
    """
    first = out.strip().split(";", 1)[0].strip()
    if not first.isdigit():
        raise SlurmError(f"sbatch answered {_show(out.strip(), 80)}, not a job id")
    return first


def parse_sacct_state(text: str, job_id: str) -> str | None:
    """The state of ``job_id`` in ``sacct -n -P -X -o JobID,State`` (``CANCELLED by 0`` ->
    ``CANCELLED``), or None when it is not listed."""
    for line in text.splitlines():
        jid, _, state = line.partition("|")
        if jid.strip() == job_id and state.strip():
            return state.split()[0]
    return None


def parse_scontrol_state(text: str) -> str | None:
    """``JobState`` from ``scontrol -o show job JOB`` (gpuctl's own jobs: names it chose)."""
    for tok in text.split():
        if tok.startswith("JobState="):
            return tok.split("=", 1)[1] or None
    return None


DEFAULT_MAX_ARRAY_SIZE = 1001  # Slurm's MaxArraySize when slurm.conf says nothing


def parse_config_value(text: str, key: str) -> str | None:
    """A value from ``scontrol show config`` (``Key = value`` lines); None when absent."""
    for line in text.splitlines():
        k, sep, value = line.partition("=")
        if sep and k.strip() == key:
            value = value.strip()
            return None if value in ("", "(null)") else value
    return None


# --- the client --------------------------------------------------------------------------------

_HINTS = (
    ("Unable to contact slurm controller", "is slurmctld up? check with scontrol ping"),
    ("Invalid partition name", "sinfo -s lists the partitions"),
    ("invalid partition specified", "sinfo -s lists the partitions"),
    ("Invalid node name", "sinfo -N lists the node names"),
    ("Invalid account", "sacctmgr show assoc user=$USER lists your accounts"),
    (
        "Could not establish a configuration source",
        "no slurm.conf found: set slurm_conf in the config, or SLURM_CONF",
    ),
)


class SlurmClient:
    """Runs Slurm's commands on this machine against one cluster.

    ``slurm_conf``: the cluster's ``slurm.conf`` (sets ``SLURM_CONF``; None: the environment's,
    else Slurm's default). ``origin`` says where it came from, for messages. ``timeout``: the
    deadline of each query (sbatch gets ``SUBMIT_TIMEOUT``).
    """

    def __init__(
        self,
        slurm_conf: str | os.PathLike[str] | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        *,
        origin: str = "slurm_conf",
    ) -> None:
        self.slurm_conf = os.path.expanduser(os.fspath(slurm_conf)) if slurm_conf else None
        self.timeout = timeout
        self.origin = origin
        self._sacct = True  # False once sacct said accounting is off: then scontrol only

    def __repr__(self) -> str:
        return f"SlurmClient({self.slurm_conf!r})"

    def env(self) -> dict[str, str]:
        """The environment for Slurm's commands: ours, with ``SLURM_CONF`` when configured."""
        env = dict(os.environ)
        if self.slurm_conf:
            env["SLURM_CONF"] = self.slurm_conf
        return env

    def _check_conf(self, env: Mapping[str, str], command: str) -> None:
        # a missing slurm.conf makes every client retry for 60 s before it says so
        conf = env.get("SLURM_CONF")
        if conf and not os.path.exists(conf):
            where = self.origin if self.slurm_conf else "$SLURM_CONF"
            raise SlurmError(
                f"{command}: {conf} does not exist: fix {where} (the cluster's slurm.conf)"
            )

    def run(self, argv: Sequence[str], *, timeout: float | None = None) -> str:
        """Run one Slurm command (``argv[0]`` in ``COMMANDS``) and return its stdout.

        Raises SlurmError with one line: the command missing, no answer within the deadline, or
        its last error line plus what to do.
        """
        argv = list(argv)
        assert argv and argv[0] in COMMANDS, argv
        limit = self.timeout if timeout is None else timeout
        env = self.env()
        self._check_conf(env, argv[0])
        t0 = time.monotonic()
        try:
            r = subprocess.run(
                argv,
                env=env,
                capture_output=True,
                text=True,
                errors="replace",
                stdin=subprocess.DEVNULL,
                timeout=limit,
            )
        except FileNotFoundError:
            raise SlurmError(f"{argv[0]} not found: is this a Slurm login node?") from None
        except subprocess.TimeoutExpired:
            extra = (
                " (the job may have been submitted all the same: look with squeue --me)"
                if argv[0] == "sbatch"
                else ""
            )
            raise SlurmError(
                f"{argv[0]} gave no answer in {limit:g} s: is slurmctld reachable? "
                f"(scontrol ping){extra}"
            ) from None
        log.debug("%s: exit %s in %.3f s", " ".join(argv[:2]), r.returncode, time.monotonic() - t0)
        if r.returncode != 0:
            lines = (r.stderr.strip() or r.stdout.strip()).splitlines()
            last = lines[-1].strip() if lines else f"exit status {r.returncode}"
            hint = next((h for key, h in _HINTS if key in last), None)
            what = " ".join(a for a in argv[:2] if not a.startswith("-")) or argv[0]
            raise SlurmError(f"{what} failed: {last}" + (f" ({hint})" if hint else ""))
        return r.stdout

    async def run_async(self, argv: Sequence[str], *, timeout: float | None = None) -> str:
        """``run`` without blocking the event loop."""
        return await asyncio.to_thread(functools.partial(self.run, argv, timeout=timeout))

    def step_argv(
        self,
        jobid: str,
        nodes: Sequence[str],
        command: Sequence[str],
        *,
        tasks_per_node: int = 1,
        shared: bool = False,
    ) -> list[str]:
        """The ``srun`` line that runs ``command`` as a step of the running job ``jobid`` on
        ``nodes`` (``tasks_per_node`` tasks each), beside the job's own steps (``--overlap``).

        One node: any failure ends the step (``--kill-on-bad-exit=1``). ``shared`` (one step
        carrying many nodes' agents): every task reads all of stdin (``--input=all``), output
        lines carry their task number (``--label``), and one task ending, even badly, leaves
        the others running (``--kill-on-bad-exit=0``). Raises SlurmValueError for a bad name.
        """
        names = nodelist(nodes)
        if not _JOB_ID.fullmatch(str(jobid)):
            raise SlurmValueError(f"jobid: {_show(str(jobid))} is not a Slurm job id")
        argv = [
            "srun",
            "--overlap",
            f"--jobid={jobid}",
            "-w",
            names,
            f"-N{len(nodes)}",
        ]
        if tasks_per_node == 1 and len(nodes) == 1 and not shared:
            argv.append("-n1")
        else:
            argv.append(f"--ntasks-per-node={tasks_per_node}")
        argv.append("--quiet")
        if shared:
            argv += ["--input=all", "--label", "--kill-on-bad-exit=0"]
        else:
            argv.append("--kill-on-bad-exit=1")
        return [*argv, *command]

    # --- queries -------------------------------------------------------------------------------

    def nodes(
        self, partition: str | None = None, names: Sequence[str] | None = None
    ) -> list[SlurmNode]:
        """The nodes Slurm knows (of one partition, or of ``names``), with GPUs and state.

        Raises SlurmValueError for a bad partition or node name, SlurmError when sinfo fails.
        """
        argv = ["sinfo", "-h", "-N", "-o", SINFO_FORMAT]
        if partition:
            argv.append(f"--partition={check_name(partition, 'partition')}")
        if names:
            argv.append(f"--nodes={nodelist(names)}")
        return parse_sinfo(self.run(argv))

    def jobs(
        self,
        *,
        nodes: Sequence[str] | None = None,
        job_ids: Sequence[str] | None = None,
        user: str | None = None,
        states: Sequence[str] | None = None,
    ) -> list[SlurmJob]:
        """Jobs (one per array task) filtered by Slurm: on ``nodes``, with ``job_ids``, of
        ``user``, in ``states`` (``RUNNING``, ``PENDING``...). Ids Slurm has forgotten are no
        error: those jobs are simply not listed.

        Raises SlurmError when squeue fails (an unknown node name included).
        """
        argv = ["squeue", "-h", "-r", "-O", SQUEUE_FORMAT]
        if nodes is not None:
            if not nodes:
                return []
            argv.append(f"--nodelist={nodelist(nodes)}")
        if job_ids is not None:
            ids = [str(j) for j in job_ids]
            if not ids:
                return []
            for j in ids:
                if not _JOB_ID.fullmatch(j):
                    raise SlurmValueError(f"job id {_show(j)} is not a Slurm job id")
            argv.append(f"--jobs={','.join(ids)}")
        if user is not None:
            if not re.fullmatch(r"[^\s,|=]+", user):
                raise SlurmValueError(f"user {_show(user)} is not a user name")
            argv.append(f"--user={user}")
        if states:
            argv.append(f"--states={','.join(check_name(s, 'state') for s in states)}")
        try:
            out = self.run(argv)
        except SlurmError as e:
            if job_ids is not None and "Invalid job id" in str(e):
                return []  # every id asked for has left Slurm's memory
            raise
        return parse_squeue(out)

    def job_gpus(self, job_id: str) -> dict[str, list[int]]:
        """Per-node GPU indices a job holds (``scontrol show job -d``); {} when none or unknown.

        Raises SlurmError when scontrol fails for another reason than a forgotten job.
        """
        if not _JOB_ID.fullmatch(str(job_id)):
            raise SlurmValueError(f"job id {_show(str(job_id))} is not a Slurm job id")
        try:
            return parse_scontrol_job(self.run(["scontrol", "-d", "show", "job", str(job_id)]))
        except SlurmError as e:
            if "Invalid job id" in str(e):
                return {}
            raise

    def final_state(self, job_id: str) -> tuple[str, str]:
        """A job's last state and where it was read: ``sacct`` when accounting runs, else
        ``scontrol`` (until the controller forgets the job, ``MinJobAge``); ("", "none")."""
        if not _JOB_ID.fullmatch(str(job_id)):
            raise SlurmValueError(f"job id {_show(str(job_id))} is not a Slurm job id")
        if self._sacct:
            try:
                out = self.run(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "JobID,State"])
            except SlurmError as e:
                out = ""
                if "accounting storage is disabled" in str(e) or "not found" in str(e):
                    self._sacct = False
            state = parse_sacct_state(out, job_id)
            if state:
                return state, "sacct"
        try:
            out = self.run(["scontrol", "-o", "show", "job", job_id])
        except SlurmError:
            return "", "none"
        state = parse_scontrol_state(out)
        return (state, "scontrol") if state else ("", "none")

    def config_value(self, key: str) -> str | None:
        """One value of ``scontrol show config`` (None when unset). Raises SlurmError."""
        return parse_config_value(self.run(["scontrol", "show", "config"]), key)

    def max_array_size(self) -> int:
        """How many tasks one job array may have: Slurm's ``MaxArraySize`` (indices run from 0
        to one less; Slurm's default when unset or unreadable as a number). Raises SlurmError."""
        value = self.config_value("MaxArraySize")
        try:
            return max(1, int(value or DEFAULT_MAX_ARRAY_SIZE))
        except ValueError:
            return DEFAULT_MAX_ARRAY_SIZE

    # --- actions -------------------------------------------------------------------------------

    def submit(self, script: str | os.PathLike[str]) -> str:
        """``sbatch --parsable SCRIPT``; returns the job id. Raises SlurmError when refused."""
        return parse_sbatch(
            self.run(
                ["sbatch", "--parsable", os.fspath(script)],
                timeout=max(self.timeout, SUBMIT_TIMEOUT),
            )
        )

    def cancel(self, job_id: str, *, signal: str | None = None, batch: bool = False) -> None:
        """``scancel`` a job, or send it ``signal`` (``USR1``; ``batch``: to the batch shell
        only). Raises SlurmError."""
        if not _JOB_ID.fullmatch(str(job_id)):
            raise SlurmValueError(f"job id {_show(str(job_id))} is not a Slurm job id")
        argv = ["scancel"]
        if batch:
            argv.append("--batch")
        if signal:
            if not re.fullmatch(r"[A-Z0-9]+", signal):
                raise SlurmValueError(f"signal {_show(signal)} is not a signal name like USR1")
            argv.append(f"--signal={signal}")
        self.run([*argv, str(job_id)])

    @audit.audited(
        lambda a: ("drain", audit.nodes_text(a.arguments["names"]), a.arguments["reason"])
    )
    def drain(self, names: Sequence[str], reason: str) -> str:
        """``scontrol update nodename=NODES state=drain reason=REASON``: Slurm starts no new job
        there (running ones finish). ``reason`` is made one printable line (at most
        ``REASON_LIMIT`` characters); returns it as given to Slurm. Raises SlurmValueError for
        a bad node name, SlurmError when scontrol refuses (not an operator: "Access/permission
        denied")."""
        text = " ".join("".join(c if c.isprintable() else " " for c in reason).split())
        if not text:
            raise SlurmValueError("a drain needs a reason")
        if len(text) > REASON_LIMIT:
            text = text[: REASON_LIMIT - 3] + "..."
        self.run(
            ["scontrol", "update", f"nodename={nodelist(names)}", "state=drain", f"reason={text}"]
        )
        return text

    @audit.audited(lambda a: ("resume", audit.nodes_text(a.arguments["names"]), ""))
    def resume(self, names: Sequence[str]) -> None:
        """``scontrol update nodename=NODES state=resume``: a drained node takes jobs again.
        Raises SlurmValueError for a bad node name, SlurmError when scontrol refuses."""
        self.run(["scontrol", "update", f"nodename={nodelist(names)}", "state=resume"])

    # --- async twins for the event loop ----------------------------------------------------

    async def _thread(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await asyncio.to_thread(functools.partial(fn, *args, **kwargs))

    async def nodes_async(
        self, partition: str | None = None, names: Sequence[str] | None = None
    ) -> list[SlurmNode]:
        """``nodes`` in a thread."""
        return await self._thread(self.nodes, partition, names)

    async def jobs_async(
        self,
        *,
        nodes: Sequence[str] | None = None,
        job_ids: Sequence[str] | None = None,
        user: str | None = None,
        states: Sequence[str] | None = None,
    ) -> list[SlurmJob]:
        """``jobs`` in a thread."""
        return await self._thread(self.jobs, nodes=nodes, job_ids=job_ids, user=user, states=states)

    async def job_gpus_async(self, job_id: str) -> dict[str, list[int]]:
        """``job_gpus`` in a thread."""
        return await self._thread(self.job_gpus, job_id)

    async def submit_async(self, script: str | os.PathLike[str]) -> str:
        """``submit`` in a thread."""
        return await self._thread(self.submit, script)

    async def cancel_async(
        self, job_id: str, *, signal: str | None = None, batch: bool = False
    ) -> None:
        """``cancel`` in a thread."""
        await self._thread(self.cancel, job_id, signal=signal, batch=batch)


def current_user() -> str:
    """This process's user name, as Slurm's ``--user`` wants it."""
    return getpass.getuser()


# --- which Slurm a command talks to ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SlurmTarget:
    """The Slurm cluster a command submits to: its ``slurm.conf`` (None: the environment's) and
    the partition (None: Slurm's default), with where each came from."""

    slurm_conf: str | None
    partition: str | None
    origin: str = "the environment"

    def client(self, timeout: float = DEFAULT_TIMEOUT) -> SlurmClient:
        """A client for this cluster."""
        return SlurmClient(self.slurm_conf, timeout, origin=self.origin)


def slurm_target(
    config: Config,
    section: str,
    *,
    nodes: Sequence[str] = (),
    partition: str | None = None,
) -> SlurmTarget:
    """Where ``gpuctl accept --via slurm`` (``section="accept"``) or ``submit --target slurm``
    (``section="jobs"``) submits, by one rule:

    1. ``[<section>] slurm_conf`` / ``partition`` when set;
    2. else the Slurm clusters of the config: the ones holding ``nodes`` when those are
       configured, else every cluster that sets ``slurm_conf`` or ``partition`` or is reached
       ``via = "srun"``. Their ``slurm_conf`` must agree (two different ones: SlurmValueError
       asking for ``[<section>] slurm_conf``); their ``partition`` is used when they agree;
    3. else ``$SLURM_CONF`` (or Slurm's default) and Slurm's default partition.

    ``partition`` (a command-line option) wins over all of these. Raises SlurmValueError.
    """
    table = config.accept if section == "accept" else config.jobs
    base = Path(config.path).expanduser().resolve().parent if config.path else Path.cwd()
    conf: str | None = None
    origin = "$SLURM_CONF"
    raw = table.slurm_conf
    if raw is not None:
        if not isinstance(raw, str) or not raw.strip():
            raise SlurmValueError(f"[{section}] slurm_conf must be a path, not {raw!r}")
        p = Path(raw).expanduser()
        conf, origin = str(p if p.is_absolute() else base / p), f"[{section}] slurm_conf"
    part = partition
    part_origin = "--partition"
    if part is None and table.partition is not None:
        part, part_origin = table.partition, f"[{section}] partition"
    clusters = list(config.clusters.values())
    wanted = set(nodes)
    chosen = [c for c in clusters if wanted & {n.name for n in c.nodes}] if wanted else []
    if not chosen:
        chosen = [c for c in clusters if c.via == "srun" or c.slurm_conf or c.partition]
    if conf is None:
        confs = {c.slurm_conf for c in chosen if c.slurm_conf}
        if len(confs) > 1:
            names = ", ".join(c.name for c in chosen if c.slurm_conf)
            raise SlurmValueError(
                f"clusters {names} name different slurm_conf files: set [{section}] "
                "slurm_conf to the one to use"
            )
        if confs:
            conf = confs.pop()
            owner = next(c.name for c in chosen if c.slurm_conf == conf)
            origin = f"[clusters.{owner}] slurm_conf"
    if part is None:
        parts = {c.partition for c in chosen if c.partition}
        if len(parts) == 1:
            part = parts.pop()
            owner = next(c.name for c in chosen if c.partition == part)
            part_origin = f"[clusters.{owner}] partition"
    if part is not None:
        check_name(part, part_origin)
    return SlurmTarget(conf, part, origin)
