"""A job's environment: one rule on every backend (issue #40.3).

A job gets its node's environment, never the submitter's (a local job used to inherit all of it,
``WANDB_API_KEY`` included, an SSH job none of it, and nothing said so); ``env_pass`` patterns
and ``job_env`` pass variables on purpose; a submit names the credential- or cache-like
variables the job will not see; the passed values are written nowhere a person or a report
reads (``meta.json``, the report, the logs, the store).
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from gpuctl.cli.main import main
from gpuctl.jobs import EnvSpec, Executor, jobenv
from gpuctl.node import jobfiles
from gpuctl_tests.jobs.test_ssh import node_config, ssh_executor

__all__ = ["node_config"]  # the sshd node fixture, shared with test_ssh

# every passed value contains it: found nowhere but in the job (made here: the module's source
# travels with the job)
SECRET = "-".join(("s3cr3t", uuid.uuid4().hex))
NAMES = ("GPUCTL_T_API_KEY", "HF_HOME", "WANDB_PROJECT", "GPUCTL_T_PASSED", "GPUCTL_T_EXPLICIT")


def seen_env() -> dict[str, str | None]:
    import os

    names = (*NAMES, "HOME", "PATH", "GPUCTL_NODE")
    return {k: os.environ.get(k) for k in names}


def fail_here() -> None:
    raise RuntimeError("the job failed on purpose")


@pytest.fixture
def submitter_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUCTL_T_API_KEY", f"key-{SECRET}")
    monkeypatch.setenv("HF_HOME", f"/cache/{SECRET}")
    monkeypatch.setenv("WANDB_PROJECT", f"proj-{SECRET}")
    monkeypatch.setenv("GPUCTL_T_PASSED", f"passed-{SECRET}")
    # the notice is said once per process
    monkeypatch.setattr(jobenv, "_TOLD_UNSEEN", set())


def folder_text(*folders: str) -> str:
    """Every file under ``folders``, as text (the job folder, the state folder), but the
    function's result (it returns the values)."""
    out = []
    for folder in folders:
        for root, _, files in os.walk(folder):
            for name in set(files) - {jobfiles.RESULT, jobfiles.RESULT_INFO}:
                with open(os.path.join(root, name), "rb") as f:
                    out.append(f.read().decode("utf-8", "replace"))
    return "\n".join(out)


def check_rule(ex: Executor, capsys: pytest.CaptureFixture[str], node: str | None) -> None:
    """The same assertions for every backend."""
    job = ex.submit(seen_env)
    got = job.result(120)
    err = capsys.readouterr().err
    # the submitter's own variables stay here; the node's, the base and what was passed arrive
    assert got["GPUCTL_T_API_KEY"] is None and got["WANDB_PROJECT"] is None
    assert got["HF_HOME"] == f"/cache/{SECRET}"  # env_pass=["HF_*"]
    assert got["GPUCTL_T_PASSED"] == f"passed-{SECRET}"  # env_pass names it whole
    assert got["GPUCTL_T_EXPLICIT"] == f"explicit-{SECRET}"  # job_env
    assert got["HOME"] and got["PATH"]
    assert got["GPUCTL_NODE"] == node  # sshd's session on the node; the local machine has none
    # one line names what the job will not see, and no value
    told = [line for line in err.splitlines() if "will not see" in line]
    assert len(told) == 1, err
    assert "GPUCTL_T_API_KEY" in told[0] and "WANDB_PROJECT" in told[0]
    assert "HF_HOME" not in told[0] and SECRET not in err
    meta = json.loads(Path(job.jobdir, jobfiles.META).read_text())
    assert meta["env_names"] == ["GPUCTL_T_EXPLICIT", "GPUCTL_T_PASSED", "HF_HOME"]
    ex.submit(seen_env).result(120)
    assert "will not see" not in capsys.readouterr().err  # once
    failed = ex.submit(fail_here)
    with pytest.raises(RuntimeError, match="on purpose"):
        failed.result(120)
    report = failed.report()
    assert report is not None and "on purpose" in report.text()
    assert SECRET not in report.text()
    assert not Path(job.jobdir, jobfiles.JOB_ENV).exists()
    state = os.environ["GPUCTL_STATE_DIR"]
    assert SECRET not in folder_text(job.jobdir, failed.jobdir, state)


def test_a_local_job_gets_the_rule_not_the_submitters_environment(
    make_executor: Any, submitter_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    ex = make_executor(
        env_pass=["HF_*", "GPUCTL_T_PASSED"], job_env={"GPUCTL_T_EXPLICIT": f"explicit-{SECRET}"}
    )
    check_rule(ex, capsys, None)


@pytest.mark.sshd
def test_an_ssh_job_gets_the_same_rule(
    node_config: Any,
    env_root: str,
    env_spec: EnvSpec,
    tmp_path: Path,
    submitter_env: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ex = ssh_executor(
        node_config,
        env_root,
        tmp_path,
        env_spec,
        env_pass=["HF_*", "GPUCTL_T_PASSED"],
        job_env={"GPUCTL_T_EXPLICIT": f"explicit-{SECRET}"},
    )
    try:
        check_rule(ex, capsys, "gpu1")
    finally:
        ex.backend.host.close()


USER_FILE = """
import os

def seen():
    return [os.environ.get("GPUCTL_T_PASSED"), os.environ.get("GPUCTL_T_API_KEY")]
"""


def test_submit_env_pass_on_the_command_line(
    venv1: str,
    venv2: str,
    tmp_path: Path,
    submitter_env: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    user = tmp_path / "user_env.py"
    user.write_text(USER_FILE)
    common = ("--supervisor-python", venv1, "--python", venv2, "--wait")
    rc = main(["submit", f"{user}:seen", "--env-pass", "GPUCTL_T_PAS*", *common])
    out = capsys.readouterr()
    assert rc == 0
    assert out.out.split(None, 1)[1].strip() == f"['passed-{SECRET}', None]"
    (told,) = [line for line in out.err.splitlines() if "will not see" in line]
    assert "GPUCTL_T_API_KEY" in told and "GPUCTL_T_PASSED" not in told and "--env-pass" in told


@pytest.mark.slurm
def test_a_slurm_job_gets_the_same_rule(
    slurm_executor: Any, submitter_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """sbatch exported the whole submitter environment (``--export=ALL``, Slurm's default):
    Slurm kept it, and the job saw it."""
    ex = slurm_executor(
        env_pass=["HF_*", "GPUCTL_T_PASSED"], job_env={"GPUCTL_T_EXPLICIT": f"explicit-{SECRET}"}
    )
    check_rule(ex, capsys, None)
