"""What a job's end leaves to know (issue #40.10): the sidecar gpuctl stopped and the files left
in /dev/shm, through the Python API as ``gpuctl jobs`` shows them; the WHY column one line
whatever the command; a CPU build of torch named as such."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from gpuctl.cli.main import main
from gpuctl_tests.helpers import need_torch

SHM = "/dev/shm"


@pytest.fixture
def shm_name() -> Iterator[str]:
    if not os.access(SHM, os.W_OK):
        pytest.skip(f"{SHM} cannot be written here")
    name = f"gpuctl-test-{uuid.uuid4().hex}"
    yield name
    if os.path.exists(f"{SHM}/{name}"):
        os.unlink(f"{SHM}/{name}")


def leave_things(shm_name: str, fail: bool) -> int:
    """Write 1 MiB into /dev/shm and start a sidecar (a command line with a newline in it)."""
    import subprocess
    import sys

    with open(f"/dev/shm/{shm_name}", "wb") as f:
        f.write(b"x" * (1 << 20))
    subprocess.Popen([sys.executable, "-c", "import time\ntime.sleep(300)"])
    if fail:
        raise ValueError("failed after leaving things")
    return 42


def test_the_end_notes_are_the_api_s_as_the_cli_s(
    make_executor: Any, shm_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    job = make_executor().submit(leave_things, shm_name, False)
    assert job.result(120) == 42
    sidecar, shm = job.notes
    assert "left 1 process(es) running" in sidecar and "time.sleep(300)" in sidecar
    assert f"{SHM}/{shm_name} (1.0 MiB)" in shm and "still there" in shm
    # a command with a line break in it (its name, its report's first line)
    command = make_executor().submit_command(["sh", "-c", "echo one\nexit 3"])
    assert command.wait(120) and command.state == "failed"
    assert main(["jobs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    # one line per job: the command's newline does not break its row
    assert len(lines) == 3, lines
    rows = {line[:12]: line for line in lines[1:]}
    assert "the function left 1 process(es)" in rows[job.id[:12]]
    assert "command_failed" in rows[command.id[:12]] and "exit 3" in rows[command.id[:12]]
    os.unlink(f"{SHM}/{shm_name}")
    failed = make_executor().submit(leave_things, shm_name, True)
    with pytest.raises(ValueError, match="failed after leaving things"):
        failed.result(120)
    report = failed.report()
    assert report is not None and f"{SHM}/{shm_name} (1.0 MiB)" in report.text()


def use_cuda() -> None:
    import torch

    torch.zeros(1).cuda()


def test_a_cpu_build_of_torch_is_named(make_executor: Any) -> None:
    torch = need_torch()
    if torch.cuda.is_available():
        pytest.skip("this torch has CUDA")
    job = make_executor(python=sys.executable).submit(use_cuda)  # a VENV2 with torch
    with pytest.raises(AssertionError, match="Torch not compiled with CUDA enabled"):
        job.result(120)
    report = job.report()
    assert report is not None and "is a CPU-only build" in report.text()
    assert "download.pytorch.org" in report.remedy
