"""``--interval`` on the command line and ``interval`` per cluster: real agents (local agent
subprocesses of simulated GPUs) say in their hello how often they sample."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from gpuctl.cli.common import build_fleet
from gpuctl.core.model import NodeState
from gpuctl.fleet.fleet import Fleet
from gpuctl_tests.helpers import REPO, wait_until_async

CONFIG = """
[clusters.slow]
nodes = "slow[1-2]"
via = "local"
simulate = "1:H100"
interval = 2.5

[clusters.fast]
nodes = "fast1"
via = "local"
simulate = "1:A100"
interval = 0.5
"""


async def live_intervals(fleet: Fleet) -> dict[str, float]:
    """Each node's sampling interval as its agent's hello said, once every node is live."""
    await fleet.start()
    try:
        live = lambda: all(s.state is NodeState.LIVE for s in fleet.snapshots())  # noqa: E731
        await wait_until_async(live, 60, "every node live", now=fleet.snapshots)
        return {name: rt.interval for name, rt in fleet.nodes.items()}
    finally:
        await fleet.stop()


def args(config: Path, **kw: object) -> argparse.Namespace:
    return argparse.Namespace(config=str(config), read_only=False, demo=False, **kw)


async def test_interval_per_cluster_and_from_the_command_line(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(CONFIG)
    got = await live_intervals(build_fleet(args(path, interval=None)))
    assert got == {"slow1": 2.5, "slow2": 2.5, "fast1": 0.5}
    got = await live_intervals(build_fleet(args(path, interval=0.25)))
    assert got == {"slow1": 0.25, "slow2": 0.25, "fast1": 0.25}


async def test_demo_interval(tmp_path: Path) -> None:
    fleet = build_fleet(argparse.Namespace(demo=True, read_only=False, interval=0.3))
    got = await live_intervals(fleet)
    assert len(got) == 6 and set(got.values()) == {0.3}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["watch", "--interval", "0"],
            "gpuctl: watch: argument --interval: must be within 0.1..3600; got 0 "
            "(seconds between samples); see: gpuctl watch --help",
        ),
        (
            ["demo", "--interval", "fast"],
            "gpuctl: demo: argument --interval: expected seconds between samples (e.g. 0.5), "
            "got 'fast'; see: gpuctl demo --help",
        ),
    ],
)
def test_a_bad_interval_is_one_line(argv: list[str], message: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gpuctl", *argv],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == message and proc.stdout == ""
