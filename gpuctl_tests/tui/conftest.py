"""Fixtures for the TUI tests: deterministic replayed fleets and a frozen clock."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

from gpuctl.core.model import NodeState
from gpuctl.fleet.fixed_links import FailingLink, ReplayLink, recorded_node
from gpuctl.fleet.fleet import Fleet
from gpuctl.fleet.links import NodeLink
from gpuctl.tui import GpuctlApp, make_app
from gpuctl_tests.helpers import until

T0 = 1_700_000_000.0
SAMPLES = 40
T_LAST = T0 + SAMPLES - 1
NOW = T_LAST + 0.5  # the frozen "now" of app and fleet: every replayed node is fresh


def replay_links() -> dict[str, NodeLink]:
    """Three nodes that always look the same: busy H100s (one burning hot), an old-sample
    A100 node that goes stale, and one that refuses connections."""
    return {
        "gpu-a01": ReplayLink(
            recorded_node(
                "gpu-a01",
                "4:H100",
                seed=3,
                t0=T0,
                samples=SAMPLES,
                load={2: 1.0},
                events=[
                    {"type": "event", "t": T0 + 30, "kind": "xid", "gpu": 1, "detail": {"xid": 79}}
                ],
            )
        ),
        "gpu-b02": ReplayLink(
            recorded_node("gpu-b02", "2:A100", seed=4, t0=T0 - 8, samples=SAMPLES)
        ),
        "gpu-c03": FailingLink("refused", "connection refused by 10.0.0.13:22"),
    }


def replay_fleet() -> Fleet:
    # Stale (older than 3 s) but not yet dropped by the fleet (silent for 12 s and more).
    # A seeded jitter: the down node's "retry in" is the same on every run.
    return Fleet(
        replay_links(),
        clock=lambda: NOW,
        stale_after=3.0,
        backoff_base=30.0,
        backoff_max=60.0,
        rng=random.Random(0),
    )


def replay_app(tmp_path: Path, **kwargs: Any) -> GpuctlApp:
    return make_app(replay_fleet(), clock=lambda: NOW, state_dir=tmp_path, **kwargs)


def acknowledge_all(app: GpuctlApp) -> None:
    """Acknowledge every row of the app's trouble log (the recording's unreachable node): ``n``
    then walks the trouble of now alone."""
    for row in app.trouble_log.unacked():
        app.trouble_log.ack(row.id, "seen", by="test")


async def settle(pilot: Pilot[Any], timeout: float = 15.0) -> None:
    """Wait until every replayed node shows its last sample (or its failure) on screen."""
    app = pilot.app
    assert isinstance(app, GpuctlApp)

    def done() -> bool:
        snaps = app.store.snaps
        return (
            snaps["gpu-a01"].last_sample_t == T_LAST
            and snaps["gpu-b02"].state is NodeState.STALE
            and snaps["gpu-c03"].state is NodeState.UNREACHABLE
            and len(app.store.xids) == 1
            and not app.store.pending
            and not app._flush_scheduled
        )

    await until(pilot, done, "the replayed fleet to settle", timeout)
    app.fleet.annotate("gpu-a01", 0, slurm_job="48213", slurm_user="alice")
    app.fleet.annotate(
        "gpu-a01", 2, burn={"state": "running", "engine": "torch", "tflops": 612.0, "errors": 0}
    )
    flushed = lambda: not app.store.pending and not app._flush_scheduled  # noqa: E731
    await until(pilot, flushed, "the annotations to reach the screen", timeout)
    app.clear_notifications()
    await pilot.pause()


async def rows_view(pilot: Pilot[Any]) -> None:
    """The GPU list as a row per GPU: ``v`` when a small terminal started it compact (more than
    two nodes at 80x24: ``overview.starts_compact``)."""
    app = pilot.app
    assert isinstance(app, GpuctlApp)
    if app.overview.nodes.compact:
        await pilot.press("v")


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"
