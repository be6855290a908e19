"""The async API the TUI pane uses: AcceptRun over a fleet of in-process simulated agents."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from gpuctl.accept.history import HistoryStore
from gpuctl.accept.run import AcceptOptions, AcceptRun, Progress, start_fleet_run
from gpuctl.core.deadline import wait_for
from gpuctl.fleet.fixed_links import recorded_node
from gpuctl.fleet.fleet import Fleet, simulated_fleet
from gpuctl.workloads.accept_suite.schema import SCHEMA_VERSION, SECTIONS
from gpuctl_tests.helpers import wait_until_async
from gpuctl_tests.tui.hostile import ScriptedAgentLink

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


def test_unsubscribe_stops_a_listener_even_from_inside_it() -> None:
    run = AcceptRun(["n1"], AcceptOptions(quick=True), "agent")
    seen: list[str] = []

    def once(p: Progress) -> None:
        seen.append(f"once:{p.kind}")
        run.unsubscribe(once)

    def every(p: Progress) -> None:
        seen.append(f"every:{p.kind}")

    run.subscribe(once)
    run.subscribe(every)
    run.emit(Progress("n1", "started"))
    run.emit(Progress("n1", "line", text="x"))
    run.unsubscribe(every)
    run.unsubscribe(every)  # not subscribed any more: nothing happens
    run.emit(Progress("n1", "line", text="y"))
    assert seen == ["once:started", "every:started", "every:line"]


def _answer(req: dict[str, Any]) -> list[dict[str, Any]]:
    """A node whose suite passes at once."""
    if req.get("type") != "accept_start":
        return [{"type": "error", "code": "unknown_request", "message": "no", "id": req.get("id")}]
    report = {"schema_version": SCHEMA_VERSION, "verdict": "PASS", "sections": {}}
    exit_event = {"event": "exit", "run": "r", "rc": 0, "report": report, "reason": None}
    return [
        {"type": "ok", "request": "accept_start", "id": req["id"], "run": "r", "pid": 1},
        {"type": "event", "t": 0, "kind": "accept", "gpu": None, "detail": exit_event},
    ]


async def test_runs_leave_no_listener_on_the_fleet() -> None:
    """Each run used to add two fleet listeners for good (and with them the run and whoever
    listened to it), then one pair per fleet kept in a module-level registry: a run's
    listeners are now its own, removed when it ends, so the fleet has as many as before any."""
    hello = recorded_node("n1", "1:H100", samples=1, t0=time.time())
    fleet = Fleet({"n1": ScriptedAgentLink(hello, _answer)})
    await fleet.start()
    try:
        before = (len(fleet._listeners), len(fleet._event_listeners))
        counts = []
        for _ in range(4):
            run = start_fleet_run(fleet, ["n1"], AcceptOptions(quick=True, device="cpu"))
            report = await wait_for(run.wait(), 30)
            assert report["verdict"] == "PASS"
            counts.append((len(fleet._listeners), len(fleet._event_listeners)))
    finally:
        await fleet.stop()
    assert counts == [before] * 4, (before, counts)


def _fast_failing_answer(req: dict[str, Any]) -> list[dict[str, Any]]:
    """A node whose suite fails at once: its start, its line and its end follow the reply."""
    if req.get("type") != "accept_start":
        return [{"type": "ok", "request": req.get("type"), "id": req.get("id")}]
    report = {"schema_version": SCHEMA_VERSION, "verdict": "FAIL", "sections": {}}

    def event(detail: dict[str, Any]) -> dict[str, Any]:
        return {"type": "event", "t": 0, "kind": "accept", "gpu": None, "detail": detail}

    return [
        {"type": "ok", "request": "accept_start", "id": req["id"], "run": "r", "pid": 1},
        event({"event": "line", "run": "old", "text": "another run's line"}),
        event({"event": "start", "run": "r"}),
        event({"event": "line", "run": "r", "section": "env", "text": "[ENV] FAIL no torch"}),
        event({"event": "exit", "run": "r", "rc": 1, "report": report, "reason": None}),
    ]


async def test_the_suite_s_words_in_the_same_read_as_the_answer_are_kept() -> None:
    """A suite that fails at once: the agent's answer and the suite's lines come in one read,
    dispatched before the task that asked reads the answer. They were dropped (the run id was
    not known yet): the pane showed a FAIL with no line saying why (a CI run under load)."""
    hello = recorded_node("n1", "1:H100", samples=1, t0=time.time())
    fleet = Fleet({"n1": ScriptedAgentLink(hello, _fast_failing_answer, together=True)})
    await fleet.start()
    try:
        run = start_fleet_run(fleet, ["n1"], AcceptOptions(quick=True, device="cpu"))
        seen: list[Progress] = []
        run.subscribe(seen.append)
        report = await wait_for(run.wait(), 30)
    finally:
        await fleet.stop()
    assert report["verdict"] == "FAIL"
    assert run.lines["n1"] == ["[ENV] FAIL no torch"]
    assert [p.kind for p in seen] == ["started", "line", "done", "finished"]


def _silent_answer(req: dict[str, Any]) -> list[dict[str, Any]]:
    """A node whose suite starts (pid 4242) and then never says a word, nor ends."""
    kind = req.get("type")
    if kind == "accept_start":
        return [{"type": "ok", "request": "accept_start", "id": req["id"], "run": "r", "pid": 4242}]
    return [{"type": "ok", "request": kind, "id": req.get("id")}]


async def test_a_silent_run_says_so_and_ends_at_its_deadline_naming_where_it_stopped() -> None:
    # It used to wait the suite's timeout plus 60 s without a word (an hour for the default),
    # and then said only "no result before the timeout".
    hello = recorded_node("n1", "1:H100", samples=1, t0=time.time())
    link = ScriptedAgentLink(hello, _silent_answer)
    fleet = Fleet({"n1": link})
    await fleet.start()
    try:
        options = AcceptOptions(quick=True, device="cpu", timeout=1.0, silent_after=0.3)
        run = start_fleet_run(fleet, ["n1"], options, result_grace=1.0)
        seen: list[Progress] = []
        run.subscribe(seen.append)
        report = await wait_for(run.wait(), 30)
    finally:
        await fleet.stop()
    silent = [p for p in seen if p.kind == "silent"]
    assert silent, [p.kind for p in seen]
    assert silent[0].node == "n1" and "started pid 4242" in silent[0].text
    assert "no output for" in silent[0].text
    reason = report["nodes"]["n1"]["reason"]
    assert reason.startswith("no result within 2 s; stopped at: started pid 4242, before the")
    assert report["verdict"] == "FAIL" and report["outcome"] == "ERROR"
    assert "accept_stop" in [r["type"] for r in link.requests]  # the suite stopped there


async def test_a_run_whose_agent_is_replaced_ends_at_once() -> None:
    # The link dropped and came back (a new agent that knows nothing of the run): the run used
    # to wait for an end that could not come until the timeout (an hour) had passed.
    hello = recorded_node("n1", "1:H100", samples=1, t0=time.time())
    fleet = Fleet({"n1": ScriptedAgentLink(hello, _silent_answer)})
    await fleet.start()
    try:
        run = start_fleet_run(fleet, ["n1"], AcceptOptions(quick=True, device="cpu"))
        await wait_until_async(lambda: run.stages["n1"].startswith("started"), 20, "started")
        await fleet.reconnect("n1")
        report = await wait_for(run.wait(), 30)
    finally:
        await fleet.stop()
    reason = report["nodes"]["n1"]["reason"]
    assert "replaced during the run" in reason and "stopped at: started pid 4242" in reason


def _deaf_answer(req: dict[str, Any]) -> list[dict[str, Any]]:
    """A node whose agent's answers never match the request (the request waits its timeout)."""
    return [{"type": "ok", "request": req.get("type"), "id": -1}]


async def test_a_run_stuck_before_its_suite_starts_says_where() -> None:
    hello = recorded_node("n1", "1:H100", samples=1, t0=time.time())
    fleet = Fleet({"n1": ScriptedAgentLink(hello, _deaf_answer)})
    await fleet.start()
    try:
        run = start_fleet_run(fleet, ["n1"], AcceptOptions(quick=True, silent_after=0.3))
        seen: list[Progress] = []
        run.subscribe(seen.append)
        await wait_until_async(lambda: any(p.kind == "silent" for p in seen), 20, "the notice")
        notice = next(p for p in seen if p.kind == "silent")
        assert notice.text.endswith("(asking the agent to start the suite)"), notice.text
        await run.cancel()
        await wait_until_async(run.done, 20, "the run to end")
    finally:
        await fleet.stop()
    assert run.outcomes["n1"].verdict == "ERROR"
