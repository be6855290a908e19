"""The process view against real processes: ``sleep``s of this user and of a second Unix user,
handed to the stand-in NVML, read by a real local agent, shown, and killed (or not) by keys."""

from __future__ import annotations

import os
import pwd
import sys
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable, Static

from gpuctl.core.model import GpuProcess, GpuSample, NodeSnapshot, NodeState
from gpuctl.fleet.fleet import Fleet
from gpuctl.fleet.links import LocalLink
from gpuctl.tui import GpuctlApp, make_app
from gpuctl.tui.procview import gpu_owners, process_rows
from gpuctl.tui.screens.confirm import ConfirmScreen
from gpuctl.tui.screens.processes import ProcessScreen
from gpuctl_tests.helpers import until
from gpuctl_tests.node.nvml_stub import CONFIG_ENV, NvmlStub
from gpuctl_tests.processes import OTHER_USER, Start, as_user, other_user
from gpuctl_tests.tui.test_app import messages

SIZE = (120, 36)


def stub_app(
    nvml_lib_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    script: str,
    read_only: bool = False,
) -> GpuctlApp:
    """The app over one local node whose agent reads the stub scripted with ``script``."""
    stub = NvmlStub(nvml_lib_dir, tmp_path / "nvml.conf", script)
    monkeypatch.setenv("LD_LIBRARY_PATH", str(stub.lib_dir))
    monkeypatch.setenv(CONFIG_ENV, str(stub.config))
    monkeypatch.delenv("GPUCTL_READ_ONLY", raising=False)
    link = LocalLink(python=sys.executable, interval=0.2, read_only=read_only)
    return make_app(Fleet({"n1": link}), state_dir=tmp_path / "state", read_only=read_only)


def table_rows(app: GpuctlApp) -> dict[str, list[str]]:
    """pid -> the cells of its row in the process view (the mark's column left out)."""
    table = app.screen.query_one("#procs-table", DataTable)
    out = {}
    for i in range(table.row_count):
        cells = [str(c) for c in table.get_row_at(i)][1:]
        out[cells[1]] = cells
    return out


def marks(app: GpuctlApp) -> dict[str, str]:
    """pid -> its mark's cell ("" when not marked)."""
    table = app.screen.query_one("#procs-table", DataTable)
    rows = [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]
    return {cells[2]: cells[0].strip() for cells in rows}


async def open_view(pilot: Pilot[Any], pids: set[int]) -> ProcessScreen:
    app = pilot.app
    assert isinstance(app, GpuctlApp)

    def listed() -> bool:
        snap = app.store.snaps["n1"]
        seen = {p.pid for g in snap.gpus for p in g.processes if p.cpu is not None}
        return snap.state is NodeState.LIVE and pids <= seen and bool(app.overview.nodes.lines)

    await until(pilot, listed, "the processes in a sample with their %CPU")
    await pilot.press("p")
    screen = await until(
        pilot, lambda: isinstance(app.screen, ProcessScreen) and app.screen, "view"
    )
    await until(pilot, lambda: {str(p) for p in pids} <= table_rows(app).keys(), "rows")
    return screen  # type: ignore[no-any-return]


async def select_pid(pilot: Pilot[Any], pid: int) -> None:
    """Put the view's cursor on ``pid`` with the arrow keys."""
    table = pilot.app.screen.query_one("#procs-table", DataTable)
    pids = [str(table.get_row_at(i)[2]) for i in range(table.row_count)]
    target = pids.index(str(pid))
    key = "down" if target > table.cursor_row else "up"
    await pilot.press(*[key] * abs(target - table.cursor_row))
    assert str(table.get_row_at(table.cursor_row)[2]) == str(pid)


async def test_the_view_shows_real_processes_kills_an_own_one_and_refuses_anothers(
    nvml_lib_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, procs: Start
) -> None:
    other = other_user()
    mine = procs("sleep", "320")
    theirs = procs(*as_user(other), "sleep", "321")
    launcher = procs("sh", "-c", "exec sleep 322")
    script = (
        f"count 2\nproc 0 {mine.pid} 2048\nproc 0 {theirs.pid} 1024\nproc 1 {launcher.pid} 512\n"
        f"procutil 0 {mine.pid} 61 10\n"
    )
    app = stub_app(nvml_lib_dir, tmp_path, monkeypatch, script)
    me = pwd.getpwuid(os.getuid()).pw_name
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await open_view(pilot, {mine.pid, theirs.pid})
        assert isinstance(app.screen, ProcessScreen) and app.screen.gpu == 0
        rows = table_rows(app)
        # the GPU the cursor was on: GPU 0 only, biggest GPU memory first
        assert list(rows) == [str(mine.pid), str(theirs.pid)]
        gpu, _pid, user, mem, sm, cpu, rss, elapsed, command = rows[str(mine.pid)]
        assert (gpu, user, mem, sm, command) == ("0", me, "2.0G", "61", "sleep 320")
        assert rss.endswith(("M", "G")) and cpu.isdigit() and elapsed.count(":") >= 1
        assert rows[str(theirs.pid)][2] == OTHER_USER
        assert rows[str(theirs.pid)][8] == "sleep 321"
        await pilot.press("g")  # the whole node
        await until(pilot, lambda: str(launcher.pid) in table_rows(app), "GPU 1's process")

        # another user's process: refused before anything is sent, the process lives on
        await select_pid(pilot, theirs.pid)
        await pilot.press("K")
        assert not isinstance(app.screen, ConfirmScreen)
        assert any(f"belongs to {OTHER_USER}" in m for m in messages(app))
        assert theirs.poll() is None

        # an own process: asked, then ended for real
        await select_pid(pilot, mine.pid)
        await pilot.press("k")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question")
        await pilot.press("y")
        await until(pilot, lambda: mine.poll() is not None, "sleep 320 to end", timeout=15)
        assert mine.returncode == -15
        await until(pilot, lambda: any("SIGTERM sent" in m for m in messages(app)), "notice")
        assert theirs.poll() is None and launcher.poll() is None


async def test_a_read_only_app_refuses_to_kill(
    nvml_lib_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, procs: Start
) -> None:
    mine = procs("sleep", "323")
    script = f"count 1\nproc 0 {mine.pid} 64\n"
    app = stub_app(nvml_lib_dir, tmp_path, monkeypatch, script, read_only=True)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await open_view(pilot, {mine.pid})
        await pilot.press("K")
        assert not isinstance(app.screen, ConfirmScreen)
        assert any("read-only: signalling processes is disabled" in m for m in messages(app))
        app.clear_notifications()
        await pilot.press("up", "space", "K")  # marked: refused the same way
        assert marks(app)[str(mine.pid)] and not isinstance(app.screen, ConfirmScreen)
        assert any("read-only: signalling processes is disabled" in m for m in messages(app))
        assert mine.poll() is None


def snap_with(
    processes: dict[int, list[GpuProcess]], parents: tuple[GpuProcess, ...] = ()
) -> NodeSnapshot:
    gpus = tuple(GpuSample(i, 0.0, processes=tuple(ps)) for i, ps in processes.items())
    return NodeSnapshot("n", NodeState.LIVE, gpus=gpus, parents=parents)


def proc(pid: int, user: str, mem: int, ppid: int = 1, **kw: Any) -> GpuProcess:
    return GpuProcess(pid, user, f"cmd{pid}", mem << 20, ppid=ppid, **kw)


def test_rows_sort_merge_and_tree() -> None:
    launcher = GpuProcess(10, "alice", "torchrun train.py", None, ppid=1)
    snap = snap_with(
        {
            0: [proc(11, "alice", 100, 10, sm=90.0), proc(30, "bob", 500)],
            1: [proc(11, "alice", 50, 10, sm=20.0), proc(12, "alice", 300, 10, cpu=5.0)],
        },
        (launcher,),
    )
    flat = process_rows(snap)
    assert [r.pid for r in flat] == [30, 12, 11]  # GPU memory, largest first
    merged = flat[2]
    assert (merged.gpus, merged.mem, merged.sm) == ((0, 1), 150 << 20, 90.0)
    assert [r.pid for r in process_rows(snap, sort="mem", reverse=True)] == [11, 12, 30]
    assert [r.pid for r in process_rows(snap, sort="cpu")] == [12, 11, 30]  # unknown last
    assert [r.pid for r in process_rows(snap, 1)] == [12, 11]
    tree = process_rows(snap, tree=True)
    # the launcher's subtree holds 300 MiB: below bob's 500 MiB, its children by memory
    assert [(r.pid, r.prefix, r.gpu_process) for r in tree] == [
        (30, "", True),
        (10, "", False),
        (12, "├─ ", True),
        (11, "└─ ", True),
    ]
    with pytest.raises(ValueError):
        process_rows(snap, sort="bogus")


def test_junk_ppids_make_no_loop_and_lose_no_process() -> None:
    snap = snap_with({0: [proc(5, "a", 1, ppid=6), proc(6, "a", 1, ppid=5), proc(7, "a", 1, 7)]})
    rows = process_rows(snap, tree=True)  # 5 and 6 are each other's parent, 7 its own
    assert sorted(r.pid for r in rows) == [5, 6, 7]


def test_the_gpu_row_names_its_main_user() -> None:
    g = GpuSample(0, 0.0, processes=(proc(1, "bob", 10), proc(2, "alice", 30), proc(3, "c", 5)))
    assert gpu_owners(g) == "alice +2"
    assert gpu_owners(GpuSample(0, 0.0)) == ""


async def test_a_hostile_nodes_processes_are_shown_as_data(tmp_path: Path) -> None:
    """Markup, escapes and junk numbers in processes, launchers and the host: text on screen,
    no crash, and a kill key refuses (the processes are no one's this user can prove)."""
    from gpuctl_tests.tui.hostile import hostile_fleet
    from gpuctl_tests.tui.test_hostile import NOW, check

    app = make_app(hostile_fleet(NOW), state_dir=tmp_path / "state", clock=lambda: NOW)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await until(pilot, lambda: app.store.snaps["evil"].gpus, "the hostile node")
        check(app)
        app.overview.nodes.select("evil", 0)
        await pilot.press("p", "g", "T")
        await until(pilot, lambda: isinstance(app.screen, ProcessScreen), "the process view")
        await pilot.pause()
        text = check(app)
        assert "[bold]x[/" in text
        for key in ("o", "o", "o", "O", "T", "K"):
            await pilot.press(key)
            check(app)
        assert not isinstance(app.screen, ConfirmScreen)


async def test_i_sends_sigint_to_an_own_process(
    nvml_lib_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, procs: Start
) -> None:
    """Issue 39.11: SIGINT beside SIGTERM and SIGKILL (a training script's Ctrl-C: it saves and
    ends), end to end: the key, the login side's check and the agent's ``signal`` request."""
    # SIGINT at its default whatever this test inherited (a shell's background job ignores it)
    code = "import signal, time; signal.signal(signal.SIGINT, signal.SIG_DFL); time.sleep(324)"
    mine = procs(sys.executable, "-c", code)
    app = stub_app(nvml_lib_dir, tmp_path, monkeypatch, f"count 1\nproc 0 {mine.pid} 2048\n")
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await open_view(pilot, {mine.pid})
        await select_pid(pilot, mine.pid)
        await pilot.press("i")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question")
        assert "Send SIGINT to pid" in str(app.screen.question)
        await pilot.press("y")
        await until(pilot, lambda: mine.poll() is not None, "the process to end", timeout=15)
        assert mine.returncode == -2
        await until(pilot, lambda: any("SIGINT sent" in m for m in messages(app)), "notice")


def title(app: GpuctlApp) -> str:
    return str(app.screen.query_one("#procs-title", Static).content)


async def test_marked_processes_get_one_question_and_each_its_signal(
    nvml_lib_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, procs: Start
) -> None:
    """Issue 39.11: several processes at once. Space marks (and unmarks), ``u`` clears the
    marks; ``k`` asks once, naming each marked process of this user and the other users' left
    alone, then signals each through the single path (each ended for real)."""
    other = other_user()
    one, two, spare = procs("sleep", "325"), procs("sleep", "326"), procs("sleep", "328")
    theirs = procs(*as_user(other), "sleep", "327")
    script = "count 1\n" + "".join(
        f"proc 0 {p.pid} {mem}\n"
        for p, mem in ((one, 4096), (two, 3072), (theirs, 2048), (spare, 1024))
    )
    app = stub_app(nvml_lib_dir, tmp_path, monkeypatch, script)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await open_view(pilot, {one.pid, two.pid, theirs.pid, spare.pid})
        for p in (spare, spare, one, two, theirs):  # spare marked and unmarked again
            await select_pid(pilot, p.pid)
            await pilot.press("space")
        shown = marks(app)
        assert [p.pid for p in (one, two, theirs) if shown[str(p.pid)]] == [
            one.pid,
            two.pid,
            theirs.pid,
        ]
        assert not shown[str(spare.pid)] and "3 marked" in title(app)

        await pilot.press("u")  # cleared: k is for the cursor's process alone
        assert not any(marks(app).values()) and "marked" not in title(app)
        await select_pid(pilot, spare.pid)
        await pilot.press("k")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question")
        assert f"Send SIGTERM to pid {spare.pid} (sleep 328)" in str(app.screen.question)
        await pilot.press("n")

        for p in (one, two, theirs):
            await select_pid(pilot, p.pid)
            await pilot.press("space")
        await pilot.press("k")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question")
        question = str(app.screen.question)
        assert question.startswith("Send SIGTERM to 2 processes on n1?"), question
        assert f"pid {one.pid}" in question and f"pid {two.pid}" in question
        assert f"1 marked of other users left alone (pid {theirs.pid})" in question
        await pilot.press("y")
        await until(pilot, lambda: None not in (one.poll(), two.poll()), "both to end", timeout=15)
        assert (one.returncode, two.returncode) == (-15, -15)
        assert theirs.poll() is None and spare.poll() is None
        await until(
            pilot, lambda: sum("SIGTERM sent" in m for m in messages(app)) == 2, "two notices"
        )
        for p in (theirs, spare):  # one of mine, one left alone
            await select_pid(pilot, p.pid)
            await pilot.press("space")
        await pilot.press("k")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question")
        question = str(app.screen.question)
        assert question.startswith("Send SIGTERM to 1 process on n1?"), question
        await pilot.press("n")


async def test_slash_filters_by_user_or_command_and_esc_clears_it(
    nvml_lib_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, procs: Start
) -> None:
    other = other_user()
    mine, also = procs("sleep", "331"), procs("sleep", "332")
    theirs = procs(*as_user(other), "sleep", "333")
    script = f"count 1\nproc 0 {mine.pid} 3072\nproc 0 {also.pid} 2048\nproc 0 {theirs.pid} 1024\n"
    app = stub_app(nvml_lib_dir, tmp_path, monkeypatch, script)
    everyone = {str(p.pid) for p in (mine, also, theirs)}
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await open_view(pilot, {mine.pid, also.pid, theirs.pid})
        assert "3 on GPUs" in title(app)
        await pilot.press("slash", *"SLEEP 332")  # any case, part of the command line
        await until(pilot, lambda: set(table_rows(app)) == {str(also.pid)}, "the one match")
        assert "1 of 3 shown" in title(app)
        await pilot.press("enter")  # the box closes, the filter stays
        assert set(table_rows(app)) == {str(also.pid)}
        await pilot.press("escape")  # clears the kept filter, the view stays
        assert isinstance(app.screen, ProcessScreen) and set(table_rows(app)) == everyone
        await pilot.press("slash", *OTHER_USER)  # the user's name
        await until(pilot, lambda: set(table_rows(app)) == {str(theirs.pid)}, "their process")
        await pilot.press("escape")  # closes the box and clears it
        assert set(table_rows(app)) == everyone and "3 on GPUs" in title(app)
        await pilot.press("escape")
        assert not isinstance(app.screen, ProcessScreen)


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_the_views_footer_offers_mark_and_filter_within_the_width(
    tmp_path: Path, size: tuple[int, int]
) -> None:
    from gpuctl_tests.tui.conftest import replay_app, rows_view, settle
    from gpuctl_tests.tui.test_usability import footer_items

    app = replay_app(tmp_path)
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        await rows_view(pilot)
        await pilot.press("p")
        await until(pilot, lambda: isinstance(app.screen, ProcessScreen), "the process view")
        await pilot.pause()
        items = footer_items(app)
        names = [what for what, _, _ in items]
        assert {"mark", "filter", "kill"} <= set(names) and names[-2:] == ["help", "quit"], names
        assert max(right for _, _, right in items) <= size[0], items
        assert ("tree" in names) is (size[0] >= 100)
        await pilot.press("slash", *"python", "enter")  # a kept filter: Esc unfilters
        await until(pilot, lambda: "unfilter" in [w for w, _, _ in footer_items(app)], "unfilter")
        items = footer_items(app)
        assert [w for w, _, _ in items][-2:] == ["help", "quit"], items
        assert max(right for _, _, right in items) <= size[0], items
        await pilot.press("escape")  # cleared: / filter is offered again
        await until(pilot, lambda: "filter" in [w for w, _, _ in footer_items(app)], "/ filter")


async def test_a_marked_process_the_filter_hides_is_left_alone_and_counted(
    nvml_lib_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, procs: Start
) -> None:
    """A key signals only the marked processes the user can see: one hidden by ``/`` is named
    as a count in the question, lives on and stays marked; all of them hidden: nothing asked."""
    seen, hidden = procs("sleep", "341"), procs("sleep", "342")
    script = f"count 1\nproc 0 {seen.pid} 2048\nproc 0 {hidden.pid} 1024\n"
    app = stub_app(nvml_lib_dir, tmp_path, monkeypatch, script)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await open_view(pilot, {seen.pid, hidden.pid})
        for p in (seen, hidden):
            await select_pid(pilot, p.pid)
            await pilot.press("space")
        await pilot.press("slash", *"sleep 341", "enter")
        await until(pilot, lambda: set(table_rows(app)) == {str(seen.pid)}, "the one match")
        await pilot.press("k")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question")
        question = str(app.screen.question)
        assert f"pid {seen.pid}" in question and f"pid {hidden.pid}" not in question, question
        assert "1 marked process hidden by the filter: left alone" in question, question
        await pilot.press("y")
        await until(pilot, lambda: seen.poll() is not None, "sleep 341 to end", timeout=15)
        await until(pilot, lambda: "1 marked" in title(app), "the hidden mark kept")
        assert hidden.poll() is None

        await pilot.press("escape", "slash", *"sleep 342", "enter")  # only the marked one...
        await until(pilot, lambda: set(table_rows(app)) == {str(hidden.pid)}, "its row")
        await pilot.press("escape", "slash", *"nothing", "enter")  # ...then none of them shown
        await until(pilot, lambda: not table_rows(app), "no row")
        await pilot.press("K")
        assert not isinstance(app.screen, ConfirmScreen)
        assert any("1 marked process hidden by the filter" in m for m in messages(app))
        assert hidden.poll() is None
