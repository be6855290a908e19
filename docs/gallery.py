"""Regenerate docs/gallery/*.png: python docs/gallery.py [SCREEN ...]

Every screen at 80x24, 120x40 and 200x60 over the replayed cluster of docs/screenshot.py (busy
nodes, a burn, an XID, a stale node, a refused one), as the app's own SVG screenshot turned into
a PNG by headless Chromium (rsvg-convert collapses runs of spaces). Names: SCREEN-WxH.png.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "docs"))

from screenshot import NOW, SAMPLES, T0, links  # noqa: E402

from gpuctl.core.model import NodeState  # noqa: E402
from gpuctl.fleet.fleet import Fleet  # noqa: E402
from gpuctl.tui import make_app  # noqa: E402
from gpuctl_tests.tui.test_panes import fill_history  # noqa: E402
from gpuctl_tests.tui.test_snapshots import job_store_with_three_jobs  # noqa: E402

OUT = ROOT / "docs" / "gallery"
SIZES = ((80, 24), (120, 40), (200, 60))
# The list's view a screen needs ("rows": a row per GPU, "compact": a line per node), whatever
# the size starts it in (more than two nodes at 80x24 start compact); ``v`` switches.
VIEWS = {"compact": "compact", "processes": "rows", "detail": "rows"}
# screen name -> the keys that reach it from the overview
SCREENS: dict[str, Sequence[str]] = {
    "overview": ("down", "down", "down"),
    "trouble-first": ("o",),
    "compact": ("down",),
    "heatmap": ("m", "n"),
    "filtered": (),  # the header's XID count chosen (below)
    "jobs": ("2",),
    "acceptance": ("3",),
    "processes": ("down", "down", "down", "p"),
    "detail": ("down", "down", "down", "enter"),  # GPU 3: burning, throttled
    "help": ("question_mark",),
    "events": ("e",),  # the trouble log: the XID, the throttle, the refused node
}


async def shoot(name: str, keys: Sequence[str], size: tuple[int, int], svg: Path) -> None:
    fleet = Fleet(links(), clock=lambda: NOW, stale_after=3.0, backoff_base=60.0, backoff_max=60.0)
    tmp = Path(tempfile.mkdtemp())
    fill_history(tmp / "accept.sqlite")  # a run in the acceptance pane
    app = make_app(
        fleet,
        simulated=True,
        clock=lambda: NOW,
        state_dir=tmp,
        job_store=job_store_with_three_jobs(tmp),
    )
    async with app.run_test(size=size) as pilot:
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
        if name == "filtered":
            app.overview.action_trouble("xid")
            await pilot.pause()
        else:
            view = VIEWS.get(name)
            if view is not None and app.overview.nodes.compact != (view == "compact"):
                await pilot.press("v")
            await pilot.press(*keys)
        await pilot.pause(0.3)
        app.clear_notifications()
        await pilot.pause()
        text = app.export_screenshot(title="gpuctl")
    svg.write_text(text, encoding="utf-8")  # noqa: ASYNC240 (a script: nothing else runs)


def to_png(svg: Path, png: Path, size: tuple[int, int]) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("docs/gallery.py: no chromium on PATH (scripts/test.sh installs it)")
    # the SVG's own size: about 12.2 px a column, 24.4 px a row, plus the window's frame
    w, h = int(size[0] * 12.25) + 40, int(size[1] * 24.45) + 90
    subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--hide-scrollbars",
            f"--screenshot={png}",
            f"--window-size={w},{h}",
            svg.as_uri(),
        ],
        check=True,
        capture_output=True,
    )


async def main(names: Sequence[str]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        for name in names or SCREENS:
            for size in SIZES:
                svg = Path(work) / f"{name}-{size[0]}x{size[1]}.svg"
                await shoot(name, SCREENS[name], size, svg)
                png = OUT / f"{svg.stem}.png"
                to_png(svg, png, size)
                print(f"wrote {png.relative_to(ROOT)}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
