"""The Prometheus reader's queries (``gpuctl.fleet.prom``): the DCGM exporter metrics read
(``METRICS``; the registry's gauges and the counters of a sample's tables), which of them are
slow (``SLOW``: asked at each host's turn), and the PromQL of a poll (``queries``: the stamp
query, one query per metric for all GPUs ``max by`` the labels used, MIG instances' own),
of a set of hosts by name (``hosts_matcher``) and of the history (``per_gpu``, ``mig_query``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuctl.fleet.prommig import MIG_ID, MIG_PROFILE, MIG_SUMMED, MIG_UTIL
from gpuctl.fleet.promwire import DRIVER_LABEL, HOST_LABELS, JOB_LABEL, MODEL_LABELS, UUID_LABELS
from gpuctl.node.metrics import METRICS as REGISTRY

PREFIX = "DCGM_FI_DEV_"


# -- what is read -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Metric:
    """One DCGM exporter metric (or several names for one reading) and where it goes in a
    sample's GPU dict: ``key``, or ``table``.``key`` for the ECC and row-remap counters."""

    names: tuple[str, ...]
    key: str
    table: str | None = None
    integer: bool = True

    @property
    def label(self) -> str:
        return " or ".join(n.removeprefix(PREFIX) for n in self.names)


# The registry's plain gauges (``gpuctl/node/metrics.py``): DCGM's value is the wire's.
GAUGES = {
    m.key: Metric((m.dcgm,), m.key, integer=m.kind == "int")
    for m in REGISTRY
    if m.dcgm and m.dcgm_scale == 1.0 and m.kind != "str"
}
UTIL = GAUGES["util_gpu"]
XID = Metric(("DCGM_FI_DEV_XID_ERRORS",), "xid")
# A MIG instance's utilisation (``mig_query``): not in METRICS, as a GPU not in MIG mode has
# none and misses nothing
MIG = Metric((MIG_UTIL,), UTIL.key)
METRICS: tuple[Metric, ...] = (
    *GAUGES.values(),
    Metric(("DCGM_FI_DEV_FB_USED",), "fb_used", integer=False),
    Metric(("DCGM_FI_DEV_FB_FREE",), "fb_free", integer=False),
    Metric(("DCGM_FI_DEV_FB_RESERVED",), "fb_reserved", integer=False),
    Metric(("DCGM_FI_DEV_PSTATE",), "pstate"),
    # DCGM 3.3 renamed the throttle reasons "clock events"; either name, NVML's bitmask
    Metric(("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"), "throttle"),
    XID,
    Metric(("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",), "volatile_corrected", "ecc"),
    Metric(("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",), "volatile_uncorrected", "ecc"),
    Metric(("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",), "aggregate_corrected", "ecc"),
    Metric(("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",), "aggregate_uncorrected", "ecc"),
    Metric(("DCGM_FI_DEV_RETIRED_SBE",), "single_bit", "retired_pages"),
    Metric(("DCGM_FI_DEV_RETIRED_DBE",), "double_bit", "retired_pages"),
    Metric(("DCGM_FI_DEV_RETIRED_PENDING",), "pending", "retired_pages"),
    Metric(("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",), "correctable", "remapped_rows"),
    Metric(("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",), "uncorrectable", "remapped_rows"),
    Metric(("DCGM_FI_DEV_ROW_REMAP_PENDING",), "pending", "remapped_rows"),
    Metric(("DCGM_FI_DEV_ROW_REMAP_FAILURE",), "failure", "remapped_rows"),
)
# Counters and limits that change seldom (ECC, retired pages, row remapping, the reserved
# memory, the power limit): a host's are asked at every ``SLOW_EVERY``-th of its new samples
# (each host at its own turn, so every poll asks them for a share of the moved hosts, not all
# of them every Nth poll), and between two asks its last values stand. At 16,384 GPUs over a
# 15 s scrape, a 5 s poll asked 29 metric queries; now 16 for the moved hosts and 13 for a
# quarter of them (figures: the README's Prometheus scale section).
SLOW: frozenset[Metric] = frozenset(
    m for m in METRICS if m.table is not None or m.key in ("fb_reserved", "power_limit")
)


def _selector(names: tuple[str, ...], matchers: str) -> str:
    if len(names) == 1:
        return f"{names[0]}{{{matchers}}}"
    alternatives = "|".join(names)
    extra = f", {matchers}" if matchers else ""
    return f'{{__name__=~"{alternatives}"{extra}}}'


def _mig_selector(matchers: str) -> str:
    """A MIG instance's utilisation series (GR_ENGINE_ACTIVE of the series with an instance
    id: a GPU not in MIG mode keeps its GPU_UTIL)."""
    instance = MIG_ID + '!=""'
    return f"{MIG_UTIL}{{{', '.join(m for m in (matchers, instance) if m)}}}"


def stamp_query(matchers: str, *, first_gpu: bool = False) -> str:
    """Each host's newest sample time (the utilisation's ``timestamp()``, ``max`` per host;
    a MIG instance's GR_ENGINE_ACTIVE for a host that has no GPU_UTIL), every host label
    kept: a poll's first query, small (a series per host; the ``or`` joins two of those).
    With ``first_gpu``, of GPU 0 only: an exporter writes all of a host's GPUs in one
    scrape, so one GPU's time is the host's, and Prometheus reads 1/8 of the series (see
    ``_stamp``)."""
    if first_gpu:
        matchers = ", ".join(m for m in ('gpu="0"', matchers) if m)
    by = f"max by ({', '.join(HOST_LABELS)})"
    util = _selector(UTIL.names, matchers)
    return f"{by} (timestamp({util})) or {by} (timestamp({_mig_selector(matchers)}))"


def mig_query(matchers: str, by: str) -> str:
    """Each MIG instance's utilisation (GR_ENGINE_ACTIVE in %; ``group`` weighs a GPU's), a
    query of its own: joined to the GPU_UTIL query by ``or``, 8,192 GPUs' answer took the
    store 139 ms instead of 55 ms; alone it takes 1.6 ms at a site without MIG, and the stamp
    and memory queries' MIG forms 0.91x to 1.09x the old ones'
    (``benchmarks/prom_query_forms.py --nodes 1024 --rounds 20``, medians)."""
    return f"max by ({by}, {MIG_PROFILE}, {MIG_ID}) (100 * {_mig_selector(matchers)})"


def per_gpu(names: tuple[str, ...], matchers: str, by: str, *, instances: bool = False) -> str:
    """The query of one metric per GPU, ``by`` these labels: the ``max`` of its series (one
    per Slurm job on the GPU with ``hpc_job``), a MIG GPU's memory summed over its instances
    (their utilisation: ``mig_query``); with ``instances``, a MIG GPU's memory per instance
    (``group`` sums them and keeps each: the detail screen lists them). A GPU not in MIG mode
    has no instance label: one series either way, and the store's time the same (8,192 GPUs,
    no MIG, medians of 15 alternated asks against the summed form: FB_USED 0.84x, FB_FREE
    1.10x, FB_RESERVED 0.97x; ``benchmarks/prom_query_forms.py --baseline OLD --nodes 1024
    --rounds 15``)."""
    if names[0] in MIG_SUMMED:
        each = f"max by ({by}, {MIG_ID}) ({_selector(names, matchers)})"
        return each if instances else f"sum by ({by}) ({each})"
    return f"max by ({by}) ({_selector(names, matchers)})"


def queries(
    matchers: str, host_labels: tuple[str, ...] = HOST_LABELS
) -> list[tuple[Metric | None, str]]:
    """The instant queries of one poll: (metric, PromQL); the metric None is the sample-time
    query. Each keeps only the labels it needs (``max by``): ``host_labels``, the labels that
    name the hosts (``instance`` is on every series: kept when not needed it made each series
    of an answer a third longer, for Prometheus to write and gpuctl to decode)."""
    hosts = ", ".join(host_labels)
    statics = ", ".join((*UUID_LABELS, *MODEL_LABELS, DRIVER_LABEL))
    out: list[tuple[Metric | None, str]] = [(None, stamp_query(matchers))]
    for m in METRICS:
        by = f"{hosts}, gpu, {statics}, {JOB_LABEL}" if m is UTIL else f"{hosts}, gpu"
        out.append((m, per_gpu(m.names, matchers, by, instances=True)))
    out.append((MIG, mig_query(matchers, f"{hosts}, gpu, {statics}, {JOB_LABEL}")))
    return out


_REGEX_SPECIAL = re.compile(r"([\\.+*?()|\[\]{}^$])")


def hosts_matcher(label: str, hosts: list[str]) -> str | None:
    """A matcher for exactly ``hosts`` by ``label`` (a set of literals: Prometheus looks each
    up in its index, no regex scan), or None where a name cannot be written in one."""
    if not hosts or any("`" in h for h in hosts):
        return None
    alternatives = "|".join(_REGEX_SPECIAL.sub(r"\\\1", h) for h in hosts)
    return f"{label}=~`{alternatives}`"
