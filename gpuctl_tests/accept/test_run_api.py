"""The async API the TUI pane uses: AcceptRun over a fleet of in-process simulated agents."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuctl.accept.history import HistoryStore
from gpuctl.accept.run import AcceptOptions, Progress, start_fleet_run
from gpuctl.fleet.fleet import simulated_fleet
from gpuctl.workloads.accept.schema import SECTIONS

SKIPS = ("membw", "train", "ddp_allreduce", "ddp_train")


@pytest.mark.slow
async def test_status_matrix_progress_and_report_over_a_fleet(tmp_path: Path) -> None:
    fleet = simulated_fleet([("sim1", "2:H100")], interval=0.5)
    await fleet.start()
    try:
        options = AcceptOptions(
            quick=True, device="cpu", extra_args=tuple(x for s in SKIPS for x in ("--skip", s))
        )
        history = HistoryStore(tmp_path / "h.sqlite")
        run = start_fleet_run(fleet, ["sim1"], options, report_dir=tmp_path / "r", history=history)
        seen: list[Progress] = []
        matrix_while_running: list[str] = []

        def listen(p: Progress) -> None:
            seen.append(p)
            if p.kind == "section" and p.section == "compute" and p.state == "start":
                matrix_while_running.append(run.status["sim1"]["compute"])

        run.subscribe(listen)
        assert run.status["sim1"] == dict.fromkeys(SECTIONS, "pending")
        assert not run.done()
        report = await run.wait()
    finally:
        await fleet.stop()
    assert run.done()
    assert matrix_while_running == ["running"]
    assert report["verdict"] == "PASS"
    assert run.status["sim1"]["compute"] == "PASS" and run.status["sim1"]["train"] == "SKIP"
    kinds = [p.kind for p in seen]
    assert kinds[0] == "started" and kinds[-2:] == ["done", "finished"]
    assert any(p.kind == "line" and p.text.startswith("[COMPUTE] cpu fp32") for p in seen)
    assert run.outcomes["sim1"].report is not None
    assert [p.name for p in run.report_paths] == [next((tmp_path / "r").glob("*.json")).name]
    assert history.nodes() == ["sim1"]
