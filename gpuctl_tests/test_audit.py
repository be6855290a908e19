"""The audit log (gpuctl.audit): every action that changes a node is one line (who, when, where,
what, how it ended), over real agents; ``gpuctl audit`` reads it back."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuctl import audit, service
from gpuctl.core.model import NodeState
from gpuctl.fleet import control
from gpuctl.fleet.fleet import simulated_fleet
from gpuctl_tests.helpers import fleet_changes, wait_until_async


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("GPUCTL_STATE_DIR", str(d))
    monkeypatch.delenv("GPUCTL_READ_ONLY", raising=False)
    return d


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_stress_start_stop_refusal_and_failure_are_written(state: Path) -> None:
    fleet = simulated_fleet([("n1", "2:H100")], interval=0.2)
    try:
        await fleet.start()
        await wait_until_async(
            lambda: all(s.state is NodeState.LIVE for s in fleet.snapshots()),
            30,
            "the node to be live",
            wake=fleet_changes(fleet),
        )
        await control.set_stress(fleet, "n1", [0, 1], True, duration=60)
        await control.set_stress(fleet, "n1", [1], False)
        with pytest.raises(service.ReadOnlyError):
            await control.set_stress(fleet, "n1", [0], True, read_only=True)
        with pytest.raises(control.StressError):
            await control.set_stress(fleet, "nope", [0], True)
        with pytest.raises(control.ProcessError):
            await control.signal_process(fleet, "n1", 1, "KILL")
        await control.stop_burners(fleet, "n1")
    finally:
        await fleet.stop()
    path = state / "audit.jsonl"
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    got = [(e["action"], e["node"], e["target"], e["outcome"]) for e in lines(path)]
    assert got[0] == ("stress_start", "n1", "GPU 0,1 for 60 s", "ok")
    assert got[1] == ("stress_stop", "n1", "GPU 1", "ok")
    assert got[2][:3] == ("stress_start", "n1", "GPU 0") and got[2][3].startswith(
        "refused: read-only mode: stress is disabled"
    )
    assert got[3][:2] == ("stress_start", "nope") and "no node named 'nope'" in got[3][3]
    assert got[4][:3] == ("signal", "n1", "pid 1 SIGKILL") and got[4][3].startswith("failed: ")
    assert got[5] == ("stress_stop", "n1", "all GPUs, other sessions' too", "ok")
    me = service.me()
    for e in lines(path):
        assert (e["user"], e["login"], e["session"]) == (me.user, me.host, me.session)


async def test_an_action_its_caller_cancelled_says_so_not_a_class_name(state: Path) -> None:
    """``accept --pairs`` cancels a round's other submissions when one fails; Ctrl-C stops any
    action: neither is the action's failure, and ``CancelledError`` is no word for a person."""

    entered = asyncio.Event()

    async def submit() -> None:
        with audit.action("accept", "n[3-4]", "the suite via sbatch"):
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(submit())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    with pytest.raises(KeyboardInterrupt), audit.action("signal", "n1", "pid 7 TERM"):
        raise KeyboardInterrupt
    assert [e["outcome"] for e in lines(state / "audit.jsonl")] == ["cancelled", "interrupted"]


def test_gpuctl_audit_reads_newest_first_filters_and_skips_junk(state: Path) -> None:
    audit.record("stress_start", "a1", "GPU 0")
    audit.record("drain", "b[1-2]", "gpuctl accept: compute gpu3\x1b]52;c;AAAA\x07 low")
    with open(state / "audit.jsonl", "a") as f:
        f.write("not json\n")
    audit.record("signal", "a1", "pid 7 TERM", "failed: not yours")
    env = {**os.environ, "GPUCTL_STATE_DIR": str(state)}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gpuctl", "audit", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )

    r = run()
    assert r.returncode == 0, r.stderr
    rows = r.stdout.splitlines()
    assert rows[0].split()[:6] == ["WHEN", "WHO", "ACTION", "NODE", "TARGET", "OUTCOME"]
    assert [row.split()[3] for row in rows[1:]] == ["signal", "drain", "stress_start"]
    assert "\x1b" not in r.stdout and "\x07" not in r.stdout  # a reason from a node, cleaned
    assert "1 line(s)" in r.stderr and "not entries" in r.stderr
    doc = json.loads(run("--json", "--node", "a1").stdout)
    assert [e["action"] for e in doc["entries"]] == ["signal", "stress_start"]
    assert doc["skipped_lines"] == 1
    # an action on several nodes is kept as their hostlist: each of them finds it
    doc = json.loads(run("--json", "--node", "b2").stdout)
    assert [e["action"] for e in doc["entries"]] == ["drain"]
    assert json.loads(run("--json", "--limit", "1").stdout)["entries"][0]["action"] == "signal"
    r = run("--since", "soon")
    assert r.returncode == 2 and "--since 'soon'" in r.stderr and "Traceback" not in r.stderr


def test_a_shared_log_from_the_config_keeps_its_mode(
    state: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuctl import context

    shared = tmp_path / "site" / "audit.jsonl"
    shared.parent.mkdir()
    shared.write_text("")
    shared.chmod(0o664)  # the admins' choice: a group of operators appends
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'audit_log = "{shared}"\n')
    cfg.chmod(0o600)
    monkeypatch.setenv("GPUCTL_CONFIG", str(cfg))
    context.install(None)
    audit.record("resume", "n3", "")
    assert [e["action"] for e in lines(shared)] == ["resume"]
    assert oct(shared.stat().st_mode & 0o777) == "0o664"
    assert not (state / "audit.jsonl").exists()
    assert audit.log_path() == shared


def test_own_log_is_bounded_and_read_across_its_rotation(
    state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(audit, "MAX_BYTES", 2000)
    for i in range(40):
        audit.record("stress_start", f"n{i}", "GPU 0")
    path = state / "audit.jsonl"
    assert path.stat().st_size < 2000 + audit.LINE_LIMIT
    assert path.with_name("audit.jsonl.1").exists()
    entries, skipped = audit.read(path)
    assert skipped == 0 and entries[0].node == "n39"
    assert [e.node for e in entries] == sorted((e.node for e in entries), key=lambda n: -int(n[1:]))


def test_sessions_appending_at_once_never_mix_their_lines(state: Path) -> None:
    """Four processes write 150 entries each, with a long target, into one file."""
    code = (
        "import sys\n"
        "from gpuctl import audit\n"
        "for i in range(150):\n"
        "    audit.record('stress_start', 'n' + sys.argv[1], 'x' * 400 + str(i))\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(k)], env=dict(os.environ))
        for k in range(4)
    ]
    assert [p.wait(120) for p in procs] == [0, 0, 0, 0]
    entries, skipped = audit.read(state / "audit.jsonl")
    assert skipped == 0 and len(entries) == 600
    for k in range(4):
        mine = sorted(int(e.target[400:]) for e in entries if e.node == f"n{k}")
        assert mine == list(range(150))
