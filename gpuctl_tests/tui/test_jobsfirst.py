"""Jobs first on the screen (#43.2): a GPU of a Slurm job idle for ``[fleet] idle_after`` has an
``IDLE`` badge with how long on its row and is counted in the header (``alloc-idle``, a filter
like the other counts); ``mine`` and ``job:ID`` filter the list to the GPUs of the caller's
jobs or of one job, whatever nodes they are on, with each job's totals beside the filter.

Simulated agents stream; the jobs are put on the GPUs as the squeue watch puts them
(``Fleet.annotate``); the tracker's clock is moved by the test, not waited for."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Label

from gpuctl.fleet.demo import demo_nodes
from gpuctl.fleet.fleet import simulated_fleet
from gpuctl.fleet.myjobs import user_name
from gpuctl.tui import GpuctlApp
from gpuctl.tui.screens.detail import Facts
from gpuctl_tests import helpers
from gpuctl_tests.helpers import open_detail, until

SIZE = (120, 40)


class Clock:
    def __init__(self) -> None:
        self.now = 5_000_000.0

    def __call__(self) -> float:
        return self.now


def header_trouble(app: GpuctlApp) -> str:
    return str(app.overview.query_one("#trouble", Label).content)


def filter_shown(app: GpuctlApp) -> str:
    return str(app.overview.query_one("#filter-shown", Label).content)


def shown_gpus(app: GpuctlApp) -> list[tuple[str, int | None]]:
    return [(ln.node, ln.gpu) for ln in app.overview.nodes.lines if ln.kind == "gpu"]


def row_text(app: GpuctlApp, node: str, gpu: int) -> str:
    nodes = app.overview.nodes
    y = next(i for i, ln in enumerate(nodes.lines) if (ln.node, ln.gpu) == (node, gpu))
    nodes.scroll_to(y=y, animate=False, immediate=True)
    return "".join(s.text for s in nodes.render_line(y - int(nodes.scroll_offset.y)))


def node_text(app: GpuctlApp, node: str) -> str:
    """The compact list's line of ``node``."""
    nodes = app.overview.nodes
    y = next(i for i, ln in enumerate(nodes.lines) if ln.kind == "node" and ln.node == node)
    nodes.scroll_to(y=y, animate=False, immediate=True)
    return "".join(s.text for s in nodes.render_line(y - int(nodes.scroll_offset.y)))


def jobs_app(state_dir: Path, clock: Clock) -> GpuctlApp:
    """Two demo nodes; every GPU of a job counts as idle (idle_below 100: the simulated jobs'
    own load does not decide the test)."""
    fleet = simulated_fleet(
        demo_nodes(2, 4), interval=0.2, idle_after=1800, idle_below=100, idle_clock=clock
    )
    return GpuctlApp(fleet, simulated=True, state_dir=state_dir)


async def start_jobs(pilot: Pilot[Any]) -> None:
    app = pilot.app
    assert isinstance(app, GpuctlApp)
    await until(
        pilot,
        lambda: helpers.all_live(app.store.snaps.values(), 4) and app.overview.nodes.lines,
        "every node live on screen",
    )
    me = user_name()
    for node, gpu, job, user in (
        ("sim-01", 0, "101", me),
        ("sim-02", 3, "101", me),  # one job over two nodes
        ("sim-01", 2, "202", "bob"),
    ):
        app.fleet.annotate(node, gpu, slurm_job=job, slurm_user=user)
    await until(pilot, lambda: len(app.fleet.idle.in_jobs()) == 3, "the jobs' GPUs tracked")


async def test_allocated_but_idle_gpus_are_flagged_counted_and_filtered(state_dir: Path) -> None:
    clock = Clock()
    app = jobs_app(state_dir, clock)
    async with app.run_test(size=SIZE) as pilot:
        await start_jobs(pilot)
        assert "alloc-idle" not in header_trouble(app)
        assert "IDLE" not in row_text(app, "sim-01", 0)
        clock.now += 1799
        assert app.store.trouble()["alloc-idle"] == 0  # what the header's next update shows
        assert (
            app.store.facts(app.store.snaps["sim-01"], app.store.snaps["sim-01"].gpus[0]).idle_s
            is None
        )
        clock.now += 1 + 120  # 32 minutes
        await until(pilot, lambda: "3 alloc-idle" in header_trouble(app), "the header's count")
        await until(pilot, lambda: "IDLE 32m" in row_text(app, "sim-01", 0), "the row's badge")
        assert "IDLE" in row_text(app, "sim-01", 2)
        assert "IDLE" not in row_text(app, "sim-01", 1)  # in no job
        # the compact list's TROUBLE counts them per node, as the header does; n stops there
        await pilot.press("v")
        await until(pilot, lambda: "IDLE×2" in node_text(app, "sim-01"), "sim-01's TROUBLE")
        assert "IDLE×1" in node_text(app, "sim-02")
        app.overview.nodes.select("sim-01", None)
        await pilot.press("n")
        assert app.overview.nodes.cursor[0] == "sim-02"
        await pilot.press("v")
        # the count is a filter, as the others are
        app.overview.action_trouble("alloc-idle")
        await until(
            pilot,
            lambda: shown_gpus(app) == [("sim-01", 0), ("sim-01", 2), ("sim-02", 3)],
            "the filter of the count",
        )
        # they are trouble as the other counts are: ``n`` stops on them, "trouble" lists them
        app.overview.set_filter("")
        await until(pilot, lambda: len(shown_gpus(app)) == 8, "the whole list")
        nodes = app.overview.nodes
        nodes.select("sim-01", 1)
        await pilot.press("n")
        assert nodes.cursor == ("sim-01", 2)
        await pilot.press("n")
        assert nodes.cursor == ("sim-02", 3)
        app.overview.set_filter("trouble")
        await until(
            pilot,
            lambda: {("sim-01", 0), ("sim-01", 2), ("sim-02", 3)} <= set(shown_gpus(app)),
            "trouble lists them",
        )
        # the detail screen says who holds it and since when
        app.overview.set_filter("")
        await until(pilot, lambda: len(shown_gpus(app)) == 8, "the whole list")
        screen = await open_detail(pilot, "sim-01", 2)
        words = "IDLE 32m in job 202 (bob): util and memory traffic ≤100%"
        await until(
            pilot,
            lambda: words in screen.query_one("#detail-now", Facts).text().plain.replace("\n", " "),
            "the detail's words",
        )


async def test_mine_and_job_filter_the_gpus_of_jobs_across_nodes_with_totals(
    state_dir: Path,
) -> None:
    clock = Clock()
    app = jobs_app(state_dir, clock)
    async with app.run_test(size=(200, 60)) as pilot:
        await start_jobs(pilot)
        app.overview.set_filter("mine")
        await until(
            pilot, lambda: shown_gpus(app) == [("sim-01", 0), ("sim-02", 3)], "my jobs' GPUs"
        )
        await until(
            pilot,
            lambda: "filter: mine · job 101: 2 GPUs " in filter_shown(app),
            "my job's totals beside the filter",
        )
        app.overview.set_filter("job:202")
        await until(pilot, lambda: shown_gpus(app) == [("sim-01", 2)], "job 202's GPU")
        await until(pilot, lambda: "· job 202: 1 GPU " in filter_shown(app), "its totals")
        app.overview.set_filter("mine sim-01")
        await until(pilot, lambda: shown_gpus(app) == [("sim-01", 0)], "mine on sim-01")
        await until(pilot, lambda: "· job 101: 1 GPU " in filter_shown(app), "the shown GPU's")


@pytest.mark.parametrize("text", ["job:abc", "job:"])
def test_a_job_filter_without_a_job_id_is_one_line(text: str) -> None:
    from gpuctl.tui.view import FilterError, parse_filter

    with pytest.raises(FilterError, match=r"^cannot read 'job:.*': write a Slurm job id like"):
        parse_filter(text)
