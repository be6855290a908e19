"""Human formatting of samples, shared by the CLI tables and the TUI: no I/O."""

from __future__ import annotations

from gpuctl.core.model import GpuSample, HostSample, NodeInfo, NodeSnapshot
from gpuctl.node import metrics

# The badge of each throttle reason and their one order are the node side's (the acceptance
# suite's lines say them too), named here for the screens.
from gpuctl.node.metrics import THROTTLE_BADGES as THROTTLE_BADGES
from gpuctl.node.metrics import throttle_order as throttle_order

GIB = 1 << 30


def fmt_bytes(n: int | None) -> str:
    """Bytes as GiB with one decimal ("12.3G"), or "-" when unknown."""
    return "-" if n is None else f"{n / GIB:.1f}G"


def fmt_opt(v: float | int | None, unit: str = "", digits: int = 0) -> str:
    """A number with a unit, or "-" when unknown."""
    return "-" if v is None else f"{v:.{digits}f}{unit}"


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """A count with its noun in the right number: "1 node", "3 nodes", "2 GPUs"."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def fmt_age(seconds: float) -> str:
    """A duration in its largest sensible unit: "45s", "12m", "3h"."""
    if seconds < 90:
        return f"{int(seconds)}s"
    if seconds < 5400:
        return f"{int(seconds // 60)}m"
    return f"{int(seconds // 3600)}h"


def fmt_rate(bytes_per_s: float) -> str:
    """A byte rate in its largest sensible unit: "12kB/s", "340MB/s", "1.2GB/s"."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if bytes_per_s >= size:
            value = bytes_per_s / size
            return f"{value:.1f}{unit}/s" if value < 10 else f"{value:.0f}{unit}/s"
    return f"{bytes_per_s:.0f}B/s"


def host_text(h: HostSample) -> str:
    """A node's host in one short line: "cpu 23% of 64  mem 120/503G  load 12.3  net ↓1.2GB/s
    ↑340MB/s"; what is unknown is left out ("" when nothing is known)."""
    parts = []
    if h.cpu is not None:
        parts.append(f"cpu {h.cpu:.0f}%" + (f" of {h.cpus}" if h.cpus else ""))
    if h.mem_total:
        used = h.mem_used
        parts.append(f"mem {'-' if used is None else f'{used / GIB:.0f}'}/{h.mem_total / GIB:.0f}G")
    if h.load:
        parts.append(f"load {h.load[0]:.1f}")
    if h.net_rx is not None or h.net_tx is not None:
        rx = "-" if h.net_rx is None else fmt_rate(h.net_rx)
        tx = "-" if h.net_tx is None else fmt_rate(h.net_tx)
        parts.append(f"net ↓{rx} ↑{tx}")
    return "  ".join(parts)


def short_model(name: str | None) -> str:
    """The model without the vendor: "NVIDIA H100 80GB HBM3" becomes "H100 80GB HBM3"."""
    if not name:
        return "?"
    for prefix in ("NVIDIA GeForce ", "NVIDIA ", "Tesla "):
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def reader_text(info: NodeInfo) -> str:
    """How a node reads its GPUs, and why when it is not NVML: "NVML, pynvml bundled 13.615.71",
    "nvidia-smi (NVML: nvmlInit failed: Driver Not Loaded)", "no GPU reader: ..."."""
    if info.reader == "nvml":
        return f"NVML, pynvml {info.bindings}" if info.bindings else "NVML"
    if info.reader is None:
        return "no GPU reader" + (f": {info.reader_error}" if info.reader_error else "")
    if info.reader_error:  # the fallback says why NVML is not used
        return f"{info.reader} ({info.reader_error})"
    return info.reader


# Throttle reasons that are no slowdown: an idle GPU clocks down, clocks set by hand.
QUIET_THROTTLE = frozenset({"gpu_idle", "applications_clocks", "display_clocks"})


def gpu_flags(g: GpuSample) -> list[str]:
    """Short badges for trouble on a GPU: lost, throttling, ECC, remapped rows."""
    flags: list[str] = []
    if g.lost:
        return ["LOST"]
    for reason in throttle_order(g.throttle or ()):
        if reason not in QUIET_THROTTLE:
            flags.append(reason)
    if g.ecc and (g.ecc.get("volatile_uncorrected") or g.ecc.get("aggregate_uncorrected")):
        flags.append("ECC")
    rr = g.remapped_rows
    if rr and (rr.get("pending") or rr.get("failure")):
        flags.append("REMAP")
    return flags


# What each badge means, for the detail screen and the help.
THROTTLE_WORDS = {
    "THERM": "thermal slowdown",
    "HWTHERM": "hardware thermal slowdown",
    "HWSLOW": "hardware slowdown",
    "PWRBRAKE": "power brake (the power supply asked)",
    "PWRCAP": "at its power cap",
    "SYNC": "held to its sync-boost group",
}


def gpu_badge_names(g: GpuSample) -> list[str]:
    """``gpu_flags`` with throttle reasons as the screen's badges (``PWRCAP``, ``THERM``)."""
    return [THROTTLE_BADGES.get(f, f.upper()) for f in gpu_flags(g)]


def gpu_users(g: GpuSample) -> str:
    """Who runs processes on the GPU: user names, comma separated, in order of first process."""
    users: list[str] = []
    for p in g.processes or ():
        if p.user and p.user not in users:
            users.append(p.user)
    return ",".join(users)


# The status table's readings: the registry's "status" metrics (gpuctl/node/metrics.py).
STATUS_METRICS = metrics.flagged("status")
STATUS_TITLES = tuple(m.title for m in STATUS_METRICS)


def reading_text(m: metrics.Metric, g: GpuSample) -> str:
    """A reading as status prints it ("45C", "1.2GB/s"), with its whole where it is a part of
    one ("12.3G/80.0G", "300W/700W"); "-" when unknown."""
    text = metrics.fmt(m, getattr(g, m.key))
    whole = metrics.PAIRED.get(m.key)
    if whole is None:
        return text
    return f"{text}/{metrics.fmt(metrics.BY_KEY[whole], getattr(g, whole))}"


def gpu_table_rows(s: NodeSnapshot) -> list[tuple[str, ...]]:
    """One text row per GPU: index, model, the ``STATUS_METRICS``, users, badges."""
    names = {g.index: g.name for g in s.info.gpus} if s.info else {}
    rows: list[tuple[str, ...]] = []
    for g in s.gpus:
        rows.append(
            (
                str(g.index),
                names.get(g.index) or "?",
                *(reading_text(m, g) for m in STATUS_METRICS),
                gpu_users(g),
                " ".join(gpu_badge_names(g)),
            )
        )
    return rows
