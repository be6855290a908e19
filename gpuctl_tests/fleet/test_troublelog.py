"""Issue 43.1: trouble kept as a log, not only a state (``gpuctl.fleet.troublelog``).

A real agent on the stand-in ``libnvidia-ml.so.1`` (an XID, a thermal throttle, pending row
remapping, a GPU that falls off the bus) and a node whose agent cannot start feed the log
through a real fleet; a new ``gpuctl events`` process reads what it kept, and acknowledges one;
the file stays bounded and another session's acknowledgement survives a compaction.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpuctl.core.model import NodeEvent
from gpuctl.fleet.fleet import Fleet
from gpuctl.fleet.links import LocalLink, NodeLink
from gpuctl.fleet.troublelog import Trouble, TroubleLog
from gpuctl_tests.helpers import node_env, wait_fleet, wait_until_async
from gpuctl_tests.node.nvml_stub import CONFIG_ENV, NvmlStub

# GPU 0 at its thermal slowdown (0x20: NVML's SwThermalSlowdown), GPU 1 with uncorrected ECC
# errors and rows pending remapping, GPU 2: XID 79 after its third sample, lost after its sixth;
# GPU 0 has 900 corrected ECC errors from before (no news: no row).
STUB = (
    "count 3\nset 0 throttle 0x20\nset 1 ecc_vol_unc 2\nset 1 rows_pending 1\n"
    "xid 2 79 3\nlost 2 6\nset 0 ecc_agg_corr 900\n"
)


def stub_python(tmp_path: Path, stub: NvmlStub) -> str:
    python = tmp_path / "python-nvml"
    python.write_text(
        "#!/bin/sh\nunset LD_LIBRARY_PATH\n"
        f'LD_LIBRARY_PATH={stub.lib_dir} {CONFIG_ENV}={stub.config} exec "{sys.executable}" "$@"\n'
    )
    python.chmod(0o755)
    return str(python)


def gpuctl(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = node_env({"GPUCTL_STATE_DIR": str(state)})
    return subprocess.run(
        [sys.executable, "-m", "gpuctl", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def kinds(log: TroubleLog) -> dict[tuple[str, int | None, str], Trouble]:
    return {(r.node, r.gpu, r.kind): r for r in log.rows.values()}


async def test_a_real_agents_trouble_is_kept_and_a_new_process_reads_it(
    nvml_lib_dir: Path, tmp_path: Path
) -> None:
    stub = NvmlStub(nvml_lib_dir, tmp_path / "nvml.conf", STUB)
    state = tmp_path / "state"
    links: dict[str, NodeLink] = {
        "nv": LocalLink(python=stub_python(tmp_path, stub), interval=0.2),
        # a reason with a terminal escape in it: it must not reach a terminal as one
        "gone": LocalLink(python="/nonexistent/\x1b[2Jpython3"),
    }
    fleet = Fleet(links, backoff_base=30)
    # an earlier session quit while GPU 0 and GPU 1 throttled: GPU 0 still does, GPU 1 not
    earlier = TroubleLog(state / "events.jsonl")
    still = earlier.note("nv", 0, "throttle", "sw_thermal", active=True)
    over = earlier.note("nv", 1, "throttle", "hw_slowdown", active=True)
    log = TroubleLog.open(state / "events.jsonl")
    log.watch(fleet)
    await fleet.start()
    try:
        await wait_fleet(fleet, lambda s: s["nv"].gpus and s["nv"].gpus[2].lost, what="GPU 2 lost")
        await wait_until_async(
            lambda: (
                {
                    ("nv", 0, "throttle"),
                    ("nv", 1, "remap"),
                    ("nv", 2, "xid"),
                    ("nv", 2, "gpu_lost"),
                    ("gone", None, "unreachable"),
                }
                <= set(kinds(log))
            ),
            20,
            "every trouble in the log",
        )
    finally:
        await fleet.stop()
        log.close()
    rows = kinds(log)
    throttle = rows[("nv", 0, "throttle")]
    assert (throttle.subject, throttle.active) == ("sw_thermal", True)
    # the episode that went on across the restart is one, not two; the one that ended, ended
    assert throttle.id == still.id and throttle.count == 1
    assert not log.rows[over.id].active and log.rows[over.id].ended is not None
    # the evidence: the stand-in's readings of GPU 0 (temperature 40 + index, ...)
    assert throttle.evidence["temp"] == 40 and throttle.evidence["throttle"] == ["sw_thermal"]
    assert rows[("nv", 2, "xid")].subject == "79"
    # the agent's event and its samples say the same loss: one occurrence
    assert (rows[("nv", 2, "gpu_lost")].count, rows[("nv", 2, "gpu_lost")].active) == (1, True)
    assert rows[("nv", 1, "remap")].detail["pending"] is True
    assert rows[("nv", 1, "ecc")].detail["volatile_uncorrected"] == 2
    assert rows[("nv", 1, "ecc")].evidence["temp"] == 41
    assert not [k for k in rows if k[2] == "ecc_corrected"]  # counts that did not rise

    # a new process reads what this one kept
    out = gpuctl(state, "events", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    got = {(e["node"], e["gpu"], e["kind"]): e for e in doc["events"]}
    assert set(got) == set(rows)
    assert got[("nv", 2, "xid")]["words"].startswith("XID 79: GPU has fallen off the bus")
    assert got[("nv", 0, "throttle")]["evidence"]["temp"] == 40
    assert got[("nv", 0, "throttle")]["state"] == "active"
    table = gpuctl(state, "events", "--kind", "unreachable")
    assert table.returncode == 0, table.stderr
    assert "node unreachable" in table.stdout and "\x1b" not in table.stdout
    assert "XID" not in table.stdout  # --kind keeps one kind

    # acknowledged by the CLI, the next read says so, with the note
    xid = rows[("nv", 2, "xid")]
    acked = gpuctl(state, "events", "ack", xid.id[:6], "--note", "drained, RMA filed")
    assert acked.returncode == 0, acked.stderr
    again = TroubleLog.open(state / "events.jsonl")
    assert again.rows[xid.id].acked is not None
    assert again.rows[xid.id].ack_note == "drained, RMA filed"
    unacked = json.loads(gpuctl(state, "events", "--json", "--state", "unacked").stdout)
    assert xid.id not in {e["id"] for e in unacked["events"]}
    wrong = gpuctl(state, "events", "ack", "zzzz")
    assert wrong.returncode != 0 and "no event 'zzzz'" in wrong.stderr
    assert "Traceback" not in wrong.stderr


def test_repeats_fold_until_acknowledged_and_lasting_trouble_only_moves_last_seen(
    tmp_path: Path,
) -> None:
    now = [1000.0]
    log = TroubleLog(tmp_path / "events.jsonl", clock=lambda: now[0])
    first = log.note("n1", 3, "xid", "79")
    now[0] += 60
    assert log.note("n1", 3, "xid", "79") is first
    assert (first.count, first.first, first.last) == (2, 1000.0, 1060.0)
    assert log.note("n1", 3, "xid", "48") is not first  # another XID: another row
    # a throttle that is still on when it "starts" again (a restart) is one episode
    hot = log.note("n1", 0, "throttle", "sw_thermal", active=True)
    log.note("n1", 0, "throttle", "sw_thermal", active=True)
    assert hot.count == 1
    log.end("n1", 0, "throttle", "sw_thermal", t=now[0] + 5)
    assert not hot.active and hot.ended == now[0] + 5
    log.note("n1", 0, "throttle", "sw_thermal", active=True)
    assert (hot.count, hot.active, hot.ended) == (2, True, None)
    # the same ECC counts seen again (a restart) are no new occurrence; new counts are
    ecc = log.note("n1", 1, "ecc", detail={"volatile_uncorrected": 2})
    log.note("n1", 1, "ecc", detail={"volatile_uncorrected": 2})
    assert ecc.count == 1
    log.note("n1", 1, "ecc", detail={"volatile_uncorrected": 5})
    assert ecc.count == 2
    # acknowledged, the next occurrence is a new row
    log.ack(first.id, "reset the GPU", by="op@login")
    now[0] += 60
    after = log.note("n1", 3, "xid", "79")
    assert after is not first and after.count == 1
    assert next(r.id for r in log.unacked()) == after.id  # newest first
    log.flush(force=True)
    kept = TroubleLog.open(tmp_path / "events.jsonl", clock=lambda: now[0])
    assert {(r.id, r.count, r.acked is not None) for r in kept.rows.values()} == {
        (r.id, r.count, r.acked is not None) for r in log.rows.values()
    }


def test_the_file_stays_bounded_and_keeps_another_sessions_acknowledgement(
    tmp_path: Path,
) -> None:
    path = tmp_path / "events.jsonl"
    now = [time.time()]  # what another session's clock says too
    log = TroubleLog(path, clock=lambda: now[0], max_bytes=20_000, max_rows=200)
    first = log.note("old", 0, "xid", "79", evidence={"temp": 90})
    other = TroubleLog.open(path)  # another session (gpuctl events ack) acknowledges it
    other.ack(first.id, "known", by="op@login")
    sizes = []
    for i in range(400):
        now[0] += 1
        log.note(f"node-{i:03d}", i % 8, "xid", "48", evidence={"temp": 60 + i % 30})
        sizes.append(path.stat().st_size)
    assert max(sizes) < 20_000 + 4000  # compacted past max_bytes (one line at most over)
    assert len(log.rows) <= 200
    assert "node-399" in {r.node for r in log.rows.values()}  # the newest kept
    read = TroubleLog.open(path)
    assert {r.id for r in read.rows.values()} == {r.id for r in log.rows.values()}
    # the oldest go first; while it is kept, the other session's acknowledgement is kept too
    small = TroubleLog(tmp_path / "small.jsonl", clock=lambda: now[0], max_bytes=4000)
    row = small.note("n", 0, "xid", "79")
    TroubleLog.open(tmp_path / "small.jsonl").ack(row.id, "seen", by="b@x")
    small.refresh()
    for _ in range(30):
        now[0] += 1
        small.note("n", 0, "gpu_lost", active=True)  # folds: the file grows with rewrites
        small.flush(force=True)
    assert (tmp_path / "small.jsonl").stat().st_size < 4000 + 4000
    assert TroubleLog.open(tmp_path / "small.jsonl").rows[row.id].ack_note == "seen"
    # rows not seen for longer than max_age go
    aged = TroubleLog(path, clock=lambda: now[0] + 31 * 86400)
    aged.load()
    assert aged.rows == {}


def test_a_broken_line_is_skipped_and_said(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    log = TroubleLog(path)
    log.note("n", 1, "xid", "79")
    with open(path, "a") as f:
        f.write("not json\n" + json.dumps({"row": {"id": "x", "kind": "nope"}}) + "\n")
    read = TroubleLog.open(path)
    assert len(read.rows) == 1 and read.skipped == 2
    out = gpuctl(tmp_path, "events", "--json")
    assert json.loads(out.stdout)["skipped_lines"] == 2
    out = gpuctl(tmp_path, "events")  # the table: said on stderr, as gpuctl audit says it
    assert out.returncode == 0 and "XID 79" in out.stdout
    assert out.stderr == f"gpuctl events: 2 line(s) of {path} are not events\n", out.stderr


@pytest.mark.parametrize(
    ("detail", "words"),
    [
        ({"started": ["hw_slowdown"], "ended": []}, "HWSLOW"),
        ({"started": ["sw_power_cap"], "ended": []}, None),  # the weather: not kept
    ],
)
def test_throttle_events_of_the_fleet_become_rows(
    detail: dict[str, Any], words: str | None
) -> None:
    log = TroubleLog(None)
    log._event("n", NodeEvent(5.0, "throttle", 2, detail))
    rows = list(log.rows.values())
    if words is None:
        assert rows == []
    else:
        assert [(r.kind, r.gpu) for r in rows] == [("throttle", 2)]


def test_the_state_folder_is_where_the_log_lives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuctl.fleet.troublelog import log_path

    monkeypatch.setenv("GPUCTL_STATE_DIR", str(tmp_path / "s"))
    assert log_path() == tmp_path / "s" / "events.jsonl"
    log = TroubleLog(log_path())
    log.note("n", None, "unreachable", active=True)
    assert oct(os.stat(log_path()).st_mode & 0o777) == "0o600"
    assert oct(os.stat(tmp_path / "s").st_mode & 0o777) == "0o700"


async def test_export_and_record_keep_the_fleets_trouble_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``running_fleet``, what ``gpuctl export`` and ``gpuctl record`` run in: a site's
    exporter keeps the log as the screen does (the demo's story goes nowhere)."""
    from gpuctl.cli.common import running_fleet
    from gpuctl.fleet.fleet import simulated_fleet
    from gpuctl.fleet.troublelog import log_path

    monkeypatch.setenv("GPUCTL_STATE_DIR", str(tmp_path / "state"))
    fleet = simulated_fleet([("sim-01", "2:H100")], interval=0.2)
    async with running_fleet(fleet):
        await wait_fleet(fleet, lambda s: s["sim-01"].gpus, what="sim-01 live")
        xid = {"type": "simulate", "action": "xid", "gpu": 1, "xid": 48}
        await fleet.request("sim-01", xid)
        await wait_until_async(
            lambda: log_path().exists() and TroubleLog.open(log_path()).newest(kind="xid"),
            10,
            "the XID in the state folder's log",
        )
    (row,) = TroubleLog.open(log_path()).newest(kind="xid")
    assert (row.node, row.gpu, row.subject) == ("sim-01", 1, "48")
    assert row.evidence["temp"] > 0  # the simulated GPU's reading, written at the end

    demo = simulated_fleet([("sim-02", "1:H100")], interval=0.2)
    async with running_fleet(demo, demo=True):
        await wait_fleet(demo, lambda s: s["sim-02"].gpus, what="sim-02 live")
    assert {r.node for r in TroubleLog.open(log_path()).rows.values()} == {"sim-01"}


def test_a_row_too_long_for_one_line_is_kept_without_its_bulk(tmp_path: Path) -> None:
    """A line is one ``write`` of at most ``appendlog.LINE_LIMIT`` bytes; a row past it (five
    failures of 300 characters, a long node name, two evidences) was cut there: no row."""
    path = tmp_path / "events.jsonl"
    log = TroubleLog(path)
    readings = {f"reading_{i}": 1000.5 + i for i in range(60)}
    detail = {"verdict": "FAIL", "failures": ["é" * 299] * 5, "run": "r" * 300}
    row = log.note("n" * 250, None, "accept", detail=detail, evidence=readings)
    kept = TroubleLog.open(path).rows[row.id]
    assert (kept.node, kept.kind, kept.detail["verdict"]) == ("n" * 250, "accept", "FAIL")


def test_a_gpu_lost_in_the_samples_alone_is_kept_and_ends_when_it_is_back() -> None:
    """A source that sends no events (a site's Prometheus): the samples say the GPU is lost,
    then (a reset) back; one occurrence, ended."""
    from gpuctl.core.model import GpuSample, NodeSnapshot, NodeState

    log = TroubleLog(None)

    def snap(t: float, state: str) -> NodeSnapshot:
        gpus = (GpuSample(index=0, t=t, temp=50), GpuSample(index=1, t=t, state=state))
        return NodeSnapshot(name="p1", state=NodeState.LIVE, gpus=gpus, last_sample_t=t)

    for t in (1.0, 2.0, 3.0):
        log._snapshot(snap(t, "lost"))
    (row,) = log.rows.values()
    assert (row.kind, row.gpu, row.count, row.active) == ("gpu_lost", 1, 1, True)
    log._snapshot(snap(4.0, "ok"))
    assert (row.active, row.ended) == (False, 4.0)
    log._snapshot(snap(5.0, "lost"))  # lost again: the same row, twice now
    assert (len(log.rows), row.count, row.active) == (1, 2, True)


def test_events_state_takes_every_state_the_screen_shows(tmp_path: Path) -> None:
    """``--state`` took only acked/unacked while the STATE column says active, ended, open or
    acked: each is a choice now (``unacked``: any but acked), a wrong one is one line."""
    log = TroubleLog(tmp_path / "events.jsonl")
    hot = log.note("n1", 0, "throttle", "sw_thermal", active=True)
    cooled = log.note("n1", 1, "throttle", "sw_thermal", active=True)
    log.end("n1", 1, "throttle", "sw_thermal")
    xid = log.note("n1", 2, "xid", "79")
    done = log.note("n1", 3, "xid", "48")
    log.ack(done.id, "reset", by="op@login")
    log.flush(force=True)
    want = {
        "active": {hot.id},
        "ended": {cooled.id},
        "open": {xid.id},
        "acked": {done.id},
        "unacked": {hot.id, cooled.id, xid.id},
    }
    for state, ids in want.items():
        out = gpuctl(tmp_path, "events", "--json", "--state", state)
        assert out.returncode == 0, out.stderr
        events = json.loads(out.stdout)["events"]
        assert {e["id"] for e in events} == ids, state
        assert all(e["state"] == state for e in events if state != "unacked")
    wrong = gpuctl(tmp_path, "events", "--state", "closed")
    assert wrong.returncode == 2 and wrong.stdout == ""
    assert len(wrong.stderr.splitlines()) == 1, wrong.stderr
    assert "invalid choice: 'closed'" in wrong.stderr, wrong.stderr
    assert all(s in wrong.stderr for s in want), wrong.stderr


def test_corrected_ecc_rises_fold_into_one_quiet_row_per_gpu(
    nvml_lib_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Corrected ECC counts, read by the NVML reader from the stand-in library and raised
    under it: the counts a GPU already had are the baseline (no row, whatever their size); each
    rise folds into the GPU's one row (its count the rises seen); a fall (a driver reload
    clears the volatile count) is a new baseline; the row is plain, so ``n`` does not stop on
    it; acknowledged, the next rise is a new row."""
    from gpuctl.core.model import GpuSample, NodeSnapshot, NodeState
    from gpuctl.node.readers.nvml import NvmlReader
    from gpuctl.tui.view import trouble_event

    stub = NvmlStub(nvml_lib_dir, tmp_path / "nvml.conf", "count 2\nset 0 ecc_agg_corr 900\n")
    stub.preload()
    monkeypatch.setenv(CONFIG_ENV, str(stub.config))
    reader = NvmlReader.open()
    log = TroubleLog(tmp_path / "events.jsonl")
    t0 = time.time()  # what the kept file is read back against (rows age out)
    t = [t0]

    def sample() -> None:
        t[0] += 1
        gpus = tuple(
            GpuSample(index=g["index"], t=t[0], ecc=g["ecc"]) for g in reader.sample(slow=True)
        )
        log._snapshot(NodeSnapshot("n1", NodeState.LIVE, gpus=gpus, last_sample_t=t[0]))

    def corrected() -> list[Trouble]:
        return [r for r in log.rows.values() if r.kind == "ecc_corrected"]

    try:
        for _ in range(3):
            sample()
        assert corrected() == []  # 900 corrected errors from before: the baseline, no news
        for n in range(1, 51):  # a memory going bad: a rise at every sample
            stub.set(0, "ecc_vol_corr", n)
            stub.set(0, "ecc_agg_corr", 900 + n)
            sample()
        (row,) = corrected()
        assert (row.gpu, row.count, row.first, row.last) == (0, 50, t0 + 4, t0 + 53)
        assert row.detail == {"volatile_corrected": 50, "aggregate_corrected": 950}
        words, how = trouble_event(row.kind, row.subject, row.detail)
        assert words == "corrected ECC errors rose (volatile corrected 50, aggregate corrected 950)"
        assert how == "plain"
        stub.set(0, "ecc_vol_corr", 0)  # a driver reload clears the volatile count
        sample()
        sample()
        assert row.count == 50 and len(corrected()) == 1
        log.ack(row.id, "watching it", by="op@login")
        stub.set(0, "ecc_vol_corr", 1)
        sample()
        assert len(corrected()) == 2 and not log.newest(kind="ecc", acked=None)
    finally:
        reader.close()
    log.flush(force=True)
    kept = TroubleLog.open(tmp_path / "events.jsonl")
    assert sorted(r.count for r in kept.rows.values() if r.kind == "ecc_corrected") == [1, 50]
