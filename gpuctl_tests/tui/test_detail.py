"""The detail screen an operator opens on a GPU in trouble (issue 26 §4): its readings and
throttle reasons first, then its processes, then the plots; axes that read as time and whole
numbers; throttle starts and ends as events; an XID named with what to do; facts whole at 80x24."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import msgspec
import pytest
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Static
from textual_plotext import PlotextPlot

from gpuctl.core.format import gpu_badge_names
from gpuctl.core.model import GpuSample, NodeEvent
from gpuctl.fleet.fixed_links import ReplayLink, recorded_node
from gpuctl.fleet.fleet import THROTTLE_HOLD_MAX_S, THROTTLE_HOLD_S, Fleet, Throttling
from gpuctl.node.metrics import BY_KEY, GIB
from gpuctl.tui import make_app
from gpuctl.tui.screens.detail import (
    NOW_FACTS,
    Facts,
    event_lines,
    event_text,
    now_facts,
    time_ticks,
    value_ticks,
)
from gpuctl.workloads.accept_suite.nodehealth import HARDWARE_XIDS, XIDS, xid_text
from gpuctl_tests.helpers import open_detail, until
from gpuctl_tests.tui.conftest import T0
from gpuctl_tests.tui.test_hostile import drawn

SAMPLES = 120
NOW = T0 + SAMPLES - 0.5


def test_an_xid_is_named_with_what_to_do_from_the_one_table() -> None:
    assert xid_text(79) == "XID 79: GPU has fallen off the bus: drain and reset the node"
    assert xid_text(48).startswith("XID 48: double-bit ECC error: drain")
    assert xid_text(999) == "XID 999: see NVIDIA's XID catalogue"
    assert xid_text("junk") == "XID junk: see NVIDIA's XID catalogue"
    # the acceptance suite's hardware XIDs (read from the table) are the ones it had
    assert sorted(HARDWARE_XIDS) == [48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120]
    assert HARDWARE_XIDS[79] == "GPU has fallen off the bus"
    assert {13, 31, 43, 45} <= XIDS.keys() and not any(XIDS[x].hardware for x in (13, 31, 43))


def test_the_now_facts_are_the_registrys_readings_in_its_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The "now" facts follow the metric registry's order; a reading the screen does not place
    shows as the registry prints it, in its place (they were a hand-written list)."""
    g = GpuSample(
        index=0,
        util_gpu=53,
        util_mem=20,
        mem_used=12 * GIB,
        mem_total=80 * GIB,
        temp=45,
        power=300.0,
        power_limit=700.0,
        sm_clock=1755,
        mem_clock=2619,
        fan=30,
        pstate="P0",
        enc=5,
        dec=7,
        pcie_tx=10**9,
        pcie_rx=2 * 10**9,
    )
    assert now_facts(g) == [
        "util 53%",
        "memory 12.0/80 GiB",
        "45°C",
        "power 300/700 W",
        "SM 1755 MHz",
        "mem clock 2619 MHz",
        "fan 30%",  # the registry's own: no line in NOW_FACTS
        "P0",
        "NVENC 5% NVDEC 7%",
        "PCIe TX 1.0GB/s RX 2.0GB/s",
    ]
    assert set(NOW_FACTS) <= set(BY_KEY) and "fan" not in NOW_FACTS
    assert "fan 30%" not in now_facts(msgspec.structs.replace(g, fan=None))  # unknown: left out
    monkeypatch.delitem(NOW_FACTS, "util_mem")  # as a new reading would be
    assert now_facts(g)[:2] == ["util 53%", "util_mem 20%"]


def test_axes_read_as_time_and_whole_numbers() -> None:
    assert time_ticks(119.5) == ([-90.0, -60.0, -30.0, 0.0], ["90s", "60s", "30s", "now"])
    assert time_ticks(1800.0)[1] == ["30m", "20m", "10m", "now"]
    assert time_ticks(6 * 3600.0)[1][-2:] == ["2h", "now"]
    first, last, ticks = value_ticks(2340.0, 2619.0)
    assert ticks == [2300, 2400, 2500, 2600, 2700] and (first, last) == (2300, 2700)
    assert value_ticks(59.7, 59.7)[2] == [58, 59, 60, 61]  # a flat line still has ticks
    assert value_ticks(0.0, 0.1)[0] == 0  # rates near 0 (PCIe of an idle link): no -1 below
    assert value_ticks(0.0, 0.0)[2][0] == 0
    assert value_ticks(0.0, 100.0)[2] == [0, 50, 100]


def test_a_throttle_starts_once_and_ends_after_the_hold() -> None:
    """A power cap at full load comes and goes every second: one start, not 40 a minute."""
    w = Throttling()
    t = 0.0
    assert w.update(t, 0, ("gpu_idle",)) is None  # an idle GPU is no event
    started = w.update(1.0, 0, ("sw_power_cap", "sw_thermal"))
    assert started is not None and started.kind == "throttle" and started.gpu == 0
    assert started.detail == {"started": ["sw_power_cap", "sw_thermal"], "ended": []}
    for k in range(2, 30):  # the cap flaps, the thermal slowdown stays
        reasons = ("sw_thermal",) if k % 2 else ("sw_thermal", "sw_power_cap")
        assert w.update(float(k), 0, reasons) is None
    assert w.update(30.0, 0, ()) is None  # gone, but not yet for the hold
    ended = w.update(30.0 + THROTTLE_HOLD_S, 0, ())
    assert ended is not None and ended.detail == {
        "started": [],
        "ended": ["sw_power_cap", "sw_thermal"],
    }
    assert w.update(50.0, 0, ()) is None
    for k in range(51, 60):  # an idle GPU's quiet reasons come and go
        assert w.update(float(k), 0, ("gpu_idle",) if k % 2 else ()) is None
    again = w.update(60.0, 0, ("gpu_idle", "hw_slowdown"))
    assert again is not None and again.detail == {"started": ["hw_slowdown"], "ended": []}
    assert w.update(61.0, 0, ()) is None and w.update(62.0, 0, ("gpu_idle",)) is None  # held
    ended = w.update(71.0, 0, ("gpu_idle",))
    assert ended is not None and ended.detail == {"started": [], "ended": ["hw_slowdown"]}


def test_a_power_cap_that_comes_back_every_20_s_is_one_episode_not_a_pair_each_time() -> None:
    """The demo's GPU 1: its cap off for ~12 s, back for ~8 s, for ten minutes. A fixed hold
    ended and restarted it every 20 s; a reason that comes back soon after it ended is held
    twice as long each time, so the flapping is one episode, ended once it stays away."""
    w = Throttling()
    events = []
    t = 0.0
    for _ in range(30):  # 30 cycles of 20 s
        for k in range(20):
            reasons = ("sw_power_cap",) if k < 8 else ()
            e = w.update(t + k, 1, reasons)
            if e is not None:
                events.append((t + k, e.detail))
        t += 20.0
    starts = [d for _, d in events if d["started"]]
    ends = [d for _, d in events if d["ended"]]
    assert len(starts) <= 3 and len(ends) <= 2, events  # was 30 pairs
    e = None
    for k in range(int(THROTTLE_HOLD_MAX_S) + 1):  # then it stays away: it ends, once
        e = w.update(t + k, 1, ()) or e
    assert e is not None and e.detail == {"started": [], "ended": ["sw_power_cap"]}
    # much later, a cap is a new episode with the short hold again
    later = t + 1000.0
    assert w.update(later, 1, ("sw_power_cap",)) is not None
    assert w.update(later + 1, 1, ()) is None
    ended = w.update(later + 1 + THROTTLE_HOLD_S, 1, ())
    assert ended is not None and ended.detail["ended"] == ["sw_power_cap"]


def detail_fleet() -> Fleet:
    """One node, GPU 0 burning (it heats into THERM and its power cap), an XID 79 on it."""
    xid = {"type": "event", "t": T0 + 90, "kind": "xid", "gpu": 0, "detail": {"xid": 79}}
    messages = recorded_node(
        "n-01", "2:H100", seed=11, t0=T0, samples=SAMPLES, load={0: 1.0}, events=[xid]
    )
    messages[0]["boot_time"] = T0 - 3 * 86400  # the node booted 3 days before the first sample
    return Fleet({"n-01": ReplayLink(messages)}, clock=lambda: NOW, stale_after=1e9)


async def test_detail_reads_now_then_processes_then_plots_and_names_the_trouble(
    tmp_path: Path,
) -> None:
    fleet = detail_fleet()
    app = make_app(fleet, clock=lambda: NOW, state_dir=tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(
            pilot, lambda: len(fleet.history("n-01", 0).series("util")[0]) == SAMPLES, "samples"
        )
        await until(pilot, lambda: app.overview.nodes.lines, "the node on screen")
        screen = await open_detail(pilot, "n-01", 0)
        now = screen.query_one("#detail-now", Facts)
        await until(pilot, lambda: "THERM" in now.text().plain, "the throttle reasons")
        await pilot.pause()
        text = now.text().plain.replace("\n", " ")  # a long fact wraps between its words
        assert "THERM: thermal slowdown" in text and "PWRCAP: at its power cap" in text
        assert "XID 79: GPU has fallen off the bus: drain and reset the node" in text
        # first the readings, then the processes, then the plots, then the static facts
        ys = [
            screen.query_one(q).region.y
            for q in ("#detail-now", "#detail-procs", "#plot-util", "#detail-facts")
        ]
        assert ys == sorted(ys) and len(set(ys)) == 4, ys
        procs = screen.query_one("#detail-procs", DataTable)
        assert procs.row_count and all(str(k.value).startswith("0:") for k in procs.rows)
        # throttle starts are events, the XID is named in the events too
        events = str(screen.query_one("#detail-events", Static).render())
        assert "GPU 0  PWRCAP sw_thermal" not in events
        assert any(line.endswith("started") and "THERM" in line for line in events.splitlines())
        assert "GPU 0  XID 79: GPU has fallen off the bus: drain and reset the node" in events
        # at 80x24 every fact of the readings is whole on one screen line
        screen_text = drawn(app)
        for para in now.paragraphs:
            for fact in para:
                if fact.cell_len <= now.content_size.width:
                    assert fact.plain in screen_text, fact.plain
                else:  # the XID: wrapped between its words
                    assert all(word in screen_text for word in fact.plain.split()), fact.plain
        # the facts at the bottom too (a GPU's UUID, "python 3.11.7" were broken mid-token)
        screen.query_one("#detail-body", VerticalScroll).scroll_end(animate=False, immediate=True)
        await pilot.pause()
        screen_text = drawn(app)
        facts = screen.query_one("#detail-facts", Facts)
        assert facts.paragraphs
        assert "up 3d" in [fact.plain for fact in facts.paragraphs[0]]  # the hello's boot_time
        for para in facts.paragraphs:
            for fact in para:
                assert fact.plain in screen_text, fact.plain
        # the time axis reads as ages; the value axis in whole numbers
        plot = screen.query_one("#plot-temp", PlotextPlot)
        rendered = plot.plt.build()
        assert "now" in rendered and "30s" in rendered and "seconds ago" not in rendered
        assert "." not in "".join(line.split("┤")[0] for line in rendered.splitlines())


async def test_this_gpus_events_come_first_and_a_flapping_power_cap_is_one_line(
    tmp_path: Path,
) -> None:
    """Issue 39.7: the events were the node's, led by another GPU's power cap coming and going
    (``GPU 1 PWRCAP ended``, ``GPU 1 PWRCAP started``...), and the selected GPU's own THERM
    start was below them; the "now" box did not say a burn runs on this GPU; the clock plot's
    two lines had no key; 0 50 100 stood 3 and 4 rows apart."""
    flaps = [
        {
            "type": "event",
            "t": T0 + 20 + 8 * k,
            "kind": "throttle",
            "gpu": 1,
            "detail": {"started": [], "ended": ["sw_power_cap"]}
            if k % 2
            else {"started": ["sw_power_cap"], "ended": []},
        }
        for k in range(12)
    ]
    messages = recorded_node(
        "n-01", "2:H100", seed=11, t0=T0, samples=SAMPLES, load={0: 1.0}, events=flaps
    )
    fleet = Fleet({"n-01": ReplayLink(messages)}, clock=lambda: NOW, stale_after=1e9)
    app = make_app(fleet, clock=lambda: NOW, state_dir=tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(
            pilot, lambda: len(fleet.history("n-01", 0).series("util")[0]) == SAMPLES, "samples"
        )
        await until(pilot, lambda: app.overview.nodes.lines, "the node on screen")
        fleet.annotate("n-01", 0, burn={"state": "running", "tflops": 648.0, "errors": 0})
        screen = await open_detail(pilot, "n-01", 0)
        now = screen.query_one("#detail-now", Facts)
        await until(pilot, lambda: "BURN 648 TF/s 0 err" in now.text().plain, "the burn")
        # the burn comes first: it is why this GPU is hot and capped
        assert now.text().plain.startswith("BURN 648 TF/s 0 err")
        lines = event_lines(fleet.events("n-01"), 0, NOW)
        assert "GPU 0  THERM" in lines[0][0] and lines[0][0].endswith("started"), lines
        assert not lines[0][1]  # this GPU's: not dimmed
        others = [(line, dim) for line, dim in lines if "GPU 1" in line]
        assert len(others) == 1 and others[0][1], lines  # one line, dimmed
        folded = re.search(r"GPU 1  PWRCAP ×(\d+) in \S+$", others[0][0])
        assert folded and int(folded[1]) >= 12, others  # ours, and any its samples made
        await pilot.pause()
        screen_text = drawn(app)
        assert "GPU 0  THERM started" in screen_text and "GPU 1  PWRCAP ×" in screen_text
        assert "events: GPU 0 first" in screen_text
        # the clocks' two lines have a key; a plot's value ticks stand evenly apart
        clock = screen.query_one("#plot-clock", PlotextPlot).plt.build()
        assert "SM" in clock and "memory" in clock
        for metric in ("util", "temp", "power", "clock"):
            plot = screen.query_one(f"#plot-{metric}", PlotextPlot)
            plot.plt.plotsize(plot.size.width, plot.size.height)  # as its render does
            rendered = plot.plt.build()
            rows = [i for i, line in enumerate(rendered.splitlines()) if "┤" in line]
            gaps = {b - a for a, b in itertools.pairwise(rows)}
            assert len(rows) >= 3 and len(gaps) == 1, (metric, rows)


def test_throttle_badges_come_in_one_order_whatever_the_reader_sent() -> None:
    """Issue 39.10: one reader sent ``sw_power_cap, sw_thermal``, another the other way round,
    and an event listed them as they came: ``THERM PWRCAP`` here, ``PWRCAP THERM`` there."""
    one = GpuSample(0, throttle=("sw_power_cap", "sw_thermal"))
    other = GpuSample(0, throttle=("sw_thermal", "sw_power_cap"))
    assert gpu_badge_names(one) == gpu_badge_names(other) == ["THERM", "PWRCAP"]
    started = NodeEvent(0.0, "throttle", 0, {"started": ["sw_power_cap", "sw_thermal"]})
    assert event_text(started) == "THERM PWRCAP started"
