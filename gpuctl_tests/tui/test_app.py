"""The real app over a simulated fleet (the real agent loop in threads), driven by keys."""

from __future__ import annotations

import asyncio
import importlib.metadata
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable, Input, Label

from gpuctl import service
from gpuctl.config import TuiSettings
from gpuctl.core.model import NodeState
from gpuctl.fleet import control
from gpuctl.fleet.demo import demo_nodes
from gpuctl.fleet.fixed_links import ReplayLink, recorded_node
from gpuctl.fleet.fleet import Fleet, simulated_fleet
from gpuctl.fleet.links import LocalLink, NodeLink
from gpuctl.fleet.session import AgentSession
from gpuctl.tui import GpuctlApp, make_app
from gpuctl.tui.screens.confirm import ConfirmScreen
from gpuctl.tui.screens.detail import DetailScreen
from gpuctl.tui.screens.help import HelpScreen
from gpuctl.tui.widgets.panes import JobsPane
from gpuctl_tests import helpers
from gpuctl_tests.helpers import until
from gpuctl_tests.node import smi_stub
from gpuctl_tests.node.nvml_stub import CONFIG_ENV, NvmlStub, build

SIZE = (120, 36)


def sim_app(state_dir: Path, **kwargs: Any) -> GpuctlApp:
    fleet = simulated_fleet(demo_nodes(3, 4), interval=0.2)
    return make_app(fleet, simulated=True, state_dir=state_dir, **kwargs)


async def all_live(pilot: Pilot[Any]) -> None:
    app = pilot.app
    assert isinstance(app, GpuctlApp)
    await until(
        pilot,
        lambda: helpers.all_live(app.store.snaps.values()) and app.overview.nodes.lines,
        "every node live on screen",
    )


def messages(app: GpuctlApp) -> list[str]:
    return [n.message for n in app._notifications]


def test_one_way_to_build_the_app() -> None:
    """The constructor is the factory (STYLE.md): ``make_app`` is not a second list of the
    same parameters that can drift from it."""
    assert make_app is GpuctlApp


async def test_cursor_moves_and_detail_opens(state_dir: Path) -> None:
    app = sim_app(state_dir)
    async with app.run_test(size=SIZE) as pilot:
        await all_live(pilot)
        nodes = app.overview.nodes
        assert nodes.cursor == ("sim-01", 0)
        await pilot.press("down", "down")
        assert nodes.cursor == ("sim-01", 2)
        await pilot.press("right")
        assert nodes.cursor == ("sim-02", 0)
        await pilot.press("up")
        assert nodes.cursor == ("sim-01", 3)  # up from a node's first GPU: the previous node
        await pilot.press("end")
        assert nodes.cursor == ("sim-03", 3)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, DetailScreen), "the detail screen")
        detail = app.screen
        assert isinstance(detail, DetailScreen)
        assert (detail.node, detail.gpu) == ("sim-03", 3)
        await pilot.press("right")
        assert detail.gpu == 0  # wraps around the node's GPUs
        # The processes table follows the node's samples: one row per process of this GPU.
        table = detail.query_one("#detail-procs", DataTable)

        def procs() -> set[str]:
            return {
                f"{g.index}:{p.pid}"
                for g in app.store.snaps["sim-03"].gpus
                if g.index == detail.gpu
                for p in g.processes
            }

        await until(
            pilot, lambda: any(g.processes for g in app.store.snaps["sim-03"].gpus), "a process"
        )
        for _ in range(4):  # to a GPU with processes
            if procs():
                break
            await pilot.press("right")
        await until(
            pilot,
            lambda: procs() and {str(k.value) for k in table.rows} == procs(),
            "the GPU's processes in the table",
        )
        assert {str(table.get_row_at(i)[3]) for i in range(table.row_count)} == {"python train.py"}
        await pilot.press("escape")
        assert app.screen is app.overview


async def test_heatmap_cursor_names_the_gpu(state_dir: Path) -> None:
    app = sim_app(state_dir)
    async with app.run_test(size=SIZE) as pilot:
        await all_live(pilot)
        await pilot.press("m")
        assert app.overview.mode == "util" and app.overview.heatmap.display
        await pilot.press("right", "right")
        status = app.overview.query_one("#heat-status")
        assert "sim-01 GPU 2" in str(status.render())
        await pilot.press("m")  # next metric, same cursor
        assert app.overview.mode == "mem"
        assert app.overview.heatmap.selected() == ("sim-01", 2)
        await pilot.press("escape")
        assert app.overview.mode == "list"
        assert app.overview.nodes.cursor == ("sim-01", 2)


async def test_filter_by_name_threshold_and_mistake(state_dir: Path) -> None:
    app = sim_app(state_dir)
    async with app.run_test(size=SIZE) as pilot:
        await all_live(pilot)
        nodes = app.overview.nodes
        await pilot.press("slash")
        box = app.overview.query_one("#filter", Input)
        assert box.has_focus
        await pilot.press(*"sim-02")
        assert {line.node for line in nodes.lines} == {"sim-02"}
        assert nodes.cursor is not None and nodes.cursor[0] == "sim-02"
        box.value = "temp>500"
        await pilot.pause()
        assert [line.kind for line in nodes.lines] == ["nomatch"]  # says so, selects nothing
        box.value = "temp>>5"
        await pilot.pause()
        assert box.has_class("-invalid") and "temp>>5" in str(box.border_title)
        assert [line.kind for line in nodes.lines] == ["nomatch"]  # the last good filter
        box.value = "temp<500 sim-03"
        await pilot.pause()
        assert {line.node for line in nodes.lines} == {"sim-03"}
        assert "filter: temp<500 sim-03" in str(
            app.overview.query_one("#filter-shown", Label).content
        )
        await pilot.press("enter")
        assert not box.display and nodes.has_focus
        await pilot.press("slash", "escape")  # escape clears the filter
        assert {line.node for line in nodes.lines} == {"sim-01", "sim-02", "sim-03"}


async def test_theme_switch_is_remembered(state_dir: Path) -> None:
    app = sim_app(state_dir)
    async with app.run_test(size=SIZE) as pilot:
        assert app.theme == "gpuctl-dark"
        await pilot.press("t")
        assert app.theme == app.gpuctl_themes[(app.gpuctl_themes.index("gpuctl-dark") + 1) % 3]
        chosen = app.theme
    again = sim_app(state_dir)
    async with again.run_test(size=SIZE):
        assert again.theme == chosen
    pinned = sim_app(state_dir, tui=TuiSettings(theme="light"))
    async with pinned.run_test(size=SIZE):
        assert pinned.theme == "gpuctl-light"  # the config pins it


async def test_read_only_refuses_mutating_keys(state_dir: Path) -> None:
    app = sim_app(state_dir, read_only=True)
    async with app.run_test(size=SIZE) as pilot:
        await all_live(pilot)
        assert app.overview.query_one("#mark-read-only", Label).display
        for key in ("s", "S", "B", "a"):
            await pilot.press(key)
        refused = [m for m in messages(app) if m.startswith("read-only:")]
        assert len(refused) == 4
        assert not isinstance(app.screen, ConfirmScreen)  # B did not even ask
        assert all(not s.annotations for s in app.store.snaps.values())


async def test_read_only_in_the_browser_names_serves_flag(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A screen `gpuctl serve` runs for a browser is read-only because serve said so: the
    refusal names serve's --allow-actions, not flags its user never typed."""
    app = sim_app(state_dir, read_only=True)
    async with app.run_test(size=SIZE) as pilot:
        await all_live(pilot)
        monkeypatch.setenv("TEXTUAL_DRIVER", "textual_serve.web_driver:WebDriver")
        await pilot.press("s")
        (refused,) = [m for m in messages(app) if m.startswith("read-only:")]
        assert "gpuctl serve --allow-actions" in refused and "GPUCTL_READ_ONLY" not in refused


async def test_quit_asks_while_burning_and_stops(state_dir: Path) -> None:
    app = sim_app(state_dir)
    async with app.run_test(size=SIZE) as pilot:
        await all_live(pilot)
        app.fleet.annotate("sim-02", 1, burn={"state": "running", "tflops": 1.0, "errors": 0})
        await until(pilot, lambda: app.store.is_burning(app.store.snaps["sim-02"], 1), "burn shown")
        await pilot.press("q")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question")
        assert "sim-02" in app.screen.question
        await pilot.press("n")
        assert app.screen is app.overview and app.is_running
        await pilot.press("q")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question again")
        await pilot.press("y")
        await until(pilot, lambda: not app.is_running, "the app to exit", timeout=15)
    assert app.return_value == 0
    assert all(rt.task is None for rt in app.fleet.nodes.values())  # the fleet was stopped


async def test_quit_without_burns_exits_at_once(state_dir: Path) -> None:
    app = sim_app(state_dir)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("q")
        await until(pilot, lambda: not app.is_running, "the app to exit")
    assert app.return_value == 0


async def test_help_lists_every_binding_and_keys_remap(state_dir: Path) -> None:
    app = sim_app(state_dir, tui=TuiSettings(keys={"heatmap": "h", "nonsense": "x"}))
    async with app.run_test(size=SIZE) as pilot:
        await all_live(pilot)
        assert any("nonsense" in m for m in messages(app))
        await pilot.press("h")
        assert app.overview.mode == "util"
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        ids = {row[2] for row in app.screen.rows}
        assert {
            "stress_gpu",
            "stress_node",
            "stress_cluster",
            "heatmap",
            "filter",
            "detail",
            "quit",
            "help",
            "theme",
            "reconnect",
            "accept",
            "pane_jobs",
        } <= ids
        assert ("h", "map", "heatmap", "overview") in app.screen.rows
        await pilot.press("escape")
        commands = {c.title for c in app.get_system_commands(app.overview)}
        assert {"Stress GPU", "Map", "Filter", "Reconnect", "Theme"} <= commands
        # the palette names keys as the footer does: "/" and "?", not "slash", "question_mark"
        helps = {c.title: c.help for c in app.get_system_commands(app.overview)}
        assert helps["Filter"] == "key /" and helps["Help"] == "key ?"
        assert not [h for h in helps.values() if "slash" in h or "question_mark" in h]


async def test_jobs_pane_lists_the_job_store_in_place(state_dir: Path, tmp_path: Path) -> None:
    from gpuctl.jobs.store import JobRecord, JobStore

    store = JobStore(tmp_path / "jobs.sqlite")
    store.add(JobRecord("j-old", "train", "local", {}, str(tmp_path), "done", 1000.0))
    store.add(JobRecord("j-new", "sweep", "gpu-a01", {}, str(tmp_path), "running", 2000.0))
    app = sim_app(state_dir, job_store=store)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        table = app.overview.query_one("#jobs-table", DataTable)
        await until(pilot, lambda: table.row_count == 2, "the two jobs")
        assert [str(table.get_row_at(i)[3]) for i in range(2)] == ["sweep", "train"]
        store.update("j-new", state="failed", summary="exit 1")
        app.overview.query_one(JobsPane).reload()
        await until(pilot, lambda: str(table.get_cell("j-new", "state")) == "failed", "update")
        assert str(table.get_cell("j-new", "summary")) == "exit 1"
        assert table.row_count == 2
        await pilot.press("1")
        assert app.overview.nodes.has_focus


async def test_jobs_pane_shows_the_task_count_of_a_job_of_several(
    state_dir: Path, tmp_path: Path
) -> None:
    from gpuctl.jobs.records import BackendInfo
    from gpuctl.jobs.store import JobRecord, JobStore

    store = JobStore(tmp_path / "jobs.sqlite")
    backend: BackendInfo = {"kind": "slurm", "handle": {"slurm_id": "77", "tasks": 4}}
    store.add(JobRecord("j-ddp", "train", "slurm", backend, str(tmp_path), "done", 1000.0))
    store.add(JobRecord("j-one", "eval", "slurm", {"kind": "slurm"}, str(tmp_path), "done", 900.0))
    app = sim_app(state_dir, job_store=store)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        table = app.overview.query_one("#jobs-table", DataTable)
        await until(pilot, lambda: table.row_count == 2, "the two jobs")
        assert str(table.get_cell("j-ddp", "target")) == "slurm (4 tasks)"
        assert str(table.get_cell("j-one", "target")) == "slurm"


async def test_acceptance_key_asks_first(state_dir: Path) -> None:
    app = sim_app(state_dir)
    async with app.run_test(size=SIZE) as pilot:
        await all_live(pilot)
        await pilot.press("down", "a")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question")
        assert "sim-01" in app.screen.question and "CPU" in app.screen.question
        await pilot.press("n")
        assert app.accept_flow.run is None and app.screen is app.overview


async def question_to(pilot: Pilot[Any], key: str) -> str:
    """Press ``key`` and return the question it asks (a ``ConfirmScreen``'s)."""
    app = pilot.app
    await pilot.press(key)
    screen = await until(
        pilot, lambda: isinstance(app.screen, ConfirmScreen) and app.screen, "a question"
    )
    return str(screen.question)


async def test_stress_key_asks_naming_the_gpu_and_the_duration(state_dir: Path) -> None:
    """``s`` on a GPU nobody else uses asks before it burns (issue 39.1: it started an hour's
    burn at once), naming the GPU and how long the burn lasts; no burns nothing, yes burns as
    this user, and ``s`` again stops it without a question."""
    app = sim_app(state_dir)
    async with app.run_test(size=SIZE) as pilot:
        await all_live(pilot)
        await pilot.press("right")  # sim-02 GPU 0 runs nobody's job
        assert await question_to(pilot, "s") == "Burn sim-02 GPU 0 for 60 min?"
        await pilot.press("n")
        assert app.screen is app.overview
        await pilot.pause()
        assert control.burning(app.fleet) == []
        assert await question_to(pilot, "s") == "Burn sim-02 GPU 0 for 60 min?"
        await pilot.press("y")
        snap = lambda: app.store.snaps["sim-02"]  # noqa: E731
        await until(pilot, lambda: app.store.burn(snap(), 0), "a burn annotation on GPU 0")
        assert app.store.burn(snap(), 0)["owner"] == service.me().to_wire()
        await pilot.press("s")  # stopping asks nothing
        assert not isinstance(app.screen, ConfirmScreen)
        await until(
            pilot,
            lambda: not app.store.is_burning(snap(), 0),
            "the burn to stop",
            timeout=15,
        )


async def test_confirm_burn_off_burns_an_idle_gpu_at_once_but_s_and_b_still_ask(
    state_dir: Path,
) -> None:
    """``[tui] confirm_burn = false``: ``s`` on a GPU without other users' processes burns
    at once (the old way), one with them still asks; ``S`` on a node of idle GPUs and ``B``
    ask whatever the key says, naming the duration of the config's ``[stress]``."""
    fleet = simulated_fleet([("busy", "2:H100"), ("idle", "1:H100")], interval=0.2)
    control.configure(fleet, {"max_duration": 1800.0})
    app = make_app(fleet, simulated=True, state_dir=state_dir, tui=TuiSettings(confirm_burn=False))
    async with app.run_test(size=SIZE) as pilot:
        await all_live(pilot)
        assert app.overview.nodes.cursor == ("busy", 0)
        assert await question_to(pilot, "s") == (
            "busy GPU 0 runs processes of dana (1). Burn it anyway for 30 min?"
        )
        await pilot.press("n")
        await pilot.press("end")
        assert app.overview.nodes.cursor == ("idle", 0)
        assert await question_to(pilot, "S") == "Burn all 1 GPU of idle for 30 min?"
        await pilot.press("n")
        assert await question_to(pilot, "B") == (
            "Burn all 3 GPUs on 2 live nodes for 30 min? "
            "2 GPUs run processes of other users: chen (1), dana (1)."
        )
        await pilot.press("n")
        await pilot.pause()
        assert control.burning(app.fleet) == []
        await pilot.press("s")
        await until(pilot, lambda: control.burning(app.fleet) == [("idle", 0)], "idle burning")
        assert not isinstance(app.screen, ConfirmScreen)


async def test_stress_keys_ask_before_burning_gpus_that_run_other_users_jobs(
    state_dir: Path,
) -> None:
    """The demo's GPUs run jobs of alice, bob, chen and dana (their samples' processes): s, S
    and B name them with their process counts and burn only on yes."""
    app = sim_app(state_dir)
    async with app.run_test(size=SIZE) as pilot:
        await all_live(pilot)

        await pilot.press("down")  # sim-01 GPU 1: chen's job
        assert (
            await question_to(pilot, "s")
            == "sim-01 GPU 1 runs processes of chen (1). Burn it anyway for 60 min?"
        )
        await pilot.press("n")
        assert app.screen is app.overview
        assert await question_to(pilot, "B") == (
            "Burn all 12 GPUs on 3 live nodes for 60 min? 9 GPUs run processes of other users: "
            "bob (3), dana (3), chen (2), alice (1)."
        )
        await pilot.press("n")
        assert app.screen is app.overview
        assert await question_to(pilot, "S") == (
            "On sim-01, GPU 0 runs processes of dana (1); GPU 1 runs processes of chen (1); "
            "GPU 2 runs processes of bob (1); GPU 3 runs processes of bob (1). "
            "Burn all 4 GPUs of sim-01 anyway for 60 min?"
        )
        await pilot.pause()
        assert control.burning(app.fleet) == []  # nothing started while asking
        await pilot.press("y")
        await until(
            pilot, lambda: len(control.burning(app.fleet)) == 4, "sim-01's four GPUs burning"
        )
        assert {n for n, _ in control.burning(app.fleet)} == {"sim-01"}
        # S decides from what the screen shows (the app's store, a flush behind the fleet)
        shown = app.store.snaps
        await until(pilot, lambda: all(shown["sim-01"].burning(g) for g in range(4)), "shown")
        await pilot.press("S")  # stopping asks nothing
        await until(pilot, lambda: not control.burning(app.fleet), "the burns to stop", 15)


class HangingLink(NodeLink):
    """A node whose connection attempt never finishes (a black-holed host)."""

    kind = "ssh"

    async def open(self) -> AgentSession:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_screen_never_waits_for_a_hanging_node(state_dir: Path) -> None:
    links: dict[str, NodeLink] = {
        "hang": HangingLink(),
        "ok": ReplayLink(recorded_node("ok", "2:H100", samples=3, t0=time.time() - 3)),
    }
    app = make_app(Fleet(links, connect_timeout=600), state_dir=state_dir)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.store.snaps["ok"].gpus, "the answering node")
        assert app.store.snaps["hang"].state is NodeState.CONNECTING
        await pilot.press("down")
        assert app.overview.nodes.cursor == ("ok", 0)
        await pilot.press("m", "escape", "question_mark", "escape")  # keys keep working


async def test_a_node_update_repaints_only_that_node(state_dir: Path) -> None:
    from gpuctl_tests.tui.conftest import replay_app, settle

    app = replay_app(state_dir)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        nodes = app.overview.nodes
        painted: list[str] = []
        original = nodes.render_line

        def counting(y: int) -> Any:
            ly = y + int(nodes.scroll_offset.y)
            if ly < len(nodes.lines):
                painted.append(nodes.lines[ly].node)
            return original(y)

        # the once-a-second tick repaints the down nodes' headers (their ages): another path,
        # which a loaded machine let fall inside this window (gpu-c03 among the painted)
        nodes.refresh_stale_headers = lambda: None  # type: ignore[method-assign]
        await pilot.pause()
        nodes.render_line = counting  # type: ignore[method-assign]
        app.fleet.annotate("gpu-b02", 1, slurm_job="7", slurm_user="eve")
        await until(pilot, lambda: painted, "a repaint")
        await pilot.pause()
        assert set(painted) == {"gpu-b02"}
        assert len(painted) <= 5  # header (two lines at 120 columns), two GPU rows, the gap line


async def test_heatmap_fits_1024_gpus_on_160x48(state_dir: Path) -> None:
    hello = recorded_node("x", "8:H100", samples=1, t0=time.time())
    links: dict[str, NodeLink] = {f"gpu-{i:03d}": ReplayLink(hello) for i in range(128)}
    app = make_app(Fleet(links), state_dir=state_dir)
    async with app.run_test(size=(160, 48)) as pilot:
        await until(
            pilot,
            lambda: (
                sum(len(s.gpus) for s in app.store.snaps.values()) == 1024 and not app.store.pending
            ),
            "1,024 GPUs",
        )
        await pilot.press("m")
        heat = app.overview.heatmap
        assert heat.virtual_size.height <= heat.size.height  # no scrolling needed
        await pilot.press("down")
        assert heat.selected() == (f"gpu-{heat.per_line:03d}", 0)


async def test_the_node_header_says_how_each_node_reads_its_gpus(
    state_dir: Path, tmp_path: Path
) -> None:
    """Two real agents: one on NVML (stand-in libnvidia-ml), one on the nvidia-smi fallback."""
    stub = NvmlStub(build(tmp_path), tmp_path / "nvml.conf", "count 1\n")
    smi_stub.install(tmp_path / "smi-bin", tmp_path / "smi.json", smi_stub.default_data())
    wrappers = {
        "nv": f"LD_LIBRARY_PATH={stub.lib_dir} {CONFIG_ENV}={stub.config}",
        "smi": f"PATH={tmp_path / 'smi-bin'}:$PATH {smi_stub.DATA_ENV}={tmp_path / 'smi.json'}",
    }
    links: dict[str, NodeLink] = {}
    for name, env in wrappers.items():
        python = tmp_path / f"python-{name}"
        python.write_text(f'#!/bin/sh\nunset LD_LIBRARY_PATH\n{env} exec "{sys.executable}" "$@"\n')
        python.chmod(0o755)
        links[name] = LocalLink(python=str(python), interval=0.2)
    app = make_app(Fleet(links), state_dir=state_dir)
    # 240 columns: the whole header, once the host's readings hold its network rates too (from
    # a node's second sample on; at 200 the reader's words were cut, read a moment later).
    async with app.run_test(size=(240, 20)) as pilot:
        await all_live(pilot)
        nodes = app.overview.nodes

        def header(name: str) -> str:
            y = next(i for i, ln in enumerate(nodes.lines) if (ln.kind, ln.node) == ("head", name))
            return nodes.render_line(y - int(nodes.scroll_offset.y)).text

        version = importlib.metadata.version("nvidia-ml-py")  # from source: the node's own
        assert header("nv").rstrip().endswith(f"NVML, pynvml system {version}")
        assert (
            header("smi")
            .rstrip()
            .endswith("nvidia-smi (NVML: nvmlInit failed: NVML Shared Library Not Found)")
        )
