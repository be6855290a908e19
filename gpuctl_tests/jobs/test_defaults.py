"""The defaults a training job expects, on real jobs (VENV1 3.6, the session VENV2; an sshd node
for the relative path): the node's CPUs without ``cpus=``, where a job that hit its time limit
was waiting, the processes a function left running, where a relative path resolved, a stack
overflow named as one, and Ctrl-C of the process that waits."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuctl.cli.main import main
from gpuctl.config import load_config
from gpuctl.jobs import Executor, JobStore, attach
from gpuctl_tests.harness.sshd import SshCluster
from gpuctl_tests.helpers import wait_until


def _threads() -> str | None:
    return os.environ.get("OMP_NUM_THREADS")


def _fail() -> None:
    raise ValueError("bad batch")


def test_without_cpus_a_job_gets_the_node_s_cpus_and_the_report_says_how_many(
    make_executor: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cpus = len(os.sched_getaffinity(0))
    assert make_executor().submit(_threads).result(120) is None
    assert make_executor(cpus=1).submit(_threads).result(120) == "1"
    with pytest.raises(ValueError, match="bad batch"):
        make_executor().submit(_fail).result(120)
    job = make_executor().submit(_fail)
    job.wait(120)
    report = job.report()
    assert report is not None
    assert f"{cpus} thread(s) (OMP_NUM_THREADS unset: the {cpus} CPUs it may use)" in "\n".join(
        report.evidence
    )
    one = make_executor(cpus=1).submit(_fail)
    one.wait(120)
    assert "1 thread(s) (OMP_NUM_THREADS=1)" in report_text(one)
    # and in `gpuctl jobs --json`, for jobs that succeeded too
    out = subprocess.run(
        [sys.executable, "-m", "gpuctl", "jobs", "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    threads = {j["id"]: j["threads"] for j in json.loads(out.stdout)["jobs"]}
    assert len(threads) == 5
    assert threads[job.id] == cpus and threads[one.id] == 1
    assert sorted(threads.values()) == sorted([cpus, 1, cpus, cpus, 1])


def report_text(job: Any) -> str:
    report = job.report()
    assert report is not None
    return str(report.text())


def _lock_forever() -> None:
    ready = threading.Event()
    lock = threading.Lock()
    lock.acquire()

    def helper() -> None:
        ready.set()
        lock.acquire()  # never released: the deadlock the report must point at

    threading.Thread(target=helper, daemon=True).start()
    ready.wait()
    wait_for_the_lock(lock)


def wait_for_the_lock(lock: threading.Lock) -> None:
    lock.acquire()


def test_a_job_that_hangs_to_its_time_limit_says_where_it_was_waiting(
    make_executor: Any,
) -> None:
    job = make_executor(time_limit=2, grace=2).submit(_lock_forever)
    job.wait(120)
    report = job.report()
    assert report is not None and report.kind == "time_limit"
    text = report.text()
    # the innermost frame of the user's code in the thread the function runs in (its file:
    # this one, or "<dynamic-code>" where cloudpickle does not keep it)
    assert "it was waiting in wait_for_the_lock (" in text
    assert "every thread's stack just before the SIGTERM is the traceback" in text
    # both threads' stacks: the helper's too
    assert report.traceback.count("Thread 0x") + report.traceback.count("thread 0x") >= 2
    assert " in helper" in report.traceback
    assert "deadlock" in report.remedy and "raise time_limit" in report.remedy
    # the stacks are the traceback, not also the stderr lines of the evidence
    assert not any(line.startswith("| Thread 0x") for line in report.evidence)


def _start_uploader() -> int:
    import subprocess
    import sys

    p = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)  # metrics-uploader"],
        start_new_session=True,
    )
    return p.pid


def _start_uploader_and_fail() -> None:
    _start_uploader()
    raise RuntimeError("diverged")


def test_a_process_the_function_left_running_is_named_in_the_record(
    make_executor: Any, tmp_path: Path
) -> None:
    failed = make_executor().submit(_start_uploader_and_fail)
    failed.wait(120)
    assert "left 1 process(es) running when it finished, and gpuctl stopped them" in report_text(
        failed
    )
    job = make_executor().submit(_start_uploader)
    pid = job.result(120)
    assert not _alive(pid)
    rec = JobStore().get(job.id)
    assert rec is not None and rec.state == "done"
    assert rec.summary is not None
    assert "left 1 process(es) running when it finished, and gpuctl stopped them" in rec.summary
    assert f"pid {pid} `" in rec.summary and "metrics-uploader" in rec.summary
    out = subprocess.run(
        [sys.executable, "-m", "gpuctl", "jobs"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    row = next(line for line in out.stdout.splitlines() if line.startswith(job.id[:12]))
    assert "left 1 process(es) running" in row


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _read_relative() -> str:
    with open("data/train.csv") as f:
        return f.read()


@pytest.mark.sshd
def test_a_relative_path_missing_on_an_ssh_node_says_where_the_job_ran(
    ssh_cluster: SshCluster, venv1: str, venv2: str, tmp_path: Path
) -> None:
    ssh_cluster.start_node("gpu1", python=venv1)
    config = load_config(ssh_cluster.write_config(tmp_path / "config.toml"))
    ex = Executor(
        "gpu1",
        config=config,
        python=venv2,
        job_root=str(tmp_path / "remote-jobs"),
        store=JobStore(),
    )
    job = ex.submit(_read_relative)
    job.wait(120)
    report = job.report()
    assert report is not None and report.kind == "user_exception"
    text = report.text()
    jobdir = job.jobdir
    assert (
        f"the job ran on {os.uname().nodename} in {jobdir}: the relative path 'data/train.csv' "
        "resolves there, not where you submitted from"
    ) in text
    assert "use an absolute path that exists on" in report.remedy


def _recurse_in_c() -> None:
    import sys

    sys.setrecursionlimit(10**7)

    def down(n: int) -> list[Any]:
        return list(map(down, [n + 1]))  # through C each time: the C stack fills

    down(0)


@pytest.mark.skipif(
    sys.version_info >= (3, 12), reason="3.12 raises RecursionError before the C stack fills"
)
def test_a_c_stack_overflow_is_named_as_one(make_executor: Any) -> None:
    job = make_executor().submit(_recurse_in_c)
    job.wait(120)
    report = job.report()
    assert report is not None and report.kind == "crash"
    first = report.evidence[0]
    assert "a stack overflow, the same frames repeat: down (" in first
    assert "(deep recursion)" in first
    assert "C extension" not in report.remedy and "iterative" in report.remedy


SCRIPT = """
import sys
from gpuctl.jobs import Executor

def slow():
    import time
    time.sleep(300)

ex = Executor("local", supervisor_python=sys.argv[1], python=sys.argv[2], job_root=sys.argv[3])
job = ex.submit(slow)
print(job.id, flush=True)
job.result()
"""


MAP_SCRIPT = """
import sys
from gpuctl.jobs import Executor

def slow(i):
    import time
    time.sleep(300)

ex = Executor("local", supervisor_python=sys.argv[1], python=sys.argv[2], job_root=sys.argv[3])
for value in ex.map(slow, range(3), chunksize=1, max_running=2):
    print(value)
"""


@pytest.fixture
def left_jobs() -> Iterator[None]:
    """After the test, whatever happened in it: every job of the store that has not ended is
    cancelled and waited for (a Ctrl-C test leaves jobs running on purpose)."""
    yield
    store = JobStore()
    for rec in store.list():
        if rec.state not in ("done", "failed", "cancelled"):
            job = attach(rec, store)
            job.cancel()
            job.wait(60)


def _interrupt_a_script(
    venv1: str,
    venv2: str,
    job_root: str,
    tmp_path: Path,
    env: dict[str, str],
    script_text: str = SCRIPT,
    running: int = 1,
) -> tuple[str, subprocess.CompletedProcess[str]]:
    """Run ``script_text`` (SCRIPT: submit, then wait in result()), send it SIGINT once
    ``running`` jobs run: (the id of the job it printed, if any, and how the script ended)."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(script_text))
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, str(script), venv1, venv2, job_root],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root), **env},
    )
    try:
        assert proc.stdout is not None
        job_id = proc.stdout.readline().strip() if script_text == SCRIPT else ""

        def runs() -> int:
            found = Path(job_root).glob("*/status.jsonl")
            return sum('"running"' in status.read_text() for status in found)

        wait_until(lambda: runs() >= running, 60, "the jobs to run")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    # without the line on the variables the job will not see (this machine's: test_job_env)
    err = "".join(x for x in err.splitlines(keepends=True) if "will not see" not in x)
    return job_id, subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_ctrl_c_of_a_script_in_result_says_the_job_keeps_running_without_gpuctl_s_frames(
    venv1: str, venv2: str, job_root: str, tmp_path: Path, left_jobs: None
) -> None:
    job_id, done = _interrupt_a_script(venv1, venv2, job_root, tmp_path, {})
    short = job_id[:12]
    # a KeyboardInterrupt: Python ends the script by SIGINT, 130 in a shell
    assert done.returncode == -signal.SIGINT, done.stderr
    err = done.stderr
    line = f"gpuctl: job {short} keeps running on local: `gpuctl cancel {short}` stops it"
    assert err.startswith(line), err
    assert "Traceback (most recent call last)" in err and "train.py" in err
    assert "job.result()" in err
    frames = [x for x in err.splitlines() if x.strip().startswith("File ")]
    assert frames and all("train.py" in x for x in frames), err
    assert "wait_hint" not in err and "_REAPER" not in err
    rec = JobStore().get(job_id)
    assert rec is not None
    assert not attach(rec, JobStore()).done()  # it runs on (the fixture cancels it)


def test_cancel_on_interrupt_from_the_config_cancels_the_job_on_ctrl_c(
    venv1: str, venv2: str, job_root: str, tmp_path: Path, left_jobs: None
) -> None:
    conf = tmp_path / "config.toml"
    conf.write_text("[jobs]\ncancel_on_interrupt = true\n")
    job_id, done = _interrupt_a_script(
        venv1, venv2, job_root, tmp_path, {"GPUCTL_CONFIG": str(conf)}
    )
    assert done.returncode == -signal.SIGINT, done.stderr
    short = job_id[:12]
    assert done.stderr.startswith(
        f"gpuctl: job {short} on local is cancelled (cancel_on_interrupt)"
    ), done.stderr
    rec = JobStore().get(job_id)
    assert rec is not None
    job = attach(rec, JobStore())
    assert job.wait(60)
    report = job.report()
    assert report is not None and report.kind == "cancelled"
    assert Executor("local", cancel_on_interrupt=False).cancel_on_interrupt is False


def test_ctrl_c_in_a_map_says_what_becomes_of_its_other_jobs(
    venv1: str, venv2: str, job_root: str, tmp_path: Path, left_jobs: None
) -> None:
    _, done = _interrupt_a_script(venv1, venv2, job_root, tmp_path, {}, MAP_SCRIPT, running=2)
    assert done.returncode == -signal.SIGINT, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0].startswith("gpuctl: job ") and "keeps running on local" in lines[0]
    waited = lines[0].split()[2]
    told = re.fullmatch(
        r"gpuctl: 1 more job\(s\) of this map keep running on local: `gpuctl cancel (.+)` stops "
        r"them all; 1 waiting for their turn never start once this process exits",
        lines[1],
    )
    assert told, lines[1]
    ids = told.group(1).split()
    assert len(ids) == 2 and ids[0] == waited  # the one waited for, and the other running
    assert not any("/gpuctl/jobs/" in line for line in lines)
    states = sorted(r.state for r in JobStore().list())
    assert states[0] == "failed"  # the one that never started (the atexit of the script)
    # the command given stops every job of the map that runs
    assert main(["cancel", *ids]) == 0
    for short in ids:
        job = attach(short, JobStore())
        assert job.wait(60)
        report = job.report()
        assert report is not None and report.kind == "cancelled"
