"""Immutable values that everything above the links sees: no I/O, standard library only.

A field a GPU could not report is ``None``. These are built from protocol v1 messages
(``gpuctl/node/protocol.py`` holds the wire schema) by the ``from_wire`` constructors, which accept
any dict and never raise on a missing or mistyped field: a bad field becomes ``None``, and so does
a number no GPU can report (an integer beyond 64 bits, a float that is not finite).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict, TypeVar, overload

from gpuctl.core import wire


class NodeState(enum.Enum):
    """Where a node's link stands."""

    CONNECTING = "connecting"
    LIVE = "live"
    STALE = "stale"
    UNREACHABLE = "unreachable"


_INT_LIMIT = wire.INT_LIMIT  # a wider integer is junk (see gpuctl.core.wire)


def _int(v: object) -> int | None:
    if type(v) is int:  # what JSON gives: checked first, the hot path of every sample
        return v if -_INT_LIMIT < v < _INT_LIMIT else None
    if isinstance(v, bool) or not isinstance(v, int):
        return None
    return v if -_INT_LIMIT < v < _INT_LIMIT else None


def _float(v: object) -> float | None:
    if type(v) is float:
        return v if math.isfinite(v) else None
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    if isinstance(v, int) and _int(v) is None:
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def _str(v: object) -> str | None:
    return v if isinstance(v, str) else None


def _bool(v: object) -> bool | None:
    return v if isinstance(v, bool) else None


def _counts(v: object) -> Mapping[str, Any] | None:
    return dict(v) if isinstance(v, dict) else None


_T = TypeVar("_T")


def _twin(cls: type[_T]) -> type[_T]:
    """A builder for the frozen, slotted dataclass ``cls``: a plain slotted dataclass with the
    same fields, whose instances become ``cls``'s by ``obj.__class__ = cls`` (same slots, same
    layout). A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``
    (~2.7 us for a GpuSample's 20 fields); the twin's sets them as plain slots (~0.7 us, the
    class change included). For the values built once per GPU per sample; what comes out is a
    ``cls`` like any other (frozen, equal and hashable as ``cls(...)`` would be)."""
    fields = [
        (f.name, f.type, field(default=f.default, default_factory=f.default_factory))
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
    ]
    twin = dataclasses.make_dataclass(f"_{cls.__name__}Twin", fields, slots=True)
    if twin.__slots__ != cls.__slots__:  # type: ignore[attr-defined]
        raise TypeError(f"{cls.__name__} and its twin differ in their slots")
    return twin


class ProcessWire(TypedDict, total=False):
    """A process as a sample carries it (``processes`` of a GPU, or ``parents``)."""

    pid: int
    user: str | None
    command: str | None
    mem: int | None
    uid: int | None
    ppid: int | None
    sm: float | None
    cpu: float | None
    rss: int | None
    started: float | None


def _count(v: object) -> int | None:
    """A non-negative integer, or None."""
    n = _int(v)
    return n if n is not None and n >= 0 else None


def _within(v: float | None, low: float, high: float) -> float | None:
    """``v`` when ``low <= v <= high``: a reading outside is junk from a node, not a fact."""
    return v if v is not None and low <= v <= high else None


CPU_PERCENT_LIMIT = 100_000.0  # %CPU of one process: 1,000 cores busy


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A process holding GPU memory (or, in ``NodeSnapshot.parents``, an ancestor of one).

    ``mem`` and ``rss`` in bytes, ``sm`` the SM % it used on its GPU, ``cpu`` its host %CPU,
    ``started`` a unix time, ``ppid`` its parent; any may be None (unknown)."""

    pid: int | None
    user: str | None
    command: str | None
    mem: int | None  # bytes
    uid: int | None = None
    ppid: int | None = None
    sm: float | None = None
    cpu: float | None = None
    rss: int | None = None
    started: float | None = None

    @classmethod
    def from_wire(cls, d: object) -> GpuProcess:
        """Build from a protocol dict; bad fields (wrong type, out of range) become None."""
        # Read field by field with the checks ``wire.parse(ProcessWire, d)`` makes (it is the
        # schema), without its generic walk: every GPU process of every sample comes here.
        w: Mapping[str, object] = d if isinstance(d, dict) else {}
        pid = _count(w.get("pid"))
        obj = _PROCESS_TWIN(
            pid=pid if pid else None,
            user=_str(w.get("user")),
            command=_str(w.get("command")),
            mem=_count(w.get("mem")),
            uid=_count(w.get("uid")),
            ppid=_count(w.get("ppid")),
            sm=_within(_float(w.get("sm")), 0.0, 100.0),
            cpu=_within(_float(w.get("cpu")), 0.0, CPU_PERCENT_LIMIT),
            rss=_count(w.get("rss")),
            started=_within(_float(w.get("started")), 1.0, 1e11),
        )
        obj.__class__ = GpuProcess
        return obj

    def to_dict(self) -> dict[str, Any]:
        """The process as plain JSON-able data (the wire names)."""
        return {
            "pid": self.pid,
            "user": self.user,
            "command": self.command,
            "mem": self.mem,
            "uid": self.uid,
            "ppid": self.ppid,
            "sm": self.sm,
            "cpu": self.cpu,
            "rss": self.rss,
            "started": self.started,
        }


_PROCESS_TWIN = _twin(GpuProcess)


class WireProcesses(Sequence[GpuProcess]):
    """A sample's ``processes`` as the node sent them, each read (``GpuProcess.from_wire``) the
    first time the sequence is looked into: most samples are never looked into (only the
    latest one of a GPU on screen, or in the process view, is), and reading every process of
    every GPU of every sample cost ~7 % of the screen's CPU at 4,096 GPUs. What it holds is
    what an eagerly read tuple holds, and it compares (and hashes) equal to that tuple."""

    __slots__ = ("_raw", "_read")

    def __init__(self, raw: list[object]) -> None:
        self._raw = raw
        self._read: tuple[GpuProcess, ...] | None = None

    def _all(self) -> tuple[GpuProcess, ...]:
        if self._read is None:
            self._read = tuple([GpuProcess.from_wire(p) for p in self._raw])
            self._raw = []  # the node's dicts are no longer needed
        return self._read

    def __len__(self) -> int:
        return len(self._raw) if self._read is None else len(self._read)

    @overload
    def __getitem__(self, index: int) -> GpuProcess: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[GpuProcess, ...]: ...
    def __getitem__(self, index: int | slice) -> GpuProcess | tuple[GpuProcess, ...]:
        return self._all()[index]

    def __iter__(self) -> Iterator[GpuProcess]:
        return iter(self._all())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, WireProcesses):
            other = other._all()
        return isinstance(other, tuple) and self._all() == other

    def __hash__(self) -> int:
        return hash(self._all())

    def __repr__(self) -> str:
        return repr(self._all())

    def __reduce__(self) -> tuple[type[tuple[GpuProcess, ...]], tuple[tuple[GpuProcess, ...]]]:
        return tuple, (self._all(),)  # pickled (and copied) as the tuple it stands for


class HostWire(TypedDict, total=False):
    """A sample's ``host``: the node's CPU, memory, load and network (protocol v1)."""

    cpu: float | None
    cpus: int | None
    mem_total: int | None
    mem_available: int | None
    load: list[float] | None
    net_rx: float | None
    net_tx: float | None


@dataclass(frozen=True, slots=True)
class HostSample:
    """A node's host beside its GPUs: ``cpu`` % of all CPUs busy, ``cpus`` their count,
    ``mem_total`` / ``mem_available`` bytes, ``load`` the 1, 5 and 15 minute load averages,
    ``net_rx`` / ``net_tx`` bytes/s; any may be None (unknown)."""

    cpu: float | None = None
    cpus: int | None = None
    mem_total: int | None = None
    mem_available: int | None = None
    load: tuple[float, ...] = ()
    net_rx: float | None = None
    net_tx: float | None = None

    @classmethod
    def from_wire(cls, d: object) -> HostSample | None:
        """Build from a sample's ``host``; None when it is not an object; a bad or impossible
        field (a negative amount, more than 100 % busy) becomes None."""
        if not isinstance(d, dict):
            return None
        # Field by field with the checks ``wire.parse(HostWire, d)`` makes (it is the schema):
        # one of these comes with every sample of every node.
        load = d.get("load")
        if not (isinstance(load, list) and all(_float(x) is not None for x in load)):
            load = []
        obj = _HOST_TWIN(
            cpu=_within(_float(d.get("cpu")), 0.0, 100.0),
            cpus=_count(d.get("cpus")),
            mem_total=_count(d.get("mem_total")),
            mem_available=_count(d.get("mem_available")),
            load=tuple(x for x in load[:3] if 0.0 <= x <= 1e9),
            net_rx=_within(_float(d.get("net_rx")), 0.0, 1e15),
            net_tx=_within(_float(d.get("net_tx")), 0.0, 1e15),
        )
        obj.__class__ = HostSample
        return obj

    @property
    def mem_used(self) -> int | None:
        """Bytes in use (total less available), or None."""
        if self.mem_total is None or self.mem_available is None:
            return None
        return max(0, self.mem_total - self.mem_available)


_HOST_TWIN = _twin(HostSample)


@dataclass(frozen=True, slots=True)
class GpuStatic:
    """Facts about a GPU that do not change while the agent runs."""

    index: int
    uuid: str | None = None
    name: str | None = None
    mem_total: int | None = None
    power_limit: float | None = None
    max_sm_clock: int | None = None
    max_mem_clock: int | None = None
    pcie_gen: int | None = None
    pcie_width: int | None = None
    mig_mode: bool | None = None
    serial: str | None = None

    @classmethod
    def from_wire(cls, d: object, position: int = 0) -> GpuStatic:
        """Build from a hello's GPU dict; ``position`` stands in for a missing index."""
        d = d if isinstance(d, dict) else {}
        index = _int(d.get("index"))
        return cls(
            index=position if index is None else index,
            uuid=_str(d.get("uuid")),
            name=_str(d.get("name")),
            mem_total=_int(d.get("mem_total")),
            power_limit=_float(d.get("power_limit")),
            max_sm_clock=_int(d.get("max_sm_clock")),
            max_mem_clock=_int(d.get("max_mem_clock")),
            pcie_gen=_int(d.get("pcie_gen")),
            pcie_width=_int(d.get("pcie_width")),
            mig_mode=_bool(d.get("mig_mode")),
            serial=_str(d.get("serial")),
        )


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One reading of one GPU at time ``t`` (unix seconds)."""

    index: int
    t: float
    uuid: str | None = None
    lost: bool = False
    util_gpu: int | None = None
    util_mem: int | None = None
    mem_used: int | None = None
    mem_total: int | None = None
    temp: int | None = None
    power: float | None = None
    power_limit: float | None = None
    sm_clock: int | None = None
    mem_clock: int | None = None
    fan: int | None = None
    pstate: str | None = None
    throttle: tuple[str, ...] | None = None
    ecc: Mapping[str, Any] | None = None
    retired_pages: Mapping[str, Any] | None = None
    remapped_rows: Mapping[str, Any] | None = None
    # A tuple, or from a node a WireProcesses (read when first looked into; equal to the tuple).
    processes: Sequence[GpuProcess] = ()

    @classmethod
    def from_wire(cls, d: object, t: float, position: int = 0) -> GpuSample:
        """Build from a sample's GPU dict; bad fields become None, never an exception."""
        d = d if isinstance(d, dict) else {}
        index = _int(d.get("index"))
        throttle = d.get("throttle")
        procs = d.get("processes")
        obj = _SAMPLE_TWIN(
            index=position if index is None else index,
            t=t,
            uuid=_str(d.get("uuid")),
            lost=d.get("state") == "lost",
            util_gpu=_int(d.get("util_gpu")),
            util_mem=_int(d.get("util_mem")),
            mem_used=_int(d.get("mem_used")),
            mem_total=_int(d.get("mem_total")),
            temp=_int(d.get("temp")),
            power=_float(d.get("power")),
            power_limit=_float(d.get("power_limit")),
            sm_clock=_int(d.get("sm_clock")),
            mem_clock=_int(d.get("mem_clock")),
            fan=_int(d.get("fan")),
            pstate=_str(d.get("pstate")),
            throttle=tuple(x for x in throttle if isinstance(x, str))
            if isinstance(throttle, list)
            else None,
            ecc=_counts(d.get("ecc")),
            retired_pages=_counts(d.get("retired_pages")),
            remapped_rows=_counts(d.get("remapped_rows")),
            processes=WireProcesses(procs) if isinstance(procs, list) and procs else (),
        )
        obj.__class__ = GpuSample
        return obj

    def to_dict(self) -> dict[str, Any]:
        """The sample as plain JSON-able data (the wire names, ``state`` instead of ``lost``)."""
        return {
            "index": self.index,
            "uuid": self.uuid,
            "state": "lost" if self.lost else "ok",
            "util_gpu": self.util_gpu,
            "util_mem": self.util_mem,
            "mem_used": self.mem_used,
            "mem_total": self.mem_total,
            "temp": self.temp,
            "power": self.power,
            "power_limit": self.power_limit,
            "sm_clock": self.sm_clock,
            "mem_clock": self.mem_clock,
            "fan": self.fan,
            "pstate": self.pstate,
            "throttle": list(self.throttle) if self.throttle is not None else None,
            "ecc": dict(self.ecc) if self.ecc is not None else None,
            "retired_pages": dict(self.retired_pages) if self.retired_pages is not None else None,
            "remapped_rows": dict(self.remapped_rows) if self.remapped_rows is not None else None,
            "processes": [p.to_dict() for p in self.processes],
        }


_SAMPLE_TWIN = _twin(GpuSample)


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """What a node's agent said about itself in its hello."""

    hostname: str | None = None
    protocol: int | None = None
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

    @classmethod
    def from_hello(cls, d: Mapping[str, Any]) -> NodeInfo:
        """Build from a hello message; bad fields become None."""
        gpus = d.get("gpus")
        feats = d.get("features")
        return cls(
            hostname=_str(d.get("hostname")),
            protocol=_int(d.get("protocol")),
            agent=_str(d.get("agent")),
            python=_str(d.get("python")),
            reader=_str(d.get("reader")),
            reader_error=_str(d.get("reader_error")),
            bindings=_str(d.get("bindings")),
            driver=_str(d.get("driver")),
            cuda=_str(d.get("cuda")),
            nvml=_str(d.get("nvml")),
            features=tuple(f for f in feats if isinstance(f, str))
            if isinstance(feats, list)
            else (),
            gpus=tuple(GpuStatic.from_wire(g, i) for i, g in enumerate(gpus))
            if isinstance(gpus, list)
            else (),
        )


@dataclass(frozen=True, slots=True)
class NodeEvent:
    """Something that happened on a node: an XID, a lost GPU, a burn that ended."""

    t: float
    kind: str
    gpu: int | None = None
    detail: Mapping[str, Any] = field(default_factory=dict)


class OwnerWire(TypedDict):
    """Who started a burn, as the protocol carries it (``gpuctl.service.Owner`` reads it)."""

    user: str
    host: str
    session: str


class BurnState(TypedDict, total=False):
    """A burn on one GPU: the agent's ``burn`` event detail, kept as the GPU's ``burn``
    annotation, which the TUI and the CLI read.

    ``state``: "starting" | "running" | "stopping" | "done" | "failed"; ``ends_at`` unix time;
    ``verdict``: "OK" | "FAULTY" | "DIED" | None; ``reason`` why it ended; ``owner`` the gpuctl
    session that started it (None: a burner no gpuctl marked); the rest is what the burner
    reports (rates in TFLOP/s, ``elapsed`` in s, ``temp`` in C, ``message`` a start-up line).
    """

    state: str
    engine: str | None
    ends_at: float | None
    dtype: str | None
    verdict: str | None
    reason: str | None
    pid: int | None
    owner: OwnerWire | None
    tflops: float | None
    tflops_mean: float | None
    errors: int | None
    iterations: float | None
    elapsed: float | None
    size: int | None
    duty: float | None
    temp: float | None
    name: str | None
    message: str | None


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
