"""Issue 26: ``gpuctl demo`` tells the README's story: "one GPU burning until it throttles, one
XID, one node that stalls now and then". The burning GPU shows BURN on its row (it was a load
seen only in ``p``), and it is the only GPU that throttles (4-7 busy GPUs showed THERM after two
minutes)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from gpuctl import service
from gpuctl.cli.demo import story
from gpuctl.fleet import control
from gpuctl.fleet.demo import HOLD_JOB, HOLD_USER, demo_nodes
from gpuctl.fleet.fleet import simulated_fleet
from gpuctl.node.readers.sim import SimReader
from gpuctl.tui import make_app
from gpuctl.tui.screens.confirm import ConfirmScreen
from gpuctl.tui.screens.processes import ProcessScreen
from gpuctl_tests.tui.test_hostile import drawn
from gpuctl_tests.tui.test_panes import until


def test_only_the_burned_gpu_of_the_demo_throttles_after_ten_minutes() -> None:
    """The demo's six nodes (the seeds and specs ``gpuctl demo`` gives them), the story's GPU
    (the first node's first GPU without a job: 6) loaded as the burn loads it, ten simulated
    minutes in one-second steps."""
    now = [0.0]
    readers = [
        SimReader.from_spec(spec, seed=i, clock=lambda: now[0])
        for i, (_name, spec) in enumerate(demo_nodes())
    ]
    target = next(g.index for g in readers[0].gpus if not g.processes)
    assert target == 6
    readers[0].simulate("load", {"gpus": [target], "load": 1.0})
    throttled: set[tuple[int, int]] = set()
    for _ in range(600):
        now[0] += 1.0
        for n, reader in enumerate(readers):
            for g in reader.sample(slow=False):
                if "sw_thermal" in g["throttle"]:
                    throttled.add((n, g["index"]))
    # the demo's jobs keep GPUs busy (the point is that they do not throttle)
    busy = sum(1 for r in readers for g in r.gpus if g.base_load >= 0.9)
    assert busy >= 4, busy
    assert throttled == {(0, target)}, sorted(throttled)


async def test_the_demo_burns_one_gpu_with_its_badge_on_the_screen(tmp_path: Path) -> None:
    """Issue 39.8: the demo taught wrong things. Its burn ran on top of another user's job, its
    process was user ``gpuctl``'s (``k`` refused to stop your own burn), and the GPU with XID 79
    ("fallen off the bus") went on at 40 % with a live process. The story burns a GPU without
    another user's job (sim-01's four all run one: sim-02 GPU 0), its burner is your user's and
    ``k`` stops it, and the XID 79 GPU reads as lost: no utilization, no processes."""
    fleet = simulated_fleet(demo_nodes(2, 4), interval=0.2)
    app = make_app(fleet, simulated=True, state_dir=tmp_path / "state")
    app.background.append(lambda: story(fleet, stall_every=3600, burns=app.stress_flow.own_burns))
    async with app.run_test(size=(160, 30)) as pilot:
        nodes = app.overview.nodes

        def row(node: str, gpu: int) -> str:
            y = next(i for i, ln in enumerate(nodes.lines) if (ln.node, ln.gpu) == (node, gpu))
            nodes.scroll_to(y=y, animate=False, immediate=True)
            return "".join(s.text for s in nodes.render_line(y - int(nodes.scroll_offset.y)))

        snaps = app.store.snaps
        await until(
            pilot,
            lambda: snaps["sim-02"].burning(0) and "BURN" in row("sim-02", 0),
            "sim-02 GPU 0 burning on screen",
            timeout=30,
        )
        burn = snaps["sim-02"].burn(0)
        assert burn is not None and burn.get("engine") == "sim"
        # one GPU burns, not the node, and on no one else's job
        assert [(n, g) for n, g in control.burning(fleet)] == [("sim-02", 0)]
        assert service.others_on(snaps["sim-02"], [0]) == []
        # the XID the story sends arrives, and its GPU is gone from the bus
        await until(pilot, lambda: ("sim-02", 3) in app.store.xids, "the XID on sim-02")
        await until(pilot, lambda: snaps["sim-02"].gpus[3].lost, "GPU 3 lost")
        lost = snaps["sim-02"].gpus[3]
        assert lost.util_gpu is None and lost.processes == ()
        # the burner is yours: p, k and yes stop it
        await until(
            pilot,
            lambda: [p.user for p in snaps["sim-02"].gpus[0].processes] == [service.user_name()],
            "the burner's process",
        )
        nodes.select("sim-02", 0)
        await pilot.press("p")
        screen = await until(
            pilot, lambda: isinstance(app.screen, ProcessScreen) and app.screen, "the processes"
        )
        assert [r.user for r in screen.rows if r.gpu_process] == [service.user_name()]
        await pilot.press("k")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question")
        await pilot.press("y")
        await until(pilot, lambda: not snaps["sim-02"].burning(0), "the burn to end")
        ended = snaps["sim-02"].burn(0)
        assert ended is not None and ended.get("reason") == "burner stopped by SIGTERM"
        assert not any("refused" in n.message for n in app._notifications)
        await pilot.press("escape")
        # q quits the demo at once, as its first screen says
        await pilot.press("q")
        await until(pilot, lambda: not app.is_running, "the demo to exit")
    assert app.return_value == 0


async def test_quitting_ends_a_story_that_lost_a_cancel(tmp_path: Path) -> None:
    """The screen's quit ends the demo's story (a Textual worker) before it stops the fleet,
    as ``running_fleet`` does for ``export``/``record``: Textual cancels its workers once and
    does not wait, and on Python 3.11 a request's ``asyncio.wait_for`` can lose that cancel; the
    story then went on while the fleet stopped and after the screen had gone, and only
    ``asyncio.run``'s own single cancel at exit was left to end it (a second lost cancel: the
    process never exits). The story here loses its first cancel as that one did."""
    lost: list[bool] = []
    tasks: list[asyncio.Task[Any]] = []
    stopped_after: list[bool] = []

    async def story() -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks.append(task)
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if lost:
                    nodes = fleet.nodes.values()  # their tasks still run: ended first
                    stopped_after.append(all(rt.task and not rt.task.done() for rt in nodes))
                    raise
                lost.append(True)  # as wait_for on 3.11: the cancel swallowed, the task goes on

    fleet = simulated_fleet(demo_nodes(1, 1), interval=0.2)
    app = make_app(fleet, simulated=True, state_dir=tmp_path / "state")
    app.background.append(story)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: bool(tasks), "the story started")
        await pilot.press("q")
    assert lost == [True]
    done, _ = await asyncio.wait(tasks, timeout=5)  # the old code left it running
    assert done, "the story still runs after the screen quit"
    assert stopped_after == [True]  # ended before the fleet stopped, not by a later cancel


async def test_the_demo_shows_a_gpu_allocated_but_idle(tmp_path: Path) -> None:
    """Jobs first in the demo (issue 43): bob's Slurm job holds a GPU's memory and computes
    nothing; after the demo's idle time its row says IDLE in job 48377 (bob) and the header
    counts it. The demo had no Slurm job: nothing showed what ``alloc-idle`` is for."""
    fleet = simulated_fleet(demo_nodes(4, 4), interval=0.2, idle_after=1.0)
    app = make_app(fleet, simulated=True, state_dir=tmp_path / "state")
    app.background.append(lambda: story(fleet, stall_every=3600, burns=app.stress_flow.own_burns))
    async with app.run_test(size=(160, 40)) as pilot:
        snaps = app.store.snaps
        # sim-02's free GPUs are the burn's (0) and the XID's (3): the next free one is held
        await until(
            pilot,
            lambda: (
                (snaps["sim-03"].annotations.get(0) or {}).get("slurm_job") == HOLD_JOB
                and [p.user for p in snaps["sim-03"].gpus[0].processes] == [HOLD_USER]
            ),
            "the held GPU's job and its process",
            timeout=30,
        )
        await until(pilot, lambda: fleet.idle.idle_for("sim-03", 0), "the GPU idle in its job")
        await until(pilot, lambda: "1 alloc-idle" in drawn(app), "the header's count")
        nodes = app.overview.nodes
        y = next(i for i, ln in enumerate(nodes.lines) if (ln.node, ln.gpu) == ("sim-03", 0))
        nodes.scroll_to(y=y, animate=False, immediate=True)
        await pilot.pause()
        row = "".join(s.text for s in nodes.render_line(y - int(nodes.scroll_offset.y)))
        assert "IDLE" in row and HOLD_USER in row, row
        assert [g for n, g in control.burning(fleet)] == [0]  # the burn is elsewhere: sim-02
        held = snaps["sim-03"].gpus[0]
        assert held.util_gpu is not None and held.util_gpu <= fleet.idle.below
        # its memory is the job's: the GPU's used memory holds the process's
        assert held.mem_used is not None and held.mem_used >= held.processes[0].mem
