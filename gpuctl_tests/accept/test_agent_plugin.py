"""The agent's accept plugin: requests, progress events, and no orphan when the agent stops."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

from gpuctl.node.messages import AcceptEvent, AcceptStarted
from gpuctl_tests.helpers import AgentProcess, assert_reader_keeps_all, node_env, wait_until


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def accept_event(msg: dict[str, Any], event: str) -> bool:
    return (
        msg.get("type") == "event"
        and msg.get("kind") == "accept"
        and msg["detail"].get("event") == event
    )


def test_bad_requests_get_errors_and_stopping_the_agent_kills_the_suite(
    agents: list[AgentProcess],
) -> None:
    a = AgentProcess.start("--interval", "5", "--liveness-timeout", "0")
    agents.append(a)
    a.read_until(lambda m: m["type"] == "hello")
    a.send({"type": "accept_start", "id": 1, "args": "--quick"})
    assert a.read_until(lambda m: m.get("id") == 1)["code"] == "bad_argument"
    a.send({"type": "accept_start", "id": 2, "args": ["--report-dir", "/tmp/x"]})
    assert a.read_until(lambda m: m.get("id") == 2)["code"] == "bad_argument"
    a.send({"type": "accept_start", "id": 3, "python": "/nonexistent/python", "args": []})
    assert a.read_until(lambda m: m.get("id") == 3)["code"] == "spawn_failed"

    args = ["--device", "cpu", "--quick", "--skip", "compute", "--skip", "membw"]
    a.send({"type": "accept_start", "id": 4, "args": args})
    ok = a.read_until(lambda m: m.get("id") == 4)
    assert ok["type"] == "ok" and ok["run"]
    a.send({"type": "accept_start", "id": 5, "args": args})
    assert a.read_until(lambda m: m.get("id") == 5)["code"] == "busy"
    # The suite is training (a long section): the agent's link goes away.
    a.read_until(
        lambda m: accept_event(m, "section") and m["detail"]["section"] == "train", timeout=60
    )
    suite_pid = ok["pid"]
    assert alive(suite_pid)
    a.close()
    wait_until(lambda: not alive(suite_pid), timeout=15, what="the suite to die with its agent")


def test_a_finished_run_sends_its_report_in_the_exit_event(agents: list[AgentProcess]) -> None:
    # Every message of the run is read by the login side through its one definition
    # (``gpuctl.node.messages``) whole: no key it does not know, none dropped.
    a = AgentProcess.start("--interval", "5", "--liveness-timeout", "0")
    agents.append(a)
    a.read_until(lambda m: m["type"] == "hello")
    skips = [x for s in ("train", "ddp_allreduce", "ddp_train", "membw") for x in ("--skip", s)]
    a.send({"type": "accept_start", "id": 1, "args": ["--device", "cpu", "--quick", *skips]})
    started = a.read_until(lambda m: m.get("id") == 1)
    assert_reader_keeps_all(AcceptStarted, started, "accept_start's reply")
    run = started["run"]
    ends = []
    report_path = None
    kinds = set()
    while True:
        m = a.read_until(lambda m: m.get("type") == "event", timeout=120)
        assert m["detail"]["run"] == run
        assert_reader_keeps_all(AcceptEvent, m["detail"], f"an accept {m['detail']['event']}")
        kinds.add(m["detail"]["event"])
        if accept_event(m, "section") and m["detail"]["state"] == "end":
            ends.append(m["detail"]["section"])
        if accept_event(m, "result"):
            report_path = m["detail"]["report"]
        if accept_event(m, "exit"):
            break
    assert kinds == {"start", "section", "line", "result", "exit"}, kinds
    d = m["detail"]
    assert d["rc"] == 0 and d["reason"] is None
    assert d["report"]["verdict"] == "PASS"
    assert ends == list(d["report"]["sections"])
    assert d["stdout_tail"][-1] == "[RESULT] SUCCESS"
    # The suite wrote its report in a private folder, gone once the report travelled.
    assert report_path is not None and os.path.basename(report_path) == "report.json"
    assert not os.path.exists(os.path.dirname(report_path))


def _agent(tmpdir: Path) -> AgentProcess:
    argv = [sys.executable, "-m", "gpuctl.node", "agent", "--interval", "5"]
    a = AgentProcess([*argv, "--liveness-timeout", "0"], env=node_env({"TMPDIR": str(tmpdir)}))
    a.read_until(lambda m: m["type"] == "hello")
    return a


def _start_suite(a: AgentProcess) -> dict[str, Any]:
    args = ["--device", "cpu", "--quick", "--skip", "compute", "--skip", "membw"]
    a.send({"type": "accept_start", "id": 1, "args": args})
    ok = a.read_until(lambda m: m.get("id") == 1)
    assert ok["type"] == "ok", ok
    a.read_until(lambda m: accept_event(m, "start"), timeout=60)
    return ok


def test_no_accept_folder_outlives_its_agent(agents: list[AgentProcess], tmp_path: Path) -> None:
    """SIGTERM: the agent removes the run's folder on its way out. SIGKILL: it cannot, and the
    next agent on the node removes it (nobody holds its lock any more)."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    a = _agent(tmpdir)
    agents.append(a)
    suite = _start_suite(a)["pid"]
    assert [p.name[:14] for p in tmpdir.iterdir()] == ["gpuctl-accept-"]
    a.proc.send_signal(signal.SIGTERM)
    assert a.proc.wait(15) == 0
    assert list(tmpdir.iterdir()) == []
    assert not alive(suite)

    b = _agent(tmpdir)
    agents.append(b)
    suite = _start_suite(b)["pid"]
    folder = next(tmpdir.iterdir())
    b.proc.send_signal(signal.SIGKILL)
    b.proc.wait(5)
    wait_until(lambda: not alive(suite), timeout=15, what="the suite to die with its agent")
    assert folder.exists()  # a SIGKILLed agent cleans nothing
    c = _agent(tmpdir)
    agents.append(c)
    assert not folder.exists()
    # ... and a live agent's folder is left alone by the next one
    _start_suite(c)
    d = _agent(tmpdir)
    agents.append(d)
    assert len(list(tmpdir.iterdir())) == 1
