"""What the screen shows, computed from snapshots: no Textual, no I/O, easy to test.

Levels are small integers (0 ok, 1 warm, 2 hot) that the widgets turn into theme colours through
component classes, so no colour is ever named here.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpuctl.core.format import (
    GIB,
    QUIET_THROTTLE,
    THROTTLE_BADGES,
    THROTTLE_WORDS,
    fmt_age,
    gpu_badge_names,
    gpu_flags,
    short_model,
)
from gpuctl.core.model import GpuSample, NodeSnapshot, NodeState
from gpuctl.fleet.myjobs import user_name, wanted
from gpuctl.node.metrics import BY_NAME, PAIRED, PERCENT_OF, Metric, flagged
from gpuctl.workloads.accept_suite.nodehealth import xid_text

SPARK_CHARS = " ▁▂▃▄▅▆▇█"
BAR_FULL = "█"
BAR_PARTS = " ▏▎▍▌▋▊▉"
HEAT_LEVELS = 5

# The screen's word for a registry metric (``gpuctl/node/metrics.py``): its ``name``, or the
# share it is sorted and drawn as ("mem": mem_used in % of mem_total, ``PERCENT_OF``).
_SHARE_WORD = {num: word for word, (num, _total) in PERCENT_OF.items()}


def screen_word(m: Metric) -> str:
    """What the filter, the sort and the heatmap call ``m``: "mem" for memory (in %)."""
    word: str = _SHARE_WORD.get(m.key, m.name)
    return word


# The heatmap's metrics (the registry's "heatmap" flag, in its order: ``m`` cycles them), and
# their names for people: the four first ones' short words, the others' registry description
# without its aside ("video encoder utilization", "PCIe transmit throughput": the legend and the
# status line have an 80-column terminal to share).
METRICS = tuple(screen_word(m) for m in flagged("heatmap"))
HEATMAP_METRICS = {screen_word(m): m for m in flagged("heatmap")}
_TITLES = {"util": "utilization", "mem": "memory", "temp": "temperature", "power": "power"}
METRIC_TITLES = {
    w: _TITLES.get(w, re.sub(r"\s*\([^)]*\)", "", m.what)) for w, m in HEATMAP_METRICS.items()
}


TAG_W = 6  # cells of a model tag (``model_tags``): "H100", "A6000", "4090", "L40S"
_TOKENS = re.compile(r"[^\s-]+")


def model_tags(models: Mapping[int, str | None]) -> dict[int, str]:
    """Short tags that tell a node's GPU models apart (GPU index -> tag), for a list too narrow
    for the model column (issue 26: a node of several models looked alike below 110 columns).

    A model's tag is its first word with a digit ("H100 80GB HBM3": H100, "RTX 4090": 4090,
    "A100-SXM4-80GB": A100); where two of the node's models share that, each of them takes a word
    the node's other models lack, one with a digit first ("A100-SXM4-80GB" and "-40GB": 80GB,
    40GB; "H100" and "H100 PCIe": H100, PCIe)."""
    names = {i: short_model(n) for i, n in models.items()}
    distinct = sorted(set(names.values()))
    words = {n: _TOKENS.findall(n) or [n] for n in distinct}
    tag = {
        n: next((w for w in ws if any(c.isdigit() for c in w)), ws[0]) for n, ws in words.items()
    }
    first = dict(tag)
    for n, ws in words.items():
        if sum(t == first[n] for t in first.values()) > 1:  # shared: a word only it has
            others = {w for o, ows in words.items() if o != n for w in ows}
            own = [w for w in ws if w not in others]
            tag[n] = next(
                (w for w in own if any(c.isdigit() for c in w)), own[0] if own else tag[n]
            )
    return {i: tag[n][:TAG_W] for i, n in names.items()}


def _has_digit(word: str) -> bool:
    return any(c.isdigit() for c in word)


def models_text(models: Mapping[int, str | None]) -> str:
    """A node's models for its header, counted by tag: "6× H100 · 2× 4090"."""
    counts: dict[str, int] = {}
    for tag in model_tags(models).values():
        counts[tag] = counts.get(tag, 0) + 1
    return " · ".join(f"{n}× {tag}" for tag, n in counts.items())


def bar(fraction: float | None, width: int) -> tuple[str, str]:
    """A horizontal bar of ``width`` cells: (filled part, empty part), eighths for the edge."""
    if fraction is None or width <= 0:
        return "", " " * max(width, 0)
    f = min(1.0, max(0.0, fraction)) * width
    full = int(f)
    part = int((f - full) * 8)
    filled = BAR_FULL * full + (BAR_PARTS[part] if part and full < width else "")
    return filled, " " * (width - len(filled))


def sparkline(values: Sequence[float | None], width: int, top: float = 100.0) -> str:
    """The last ``width`` values as block characters (missing values as blanks)."""
    tail = list(values)[-width:]
    out = []
    for v in tail:
        if v is None:
            out.append(" ")
        else:
            i = math.ceil(min(1.0, max(0.0, v / top)) * (len(SPARK_CHARS) - 1))
            out.append(SPARK_CHARS[i])
    return "".join(out).rjust(width)


def level(value: float | None, warm: float, hot: float) -> int:
    """0 ok, 1 warm, 2 hot; None counts as ok (nothing to warn about)."""
    if value is None:
        return 0
    return 2 if value >= hot else 1 if value >= warm else 0


@dataclass(frozen=True, slots=True)
class Levels:
    """Where the screen turns a temperature (°C) and a GPU's memory (fraction used) warm and
    hot: ``[tui]`` temp_warn, temp_critical, mem_warn, mem_critical (``from_settings``). Memory
    is never hot unless ``mem_critical`` is set: a full memory is no fault."""

    temp_warn: float = 75.0
    temp_critical: float = 85.0
    mem_warn: float = 0.8
    mem_critical: float = math.inf

    @classmethod
    def from_settings(cls, tui: object) -> Levels:
        """From a ``config.TuiSettings`` (memory in percent there)."""
        crit = getattr(tui, "mem_critical", None)
        return cls(
            float(getattr(tui, "temp_warn", 75.0)),
            float(getattr(tui, "temp_critical", 85.0)),
            float(getattr(tui, "mem_warn", 80.0)) / 100,
            math.inf if crit is None else float(crit) / 100,
        )

    def temp(self, value: float | None) -> int:
        return level(value, self.temp_warn, self.temp_critical)

    def mem(self, fraction: float | None) -> int:
        return level(fraction, self.mem_warn, self.mem_critical)


def mem_fraction(g: GpuSample) -> float | None:
    if g.mem_used is None or not g.mem_total:
        return None
    return g.mem_used / g.mem_total


def power_fraction(g: GpuSample) -> float | None:
    if g.power is None or not g.power_limit:
        return None
    return g.power / g.power_limit


def metric_fraction(g: GpuSample, metric: str) -> float | None:
    """A heatmap metric (``METRICS``) as 0..1: the share of the reading it is paired with
    (memory of its total, power of its limit), else its place on the registry's ``heat`` scale
    (temperature between 30 and 90 °C, PCIe between 0 and 64 GB/s)."""
    if g.lost:
        return None
    m = HEATMAP_METRICS.get(metric)
    if m is None:
        raise ValueError(f"unknown metric {metric!r}")
    v = getattr(g, m.key)
    if v is None:
        return None
    total_key = PAIRED.get(m.key)
    if total_key is not None:
        total = getattr(g, total_key)
        return v / total if total else None
    lo, hi = m.heat or (0.0, 100.0)
    return (float(v) * m.scale - lo) / (hi - lo)


def heat_scale(metric: str) -> tuple[str, str]:
    """The heatmap legend's two ends for ``metric``: "0%", "100% used"; "30°C", "90°C"."""
    m = HEATMAP_METRICS[metric]
    if m.key in PAIRED:
        return "0%", "100% used" if m.key == "mem_used" else "100% of limit"
    lo, hi = m.heat or (0.0, 100.0)
    unit = "°C" if m.shown == "C" else m.shown
    return f"{lo:g}{unit}", f"{hi:g}{unit}"


def heat_level(fraction: float | None) -> int | None:
    """0..HEAT_LEVELS-1 or None when there is nothing to show."""
    if fraction is None:
        return None
    f = min(1.0, max(0.0, fraction))
    return min(HEAT_LEVELS - 1, int(f * HEAT_LEVELS))


def gpu_badges(g: GpuSample, xid_seen: bool) -> list[str]:
    """Badges for a GPU row: throttle reasons shortened, ECC, REMAP, XID, LOST."""
    out = gpu_badge_names(g)
    if xid_seen and not g.lost:
        out.append("XID")
    return out


# -- trouble ------------------------------------------------------------------------------------
# GPUs of a Slurm job idle for [fleet] idle_after (``gpuctl.fleet.idle``): counted in the header
# from the fleet's tracker (``FleetStore.trouble``), not from a snapshot (it is a span of time).
ALLOC_IDLE = "alloc-idle"
# What is wrong, worst first: the header counts these, ``n`` / ``N`` jump between them, the
# "trouble first" order sorts by them. Power capping is last and is no problem: a busy GPU at
# its power limit is normal (it is neither counted nor jumped to).
TROUBLE = ("lost", "xid", "ecc", "down", "slowdown", ALLOC_IDLE, "pwrcap")
TROUBLE_TITLES = {
    "lost": "lost",
    "xid": "XID",
    "ecc": "ECC",
    "down": "down",
    "slowdown": "slow",
    ALLOC_IDLE: ALLOC_IDLE,
    "pwrcap": "pwrcap",
}
PROBLEMS = TROUBLE[:-1]  # what counts as trouble; power capping does not
SNAPSHOT_PROBLEMS = tuple(k for k in PROBLEMS if k != ALLOC_IDLE)  # a snapshot tells these
NO_TROUBLE = len(TROUBLE)
SLOWDOWN_REASONS = frozenset({"sw_thermal", "hw_thermal", "hw_slowdown", "hw_power_brake"})
POWER_CAP_REASONS = frozenset({"sw_power_cap"})


def gpu_problems(g: GpuSample, xid: bool) -> list[str]:
    """A GPU's troubles (``TROUBLE`` words), worst first (a lost GPU reports nothing else). A
    down or stale node is its node's trouble (``node_is_down``), not its GPUs'."""
    out = ["xid"] if xid else []
    if g.lost:
        return ["lost", *out]
    flags = gpu_flags(g)
    if not flags:  # most GPUs, each sample (the header counts every node's)
        return out
    if "ECC" in flags or "REMAP" in flags:
        out.append("ecc")
    if SLOWDOWN_REASONS.intersection(flags):
        out.append("slowdown")
    if POWER_CAP_REASONS.intersection(flags):
        out.append("pwrcap")
    return out


LOST_WORDS = "LOST: GPU fell off the bus: drain and reset the node"


def trouble_lines(g: GpuSample, xid: object | None = None) -> list[tuple[str, str]]:
    """A GPU's trouble in words, each line with how to draw it ("alarm", "warn" or "plain"),
    in the detail screen's order: lost, else its flags (ECC and row remapping, throttle
    reasons as their badges and words), then the last XID seen (``xid``: its number, None:
    none) named with what to do. The detail screen shows them all; the heatmap's status line
    the one ``worst_trouble`` picks. Node text (a reason the node made up) comes out as it came:
    the caller makes it printable."""
    out: list[tuple[str, str]] = []
    if g.lost:
        out.append((LOST_WORDS, "alarm"))
    else:
        out += [flag_line(flag) for flag in gpu_flags(g)]
    if xid is not None:
        out.append((xid_text(xid), "alarm"))
    return out


def flag_line(flag: str) -> tuple[str, str]:
    """One flag of ``gpu_flags`` in words, with how to draw it (``trouble_lines``)."""
    badge = THROTTLE_BADGES.get(flag, flag)
    words = THROTTLE_WORDS.get(badge)
    if flag in ("ECC", "REMAP"):
        words = "uncorrected ECC errors" if flag == "ECC" else "row remapping pending"
        return (f"{badge}: {words}", "alarm")
    if badge == "PWRCAP" or words is None:
        return (badge if words is None else f"{badge}: {words}", "plain")
    return (f"{badge}: {words}", "warn")


def trouble_event(kind: str, subject: str, detail: Mapping[str, object]) -> tuple[str, str]:
    """A row of the trouble log (``gpuctl.fleet.troublelog.Trouble``: its kind, subject and
    detail) in the words of ``trouble_lines``, with how to draw it. Node text comes out as it
    came: the caller makes it printable."""
    if kind == "xid":
        return (xid_text(int(subject) if subject.isdigit() else subject), "alarm")
    if kind == "gpu_lost":
        why = detail.get("reason")
        return (LOST_WORDS + (f" ({why})" if why else ""), "alarm")
    if kind == "throttle":
        return flag_line(subject)
    if kind in ("ecc", "remap"):
        text, how = flag_line(kind.upper())
        counts = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in detail.items() if v)
        return (f"{text} ({counts})" if counts else text, how)
    if kind == "ecc_corrected":  # no fault: plain, ``n`` does not stop on it
        counts = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in detail.items())
        return ("corrected ECC errors rose" + (f" ({counts})" if counts else ""), "plain")
    if kind == "unreachable":
        why = detail.get("reason")
        return ("node unreachable" + (f": {why}" if why else ""), "alarm")
    if kind == "accept":
        failures = detail.get("failures")
        named = "; ".join(map(str, failures)) if isinstance(failures, list) else ""
        return (
            f"acceptance {detail.get('verdict', 'FAIL')}" + (f": {named}" if named else ""),
            "alarm",
        )
    return (" ".join([kind, subject]).strip(), "plain")


def next_stop(
    n: int, here: int, step: int, unacked: Callable[[int], bool], trouble: Callable[[int], bool]
) -> int | None:
    """Where ``n`` (``step`` 1) or ``N`` (-1) goes from position ``here`` of ``n`` (the list's
    lines, the heatmap's cells): one tour, round the end, of the positions with an
    unacknowledged event of the trouble log first (``unacked``), in their order, then of the
    others in trouble now (``trouble``). From a position that is no stop, the next
    unacknowledged one in that direction, else the next in trouble. None: no stop at all."""
    first = [i for i in range(n) if unacked(i)]
    seen = set(first)
    tour = first + [i for i in range(n) if i not in seen and trouble(i)]
    if not tour:
        return None
    if here in tour:
        return tour[(tour.index(here) + step) % len(tour)]
    for group in (first, tour[len(first) :]):
        if group:
            ahead = [i for i in group if (i - here) * step > 0]
            return (ahead or group)[0] if step > 0 else (ahead or group)[-1]
    return None


def alloc_idle_text(seconds: float, job: object, user: object, below: float) -> str:
    """What the detail screen says of a GPU allocated but idle (``gpuctl.fleet.idle``)."""
    who = f"job {job}" + (f" ({user})" if user else "")
    return f"IDLE {fmt_age(seconds)} in {who}: util and memory traffic ≤{below:g}%"


def worst_trouble(lines: list[tuple[str, str]]) -> tuple[str, str] | None:
    """The line of ``trouble_lines`` a one-line summary names: the XID when there is one (it
    says why, and what to do), else the first alarm, else the first warning; None when
    nothing but quiet flags (power cap, sync boost) is there."""
    xids = [line for line in lines if line[0].startswith("XID ")]
    for pick in (xids, [x for x in lines if x[1] == "alarm"], [x for x in lines if x[1] == "warn"]):
        if pick:
            return pick[0]
    return None


def gpu_trouble(g: GpuSample, xid: bool) -> int:
    """A GPU's worst trouble as an index into ``TROUBLE`` (``NO_TROUBLE``: none)."""
    problems = gpu_problems(g, xid)
    return TROUBLE.index(problems[0]) if problems else NO_TROUBLE


def node_is_down(s: NodeSnapshot) -> bool:
    """Unreachable or stale: its GPUs are not being watched right now."""
    return s.state in (NodeState.UNREACHABLE, NodeState.STALE)


def trouble_counts(s: NodeSnapshot, xid_gpus: set[int]) -> dict[str, int]:
    """How many of a node's GPUs have each problem (``SNAPSHOT_PROBLEMS``; ``down`` counts the
    node);
    a GPU with two problems counts under both, as the filter of each finds it.

    Every node's every sample comes here (the header's counts): a GPU without trouble (most,
    each sample) is told in a few tests written out (``gpu_problems`` for the others), not a
    list of flags built and read (0.83 s of ~10 s busy at 4,096 GPUs, profiled)."""
    counts = dict.fromkeys(SNAPSHOT_PROBLEMS, 0)
    if node_is_down(s):
        counts["down"] = 1
    quiet = _QUIET_REASONS
    for g in s.gpus:
        reasons = g.throttle
        ecc = g.ecc
        rr = g.remapped_rows
        if (
            g.state != "lost"
            and (not reasons or quiet.get(reasons) or _quiet_reasons(reasons))
            and not (ecc and (ecc.get("volatile_uncorrected") or ecc.get("aggregate_uncorrected")))
            and not (rr and (rr.get("pending") or rr.get("failure")))
            and g.index not in xid_gpus
        ):
            continue  # no flag (``gpu_flags``), no XID: no problem
        for kind in gpu_problems(g, g.index in xid_gpus):
            if kind in counts:
                counts[kind] += 1
    return counts


# Throttle reasons (as sent) that are all quiet (``QUIET_THROTTLE``), once told: an agent
# sends a few distinct tuples. Kept to a bound, for an agent that would send many.
_QUIET_REASONS: dict[tuple[str, ...], bool] = {}


def _quiet_reasons(reasons: tuple[str, ...]) -> bool:
    quiet = all(r in QUIET_THROTTLE for r in reasons)
    if len(_QUIET_REASONS) >= 256:
        _QUIET_REASONS.clear()
    _QUIET_REASONS[reasons] = quiet
    return quiet


def is_problem(s: NodeSnapshot, g: GpuSample | None, xid: bool) -> bool:
    """Whether ``n`` stops at this GPU (``None``: the node as a whole)."""
    if node_is_down(s):
        return True
    return g is not None and gpu_trouble(g, xid) < TROUBLE.index("pwrcap")


def node_age_text(s: NodeSnapshot, now: float) -> str:
    """The state for people: live, "stale 12s", "unreachable: <reason>", connecting."""
    if s.state is NodeState.STALE:
        age = s.age(now)
        text = "stale" if age is None else f"stale {fmt_age(age)}"
        return f"{text} ({s.reason})" if s.reason else str(text)
    if s.state is NodeState.UNREACHABLE:
        return f"unreachable: {s.reason}" if s.reason else "unreachable"
    return str(s.state.value)


def down_text(s: NodeSnapshot, now: float, retry_in: float | None) -> str:
    """An unreachable node's state for people, what a person waits for first, the reason
    (which can be long: the line is cut at the edge) last: "unreachable · retry in 4s · last
    seen 2m ago · <reason>" (``retry_in``: seconds to the fleet's next try, None while it
    tries). Other states as ``node_age_text``."""
    if s.state is not NodeState.UNREACHABLE:
        return node_age_text(s, now)
    age = s.age(now)
    seen = "never seen" if age is None else f"last seen {fmt_age(age)} ago"
    retry = "retrying now" if retry_in is None else f"retry in {math.ceil(max(0.0, retry_in))}s"
    return " · ".join(["unreachable", retry, seen, *([s.reason] if s.reason else [])])


def fmt_power(watts: float) -> str:
    if not math.isfinite(watts):  # a sum of junk readings (1e308 W twice)
        return "-"
    return f"{watts / 1000:.1f} kW" if watts >= 1000 else f"{watts:.0f} W"


def fmt_gib_pair(used: int | None, total: int | None) -> str:
    u = "-" if used is None else f"{used / GIB:.0f}"
    t = "-" if total is None else f"{total / GIB:.0f}"
    return f"{u}/{t}G"


@dataclass(frozen=True, slots=True)
class NodeTotals:
    gpus: int
    util_sum: float
    util_n: int
    power: float


def node_totals(s: NodeSnapshot) -> NodeTotals:
    """A node's GPUs counted, their utilization summed over those that report it, and their
    power (a lost GPU reports neither); one pass over the GPUs (every sample's node)."""
    util = util_n = 0
    power = 0.0
    for g in s.gpus:
        if g.state == "lost":  # ``g.lost`` written out: a call per GPU per sample
            continue
        u = g.util_gpu
        if u is not None:
            util += u
            util_n += 1
        p = g.power
        if p is not None:
            power += p
    return NodeTotals(len(s.gpus), float(util), util_n, power)


@dataclass(frozen=True, slots=True)
class ClusterTotals:
    nodes: int
    live: int
    gpus: int
    util_mean: float | None
    power: float


def cluster_totals(parts: Iterable[tuple[bool, NodeTotals | None]]) -> ClusterTotals:
    """The cluster's figures from each node's part: whether it is live, and its totals when
    it is live or stale (None otherwise)."""
    # Summed in C (``sum`` over ``map``): every flush asks, over every node (512: 0.7 ms a
    # flush as a loop of attribute reads, profiled).
    pairs = list(parts)
    if not pairs:
        return ClusterTotals(0, 0, 0, None, 0.0)
    lives, all_totals = zip(*pairs, strict=True)
    kept = list(filter(None, all_totals))
    util_n = sum(map(_UTIL_N, kept))
    util_sum = float(sum(map(_UTIL_SUM, kept)))
    return ClusterTotals(
        len(pairs),
        sum(lives),
        sum(map(_GPUS, kept)),
        util_sum / util_n if util_n else None,
        float(sum(map(_POWER, kept))),
    )


_GPUS = operator.attrgetter("gpus")
_UTIL_SUM = operator.attrgetter("util_sum")
_UTIL_N = operator.attrgetter("util_n")
_POWER = operator.attrgetter("power")


# -- filter ------------------------------------------------------------------------------------
_OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    "!=": operator.ne,
    ">": operator.gt,
    "<": operator.lt,
    "==": operator.eq,
    "=": operator.eq,
}
_THRESHOLD = re.compile(r"^([a-z_]+)\s*(>=|<=|!=|==|>|<|=)\s*(-?\d+(?:\.\d+)?)$")
STATE_WORDS = {s.value for s in NodeState} | {"down"}
GPU_WORDS = {
    "lost",
    "throttle",
    "throttling",
    "xid",
    "burning",
    "idle",
    "busy",
    "ecc",
    "slowdown",
    "pwrcap",
    "trouble",
    ALLOC_IDLE,
}
# Threshold words of the filter: the registry's "filter" metrics, in their shown units, and the
# shares ("mem": % of the memory in use).
FILTER_METRICS = {m.name for m in flagged("filter")} | set(PERCENT_OF)


class FilterError(ValueError):
    """The filter text cannot be understood; the message is one line for the user."""


def _gpu_metric(g: GpuSample, metric: str) -> float | None:
    """A metric by its screen word, in its shown unit (the registry's ``shown``; "mem": %)."""
    if g.lost:
        return None
    if metric in PERCENT_OF:
        f = mem_fraction(g)
        return None if f is None else 100.0 * f
    m = BY_NAME[metric]
    v = getattr(g, m.key)
    return None if v is None else float(v) * m.scale


GpuPredicate = Callable[[NodeSnapshot, GpuSample | None, "GpuFacts"], bool]


@dataclass(frozen=True, slots=True)
class GpuFacts:
    """What the filter needs beyond the sample: model name, XID seen, burn state."""

    model: str = ""
    xid: bool = False
    burning: bool = False
    idle_s: float | None = None  # seconds allocated but idle (``gpuctl.fleet.idle``), else None


@dataclass(frozen=True)
class NodeFilter:
    """A parsed ``/`` filter: every term must hold (AND).

    Terms: a state word (live, stale, unreachable, connecting, down), a GPU word (lost, throttle,
    xid, ecc [ECC or row-remap trouble], slowdown [thermal or hardware], pwrcap, trouble [any of
    the header's counts], burning, idle, busy, alloc-idle [in a Slurm job, idle for
    ``idle_after``], mine [in a Slurm job of yours]), ``job:ID`` (in that Slurm job), a
    threshold ``metric op number``
    (``FILTER_METRICS``: util, mem [%], mem_gib, temp [°C], power [W], clock [MHz], fan, enc,
    dec [%], pcie_tx [GB/s], ...: the metric registry's, in its shown units) or any other
    text, matched against the node name and the GPU model. A node with no GPU rows matches
    only if no GPU term is present.
    """

    text: str
    node_terms: tuple[Callable[[NodeSnapshot], bool], ...] = ()
    gpu_terms: tuple[GpuPredicate, ...] = ()
    jobs: tuple[str | None, str | None] | None = None  # (user, job) of ``mine`` / ``job:ID``

    @property
    def empty(self) -> bool:
        return not self.node_terms and not self.gpu_terms

    def node_matches(self, s: NodeSnapshot) -> bool:
        return all(t(s) for t in self.node_terms)

    def gpu_matches(self, s: NodeSnapshot, g: GpuSample | None, facts: GpuFacts) -> bool:
        return all(t(s, g, facts) for t in self.gpu_terms)

    @property
    def has_gpu_terms(self) -> bool:
        return bool(self.gpu_terms)


def parse_filter(text: str) -> NodeFilter:
    """Parse filter text; raises FilterError with a one-line message."""
    node_terms: list[Callable[[NodeSnapshot], bool]] = []
    gpu_terms: list[GpuPredicate] = []
    jobs: tuple[str | None, str | None] | None = None
    # "temp > 80" is one term: glue operators to their neighbours before splitting.
    glued = re.sub(r"\s*(>=|<=|!=|==|>|<|=)\s*", r"\1", text.strip().lower())
    for word in glued.split():
        m = _THRESHOLD.match(word)
        if word.startswith("job:"):
            job = word[4:]
            if not job.replace("_", "").isdigit():
                raise FilterError(f"cannot read {word!r}: write a Slurm job id like job:4242")
            jobs = (jobs[0] if jobs else None, job)
            gpu_terms.append(_job_term(None, job))
        elif word == "mine":
            me = user_name()
            jobs = (me, jobs[1] if jobs else None)
            gpu_terms.append(_job_term(me, None))
        elif m:
            metric, op, num = m.group(1), m.group(2), float(m.group(3))
            if metric in ("utilization", "gpu"):
                metric = "util"
            if metric in ("temperature",):
                metric = "temp"
            if metric not in FILTER_METRICS:
                raise FilterError(
                    f"unknown metric {metric!r} in {word!r} "
                    f"(use: {', '.join(sorted(FILTER_METRICS))})"
                )
            fn = _OPS[op]

            def threshold(
                _s: NodeSnapshot,
                g: GpuSample | None,
                _f: GpuFacts,
                metric: str = metric,
                fn: Callable[[float, float], bool] = fn,
                num: float = num,
            ) -> bool:
                if g is None:
                    return False
                v = _gpu_metric(g, metric)
                return v is not None and fn(v, num)

            gpu_terms.append(threshold)
        elif any(c in word for c in "<>=!"):
            raise FilterError(f"cannot read {word!r}: write a threshold like temp>80 or util<=5")
        elif word in STATE_WORDS:
            states = (
                {NodeState.UNREACHABLE, NodeState.STALE} if word == "down" else {NodeState(word)}
            )
            node_terms.append(lambda s, states=states: s.state in states)  # type: ignore[misc]
        elif word in GPU_WORDS:
            gpu_terms.append(_gpu_word(word))
        else:

            def name_term(
                s: NodeSnapshot, g: GpuSample | None, f: GpuFacts, word: str = word
            ) -> bool:
                return word in s.name.lower() or (g is not None and word in f.model.lower())

            gpu_terms.append(name_term)
    return NodeFilter(text, tuple(node_terms), tuple(gpu_terms), jobs)


def _job_term(user: str | None, job: str | None) -> GpuPredicate:
    def pred(s: NodeSnapshot, g: GpuSample | None, _f: GpuFacts) -> bool:
        return g is not None and wanted(s.annotations.get(g.index), user=user, job=job)

    return pred


def _gpu_word(word: str) -> GpuPredicate:
    def pred(_s: NodeSnapshot, g: GpuSample | None, f: GpuFacts) -> bool:
        if g is None:
            return False
        if word == "lost":
            return g.lost
        if word in ("throttle", "throttling"):
            return bool([x for x in gpu_flags(g) if x not in ("ECC", "REMAP", "LOST")])
        if word == "xid":
            return f.xid
        if word in ("ecc", "slowdown", "pwrcap"):
            return word in gpu_problems(g, f.xid)
        if word == "trouble":
            return is_problem(_s, g, f.xid) or f.idle_s is not None
        if word == "burning":
            return f.burning
        if word == "idle":
            return g.util_gpu is not None and g.util_gpu <= 2
        if word == ALLOC_IDLE:
            return f.idle_s is not None
        return g.util_gpu is not None and g.util_gpu > 2  # busy

    return pred
