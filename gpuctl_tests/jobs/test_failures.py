"""Every failure class provoked for real; each test asserts the classification and the evidence.

VENV1 is a real Python 3.6, VENV2 a venv gpuctl built; no fakes. "result not found" never appears.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from gpuctl.jobs import EnvSpec, Job, JobFailed, JobStore, RemoteTraceback, attach
from gpuctl_tests.helpers import need_torch, old_python, wait_until
from gpuctl_tests.jobs.conftest import no_process_with_env


class InventoryError(Exception):
    """A user exception class defined in the test module."""

    def __init__(self, item: str, count: int) -> None:
        super().__init__(f"{item}: only {count} left")
        self.item, self.count = item, count


def raises_custom(item: str) -> None:
    def deeper() -> None:
        raise InventoryError(item, 2)

    deeper()


def failure(job: Job, kind: str, timeout: float = 60) -> JobFailed:
    """The JobFailed of ``job``, checked to be of ``kind`` and free of 'not found' guesses."""
    with pytest.raises(JobFailed) as info:
        job.result(timeout)
    text = str(info.value)
    assert info.value.kind == kind, text
    assert "result_raw.pkl" not in text and "may have failed" not in text
    assert f"[{kind}]" in text and "remedy:" in text and "outcome.json" in text
    return info.value


def running(job: Job) -> bool:
    data = Path(job.jobdir, "status.jsonl")
    return data.exists() and '"running"' in data.read_text()


def test_user_exception_keeps_type_attributes_and_remote_traceback(make_executor: Any) -> None:
    job = make_executor().submit(raises_custom, "widgets")
    with pytest.raises(InventoryError) as info:
        job.result(60)
    assert (info.value.item, info.value.count) == ("widgets", 2)
    cause = info.value.__cause__
    assert isinstance(cause, RemoteTraceback)
    assert "in deeper" in cause.tb and "raise InventoryError" in cause.tb
    report = job.report()
    assert report is not None and report.kind == "user_exception"
    assert report.phase == "running"
    assert any("widgets: only 2 left" in e for e in report.evidence)
    assert job.state == "failed"
    assert isinstance(job.exception(), InventoryError)


def test_segfault_is_a_crash_with_the_faulthandler_stack(make_executor: Any) -> None:
    def crash_in_ctypes() -> None:
        import ctypes

        ctypes.string_at(0)

    err = failure(make_executor().submit(crash_in_ctypes), "crash")
    assert "Fatal Python error: Segmentation fault" in err.report.traceback
    assert "crash_in_ctypes" in err.report.traceback
    assert any("SIGSEGV" in e for e in err.report.evidence)


def test_memory_limit_is_out_of_memory(make_executor: Any) -> None:
    def hog() -> int:
        import subprocess
        import sys
        import time

        # a child of the function holds memory too: the limit is the whole session's
        child = subprocess.Popen(
            [sys.executable, "-c", "import time; b = bytearray(150 << 20); time.sleep(60)"]
        )
        blocks = []
        for _ in range(32):  # 2 GiB against a 400 MiB limit, as a training loop grows
            blocks.append(bytearray(64 << 20))
            time.sleep(0.05)
        child.kill()
        return len(blocks)

    err = failure(make_executor(mem="400M").submit(hog), "out_of_memory")
    text = str(err)
    assert "over its limit of 400.0 MiB (mem=): gpuctl's supervisor killed them" in text
    assert err.report.phase == "running"


def test_memory_limit_counts_resident_memory_not_address_space(make_executor: Any) -> None:
    """CUDA maps far more address space than it uses: a limit on address space (RLIMIT_AS)
    breaks it. 8 GiB mapped and untouched under mem=400M is fine."""

    def maps_a_lot() -> int:
        import mmap

        m = mmap.mmap(-1, 8 << 30)  # anonymous, never touched: address space, not memory
        m[0:1] = b"x"
        return len(m)

    assert make_executor(mem="400M").submit(maps_a_lot).result(60) == 8 << 30


@pytest.mark.parametrize("supervisor", ["/bin/false", "2.7.18"])  # a missing one: test_store
def test_a_broken_venv1_is_named_before_submitting(make_executor: Any, supervisor: str) -> None:
    """Not "lost" after the fact: the supervisor's Python is probed with VENV2."""
    python = old_python(supervisor) if supervisor[0].isdigit() else supervisor
    ex = make_executor(supervisor_python=python)
    with pytest.raises(JobFailed) as info:
        ex.submit(abs, -1)
    err = info.value
    assert err.kind == "venv1_wont_start" and err.report.phase == "provision", str(err)
    if supervisor == "2.7.18":
        assert "is Python 2.7.18: the supervisor needs Python 3.6 or newer" in str(err)
    else:
        assert f"VENV1 {python} on local does not run as a Python: exit" in str(err)
    assert "supervisor_python=" in err.report.remedy


def test_python_version_mismatch_refused_before_submitting(make_executor: Any) -> None:
    py39 = old_python("3.9.18")
    with pytest.raises(JobFailed) as info:
        make_executor(python=py39).submit(len, [1])
    assert info.value.kind == "python_mismatch"
    text = str(info.value)
    assert "Python 3.9.18" in text
    want = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert f"env=EnvSpec(python='{want}'" in text


def test_python_version_mismatch_caught_by_the_worker(make_executor: Any) -> None:
    """Unchecked at submit (verify=False): VENV2 3.9 refuses the payload before loading it."""
    py39 = old_python("3.9.18")
    job = make_executor(python=py39, verify=False).submit(len, [1])
    err = failure(job, "python_mismatch")
    assert "VENV2 runs Python 3.9 but the function was pickled by Python" in str(err)
    assert err.report.phase == "start"
    assert not Path(job.jobdir, "result.pkl").exists()


def test_missing_module_is_named(make_executor: Any, tmp_path: Path) -> None:
    """A module installed here but not in VENV2: the report names it. (A module of the user's
    own files travels with the payload instead: test_local_modules.py.)"""
    moddir = tmp_path / "onlyhere" / "site-packages"  # as pip would have put it
    moddir.mkdir(parents=True)
    (moddir / "gpuctl_only_on_login.py").write_text("def answer():\n    return 42\n")
    sys.path.insert(0, str(moddir))
    try:
        import gpuctl_only_on_login as mod  # type: ignore[import-not-found]

        def uses_it() -> int:
            return int(mod.answer())

        err = failure(make_executor().submit(uses_it), "module_missing")
    finally:
        sys.path.remove(str(moddir))
        sys.modules.pop("gpuctl_only_on_login", None)
    assert "'gpuctl_only_on_login'" in str(err)
    assert err.report.phase == "loading"

    def imports_at_runtime() -> None:
        import gpuctl_no_such_package  # type: ignore[import-not-found]  # noqa: F401

    err = failure(make_executor().submit(imports_at_runtime), "module_missing")
    # the module it could not import, not the module of ImportError's class ("builtins")
    assert err.report.evidence[0].startswith("module 'gpuctl_no_such_package' cannot be imported")
    assert "builtins" not in str(err)
    assert err.report.phase == "running"


def test_time_limit_terms_then_kills(make_executor: Any) -> None:
    def ignores_term() -> None:
        import signal as s
        import time as t

        s.signal(s.SIGTERM, s.SIG_IGN)
        t.sleep(120)

    t0 = time.monotonic()
    err = failure(make_executor(time_limit=1.0, grace=0.5).submit(ignores_term), "time_limit")
    assert time.monotonic() - t0 < 20
    assert "time limit 1.0 s" in str(err) and "then SIGKILL" in str(err)


def test_unpicklable_result(make_executor: Any) -> None:
    def returns_a_lock() -> Any:
        import threading

        return threading.Lock()

    err = failure(make_executor().submit(returns_a_lock), "unpicklable_result")
    assert err.report.phase == "saving"
    assert "lock" in str(err).lower()


def test_a_result_this_python_cannot_unpickle_says_so(make_executor: Any, tmp_path: Path) -> None:
    def returns_a_node_only_class(folder: str) -> Any:
        import importlib
        import os
        import sys

        with open(os.path.join(folder, "gpuctl_only_on_node.py"), "w") as f:
            f.write("class Point:\n    def __init__(self, x):\n        self.x = x\n")
        sys.path.insert(0, folder)
        return importlib.import_module("gpuctl_only_on_node").Point(3)  # pickled by reference

    node_side = tmp_path / "node-side"
    node_side.mkdir()
    err = failure(
        make_executor().submit(returns_a_node_only_class, str(node_side)), "result_unloadable"
    )
    assert isinstance(err.__cause__, ModuleNotFoundError)
    assert "gpuctl_only_on_node.Point" in err.report.evidence[0]
    assert "No module named 'gpuctl_only_on_node'" in err.report.evidence[1]
    assert "install 'gpuctl_only_on_node' into this Python" in err.report.remedy


def test_gpu_out_of_memory_is_named_and_its_exception_kept(make_executor: Any) -> None:
    """torch's own OutOfMemoryError (raised by hand: there is no GPU here to exhaust)."""
    torch = need_torch()

    def allocates() -> None:
        import torch

        raise torch.cuda.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 79.11 GiB total capacity)"
        )

    job = make_executor(python=sys.executable).submit(allocates)  # a VENV2 with torch
    with pytest.raises(torch.cuda.OutOfMemoryError):  # the function's own, to catch and retry
        job.result(120)
    report = job.report()
    assert report is not None and report.kind == "gpu_out_of_memory"
    assert "Tried to allocate 20.00 GiB" in report.text() and "smaller batch" in report.remedy


def test_a_keyboard_interrupt_on_the_node_is_the_jobs_failure_not_a_ctrl_c_here(
    make_executor: Any,
) -> None:
    def interrupted() -> None:
        raise KeyboardInterrupt("stopped by the function itself")

    err = failure(make_executor().submit(interrupted), "user_exception")
    assert isinstance(err.__cause__, KeyboardInterrupt)
    assert "KeyboardInterrupt: stopped by the function itself" in str(err)
    assert "not a Ctrl-C of yours" in str(err)


@pytest.mark.parametrize(
    ("how", "expect"),
    [("os", "os._exit(3)"), ("sys", "sys.exit(4)")],
)
def test_function_that_exits_the_process(make_executor: Any, how: str, expect: str) -> None:
    def leaves() -> None:
        if how == "os":
            os._exit(3)
        sys.exit(4)

    err = failure(make_executor().submit(leaves), "sys_exit")
    assert expect in str(err)
    assert err.report.phase == "running"


def test_venv2_python_will_not_start(make_executor: Any, tmp_path: Path) -> None:
    missing = str(tmp_path / "no" / "python")
    with pytest.raises(JobFailed) as info:
        make_executor(python=missing).submit(len, [])
    assert info.value.kind == "venv2_wont_start"
    # unverified: the supervisor meets it and says so
    err = failure(make_executor(python=missing, verify=False).submit(len, []), "venv2_wont_start")
    assert "ENOENT" in str(err) and missing in str(err)


def test_environment_build_failure_is_not_a_job_error(venv1: str, tmp_path: Path) -> None:
    from gpuctl.jobs import Executor

    ex = Executor(
        "local",
        supervisor_python=venv1,
        env=EnvSpec(python="2.5", methods=("venv",)),
        env_root=str(tmp_path / "envs"),
        job_root=str(tmp_path / "jobs"),
        store=False,
    )
    with pytest.raises(JobFailed) as info:
        ex.submit(len, [])
    assert info.value.kind == "env_build_failed"
    assert "no python2.5 on PATH" in str(info.value)
    assert info.value.report.logs["build log"].endswith(".log")
    assert not (tmp_path / "jobs").exists()


def test_cancel_stops_the_job_and_everything_it_started(make_executor: Any) -> None:
    token = f"GPUCTL_JOBTEST_{uuid.uuid4().hex}"

    def spawns_and_sleeps() -> None:
        import subprocess
        import time as t

        subprocess.Popen(["sleep", "300"])  # a grandchild the job leaves behind
        t.sleep(300)

    ex = make_executor(job_env={token: "1"}, grace=2)
    job = ex.submit(spawns_and_sleeps)
    wait_until(lambda: running(job), 30, "the job to run")
    wait_until(lambda: not no_process_with_env(token), 10, "the grandchild to start")
    assert job.state == "running"
    assert job.cancel()
    err = failure(job, "cancelled", 30)
    assert "SIGTERM" in str(err)
    assert job.state == "cancelled"
    wait_until(lambda: no_process_with_env(token), 10, "every process of the job to exit")
    assert not job.cancel()


def test_supervisor_and_keeper_killed_is_lost_and_takes_venv2_along(make_executor: Any) -> None:
    """Both VENV1 processes killed at once (what a node's reboot or a kill of the session looks
    like): nobody is left to write the outcome, and VENV2 dies of its parent-death signal."""
    token = f"GPUCTL_JOBTEST_{uuid.uuid4().hex}"
    job = make_executor(job_env={token: "1"}).submit(time.sleep, 300)
    wait_until(lambda: running(job), 30, "the job to run")
    pgid = json.loads(Path(job.jobdir, "supervisor.json").read_text())["pgid"]
    os.killpg(pgid, signal.SIGKILL)
    err = failure(job, "lost", 30)
    assert "outcome.json was never written" in str(err)
    wait_until(lambda: no_process_with_env(token), 10, "VENV2 to die with its supervisor")


def test_setup_lines_run_first_and_their_failure_is_named(make_executor: Any) -> None:
    def read_env() -> str:
        return os.environ["GPUCTL_FROM_SETUP"]

    ex = make_executor(setup=["echo setup-says-hi", "export GPUCTL_FROM_SETUP=from-setup"])
    job = ex.submit(read_env)
    assert job.result(60) == "from-setup"
    assert "setup-says-hi" in Path(job.jobdir, "setup.log").read_text()

    bad = make_executor(setup=["module load cuda/12.1"]).submit(read_env)
    err = failure(bad, "setup_failed")
    assert "module load cuda/12.1" in str(err)
    assert "module: command not found" in str(err) or "not found" in str(err)
    assert not Path(bad.jobdir, "status.jsonl").exists()


def test_stack_dump_on_request(make_executor: Any) -> None:
    def stuck_somewhere_deep() -> None:
        import time as t

        t.sleep(120)

    job = make_executor(grace=1).submit(stuck_somewhere_deep)
    wait_until(lambda: running(job), 30, "the job to run")
    job.dump_stacks()
    wait_until(lambda: "stuck_somewhere_deep" in job.stderr(), 10, "a stack dump in stderr")
    job.cancel()
    failure(job, "cancelled", 30)


def test_store_reattaches_after_restart(make_executor: Any, _state_dir: Path) -> None:
    job = make_executor().submit(pow, 2, 10)
    assert job.result(60) == 1024
    failed = make_executor().submit(raises_custom, "bolts")
    with pytest.raises(InventoryError):
        failed.result(60)
    store = JobStore()  # a new process would open the same file
    rec = store.get(job.id[:10])
    assert rec is not None and rec.state == "done" and rec.kind is None
    again = attach(rec, store)
    assert again.result(10) == 1024
    frec = store.get(failed.id)
    assert frec is not None and frec.state == "failed" and frec.kind == "user_exception"
    assert frec.report is not None and frec.report["kind"] == "user_exception"
    assert [r.id for r in store.list()] == [failed.id, job.id]
    assert (_state_dir / "jobs.sqlite").exists()


@pytest.mark.slow
def test_cloudpickle_mismatch(make_executor: Any, venv1: str, env_root: str) -> None:
    """A VENV2 whose cloudpickle differs from the submitter's (built by gpuctl from the local
    package index, without the system site-packages)."""
    import cloudpickle

    from gpuctl.jobs import Executor

    other = "3.1.2" if not cloudpickle.__version__.startswith("3.1") else "2.2.1"
    spec = EnvSpec(
        packages=(f"cloudpickle=={other}",), methods=("venv",), base_python=sys.executable
    )
    try:
        probe = Executor(
            "local", supervisor_python=venv1, env=spec, env_root=env_root, store=False, verify=False
        ).venv2()
    except JobFailed as e:
        pytest.skip(f"no cloudpickle {other} to install here: {e.report.evidence[0]}")
    assert probe["cloudpickle"] == other
    with pytest.raises(JobFailed) as info:
        make_executor(python=probe["path"]).submit(len, [1])
    assert info.value.kind == "cloudpickle_mismatch"
    assert f"cloudpickle {other}" in str(info.value)
    assert f"pip install cloudpickle=={cloudpickle.__version__}" in str(info.value)
    job = make_executor(python=probe["path"], verify=False).submit(len, [1])
    err = failure(job, "cloudpickle_mismatch")
    assert f"VENV2 has cloudpickle {other}" in str(err)
