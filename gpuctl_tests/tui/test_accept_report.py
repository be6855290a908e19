"""Issue 39.6: the acceptance report opens on what failed, each failure with the rule it broke
(the threshold and how far below it), its figures, the likely cause the report shows ([HEALTH]'s
throttling and temperature on that GPU) and the next step as a command; a simulated node's
report names the simulated node as its host; the pane's ``report:`` path fits 80 columns."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from textual.widgets import DataTable, Static

from gpuctl.accept.run import Progress
from gpuctl.tui import make_app
from gpuctl.tui.screens.accept_report import AcceptReportScreen
from gpuctl.tui.text import short_path
from gpuctl_tests.helpers import until
from gpuctl_tests.tui.conftest import NOW, replay_fleet
from gpuctl_tests.tui.test_accept_sim import heated_run
from gpuctl_tests.tui.test_hostile import drawn
from gpuctl_tests.tui.test_panes import shown_run


def heated_report(tmp_path: Path) -> dict[str, Any]:
    """A simulated run of sim-07 whose GPU 1 burned for five minutes (held down by heat)."""
    return heated_run(
        tmp_path, "--node-name", "sim-07", "--report-dir", str(tmp_path), "--report-name", "r.json"
    )


async def test_the_report_opens_on_the_failures_with_rule_cause_and_next_step(
    tmp_path: Path,
) -> None:
    report = heated_report(tmp_path)
    # the simulated node is the host, not the machine that ran its agent
    assert report["hostname"] == "sim-07"
    assert report["sections"]["env"]["hostname"] == "sim-07"
    app = make_app(replay_fleet(), state_dir=tmp_path, clock=lambda: NOW)
    async with app.run_test(size=(80, 24)) as pilot:
        await app.push_screen(AcceptReportScreen("sim-07", report))
        screen = await until(
            pilot, lambda: isinstance(app.screen, AcceptReportScreen) and app.screen, "report"
        )
        await pilot.pause()
        box = screen.query_one("#report-findings", Static)
        text = str(box.render())
        lines = text.splitlines()
        # failures first: the three slow dtypes of GPU 1, then [HEALTH]'s warning
        heads = [line for line in lines if not line.startswith("  ")]
        assert [h.split(":")[0] for h in heads] == [
            "FAIL compute gpu1 fp32",
            "FAIL compute gpu1 tf32",
            "FAIL compute gpu1 bf16",
            "WARN health gpu1",
        ], heads
        bf16 = lines[lines.index(heads[2]) : lines.index(heads[3])]
        assert "12% below the best H100 80GB HBM3 of this node (791.2 TFLOP/s)" in bf16[0]
        assert bf16[0].endswith("; more than 10% below fails")
        assert any(line.strip().startswith("figures: ") and "TFLOP/s" in line for line in bf16)
        likely = next(line for line in bf16 if line.strip().startswith("likely: "))
        assert "throttled while computing: THERM (thermal slowdown) at " in likely
        assert "°C" in likely and "sw_thermal" not in text  # the screen's names
        # the cause the three share is said once, after the last of them
        assert (
            text.count("likely: ") == 1
            and "WARN health gpu1: throttled during COMPUTE: THERM" in text
        )
        step = next(line for line in bf16 if line.strip().startswith("next: "))
        assert step.endswith("gpuctl accept --nodes sim-07 --burn 10m"), step
        # what the screen opens on at 80x24: the first failure, above the tables
        body = drawn(app)
        assert "FAIL compute gpu1 fp32" in body and "sim-07" in body.splitlines()[0]
        assert box.region.y < screen.query_one("#report-sections", DataTable).region.y
        assert "host sim-07" in str(screen.query_one("#report-title", Static).render())


def test_a_path_is_shown_home_relative_and_cut_in_the_middle() -> None:
    home = os.path.expanduser("~")
    path = f"{home}/.local/state/gpuctl/reports/accept-cluster-20261129-075101.json"
    assert short_path(path) == "~/.local/state/gpuctl/reports/accept-cluster-20261129-075101.json"
    cut = short_path(path, 44)
    assert len(cut) == 44 and cut.startswith("~/.l") and "…" in cut
    assert cut.endswith("/accept-cluster-20261129-075101.json")
    assert short_path("/srv/r.json", 40) == "/srv/r.json"


async def test_the_report_path_of_a_finished_run_fits_80_columns(tmp_path: Path) -> None:
    app = make_app(replay_fleet(), state_dir=tmp_path, clock=lambda: NOW)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("3")
        _pane, run = shown_run(app)
        name = "accept-cluster-20261129-075101.json"
        run.report_paths = [Path.home() / ".local/state/gpuctl/reports" / name]
        run.emit(Progress("", "finished", verdict="FAIL"))
        await pilot.pause()
        screen = drawn(app)
        note = next(line for line in screen.splitlines() if "acceptance finished" in line)
        assert note.strip().endswith(f"/{name}") and "report: ~/" in note, note
