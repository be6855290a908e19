"""The local backend's file and process errors are the typed, one-line ``HostError`` an SSH node
gives for the same failure, never a raw OSError out of the API."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from gpuctl.jobs import HostError, JobFailed, JobStore


def test_a_read_only_job_root_is_one_host_error(
    make_executor: Any, read_only_fs: Path, tmp_path: Path
) -> None:
    store = JobStore(tmp_path / "jobs.sqlite")
    ex = make_executor(job_root=str(read_only_fs / "jobs"), store=store)
    with pytest.raises(HostError) as info:
        ex.submit(abs, -1)
    (line,) = str(info.value).splitlines()
    assert line.startswith(f"local: creating {read_only_fs / 'jobs'} failed: Read-only file system")
    assert "job_root=" in line
    assert store.list() == []  # no row left for a job that never got its folder


def test_a_disk_full_while_writing_the_payload_is_one_host_error(
    make_executor: Any, small_fs: Path
) -> None:
    ex = make_executor(job_root=str(small_fs / "jobs"))
    with pytest.raises(HostError) as info:
        ex.submit(len, os.urandom(8 << 20))  # 8 MiB argument, 4 MiB file system
    (line,) = str(info.value).splitlines()
    assert line.startswith("local: writing ") and "payload.pkl failed: No space left" in line
    assert "free space there" in line
    leftovers = [p.name for d in (small_fs / "jobs").iterdir() for p in d.iterdir()]
    assert not any(n.startswith("payload.pkl") for n in leftovers), leftovers


def test_a_missing_venv1_is_the_ssh_backends_error(make_executor: Any, tmp_path: Path) -> None:
    missing = str(tmp_path / "no" / "python3")
    ex = make_executor(supervisor_python=missing)
    with pytest.raises(HostError) as info:
        ex.submit(abs, -1)
    assert str(info.value) == (
        f"local: no python at {missing!r} for the job supervisor: set python = "
        '"/path/to/python3" for this node in the gpuctl config (or --supervisor-python)'
    )


def test_reading_a_job_file_that_cannot_be_read_is_one_host_error(
    make_executor: Any, tmp_path: Path
) -> None:
    """A job file that is a folder (EISDIR, which stops root as well as anyone) gives the one
    line a node would, for the logs, the result's copy and the result itself."""
    job = make_executor().submit(abs, -7)
    assert job.result(60) == 7
    folder = Path(job.jobdir)
    for name in ("stdout.txt", "result.pkl"):
        (folder / name).unlink()
        (folder / name).mkdir()
    with pytest.raises(HostError) as info:
        job.stdout()
    (line,) = str(info.value).splitlines()
    assert line == f"local: reading {folder / 'stdout.txt'} failed: Is a directory"
    with pytest.raises(HostError) as info:
        job.copy_result(str(tmp_path / "out.pkl"))
    (line,) = str(info.value).splitlines()
    assert line.startswith(f"local: copying {folder / 'result.pkl'} to ")
    assert line.endswith("failed: Is a directory")
    with pytest.raises(JobFailed) as failed:
        job.result(60)
    assert f"local: reading {folder / 'result.pkl'} failed: Is a directory" in str(failed.value)
    # this machine is not "a node that cannot be reached": the report says what it is
    assert failed.value.kind == "job_files_unreadable"
    assert "cannot be reached" not in str(failed.value)


def test_a_copy_whose_own_destination_fails_mid_write_keeps_its_oserror(
    make_executor: Any,
) -> None:
    """``copy_result`` to the caller's own file: a write that fails there (a full disk:
    /dev/full) is the caller's OSError, as over SSH, not the node's HostError."""
    job = make_executor().submit(bytes, 1 << 16)  # a result larger than a write's buffer
    assert job.result(60) == bytes(1 << 16)
    with pytest.raises(OSError) as info:
        job.copy_result("/dev/full")
    assert not isinstance(info.value, HostError)
    assert info.value.errno == errno.ENOSPC
