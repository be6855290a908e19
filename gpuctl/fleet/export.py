"""The fleet as one Prometheus / OpenMetrics endpoint: ``gpuctl export``.

``FleetCollector`` is a prometheus-client collector that reads the fleet's current snapshots at
scrape time, so a scrape costs nothing between scrapes and always shows the newest sample. GPU
metrics carry the labels ``node``, ``gpu``, ``uuid`` and ``model``; where DCGM exporter has a
metric for the same reading, the name and unit are DCGM exporter's (``DCGM_FI_DEV_GPU_UTIL`` in %,
``DCGM_FI_DEV_FB_USED`` in MiB, ...) so that dashboards made for it work; the rest are
``gpuctl_*``. ``METRICS`` is the table the README shows.

Threads: the HTTP server answers in its own threads while the fleet runs on the event loop. The
collector only reads: each node's snapshot is an immutable value that the loop replaces whole,
and the XID counts are copied under a lock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
    StateSetMetricFamily,
)
from prometheus_client.registry import Collector, CollectorRegistry

from gpuctl.core.model import GpuSample, NodeEvent, NodeSnapshot, NodeState
from gpuctl.fleet.fleet import Fleet
from gpuctl.node.protocol import THROTTLE_REASONS

DEFAULT_LISTEN = "127.0.0.1:9400"  # DCGM exporter's port: the scrape config stays the same
GPU_LABELS = ("node", "gpu", "uuid", "model")
MIB = 1 << 20


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
    def read(g: GpuSample) -> float | int | None:
        counts = getattr(g, table)
        v = counts.get(key) if counts is not None else None
        if isinstance(v, bool):
            return int(v)
        return v if isinstance(v, int | float) else None

    return read


def _throttle_mask(g: GpuSample) -> int | None:
    if g.throttle is None:
        return None
    return sum(bit for bit, name in THROTTLE_REASONS if name in g.throttle)


def _pstate(g: GpuSample) -> int | None:
    p = g.pstate
    if p is None or not p.startswith("P") or not p[1:].isdigit():
        return None
    return int(p[1:])


METRICS: tuple[GpuMetric, ...] = (
    GpuMetric("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda g: g.util_gpu),
    GpuMetric(
        "DCGM_FI_DEV_MEM_COPY_UTIL", "Memory (copy) utilization (in %).", lambda g: g.util_mem
    ),
    GpuMetric(
        "DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", lambda g: _mib(g.mem_used)
    ),
    GpuMetric("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", _free),
    GpuMetric(
        "DCGM_FI_DEV_FB_TOTAL", "Framebuffer memory total (in MiB).", lambda g: _mib(g.mem_total)
    ),
    GpuMetric("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", lambda g: g.temp),
    GpuMetric("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda g: g.power),
    GpuMetric("DCGM_FI_DEV_POWER_MGMT_LIMIT", "Power limit (in W).", lambda g: g.power_limit),
    GpuMetric("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", lambda g: g.sm_clock),
    GpuMetric("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", lambda g: g.mem_clock),
    GpuMetric("DCGM_FI_DEV_FAN_SPEED", "Fan speed (in %).", lambda g: g.fan),
    GpuMetric("DCGM_FI_DEV_PSTATE", "Performance state, 0 = highest.", _pstate),
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


class XidCounts:
    """XIDs seen per (node, GPU) since gpuctl started, kept from the fleet's events."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, int, int], int] = {}  # (node, gpu, xid) -> count
        self._last: dict[tuple[str, int], int] = {}  # (node, gpu) -> last xid

    def on_event(self, node: str, event: NodeEvent) -> None:
        """A fleet event listener (``Fleet.on_event``): counts ``xid`` events."""
        xid = event.detail.get("xid")
        if event.kind != "xid" or event.gpu is None or isinstance(xid, bool):
            return
        if not isinstance(xid, int):
            return
        with self._lock:
            key = (node, event.gpu, xid)
            self._counts[key] = self._counts.get(key, 0) + 1
            self._last[(node, event.gpu)] = xid

    def copy(self) -> tuple[dict[tuple[str, int, int], int], dict[tuple[str, int], int]]:
        """The counts and the last XID per GPU, as of now."""
        with self._lock:
            return dict(self._counts), dict(self._last)


class FleetCollector(Collector):
    """Reads ``fleet``'s snapshots at each scrape and yields the metric families."""

    def __init__(self, fleet: Fleet, *, clock: Callable[[], float] = time.time) -> None:
        self.fleet = fleet
        self.clock = clock
        self.xids = XidCounts()
        fleet.on_event(self.xids.on_event)

    def collect(self) -> Iterator[Metric]:
        """Yield every family for the fleet as it is now (called by the HTTP thread)."""
        now = self.clock()
        snaps = self.fleet.snapshots()
        xid_counts, last_xid = self.xids.copy()
        yield from self._nodes(snaps, now)
        gauges = {m.name: GaugeMetricFamily(m.name, m.help, labels=GPU_LABELS) for m in METRICS}
        throttle = GaugeMetricFamily(
            "gpuctl_gpu_throttle_reason",
            "1 when a clock throttle reason is active, per reason.",
            labels=(*GPU_LABELS, "reason"),
        )
        last = GaugeMetricFamily(
            "DCGM_FI_DEV_XID_ERRORS",
            "Value of the last XID error seen (0: none since gpuctl started).",
            labels=GPU_LABELS,
        )
        xids = CounterMetricFamily(
            "gpuctl_gpu_xid_errors",
            "XID errors seen since gpuctl started, per XID.",
            labels=(*GPU_LABELS, "xid"),
        )
        burning = GaugeMetricFamily(
            "gpuctl_gpu_burning", "1 while a gpuctl burn runs on the GPU.", labels=GPU_LABELS
        )
        slurm = InfoMetricFamily(
            "gpuctl_gpu_slurm_job",
            "The Slurm job that holds the GPU (job), and its user.",
            labels=GPU_LABELS,
        )
        for s in snaps:
            if s.state is not NodeState.LIVE:
                continue  # no GPU values for a node whose values are not current
            models = {st.index: st for st in s.info.gpus} if s.info is not None else {}
            for g in s.gpus:
                st = models.get(g.index)
                labels = [
                    s.name,
                    str(g.index),
                    g.uuid or (st.uuid if st is not None else None) or "",
                    (st.name if st is not None else None) or "",
                ]
                # One label dict shared by the GPU's samples (read only): at 4,096 GPUs a dict
                # per sample is a third of the scrape.
                shared = dict(zip(GPU_LABELS, labels, strict=True))
                for m in METRICS:
                    value = m.read(g)
                    if value is not None:
                        gauges[m.name].add_sample(m.name, shared, float(value))
                if g.throttle is not None:
                    active = set(g.throttle)
                    for _bit, reason in THROTTLE_REASONS:
                        throttle.add_sample(
                            throttle.name, {**shared, "reason": reason}, float(reason in active)
                        )
                last.add_sample(last.name, shared, float(last_xid.get((s.name, g.index), 0)))
                burning.add_sample(burning.name, shared, float(s.burning(g.index)))
                notes = s.annotations.get(g.index, {})
                job = notes.get("slurm_job")
                if job is not None:
                    slurm.add_metric(labels, {"job": job, "user": notes.get("slurm_user") or ""})
            for (node, gpu, xid), n in sorted(xid_counts.items()):
                if node == s.name:
                    st = models.get(gpu)
                    uuid = st.uuid if st is not None and st.uuid else ""
                    model = st.name if st is not None and st.name else ""
                    xids.add_metric([node, str(gpu), uuid, model, str(xid)], float(n))
        yield from gauges.values()
        yield from (throttle, last, xids, burning, slurm)

    def _nodes(self, snaps: list[NodeSnapshot], now: float) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "gpuctl_node_up",
            "1 while the node's link is live and its samples current.",
            labels=("node", "link"),
        )
        state = StateSetMetricFamily(
            "gpuctl_node_state", "Where the node's link stands.", labels=("node",)
        )
        age = GaugeMetricFamily(
            "gpuctl_node_last_sample_age_seconds",
            "Seconds since the node's newest sample.",
            labels=("node",),
        )
        info = InfoMetricFamily(
            "gpuctl_node",
            "What the node's agent said in its hello.",
            labels=("node", "hostname", "driver", "cuda", "reader"),
        )
        for s in snaps:
            up.add_metric([s.name, s.link], float(s.state is NodeState.LIVE))
            state.add_metric([s.name], {st.value: s.state is st for st in NodeState})
            a = s.age(now)
            if a is not None:
                age.add_metric([s.name], a)
            if s.info is not None:
                i = s.info
                info.add_metric(
                    [s.name, i.hostname or "", i.driver or "", i.cuda or "", i.reader or ""], {}
                )
        yield from (up, state, age, info)


def registry_for(fleet: Fleet, **kwargs: Any) -> tuple[CollectorRegistry, FleetCollector]:
    """A registry holding only the fleet's collector (no process metrics of gpuctl's own)."""
    registry = CollectorRegistry(auto_describe=False)
    collector = FleetCollector(fleet, **kwargs)
    registry.register(collector)
    return registry, collector


class MetricsServer:
    """The HTTP endpoint (``/metrics``, any path in fact) in daemon threads of this process."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        """Bind and start serving; raises OSError when the address cannot be bound."""
        from prometheus_client import start_http_server

        self.httpd, self.thread = start_http_server(port, addr=host, registry=registry)
        self.host = host

    @property
    def port(self) -> int:
        """The bound port (the one the system chose for port 0)."""
        return int(self.httpd.server_address[1])

    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and release the socket."""
        self.httpd.shutdown()
        self.httpd.server_close()
