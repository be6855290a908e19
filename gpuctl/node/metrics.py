"""The GPU metric registry: one row per reading a sample carries for a GPU, read by both sides.

Python 3.6 syntax, standard library only: the node side imports it (``protocol.SAMPLE_FIELDS``,
the nvidia-smi reader's query), and so does the login side, which drives from it the decode
check (``GpuSample``'s fields are these keys: a test holds them equal), the Prometheus export
(``fleet/exportmetrics.py``: DCGM exporter's names and units), the Prometheus source
(``fleet/prom.py`` reads the same DCGM series back), the CSV columns
(``fleet/recording/csvexport.py``, by name), the history columns (``fleet/gpu_history.py``),
the filter words, sort keys and
heatmap metrics (``tui/view.py``, ``tui/gpusort.py``), the ``status`` table (``core/format.py``),
the detail screen's plots and the docs' metrics table (``python -m gpuctl.metrics_table
--write docs/metrics.md``; a test fails when the page's differs).

Units (one per reading, everywhere): the wire carries each reading in ``unit``; the screen,
``status`` and the filter show it in ``shown`` (the wire value times ``scale``). Memory: bytes
on the wire, GiB where a figure is shown (``mem_gib``), and the filter, sort and heatmap word
``mem`` is the part of the memory in use in % (``PERCENT_OF``: mem_used over mem_total), never a
0..1 fraction outside code. PCIe throughput: bytes/s on the wire (NVML answers KB/s, the reader
multiplies), GB/s on the screen, bytes/s in the export (DCGM's unit).

Adding a metric: a row here, its read in ``readers/nvml.py`` (and the stand-in library's
function in ``gpuctl_tests/node/nvml_stub``) and ``readers/sim.py`` (``readers/smi.py`` takes
``smi`` and the unit from here), the field in ``core/model.py``'s ``GpuSample`` (the decode stays
a msgspec Struct: a test holds its fields, types and bounds equal to these rows), and the
docs' table regenerated; with "plot", its line in ``tui/screens/detail.py``'s ``PLOTS`` (a
test says so); with "heatmap", its ``heat`` scale. Everything else follows from the flags:
NVENC/NVDEC took 5 product files (6 with the plot), where a metric took ~15 before.

Flags of a row (``flags``):
    list     a column of the GPU list where the width allows it (``tui/widgets/gpu_columns.py``'s
             ``COLUMNS``: in this order, from 190 columns unless placed there)
    filter   a threshold word of the ``/`` filter (``name``, in ``shown`` units)
    sort     a sort of the GPU list (``o``: ``tui/gpusort.py``'s ``SORTS``, largest first)
    heatmap  a metric of the heatmap (``m``): the share of the reading it is ``PAIRED`` with
             (memory of its total, power of its limit), else its place on ``heat``, a scale in
             the shown unit (temperature 30..90 C, PCIe 0..64 GB/s: PCIe 5.0 x16's one
             direction, the fastest link a GPU has; utilizations 0..100 %)
    plot     a plot of the detail screen (from the history column)
    csv      a column of ``replay --export-csv`` (named ``key``)
    status   a column of ``gpuctl status``
"""

from typing import Dict, FrozenSet, Iterable, List, NamedTuple, Optional, Sequence, Tuple, Union

Metric = NamedTuple("Metric", [
    ("key", str),      # the wire key in a sample's GPU dict (the GpuSample field, CSV column)
    ("name", str),     # the screen's word: filter, sort, heatmap, history column
    ("title", str),    # the column title (list, status)
    ("what", str),     # what it is, for people (README, export help)
    ("unit", str),     # the wire unit: "%", "bytes", "C", "W", "MHz", "bytes/s", "" (text)
    ("kind", str),     # the wire type: "int", "float" or "str" (GpuSample's field type)
    # bounds of a valid value in the wire unit (None: the type's own, a 64-bit integer or a
    # finite double); outside them a reading is junk: the login side keeps None (GpuSample's
    # Meta(ge, le): the lenient decode)
    ("lo", Optional[int]),
    ("hi", Optional[int]),
    ("nvml", str),     # how the NVML reader reads it (a pynvml call, for people)
    ("smi", Tuple[str, ...]),  # nvidia-smi --query-gpu fields that give it, newest first
    ("slow", bool),    # read every SLOW_READ_EVERY samples only: the call is costly
    ("dcgm", Optional[str]),  # DCGM exporter's field name it is exported as (None: not)
    ("dcgm_scale", float),  # the wire value times this is DCGM's unit (bytes -> MiB: 2**-20)
    ("shown", str),    # the unit on the screen, in status and in the filter
    ("scale", float),  # the wire value times this is the shown figure
    ("digits", int),   # decimals of the shown figure
    ("history", Optional[str]),  # array typecode of its history column (None: no history)
    ("flags", FrozenSet[str]),  # list, filter, sort, heatmap, plot, csv, status (docstring)
    # the heatmap's scale in the shown unit, (coldest, hottest) (None: a PAIRED share or no map)
    ("heat", Optional[Tuple[float, float]]),
])

MIB = 1 << 20
GIB = 1 << 30
_ALL = frozenset(("list", "filter", "sort", "heatmap", "plot", "csv", "status"))


# A reading shown with the one it is a part of, "used/total" (status: "12.3G/80.0G", "300W/700W"),
# and drawn on the heatmap as its share of it.
PAIRED = {"mem_used": "mem_total", "power": "power_limit"}

# Samples between two reads of a ``slow`` reading (each GPU's, spread over them by the reader):
# PCIe throughput costs 21 ms wall and 0.9 ms of CPU a counter on an H100 (the call measures a
# 20 ms window): every 10th sample it was 0.18 ms per GPU-sample on average, every 60th 0.03.
SLOW_READ_EVERY = 60

def _m(key, name, title, what, unit, lo, hi, nvml, smi, dcgm, dcgm_scale=1.0, shown=None,
       scale=1.0, digits=0, history=None, flags=(), slow=False, heat=None):
    # type: (str, str, str, str, str, Optional[int], Optional[int], str, Sequence[str], Optional[str], float, Optional[str], float, int, Optional[str], Sequence[str], bool, Optional[Tuple[float, float]]) -> Metric  # noqa: E501
    bad = set(flags) - _ALL
    if bad:
        raise ValueError("metric %s: unknown flags %s" % (key, sorted(bad)))
    kind = "str" if unit == "" else "float" if unit == "W" else "int"
    if "heatmap" in flags and heat is None and key not in PAIRED:
        raise ValueError("metric %s: a heatmap metric needs its heat scale" % key)
    return Metric(key, name, title, what, unit, kind, lo, hi, nvml, tuple(smi), slow, dcgm,
                  dcgm_scale, unit if shown is None else shown, scale, digits, history,
                  frozenset(flags), heat)


# In the order of the wire, the CSV and status. Percent readings are whole numbers.
METRICS = (
    _m("util_gpu", "util", "UTIL", "GPU utilization", "%", None, None,
       "nvmlDeviceGetUtilizationRates().gpu", ("utilization.gpu",),
       "DCGM_FI_DEV_GPU_UTIL", history="B", heat=(0, 100),
       flags=("list", "filter", "sort", "heatmap", "plot", "csv", "status")),
    _m("util_mem", "util_mem", "MEM UTIL", "memory (copy) utilization", "%", None, None,
       "nvmlDeviceGetUtilizationRates().memory", ("utilization.memory",),
       "DCGM_FI_DEV_MEM_COPY_UTIL", flags=("csv",)),
    _m("mem_used", "mem_gib", "MEMORY", "framebuffer memory used", "bytes", None, None,
       "nvmlDeviceGetMemoryInfo().used", ("memory.used",),
       "DCGM_FI_DEV_FB_USED", 1.0 / MIB, shown="GiB", scale=1.0 / GIB, digits=1, history="f",
       flags=("list", "filter", "sort", "heatmap", "plot", "csv", "status")),
    _m("mem_total", "mem_total", "MEM TOTAL", "framebuffer memory total", "bytes", None, None,
       "nvmlDeviceGetMemoryInfo().total", ("memory.total",),
       "DCGM_FI_DEV_FB_TOTAL", 1.0 / MIB, shown="GiB", scale=1.0 / GIB, digits=1,
       flags=("csv",)),
    _m("temp", "temp", "TEMP", "GPU temperature", "C", None, None,
       "nvmlDeviceGetTemperature(TEMPERATURE_GPU)", ("temperature.gpu",),
       "DCGM_FI_DEV_GPU_TEMP", history="B", heat=(30, 90),
       flags=("list", "filter", "sort", "heatmap", "plot", "csv", "status")),
    _m("power", "power", "POWER", "power draw", "W", None, None,
       "nvmlDeviceGetPowerUsage() / 1000", ("power.draw",),
       "DCGM_FI_DEV_POWER_USAGE", history="f",
       flags=("list", "filter", "sort", "heatmap", "plot", "csv", "status")),
    _m("power_limit", "power_limit", "POWER LIMIT", "power limit", "W", None, None,
       "nvmlDeviceGetEnforcedPowerLimit() / 1000", ("power.limit",),
       "DCGM_FI_DEV_POWER_MGMT_LIMIT", flags=("csv",)),
    _m("sm_clock", "clock", "SM MHz", "SM clock frequency", "MHz", None, None,
       "nvmlDeviceGetClockInfo(CLOCK_SM)", ("clocks.sm", "clocks.current.sm"),
       "DCGM_FI_DEV_SM_CLOCK", history="H",
       flags=("list", "filter", "plot", "csv", "status")),
    _m("mem_clock", "mem_clock", "MEM CLK", "memory clock frequency", "MHz", None, None,
       "nvmlDeviceGetClockInfo(CLOCK_MEM)", ("clocks.mem", "clocks.current.memory"),
       "DCGM_FI_DEV_MEM_CLOCK", history="H", flags=("filter", "plot", "csv")),
    _m("fan", "fan", "FAN", "fan speed", "%", None, None,
       "nvmlDeviceGetFanSpeed()", ("fan.speed",),
       "DCGM_FI_DEV_FAN_SPEED", flags=("list", "filter", "csv")),
    _m("pstate", "pstate", "PST", "performance state, P0 the fastest", "", None, None,
       "nvmlDeviceGetPerformanceState()", ("pstate",),
       "DCGM_FI_DEV_PSTATE", flags=("list", "csv")),
    _m("enc", "enc", "ENC", "video encoder (NVENC) utilization", "%", 0, 100,
       "nvmlDeviceGetEncoderUtilization()[0]", ("utilization.encoder",),
       "DCGM_FI_DEV_ENC_UTIL", history="B", heat=(0, 100),
       flags=("list", "filter", "sort", "heatmap", "plot", "csv", "status")),
    _m("dec", "dec", "DEC", "video decoder (NVDEC) utilization", "%", 0, 100,
       "nvmlDeviceGetDecoderUtilization()[0]", ("utilization.decoder",),
       "DCGM_FI_DEV_DEC_UTIL", history="B", heat=(0, 100),
       flags=("list", "filter", "sort", "heatmap", "plot", "csv", "status")),
    # NVML measures PCIe throughput over a 20 ms window inside the call: read it slowly.
    _m("pcie_tx", "pcie_tx", "PCIe TX", "PCIe transmit throughput (GPU to host)", "bytes/s",
       0, 10 ** 13, "nvmlDeviceGetPcieThroughput(PCIE_UTIL_TX_BYTES) * 1024 (KB/s)", (),
       "DCGM_FI_PROF_PCIE_TX_BYTES", shown="GB/s", scale=1e-9, digits=1, history="f",
       flags=("list", "filter", "sort", "heatmap", "plot", "csv", "status"), slow=True,
       heat=(0, 64)),
    _m("pcie_rx", "pcie_rx", "PCIe RX", "PCIe receive throughput (host to GPU)", "bytes/s",
       0, 10 ** 13, "nvmlDeviceGetPcieThroughput(PCIE_UTIL_RX_BYTES) * 1024 (KB/s)", (),
       "DCGM_FI_PROF_PCIE_RX_BYTES", shown="GB/s", scale=1e-9, digits=1, history="f",
       flags=("list", "filter", "sort", "heatmap", "plot", "csv", "status"), slow=True,
       heat=(0, 64)),
)

BY_KEY = dict((m.key, m) for m in METRICS)  # type: Dict[str, Metric]
BY_NAME = dict((m.name, m) for m in METRICS)  # type: Dict[str, Metric]
# A name shown as a share of another reading, in %: the screen's "mem" is mem_used of mem_total.
PERCENT_OF = {"mem": ("mem_used", "mem_total")}

# The wire's GPU dict: who it is, then the readings above, then the structured fields.
IDENTITY_FIELDS = ("index", "uuid", "state")
STRUCTURED_FIELDS = ("throttle", "ecc", "retired_pages", "remapped_rows", "processes", "mig")
SAMPLE_FIELDS = IDENTITY_FIELDS + tuple(m.key for m in METRICS) + STRUCTURED_FIELDS


def flagged(flag):
    # type: (str) -> Tuple[Metric, ...]
    """The metrics with ``flag``, in registry order."""
    return tuple(m for m in METRICS if flag in m.flags)


Value = Union[int, float, str, None]


def shown_value(metric, value):
    # type: (Metric, Value) -> Value
    """A wire value in the metric's shown unit (None stays None, text stays text)."""
    if value is None or isinstance(value, str) or metric.scale == 1.0:
        return value
    return value * metric.scale


def fmt(metric, value, suffix=True):
    # type: (Metric, Value, bool) -> str
    """The shown figure with its unit ("45C", "1.2GB/s", "P0"), or "-" when unknown."""
    v = shown_value(metric, value)
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    unit = metric.shown if suffix and not metric.title.endswith(metric.shown) else ""
    if unit == "GiB":
        unit = "G"  # the short form status and the list print
    return "%.*f%s" % (metric.digits, v, unit)


# Throttle reasons (``protocol.THROTTLE_REASONS`` decodes NVML's bits to them) as the screen
# names each (its badge), in the one order every screen and suite line shows them (THERM before
# PWRCAP): the one table of these names, ``core.format``'s too.
THROTTLE_BADGES = {
    "sw_thermal": "THERM",
    "hw_thermal": "HWTHERM",
    "hw_slowdown": "HWSLOW",
    "hw_power_brake": "PWRBRAKE",
    "sw_power_cap": "PWRCAP",
    "sync_boost": "SYNC",
}
_BADGE_RANK = {r: i for i, r in enumerate(("sw_thermal", "hw_thermal", "hw_slowdown",
                                           "hw_power_brake", "sw_power_cap", "sync_boost"))}


def throttle_order(reasons: Iterable[str]) -> List[str]:
    """Throttle reasons in the one order every screen shows them: THROTTLE_BADGES' (THERM
    before PWRCAP), unknown ones after, by name; readers and events list them as they come."""
    return sorted(reasons, key=lambda r: (_BADGE_RANK.get(r, len(_BADGE_RANK)), str(r)))


def throttle_badge(reason: str) -> str:
    """A throttle reason as the screen names it (``sw_thermal`` -> ``THERM``): the acceptance
    suite's lines and reasons say what the screen says."""
    return THROTTLE_BADGES.get(reason, str(reason).upper())


def throttle_badges(reasons: Iterable[str]) -> List[str]:
    """``throttle_badge`` of each reason, in the screen's order."""
    return [throttle_badge(r) for r in throttle_order(reasons)]
