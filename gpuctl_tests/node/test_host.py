"""The node's host figures: /proc read by ``HostStats`` (a fixed /proc tree, then the real one
through an agent under Python 3.6), and what the login side makes of them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuctl.core import wire
from gpuctl.core.format import fmt_rate, host_text
from gpuctl.core.model import HostSample
from gpuctl.node.readers.host import HOST_FIELDS, HostStats
from gpuctl_tests.helpers import AgentProcess
from gpuctl_tests.node.nvml_stub import NvmlStub, build
from gpuctl_tests.node.test_gpu_processes import start_agent

GIB = 1 << 30
NET_HEAD = (
    "Inter-|   Receive                            |  Transmit\n"
    " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets ...\n"
)


def write_proc(root: Path, cpu: list[int], rx: int, tx: int, lo: int) -> None:
    (root / "net").mkdir(parents=True, exist_ok=True)
    (root / "stat").write_text("cpu  " + " ".join(map(str, cpu)) + "\ncpu0 1 2 3 4\nbtime 1\n")
    (root / "meminfo").write_text(
        "MemTotal:       16384000 kB\nMemFree:  1000 kB\nMemAvailable:    4096000 kB\n"
    )
    (root / "loadavg").write_text("3.50 2.25 1.00 2/345 6789\n")
    (root / "net" / "dev").write_text(
        NET_HEAD
        + f"    lo: {lo} 10 0 0 0 0 0 0 {lo} 10 0 0 0 0 0 0\n"
        + f"  eth0: {rx} 10 0 0 0 0 0 0 {tx} 10 0 0 0 0 0 0\n"
        + f"  ib0: {rx} 10 0 0 0 0 0 0 {tx} 10 0 0 0 0 0 0\n"
    )


def test_cpu_memory_load_and_network_from_proc(tmp_path: Path) -> None:
    now = [100.0]
    stats = HostStats(str(tmp_path), clock=lambda: now[0])
    # user nice system idle iowait irq softirq steal
    write_proc(tmp_path, [100, 0, 100, 700, 100, 0, 0, 0], rx=1000, tx=500, lo=10**9)
    first = stats.sample()
    assert set(first) == set(HOST_FIELDS)
    assert (first["cpu"], first["net_rx"], first["net_tx"]) == (None, None, None)
    assert (first["mem_total"], first["mem_available"]) == (16384000 * 1024, 4096000 * 1024)
    assert first["load"] == [3.5, 2.25, 1.0]
    assert first["cpus"] == os.cpu_count()
    # 400 more jiffies: 300 busy (user 200 + system 100), idle 50, iowait 50
    write_proc(tmp_path, [300, 0, 200, 750, 150, 0, 0, 0], rx=5000, tx=900, lo=2 * 10**9)
    now[0] = 102.0
    second = stats.sample()
    assert second["cpu"] == 75.0
    # two interfaces, loopback left out: (4000 + 4000) bytes in 2 s
    assert (second["net_rx"], second["net_tx"]) == (4000.0, 400.0)
    # a counter that went back is no rate; a file that is gone is null, not an error
    write_proc(tmp_path, [300, 0, 200, 750, 150, 0, 0, 0], rx=10, tx=900, lo=0)
    (tmp_path / "loadavg").unlink()
    now[0] = 105.0  # LOAD_EVERY_S after the first read: the load averages are read again
    third = stats.sample()
    assert (third["net_rx"], third["net_tx"], third["load"]) == (None, 0.0, None)
    assert third["cpu"] is None  # no jiffies passed


def test_the_cpu_count_is_read_again_every_minute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """os.cpu_count() reads /sys each time (9 us of a 59 us host sample): once a minute."""
    from gpuctl.node.readers import host

    now = [100.0]
    counts = iter([8, 6, 4])
    monkeypatch.setattr(host.os, "cpu_count", lambda: next(counts))
    stats = HostStats(str(tmp_path), clock=lambda: now[0])
    write_proc(tmp_path, [100, 0, 100, 700, 100, 0, 0, 0], rx=1000, tx=500, lo=0)
    assert [stats.sample()["cpus"] for _ in range(3)] == [8, 8, 8]
    now[0] += host.CPUS_EVERY_S - 1
    assert stats.sample()["cpus"] == 8
    now[0] += 1
    assert stats.sample()["cpus"] == 6  # a CPU went offline: seen within a minute


def test_the_load_averages_are_read_every_five_seconds(tmp_path: Path) -> None:
    """The kernel computes them every 5 s (LOAD_EVERY_S): read as often, not every sample."""
    now = [100.0]
    stats = HostStats(str(tmp_path), clock=lambda: now[0])
    write_proc(tmp_path, [100, 0, 100, 700, 100, 0, 0, 0], rx=1000, tx=500, lo=0)
    assert stats.sample()["load"] == [3.5, 2.25, 1.0]
    (tmp_path / "loadavg").write_text("7.00 3.00 1.50 2/345 6789\n")
    now[0] += 4.0
    assert stats.sample()["load"] == [3.5, 2.25, 1.0]
    now[0] += 1.0
    assert stats.sample()["load"] == [7.0, 3.0, 1.5]


def test_an_nvml_agent_sends_this_machines_host_under_python36(
    tmp_path: Path, agents: list[AgentProcess]
) -> None:
    """The bundle under Python 3.6 over the stand-in NVML: the host is this machine's."""
    stub = NvmlStub(build(tmp_path), tmp_path / "nvml.conf", "count 1\n")
    agent = start_agent(stub, tmp_path, agents)
    first = agent.read_until(lambda m: m["type"] == "sample")
    later = agent.read_until(lambda m: m["type"] == "sample" and m["host"]["cpu"] is not None)
    with open("/proc/meminfo") as f:
        total = int(next(line for line in f if line.startswith("MemTotal:")).split()[1]) * 1024
    assert first["host"]["cpu"] is None and first["host"]["net_rx"] is None
    host = later["host"]
    assert host["mem_total"] == total and 0 < host["mem_available"] <= total
    assert host["cpus"] == os.cpu_count() and 0.0 <= host["cpu"] <= 100.0
    assert len(host["load"]) == 3 and host["net_rx"] >= 0.0 and host["net_tx"] >= 0.0


def test_host_values_from_a_node_are_checked_and_shown() -> None:
    h = wire.lenient(
        HostSample,
        {
            "cpu": 23.4,
            "cpus": 64,
            "mem_total": 503 * GIB,
            "mem_available": 383 * GIB,
            "load": [12.34, 10.0, 9.0],
            "net_rx": 1.2e9,
            "net_tx": 3.4e8,
        },
    )
    assert h is not None and h.mem_used == 120 * GIB
    assert host_text(h) == "cpu 23% of 64  mem 120/503G  load 12.3  net ↓1.2GB/s ↑340MB/s"
    junk = wire.lenient(
        HostSample,
        {
            "cpu": 250,
            "cpus": -1,
            "mem_total": "lots",
            "mem_available": 10**30,
            "load": [1.0, "x"],
            "net_rx": -5.0,
            "net_tx": 1e300,
        },
    )
    assert junk == HostSample()
    assert host_text(HostSample()) == ""
    assert wire.lenient(HostSample, None) is None and wire.lenient(HostSample, [1]) is None
    assert fmt_rate(999) == "999B/s" and fmt_rate(12_345) == "12kB/s"


@pytest.mark.parametrize("host", [None, {"cpu": 5.0}])
def test_a_sample_carries_its_host(host: object) -> None:
    from gpuctl.fleet.session import decode_sample

    sample = decode_sample({"type": "sample", "t": 1.0, "gpus": [], "host": host})
    assert sample.host == (None if host is None else HostSample(cpu=5.0))
