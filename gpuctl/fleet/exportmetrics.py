"""What ``gpuctl export`` exposes: its metric families, each declared once, in the order of the
exposition (``FAMILIES``), and how each per-GPU gauge reads a sample (``METRICS``).

GPU metrics carry the labels ``node``, ``gpu``, ``uuid`` and ``model``; where DCGM exporter has a
metric for the same reading, the name and unit are DCGM exporter's (``DCGM_FI_DEV_GPU_UTIL`` in %,
``DCGM_FI_DEV_FB_USED`` in MiB, ...) so that dashboards made for it work; the rest are
``gpuctl_*``. ``METRICS`` is made from the metric registry (``gpuctl/node/metrics.py``: each
reading with a DCGM name) and what is derived from readings (free memory, throttle bits, ECC
counts); the README's metrics table is the registry's (``gpuctl.metrics_table``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter

from gpuctl.core.model import GpuSample
from gpuctl.node.metrics import METRICS as REGISTRY
from gpuctl.node.metrics import Metric
from gpuctl.node.protocol import THROTTLE_REASONS

GPU_LABELS = ("node", "gpu", "uuid", "model")
MIB = 1 << 20
XID_MAX = 255  # XIDs are small positive integers: NVIDIA's catalogue stays below 256
XIDS_PER_GPU = 32  # distinct XIDs counted per GPU (a failing GPU shows a handful)


@dataclass(frozen=True)
class GpuMetric:
    """One per-GPU gauge: its name, help, unit and how to read it from a sample."""

    name: str
    help: str
    read: Callable[[GpuSample], float | int | None]
    dcgm: bool = True  # the name is DCGM exporter's


def _mib(v: int | None) -> float | None:
    return None if v is None else v / MIB


def _free(g: GpuSample) -> float | None:
    if g.mem_total is None or g.mem_used is None:
        return None
    return (g.mem_total - g.mem_used) / MIB


def _count(table: str, key: str) -> Callable[[GpuSample], float | int | None]:
    get = attrgetter(table)

    def read(g: GpuSample) -> float | int | None:
        counts = get(g)
        if counts is None:
            return None
        v = counts.get(key)
        if type(v) is int or type(v) is float:  # what JSON gives: exact types are cheap
            return v
        if isinstance(v, bool):
            return int(v)
        return v if isinstance(v, (int, float)) else None

    return read


_THROTTLE_BITS = {name: bit for bit, name in THROTTLE_REASONS}


def _throttle_mask(g: GpuSample) -> int | None:
    reasons = g.throttle
    if reasons is None:
        return None
    if not reasons:
        return 0  # most samples
    return sum(_THROTTLE_BITS.get(name, 0) for name in set(reasons))


_PSTATES = {f"P{n}": n for n in range(16)}


def _pstate(g: GpuSample) -> int | None:
    p = g.pstate
    if p is None:
        return None
    n = _PSTATES.get(p)
    if n is not None or not p.startswith("P") or not p[1:].isdigit():
        return n
    return int(p[1:])


# Help and reading of a registry row whose DCGM value is not its wire value times a scale.
_SPECIAL: dict[str, tuple[str, Callable[[GpuSample], float | int | None]]] = {
    "pstate": ("Performance state, 0 = highest.", _pstate),
}


def _scaled(key: str, scale: float) -> Callable[[GpuSample], float | int | None]:
    get = attrgetter(key)
    if scale == 1.0:
        return get

    def read(g: GpuSample) -> float | None:
        v = get(g)
        return None if v is None else v * scale

    return read


def _from_registry(m: Metric) -> GpuMetric:
    """A registry row's gauge: DCGM exporter's name, in DCGM's unit (MiB for memory)."""
    assert m.dcgm is not None
    special = _SPECIAL.get(m.key)
    if special is not None:
        return GpuMetric(m.dcgm, special[0], special[1])
    unit = "MiB" if m.dcgm_scale == 1 / MIB else m.unit
    return GpuMetric(
        m.dcgm, f"{m.what[:1].upper()}{m.what[1:]} (in {unit}).", _scaled(m.key, m.dcgm_scale)
    )


# The registry's readings with a DCGM name (``gpuctl/node/metrics.py``), then what is derived.
METRICS: tuple[GpuMetric, ...] = (
    *(_from_registry(m) for m in REGISTRY if m.dcgm),
    GpuMetric("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", _free),
    GpuMetric(
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        "Active clock throttle reasons as NVML's bitmask.",
        _throttle_mask,
    ),
    GpuMetric(
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "Corrected (single-bit) volatile ECC errors.",
        _count("ecc", "volatile_corrected"),
    ),
    GpuMetric(
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "Uncorrected (double-bit) volatile ECC errors.",
        _count("ecc", "volatile_uncorrected"),
    ),
    GpuMetric(
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        "Corrected (single-bit) aggregate ECC errors.",
        _count("ecc", "aggregate_corrected"),
    ),
    GpuMetric(
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "Uncorrected (double-bit) aggregate ECC errors.",
        _count("ecc", "aggregate_uncorrected"),
    ),
    GpuMetric(
        "DCGM_FI_DEV_RETIRED_SBE",
        "Pages retired for single-bit errors.",
        _count("retired_pages", "single_bit"),
    ),
    GpuMetric(
        "DCGM_FI_DEV_RETIRED_DBE",
        "Pages retired for double-bit errors.",
        _count("retired_pages", "double_bit"),
    ),
    GpuMetric(
        "DCGM_FI_DEV_RETIRED_PENDING",
        "1 when pages are pending retirement.",
        _count("retired_pages", "pending"),
    ),
    GpuMetric(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "Rows remapped for correctable errors.",
        _count("remapped_rows", "correctable"),
    ),
    GpuMetric(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "Rows remapped for uncorrectable errors.",
        _count("remapped_rows", "uncorrectable"),
    ),
    GpuMetric(
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
        "1 when a row remapping is pending (reset the GPU).",
        _count("remapped_rows", "pending"),
    ),
    GpuMetric(
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "1 when row remapping has failed.",
        _count("remapped_rows", "failure"),
    ),
    GpuMetric("gpuctl_gpu_lost", "1 when the GPU fell off the bus.", lambda g: int(g.lost), False),
)


# -- the families --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Family:
    name: str  # the OpenMetrics family name
    help: str
    kind: str  # gauge | counter | info | stateset

    def header(self, openmetrics: bool) -> str:
        """HELP and TYPE lines; Prometheus text names counters ``_total`` and info ``_info``,
        and has gauges where OpenMetrics has info and stateset (as prometheus-client wrote)."""
        name, kind = self.name, self.kind
        if not openmetrics:
            if kind == "counter":
                name += "_total"
            elif kind == "info":
                name, kind = name + "_info", "gauge"
            elif kind == "stateset":
                kind = "gauge"
        text = self.help.replace("\\", "\\\\").replace("\n", "\\n")
        return f"# HELP {name} {text}\n# TYPE {name} {kind}\n"


# A family's lines are kept under its name, never its position: FAMILIES alone says the order
# of the exposition, and a family put in between moves no line under another's header.
F_UP = "gpuctl_node_up"
F_STATE = "gpuctl_node_state"
F_AGE = "gpuctl_node_last_sample_age_seconds"  # written per scrape (FleetExporter._ages)
F_IDLE = "gpuctl_gpu_allocated_idle_seconds"  # per scrape too, beside the ages
PER_SCRAPE = (F_AGE, F_IDLE)  # written at each scrape (they change with time, not samples)
F_INFO = "gpuctl_node"
F_THROTTLE = "gpuctl_gpu_throttle_reason"
F_XID_LAST = "DCGM_FI_DEV_XID_ERRORS"
F_XID = "gpuctl_gpu_xid_errors"
F_BURNING = "gpuctl_gpu_burning"
F_SLURM = "gpuctl_gpu_slurm_job"
F_REFUSED = "gpuctl_node_xid_events_refused"
_NODE_FAMILIES = (
    Family(F_UP, "1 while the node's link is live and its samples current.", "gauge"),
    Family(F_STATE, "Where the node's link stands.", "stateset"),
    Family(F_AGE, "Seconds since the node's newest sample.", "gauge"),
    Family(
        F_IDLE,
        "Seconds a GPU of a running Slurm job (job, user) has been idle (utilization and memory "
        "traffic at or below [fleet] idle_below %); 0 while busy.",
        "gauge",
    ),
    Family(F_INFO, "What the node's agent said in its hello.", "info"),
)
_GPU_FAMILIES = (
    *(Family(m.name, m.help, "gauge") for m in METRICS),
    Family(F_THROTTLE, "1 when a clock throttle reason is active, per reason.", "gauge"),
    Family(F_XID_LAST, "Value of the last XID error seen (0: none since gpuctl started).", "gauge"),
    Family(F_XID, "XID errors seen since gpuctl started, per XID.", "counter"),
    Family(F_BURNING, "1 while a gpuctl burn runs on the GPU.", "gauge"),
    Family(F_SLURM, "The Slurm job that holds the GPU (job), and its user.", "info"),
    Family(
        F_REFUSED,
        f"XID events not counted: for a GPU the hello did not name, outside 1..{XID_MAX}, or "
        f"past {XIDS_PER_GPU} distinct XIDs on one GPU.",
        "counter",
    ),
)
FAMILIES = (*_NODE_FAMILIES, *_GPU_FAMILIES)
