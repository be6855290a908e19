"""Orders of the GPU list (``o`` cycles them): no Textual, no I/O, easy to test.

Within a node its GPUs go by the metric; the nodes go by their best GPU, so the hottest (or
most idle, ...) GPU of the cluster is on top. A GPU that cannot report the metric (lost, or a
field its driver lacks) goes last, and so does a node with no such GPU; ties keep the fleet's
order. "Trouble first" goes by ``view.TROUBLE``: lost, XID, ECC/remap, down or stale node,
thermal/hardware slowdown, power cap, then the GPUs without trouble.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from gpuctl.core.model import GpuSample, NodeSnapshot, NodeState
from gpuctl.node.metrics import Metric, flagged
from gpuctl.tui.view import NO_TROUBLE, TROUBLE, gpu_trouble, node_is_down, screen_word
from gpuctl.tui.view import _gpu_metric as gpu_metric

Sort = tuple[str, str, str, bool]  # key, title (the notification), the column it sorts, descending

# The registry's metrics that have their own words: temperature first (the most asked of a
# cluster), utilization both ways. Any other "sort" metric is "highest TITLE", largest first.
_WORDS: dict[str, tuple[Sort, ...]] = {
    "temp": (("hot", "hottest", "temp", True),),
    "util_gpu": (("busy", "busiest", "util", True), ("idle", "most idle", "util", False)),
    "mem_used": (("mem", "most memory", "mem", True),),
    "power": (("power", "most power", "power", True),),
}


def _sorts(m: Metric) -> tuple[Sort, ...]:
    word = screen_word(m)
    return _WORDS.get(m.key, ((word, f"highest {m.title}", word, True),))


# ``o`` cycles these: trouble first, then the metric registry's "sort" metrics (temperature
# first, then in the registry's order), then the fleet's own order.
SORTS: tuple[Sort, ...] = (
    ("trouble", "trouble first", "flags", True),
    *(s for m in sorted(flagged("sort"), key=lambda m: m.key != "temp") for s in _sorts(m)),
)
SORT_BY_KEY = {s[0]: s for s in SORTS}
DOWN_RANK = TROUBLE.index("down")

XidsOf = Callable[[str], set[int]]  # node -> the GPUs an XID was seen on


def _no_xids(_node: str) -> set[int]:
    return set()


def next_sort(current: str | None) -> str | None:
    """The sort after ``current``; after the last, None (the fleet's order)."""
    keys = [s[0] for s in SORTS]
    if current is None:
        return keys[0]
    i = keys.index(current) + 1
    return keys[i] if i < len(keys) else None


def metric(g: GpuSample, column: str) -> float | None:
    """The value a sort compares (temperature °C, utilization %, memory %, watts), as the
    filter reads it; None for a lost GPU or a reading it lacks."""
    return gpu_metric(g, column)


def _rank(value: float | None, descending: bool) -> tuple[int, float]:
    if value is None:
        return (1, 0.0)
    return (0, -value if descending else value)


def _trouble_rank(snap: NodeSnapshot, g: GpuSample, xids: set[int]) -> tuple[int, float]:
    rank = gpu_trouble(g, g.index in xids)
    if node_is_down(snap):
        rank = min(rank, DOWN_RANK)
    return (0, float(rank)) if rank < NO_TROUBLE else (1, 0.0)


def order_gpus(
    snap: NodeSnapshot, positions: Iterable[int], sort: str, xids: set[int] | None = None
) -> list[int]:
    """``positions`` (indexes into ``snap.gpus``) in the order of ``sort`` (``xids``: the
    node's GPUs an XID was seen on, for "trouble first")."""
    _, _, column, descending = SORT_BY_KEY[sort]
    if sort == "trouble":
        seen = xids or set()
        return sorted(positions, key=lambda i: _trouble_rank(snap, snap.gpus[i], seen))
    return sorted(positions, key=lambda i: _rank(metric(snap.gpus[i], column), descending))


def order_nodes(snaps: Sequence[NodeSnapshot], sort: str, xids_of: XidsOf = _no_xids) -> list[str]:
    """Node names by their best GPU under ``sort`` (live and stale nodes first; for "trouble
    first" a down node ranks as its trouble)."""
    _, _, column, descending = SORT_BY_KEY[sort]

    def best(s: NodeSnapshot) -> tuple[int, float]:
        if sort == "trouble":
            xids = xids_of(s.name)
            ranks = [_trouble_rank(s, g, xids) for g in s.gpus]
            if node_is_down(s):
                ranks.append((0, float(DOWN_RANK)))
            return min(ranks, default=(1, 0.0))
        if s.state not in (NodeState.LIVE, NodeState.STALE):
            return (2, 0.0)
        ranks = [_rank(metric(g, column), descending) for g in s.gpus]
        return min(ranks, default=(1, 0.0))

    return [s.name for s in sorted(snaps, key=best)]
