"""Screenshots of each screen and theme over a replayed fleet: clocks frozen, data fixed.

Update after a deliberate change with ``pytest gpuctl_tests/tui --snapshot-update`` and look at
the SVGs before committing them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable, Log

from gpuctl.config import TuiSettings
from gpuctl.tui.widgets.panes import JobsPane
from gpuctl_tests.helpers import until
from gpuctl_tests.tui.conftest import NOW, replay_app, settle

SIZE = (120, 36)
Compare = Callable[..., bool]


def prepare(*keys: str, view: str | None = None) -> Callable[[Pilot[Any]], Awaitable[None]]:
    """Settle, put the list in ``view`` ("rows": a row per GPU, "compact": a line per node;
    a small terminal starts compact), then press ``keys``."""

    async def run_before(pilot: Pilot[Any]) -> None:
        await settle(pilot)
        compact = pilot.app.overview.nodes.compact  # type: ignore[attr-defined]
        if view is not None and compact != (view == "compact"):
            await pilot.press("v")
        await pilot.press(*keys)
        await pilot.pause()

    return run_before


@pytest.mark.slow
@pytest.mark.parametrize("theme", ["dark", "light", "high-contrast"])
def test_overview_in_each_theme(snap_compare: Compare, tmp_path: Path, theme: str) -> None:
    """Live, stale and unreachable nodes; throttling, XID, Slurm job and burn badges."""
    app = replay_app(tmp_path, tui=TuiSettings(theme=theme))
    assert snap_compare(app, terminal_size=SIZE, run_before=prepare())


@pytest.mark.slow
def test_heatmap(snap_compare: Compare, tmp_path: Path) -> None:
    app = replay_app(tmp_path)
    assert snap_compare(app, terminal_size=SIZE, run_before=prepare("m", "right", "right"))


@pytest.mark.slow
def test_detail(snap_compare: Compare, tmp_path: Path) -> None:
    app = replay_app(tmp_path)
    assert snap_compare(app, terminal_size=SIZE, run_before=prepare("down", "down", "enter"))


@pytest.mark.unit  # in the unit lane too, with the 120x40 ones of test_snapshots_sizes
def test_help(snap_compare: Compare, tmp_path: Path) -> None:
    app = replay_app(tmp_path, read_only=True)
    assert snap_compare(app, terminal_size=SIZE, run_before=prepare("question_mark"))


def job_store_with_three_jobs(tmp_path: Path) -> Any:
    """A done, a failed and a cancelled local job with their logs, at fixed times."""
    from gpuctl.jobs.store import JobRecord, JobStore

    store = JobStore(tmp_path / "jobs.sqlite")
    t = NOW - 600
    specs = [
        ("a1b2c3d4e5f6a7b8", "train.main", "done", None, "step 1\nstep 2\nloss 0.12\n", ""),
        (
            "b2c3d4e5f6a7b8c9",
            "sweep.evaluate",
            "failed",
            "user_exception",
            "loading shard 3\n",
            "Traceback (most recent call last):\nKeyError: 'shard-3'\n",
        ),
        ("c3d4e5f6a7b8c9d0", "bench.loop", "cancelled", "cancelled", "tick 0\ntick 1\n", ""),
    ]
    for i, (job_id, name, state, kind, out, err) in enumerate(specs):
        jobdir = tmp_path / "jobs" / job_id
        jobdir.mkdir(parents=True)
        (jobdir / "stdout.txt").write_text(out)
        (jobdir / "stderr.txt").write_text(err)
        backend = {"kind": "local", "job_root": str(tmp_path / "jobs"), "python": "python3"}
        created = t + 60 * i
        store.add(JobRecord(job_id, name, "local", backend, str(jobdir), "submitted", created))
        logs = {n: f"/scratch/jobs/{job_id}/{n}" for n in ("stdout.txt", "stderr.txt")}
        report = None
        summary = None
        if kind == "user_exception":
            summary = "KeyError: 'shard-3'"
            report = {
                "kind": kind,
                "title": "the function raised an exception",
                "phase": "running",
                "evidence": [summary, "VENV2 ended with exit code 1 after 4.2 s"],
                "remedy": "fix the function; the remote traceback above shows where it raised",
                "logs": logs,
                "job_id": job_id,
                "traceback": "File \"sweep.py\", line 12, in evaluate\nKeyError: 'shard-3'",
            }
        elif kind == "cancelled":
            summary = "stopped by request (SIGTERM)"
            report = {
                "kind": kind,
                "title": "cancelled",
                "phase": "running",
                "evidence": [summary],
                "remedy": "nothing to fix: the job was cancelled",
                "logs": logs,
                "job_id": job_id,
                "traceback": "",
            }
        store.update(
            job_id,
            state=state,
            kind=kind,
            summary=summary,
            started_at=created + 1,
            ended_at=created + 5.2 + 30 * i,
            report=report,
        )
    return store


@pytest.mark.slow
def test_jobs_pane(snap_compare: Compare, tmp_path: Path) -> None:
    """The failed job selected: list, its report in sections, its stdout and stderr."""
    app = replay_app(tmp_path, job_store=job_store_with_three_jobs(tmp_path))

    async def run_before(pilot: Pilot[Any]) -> None:
        await settle(pilot)
        await pilot.press("2")
        table = pilot.app.query_one("#jobs-table", DataTable)
        await until(pilot, lambda: table.row_count == 3)
        await pilot.press("down")
        stderr = pilot.app.query_one("#job-stderr", Log)
        await until(pilot, lambda: "KeyError" in "\n".join(stderr.lines))
        pane = pilot.app.query_one(JobsPane)
        await until(pilot, lambda: pane.final_read)  # the list reloaded for the ended job
        # the table's header is repainted a frame after its columns took their cells' widths
        # (a CI run caught `function` still 8 cells wide above rows 14 wide)
        await pilot.pause()
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def _accept_app(tmp_path: Path) -> Any:
    from gpuctl_tests.tui.test_panes import fill_history

    fill_history(tmp_path / "accept.sqlite")
    return replay_app(tmp_path)


@pytest.mark.slow
def test_acceptance_pane(snap_compare: Compare, tmp_path: Path) -> None:
    """A row from the history (trend, degradation) and a run in progress fed step by step."""
    from gpuctl.accept.run import AcceptOptions, AcceptRun, Progress
    from gpuctl.tui.widgets.panes import AcceptPane

    app = _accept_app(tmp_path)

    async def run_before(pilot: Pilot[Any]) -> None:
        await settle(pilot)
        await pilot.press("3")
        table = pilot.app.query_one("#accept-table", DataTable)
        await until(pilot, lambda: table.row_count == 1)
        pane = pilot.app.query_one(AcceptPane)
        run = AcceptRun(["gpu-b02"], AcceptOptions(quick=True), "agent")
        run.started = NOW - 20
        pane.start(run)
        run.subscribe(pane.progress)
        run.emit(Progress("gpu-b02", "started"))
        for section, verdict in (("env", "PASS"), ("compute", "PASS"), ("membw", "WARN")):
            run.emit(Progress("gpu-b02", "section", section=section, state="start"))
            run.emit(Progress("gpu-b02", "line", text=f"[{section.upper()}] {verdict}"))
            run.emit(Progress("gpu-b02", "section", section=section, state="end", verdict=verdict))
        run.emit(Progress("gpu-b02", "section", section="pcie", state="start"))
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


@pytest.mark.slow
def test_acceptance_report(snap_compare: Compare, tmp_path: Path) -> None:
    """Enter on a node: sections, figures per GPU and dtype with fraction of peak, trends."""
    app = _accept_app(tmp_path)

    async def run_before(pilot: Pilot[Any]) -> None:
        await settle(pilot)
        await pilot.press("3")
        table = pilot.app.query_one("#accept-table", DataTable)
        await until(pilot, lambda: table.row_count == 1)
        await pilot.press("enter")
        figures = await until(pilot, lambda: pilot.app.screen.query("#report-figures"))
        await until(pilot, lambda: str(figures.first().get_cell("2", "trend")))

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


@pytest.mark.slow
@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
def test_process_view(snap_compare: Compare, tmp_path: Path, size: tuple[int, int]) -> None:
    """``p`` on a GPU: its processes; ``g`` the whole node; ``T`` the tree under launchers."""
    app = replay_app(tmp_path)
    assert snap_compare(app, terminal_size=size, run_before=prepare("p", "g", "T", view="rows"))


@pytest.mark.slow
def test_process_view_of_one_gpu_by_cpu(snap_compare: Compare, tmp_path: Path) -> None:
    app = replay_app(tmp_path)
    assert snap_compare(app, terminal_size=(80, 24), run_before=prepare("p", "o", "o", view="rows"))


@pytest.mark.slow
@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
def test_compact_list(snap_compare: Compare, tmp_path: Path, size: tuple[int, int]) -> None:
    """``v``: one line per node under its column titles."""
    app = replay_app(tmp_path)
    assert snap_compare(app, terminal_size=size, run_before=prepare(view="compact"))


@pytest.mark.slow
@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
def test_list_sorted_hottest_first(
    snap_compare: Compare, tmp_path: Path, size: tuple[int, int]
) -> None:
    """``o``: the hottest GPU on top, its node first; the TEMP column marked."""
    app = replay_app(tmp_path)
    assert snap_compare(
        app, terminal_size=size, run_before=prepare("o", "o", view="rows")
    )  # trouble, hot


@pytest.mark.slow
@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
def test_heatmap_legend_and_marks(
    snap_compare: Compare, tmp_path: Path, size: tuple[int, int]
) -> None:
    """The temperature heatmap: the legend's scale, XID and burning marks, a stale node."""
    app = replay_app(tmp_path)
    keys = ("m", "m", "m", "right", "right", "right")
    assert snap_compare(app, terminal_size=size, run_before=prepare(*keys))
