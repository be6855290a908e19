"""Node data is data: a hostile node (markup, escapes, control bytes, huge strings and numbers
in its hello, samples, events, errors, suite lines and report) on every screen and pane.

The app must keep running, show the literal text (``[bold]x[/`` as such) and never put an
escape or control character from a node into what it draws.
"""

from __future__ import annotations

import re
from pathlib import Path

from textual.widgets import DataTable, Log

from gpuctl.core.model import NodeState
from gpuctl.tui import GpuctlApp, make_app
from gpuctl.tui.screens.accept_report import AcceptReportScreen
from gpuctl.tui.screens.confirm import ConfirmScreen
from gpuctl.tui.screens.help import HelpScreen
from gpuctl_tests.helpers import open_detail, until
from gpuctl_tests.tui.conftest import NOW
from gpuctl_tests.tui.hostile import SEEN, hostile_fleet, hostile_job_store

SIZE = (120, 36)
# What no drawn cell may hold: C0 controls, DEL, C1 controls (ESC among them).
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def drawn(app: GpuctlApp) -> str:
    """Every character the app would send for the current screen (toasts included), one line
    per terminal row: the compositor's full update, as ``export_screenshot`` renders it."""
    update = app.screen._compositor.render_update(full=True, screen_stack=app._background_screens)
    rows = getattr(update, "strips", [])
    assert rows, "nothing drawn"
    return "\n".join("".join(seg.text for strip in row for seg in strip) for row in rows)


def check(app: GpuctlApp, *, shows: str | None = SEEN) -> str:
    assert app.is_running and app._exception is None, app._exception
    text = drawn(app)
    bad = {hex(ord(c)) for line in text.splitlines() for c in CONTROL.findall(line)}
    assert not bad, f"control characters reached the screen: {sorted(bad)}"
    if shows is not None:
        assert shows in text, f"{shows!r} not shown literally on {type(app.screen).__name__}"
    return text


def messages(app: GpuctlApp) -> list[str]:
    return [str(n.message) for n in app._notifications]


async def test_hostile_node_is_shown_as_data_on_every_screen(tmp_path: Path) -> None:
    app = make_app(
        hostile_fleet(NOW),
        state_dir=tmp_path / "state",
        clock=lambda: NOW,
        job_store=hostile_job_store(tmp_path),
    )
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        snaps = app.store.snaps
        await until(
            pilot,
            lambda: (
                snaps["evil"].last_sample_t == NOW - 0.5
                and snaps["evil"].annotations.get(1)
                and snaps["down"].state is NodeState.UNREACHABLE
                and snaps["nan"].last_sample_t == 1.0
                and app.overview.nodes.lines
                and not app.store.pending
            ),
            "the hostile nodes on screen",
        )
        # a NaN (or a number too long to be one) is "unknown": the rest of the sample shows
        assert [g.temp for g in snaps["nan"].gpus] == [None]
        assert snaps["evil"].gpus[0].util_gpu is None and snaps["evil"].gpus[1].util_gpu == 50
        await pilot.pause()
        # The overview: GPU rows (model, badges, burn), headers (driver, CUDA, reasons), the
        # XID and lost-GPU notifications.
        text = check(app)
        assert any("XID" in m for m in messages(app))
        assert "· refused: [bold]x[/" in text  # the reason last, as text

        await pilot.press("m", "right")  # the heatmap, the cursor on evil's GPU 1
        check(app)
        await pilot.press("left")
        status = check(app)
        assert "evil GPU 0 · XID [bold]x[/" in status  # its XID, as text (the model: too long)
        await pilot.press("escape")

        detail = await open_detail(pilot, "evil", 0)
        procs = detail.query_one("#detail-procs", DataTable)
        await until(pilot, lambda: procs.row_count == 2, "evil's GPU 0's processes")
        await pilot.pause()
        check(app)
        await pilot.press("right")  # GPU 1: its model name is LONG, its state hostile
        await until(pilot, lambda: detail.gpu == 1, "GPU 1")
        await pilot.pause()
        check(app)
        await pilot.press("escape")

        # s on a GPU whose burn the node reports: the agent refuses in markup and escapes.
        app.overview.nodes.select("evil", 0)
        await pilot.press("s")
        await until(pilot, lambda: "stress evil GPU 0: evil:" in drawn(app), "the refusal")
        check(app)
        app.clear_notifications()

        await pilot.press("2")  # jobs: name, target, summary, report, logs
        table = app.overview.query_one("#jobs-table", DataTable)
        await until(pilot, lambda: table.row_count == 1, "the hostile job")
        stdout = app.overview.query_one("#job-stdout", Log)
        await until(pilot, lambda: any("L" * 50 in line for line in stdout.lines), "its stdout")
        await until(pilot, lambda: app.overview.query_one("#job-report-box").display, "report")
        await pilot.pause()
        check(app)

        await pilot.press("1")
        app.overview.nodes.select("evil", 0)
        await pilot.press("a")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question")
        await pilot.press("y")
        run = await until(pilot, lambda: app.accept_flow.run, "the acceptance run")
        await until(pilot, run.done, "the run to end")
        await pilot.pause()
        check(app)  # the matrix (hostile verdicts), the suite's lines, the note
        table = app.overview.query_one("#accept-table", DataTable)
        table.move_cursor(row=table.get_row_index("evil"))
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, AcceptReportScreen), "the report")
        await pilot.pause()
        check(app)
        await pilot.press("escape")

        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), "help")
        check(app, shows=None)  # no node data there, but the toasts above it are drawn
        await pilot.press("escape")
        check(app)
        assert app.is_running


async def test_the_check_sees_what_textual_would_draw(tmp_path: Path) -> None:
    """The screen check above can fail: a ``Text`` holding an escape reaches the drawn cells
    as it is (Rich and Textual strip only BEL, BS, VT, FF and CR), and markup is parsed."""
    from rich.text import Text
    from textual.widgets import Static

    app = make_app(hostile_fleet(NOW), state_dir=tmp_path, clock=lambda: NOW)
    async with app.run_test(size=SIZE) as pilot:
        await app.overview.mount(Static(Text("esc:\x1b[2J:"), id="raw"))
        await pilot.pause()
        assert "esc:\x1b[2J:" in drawn(app)
        app.overview.query_one("#raw", Static).update("[b]bold[/b]")
        await pilot.pause()
        assert "[b]" not in drawn(app) and "bold" in drawn(app)


async def test_notifications_are_never_markup(tmp_path: Path) -> None:
    """Every ``notify`` of the app (and of its widgets) shows its message as plain text."""
    from gpuctl_tests.tui.hostile import H

    app = make_app(hostile_fleet(NOW), state_dir=tmp_path, clock=lambda: NOW)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        app.notify(H)
        app.overview.notify(f"widget: {H}", severity="warning")
        await until(pilot, lambda: "widget:" in drawn(app), "the toasts")
        check(app)
        check(app, shows="widget: [bold]x[/")
