"""Pure view helpers: bars, sparklines, heat levels and the ``/`` filter language."""

from __future__ import annotations

import pytest

from gpuctl.core.format import short_model
from gpuctl.core.model import GpuSample, NodeSnapshot, NodeState
from gpuctl.tui.view import (
    FilterError,
    GpuFacts,
    bar,
    heat_level,
    metric_fraction,
    node_age_text,
    parse_filter,
    sparkline,
)

GIB = 1 << 30


def gpu(index: int = 0, **kw: object) -> GpuSample:
    base: dict[str, object] = dict(
        util_gpu=50, mem_used=40 * GIB, mem_total=80 * GIB, temp=70, power=300.0, power_limit=700.0
    )
    base.update(kw)
    return GpuSample(index=index, t=0.0, **base)  # type: ignore[arg-type]


def node(
    name: str = "gpu-a01", state: NodeState = NodeState.LIVE, *gpus: GpuSample
) -> NodeSnapshot:
    return NodeSnapshot(name=name, state=state, gpus=gpus)


def test_bar_fills_in_eighths_and_keeps_its_width() -> None:
    assert bar(0.0, 8) == ("", " " * 8)
    assert bar(1.0, 8) == ("█" * 8, "")
    filled, rest = bar(0.5 + 1 / 16, 8)
    assert filled == "████▌" and len(filled + rest) == 8
    assert bar(None, 4) == ("", "    ")
    assert bar(7.0, 3) == ("███", "")  # clamped


def test_sparkline_scales_and_pads() -> None:
    assert sparkline([0, 50, 100], 5) == "  " + " ▄█"
    assert sparkline([None, 100], 2) == " █"
    assert len(sparkline(list(range(100)), 12)) == 12


def test_heat_levels_cover_the_range_and_none() -> None:
    assert heat_level(None) is None
    assert heat_level(0.0) == 0
    assert heat_level(0.99) == 4
    assert heat_level(1.5) == 4
    assert metric_fraction(gpu(temp=90), "temp") == pytest.approx(1.0)
    assert metric_fraction(gpu(state="lost"), "util") is None
    with pytest.raises(ValueError):
        metric_fraction(gpu(), "fans")


def test_short_model_and_ages() -> None:
    assert short_model("NVIDIA H100 80GB HBM3") == "H100 80GB HBM3"
    assert short_model("NVIDIA GeForce RTX 4090") == "RTX 4090"
    assert short_model(None) == "?"
    stale = NodeSnapshot(name="n", state=NodeState.STALE, last_sample_t=100.0)
    assert node_age_text(stale, 112.7) == "stale 12s"
    down = NodeSnapshot(name="n", state=NodeState.UNREACHABLE, reason="refused: no")
    assert node_age_text(down, 0) == "unreachable: refused: no"


def test_filter_thresholds_names_and_states() -> None:
    hot, cool = gpu(0, temp=85), gpu(1, temp=40)
    s = node("gpu-a01", NodeState.LIVE, hot, cool)
    facts = GpuFacts(model="H100 80GB HBM3")
    f = parse_filter("temp>80")
    assert f.node_matches(s)
    assert f.gpu_matches(s, hot, facts) and not f.gpu_matches(s, cool, facts)
    assert parse_filter("temp > 80").gpu_matches(s, hot, facts)  # spaces around the operator
    assert parse_filter("mem>=50 util<60").gpu_matches(s, hot, facts)
    assert not parse_filter("mem>60").gpu_matches(s, hot, facts)
    assert parse_filter("a01").gpu_matches(s, cool, facts)
    assert parse_filter("h100").gpu_matches(s, cool, facts)  # the model counts too
    assert not parse_filter("b02").gpu_matches(s, cool, facts)
    assert not parse_filter("stale").node_matches(s)
    assert parse_filter("live").node_matches(s)
    down = node("gpu-c03", NodeState.UNREACHABLE)
    assert parse_filter("down").node_matches(down)
    assert parse_filter("c03").gpu_matches(down, None, GpuFacts())
    assert parse_filter("xid").gpu_matches(s, hot, GpuFacts(xid=True))
    assert parse_filter("").empty


@pytest.mark.parametrize("text", ["temp>>80", "fans>3", "temp>hot", "<5"])
def test_filter_mistakes_are_one_line_errors(text: str) -> None:
    with pytest.raises(FilterError) as e:
        parse_filter(text)
    assert "\n" not in str(e.value) and str(e.value)


def test_trouble_words_filter_what_the_header_counts() -> None:
    from gpuctl.tui.view import trouble_counts

    capped = gpu(0, util_gpu=100, throttle=("sw_power_cap",))
    hot = gpu(1, throttle=("sw_thermal", "sw_power_cap"))
    ecc = gpu(2, remapped_rows={"pending": 1})
    lost = gpu(3, state="lost")
    s = node("n", NodeState.LIVE, capped, hot, ecc, lost)

    def matching(text: str, xids: frozenset[int] = frozenset()) -> list[int]:
        f = parse_filter(text)
        return [g.index for g in s.gpus if f.gpu_matches(s, g, GpuFacts(xid=g.index in xids))]

    assert matching("slowdown") == [1]
    assert matching("pwrcap") == [0, 1]
    assert matching("ecc") == [2]
    assert matching("trouble") == [1, 2, 3]  # a power cap is no trouble
    assert matching("xid", frozenset({0})) == [0]
    assert trouble_counts(s, {0}) == {"lost": 1, "xid": 1, "ecc": 1, "down": 0, "slowdown": 1}
    stale = node("m", NodeState.STALE, gpu(0))
    assert trouble_counts(stale, set())["down"] == 1


def test_trouble_counts_agree_with_each_gpus_problems() -> None:
    """``trouble_counts`` tells a GPU without trouble in a few tests of its own (the header
    counts every node's every sample): it counts what ``gpu_problems`` says of each GPU, for
    every mix of throttle reasons (quiet, slowing, a power cap, none), ECC and row-remap
    counts (zero, set, a flag), a lost GPU and an XID."""
    import itertools

    from gpuctl.tui.view import SNAPSHOT_PROBLEMS, gpu_problems, trouble_counts

    throttles = [None, (), ("gpu_idle",), ("gpu_idle", "applications_clocks"), ("sw_power_cap",)]
    throttles += [("gpu_idle", "hw_slowdown"), ("sw_thermal", "sw_power_cap")]
    eccs = [None, {}, {"volatile_uncorrected": 0, "aggregate_uncorrected": 0}]
    eccs += [{"volatile_uncorrected": 2}, {"aggregate_uncorrected": 1, "volatile_corrected": 9}]
    remaps = [None, {"correctable": 3, "pending": False, "failure": False}, {"pending": True}]
    remaps += [{"failure": 1}]
    gpus = [
        gpu(i, throttle=t, ecc=e, remapped_rows=r, state=state)
        for i, (t, e, r, state) in enumerate(
            itertools.product(throttles, eccs, remaps, ("ok", "lost"))
        )
    ]
    for xids in (set(), {0, 5, 17, 300}):
        for chunk in range(0, len(gpus), 8):  # nodes of 8 GPUs
            s = node("n", NodeState.LIVE, *gpus[chunk : chunk + 8])
            want = dict.fromkeys(SNAPSHOT_PROBLEMS, 0)
            for g in s.gpus:
                for kind in gpu_problems(g, g.index in xids):
                    if kind in want:
                        want[kind] += 1
            assert trouble_counts(s, xids) == want, [g for g in s.gpus]


def test_cluster_totals_sum_the_nodes_parts() -> None:
    """The header's figures from each node's part: nodes, live ones, GPUs, mean utilization
    over the GPUs that report it, power; a down node (no totals) counts as a node only."""
    from gpuctl.tui.view import ClusterTotals, cluster_totals, node_totals

    a = node("a", NodeState.LIVE, gpu(0, util_gpu=10, power=100.5), gpu(1, util_gpu=None))
    b = node("b", NodeState.STALE, gpu(0, util_gpu=40, power=None), gpu(1, state="lost"))
    parts = [(True, node_totals(a)), (False, node_totals(b)), (False, None)]
    assert node_totals(a).util_n == 1 and node_totals(b).gpus == 2
    assert cluster_totals(parts) == ClusterTotals(3, 1, 4, 25.0, 400.5)
    assert cluster_totals([(False, None)]) == ClusterTotals(1, 0, 0, None, 0.0)
    assert cluster_totals([]) == ClusterTotals(0, 0, 0, None, 0.0)


def test_trouble_counts_and_totals_of_nodes_alike_but_for_one_gpu() -> None:
    """A node's trouble is counted as ``gpu_problems`` says of each GPU, and its totals
    summed GPU by GPU, where its GPUs are alike but for one (the common node, whose every GPU
    the header's counts tell quiet): 8 GPUs of one profile, and 7 quiet ones (each with its
    own corrected ECC count) with the eighth (first, middle or last) of another, for every mix
    of throttle reasons, ECC and row-remap counts, a lost GPU, an XID, and a GPU that reports
    no utilization or power."""
    import itertools

    from gpuctl.tui.view import SNAPSHOT_PROBLEMS, gpu_problems, node_totals, trouble_counts

    throttles = [None, (), ("gpu_idle",), ("sw_power_cap",), ("gpu_idle", "hw_slowdown")]
    eccs = [None, {}, {"volatile_uncorrected": 0, "aggregate_uncorrected": 0}]
    eccs += [{"volatile_uncorrected": 2}, {"aggregate_uncorrected": True}]
    remaps = [None, {"pending": False, "failure": False}, {"pending": True}, {"failure": 1}]
    readings = [(50, 300.0), (None, 300.0), (50, None)]

    def quiet(i: int) -> dict[str, object]:
        ecc = {"aggregate_corrected": i, "volatile_uncorrected": 0}
        return {"throttle": (), "ecc": ecc, "remapped_rows": remaps[1]}

    for t, e, r, state, (u, p) in itertools.product(
        throttles, eccs, remaps, ("ok", "lost"), readings
    ):
        odd = {"throttle": t, "ecc": e, "remapped_rows": r, "state": state}
        odd |= {"util_gpu": u, "power": p}
        nodes = [[gpu(i, **odd) for i in range(8)]]
        for at in (0, 3, 7):
            nodes.append([gpu(i, **(odd if i == at else quiet(i))) for i in range(8)])
        for gpus in nodes:
            s = node("n", NodeState.LIVE, *gpus)
            for xids in (set(), {3}):
                want = dict.fromkeys(SNAPSHOT_PROBLEMS, 0)
                for g in gpus:
                    for kind in gpu_problems(g, g.index in xids):
                        if kind in want:
                            want[kind] += 1
                assert trouble_counts(s, xids) == want, (odd, xids)
            ok = [g for g in gpus if not g.lost]
            utils = [g.util_gpu for g in ok if g.util_gpu is not None]
            power = sum((g.power for g in ok if g.power is not None), 0.0)
            totals = node_totals(s)
            assert (totals.gpus, totals.util_sum, totals.util_n) == (8, sum(utils), len(utils))
            assert totals.power == power and type(totals.util_sum) is float


def test_the_store_counts_a_nodes_last_snapshot_of_a_flush() -> None:
    """The header's parts of a live node's sample are computed as it is offered (its readings
    just decoded), for the version the flush gives it; a later snapshot of another kind in the
    same flush (the node gone stale, its hello changed) is what the flush counts, and so is an
    XID that came with the node's snapshot offered again."""
    from dataclasses import replace

    from gpuctl.core.model import NodeInfo
    from gpuctl.fleet.fleet import Fleet
    from gpuctl.tui.fleet_store import FleetStore

    class Link:
        kind = "simulated"
        holds_files = 0

    store = FleetStore(Fleet({"a": Link()}))  # type: ignore[dict-item]
    info = NodeInfo(hostname="a")
    live = NodeSnapshot(name="a", state=NodeState.LIVE, info=info, gpus=(gpu(0), gpu(1)))
    store.offer(live)
    store.take_pending()
    assert store.trouble()["down"] == 0 and store.totals().gpus == 2

    lost = replace(live, gpus=(gpu(0), gpu(1, state="lost")))
    store.offer(lost)  # the same kind: kept at once, its parts computed
    assert store.snaps["a"] is lost
    store.offer(replace(lost, state=NodeState.STALE))  # then stale, in the same flush
    store.take_pending()
    assert store.trouble()["down"] == 1 and store.trouble()["lost"] == 1
    assert store.totals().live == 0 and store.totals().util_mean == 50.0

    store.offer(replace(live, state=NodeState.STALE, info=NodeInfo(hostname="b")))
    store.take_pending()
    store.offer(replace(live, state=NodeState.STALE, gpus=(gpu(0, util_gpu=10), gpu(1))))
    store.offer(replace(live, info=info))  # live again, the first hello: counted by the flush
    store.take_pending()
    assert store.trouble()["down"] == 0 and store.totals().live == 1

    store.offer(live)
    store.xids.add(("a", 1))  # the app adds an XID, then offers the node's snapshot again
    store.offer(live)
    store.take_pending()
    assert store.trouble()["xid"] == 1
    assert store.totals() == cluster_totals_of(store)
    t = store.totals()
    assert store.counts() == (t.live, t.nodes, t.gpus)  # kept as parts move, not summed


def cluster_totals_of(store: object) -> object:
    """The header's totals computed afresh from every node's kept snapshot."""
    from gpuctl.tui.view import cluster_totals, node_totals

    snaps = store.snaps.values()  # type: ignore[attr-defined]
    down = (NodeState.LIVE, NodeState.STALE)
    return cluster_totals(
        [(s.state is NodeState.LIVE, node_totals(s) if s.state in down else None) for s in snaps]
    )


def test_the_counts_follow_nodes_as_they_change_come_and_leave() -> None:
    """``FleetStore.counts`` (what the header checks at every flush) is kept as each node's
    part moves, not summed: after any mix of snapshots of every state and size, flushes, nodes
    leaving and coming back, it is what ``totals`` counts afresh."""
    import random

    from gpuctl.core.model import NodeInfo
    from gpuctl.fleet.fleet import Fleet
    from gpuctl.tui.fleet_store import FleetStore

    class Link:
        kind = "simulated"
        holds_files = 0

    rng = random.Random(7)
    store = FleetStore(Fleet({n: Link() for n in "abc"}))  # type: ignore[misc]
    infos = [NodeInfo(hostname="x"), NodeInfo(hostname="y")]
    seen = set()
    for _ in range(400):
        name = rng.choice("abcde")  # d and e come later
        if rng.random() < 0.1:
            store.leave(name, "left the store")
        else:
            gpus = tuple(gpu(i) for i in range(rng.randrange(4)))
            state = rng.choice(list(NodeState))
            store.offer(NodeSnapshot(name=name, state=state, info=rng.choice(infos), gpus=gpus))
        if rng.random() < 0.5:
            seen |= set(store.take_removed())
            store.take_pending()
        t = store.totals()
        assert store.counts() == (t.live, t.nodes, t.gpus)
    assert seen and t.live and t.gpus  # the mix had nodes leaving, and live ones with GPUs


def test_xid_gpus_follow_the_xids_as_they_grow_are_replaced_and_nodes_leave() -> None:
    """``FleetStore.xid_gpus`` (asked for every sample) answers from an index of ``xids``: after
    any mix of XIDs added, nodes leaving (``take_removed`` replaces the set), a set put in its
    place of the same size, and callers changing the set they were given, it is what a walk
    over ``xids`` finds."""
    import random

    from gpuctl.fleet.fleet import Fleet
    from gpuctl.tui.fleet_store import FleetStore

    class Link:
        kind = "simulated"
        holds_files = 0

    rng = random.Random(11)
    store = FleetStore(Fleet({n: Link() for n in "abc"}))  # type: ignore[misc]
    replaced = left = 0
    for _ in range(300):
        name = rng.choice("abcd")
        roll = rng.random()
        if roll < 0.6:
            store.xids.add((name, rng.randrange(8)))  # as the app does at an XID event
        elif roll < 0.7:
            store.offer(NodeSnapshot(name=name, state=NodeState.LIVE, gpus=(gpu(0),)))
            store.leave(name, "left")
            store.take_pending()
            left += len(store.take_removed())
        elif roll < 0.8 and store.xids:  # another set, as large, other GPUs
            store.xids = {(n, i + 8) for n, i in store.xids}
            replaced += 1
        for n in "abcd":
            got = store.xid_gpus(n)
            assert got == {i for m, i in store.xids if m == n}
            got.add(-1)  # the caller's own set
        assert all(-1 not in store.xid_gpus(n) for n in "abcd")
    assert replaced and left and store.xids  # the mix did each
