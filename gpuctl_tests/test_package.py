"""The top-level package: the jobs API is reachable as ``gpuctl.remote`` and friends."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpuctl_tests.helpers import node_env


def test_jobs_api_at_top_level() -> None:
    import gpuctl.jobs

    assert gpuctl.remote is gpuctl.jobs.remote
    assert gpuctl.Executor is gpuctl.jobs.Executor
    assert gpuctl.JobFailed is gpuctl.jobs.JobFailed
    with pytest.raises(AttributeError):
        _ = gpuctl.nonexistent  # type: ignore[attr-defined]


def test_plain_import_stays_light() -> None:
    probe = "import sys, gpuctl; print('gpuctl.jobs' in sys.modules, 'asyncssh' in sys.modules)"
    r = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        env=node_env(),
        timeout=60,
        check=True,
    )
    assert r.stdout.split() == ["False", "False"]


def test_the_connection_layer_does_not_hide_the_jobs_decorator() -> None:
    """The connection layer is ``gpuctl.reach``: a package named ``gpuctl/remote/`` (its first
    name) made the import system replace the ``gpuctl.remote`` decorator with the package."""
    probe = (
        "import gpuctl, gpuctl.reach.pool, gpuctl.jobs\n"
        "from gpuctl import remote\n"
        "from gpuctl.reach.options import resolve\n"
        "assert gpuctl.remote is gpuctl.jobs.remote is remote, gpuctl.remote\n"
        "print(callable(gpuctl.remote))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=node_env(), timeout=60
    )
    assert r.stdout.strip() == "True", r.stderr
