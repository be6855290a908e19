"""``Executor("debug")``: the function runs in this process (breakpoints work), the job it returns
answers like a real one, and what could not travel to a node is refused as ``submit`` refuses it."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from gpuctl.cli.main import main
from gpuctl.jobs import Executor, JobFailed, JobStore

HITS: list[Any] = []


def record_breakpoint(*args: Any, **kwargs: Any) -> None:
    """A ``sys.breakpointhook`` (via PYTHONBREAKPOINT) that notes the frame it was called from."""
    HITS.append(sys._getframe(1).f_code.co_name)


def stops_at_a_breakpoint(x: int) -> tuple[int, int]:
    breakpoint()
    return os.getpid(), x * 2


def returns_its_argument(obj: Any) -> Any:
    return obj


def fails(message: str) -> None:
    raise ValueError(message)


def exits(code: int) -> None:
    sys.exit(code)


def returns_a_lock() -> Any:
    return threading.Lock()


def test_debug_runs_the_function_here_and_breakpoints_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYTHONBREAKPOINT", f"{__name__}.record_breakpoint")
    HITS.clear()
    job = Executor("debug", mem="1G", time_limit=5).submit(stops_at_a_breakpoint, 21)
    assert job.done() and job.state == "done" and job.report() is None
    assert job.result() == (os.getpid(), 42)
    assert HITS == ["stops_at_a_breakpoint"]
    arg = {"the": "same object"}
    assert Executor("debug").submit(returns_its_argument, arg).result() is arg  # not a copy
    assert job.exception() is None and not job.cancel() and job.logs() == {}
    assert JobStore().list(10) == []  # nothing of a debug job is kept


def test_debug_exception_is_the_runners_user_exception() -> None:
    job = Executor("debug").submit(fails, "bad input")
    assert job.done() and job.state == "failed"
    report = job.report()
    assert report is not None and report.kind == "user_exception"
    assert report.evidence[0] == "ValueError: bad input"
    assert "in fails" in report.traceback
    with pytest.raises(ValueError, match="bad input") as info:
        job.result()
    tb = info.value.__traceback__  # this process's own traceback: pdb.post_mortem walks it
    names = []
    while tb is not None:
        names.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    assert names[-1] == "fails"
    assert isinstance(job.exception(), ValueError)

    with pytest.raises(JobFailed) as failed:
        Executor("debug").submit(exits, 4).result()
    assert failed.value.kind == "sys_exit" and "sys.exit(4)" in failed.value.report.evidence[0]

    with pytest.raises(JobFailed) as failed:
        Executor("debug").submit(returns_a_lock).result()
    assert failed.value.kind == "unpicklable_result"


def test_debug_refuses_what_could_not_travel_as_submit_does(
    make_executor: Any, job_root: str
) -> None:
    seen: list[Any] = []
    lock = threading.Lock()
    with pytest.raises(TypeError) as here:
        Executor("debug").submit(seen.append, lock)
    assert seen == []  # refused before the call
    with pytest.raises(TypeError) as there:
        make_executor().submit(seen.append, lock)
    assert str(here.value) == str(there.value)
    assert str(here.value).startswith(
        "the call of list.append cannot be pickled: argument 0 is a lock (_thread.lock)"
    )


def test_debug_map_and_command(capfd: pytest.CaptureFixture[str]) -> None:
    ex = Executor("debug")
    assert list(ex.map(abs, [-1, -2, 3])) == [1, 2, 3]
    assert ex.submit_command([sys.executable, "-c", "print('from the command')"]).result() == 0
    assert capfd.readouterr().out == "from the command\n"  # this process's own stdout
    job = ex.submit_command(["sh", "-c", "exit 5"])
    report = job.report()
    assert report is not None and (report.kind, report.exit_status) == ("command_failed", 5)


def test_cli_submit_debug_prints_the_result_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    user = tmp_path / "user_fn.py"
    user.write_text("import os\n\ndef pid():\n    return os.getpid()\n")
    rc = main(["submit", "--target", "debug", f"{user}:pid"])
    out = capsys.readouterr()
    assert (rc, out.out) == (0, f"{os.getpid()}\n")
    rc = main(["submit", "--target", "debug", "--", "sh", "-c", "exit 6"])
    out = capsys.readouterr()
    assert rc == 6 and out.err.strip().endswith("exited with code 6")
