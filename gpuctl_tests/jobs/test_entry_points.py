"""The supervisor is reachable three ways: the copy in the job folder (what backends run), the
node bundle (``python3 gpuctl-node-<hash>.pyz supervisor JOBDIR``) and ``-m gpuctl.node``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuctl.bundle import write_bundle
from gpuctl_tests.helpers import REPO


def _wrapper(tmp_path: Path, venv1: str, body: str) -> str:
    # Backends run ``VENV1 JOBDIR/supervisor.py JOBDIR``: the wrapper drops the script path.
    # ``VENV1 -c CODE`` (the probe before submitting) goes to the real VENV1.
    path = tmp_path / "venv1"
    path.write_text(f'#!/bin/sh\n[ "$1" = -c ] && exec {venv1} "$@"\njobdir="$2"\n{body}\n')
    path.chmod(0o755)
    return str(path)


def double(x: int) -> int:
    return 2 * x


@pytest.mark.parametrize("how", ["bundle", "module"])
def test_supervisor_entry_points(make_executor: Any, venv1: str, tmp_path: Path, how: str) -> None:
    if how == "bundle":
        bundle = write_bundle(tmp_path / "bundle")
        body = f'exec {venv1} {bundle} supervisor "$jobdir"'
    else:
        body = f'PYTHONPATH={REPO} exec {venv1} -m gpuctl.node supervisor "$jobdir"'
    job = make_executor(supervisor_python=_wrapper(tmp_path, venv1, body)).submit(double, 21)
    assert job.result(60) == 42
    outcome = json.loads(Path(job.jobdir, "outcome.json").read_text())
    assert outcome["supervisor_python"] == "3.6.15"
    # the only command line is paths: no code, no payload
    assert outcome["argv"][1:] == [
        "-X",
        "faulthandler",
        "-u",
        f"{job.jobdir}/worker.py",
        job.jobdir,
    ]


def test_venv2_that_dies_while_starting(make_executor: Any) -> None:
    from gpuctl.jobs import JobFailed

    job = make_executor(job_env={"PYTHONHOME": "/nonexistent"}, verify=False).submit(len, [])
    with pytest.raises(JobFailed) as info:
        job.result(60)
    assert info.value.kind == "venv2_wont_start", str(info.value)
    assert "before the worker started" in str(info.value)
    assert "encodings" in str(info.value)  # Python's own complaint, from stderr.txt
    assert sys.version.split()[0] in str(info.value) or "submitter Python" in str(info.value)


def test_runner_files_do_not_shadow_user_modules(make_executor: Any, tmp_path: Path) -> None:
    lib = tmp_path / "userlib"
    lib.mkdir()
    (lib / "worker.py").write_text('NAME = "the user\'s worker module"\n')

    def which_worker() -> str:
        import worker  # type: ignore[import-not-found]

        return str(worker.NAME)

    job = make_executor(job_env={"PYTHONPATH": str(lib)}).submit(which_worker)
    assert job.result(60) == "the user's worker module"
