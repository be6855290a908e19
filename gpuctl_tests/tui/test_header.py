"""The header's cluster figures move once a round of samples is in (every live node has sent
one since they were last shown), or at once when the node or GPU counts change, and at least
once a second with the tick; not at every flush, which at 512 nodes brings a tenth of them
(``OverviewScreen.update_header``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import msgspec
from textual.pilot import Pilot
from textual.widgets import Label

from gpuctl.core.model import NodeSnapshot, NodeState
from gpuctl.tui import GpuctlApp
from gpuctl_tests.helpers import until
from gpuctl_tests.tui.conftest import replay_app, settle


def figures(app: GpuctlApp) -> str:
    return str(app.overview.query_one("#totals", Label).content)


def with_load(s: NodeSnapshot, util: int, power: float, **changes: object) -> NodeSnapshot:
    gpus = tuple(msgspec.structs.replace(g, util_gpu=util, power=power) for g in s.gpus)
    return dataclasses.replace(s, gpus=gpus, **changes)  # type: ignore[arg-type]


async def offered(app: GpuctlApp, pilot: Pilot[Any], snapshot: NodeSnapshot) -> None:
    """``snapshot`` as the fleet hands it over, through the next flush."""
    app._on_snapshot(snapshot)
    await until(
        pilot,
        lambda: (
            app.store.snaps[snapshot.name] is snapshot
            and not app.store.pending
            and not app._flush_scheduled
        ),
        f"{snapshot.name}'s snapshot flushed",
    )


async def test_figures_move_per_round_counts_at_once_and_with_the_tick(tmp_path: Path) -> None:
    app = replay_app(tmp_path)
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(pilot)
        app.ticker.pause()  # the test ticks (below): at its own second it would show them
        a, b = app.store.snaps["gpu-a01"], app.store.snaps["gpu-b02"]
        assert "nodes 1/3 live" in figures(app)  # gpu-b02 is stale, gpu-c03 down

        # gpu-b02 comes back: the count changes, and the figures show it at once.
        await offered(app, pilot, with_load(b, 50, 100.0, state=NodeState.LIVE))
        assert "nodes 2/3 live" in figures(app)
        shown = figures(app)

        # gpu-a01 sends a sample of idle GPUs: half a round (gpu-b02 has not sent since).
        await offered(app, pilot, with_load(a, 0, 10.0))
        assert figures(app) == shown

        # gpu-b02 sends one too: the round is in, the figures move.
        await offered(app, pilot, with_load(b, 50, 100.0, state=NodeState.LIVE))
        assert figures(app) == "nodes 2/3 live   GPUs 6   util 17%   power 240 W"

        # Half a round again, then the once-a-second tick: it shows the figures as they are.
        await offered(app, pilot, with_load(a, 100, 500.0))
        assert "util 17%" in figures(app)
        app.overview.tick()
        assert figures(app) == "nodes 2/3 live   GPUs 6   util 83%   power 2.2 kW"
