"""Failures that need the machine's help to provoke: a cgroup OOM kill, a full disk, Slurm's
warning signal. Each skips (with the reason) where the container forbids cgroups or mounts."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuctl.jobs import JobFailed
from gpuctl_tests.helpers import wait_until

CGROUP_V1_MEMORY = Path("/sys/fs/cgroup/memory")


@pytest.fixture
def memory_cgroup() -> Iterator[Path]:
    """A cgroup v1 memory cgroup limited to 200 MiB, without swap; removed after the test."""
    parent = CGROUP_V1_MEMORY
    if not (parent / "memory.limit_in_bytes").exists():
        pytest.skip("no cgroup v1 memory controller here")
    path = parent / f"gpuctl-test-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir()
    except OSError as e:
        pytest.skip(f"cannot create a memory cgroup: {e}")
    try:
        (path / "memory.limit_in_bytes").write_text(str(200 << 20))
        with contextlib.suppress(OSError):
            (path / "memory.memsw.limit_in_bytes").write_text(str(200 << 20))
        yield path
    finally:
        wait_until(
            lambda: not (path / "cgroup.procs").read_text().strip(), 10, "the cgroup to empty"
        )
        path.rmdir()


def test_cgroup_oom_kill_is_out_of_memory(
    make_executor: Any, memory_cgroup: Path, venv1: str, tmp_path: Path
) -> None:
    # VENV1 joins the cgroup first (as a cluster's job would be placed in one), then execs.
    wrapper = tmp_path / "venv1-in-cgroup"
    wrapper.write_text(f'#!/bin/sh\necho $$ > {memory_cgroup}/cgroup.procs\nexec {venv1} "$@"\n')
    wrapper.chmod(0o755)

    def hog() -> int:
        blocks = []
        for _ in range(64):
            b = bytearray(16 << 20)
            b[::4096] = b"x" * len(b[::4096])  # touch every page: RSS, not just address space
            blocks.append(b)
        return len(blocks)

    job = make_executor(supervisor_python=str(wrapper)).submit(hog)
    with pytest.raises(JobFailed) as info:
        job.result(60)
    text = str(info.value)
    assert info.value.kind == "out_of_memory", text
    assert "SIGKILL" in text and "cgroup OOM kills during the job: 1" in text
    outcome = json.loads(Path(job.jobdir, "outcome.json").read_text())
    assert outcome["cgroup_after"]["limit_bytes"] == 200 << 20
    assert outcome["cgroup_after"]["path"].endswith(memory_cgroup.name)


def test_disk_full_while_saving_the_result(make_executor: Any, small_fs: Path) -> None:
    job = make_executor(job_root=str(small_fs / "jobs")).submit(os.urandom, 8 << 20)
    with pytest.raises(JobFailed) as info:
        job.result(60)
    assert info.value.kind == "disk_full"
    assert info.value.report.phase == "saving"
    assert "No space left on device" in str(info.value)
    assert not any(p.name.startswith("result.pkl") for p in Path(job.jobdir).iterdir())


def test_a_disk_full_before_the_outcome_is_disk_full_not_lost(
    make_executor: Any, small_fs: Path
) -> None:
    """The disk fills while the job runs, by a file outside the job's folders: the space the
    worker held lets error.json and outcome.json be written (they could not, and the job was
    put down to the full disk by a probe of its free space), and the file is named."""

    def fills_the_disk(folder: str) -> int:
        import errno
        import os

        with open(os.path.join(folder, "filler"), "wb") as f:
            try:
                while True:
                    f.write(b"\0" * (64 << 10))
                    f.flush()
            except OSError as e:  # no `assert` here: pytest rewrites it into its own helpers
                if e.errno != errno.ENOSPC:
                    raise
        return 7

    job = make_executor(job_root=str(small_fs / "jobs")).submit(fills_the_disk, str(small_fs))
    with pytest.raises(JobFailed) as info:
        job.result(60)
    assert info.value.kind == "disk_full", str(info.value)
    assert f"the file that grew: {small_fs.resolve() / 'filler'} (" in str(info.value)


def test_a_function_that_fills_the_disk_is_named_with_its_file(
    make_executor: Any, small_fs: Path
) -> None:
    """The function's own file fills the job folder's file system: the report names the file
    and its size, the mount point and its free space, the OSError (errno 28) and its line."""

    def writes_a_big_file() -> int:
        with open("big.bin", "wb") as f:  # its working folder (cwd=)
            for _ in range(1000):
                f.write(b"\1" * (64 << 10))
        return 7

    work = small_fs / "work"
    work.mkdir()
    job = make_executor(job_root=str(small_fs / "jobs"), cwd=str(work)).submit(writes_a_big_file)
    with pytest.raises(JobFailed) as info:
        job.result(60)
    text = str(info.value)
    assert info.value.kind == "disk_full", text
    assert info.value.report.phase == "running", text
    assert f"the file that grew: {work.resolve() / 'big.bin'} (" in text, text
    assert f"mounted at {small_fs.resolve()}) had " in text and " free of 4.0 MiB" in text, text
    assert "OSError: [Errno 28] No space left on device" in text, text
    assert 'in writes_a_big_file: f.write(b"\\1" * (64 << 10))' in text, text
    assert not (Path(job.jobdir) / "reserve.bin").exists()


def test_a_full_disk_elsewhere_is_not_put_on_the_job_folders_files(
    make_executor: Any, small_fs: Path, tmp_path: Path
) -> None:
    """The function fills another file system than its job folder's, by a write that names
    no file: the report does not name a file of the job folder as the one that grew."""

    def fills(path: str) -> int:
        with open(path, "wb") as f:
            for _ in range(1000):
                f.write(b"\1" * (64 << 10))
                f.flush()
        return 7

    job = make_executor(job_root=str(tmp_path / "jobs")).submit(fills, str(small_fs / "big"))
    with pytest.raises(JobFailed) as info:
        job.result(60)
    text = str(info.value)
    assert info.value.kind == "disk_full", text
    assert "the one that filled is another, and the OSError names no file" in text, text
    assert "the file that grew" not in text, text
    assert "in fills: f.write(" in text or "in fills: f.flush()" in text, text


def test_prints_that_fill_the_disk_name_stdout(make_executor: Any, small_fs: Path) -> None:
    def prints_a_lot() -> int:
        line = "x" * 1023
        for _ in range(100000):
            print(line)
        return 7

    job = make_executor(job_root=str(small_fs / "jobs")).submit(prints_a_lot)
    with pytest.raises(JobFailed) as info:
        job.result(60)
    text = str(info.value)
    assert info.value.kind == "disk_full", text
    assert f"the file that grew: {Path(job.jobdir).resolve() / 'stdout.txt'} (" in text, text
    assert "in prints_a_lot: print(line)" in text, text


def test_warning_signal_and_stack_dumps_reach_venv2_and_spare_the_functions_children(
    make_executor: Any, tmp_path: Path
) -> None:
    pid_file = tmp_path / "child.pid"

    def waits(pid_file: str) -> None:
        import subprocess
        import time

        child = subprocess.Popen(["sleep", "120"])  # a data loader, a server: not the job's Python
        with open(pid_file, "w") as f:
            f.write(str(child.pid))
        time.sleep(120)

    job = make_executor(grace=1).submit(waits, str(pid_file))
    status = Path(job.jobdir, "status.jsonl")
    wait_until(lambda: pid_file.exists() and pid_file.read_text(), 30, "the function's child")
    child = int(pid_file.read_text())
    job.backend.signal(job.handle, job.jobdir, signal.SIGUSR1)  # what Slurm's --signal sends
    # (bounds, not synchronisation; on a timeout the job's processes and files are shown)
    seen = functools.partial(_job_state, job.jobdir)
    noted = '"signal": "SIGUSR1"'
    wait_until(lambda: noted in status.read_text(), 30, "VENV2 to note it", now=seen)
    job.dump_stacks()  # SIGUSR2: faulthandler writes every thread's stack to stderr
    stderr = Path(job.jobdir, "stderr.txt")
    wait_until(lambda: " in waits" in stderr.read_text(), 30, "the stack dump", now=seen)
    assert Path(f"/proc/{child}").exists()  # the function's own child lives on
    assert Path(f"/proc/{child}/stat").read_text().split()[2] != "Z"
    job.cancel()
    with pytest.raises(JobFailed) as info:
        job.result(30)
    # the note is not a phase: the job was cancelled while running
    assert (info.value.kind, info.value.report.phase) == ("cancelled", "running")
    outcome = json.loads(Path(job.jobdir, "outcome.json").read_text())
    assert outcome["forwarded"] == ["SIGUSR1", "SIGUSR2"]


def _job_state(jobdir: str) -> str:
    """What a job's supervisor and VENV2 are doing (their /proc state and signal masks) and the
    tail of its status and logs: what a test that timed out on a job's signal shows."""
    out = []
    pids = {"supervisor": json.loads(Path(jobdir, "supervisor.json").read_text())["pid"]}
    with contextlib.suppress(OSError, ValueError):
        pids["venv2"] = json.loads(Path(jobdir, "heartbeat.json").read_text())["venv2_pid"]
    for name, pid in pids.items():
        try:
            lines = Path(f"/proc/{pid}/status").read_text().splitlines()
            wchan = Path(f"/proc/{pid}/wchan").read_text()
        except OSError:
            out.append(f"{name} {pid}: gone")
            continue
        keep = ("State", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")
        out.append(
            f"{name} {pid} wchan={wchan} "
            + " ".join(line.replace(":\t", "=") for line in lines if line.startswith(keep))
        )
    for file in ("status.jsonl", "stderr.txt", "supervisor.log", "outcome.json"):
        with contextlib.suppress(OSError):
            out.append(f"{file}: {Path(jobdir, file).read_text()[-600:]}")
    return "\n".join(out)
