"""Jobs as concurrent.futures and submitit users expect them: a cancelled job is a cancelled
Future, a Job pickles as a handle that works in another process, ``attach`` takes an id or a
prefix, and a map's chunk with a failed item is not plain "done" in ``gpuctl jobs``."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpuctl.cli.main import main
from gpuctl.jobs import JobCancelled, JobNotFound, JobRecord, JobStore, attach
from gpuctl.node import jobfiles
from gpuctl_tests.helpers import node_env, wait_until


def naps(seconds: float, value: int) -> int:
    import time

    print("started", flush=True)
    time.sleep(seconds)
    return value


def test_a_cancelled_job_is_a_cancelled_future(make_executor: Any) -> None:
    ex = make_executor()
    job = ex.submit(naps, 120.0, 1)
    wait_until(lambda: job.stdout() == "started\n", 60, "the job to run")
    watched = asyncio.new_event_loop()
    try:
        wrapped = asyncio.wrap_future(job, loop=watched)
        assert job.cancel()
        done, _ = concurrent.futures.wait([job], timeout=60)
        assert done == {job} and job.cancelled() and job.done()
        assert list(concurrent.futures.as_completed([job], timeout=10)) == [job]
        with pytest.raises(concurrent.futures.CancelledError) as info:
            job.result(0)
        assert isinstance(info.value, JobCancelled) and info.value.kind == "cancelled"
        with pytest.raises(concurrent.futures.CancelledError):
            job.exception(0)
        report = job.report()  # how it was stopped stays available
        assert report is not None and report.kind == "cancelled" and report.job_id == job.id
        with pytest.raises(asyncio.CancelledError):  # what asyncio sees: a cancelled future
            watched.run_until_complete(wrapped)
    finally:
        watched.close()


READER = """
import pickle, sys
job = pickle.loads(open(sys.argv[1], "rb").read())
print(job.id, job.state, job.result(120), job.stdout().strip(), flush=True)
"""


def test_a_job_pickles_as_a_handle_that_works_in_another_process(
    make_executor: Any, tmp_path: Path
) -> None:
    ex = make_executor()
    job = ex.submit(naps, 0.0, 42)
    data = pickle.dumps(job)
    assert len(data) < 2000  # a handle, not the job's files
    (tmp_path / "job.pkl").write_bytes(data)
    env = node_env({"GPUCTL_STATE_DIR": os.environ["GPUCTL_STATE_DIR"]})
    out = subprocess.run(
        [sys.executable, "-c", READER, str(tmp_path / "job.pkl")],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [job.id, "done", "42", "started"]
    again = pickle.loads(data)  # and here, next to the Job it was made from
    assert again is not job and again.result(60) == 42 == job.result(0)


def test_attach_takes_an_id_or_a_unique_prefix(make_executor: Any) -> None:
    ex = make_executor()
    job = ex.submit(naps, 0.0, 7)
    assert attach(job.id).result(60) == 7
    assert attach(job.id[:6], JobStore(), watch=False).result(60) == 7
    store = JobStore()
    for job_id in ("abc1" + "0" * 28, "abc2" + "0" * 28):
        backend = {"kind": "local", "job_root": "/nonexistent", "python": "3"}
        store.add(JobRecord(job_id, "f", "local", backend, f"/x/{job_id}", "done", time.time()))  # type: ignore[arg-type]
    with pytest.raises(JobNotFound) as info:
        attach("abc", store)
    message = str(info.value)
    assert "\n" not in message and "abc10000000" in message and "abc20000000" in message
    assert "ambiguous (2 jobs" in message
    with pytest.raises(JobNotFound, match="no job 'fff'"):
        attach("fff", store)


def fails_on_odd(i: int) -> int:
    if i % 2:
        raise ValueError(f"odd item {i}")
    return i


def test_a_map_chunk_with_failed_items_is_not_plain_done(
    make_executor: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    ex = make_executor()
    jobs = ex.map_jobs(fails_on_odd, [0, 2, 4, 5, 6, 7], chunksize=3)
    first, second = jobs
    assert [x[0] for x in first.result(120)] == ["ok"] * 3
    assert [x[0] for x in second.result(120)] == ["err", "ok", "err"]
    assert main(["jobs"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows[first.id[:12]].split()[1] == "done"
    assert rows[second.id[:12]].split()[1] == "partial"
    # the API says what the CLI says, for this Job and for one attached from the store
    assert (first.state, second.state) == ("done", "partial")
    again = attach(second.id, JobStore())
    assert again.wait(60) and again.state == "partial"
    assert (
        "items_failed: 2 of 3 items failed (5, 7): ValueError: odd item 5" in rows[second.id[:12]]
    )
    assert os.path.exists(f"{second.jobdir}/items_failed.json")
    assert not os.path.exists(f"{first.jobdir}/items_failed.json")
    assert jobfiles.RESULT in os.listdir(second.jobdir)
    assert first.failed_items is None
    assert second.failed_items is not None and second.failed_items["failed"] == ["5", "7"]


def test_a_store_less_job_pickles_too(make_executor: Any) -> None:
    job = make_executor(store=False).submit(naps, 0.0, 3)
    again = pickle.loads(pickle.dumps(job))
    assert again.store is None and again.result(60) == 3
