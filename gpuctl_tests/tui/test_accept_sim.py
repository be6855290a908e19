"""Issue 26: ``a`` where the suite's Python has no torch (the README's install has none) says
so once, with the two ways out, instead of 12 ERROR cells and a cut-off line; and ``gpuctl demo``
runs the suite simulated on its simulated GPUs (no torch), through the real report path."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable, Label, RichLog

from gpuctl.accept.history import HistoryStore
from gpuctl.accept.run import AcceptRun
from gpuctl.fleet.demo import demo_nodes
from gpuctl.fleet.fleet import simulated_fleet
from gpuctl.node.readers.sim import SimReader
from gpuctl.tui import GpuctlApp, make_app
from gpuctl.tui.screens.confirm import ConfirmScreen
from gpuctl.workloads.accept_suite import suite
from gpuctl.workloads.accept_suite.schema import SECTIONS
from gpuctl_tests.helpers import old_python
from gpuctl_tests.tui.test_panes import cell, until

SIZE = (160, 40)


def python_without_torch() -> str:
    """A real interpreter that cannot import torch (pyenv's 3.12, as a fresh install)."""
    python = old_python("3.12.1")
    probe = subprocess.run([python, "-c", "import torch"], capture_output=True, check=False)
    assert probe.returncode != 0, f"{python} has torch: pick a Python without it"
    return python


def message(python: str) -> str:
    return (
        f"torch is not importable by {python}: install it there, or set "
        "`[accept] python` / `--python`"
    )


async def accept(pilot: Pilot[Any], node: str) -> tuple[AcceptRun, str]:
    """``a`` on ``node``, answered yes; the run once it ended and the question asked."""
    app = pilot.app
    assert isinstance(app, GpuctlApp)
    app.overview.nodes.select(node, 0)
    await pilot.press("a")
    screen = await until(
        pilot, lambda: isinstance(app.screen, ConfirmScreen) and app.screen, "the question"
    )
    question = str(screen.query_one("#confirm-question", Label).render())
    await pilot.press("y")
    run = await until(pilot, lambda: app.accept_flow.run, "the run")
    await until(pilot, run.done, "the run to end", timeout=60)
    await pilot.pause()
    return run, question


@pytest.mark.slow
async def test_a_without_torch_says_so_once_with_the_ways_out(tmp_path: Path) -> None:
    python = python_without_torch()
    fleet = simulated_fleet(demo_nodes(1, 2), interval=0.5)
    app = make_app(fleet, simulated=True, state_dir=tmp_path, accept_options={"python": python})
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.store.snaps["sim-01"].gpus, "sim-01 live")
        run, _question = await accept(pilot, "sim-01")
        table = app.overview.query_one("#accept-table", DataTable)
        cells = {s: cell(table, "sim-01", s) for s in SECTIONS}
        # one FAIL that says why, every other section skipped: no ERROR cell
        assert cells["env"] == "FAIL", cells
        assert {cells[s] for s in SECTIONS if s != "env"} == {"SKIP"}, cells
        outcome = run.outcomes["sim-01"]
        assert outcome.failures == [message(python)]
        rich_log = app.overview.query_one(RichLog)

        def text() -> str:
            return "\n".join(str(line.text) for line in rich_log.lines)

        # the log shows its lines once laid out (a CI run read it empty a moment before)
        await until(pilot, lambda: "torch is not importable" in text(), "the log's line")
        await pilot.pause()
        log = text()
        assert log.count("torch is not importable") == 1, log
        assert message(python) in log.replace("\n", ""), log


@pytest.mark.slow
async def test_the_demo_runs_the_suite_simulated_on_its_gpus(tmp_path: Path) -> None:
    fleet = simulated_fleet(demo_nodes(2, 4), interval=0.5)
    # as ``gpuctl demo`` makes it (cli/demo.py), and no torch for the suite to find
    app = make_app(
        fleet,
        simulated=True,
        state_dir=tmp_path,
        accept_options={"device": "sim", "python": python_without_torch()},
    )
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.store.snaps["sim-02"].gpus, "sim-02 live")
        # XID 48 (a double-bit ECC error): the GPU stays on the bus (79 takes it off: lost)
        await fleet.request("sim-02", {"type": "simulate", "action": "xid", "gpu": 3, "xid": 48})
        run, question = await accept(pilot, "sim-02")
        assert "simulated run" in question
        table = app.overview.query_one("#accept-table", DataTable)
        cells = {s: cell(table, "sim-02", s) for s in SECTIONS}
        # the figures come from the simulated GPUs: all pass but the XID GPU's health
        assert cells["health"] == "FAIL", cells
        assert cells["burn"] == "SKIP"
        assert {cells[s] for s in SECTIONS if s not in ("health", "burn")} == {"PASS"}, cells
        assert run.outcomes["sim-02"].failures == ["health gpu3: XID 48 during the run"]
    # the real report path: the node's JSON report, the history (apart from real runs)
    (path,) = (tmp_path / "reports").glob("accept-sim-02-*.json")
    report = json.loads(path.read_text())
    assert report["device"] == "sim" and report["simulated"] is True
    assert report["hostname"] == "sim-02"  # the simulated node, not this machine
    compute = report["sections"]["compute"]
    assert [d["name"] for d in compute["devices"]] == ["NVIDIA H100 80GB HBM3"] * 4
    assert compute["summary"].startswith("simulated:")
    history = HistoryStore(tmp_path / "accept.sqlite")
    assert history.nodes() == ["sim-02"]
    assert any(k.startswith("compute/gpu0/") for k in history.keys("sim-02"))


def heated_run(tmp_path: Path, *args: str) -> dict[str, Any]:
    """The simulated suite's report (``args`` name where it goes) on four H100s whose GPU 1
    burned for five minutes first (held down by heat): it fails the run."""
    now = [0.0]
    reader = SimReader.from_spec("4:H100", clock=lambda: now[0])
    reader.simulate("load", {"gpus": [1], "load": 1.0})
    for _ in range(300):
        now[0] += 1.0
        reader.sample(slow=False)
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps(reader.accept_facts()))
    argv = ["--device", "sim", "--sim-facts", str(facts), "--quick", *args]
    assert suite.main(argv) == 1
    report: dict[str, Any] = json.loads((tmp_path / "r.json").read_text())
    return report


def test_the_burning_gpus_heat_shows_in_a_simulated_run(tmp_path: Path) -> None:
    """The agent hands the suite its GPUs as they are (``accept_facts``): a GPU held down by
    heat after five minutes of burn is slower than its siblings (the same-model rule fails it)
    and [HEALTH] notes its throttling."""
    report = heated_run(tmp_path, "--report-dir", str(tmp_path), "--report-name", "r.json")
    compute = report["sections"]["compute"]
    slow = {(d["label"], r["dtype"]): r for d in compute["devices"] for r in d["results"]}
    assert {k[0] for k, r in slow.items() if r["verdict"] == "FAIL"} == {"gpu1"}
    assert "below the best NVIDIA H100 80GB HBM3" in slow[("gpu1", "bf16")]["reason"]
    health = report["sections"]["health"]
    assert [g["verdict"] for g in health["gpus"]] == ["PASS", "WARN", "PASS", "PASS"]
    assert health["gpus"][1]["throttle"] == ["sw_thermal"]


def test_the_suite_lines_name_throttling_as_the_screen_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 39.10: the acceptance pane showed ``[HEALTH] ... throttle sw_thermal`` where the
    GPU list and the report say THERM; the report's data keeps NVML's names."""
    report = heated_run(tmp_path, "--report-dir", str(tmp_path), "--report-name", "r.json")
    lines = capsys.readouterr().out.splitlines()
    health = [ln for ln in lines if ln.startswith("[HEALTH] gpu1 ")]
    assert health and "throttle THERM  WARN" in health[0], health
    assert not [ln for ln in lines if "sw_thermal" in ln]
    gpu1 = report["sections"]["health"]["gpus"][1]
    assert gpu1["reason"] == "throttled during COMPUTE: THERM"
    assert gpu1["throttle"] == ["sw_thermal"]
