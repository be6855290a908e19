"""Command jobs (``Executor.submit_command``, ``gpuctl submit -- CMD``) through the real runner:
VENV1 a Python 3.6 supervisor, VENV2 the session's venv, local and over a real sshd."""

from __future__ import annotations

import os
import shlex
import stat
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from gpuctl.cli.main import main
from gpuctl.config import load_config
from gpuctl.jobs import EnvSpec, Executor, JobFailed, JobStore
from gpuctl_tests.harness.sshd import SshCluster
from gpuctl_tests.helpers import wait_until
from gpuctl_tests.jobs.conftest import no_process_with_env

SHOW = (
    "import os, sys; print(sys.executable); print(os.getcwd()); print('to stderr', file=sys.stderr)"
)
FAIL_3 = "import sys; print('before the end'); print('it went wrong', file=sys.stderr); sys.exit(3)"
# exits cleanly on SIGTERM after saying so: the command, not gpuctl, decides how it ends
TRAPS_TERM = (
    "import signal, sys, time\n"
    "def bye(*a):\n"
    "    print('cleaned up', flush=True)\n"
    "    sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, bye)\n"
    "print('ready', flush=True)\n"
    "time.sleep(300)\n"
)


def test_command_runs_in_venv2_and_in_the_cwd(
    make_executor: Any, venv2: str, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    ex = make_executor(cwd=str(work))
    job = ex.submit_command(["python", "-c", SHOW])
    assert job.result(60) == 0
    exe, cwd = job.stdout().splitlines()
    assert exe == venv2 != sys.executable  # `python` is VENV2's: its bin is first on PATH
    assert cwd == str(work)
    assert job.stderr() == "to stderr\n"
    rec = JobStore().get(job.id)
    assert rec is not None and rec.name == shlex.join(["python", "-c", SHOW])
    assert rec.state == "done"


def test_command_exit_code_is_command_failed_with_the_stderr_tail(make_executor: Any) -> None:
    job = make_executor().submit_command(["python", "-c", FAIL_3])
    with pytest.raises(JobFailed) as info:
        job.result(60)
    report = info.value.report
    assert (report.kind, report.exit_status) == ("command_failed", 3)
    assert report.evidence[0] == f"`python -c {shlex.quote(FAIL_3)}` exited with code 3"
    assert "| it went wrong" in report.evidence
    assert not any("VENV2 ended with exit code" in line for line in report.evidence)
    assert report.traceback == ""  # the runner's own frames are not the user's business
    assert job.stdout() == "before the end\n"
    rec = JobStore().get(job.id)
    assert rec is not None and (rec.state, rec.kind) == ("failed", "command_failed")
    assert rec.report is not None and rec.report.get("exit_status") == 3


def test_command_killed_by_a_signal_says_which(make_executor: Any) -> None:
    job = make_executor().submit_command(["sh", "-c", "kill -SEGV $$"])
    with pytest.raises(JobFailed) as info:
        job.result(60)
    assert info.value.kind == "command_failed" and info.value.report.exit_status == -11
    assert "was killed by SIGSEGV" in info.value.report.evidence[0]


def test_command_not_found_is_its_own_kind(make_executor: Any, tmp_path: Path) -> None:
    ex = make_executor(cwd=str(tmp_path))
    job = ex.submit_command(["no-such-program-xyz", "--flag"])
    with pytest.raises(JobFailed) as info:
        job.result(60)
    report = info.value.report
    assert report.kind == "command_not_found"
    assert report.evidence[0].startswith("`no-such-program-xyz --flag`: command not found on VENV2")
    assert "'no-such-program-xyz'" in report.evidence[0] and "[Errno" not in report.evidence[0]
    assert report.traceback == ""

    script = tmp_path / "not-executable.sh"
    script.write_text("echo hi\n")
    script.chmod(stat.S_IRUSR | stat.S_IWUSR)
    with pytest.raises(JobFailed) as info:
        ex.submit_command(["./not-executable.sh"]).result(60)
    assert info.value.kind == "command_not_found"
    assert "Permission denied" in info.value.report.evidence[0]


def test_cancelled_command_gets_term_and_ends_its_own_way(make_executor: Any) -> None:
    token = uuid.uuid4().hex
    ex = make_executor(grace=30, job_env={"GPUCTL_TEST_TOKEN": token})
    job = ex.submit_command(["python", "-c", TRAPS_TERM])
    wait_until(lambda: "ready" in job.stdout(), 30, "the command to start")
    assert not no_process_with_env(token)
    assert job.cancel()
    with pytest.raises(JobFailed) as info:
        job.result(60)
    assert info.value.kind == "cancelled"
    assert "cleaned up" in job.stdout()  # it got the TERM and finished, well before the KILL
    wait_until(lambda: no_process_with_env(token), 10, "the command's process to end")


def test_command_time_limit_stops_it(make_executor: Any) -> None:
    job = make_executor(time_limit=1, grace=1).submit_command(["sleep", "300"])
    with pytest.raises(JobFailed) as info:
        job.result(60)
    assert info.value.kind == "time_limit"


def test_command_memory_counts_against_mem(make_executor: Any) -> None:
    grows = "import time; x = b'x' * (300 << 20); print('holding', flush=True); time.sleep(60)"
    job = make_executor(mem="100M").submit_command(["python", "-c", grows])
    with pytest.raises(JobFailed) as info:
        job.result(60)
    assert info.value.kind == "out_of_memory"  # the command's memory, summed with VENV2's


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        ("python train.py", TypeError),
        ([], ValueError),
        (["python", 3], TypeError),
        (["python", "a\0b"], ValueError),
    ],
)
def test_bad_argv_is_refused_before_anything_is_written(
    make_executor: Any, job_root: str, argv: Any, error: type[Exception]
) -> None:
    with pytest.raises(error):
        make_executor().submit_command(argv)
    assert not os.path.exists(job_root) or os.listdir(job_root) == []
    assert JobStore().list(10) == []


def test_submit_command_refuses_in_read_only_mode(job_root: str) -> None:
    from gpuctl import service

    ex = Executor("local", job_root=job_root, read_only=True)
    with pytest.raises(service.ReadOnlyError, match="submitting jobs is disabled"):
        ex.submit_command(["true"])
    assert not os.path.exists(job_root)


# -- the command line ------------------------------------------------------------------------
def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_submit_command_wait_logs_and_exit_status(
    venv1: str, venv2: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    common = ("--supervisor-python", venv1, "--python", venv2)
    rc, out, err = run(capsys, "submit", *common, "--wait", "--", "python", "-c", FAIL_3)
    assert rc == 3  # the command's own exit status
    assert out == "before the end\n"  # stdout is the command's, nothing else
    lines = err.splitlines()
    assert lines[0].startswith("gpuctl: job ") and "it went wrong" in lines
    assert lines[-1].endswith("exited with code 3")

    rc, out, err = run(capsys, "submit", *common, "--", "python", "-c", SHOW)
    assert rc == 0 and err == ""
    job_id = out.strip()
    assert len(job_id) == 32
    rc, out, _ = run(capsys, "result", job_id, "--timeout", "60")
    assert (rc, out) == (0, "0\n")
    rc, out, _ = run(capsys, "logs", job_id)
    assert out.splitlines() == ["=== stdout ===", venv2, os.getcwd(), "=== stderr ===", "to stderr"]
    rc, out, _ = run(capsys, "jobs")
    assert any(job_id[:12] in line and " done " in line for line in out.splitlines())

    rc, _, err = run(capsys, "submit", *common, "--wait", "--", "no-such-program-xyz")
    assert rc == 127 and "[command_not_found]" in err

    rc, _, err = run(capsys, "submit", "--wait", *common, "--", "sh", "-c", "exit 0")
    assert rc == 0


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["submit", "--"], "nothing after --"),
        (["submit"], "give FILE.py:FUNC, or a command after --"),
        (["submit", "train.py:main", "--", "python"], "not both"),
        (["submit", "--args", "[1]", "--", "python"], "--args is for FILE.py:FUNC"),
    ],
)
def test_cli_submit_command_mistakes_are_one_line(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and out == ""
    assert err.startswith("gpuctl: ") and said in err and err.count("\n") == 1


def test_cli_submit_command_refused_in_read_only_mode(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GPUCTL_READ_ONLY", "1")
    marker = tmp_path / "ran"
    rc, _, err = run(capsys, "submit", "--wait", "--", "touch", str(marker))
    assert rc == 2 and err.startswith("gpuctl: read-only mode: submitting jobs is disabled")
    assert not marker.exists()


# -- over SSH: the job's folder on the node is the command's cwd -----------------------------
@pytest.mark.sshd
def test_command_over_ssh(
    ssh_cluster: SshCluster, venv1: str, env_root: str, env_spec: EnvSpec, tmp_path: Path
) -> None:
    ssh_cluster.start_node("gpu1", python=venv1)
    config = load_config(ssh_cluster.write_config(tmp_path / "config.toml"))
    ex = Executor(
        "gpu1",
        config=config,
        env=env_spec,
        env_root=env_root,
        job_root=str(tmp_path / "remote-jobs"),
        store=JobStore(),
    )
    job = ex.submit_command(["python", "-c", SHOW])
    assert job.result(60) == 0
    exe, cwd = job.stdout().splitlines()
    assert exe == ex.venv2()["path"]
    assert cwd == job.jobdir  # no cwd on a node: the job's own folder
    assert job.stderr() == "to stderr\n"

    with pytest.raises(JobFailed) as info:
        ex.submit_command(["python", "-c", FAIL_3]).result(60)
    assert (info.value.kind, info.value.report.exit_status) == ("command_failed", 3)
    assert "| it went wrong" in info.value.report.evidence
    assert "gpu1:" in info.value.report.logs["stderr.txt"]

    with pytest.raises(JobFailed) as info:
        ex.submit_command(["no-such-program-xyz"]).result(60)
    assert info.value.kind == "command_not_found"


def test_command_through_slurm(slurm_executor: Any, venv2: str) -> None:
    """A command job as a batch job: VENV2's python, the exit status, the stderr tail, the
    Slurm job id in the store, and ``cancel`` (scancel) letting it end its own way."""
    token = uuid.uuid4().hex
    ex = slurm_executor(grace=30, job_env={"GPUCTL_TEST_TOKEN": token})
    job = ex.submit_command(["python", "-c", SHOW])
    assert job.result(120) == 0
    exe, cwd = job.stdout().splitlines()
    assert exe == venv2 != sys.executable
    assert cwd == os.getcwd()  # as sbatch does: the folder it was submitted from (shared)
    rec = JobStore().get(job.id)
    assert rec is not None and rec.state == "done"
    assert str((rec.backend.get("handle") or {}).get("slurm_id", "")).isdigit()

    with pytest.raises(JobFailed) as info:
        ex.submit_command(["python", "-c", FAIL_3]).result(120)
    assert (info.value.kind, info.value.report.exit_status) == ("command_failed", 3)
    assert "| it went wrong" in info.value.report.evidence

    job = ex.submit_command(["python", "-c", TRAPS_TERM])
    wait_until(lambda: "ready" in job.stdout(), 120, "the command to start under Slurm")
    assert not no_process_with_env(token)
    assert job.cancel()
    with pytest.raises(JobFailed) as info:
        job.result(120)
    assert info.value.kind == "cancelled"
    assert "cleaned up" in job.stdout()  # TERM reached the command, not only its supervisor
    wait_until(lambda: no_process_with_env(token), 30, "the command's process to end")
