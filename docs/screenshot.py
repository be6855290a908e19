"""Regenerate docs/screenshot.svg from the app itself: python docs/screenshot.py

The cluster is replayed (gpuctl.fleet.fixed_links), so the picture is the same on every run: busy
nodes, one GPU burning until it throttles, an XID, a Slurm job, a stale node, a refused one.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuctl.core.model import NodeState  # noqa: E402
from gpuctl.fleet.fixed_links import FailingLink, ReplayLink, recorded_node  # noqa: E402
from gpuctl.fleet.fleet import Fleet  # noqa: E402
from gpuctl.fleet.links import NodeLink  # noqa: E402
from gpuctl.tui import make_app  # noqa: E402

T0 = 1_700_000_000.0
SAMPLES = 120
NOW = T0 + SAMPLES - 0.5


def links() -> dict[str, NodeLink]:
    xid = {"type": "event", "t": T0 + 90, "kind": "xid", "gpu": 5, "detail": {"xid": 79}}
    return {
        "dgx-a01": ReplayLink(
            recorded_node("dgx-a01", "8:H100", seed=11, t0=T0, samples=SAMPLES, load={3: 1.0})
        ),
        "dgx-a02": ReplayLink(
            recorded_node("dgx-a02", "8:H100", seed=12, t0=T0, samples=SAMPLES, events=[xid])
        ),
        "hgx-b01": ReplayLink(
            recorded_node("hgx-b01", "8:H200", seed=13, t0=T0 - 8, samples=SAMPLES)
        ),
        "l40s-c01": FailingLink("auth", "permission denied (publickey) for gpuadmin@l40s-c01"),
        # a lab workstation grown over the years: two models in one node
        "ws-d01": ReplayLink(
            recorded_node("ws-d01", "2:A6000,2:4090", seed=14, t0=T0, samples=SAMPLES)
        ),
    }


async def main() -> None:
    fleet = Fleet(links(), clock=lambda: NOW, stale_after=3.0, backoff_base=60.0, backoff_max=60.0)
    app = make_app(fleet, simulated=True, clock=lambda: NOW, state_dir=Path(tempfile.mkdtemp()))
    async with app.run_test(size=(140, 44)) as pilot:
        while not (
            app.store.snaps["dgx-a01"].last_sample_t == T0 + SAMPLES - 1
            and app.store.snaps["ws-d01"].last_sample_t == T0 + SAMPLES - 1
            and app.store.snaps["hgx-b01"].state is NodeState.STALE
            and app.store.snaps["l40s-c01"].state is NodeState.UNREACHABLE
            and app.store.xids
        ):
            await pilot.pause(0.05)
        for gpu, job, user in ((0, "48213", "alice"), (1, "48213", "alice"), (6, "48250", "chen")):
            fleet.annotate("dgx-a01", gpu, slurm_job=job, slurm_user=user)
        burn = {"state": "running", "engine": "gpu-burn", "tflops": 648.0, "errors": 0}
        fleet.annotate("dgx-a01", 3, burn=burn)
        while app.store.pending or app._flush_scheduled:
            await pilot.pause(0.05)
        app.clear_notifications()
        await pilot.press("down", "down", "down")
        await pilot.pause()
        svg = app.export_screenshot(title="gpuctl")
    (ROOT / "docs" / "screenshot.svg").write_text(svg, encoding="utf-8")
    print("wrote docs/screenshot.svg")


if __name__ == "__main__":
    asyncio.run(main())
