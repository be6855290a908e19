"""A DataLoader worker killed by a signal: the function's own ``RuntimeError`` is the job's
failure (``user_exception``, raised again by ``result()``), every time. torch's SIGCHLD handler
raises again whenever a child of the job changes state while the dead worker is still known;
the worker's report of the function's exception (the pickled exception, then its traceback
read through ``linecache``) must not be cut by it.

Real torch on CPU, a real worker killed with SIGKILL from inside the function, many jobs side by
side (the handler's exception came in 2 of 7 runs)."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from gpuctl.jobs import JobFailed

RUNS = 10


def kills_a_dataloader_worker(seed: int) -> None:
    import os
    import signal

    from torch.utils.data import DataLoader, Dataset

    class Items(Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return 400

        def __getitem__(self, i: int) -> int:
            return i + seed

    loader = DataLoader(Items(), batch_size=2, num_workers=3)
    batches = iter(loader)
    next(batches)
    os.kill(batches._workers[0].pid, signal.SIGKILL)  # type: ignore[attr-defined]
    try:
        for _ in batches:
            pass
    except (ConnectionError, EOFError) as e:  # the dead worker's end of a queue, now and then
        raise RuntimeError(f"DataLoader worker gone: {type(e).__name__}: {e}") from e


def test_a_killed_dataloader_worker_is_the_functions_runtime_error(make_executor: Any) -> None:
    pytest.importorskip("torch")
    ex = make_executor(python=sys.executable)  # a VENV2 with torch
    jobs = [ex.submit(kills_a_dataloader_worker, k) for k in range(RUNS)]
    for job in jobs:
        with pytest.raises(RuntimeError, match="DataLoader worker") as caught:
            job.result(300)
        assert not isinstance(caught.value, JobFailed), caught.value
        report = job.report()
        assert report is not None and report.kind == "user_exception", report
        assert "kills_a_dataloader_worker" in report.text()
