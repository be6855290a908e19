"""Others' actions on the screen: a session (read-only or not) follows the audit log and says
what another gpuctl session did while it watched (#43.4); its own actions are not said back."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from gpuctl import audit
from gpuctl.fleet.demo import demo_nodes
from gpuctl.fleet.fleet import simulated_fleet
from gpuctl.tui import make_app
from gpuctl_tests.helpers import until


@pytest.fixture
def log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GPUCTL_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state" / audit.AUDIT_FILE


def test_follow_starts_at_the_end_and_reads_what_is_appended(log: Path) -> None:
    audit.record("drain", "old1", "before we looked")
    follow = audit.Follow(log)
    assert follow.new() == []  # the first look: the end
    audit.record("stress_start", "a1", "GPU 0 for 60 s")
    audit.record("signal", "a1", "pid 7 SIGTERM", "failed: not yours")
    got = follow.new()
    assert [(e.action, e.node) for e in got] == [("stress_start", "a1"), ("signal", "a1")]
    assert got[1].words().endswith("signalled a process on a1 pid 7 SIGTERM: failed: not yours")
    assert follow.new() == []
    with open(log, "ab") as f:  # a line half written: held until its end comes
        f.write(b"junk\n" + audit.Entry(1.0, "u", "h", "s", "resume", "b1", "", "ok").line()[:20])
    assert follow.new() == []
    with open(log, "ab") as f:
        f.write(audit.Entry(1.0, "u", "h", "s", "resume", "b1", "", "ok").line()[20:])
    assert [e.words() for e in follow.new()] == ["u@h resumed b1"]


def test_follow_reads_the_rest_of_a_rotated_log_then_the_new_one(log: Path) -> None:
    audit.record("resume", "r0", "")
    follow = audit.Follow(log)
    follow.new()
    audit.record("resume", "r1", "")  # written to the file that is then rotated away
    os.replace(log, log.with_name(log.name + ".1"))
    audit.record("resume", "r2", "")
    assert [e.node for e in follow.new()] == ["r1", "r2"]
    log.write_bytes(b"")  # cut short by hand: read again from its start
    assert follow.new() == []
    audit.record("resume", "r3", "")
    assert [e.node for e in follow.new()] == ["r3"]


def test_a_flood_is_read_as_its_newest_part(log: Path) -> None:
    follow = audit.Follow(log)
    assert follow.new() == []  # no log yet: one made later is read from its start
    line = audit.Entry(1.0, "u", "h", "s", "resume", "n", "x" * 100, "ok").line()
    log.parent.mkdir(parents=True)
    with open(log, "ab") as f:
        f.write(line * (2 * audit.FOLLOW_READ // len(line)))
    got = follow.new()
    assert 0 < len(got) <= audit.FOLLOW_READ // len(line)
    assert all(e.node == "n" for e in got)


async def test_a_read_only_session_is_told_what_another_session_did(
    log: Path, state_dir: Path
) -> None:
    app = make_app(
        simulated_fleet(demo_nodes(2, 2), interval=0.2),
        simulated=True,
        read_only=True,
        state_dir=state_dir,
    )
    async with app.run_test(size=(120, 36), notifications=True) as pilot:
        follow = app.activity_flow.follow
        await until(pilot, lambda: follow._offset is not None, "the first look at the log")
        audit.record("stress_start", "sim-01", "GPU 0 for 60 s")  # this session's own
        other = (
            "from gpuctl import audit; "
            "audit.record('stress_start', 'sim-02', 'GPU 1 for 3600 s'); "
            "audit.record('drain', 'sim-02', 'gpuctl accept: gemm 40 % low')"
        )
        writer = await asyncio.create_subprocess_exec(sys.executable, "-c", other)
        assert await writer.wait() == 0
        said = lambda: [n.message for n in app._notifications]  # noqa: E731
        await until(pilot, lambda: any("drained" in m for m in said()), "the other's drain said")
        words = [m for m in said() if "@" in m]
        assert any(m.endswith("started a burn on sim-02 GPU 1 for 3600 s") for m in words), words
        assert any(m.endswith("drained sim-02 (gpuctl accept: gemm 40 % low)") for m in words)
        assert not any("sim-01" in m for m in words)  # ours is not said back
        assert [e.node for e in app.activity_flow.seen] == ["sim-02", "sim-02"]
