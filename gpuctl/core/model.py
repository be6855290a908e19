"""Immutable values that everything above the links sees: no I/O.

A field a GPU could not report is ``None``. The classes an agent's messages are read into
(``Sample``, ``GpuSample``, ``GpuProcess``, ``HostSample``, ``NodeInfo`` with its ``GpuStatic``,
``NodeEvent``) are msgspec Structs, and they are the login side's schema of protocol v2 and v1
(``gpuctl/node/protocol.py`` documents the wire, which the node side writes with the standard
library; a v2 sample leaves out what is null and what the hello holds, and the session fills a
GPU's ``uuid``, ``mem_total`` and ``power_limit`` from its ``GpuStatic``): a field's type says what
a valid value is, bounds included (``Annotated`` with ``msgspec.Meta``), and
``gpuctl.fleet.session.decode_line`` decodes a line straight into them, in C. A line that does not
fit (a string where a number belongs, an integer beyond 64 bits, a load average of -1) is read
again leniently, field by field (``gpuctl.core.wire.lenient_fields``), and the bad fields are
left at their defaults (``None``): one broken field never hides the rest.

The Structs are ``frozen`` (values, safe to share between the screen's views) and ``gc=False``:
they hold only numbers, strings, tuples of such Structs and dicts decoded from JSON, which
cannot refer back to them, so they can never be part of a reference cycle and the collector
need not track the Structs a sample makes. Decoding a sample line of 8 GPUs takes ~12 us of
CPU where json.loads and reading its dicts field by field took ~130 us on the same machine
(``benchmarks/decode.py``).
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, TypedDict

import msgspec
from msgspec import Meta

from gpuctl.core import wire

# A burn's messages are defined once, beside their writer (the agent's stress plugin): the
# node side's contract, read here as the GPU's ``burn`` annotation.
from gpuctl.node.messages import BurnState as BurnState
from gpuctl.node.messages import OwnerWire as OwnerWire


class NodeState(enum.Enum):
    """Where a node's link stands."""

    CONNECTING = "connecting"
    LIVE = "live"
    STALE = "stale"
    UNREACHABLE = "unreachable"


# The bounds of a value from a node; outside them it is junk, not a fact. No counter a node
# reports is wider than 64 bits; msgspec bounds an integer within int64 (a counter past 2**63 is
# as much junk as one past 2**64), and a JSON float beyond a double is refused by the decoder.
Int = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]
# A finite float: the bounds refuse NaN and the infinities (which a dict from json.loads, a
# recording's, may hold; the JSON decoder refuses a float beyond a double anyway).
Float = Annotated[float, Meta(ge=-sys.float_info.max, le=sys.float_info.max)]
Count = Annotated[int, Meta(ge=0, le=2**63 - 1)]  # an amount or an id: never negative
Pid = Annotated[int, Meta(ge=1, le=2**63 - 1)]  # pid 0 is no process
Percent = Annotated[float, Meta(ge=0.0, le=100.0)]
CPU_PERCENT_LIMIT = 100_000.0  # %CPU of one process: 1,000 cores busy
CpuPercent = Annotated[float, Meta(ge=0.0, le=CPU_PERCENT_LIMIT)]
UnixTime = Annotated[float, Meta(ge=1.0, le=1e11)]  # a process's start: 1970 to year 5138
Rate = Annotated[float, Meta(ge=0.0, le=1e15)]  # bytes/s of a node's network
Load = Annotated[float, Meta(ge=0.0, le=1e9)]
Share = Annotated[int, Meta(ge=0, le=100)]  # a whole % (gpuctl/node/metrics.py: lo, hi)
Throughput = Annotated[int, Meta(ge=0, le=10**13)]  # bytes/s of a GPU's PCIe link
# ECC counters, retired pages, remapped rows: counts and flags by name (protocol docstring).
Counts = dict[str, Annotated[int, Meta(ge=0, le=2**63 - 1)] | bool | None]


class GpuProcess(msgspec.Struct, frozen=True, gc=False):
    """A process holding GPU memory (or, in ``NodeSnapshot.parents``, an ancestor of one).

    ``mem`` and ``rss`` in bytes, ``sm`` the SM % it used on its GPU, ``cpu`` its host %CPU,
    ``started`` a unix time, ``ppid`` its parent, ``slurm_job`` the Slurm job its cgroup is in;
    any may be None (unknown)."""

    pid: Pid | None = None
    user: str | None = None
    command: str | None = None
    mem: Count | None = None  # bytes
    uid: Count | None = None
    ppid: Count | None = None
    sm: Percent | None = None
    cpu: CpuPercent | None = None
    rss: Count | None = None
    started: UnixTime | None = None
    slurm_job: str | None = None  # the Slurm job of its cgroup, where the node can tell

    def to_dict(self) -> dict[str, Any]:
        """The process as plain JSON-able data (the wire names)."""
        return msgspec.structs.asdict(self)


class HostSample(msgspec.Struct, frozen=True, gc=False):
    """A node's host beside its GPUs: ``cpu`` % of all CPUs busy, ``cpus`` their count,
    ``mem_total`` / ``mem_available`` bytes, ``load`` the 1, 5 and 15 minute load averages,
    ``net_rx`` / ``net_tx`` bytes/s; any may be None (unknown)."""

    cpu: Percent | None = None
    cpus: Count | None = None
    mem_total: Count | None = None
    mem_available: Count | None = None
    load: Annotated[tuple[Load, ...], Meta(max_length=3)] = ()
    net_rx: Rate | None = None
    net_tx: Rate | None = None

    @property
    def mem_used(self) -> int | None:
        """Bytes in use (total less available), or None."""
        if self.mem_total is None or self.mem_available is None:
            return None
        return max(0, self.mem_total - self.mem_available)


class GpuStatic(msgspec.Struct, frozen=True, gc=False):
    """Facts about a GPU that do not change while the agent runs (a hello's ``gpus``; a GPU
    whose ``index`` is missing or bad takes its position in the list)."""

    index: Int
    uuid: str | None = None
    name: str | None = None
    mem_total: Int | None = None
    power_limit: Float | None = None
    max_sm_clock: Int | None = None
    max_mem_clock: Int | None = None
    pcie_gen: Int | None = None
    pcie_width: Int | None = None
    mig_mode: bool | None = None
    serial: str | None = None


class MigInstance(msgspec.Struct, frozen=True, gc=False):
    """One GPU instance of a GPU in MIG mode (a sample's ``mig``): DCGM's instance id
    (``GPU_I_ID``), its profile ("3g.40gb"), its utilisation (GR_ENGINE_ACTIVE, %) and memory
    (bytes). The GPU's row sums them (``gpuctl.fleet.prom``); the detail screen lists them."""

    id: str = ""
    profile: str | None = None
    util: Share | None = None
    mem_used: Int | None = None
    mem_total: Int | None = None


class GpuSample(msgspec.Struct, frozen=True, gc=False):
    """One reading of one GPU at time ``t`` (unix seconds: the sample's ``t``, which the wire
    carries once per sample, not per GPU). ``state`` is "ok" or "lost" (``lost``). The readings
    are the rows of ``gpuctl/node/metrics.py``, in its order, with its types and bounds (a test
    holds them equal; written out here so that the decode stays msgspec's, in C)."""

    index: Int
    t: Float = 0.0
    uuid: str | None = None
    state: str = "ok"
    util_gpu: Int | None = None
    util_mem: Int | None = None
    mem_used: Int | None = None
    mem_total: Int | None = None
    temp: Int | None = None
    power: Float | None = None
    power_limit: Float | None = None
    sm_clock: Int | None = None
    mem_clock: Int | None = None
    fan: Int | None = None
    pstate: str | None = None
    enc: Share | None = None
    dec: Share | None = None
    pcie_tx: Throughput | None = None
    pcie_rx: Throughput | None = None
    throttle: tuple[str, ...] | None = None
    ecc: Counts | None = None
    retired_pages: Counts | None = None
    remapped_rows: Counts | None = None
    processes: tuple[GpuProcess, ...] = ()
    mig: tuple[MigInstance, ...] | None = None  # a GPU in MIG mode's instances, where known

    @property
    def lost(self) -> bool:
        """The agent lost this GPU (it fell off the bus, or its driver stopped answering)."""
        return self.state == "lost"

    def to_dict(self) -> dict[str, Any]:
        """The sample as plain JSON-able data (the wire names)."""
        d: dict[str, Any] = msgspec.to_builtins(self)
        del d["t"]
        d["state"] = "lost" if self.lost else "ok"
        return d


MAX_PARENTS = 256  # a sample's ``parents`` kept (an agent sends at most 64)


class Sample(msgspec.Struct, frozen=True, gc=False, tag_field="type", tag="sample"):
    """A ``sample`` message: ``t`` (unix time), ``seq``, its GPUs (each with the sample's ``t``),
    the ancestors of the GPU processes (``parents``: launchers, shells) and the node's host."""

    t: Float = 0.0
    seq: Int = -1
    gpus: tuple[GpuSample, ...] = ()
    parents: Annotated[tuple[GpuProcess, ...], Meta(max_length=MAX_PARENTS)] = ()
    host: HostSample | None = None


class NodeInfo(msgspec.Struct, frozen=True, gc=False):
    """What a node's agent said about itself in its hello (the protocol docstring lists the
    fields): versions, host, pid, Python, reader, sampling ``interval`` (s), the request types
    it understands (``features``), ``read_only``, ``liveness_timeout`` and ``max_duration`` (s),
    and its GPUs' static facts."""

    hostname: str | None = None
    protocol: Int | None = None
    agent: str | None = None
    python: str | None = None
    reader: str | None = None
    reader_error: str | None = None
    bindings: str | None = None  # "bundled 13.615.71" | "system 12.535.133" | None
    driver: str | None = None
    cuda: str | None = None
    nvml: str | None = None
    features: tuple[str, ...] = ()
    gpus: tuple[GpuStatic, ...] = ()
    pid: Count | None = None
    interval: Float | None = None
    read_only: bool | None = None
    liveness_timeout: Float | None = None
    max_duration: Float | None = None
    boot_time: UnixTime | None = None  # when the node booted


class NodeEvent(msgspec.Struct, frozen=True, gc=False, tag_field="type", tag="event"):
    """Something that happened on a node: an XID, a lost GPU, a burn that ended. ``detail`` is
    the event's data as the node sent it (``burn_from_wire`` checks a burn's)."""

    t: Float = 0.0
    kind: str = ""
    gpu: Int | None = None
    detail: dict[str, Any] = {}


# A burn in one of these states holds its GPU (a stop may still be on its way).
BURNING_STATES = ("starting", "running", "stopping")


def burn_from_wire(detail: object) -> BurnState:
    """A ``burn`` event's detail as a BurnState: an unknown key, or a field of the wrong type
    (a string for ``tflops``, a 10**400 error count, a malformed owner), is left out. Never
    raises."""
    return wire.parse(BurnState, detail) or {}


class GpuNotes(TypedDict, total=False):
    """What other subsystems add to a GPU (``Fleet.annotate``): its burn, the Slurm job that
    holds it and that job's user."""

    burn: BurnState
    slurm_job: str
    slurm_user: str


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    """Everything known about one node at one moment: the unit the fleet hands upward."""

    name: str
    state: NodeState
    link: str = "local"  # "local" | "ssh" | "srun" | "simulated"
    info: NodeInfo | None = None
    gpus: tuple[GpuSample, ...] = ()
    last_sample_t: float | None = None  # unix time of the newest sample
    reason: str | None = None  # why it is unreachable (or None)
    # Extra per-GPU annotations from other subsystems (burn state, Slurm job), by GPU index.
    annotations: Mapping[int, GpuNotes] = field(default_factory=dict)
    # Ancestors of the GPU processes that use no GPU themselves (launchers, shells).
    parents: tuple[GpuProcess, ...] = ()
    host: HostSample | None = None  # the node's CPU, memory, load and network, newest sample

    def age(self, now: float) -> float | None:
        """Seconds since the newest sample, or None if there never was one."""
        return None if self.last_sample_t is None else max(0.0, now - self.last_sample_t)

    def burn(self, gpu: int) -> BurnState | None:
        """The burn annotation of GPU ``gpu``, or None."""
        return self.annotations.get(gpu, {}).get("burn")

    def burning(self, gpu: int) -> bool:
        """True while GPU ``gpu`` has a burn that is starting, running or stopping."""
        burn = self.burn(gpu)
        return burn is not None and burn.get("state") in BURNING_STATES
