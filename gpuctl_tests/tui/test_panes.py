"""Panes 2 and 3 driven by keys: real local jobs (output, failure report, cancel), and
acceptance (progress fed to the matrix, a real run over a simulated node, history, drill-down)."""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from rich.text import Text
from textual.widgets import DataTable, Log, RichLog, Static

from gpuctl.accept.history import HistoryStore
from gpuctl.accept.run import AcceptOptions, AcceptRun, NodeOutcome, Progress, outcome_from_report
from gpuctl.config import TuiSettings
from gpuctl.core.model import NodeState
from gpuctl.fleet.demo import demo_nodes
from gpuctl.fleet.fixed_links import recorded_node
from gpuctl.fleet.fleet import Fleet, simulated_fleet
from gpuctl.jobs import Executor, JobStore
from gpuctl.jobs.store import JobRecord
from gpuctl.tui import GpuctlApp, make_app
from gpuctl.tui.screens.accept_report import AcceptReportScreen, figure_rows
from gpuctl.tui.screens.confirm import ConfirmScreen
from gpuctl.tui.widgets.panes import AcceptPane, JobsPane
from gpuctl.workloads.accept_suite.schema import SCHEMA, SCHEMA_VERSION, SECTIONS
from gpuctl_tests.helpers import until, wait_until
from gpuctl_tests.tui.conftest import NOW, replay_fleet
from gpuctl_tests.tui.hostile import ScriptedAgentLink

SIZE = (120, 36)
H100_0 = "gpu0 NVIDIA H100 80GB HBM3"


def messages(app: GpuctlApp) -> list[str]:
    return [n.message for n in app._notifications]


def log_text(app: GpuctlApp, which: str) -> str:
    return "\n".join(app.overview.query_one(f"#job-{which}", Log).lines)


def cell(table: DataTable[Any], row: str, col: str) -> str:
    return str(table.get_cell(row, col))


# -- jobs ------------------------------------------------------------------------------------
def prints_and_returns(n: int) -> int:
    for i in range(n):
        print(f"step {i}", flush=True)
    return n


def raises() -> None:
    print("about to fail", flush=True)
    raise ValueError("the flux capacitor is cracked")


def sleeps() -> None:
    print("sleeping", flush=True)
    time.sleep(300)


def prints_a_lot(lines: int) -> int:
    sys.stdout.write("".join(f"line {i:07d} of a long log\n" for i in range(lines)))
    return lines


async def test_jobs_pane_reads_only_the_end_of_a_long_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job's log of megabytes: the pane shows its end and says how much came before, and
    only that end travels from the node (read there, as ``gpuctl logs --tail``)."""
    from gpuctl.jobs.hosts import LocalHost
    from gpuctl.tui.widgets.jobs_pane import TAIL_BYTES

    monkeypatch.setenv("GPUCTL_STATE_DIR", str(tmp_path / "state"))
    store = JobStore()
    ex = Executor("local", python=sys.executable, job_root=str(tmp_path / "jobs"), store=store)
    job = ex.submit(prints_a_lot, 100_000)  # 2.7 MB of stdout
    assert job.result(60) == 100_000
    brought: list[int] = []
    for name in ("read_bytes", "run"):
        real = getattr(LocalHost, name)

        def spy(self: Any, *a: Any, _real: Any = real, **k: Any) -> Any:
            out = _real(self, *a, **k)
            data = out if isinstance(out, bytes) or out is None else out[1]
            brought.append(len(data or b""))
            return out

        monkeypatch.setattr(LocalHost, name, spy)
    app = make_app(replay_fleet(), state_dir=tmp_path / "ui", job_store=store)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        await until(pilot, lambda: "line 0099999" in log_text(app, "stdout"), "the log's end")
        text = log_text(app, "stdout")
        assert text.startswith("[… ") and "bytes before]" in text.splitlines()[0]
        assert "line 0000000" not in text
    assert brought and max(brought) <= TAIL_BYTES + 64, brought


async def test_a_log_read_that_started_before_another_was_shown_is_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two reads of the selected job's logs that overlap (the tail timer's and the selection's,
    on a slow node) both start from the same offsets: the later one's lines were shown twice
    (a CI run's snapshot had the stderr's two lines in reverse order, scrolled)."""
    from gpuctl.tui.widgets.jobs_pane import STREAMS
    from gpuctl_tests.tui.test_snapshots import job_store_with_three_jobs

    app = make_app(
        replay_fleet(), state_dir=tmp_path / "ui", job_store=job_store_with_three_jobs(tmp_path)
    )
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        pane = app.overview.query_one(JobsPane)
        await until(pilot, lambda: pane.final_read and "tick 1" in log_text(app, "stdout"), "logs")
        before = log_text(app, "stdout")
        assert before.count("tick 1") == 1
        zero = dict.fromkeys(STREAMS, 0)
        again = {STREAMS[0]: b"tick 0\ntick 1\n", STREAMS[1]: b""}
        pane._append_logs(pane.selected or "", zero, again, {STREAMS[0]: 14, STREAMS[1]: 0}, True)
        await pilot.pause()
        assert log_text(app, "stdout") == before


@pytest.mark.slow
async def test_jobs_pane_shows_output_report_and_cancels_from_the_keyboard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUCTL_STATE_DIR", str(tmp_path / "state"))
    store = JobStore()
    ex = Executor("local", python=sys.executable, job_root=str(tmp_path / "jobs"), store=store)
    good = ex.submit(prints_and_returns, 5)
    bad = ex.submit(raises)
    assert good.result(60) == 5
    assert bad.wait(60)
    slow = ex.submit(sleeps)  # newest: the first row
    wait_until(lambda: "sleeping" in slow.stdout(), timeout=30, what="the sleeper to start")

    app = make_app(replay_fleet(), state_dir=tmp_path / "ui", job_store=store)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        pane = app.overview.query_one(JobsPane)
        table = app.overview.query_one("#jobs-table", DataTable)
        await until(pilot, lambda: table.row_count == 3, "three jobs")
        names = [str(table.get_row_at(i)[3]).rsplit(".", 1)[-1] for i in range(3)]
        assert names == ["sleeps", "raises", "prints_and_returns"]
        # The running job is selected: its output arrives while it runs, no report.
        await until(pilot, lambda: "sleeping" in log_text(app, "stdout"), "live stdout")
        assert cell(table, slow.id, "state") == "running"
        assert not app.overview.query_one("#job-report-box").display

        await pilot.press("down")  # the failed job: its report in sections
        await until(pilot, lambda: app.overview.query_one("#job-report-box").display, "report")
        report = str(app.overview.query_one("#job-report", Static).render())
        for heading in ("What happened", "Evidence", "Remedy", "Logs"):
            assert heading in report
        assert "the function raised an exception" in report and "[user_exception]" in report
        assert "ValueError: the flux capacitor is cracked" in report
        assert "stdout.txt" in report
        await until(pilot, lambda: "about to fail" in log_text(app, "stdout"), "its stdout")
        assert "the flux capacitor" in cell(table, bad.id, "summary")

        await pilot.press("down")  # the good one: its output, no report
        await until(pilot, lambda: "step 4" in log_text(app, "stdout"), "the good job's stdout")
        assert "about to fail" not in log_text(app, "stdout")
        assert not app.overview.query_one("#job-report-box").display

        await pilot.press("c")  # finished: nothing to cancel
        assert any("already ended (done)" in m for m in messages(app))

        await pilot.press("up", "up", "c")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question")
        assert slow.id[:12] in app.screen.question
        await pilot.press("y")
        await until(pilot, lambda: cell(table, slow.id, "state") == "cancelled", "cancelled")
        assert pane.records[slow.id].kind == "cancelled"
        await until(pilot, lambda: app.overview.query_one("#job-report-box").display, "report")
    assert slow.wait(30) and slow.state == "cancelled"
    pid = slow.handle.get("pid")
    assert isinstance(pid, int), slow.handle  # a local job knows its supervisor's pid
    wait_until(lambda: gone(pid), timeout=10, what="the supervisor to end")


async def test_jobs_pane_names_a_command_job_by_its_argv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUCTL_STATE_DIR", str(tmp_path / "state"))
    store = JobStore()
    ex = Executor("local", python=sys.executable, job_root=str(tmp_path / "jobs"), store=store)
    argv = ["python", "-c", "import sys; print('oops', file=sys.stderr); sys.exit(3)"]
    job = ex.submit_command(argv)
    assert job.wait(60)

    app = make_app(replay_fleet(), state_dir=tmp_path / "ui", job_store=store)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        table = app.overview.query_one("#jobs-table", DataTable)
        await until(pilot, lambda: table.row_count == 1, "the command job")
        assert cell(table, job.id, "function") == shlex.join(argv)
        assert cell(table, job.id, "state") == "failed"
        await until(pilot, lambda: app.overview.query_one("#job-report-box").display, "report")
        report = str(app.overview.query_one("#job-report", Static).render())
        assert "[command_failed]" in report and "exited with code 3" in report
        await until(pilot, lambda: "oops" in log_text(app, "stderr"), "its stderr")


def gone(pid: int) -> bool:
    """No such process, or only a zombie our test process has not reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


async def test_cancel_job_is_refused_read_only_and_listed_in_help(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs.sqlite")
    store.add(JobRecord("j-run", "train", "local", {}, str(tmp_path), "running", 1000.0))
    app = make_app(
        replay_fleet(),
        state_dir=tmp_path,
        job_store=store,
        read_only=True,
        tui=TuiSettings(keys={"cancel_job": "x"}),
    )
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        table = app.overview.query_one("#jobs-table", DataTable)
        await until(pilot, lambda: table.row_count == 1, "the job")
        await pilot.press("c")
        assert not any("read-only" in m for m in messages(app))  # remapped away
        await pilot.press("x")
        assert any("read-only" in m and "cancel" in m for m in messages(app))
        assert app.screen is app.overview
        ids = {row[2] for row in app.help_rows()}
        assert {"cancel_job", "accept_report", "report_back"} <= ids
        titles = {c.title for c in app.get_system_commands(app.overview)}
        assert "Cancel job" in titles


async def test_jobs_pane_says_why_a_damaged_store_lists_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A junk ``jobs.sqlite`` in the state folder: the screen opens, the pane says which file
    and what to do; a store that goes bad while shown says so too, and recovers."""
    from gpuctl.cli.watch import open_job_store
    from gpuctl.context import Context

    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setenv("GPUCTL_STATE_DIR", str(state))
    junk = b"not a database\x00\xff" * 100
    (state / "jobs.sqlite").write_bytes(junk)
    store, why = open_job_store(Context())
    assert store is None and why is not None
    app = make_app(replay_fleet(), state_dir=tmp_path, job_store=store, job_store_error=why)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        note = app.overview.query_one("#jobs-note", Static)
        assert str(note.render()) == why and note.has_class("-unavailable")
        assert "is damaged" in why and str(state / "jobs.sqlite") in why
        assert app.overview.query_one("#jobs-table", DataTable).row_count == 0
        assert app.is_running

    (state / "jobs.sqlite").unlink()
    store = JobStore()
    store.add(JobRecord("j-1", "train", "local", {}, str(tmp_path), "done", 1000.0))
    app = make_app(replay_fleet(), state_dir=tmp_path, job_store=store)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        table = app.overview.query_one("#jobs-table", DataTable)
        note = app.overview.query_one("#jobs-note", Static)
        await until(pilot, lambda: table.row_count == 1, "the job")
        assert not note.has_class("-unavailable")
        good = (state / "jobs.sqlite").read_bytes()
        (state / "jobs.sqlite").write_bytes(junk)
        app.overview.query_one(JobsPane).reload()
        await until(pilot, lambda: "is damaged" in str(note.render()), "the reason")
        assert str(state / "jobs.sqlite") in str(note.render())
        assert not [m for m in messages(app) if "load" in m]  # a line, not an error per poll
        (state / "jobs.sqlite").write_bytes(good)
        app.overview.query_one(JobsPane).reload()
        await until(pilot, lambda: not note.has_class("-unavailable"), "the store back")
        assert "↑↓ select" in str(note.render()) and table.row_count == 1


async def test_jobs_pane_says_how_to_submit_when_empty_and_gives_the_summary_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUCTL_STATE_DIR", str(tmp_path / "state"))
    store = JobStore()
    app = make_app(replay_fleet(), state_dir=tmp_path, job_store=store)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        note = app.overview.query_one("#jobs-note", Static)
        table = app.overview.query_one("#jobs-table", DataTable)
        await until(pilot, lambda: "no jobs yet" in str(note.render()), "the empty state")
        assert "gpuctl submit train.py:main" in str(note.render())
        store.add(JobRecord("j-1", "train", "local", {}, str(tmp_path), "running", 1000.0))
        app.overview.query_one(JobsPane).reload()
        await until(pilot, lambda: table.row_count == 1, "the job")
        assert "↑↓ select" in str(note.render())
        why = "ValueError: the learning rate 3e-1 diverged at step 12"
        store.update("j-1", state="failed", kind="user_exception", summary=why)
        app.overview.query_one(JobsPane).reload()
        await until(pilot, lambda: cell(table, "j-1", "summary") == why, "the summary")
        assert table.columns["summary"].get_render_width(table) >= len(why)


async def test_jobs_pane_says_partial_as_gpuctl_jobs_and_job_state_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A map's chunk done with failed items (its row: done, items_failed) is partial here too."""
    monkeypatch.setenv("GPUCTL_STATE_DIR", str(tmp_path / "state"))
    store = JobStore()
    store.add(JobRecord("j-1", "map:f", "local", {}, str(tmp_path), "running", 1000.0))
    why = "2 of 3 items failed (5, 7): ValueError: odd item 5"
    store.update("j-1", state="done", kind="items_failed", summary=why, ended_at=1010.0)
    app = make_app(replay_fleet(), state_dir=tmp_path, job_store=store)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        table = app.overview.query_one("#jobs-table", DataTable)
        await until(pilot, lambda: table.row_count == 1, "the job")
        assert cell(table, "j-1", "state") == "partial"
        assert cell(table, "j-1", "summary") == why


# -- acceptance ------------------------------------------------------------------------------
def gpu_report(node: str, started: float, bf16: tuple[float, float]) -> dict[str, Any]:
    """A node report as the suite writes it (two H100s), with the given bf16 TFLOP/s."""
    peak = {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4}
    devices = []
    for i, b in enumerate(bf16):
        results = []
        for dtype, value in (("fp32", 51.0), ("tf32", 402.0), ("bf16", b)):
            frac = value / peak[dtype]
            results.append(
                {
                    "dtype": dtype,
                    "tflops": value,
                    "peak_tflops": peak[dtype],
                    "fraction": frac,
                    "verdict": "PASS" if frac >= 0.6 else "FAIL",
                }
            )
        devices.append(
            {"index": i, "label": f"gpu{i}", "name": "NVIDIA H100 80GB HBM3", "results": results}
        )
    compute_ok = all(r["verdict"] == "PASS" for d in devices for r in d["results"])
    sections: dict[str, Any] = {s: {"verdict": "PASS", "summary": f"{s} fine"} for s in SECTIONS}
    sections["compute"] = {
        "verdict": "PASS" if compute_ok else "FAIL",
        "summary": "bf16 " + ", ".join(f"{b:g}" for b in bf16),
        "devices": devices,
        "seconds": 12.0,
    }
    sections["membw"]["devices"] = [
        {"label": f"gpu{i}", "gbps": 2900.0, "peak_gbps": 3350.0, "fraction": 0.87}
        | {"verdict": "PASS"}
        for i in range(len(bf16))
    ]
    sections["pcie"] = {"verdict": "WARN", "summary": "gpu1 at gen4", "devices": []}
    sections["ddp_allreduce"].update(
        {"world_size": 2, "nnodes": 1, "algbw_gbps": 180.0, "busbw_gbps": 180.0}
    )
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "node": node,
        "hostname": node,
        "started": started,
        "duration_s": 95.0,
        "device": "cuda",
        "quick": True,
        "verdict": "PASS" if compute_ok else "FAIL",
        "failures": [] if compute_ok else ["compute gpu1 bf16: below the floor"],
        "sections": sections,
    }


def fill_history(path: Path) -> HistoryStore:
    """Three earlier runs of gpu-a01 (the last one slower: a degradation)."""
    history = HistoryStore(path)
    for k, bf16 in enumerate(((805.0, 799.0), (812.0, 801.0), (809.0, 640.0))):
        report = gpu_report("gpu-a01", NOW - 3600 * (3 - k), bf16)
        history.record("gpu-a01", report, via="agent")
    return history


def test_figure_rows_name_each_gpu_dtype_with_its_fraction_of_peak() -> None:
    rows = figure_rows(gpu_report("n", NOW, (812.0, 640.0)))
    by_key = {key: cells for cells, key in rows if key}
    cells = by_key["compute/gpu1/bf16"]
    assert cells[:3] == ("compute", "gpu1 NVIDIA H100 80GB HBM3", "bf16")
    assert cells[3] == "640 TFLOP/s" and cells[4] == "989.4" and cells[5] == "65%"
    assert by_key["membw/gpu0"][3] == "2900 GB/s" and by_key["membw/gpu0"][5] == "87%"
    assert by_key["ddp/busbw"][2:4] == ("busbw", "180 GB/s")
    assert {cells[2] for cells, _ in rows if cells[0] == "ddp"} == {"algbw", "busbw"}


async def test_acceptance_matrix_follows_progress_and_drills_down(tmp_path: Path) -> None:
    fill_history(tmp_path / "accept.sqlite")
    app = make_app(replay_fleet(), state_dir=tmp_path, clock=lambda: NOW)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("3")
        pane = app.overview.query_one(AcceptPane)
        table = app.overview.query_one("#accept-table", DataTable)
        await until(pilot, lambda: table.row_count == 1, "the history row")
        assert cell(table, "gpu-a01", "verdict") == "PASS ↓1"  # the degradation is counted
        assert cell(table, "gpu-a01", "when") == "60m ago"
        assert cell(table, "gpu-a01", "trend").startswith("▇█▁ ")  # mean bf16 per run
        live = lambda: app.store.snaps["gpu-a01"].state is NodeState.LIVE  # noqa: E731
        await until(pilot, live, "gpu-a01 live")
        await pilot.press("a")  # on pane 3, `a` asks about the node under the matrix cursor
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question")
        assert "gpu-a01" in app.screen.question
        await pilot.press("n")

        run = AcceptRun(["gpu-a01", "gpu-c03"], AcceptOptions(quick=True), "agent")
        pane.start(run)
        run.subscribe(pane.progress)
        assert cell(table, "gpu-a01", "compute") == "·"
        run.emit(Progress("gpu-a01", "started"))
        run.emit(Progress("gpu-a01", "section", section="env", state="start"))
        assert cell(table, "gpu-a01", "env") == "▶ run"
        run.emit(Progress("gpu-a01", "section", section="env", state="end", verdict="PASS"))
        run.emit(Progress("gpu-a01", "line", section="compute", text="[COMPUTE] gpu0 bf16 812"))
        env = table.get_cell("gpu-a01", "env")
        assert isinstance(env, Text) and env.plain == "PASS"
        success = pane.get_component_rich_style("acceptpane--pass").color
        assert env.style.color == success and success is not None  # type: ignore[union-attr]
        run.finish_node(outcome_from_report("gpu-a01", gpu_report("gpu-a01", NOW, (812, 3)), None))
        run.finish_node(NodeOutcome("gpu-c03", "ERROR", reason="not reachable: refused"))
        assert cell(table, "gpu-a01", "compute") == "FAIL"
        assert cell(table, "gpu-a01", "pcie") == "WARN"
        assert cell(table, "gpu-a01", "verdict") == "FAIL"
        assert [cell(table, "gpu-c03", s) for s in SECTIONS] == ["ERROR"] * len(SECTIONS)
        fail = table.get_cell("gpu-a01", "compute")
        assert isinstance(fail, Text) and fail.style != env.style

        # Theme switch: the same cells, the new theme's colours.
        await pilot.press("t")
        await pilot.pause()
        env2 = table.get_cell("gpu-a01", "env")
        assert isinstance(env2, Text)
        assert env2.style.color == pane.get_component_rich_style("acceptpane--pass").color  # type: ignore[union-attr]

        # Enter: the node's report, figures per GPU and dtype, trends from the history.
        table.move_cursor(row=table.get_row_index("gpu-a01"))
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, AcceptReportScreen), "the report")
        screen = app.screen
        assert isinstance(screen, AcceptReportScreen)
        figures = screen.query_one("#report-figures", DataTable)
        rows = [[str(c) for c in figures.get_row_at(i)] for i in range(figures.row_count)]
        assert rows[5][:4] == ["compute", "gpu1 NVIDIA H100 80GB HBM3", "bf16", "3 TFLOP/s"]
        assert rows[5][5:7] == ["0%", "FAIL"]
        i = next(i for i, r in enumerate(rows) if r[:3] == ["compute", H100_0, "bf16"])
        await until(pilot, lambda: str(figures.get_cell(str(i), "trend")), "a trend")
        assert len(str(figures.get_cell(str(i), "trend"))) == 3  # three earlier runs
        notes = str(screen.query_one("#report-findings", Static).render())
        assert "compute gpu1 bf16: 0% of the peak: 65 points under the floor 65%" in notes
        await pilot.press("escape")
        assert app.screen is app.overview
        table.move_cursor(row=table.get_row_index("gpu-c03"))
        await pilot.press("enter")
        why = "gpu-c03: no report to show (not reachable: refused)"
        assert any(why in m for m in messages(app))


async def test_acceptance_matrix_words_are_whole_verdict_first_and_the_trend_shows_at_120(
    tmp_path: Path,
) -> None:
    """Issue 26 §5: cells that change in place kept the width of their first word ("PAS",
    "SKI", "ERRO", "21s ag"), the cursor's colour hid PASS green, the trend was off the right
    edge at 120 columns, and a long suite line was cut."""
    fill_history(tmp_path / "accept.sqlite")
    app = make_app(replay_fleet(), state_dir=tmp_path, clock=lambda: NOW)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("3")
        pane = app.overview.query_one(AcceptPane)
        table = app.overview.query_one("#accept-table", DataTable)
        await until(pilot, lambda: table.row_count == 1, "the history row")
        run = AcceptRun(["gpu-a01", "a-node-with-a-long-name-07"], AcceptOptions(), "agent")
        pane.start(run)
        run.subscribe(pane.progress)
        for s, v in zip(SECTIONS, ("PASS", "SKIP", "ERROR", "WARN", "FAIL"), strict=False):
            run.emit(Progress("gpu-a01", "section", section=s, state="end", verdict=v))
        long = "[COMPUTE] gpu0 bf16 " + "x" * 150 + " the one line that matters"
        run.emit(Progress("gpu-a01", "line", section="compute", text=long))
        table.move_cursor(row=table.get_row_index("gpu-a01"))
        await pilot.pause()
        title = table.render_line(0).text
        assert title.split()[:2] == ["verdict", "node"]
        assert "trend" in title  # inside the 120 columns
        row = table.render_line(1 + table.get_row_index("gpu-a01"))
        words = row.text.split()
        assert {"PASS", "SKIP", "ERROR", "WARN", "FAIL", "ago"} <= set(words), row.text
        # PASS in the pass colour and SKIP in the muted one, under the cursor too
        colours = {seg.text.strip(): seg.style.color for seg in row if seg.text.strip()}
        for word, cls in (("PASS", "acceptpane--pass"), ("SKIP", "acceptpane--skip")):
            assert colours[word] == pane.get_component_rich_style(cls).color, word
        # the history row's age is a whole "ago"; the long node's name is whole
        cells = [table.render_line(1 + i).text for i in range(table.row_count)]
        assert any("a-node-with-a-long-name-07" in c for c in cells)
        run.finish_node(NodeOutcome("gpu-a01", "ERROR", reason="x"))
        await pilot.pause()
        # the wrapped line: every word of it is on the log's screen
        log = pane.query_one("#accept-log")
        shown = "".join(strip.text for strip in log.lines)  # type: ignore[attr-defined]
        assert "the one line that matters" in shown


@pytest.mark.parametrize(("pane", "table_id"), [("2", "#jobs-table"), ("3", "#accept-table")])
async def test_a_tables_scrollbar_is_a_line_not_one_more_selected_row(
    tmp_path: Path, pane: str, table_id: str
) -> None:
    """Issue 39.10: at 80 columns the jobs table and the acceptance matrix scroll sideways, and
    their scrollbar, a block of colour as wide as the table right under its rows, looked like
    one more row, the selected one."""
    from gpuctl_tests.tui.test_snapshots import job_store_with_three_jobs

    fill_history(tmp_path / "accept.sqlite")
    store = job_store_with_three_jobs(tmp_path)
    app = make_app(replay_fleet(), state_dir=tmp_path, clock=lambda: NOW, job_store=store)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press(pane)
        table = app.overview.query_one(table_id, DataTable)
        await until(pilot, lambda: table.row_count, "the table's rows")
        await pilot.pause()
        bar = table.horizontal_scrollbar
        assert table.show_horizontal_scrollbar and bar.size.width > 40  # it scrolls sideways
        options = app.console.options.update_dimensions(bar.size.width, 1)
        cells = [seg for seg in app.console.render(bar.render(), options) if seg.text.strip("\n")]
        assert sum(len(seg.text) for seg in cells) == bar.size.width
        # every cell a line glyph, no block of colour: a thumb and a track
        assert {ch for seg in cells for ch in seg.text} == {"━", "─"}, cells
        assert not any(seg.style and seg.style.reverse for seg in cells)
        # over the table's own background, not a colour of its own
        table_bg = table.styles.background.rich_color
        assert {seg.style.bgcolor for seg in cells if seg.style} == {table_bg}


def shown_run(app: GpuctlApp, node: str = "gpu-a01") -> tuple[AcceptPane, AcceptRun]:
    """A quick run on ``node`` shown in the acceptance pane (its progress fed to the pane)."""
    pane = app.overview.query_one(AcceptPane)
    run = AcceptRun([node], AcceptOptions(quick=True), "agent")
    pane.start(run)
    run.subscribe(pane.progress)
    return pane, run


async def test_the_suite_output_wraps_at_80_columns_without_scrolling_sideways(
    tmp_path: Path,
) -> None:
    """At 80x24 the suite's lines were laid out 78 cells wide (RichLog's min_width) in a log
    74 wide: the ends of lines hidden, a horizontal scrollbar under them."""
    app = make_app(replay_fleet(), state_dir=tmp_path, clock=lambda: NOW)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("3")
        pane, run = shown_run(app)
        text = "[DDP] PASS (0.0 s): simulated: 4 ranks, identical parameters after 50 steps"
        run.emit(Progress("gpu-a01", "line", section="ddp", text=text))
        await pilot.pause()
        log = pane.query_one("#accept-log", RichLog)
        width = log.scrollable_content_region.width
        assert 0 < width < 78 and log.virtual_size.width <= width, (width, log.virtual_size)
        assert not log.show_horizontal_scrollbar
        shown = " ".join(strip.text.strip() for strip in log.lines)
        assert f"gpu-a01: {text}" in shown, shown


def passing_agent(req: dict[str, Any]) -> list[dict[str, Any]]:
    """A stand-in agent whose suite passes at once with a two-H100 report."""
    if req.get("type") != "accept_start":
        return [{"type": "error", "code": "unknown_request", "message": "no", "id": req.get("id")}]
    report = gpu_report("ok-01", NOW, (812.0, 801.0))
    detail = {"event": "exit", "run": "r", "rc": 0, "report": report, "reason": None}
    return [
        {"type": "ok", "request": "accept_start", "id": req["id"], "run": "r", "pid": 1},
        {"type": "event", "t": NOW, "kind": "accept", "gpu": None, "detail": detail},
    ]


async def test_acceptance_runs_from_the_tui_leave_no_listeners_behind(tmp_path: Path) -> None:
    """Every run used to keep the app's relay and two fleet listeners for good."""
    node = recorded_node("ok-01", "2:H100", samples=3, t0=NOW - 2.5)
    fleet = Fleet({"ok-01": ScriptedAgentLink(node, passing_agent)}, clock=lambda: NOW)
    app = make_app(fleet, state_dir=tmp_path, clock=lambda: NOW)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.store.snaps["ok-01"].state is NodeState.LIVE, "live")
        await until(pilot, lambda: app.overview.nodes.lines, "the node on screen")
        runs: list[AcceptRun] = []
        counts = []
        table = app.overview.query_one("#accept-table", DataTable)
        for _ in range(3):
            await pilot.press("a")
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question")
            await pilot.press("y")
            run = await until(
                pilot,
                lambda: app.accept_flow.run not in (None, *runs) and app.accept_flow.run,
                "a run",
            )
            runs.append(run)
            await until(pilot, run.done, "the run to end")
            await until(pilot, lambda: cell(table, "ok-01", "verdict") == "PASS", "the verdict")
            counts.append((len(fleet._listeners), len(fleet._event_listeners)))
        assert [r._listeners for r in runs] == [[], [], []]
        assert counts[0] == counts[1] == counts[2], counts
        assert app.is_running


@pytest.mark.slow
async def test_acceptance_from_the_tui_is_recorded_and_reported(tmp_path: Path) -> None:
    """One real quick suite on the CPU through a simulated node's agent (a few seconds)."""
    skips = ("membw", "train", "ddp_allreduce", "ddp_train")
    fleet = simulated_fleet(demo_nodes(2, 2), interval=0.5)
    app = make_app(
        fleet,
        simulated=True,
        state_dir=tmp_path,
        accept_options={"extra_args": tuple(a for s in skips for a in ("--skip", s))},
    )
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.overview.nodes.lines, "the nodes")
        await until(pilot, lambda: app.store.snaps["sim-01"].gpus, "sim-01 live")
        app.overview.nodes.select("sim-01", 0)
        await pilot.press("a")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question")
        await pilot.press("y")
        table = app.overview.query_one("#accept-table", DataTable)
        await until(pilot, lambda: table.row_count == 1, "the live row")
        run = app.accept_flow.run
        assert run is not None
        await until(pilot, run.done, "the run to end", timeout=180)
        await until(pilot, lambda: cell(table, "sim-01", "trend"), "the trend from history")
        assert cell(table, "sim-01", "compute") == "PASS"
        assert cell(table, "sim-01", "train") == "SKIP"
        assert cell(table, "sim-01", "verdict") == "PASS"
        note = str(app.overview.query_one("#accept-note", Static).render())
        assert "acceptance finished: PASS" in note
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, AcceptReportScreen), "the report")
        figures = app.screen.query_one("#report-figures", DataTable)
        assert [str(c) for c in figures.get_row_at(0)][:3] == ["compute", "cpu", "fp32"]
    assert HistoryStore(tmp_path / "accept.sqlite").nodes() == ["sim-01"]
    (path,) = (tmp_path / "reports").glob("accept-sim-01-*.json")
    assert run.report_paths == [path]


def test_the_report_says_why_a_figure_degraded() -> None:
    """The report screen words a degradation as the history does: a slow fall, a lost GPU."""
    from gpuctl.accept.history import Degradation
    from gpuctl.tui.screens.accept_report import _degradation_text

    falling = Degradation("gpu07", "compute/gpu3/bf16", 88.0, 100.0, 0.12, "TFLOP/s", 4, "falling")
    assert "falling at every run" in _degradation_text(falling.to_dict())
    gone = Degradation("gpu07", "gpus", 7, 8, 0.125, "", 1, "vanished", "gpu5 (GPU-ab12)")
    assert _degradation_text(gone.to_dict()).endswith("gone: gpu5 (GPU-ab12)")
    # an entry that is not one (a report from elsewhere) still shows its figures
    assert "below its earlier runs" in _degradation_text({"key": "x", "value": 1, "drop": 0.5})


async def test_a_silent_acceptance_run_says_so_in_the_pane(tmp_path: Path) -> None:
    """A suite that starts and never writes a line (here an interpreter that only sleeps, run by
    a real simulated node's agent): the pane showed "…" and nothing else until cancelled."""
    mute = tmp_path / "mute-python"
    mute.write_text("#!/bin/sh\nexec sleep 300\n")
    mute.chmod(0o755)
    fleet = simulated_fleet(demo_nodes(1, 1), interval=0.5)
    app = make_app(
        fleet,
        simulated=True,
        state_dir=tmp_path,
        accept_options={"python": str(mute), "silent_after": 0.5},
    )
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.store.snaps["sim-01"].gpus, "sim-01 live")
        app.overview.nodes.select("sim-01", 0)
        await pilot.press("a")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question")
        await pilot.press("y")
        note = app.overview.query_one("#accept-note", Static)
        # the notice, once the suite's process has started (before that it names the stage)
        await until(pilot, lambda: "(started pid " in str(note.render()), "the silence noted")
        run = app.accept_flow.run
        assert run is not None
        text = str(note.render())
        assert text.startswith("sim-01: no output for ")
        assert "(started pid " in text and "before the suite's first line" in text
        pid = int(text.split("pid ", 1)[1].split(",", 1)[0])
        await pilot.press("a")  # cancel it
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question")
        await pilot.press("y")
        await until(pilot, run.done, "the run to end")
        wait_until(lambda: not _alive(pid), 20, "the mute suite stopped")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def test_an_ended_jobs_return_value_shows_and_an_empty_log_gives_its_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 39.10: at 80x24 an ended job's empty stderr box kept its half of 40% of the pane,
    and what the job returned was nowhere on the screen."""
    monkeypatch.setenv("GPUCTL_STATE_DIR", str(tmp_path / "state"))
    store = JobStore()
    ex = Executor("local", python=sys.executable, job_root=str(tmp_path / "jobs"), store=store)
    job = ex.submit(prints_and_returns, 3)
    assert job.result(60) == 3
    app = make_app(replay_fleet(), state_dir=tmp_path / "ui", job_store=store)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("2")
        title = app.overview.query_one("#job-title", Static)
        await until(pilot, lambda: "returned 3" in str(title.render()), "the return value")
        await until(pilot, lambda: "step 2" in log_text(app, "stdout"), "the stdout")
        stdout = app.overview.query_one("#job-stdout", Log)
        stderr = app.overview.query_one("#job-stderr", Log)
        assert stdout.display and not stderr.display  # stdout has the width stderr had
        await pilot.pause()
        assert stdout.region.width > 60, stdout.region
