"""A real one-node Slurm 22.05 (Debian's slurm-wlm + munge) under a temporary folder.

``SlurmCluster(tmpdir)`` writes its own munge key, ``slurm.conf``, ``gres.conf`` and
``cgroup.conf``, starts a private ``munged`` (own socket), ``slurmctld`` and ``slurmd`` on free
ports, and waits until the node is idle. Clients reach it with ``env=cluster.env`` (which sets
``SLURM_CONF``) or through ``cluster.run([...])``. The node carries two fake GPUs
(``Gres=gpu:h100:2``, device files are symlinks to /dev/null), so ``--gpus=1`` sets
``CUDA_VISIBLE_DEVICES`` in the job and ``--gpus=3`` is refused.

``SlurmCluster(tmpdir, nodes=N)`` runs N nodes instead, ``node01`` .. ``nodeN``: one slurmd per
network namespace (``gpuctl_tests.harness.netns.HostNet``: a private bridge, each node its own
10.x address, nothing leaves the machine), the controller on the bridge's address so that every
node and every client reaches it. Each slurmd also has its own hostname (its node name) and a
private ``/etc/hosts`` naming every node's address (UTS and mount namespaces), so that what runs
on a node finds itself and the others by name, as on a real cluster (gloo does). Each node
carries the same two fake GPUs. Needs root and network namespaces (``missing_parts(multi=True)``
says why not).

Every daemon and job carries a private marker in its environment so ``stop()`` also finds job
processes that left the daemons' process trees.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
import uuid
import weakref
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuctl_tests.harness import (
    HarnessError,
    descendants,
    is_alive,
    kill_pids,
    log_tail,
    pids_with_env,
    wait_gone,
)

if TYPE_CHECKING:
    from gpuctl_tests.harness.netns import HostNet

DAEMONS = {
    "munged": "/usr/sbin/munged",
    "slurmctld": "/usr/sbin/slurmctld",
    "slurmd": "/usr/sbin/slurmd",
}
CLIENTS = ("sinfo", "srun", "sbatch", "squeue", "scancel", "scontrol")
START_TIMEOUT = 30.0


_LIVE: weakref.WeakSet[SlurmCluster] = weakref.WeakSet()


@atexit.register
def _stop_leftovers() -> None:
    for cluster in list(_LIVE):
        cluster.stop()


def missing_parts(multi: bool = False) -> str | None:
    """Why a private Slurm (with ``multi``: of several nodes, in network namespaces) cannot run
    here, or None when it can."""
    for name, path in DAEMONS.items():
        if not Path(path).exists():
            pkg = "munge" if name == "munged" else "slurm-wlm"
            return f"{path} missing (apt-get install {pkg})"
    for tool in CLIENTS:
        if shutil.which(tool) is None:
            return f"{tool} missing (apt-get install slurm-client)"
    if os.geteuid() != 0:
        return "a private Slurm needs root here (slurmd starts job steps as the job's user)"
    if multi:
        from gpuctl_tests.harness.netns import missing_netns

        return missing_netns()
    return None


@contextlib.contextmanager
def running_cluster(folder: Path, **options: Any) -> Iterator[SlurmCluster]:
    """A private Slurm in ``folder`` (``options`` as ``SlurmCluster`` takes them), stopped at
    the end; the test is skipped here, failed in CI, when the parts it needs are missing."""
    from gpuctl_tests.helpers import unavailable

    reason = missing_parts(multi=options.get("nodes", 1) > 1)
    if reason:
        unavailable(reason)
    cluster = SlurmCluster(folder, **options)
    try:
        yield cluster
    finally:
        cluster.stop()


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def _mem_total_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    return 4096


class SlurmCluster:
    """A private munged + slurmctld + one slurmd ("node ``node``", partition ``partition``), or
    with ``nodes=N`` N slurmd's in network namespaces (``node01`` .. ``nodeN``; ``node`` is the
    first).

    Attributes: ``env`` (environment for Slurm clients: ``SLURM_CONF`` set, inherited
    ``SLURM_*`` job variables removed), ``conf_path``, ``node``, ``partition``, ``gpus`` (2),
    ``gpu_type`` ("h100"), ``cpus``, ``jobcomp_path`` (one line per finished job),
    ``start_seconds``, ``nodes`` (every node's name), ``net`` (the namespaces, or None).

    ``enforce_memory=True`` makes Slurm enforce ``--mem`` itself (``jobacct_gather/linux``
    sampling every second with ``OverMemoryKill``: a step over its limit is killed and the job
    ends OUT_OF_MEMORY). Off by default: with ``DefMemPerCPU=100`` every job without ``--mem``
    would then be held to 100 MB per CPU.

    ``conf``: more ``slurm.conf`` settings, over the harness's own (``{"MaxArraySize": 11}``).
    ``preemption=True`` adds two partitions on the same node(s), ``low`` (``PriorityTier=1``,
    ``PreemptMode=REQUEUE``, ``GraceTime=preempt_grace``) and ``high`` (``PriorityTier=2``,
    never preempted), under ``PreemptType=preempt/partition_prio``: a job of ``high`` that
    needs the node preempts the jobs of ``low`` (SIGCONT and SIGTERM, ``preempt_grace`` seconds,
    then Slurm kills and requeues them). Off by default; the default partition stays.
    """

    def __init__(
        self,
        tmpdir: str | os.PathLike[str],
        *,
        node: str = "localhost",
        nodes: int | None = None,
        partition: str = "debug",
        cpus: int = 8,
        gpus: int = 2,
        gpu_type: str = "h100",
        min_job_age: int = 10,
        enforce_memory: bool = False,
        conf: Mapping[str, str | int] | None = None,
        preemption: bool = False,
        preempt_grace: int = 30,
        start: bool = True,
    ) -> None:
        reason = missing_parts(multi=nodes is not None)
        if reason:
            raise HarnessError(reason)
        self.dir = Path(tmpdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        self.net: HostNet | None = None
        if nodes is None:
            self.nodes = [node]
        else:
            width = max(2, len(str(nodes)))
            self.nodes = [f"node{i:0{width}d}" for i in range(1, nodes + 1)]
            node = self.nodes[0]
        self.node = node
        self.partition = partition
        self.cpus = cpus
        self.gpus = gpus
        self.gpu_type = gpu_type
        self.min_job_age = min_job_age
        self.enforce_memory = enforce_memory
        self.extra_conf = dict(conf or {})
        self.preemption = preemption
        self.preempt_grace = preempt_grace
        self.low_partition = "low"
        self.high_partition = "high"
        self.user = pwd.getpwuid(os.getuid()).pw_name
        self.conf_path = self.dir / "slurm.conf"
        self.munge_socket = self.dir / "munge" / "munge.socket"
        self.jobcomp_path = self.dir / "jobcomp.txt"
        self.logs = {
            "munged": self.dir / "munged.log",
            "slurmctld": self.dir / "slurmctld.log",
            "slurmd": self.dir / "slurmd.log",
        }
        if nodes is not None:
            self.logs.update({f"slurmd-{n}": self.dir / f"slurmd-{n}.log" for n in self.nodes})
        self.marker = f"GPUCTL_TEST_SLURM={uuid.uuid4().hex}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env["SLURM_CONF"] = str(self.conf_path)
        name, value = self.marker.split("=", 1)
        env[name] = value
        self.env: dict[str, str] = env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        _LIVE.add(self)
        self.start_seconds: float | None = None
        if nodes is not None:
            from gpuctl_tests.harness.netns import HostNet

            try:
                self.net = HostNet(nodes)
            except (RuntimeError, ValueError) as e:
                raise HarnessError(f"private Slurm: no network namespaces: {e}") from None
        self._write_files()
        if start:
            self.start()

    # --- files -----------------------------------------------------------------------------

    def _write_files(self) -> None:
        d = self.dir
        for sub in ("munge", "state", "spool", "dev"):
            (d / sub).mkdir(mode=0o700, exist_ok=True)
        key = d / "munge" / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
            key.chmod(0o400)
        self.ctld_port, self.slurmd_port = _free_ports(2)
        self._write_conf()
        (d / "plugstack.conf").write_text("")
        (d / "cgroup.conf").write_text("CgroupPlugin=autodetect\n")
        gres = ["AutoDetect=off"]
        gres += [
            f"NodeName={node} Name=gpu Type={self.gpu_type} File={dev}"
            for node in self.nodes
            for dev in self._devices()
        ]
        (d / "gres.conf").write_text("\n".join(gres) + "\n")

    def _devices(self) -> list[Path]:
        d = self.dir
        devices = []
        for i in range(self.gpus):
            dev = d / "dev" / f"nvidia{i}"
            if not dev.is_symlink():
                dev.symlink_to("/dev/null")  # gres drops regular files; device nodes count
            devices.append(dev)
        return devices

    def _write_conf(self) -> None:
        d = self.dir
        real_mb = max(512, min(_mem_total_mb() - 512, 16384))
        # several nodes: each slurmd reaches the controller on the bridge, and keeps its own
        # spool, pid and log file (%n: the node's name)
        per_node = "-%n" if self.net is not None else ""
        conf = {
            "ClusterName": "gpuctltest",
            "SlurmctldHost": f"localhost({self.net.gateway if self.net else '127.0.0.1'})",
            "SlurmctldPort": self.ctld_port,
            "SlurmdPort": self.slurmd_port,
            "SlurmUser": self.user,
            "SlurmdUser": self.user,
            "AuthType": "auth/munge",
            "CredType": "cred/munge",
            # cred_expire: a requeued job waits this long before it may start again (120 s
            # by default); the checkpoint tests requeue jobs
            "AuthInfo": f"socket={self.munge_socket},cred_expire=10",
            "StateSaveLocation": d / "state",
            "SlurmdSpoolDir": f"{d / 'spool'}{per_node}",
            "SlurmctldPidFile": d / "slurmctld.pid",
            "SlurmdPidFile": d / f"slurmd{per_node}.pid",
            "SlurmctldLogFile": self.logs["slurmctld"],
            "SlurmdLogFile": d / f"slurmd{per_node}.log",
            "PlugStackConfig": d / "plugstack.conf",
            "ProctrackType": "proctrack/linuxproc",
            "TaskPlugin": "task/none",
            "JobAcctGatherType": "jobacct_gather/none",
            "AccountingStorageType": "accounting_storage/none",
            "JobCompType": "jobcomp/filetxt",
            "JobCompLoc": self.jobcomp_path,
            "SelectType": "select/cons_tres",
            "SelectTypeParameters": "CR_Core_Memory",
            "DefMemPerCPU": 100,
            "GresTypes": "gpu",
            "MpiDefault": "none",
            "SwitchType": "switch/none",
            "ReturnToService": 2,
            "MinJobAge": self.min_job_age,
            "SlurmctldTimeout": 30,
            "SlurmdTimeout": 30,
            "MessageTimeout": 10,
            "InactiveLimit": 0,
            "KillWait": 2,
            "SchedulerType": "sched/backfill",
            # start batch jobs within ~1 s instead of ~3 s (the first one after start still
            # waits for the scheduler's first pass, ~3 s after slurmctld starts).
            # bf_interval=1, sched_interval=1: what no event wakes is looked at every second,
            # not every 30 s (backfill) or 60 s (the full main pass). Slurm 22.05 begins a
            # preemption only in a backfill pass, and ends it (the requeue, KillWait +
            # MessageTimeout after it began) and starts a requeued job once its begin time
            # (now + cred_expire + 1, job_mgr.c) is past only in a pass that something else
            # triggers: with the defaults each waited up to 30 s (a preemption test took 60 s,
            # 27 s with these; the `scontrol requeue` test 51 s, 23 s)
            "SchedulerParameters": (
                "batch_sched_delay=0,sched_min_interval=0,bf_interval=1,sched_interval=1"
            ),
            # the node may declare more CPUs than the machine has: jobs are small, and tests
            # want several at once on a 2-core machine
            "SlurmdParameters": "config_overrides",
            "SlurmctldDebug": "info",
            "SlurmdDebug": "info",
        }
        if self.enforce_memory:
            conf["JobAcctGatherType"] = "jobacct_gather/linux"
            conf["JobAcctGatherFrequency"] = "task=1"
            conf["JobAcctGatherParams"] = "OverMemoryKill"
        conf.update(self.extra_conf)
        if self.preemption:
            conf["PreemptType"] = "preempt/partition_prio"
            conf["PreemptMode"] = "REQUEUE"
        lines = [f"{k}={v}" for k, v in conf.items()]
        addrs = self.net.addresses if self.net else ["127.0.0.1"]
        for node, addr in zip(self.nodes, addrs, strict=True):
            host = node if self.net else socket.gethostname()
            lines.append(
                f"NodeName={node} NodeAddr={addr} NodeHostname={host} "
                f"CPUs={self.cpus} RealMemory={real_mb} Gres=gpu:{self.gpu_type}:{self.gpus} "
                "State=UNKNOWN"
            )
        lines.append(
            f"PartitionName={self.partition} Nodes={','.join(self.nodes)} Default=YES "
            "MaxTime=INFINITE State=UP"
        )
        if self.preemption:
            nodes = ",".join(self.nodes)
            lines += [
                f"PartitionName={self.low_partition} Nodes={nodes} MaxTime=INFINITE State=UP "
                f"PriorityTier=1 PreemptMode=REQUEUE GraceTime={self.preempt_grace}",
                f"PartitionName={self.high_partition} Nodes={nodes} MaxTime=INFINITE State=UP "
                "PriorityTier=2 PreemptMode=OFF",
            ]
        self.conf_path.write_text("\n".join(lines) + "\n")

    # --- lifecycle -------------------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        out = open(self.dir / f"{name}.out", "ab")  # noqa: SIM115 - lives as long as the daemon
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.dir,
                start_new_session=True,
            )
        finally:
            out.close()
        self.procs[name] = proc
        return proc

    def _fail(self, name: str, why: str) -> HarnessError:
        log = self.logs.get(name, self.logs["slurmd"])
        tails = [f"--- {name} log ---\n{log_tail(log)}"]
        out = self.dir / f"{name}.out"
        if out.exists() and out.stat().st_size:
            tails.append(f"--- {name} output ---\n{log_tail(out)}")
        err = HarnessError(f"private Slurm: {name} {why}\n" + "\n".join(tails))
        self.stop()
        return err

    def _wait(self, name: str, ready: Any, deadline: float) -> None:
        while not ready():
            proc = self.procs[name]
            if proc.poll() is not None:
                raise self._fail(name, f"exited with status {proc.returncode}")
            if time.monotonic() > deadline:
                raise self._fail(name, "did not become ready in time")
            time.sleep(0.02)  # poll interval; the deadline decides

    def start(self, timeout: float = START_TIMEOUT, attempts: int = 3) -> None:
        """Start munged, slurmctld and slurmd; return once the node is idle.

        The ports were free when chosen, but another process (another engineer's test Slurm on
        this machine, say) may bind one before our daemon does: then the daemon dies with
        "Address already in use", and the cluster starts again on new ports, up to
        ``attempts`` times. Raises HarnessError (with the failing daemon's log tail) when a
        daemon does not come up.
        """
        for attempt in range(1, attempts + 1):
            try:
                self._start_once(timeout)
                return
            except HarnessError as e:
                if attempt == attempts or "Address already in use" not in str(e):
                    raise
            self.ctld_port, self.slurmd_port = _free_ports(2)
            self._write_conf()

    def _start_once(self, timeout: float) -> None:
        t0 = time.monotonic()
        deadline = t0 + timeout
        m = self.dir / "munge"
        self._spawn(
            "munged",
            [
                DAEMONS["munged"],
                "--foreground",
                "--force",
                f"--socket={self.munge_socket}",
                f"--key-file={m / 'munge.key'}",
                f"--pid-file={m / 'munged.pid'}",
                f"--seed-file={m / 'munged.seed'}",
                f"--log-file={self.logs['munged']}",
                "--num-threads=4",
            ],
        )
        self._wait("munged", self.munge_socket.exists, deadline)
        self._spawn("slurmctld", [DAEMONS["slurmctld"], "-D", "-c", "-f", str(self.conf_path)])
        self._wait("slurmctld", self._controller_up, deadline)
        if self.net is None:
            argv = [DAEMONS["slurmd"], "-D", "-N", self.node, "-f", str(self.conf_path)]
            self._spawn("slurmd", argv)
            self._wait("slurmd", self._node_idle, deadline)
        else:
            hosts = self.dir / "hosts"
            hosts.write_text(
                "127.0.0.1 localhost\n"
                + "".join(f"{a} {n}\n" for a, n in zip(self.net.addresses, self.nodes, strict=True))
            )
            for i, node in enumerate(self.nodes):
                argv = [DAEMONS["slurmd"], "-D", "-N", node, "-f", str(self.conf_path)]
                own = [  # its own hostname and /etc/hosts, then slurmd (same pid throughout)
                    "unshare", "--uts", "--mount", "--propagation", "private",
                    "sh", "-c", 'mount --bind "$1" /etc/hosts && hostname "$2" && shift 2 && '
                    'exec "$@"', "sh", str(hosts), node, *argv,
                ]  # fmt: skip
                self._spawn(f"slurmd-{node}", self.net.enter(i, own))
            for node in self.nodes:
                self._wait(f"slurmd-{node}", self._node_idle, deadline)
        self.start_seconds = time.monotonic() - t0

    def _client(self, argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv),
            env=self.env,
            cwd=self.dir,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=timeout,
        )

    def _controller_up(self) -> bool:
        try:
            r = self._client(["scontrol", "ping"], timeout=5)
        except subprocess.TimeoutExpired:
            return False
        return "is UP" in r.stdout

    def _node_state(self) -> str:
        """The node's state; with several nodes, the first one that is not idle (or idle)."""
        names = ",".join(self.nodes)
        try:
            r = self._client(["sinfo", "-h", "-N", "-n", names, "-o", "%N %T"], timeout=5)
        except subprocess.TimeoutExpired:
            return ""
        # a node is listed once per partition it is in
        by_node = dict(line.split(None, 1) for line in r.stdout.splitlines() if " " in line)
        states = [by_node[n] for n in self.nodes if n in by_node]
        if len(states) != len(self.nodes):
            return r.stdout.strip()
        return next((s for s in states if s != "idle"), "idle")

    def _node_idle(self) -> bool:
        return self._node_state() == "idle"

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float = 60,
        check: bool = True,
        input: str | None = None,
        cwd: str | os.PathLike[str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client (``["srun", "-N1", "hostname"]``) against this cluster.

        Runs in ``cwd`` (default: the cluster's folder, so a job's ``slurm-N.out`` lands there,
        not in the checkout). Returns the completed process (text); with ``check`` a non-zero
        exit raises HarnessError carrying stderr. Raises subprocess.TimeoutExpired past
        ``timeout``.
        """
        r = subprocess.run(
            list(argv),
            env=self.env,
            cwd=self.dir if cwd is None else cwd,
            capture_output=True,
            text=True,
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
            timeout=timeout,
        )
        if check and r.returncode != 0:
            raise HarnessError(
                f"{' '.join(argv)} exited {r.returncode}: {r.stderr.strip() or r.stdout.strip()}"
            )
        return r

    def jobs(self) -> list[str]:
        """Ids of the jobs squeue lists (pending, running, completing)."""
        r = self.run(["squeue", "-h", "-o", "%i"], timeout=10)
        return r.stdout.split()

    def wait_idle(self, timeout: float = 30, *, node_idle: bool = True) -> None:
        """Wait until no job is queued, running or completing and every node idle (or, without
        ``node_idle``, idle or "mixed": sinfo's state of a node that a cancelled job left);
        raises HarnessError naming what it saw instead."""
        done = ("idle",) if node_idle else ("idle", "mixed")
        deadline = time.monotonic() + timeout
        while True:
            queued = self._client(["squeue", "-h", "-t", "PD,R,CG,S", "-o", "%i %T"], 10)
            seen = f"queued: {queued.stdout.strip()} {queued.stderr.strip()}"
            if not queued.stdout.split():
                state = seen = self._node_state()
                if state in done:
                    return
                if state in ("drained", "draining", "down", "down*") and self.resume():
                    continue
            if time.monotonic() > deadline:
                raise HarnessError(f"Slurm not idle after {timeout:g} s: {seen}; {self._busy()}")
            time.sleep(0.05)  # poll interval; the deadline decides

    def _busy(self) -> str:
        """What keeps the cluster from idle: every job Slurm still knows, each node's state."""
        jobs = self._client(["squeue", "-h", "-t", "all", "-o", "%i %T %j %N"], 10).stdout
        nodes = self._client(["scontrol", "-o", "show", "node"], 10).stdout
        keep = ("NodeName", "State", "AllocTRES", "Reason")
        shown = [
            " ".join(f for f in line.split() if f.startswith(keep)) for line in nodes.splitlines()
        ]
        return f"{self._node_state()}; jobs: {jobs.strip() or 'none'}; nodes: {'; '.join(shown)}"

    def cancel_all(self, timeout: float = 10) -> None:
        """scancel every job of this cluster (bounded: scancel retries without a controller)."""
        if self.procs.get("slurmctld") and self.procs["slurmctld"].poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._client(["scancel", "--full", "-u", self.user], timeout=timeout)

    def resume(self) -> bool:
        """Put a drained or down node back in service; True when scontrol accepted it."""
        try:
            r = self._client(
                ["scontrol", "update", f"NodeName={','.join(self.nodes)}", "State=RESUME"],
                timeout=5,
            )
        except subprocess.TimeoutExpired:
            return False
        return r.returncode == 0

    def processes(self) -> set[int]:
        """Live processes of this cluster: daemons, slurmstepd and job processes."""
        roots = [p.pid for p in self.procs.values()]
        found = descendants(roots) | pids_with_env(self.marker)
        return {p for p in found if is_alive(p) and p != os.getpid()}

    def stop(self) -> None:
        """Cancel jobs, SIGTERM the daemons, SIGKILL what remains (jobs included)."""
        self.cancel_all()
        pids = self.processes()
        # slurmd first (it may ignore SIGTERM while registering), then the controller, munge
        slurmds = [n for n in self.procs if n.startswith("slurmd")]
        for group in (slurmds, ["slurmctld"], ["munged"]):
            procs = [p for n in group if (p := self.procs.get(n)) and p.poll() is None]
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 5
            for proc in procs:
                try:
                    proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
        kill_pids(self.processes() | pids, signal.SIGKILL)
        wait_gone(pids, 5)
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
        if self.net is not None:
            self.net.close()

    def __enter__(self) -> SlurmCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
