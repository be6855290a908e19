"""The jobs API in read-only mode: ``submit``, ``map`` and ``Job.cancel`` refuse as the CLI does,
before anything is provisioned, written or signalled; real supervisor (Python 3.6) and VENV2."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from gpuctl import readonly, service
from gpuctl.config import ConfigError, load_config
from gpuctl.jobs import Executor, JobStore, remote


def nap(seconds: float) -> str:
    """The job: it runs until it is cancelled (its work is to take time, not to wait for us)."""
    import time

    time.sleep(seconds)
    return "slept"


def double(x: int) -> int:
    return 2 * x


def _nothing_written(job_root: str, store: JobStore) -> None:
    assert not os.path.exists(job_root) or os.listdir(job_root) == []
    assert store.list(10) == []


@pytest.mark.parametrize("how", ["env", "config", "config object", "argument"])
def test_submit_and_map_refuse_in_read_only_mode(
    how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, job_root: str
) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text("read_only = true\n" if how.startswith("config") else "")
    monkeypatch.setenv("GPUCTL_CONFIG", str(cfg))
    if how == "env":
        monkeypatch.setenv(readonly.READ_ONLY_ENV, "1")
    options: dict[str, Any] = {}
    if how == "config object":
        options["config"] = load_config(str(cfg))
        monkeypatch.setenv("GPUCTL_CONFIG", str(tmp_path / "missing.toml"))  # never read
    if how == "argument":
        options["read_only"] = True
    store = JobStore()
    ex = Executor("local", job_root=job_root, store=store, **options)
    with pytest.raises(service.ReadOnlyError) as e:
        ex.submit(double, 21)
    line = str(e.value)
    assert line.startswith("read-only mode: submitting jobs is disabled (")
    assert "\n" not in line
    if how == "env":
        assert line.endswith("(GPUCTL_READ_ONLY is set: unset it)")
    elif how.startswith("config"):
        assert f"({cfg} sets read_only = true: set it to false there)" in line
    with pytest.raises(service.ReadOnlyError):
        ex.map_jobs(double, [1, 2])
    with pytest.raises(service.ReadOnlyError):
        ex.map(double, [1, 2])
    with pytest.raises(service.ReadOnlyError):
        remote(target="local", job_root=job_root, store=store, **options)(double)(2)
    _nothing_written(job_root, store)


def test_a_config_that_cannot_be_read_refuses_rather_than_guess(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, job_root: str
) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text("read_only = true\nread_only = false\n")
    monkeypatch.setenv("GPUCTL_CONFIG", str(cfg))
    store = JobStore()
    with pytest.raises(ConfigError, match=r"config\.toml"):
        Executor("local", job_root=job_root, store=store).submit(double, 1)
    _nothing_written(job_root, store)


@pytest.mark.slow
def test_cancel_refuses_in_read_only_mode_and_the_job_runs_on(
    make_executor: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(readonly.READ_ONLY_ENV, "1")  # the session (gpuctl.context) is read-only
    ex = make_executor(read_only=False)  # this executor's caller decided otherwise
    job = ex.submit(nap, 120)
    with pytest.raises(service.ReadOnlyError) as e:
        job.cancel()
    assert str(e.value) == (
        "read-only mode: cancelling jobs is disabled (GPUCTL_READ_ONLY is set: unset it)"
    )
    assert not job.done() and job.state in ("submitted", "running")
    # the caller that decided (the CLI, the TUI) passes its decision: nothing is read again
    assert job.cancel(read_only=False) is True
    job.wait(60)
    assert job.state == "cancelled", job.state


def test_the_executors_own_decision_is_not_read_again(
    make_executor: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``read_only=False`` is the caller's decision (the CLI checked before the command ran):
    the environment and the config are not read again at submit."""
    monkeypatch.setenv(readonly.READ_ONLY_ENV, "1")
    ex = make_executor(read_only=False)
    assert ex.submit(double, 21).result(60) == 42
