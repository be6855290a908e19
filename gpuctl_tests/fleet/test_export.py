"""``gpuctl export``: a real HTTP endpoint scraped and parsed with prometheus-client's own parsers,
its values checked against the fleet that feeds it."""

from __future__ import annotations

import asyncio
import json
import selectors
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from gpuctl.core.model import NodeState
from gpuctl.fleet.export import METRICS, FleetExporter, MetricsServer
from gpuctl.fleet.fleet import Fleet, simulated_fleet
from gpuctl.fleet.links import NodeLink
from gpuctl.fleet.replay import FailingLink, ReplayLink, recorded_node
from gpuctl_tests.helpers import node_env

Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(url: str, *, openmetrics: bool = False) -> Samples:
    """GET ``url`` and parse it: metric sample name -> [(labels, value)]."""
    accept = "application/openmetrics-text; version=1.0.0" if openmetrics else "text/plain"
    req = urllib.request.Request(url, headers={"Accept": accept})
    with urllib.request.urlopen(req, timeout=10) as resp:
        kind = resp.headers["Content-Type"]
        text = resp.read().decode()
    if openmetrics:
        assert kind.startswith("application/openmetrics-text"), kind
        families = openmetrics_families(text)
    else:
        assert kind.startswith("text/plain"), kind
        families = text_string_to_metric_families(text)
    out: Samples = {}
    for family in families:
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def one(samples: Samples, name: str, **labels: str) -> float:
    found = [
        v for lab, v in samples.get(name, []) if all(lab.get(k) == x for k, x in labels.items())
    ]
    assert len(found) == 1, (name, labels, found)
    return found[0]


# -- the real command ----------------------------------------------------------------------------
class Exporter:
    """``gpuctl export`` as a user starts it, with its URL read from its first line."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuctl", "export", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=node_env(),
        )

    def url(self, timeout: float = 30.0) -> str:
        assert self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            self.proc.kill()
            pytest.fail("gpuctl export printed no URL")
        line = self.proc.stdout.readline()
        assert line.startswith("gpuctl export: http://127.0.0.1:"), line
        return line.split()[2]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)


@pytest.fixture
def demo_export() -> Iterator[Exporter]:
    exporter = Exporter("--demo", "--listen", "127.0.0.1:0")
    try:
        yield exporter
    finally:
        if exporter.proc.poll() is None:
            exporter.proc.kill()
            exporter.proc.wait()


def _until(pred: Any, what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)  # a poll interval: the deadline decides


def test_demo_export_serves_every_gpu_of_the_demo_fleet(demo_export: Exporter) -> None:
    url = demo_export.url()
    # The demo fleet is seeded: `status --demo --json` reads the same GPUs (uuids, models, sizes).
    status = subprocess.run(
        [sys.executable, "-m", "gpuctl", "status", "--demo", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=node_env(),
    )
    assert status.returncode == 0, status.stderr
    nodes = json.loads(status.stdout)["nodes"]

    def all_up() -> Samples | None:
        s = scrape(url)
        ups = s.get("gpuctl_node_up", [])
        return s if len(ups) == len(nodes) and all(v == 1 for _, v in ups) else None

    samples = _until(all_up, "every demo node up")
    for node in nodes:
        name = node["name"]
        assert one(samples, "gpuctl_node_state", node=name, gpuctl_node_state="live") == 1
        assert 0 <= one(samples, "gpuctl_node_last_sample_age_seconds", node=name) < 10
        for gpu in node["gpus"]:
            labels = {
                "node": name,
                "gpu": str(gpu["index"]),
                "uuid": gpu["uuid"],
                "model": gpu["name"],
            }
            assert one(samples, "DCGM_FI_DEV_FB_TOTAL", **labels) == gpu["mem_total"] / 2**20
            assert 0 <= one(samples, "DCGM_FI_DEV_GPU_UTIL", **labels) <= 100
            assert 0 < one(samples, "DCGM_FI_DEV_GPU_TEMP", **labels) < 120
            assert one(samples, "DCGM_FI_DEV_POWER_USAGE", **labels) > 0
            assert one(samples, "DCGM_FI_DEV_SM_CLOCK", **labels) > 0
            used = one(samples, "DCGM_FI_DEV_FB_USED", **labels)
            assert used + one(samples, "DCGM_FI_DEV_FB_FREE", **labels) == pytest.approx(
                gpu["mem_total"] / 2**20
            )
    # The demo's story: GPU 5 of the second node reports XID 79.
    xid = {"node": nodes[1]["name"], "gpu": "5"}
    samples = _until(
        lambda: (
            (s := scrape(url, openmetrics=True))
            and any(v == 79 for lab, v in s.get("DCGM_FI_DEV_XID_ERRORS", []) if _has(lab, xid))
            and s
        ),
        "the demo's XID",
    )
    assert one(samples, "gpuctl_gpu_xid_errors_total", xid="79", **xid) == 1
    assert demo_export.stop() == 0


def _has(labels: dict[str, str], want: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in want.items())


def test_bad_listen_is_one_line() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = f"127.0.0.1:{busy.getsockname()[1]}"
        for listen, says in (
            ("nonsense", "--listen must be HOST:PORT"),
            ("127.0.0.1:99999", "a port within 0..65535"),
            ("0.0.0.0:9400", "not a loopback address"),
            ("10.1.2.3:9400", "--allow-remote"),
            (taken, f"cannot listen on {taken}: Address already in use"),
        ):
            r = subprocess.run(
                [sys.executable, "-m", "gpuctl", "export", "--demo", "--listen", listen],
                capture_output=True,
                text=True,
                timeout=60,
                env=node_env(),
            )
            assert r.returncode == 2, (listen, r.stderr)
            assert r.stderr.count("\n") == 1 and says in r.stderr, (listen, r.stderr)
            assert r.stderr.startswith("gpuctl: ") and r.stdout == ""


# -- the collector over fleets whose values are known -------------------------------------------
async def _scrape(server: MetricsServer, **kw: Any) -> Samples:
    return await asyncio.to_thread(scrape, server.url(), **kw)


async def _until_async(pred: Any, what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := await pred()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)  # a poll interval: the deadline decides
    return value


async def test_metrics_are_the_fleets_snapshots() -> None:
    xid_event = {
        "type": "event",
        "t": 1_700_000_029.5,
        "kind": "xid",
        "gpu": 1,
        "detail": {"xid": 48},
    }
    links: dict[str, NodeLink] = {
        "n1": ReplayLink(recorded_node("n1", "2:H100", load={0: 1.0}, events=[xid_event])),
        "n2": ReplayLink(recorded_node("n2", "1:A100", seed=1)),
        "down": FailingLink("refused", "connection refused"),
    }
    fleet = Fleet(links, backoff_base=30.0)
    server = MetricsServer(FleetExporter(fleet), "127.0.0.1", 0)
    await fleet.start()
    try:

        async def settled() -> Samples | None:
            s = await _scrape(server)
            ok = (
                fleet.snapshot("down").state is NodeState.UNREACHABLE
                and len(s.get("DCGM_FI_DEV_GPU_UTIL", [])) == 3
                and s.get("gpuctl_gpu_xid_errors_total")
            )
            return s if ok else None

        samples = await _until_async(settled, "every node settled")
        fleet.annotate("n1", 1, slurm_job="4242", slurm_user="alice")
        samples = await _scrape(server)
        assert one(samples, "gpuctl_node_up", node="down", link="ssh") == 0
        assert one(samples, "gpuctl_node_state", node="down", gpuctl_node_state="unreachable") == 1
        assert not [lab for lab, _ in samples["DCGM_FI_DEV_GPU_UTIL"] if lab["node"] == "down"]
        for name in ("n1", "n2"):
            snap = fleet.snapshot(name)
            assert snap.info is not None
            assert one(samples, "gpuctl_node_up", node=name, link="simulated") == 1
            assert one(samples, "gpuctl_node_info", node=name, hostname=name) == 1
            age = one(samples, "gpuctl_node_last_sample_age_seconds", node=name)
            assert snap.last_sample_t is not None and age >= time.time() - snap.last_sample_t - 1
            for g in snap.gpus:
                st = snap.info.gpus[g.index]
                labels = {
                    "node": name,
                    "gpu": str(g.index),
                    "uuid": g.uuid or "",
                    "model": st.name or "",
                }
                for m in METRICS:
                    value = m.read(g)
                    if value is None:
                        assert not [x for lab, x in samples.get(m.name, []) if _has(lab, labels)]
                    else:
                        assert one(samples, m.name, **labels) == pytest.approx(value), m.name
                assert one(samples, "DCGM_FI_DEV_GPU_UTIL", **labels) == g.util_gpu
                assert one(samples, "DCGM_FI_DEV_FB_USED", **labels) == (g.mem_used or 0) / 2**20
                assert one(samples, "DCGM_FI_DEV_POWER_USAGE", **labels) == g.power
                for reason in ("sw_thermal", "hw_slowdown", "gpu_idle"):
                    active = reason in (g.throttle or ())
                    got = one(samples, "gpuctl_gpu_throttle_reason", reason=reason, **labels)
                    assert got == float(active)
        n1 = fleet.snapshot("n1")
        assert "sw_power_cap" in (n1.gpus[0].throttle or ()) or "sw_thermal" in (
            n1.gpus[0].throttle or ()
        )  # GPU 0 runs at full load: one of the two holds its clocks
        assert one(samples, "DCGM_FI_DEV_XID_ERRORS", node="n1", gpu="1") == 48
        assert one(samples, "DCGM_FI_DEV_XID_ERRORS", node="n1", gpu="0") == 0
        assert one(samples, "gpuctl_gpu_xid_errors_total", node="n1", gpu="1", xid="48") == 1
        assert one(samples, "gpuctl_gpu_slurm_job_info", node="n1", gpu="1") == 1
        job = [lab for lab, _ in samples["gpuctl_gpu_slurm_job_info"]]
        assert job == [{**job[0], "job": "4242", "user": "alice"}] and job[0]["node"] == "n1"
    finally:
        server.close()
        await fleet.stop()


async def test_a_node_that_goes_silent_shows_up_0() -> None:
    fleet = simulated_fleet([("a", "2:H100"), ("b", "1:L40S")], interval=0.2, stale_after=0.6)
    server = MetricsServer(FleetExporter(fleet), "127.0.0.1", 0)
    await fleet.start()
    try:

        async def up(node: str, want: float) -> Samples | None:
            s = await _scrape(server)
            got = [v for lab, v in s.get("gpuctl_node_up", []) if lab["node"] == node]
            return s if got == [want] else None

        await _until_async(lambda: up("b", 1.0), "b up")
        await fleet.request("b", {"type": "simulate", "action": "stall", "seconds": 30})
        samples = await _until_async(lambda: up("b", 0.0), "b down")
        assert one(samples, "gpuctl_node_state", node="b", gpuctl_node_state="stale") == 1
        assert one(samples, "gpuctl_node_last_sample_age_seconds", node="b") > 0.6
        assert one(samples, "gpuctl_node_up", node="a", link="simulated") == 1
        gpus = {lab["node"] for lab, _ in samples["DCGM_FI_DEV_GPU_TEMP"]}
        assert gpus == {"a"}  # a stale node's last values are not served as current
    finally:
        server.close()
        await fleet.stop()


def test_export_is_not_reachable_beyond_loopback_by_default() -> None:
    # The default --listen is loopback: nothing in the parser or the command binds elsewhere.
    from gpuctl.cli.main import build_parser

    args = build_parser().parse_args(["export"])
    assert args.listen == "127.0.0.1:9400" and not args.allow_remote
