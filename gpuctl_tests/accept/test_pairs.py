"""``gpuctl accept --pairs`` (#43.3): all-reduce between pairs of nodes, then bisection to the
slow or failing node or link. The logic over pair results given by the test (its cases), then
for real: four Slurm nodes, each in its own network namespace, one of them with its link
throttled (a token bucket on its veth), found by the real suite's all-reduce over gloo."""

from __future__ import annotations

import asyncio
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpuctl.accept.pairs import PairResult, find_bad
from gpuctl.accept.results import junit_xml
from gpuctl_tests.accept.test_cli import gpuctl
from gpuctl_tests.helpers import wait_until_async


def pairs_of(
    speed: dict[str, float],
    bad_links: frozenset[frozenset[str]] = frozenset(),
    dead: frozenset[str] = frozenset(),
) -> tuple[Any, list[tuple[str, str, int]]]:
    """A ``run_pair`` answering from a table: a pair runs at its slower node's speed, 0.01 on a
    bad link, fails with a dead node; it checks that no node is in two pairs at once."""
    busy: set[str] = set()
    calls: list[tuple[str, str, int]] = []

    async def run_pair(a: str, b: str, round_: int) -> PairResult:
        assert not busy & {a, b}, f"{a}-{b} overlaps a pair still running"
        busy.update((a, b))
        calls.append((a, b, round_))
        await asyncio.sleep(0)  # the other pairs of the round start meanwhile
        busy.difference_update((a, b))
        if dead & {a, b}:
            return PairResult((a, b), False, None, "rank 1: timed out", round=round_)
        bw = 0.01 if frozenset((a, b)) in bad_links else min(speed[a], speed[b])
        return PairResult((a, b), True, bw, round=round_)

    return run_pair, calls


def nodes(n: int) -> list[str]:
    return [f"n{i:02d}" for i in range(1, n + 1)]


async def test_a_slow_node_is_found_with_a_good_partner() -> None:
    speed = dict.fromkeys(nodes(4), 10.0) | {"n03": 1.0}
    run_pair, calls = pairs_of(speed)
    got = await find_bad(nodes(4), run_pair)
    assert got["verdict"] == "FAIL" and list(got["bad_nodes"]) == ["n03"]
    assert got["bad_nodes"]["n03"].startswith("n03-n01 1.000 GB/s (a good partner); n03-n04")
    assert got["bad_links"] == [] and got["best_busbw"] == 10.0
    assert calls == [("n01", "n02", 1), ("n03", "n04", 1), ("n03", "n01", 2), ("n04", "n02", 2)]
    assert got["nodes"]["n03"]["verdict"] == "FAIL" and got["nodes"]["n04"]["verdict"] == "PASS"


async def test_a_bad_link_between_two_good_nodes_is_named_as_the_link() -> None:
    run_pair, _ = pairs_of(dict.fromkeys(nodes(4), 10.0), frozenset({frozenset(("n01", "n02"))}))
    got = await find_bad(nodes(4), run_pair)
    assert got["bad_nodes"] == {}
    (link,) = got["bad_links"]
    assert (
        link["nodes"] == ["n01", "n02"]
        and "while each is good with another node" in link["evidence"]
    )
    assert got["failures"][0].startswith("link n01-n02: n01-n02 0.010 GB/s")


async def test_a_dead_node_fails_its_pairs_and_the_odd_node_is_tested_too() -> None:
    run_pair, calls = pairs_of(dict.fromkeys(nodes(5), 10.0), dead=frozenset({"n02"}))
    got = await find_bad(nodes(5), run_pair)
    assert list(got["bad_nodes"]) == ["n02"] and "timed out" in got["bad_nodes"]["n02"]
    assert ("n05", "n03", 2) in calls  # the odd node out, with a good partner (a second wave)


async def test_the_pass_as_junit_fails_the_bad_node_and_its_pairs_and_the_bad_link() -> None:
    """``--pairs --junit``: was left out (the pass returned before the suite's JUnit)."""
    speed = dict.fromkeys(nodes(4), 10.0)
    run_pair, _ = pairs_of(speed, dead=frozenset({"n02"}))
    xml = ET.fromstring(junit_xml(await find_bad(nodes(4), run_pair)))
    failed = {
        (case.get("classname"), case.get("name")): case.find("failure").get("message")
        for case in xml.iter("testcase")
        if case.find("failure") is not None
    }
    assert set(failed) >= {("nodes", "n02")} and "timed out" in failed[("nodes", "n02")]
    assert {k for k in failed if k[0] == "nodes"} == {("nodes", "n02")}
    assert failed.keys() - {("nodes", "n02")}, "the dead node's pairs fail too"
    assert all("n02" in name for kind, name in failed if kind == "pairs"), failed
    assert xml.get("failures") == str(len(failed))
    run_pair, _ = pairs_of(speed, frozenset({frozenset(("n01", "n02"))}))
    xml = ET.fromstring(junit_xml(await find_bad(nodes(4), run_pair)))
    (case,) = [c for c in xml.iter("testcase") if c.find("failure") is not None]
    assert case.get("name") == "n01-n02 round 1" and case.get("classname") == "pairs"
    assert "while each is good with another node" in case.find("failure").get("message")


async def test_suspects_outnumbering_good_nodes_go_in_waves() -> None:
    speed = dict.fromkeys(nodes(6), 10.0) | {"n01": 1.0, "n03": 1.0}
    run_pair, calls = pairs_of(speed)
    got = await find_bad(nodes(6), run_pair)
    assert sorted(got["bad_nodes"]) == ["n01", "n03"]
    assert [c for c in calls if c[2] == 2] == [
        ("n01", "n05", 2), ("n02", "n06", 2), ("n03", "n05", 2), ("n04", "n06", 2),
    ]  # fmt: skip


async def test_with_no_good_pair_every_node_is_named() -> None:
    run_pair, _ = pairs_of(dict.fromkeys(nodes(2), 10.0), dead=frozenset({"n01"}))
    got = await find_bad(nodes(2), run_pair)
    assert sorted(got["bad_nodes"]) == ["n01", "n02"] and got["untested"] == ["n01", "n02"]


def test_pairs_needs_slurm_and_two_nodes(tmp_path: Path) -> None:
    for extra, words in (
        (("--nodes", "n[1-2]"), "--pairs runs each pair of nodes as a two-node Slurm job"),
        (("--via", "slurm", "--nodes", "n1"), "--pairs needs two nodes or more in --nodes"),
        (("--via", "slurm"), "gpuctl: --pairs needs --nodes HOSTLIST"),
    ):
        r = gpuctl(tmp_path, "--pairs", *extra)
        assert r.returncode == 2 and words in r.stderr, r.stderr


def veth(net: Any, i: int) -> str:
    out = subprocess.run(
        net.enter(i, ["ip", "-o", "link", "show"]), capture_output=True, text=True, check=True
    ).stdout
    return next(
        line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if " lo:" not in line
    )


@pytest.mark.slow
@pytest.mark.slurm
def test_pairs_find_the_node_whose_link_is_throttled(tmp_path: Path, slurm_nodes: Any) -> None:
    """node03's namespace sends through a 40 Mbit/s token bucket: its pairs' all-reduce is slow;
    the bisection names node03 and no other node, and --drain-failed drains it with the
    evidence as the reason."""
    net = slurm_nodes.net
    dev = veth(net, 2)
    tc = ["tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", "40mbit", "burst", "64kb"]
    subprocess.run(net.enter(2, [*tc, "latency", "100ms"]), check=True)
    try:
        r = gpuctl(
            tmp_path, "--pairs", "--via", "slurm", "--device", "cpu", "--quick",
            "--nodes", "node[01-04]", "--job-dir", str(tmp_path / "jobs"),
            "--report-dir", str(tmp_path / "D"), "--drain-failed",
            "--junit", str(tmp_path / "J" / "pairs.xml"), env=slurm_nodes.env,
        )  # fmt: skip
    finally:
        subprocess.run(net.enter(2, ["tc", "qdisc", "del", "dev", dev, "root"]), check=False)
        subprocess.run(
            ["scontrol", "update", "nodename=node03", "state=resume"],
            env=slurm_nodes.env, capture_output=True,
        )  # fmt: skip
    out = r.stdout
    print(out[-3000:])  # the pairs' figures
    assert r.returncode == 1, out[-3000:] + r.stderr[-3000:]
    assert "BAD NODE node03: node03-node01" in out and "BAD NODE node0" not in out.replace(
        "BAD NODE node03", ""
    )
    assert "drained node03 in Slurm: gpuctl accept: pairs: node03-node01" in out
    assert out.strip().splitlines()[-1].startswith("[RESULT] FAILURE")
    junit = ET.parse(tmp_path / "J" / "pairs.xml").getroot()  # its missing folder made
    bad = [c.get("name") for c in junit.iter("testcase") if c.get("classname") == "nodes"]
    assert sorted(bad) == ["node01", "node02", "node03", "node04"]
    failed = {c.get("name") for c in junit.iter("testcase") if c.find("failure") is not None}
    assert "node03" in failed and not failed & {"node01", "node02", "node04"}, failed


class FakeRun:
    """What ``start_slurm_run`` returns, for the pair runner's bookkeeping: a run that ends
    when the test says, and says whether it was cancelled."""

    def __init__(self, a: str, b: str, on_end: Callable[[], None] = lambda: None) -> None:
        self.nodes = (a, b)
        self.on_end = on_end
        self.done = asyncio.Event()
        self.cancelled = False

    async def wait(self) -> dict[str, Any]:
        await self.done.wait()
        await asyncio.sleep(0)  # the job's own end comes on a later turn of the loop
        self.on_end()
        section = {"verdict": "PASS", "busbw_gbps": 1.0}
        return {
            "nodes": {n: {"report": {"sections": {"ddp_allreduce": section}}} for n in self.nodes}
        }

    async def cancel(self) -> None:
        self.cancelled = True


async def test_slurm_pairs_keep_a_bounded_number_in_flight() -> None:
    from gpuctl.accept.pairs import slurm_pairs
    from gpuctl.accept.run import AcceptOptions

    runs: list[FakeRun] = []
    in_flight: list[int] = [0]  # submitted and not ended, as it went

    async def start(opts: Any, a: str, b: str) -> FakeRun:
        assert "--sweep-max" in opts.extra_args  # the pair's own options
        runs.append(FakeRun(a, b, on_end=lambda: in_flight.append(in_flight[-1] - 1)))
        runs[-1].done.set()  # its result is there; the wait still yields to the loop
        in_flight.append(in_flight[-1] + 1)
        return runs[-1]

    got = await find_bad(nodes(12), slurm_pairs(AcceptOptions(device="cpu"), start, in_flight=3))
    assert got["verdict"] == "PASS" and len(runs) == 6  # six pairs in round one
    # every submission started before any wait ended would reach 6; the bound holds it at 3
    assert max(in_flight) == 3, in_flight


async def test_a_refused_submission_cancels_the_pairs_in_flight() -> None:
    from gpuctl.accept.pairs import slurm_pairs
    from gpuctl.accept.run import AcceptOptions
    from gpuctl.reach.slurm import SlurmError

    runs: list[FakeRun] = []

    async def start(opts: Any, a: str, b: str) -> FakeRun:
        if a == "n05":
            await wait_until_async(lambda: len(runs) == 2, 10, "the other pairs submitted")
            raise SlurmError("sbatch: error: invalid partition")
        runs.append(FakeRun(a, b))
        return runs[-1]

    with pytest.raises(SlurmError):
        await find_bad(nodes(6), slurm_pairs(AcceptOptions(device="cpu"), start))
    assert [r.cancelled for r in runs] == [True, True]  # nothing left in Slurm's queue
