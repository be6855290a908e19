"""``gpuctl watch`` / ``gpuctl demo`` wiring: what the config hands to the TUI, a damaged job
store, and a screen that crashes."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuctl import logs
from gpuctl.accept.run import AcceptOptions
from gpuctl.cli.watch import accept_defaults, open_job_store, run_tui
from gpuctl.config import parse_config
from gpuctl.context import Context
from gpuctl.fleet.fixed_links import ReplayLink, recorded_node
from gpuctl.fleet.fleet import Fleet
from gpuctl.tui import GpuctlApp
from gpuctl_tests.tui.hostile import crashing_fleet

JUNK = b"this is not an SQLite file, just bytes on the disk\x00\xff" * 40


def test_accept_table_reaches_the_tui_options() -> None:
    table = parse_config(
        '[accept]\npython = "/opt/torch/bin/python"\nfloor = 0.5\npartition = "gpu"\n'
    ).accept
    got = accept_defaults(table)  # partition is the Slurm run's, not the suite's
    assert got == {"python": "/opt/torch/bin/python", "floor": 0.5}
    opts = AcceptOptions(quick=True, device="cpu", **got)
    assert opts.python == "/opt/torch/bin/python" and "--floor" in opts.suite_args()


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "state"
    folder.mkdir(mode=0o700)
    monkeypatch.setenv("GPUCTL_STATE_DIR", str(folder))
    return folder


def test_a_damaged_job_store_is_a_reason_not_a_crash(state: Path) -> None:
    (state / "jobs.sqlite").write_bytes(JUNK)
    store, why = open_job_store(Context())
    assert store is None and why is not None
    path = state / "jobs.sqlite"
    assert why.startswith(f"the job store {path} is damaged (file is not a database)")
    assert f"mv {path} {path}.bad" in why and "\n" not in why


def test_a_job_store_that_cannot_be_opened_says_so(state: Path) -> None:
    (state / "jobs.sqlite").mkdir()  # a folder where the file should be
    store, why = open_job_store(Context())
    assert store is None and why is not None
    assert why.startswith(f"the job store {state / 'jobs.sqlite'} cannot be opened (")
    assert "cannot be opened" in why and "check its folder" in why


def test_a_good_job_store_opens(state: Path) -> None:
    store, why = open_job_store(Context())
    assert why is None and store is not None and store.list() == []
    with sqlite3.connect(state / "jobs.sqlite") as db:  # a real store, in the state folder
        assert db.execute("SELECT count(*) FROM jobs").fetchone() == (0,)


@pytest.fixture
def log_file(tmp_path: Path) -> Iterator[Path]:
    """gpuctl's log set up as the CLI sets it up, into a file of this test; restored after."""
    logger = logging.getLogger("gpuctl")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    path = tmp_path / "gpuctl.log"
    assert logs.setup(0, path) == path
    yield path
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    handlers, level, propagate = saved
    for handler in handlers:
        logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = propagate


def run_to_crash(app: GpuctlApp) -> int:
    """``run_tui``'s exit code for ``app`` headless, wide enough for the sparklines; a screen
    that fails to crash exits 0 after a minute (the test fails, it does not hang)."""

    async def deadline() -> None:
        await asyncio.sleep(60)  # a bound on the test, not synchronisation
        app.exit(0)

    app.background.append(deadline)
    return run_tui(app, headless=True, size=(120, 36))


def test_a_crashed_screen_exits_non_zero_and_names_its_log(
    tmp_path: Path, log_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    app = GpuctlApp(crashing_fleet(), state_dir=tmp_path / "state")
    assert run_to_crash(app) == 1
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    # One line, the node-made message as text, the log named; no escape reaches the terminal.
    assert last == (
        "gpuctl: the screen crashed: RuntimeError: history is broken [bold]on purpose[/  "
        f"(traceback in {log_file})"
    )
    assert "\x1b" not in err and "Traceback" not in err
    log = log_file.read_text()
    assert "ERROR gpuctl.tui: the screen crashed: RuntimeError" in log
    assert "Traceback (most recent call last)" in log and "def history" not in log
    assert "in history" in log  # the frame that raised


def test_an_error_in_a_flush_ends_the_screen_as_one_in_a_paint(
    tmp_path: Path, log_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A flush runs on the event loop's own timer (``GpuctlApp._schedule_flush``), whose errors
    the loop would only log: one must still end the screen, say one line and log its story."""
    node = recorded_node("flush-01", "2:H100", samples=3, t0=time.time() - 3)
    app = GpuctlApp(Fleet({"flush-01": ReplayLink(node)}), state_dir=tmp_path / "state")

    def broken() -> None:
        raise RuntimeError("the store broke at a flush")

    app.store.take_pending = broken  # type: ignore[assignment,method-assign]
    assert run_to_crash(app) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == (
        "gpuctl: the screen crashed: RuntimeError: the store broke at a flush "
        f"(traceback in {log_file})"
    )
    assert "in broken" in log_file.read_text()  # the frame that raised
