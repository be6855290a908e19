"""Jobs through the real one-node Slurm: sbatch script, job arrays for map, states, OOM, cancel."""

from __future__ import annotations

import json
import os
import pwd
import time
from pathlib import Path
from typing import Any

import pytest

from gpuctl.jobs import Executor, JobFailed, JobStore
from gpuctl_tests.helpers import wait_until
from gpuctl_tests.jobs.test_map_cap import run_capped

pytestmark = pytest.mark.slurm


def where_am_i(x: int) -> dict[str, Any]:
    import os

    return {
        "x": x * 3,
        "job": os.environ.get("SLURM_JOB_ID"),
        "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


@pytest.mark.slow
def test_submit_and_map_as_a_job_array(slurm_executor: Any) -> None:
    ex = slurm_executor(gpus=1)
    job = ex.submit(where_am_i, 5)
    out = job.result(60)
    assert out["x"] == 15 and out["job"] == job.handle["slurm_id"]
    assert out["gpus"] is not None  # --gpus=1 went into the batch script
    script = Path(job.jobdir, "job.sbatch").read_text()
    assert "#SBATCH --gpus=1" in script and "supervisor.py" in script
    outcome = json.loads(Path(job.jobdir, "outcome.json").read_text())
    assert outcome["slurm_job_id"] == job.handle["slurm_id"]
    assert outcome["supervisor_python"] == "3.6.15"

    jobs = ex.map_jobs(lambda a: a * a, range(12), chunksize=4)
    assert len(jobs) == 3
    array_ids = {j.handle["array"] for j in jobs}
    assert len(array_ids) == 1
    array_id = array_ids.pop()
    assert [j.handle["slurm_id"] for j in jobs] == [f"{array_id}_{i}" for i in range(3)]
    assert [j.result(60) for j in jobs] == [
        [("ok", a * a) for a in range(i, i + 4)] for i in (0, 4, 8)
    ]
    assert list(ex.map(lambda a: a + 1, range(12), chunksize=4)) == list(range(1, 13))


def test_a_capped_map_is_an_array_slurm_throttles(
    slurm_executor: Any, slurm_cluster: Any, tmp_path: Path
) -> None:
    """Six one-item tasks, cap 2, on a node with room for eight: Slurm runs two at a time (the
    items' own start/end times say so) and keeps the rest pending for JobArrayTaskLimit."""

    def throttled_by_slurm(jobs: list[Any]) -> None:
        assert "#SBATCH --array=0-5%2\n" in Path(jobs[0].jobdir, "job.sbatch").read_text()
        shown = slurm_cluster.run(["scontrol", "show", "job", jobs[0].handle["array"]]).stdout
        assert "ArrayTaskThrottle=2" in shown, shown
        reasons = slurm_cluster.run(["squeue", "-h", "-r", "-t", "PD", "-o", "%r"]).stdout.split()
        assert reasons and set(reasons) == {"JobArrayTaskLimit"}, reasons

    run_capped(slurm_executor(), tmp_path, items=6, cap=2, while_held=throttled_by_slurm)


def test_memory_limit_on_slurm_is_out_of_memory(slurm_executor: Any) -> None:
    def hog() -> int:
        return len([bytearray(64 << 20) for _ in range(32)])

    job = slurm_executor(mem="400M").submit(hog)
    with pytest.raises(JobFailed) as info:
        job.result(60)
    assert info.value.kind == "out_of_memory"
    assert "#SBATCH --mem=400M" in Path(job.jobdir, "job.sbatch").read_text()


def test_pending_then_cancelled_and_running_cancel(slurm_executor: Any) -> None:
    ex = slurm_executor(sbatch_args=["--begin=now+3600"])
    pending = ex.submit(where_am_i, 1)
    wait_until(lambda: pending.state == "pending", 20, "the job to be pending")

    def reason() -> str | None:
        info = pending.backend.scheduler_state(pending.handle)
        return None if info is None else info["reason"]

    # Slurm may first give another reason (Resources, while the node is still busy with the
    # job of the test before) and says BeginTime at its next scheduling pass.
    wait_until(lambda: reason() == "BeginTime", 30, "Slurm to say the job waits for its begin time")
    assert pending.cancel()
    with pytest.raises(JobFailed) as err:
        pending.result(30)
    assert err.value.kind == "cancelled"
    assert "before VENV2 started" in str(err.value)

    def sleeper() -> None:
        import time

        time.sleep(120)

    running = slurm_executor(grace=1).submit(sleeper)
    wait_until(lambda: running.state == "running", 30, "the job to run")
    assert running.cancel()
    with pytest.raises(JobFailed) as err:
        running.result(30)
    assert err.value.kind == "cancelled"


def test_time_limit_on_slurm(slurm_executor: Any) -> None:
    """Slurm's --time has minute steps; the supervisor enforces the exact limit inside it."""

    def sleeper() -> None:
        import time

        time.sleep(120)

    job = slurm_executor(time_limit=1.0, grace=0.5).submit(sleeper)
    with pytest.raises(JobFailed) as info:
        job.result(60)
    assert info.value.kind == "time_limit"
    assert "#SBATCH --time=1" in Path(job.jobdir, "job.sbatch").read_text()


@pytest.fixture
def enforcing_slurm(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A private Slurm of its own that enforces --mem (jobacct_gather/linux, OverMemoryKill);
    the shared one does not, so that jobs without --mem keep their default of 100 MB/CPU."""
    from gpuctl_tests.harness.slurm import running_cluster

    with running_cluster(tmp_path_factory.mktemp("slurm-mem"), enforce_memory=True) as cluster:
        yield cluster


@pytest.mark.slow
def test_slurm_kills_a_job_over_its_mem(
    enforcing_slurm: Any, venv1: str, venv2: str, tmp_path: Path
) -> None:
    """Slurm's own --mem enforcement: slurmstepd kills the whole step (supervisor included), the
    job ends FAILED (not OUT_OF_MEMORY: that state is for cgroup OOM kills), and the report
    finds the reason in Slurm's output file."""

    def hog() -> int:
        import time

        held = [bytearray(32 << 20) for _ in range(12)]  # 384 MiB, written (zero-filled)
        time.sleep(60)
        return len(held)

    ex = Executor(
        "slurm",
        partition=enforcing_slurm.partition,
        slurm_conf=str(enforcing_slurm.conf_path),
        job_root=str(tmp_path / "shared-jobs"),
        store=JobStore(),
        supervisor_python=venv1,
        python=venv2,
        mem="100M",
    )
    job = ex.submit(hog)
    t0 = time.monotonic()
    with pytest.raises(JobFailed) as info:
        job.result(50)
    took = time.monotonic() - t0
    report = info.value.report
    assert report.kind == "out_of_memory", str(info.value)
    text = str(info.value)
    assert "Slurm killed StepId=" in text and "over its --mem limit of 100.0 MiB" in text
    used = float(text.split("it used ", 1)[1].split(" MiB")[0])
    assert used > 100  # what Slurm measured, above the limit
    assert "scheduler state: FAILED" in text
    assert report.logs["slurm output"].endswith(".out")
    assert "exceeded memory limit" in Path(report.logs["slurm output"]).read_text()
    meta = json.loads(Path(job.jobdir, "meta.json").read_text())
    assert meta["limits"]["mem_enforced_by"] == "slurm"  # the supervisor leaves it to Slurm
    assert "#SBATCH --mem=100M" in Path(job.jobdir, "job.sbatch").read_text()
    assert took < 40  # killed by Slurm's 1 s sampling, not by the 60 s sleep ending


def test_scancel_from_outside_waits_for_slurms_verdict(
    slurm_executor: Any, slurm_cluster: Any
) -> None:
    """An admin's scancel reaches the supervisor as SIGTERM; the report waits for Slurm's final
    state (which is what tells a time limit or a preemption from a cancel) and says CANCELLED."""

    def sleeper() -> None:
        import time

        time.sleep(120)

    job = slurm_executor(grace=1).submit(sleeper)
    wait_until(lambda: job.state == "running", 30, "the job to run")
    slurm_cluster.run(["scancel", job.handle["slurm_id"]])
    t0 = time.monotonic()
    with pytest.raises(JobFailed) as err:
        job.result(30)
    assert time.monotonic() - t0 < 20  # well before the 30 s bound on waiting for the verdict
    assert err.value.kind == "cancelled"
    assert "scheduler state: CANCELLED" in str(err.value)
    assert not Path(job.jobdir, "cancel-requested").exists()  # nobody asked gpuctl to cancel


def test_submit_target_slurm_takes_slurm_conf_from_the_config(
    slurm_cluster: Any, venv1: str, venv2: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``gpuctl submit --target slurm`` with no SLURM_CONF in the environment: the Slurm
    cluster's slurm_conf and partition come from the config, and so does ``[jobs] dir``."""
    import subprocess
    import sys

    from gpuctl_tests.helpers import node_env

    monkeypatch.delenv("SLURM_CONF", raising=False)
    shared = tmp_path / "shared-jobs"
    cfg = tmp_path / "config.toml"
    cfg.write_text(
        f'[jobs]\ndir = "{shared}"\n'
        f'[clusters.hpc]\nvia = "srun"\nslurm_conf = "{slurm_cluster.conf_path}"\n'
        f'partition = "{slurm_cluster.partition}"\n'
    )
    (tmp_path / "fns.py").write_text(
        "def triple(x):\n    import os\n    return [x * 3, os.environ.get('SLURM_JOB_ID')]\n"
    )
    env = node_env({"GPUCTL_CONFIG": str(cfg), "GPUCTL_STATE_DIR": str(tmp_path / "state")})
    env.pop("SLURM_CONF", None)
    env["GPUCTL_TEST_SLURM"] = slurm_cluster.env["GPUCTL_TEST_SLURM"]  # the harness's cleanup
    r = subprocess.run(
        [
            sys.executable, "-m", "gpuctl", "submit", f"{tmp_path / 'fns.py'}:triple",
            "--args", "[4]", "--target", "slurm", "--python", venv2,
            "--supervisor-python", venv1, "--wait",
        ],
        capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    value = eval(r.stdout.strip().splitlines()[-1])  # repr of [12, '<job id>']
    assert value[0] == 12 and value[1].isdigit()
    (script,) = shared.glob(f"{pwd.getpwuid(os.getuid()).pw_name}/*/job.sbatch")  # per user
    assert f"#SBATCH --partition={slurm_cluster.partition}" in script.read_text()
    # `gpuctl jobs` names the Slurm job id beside the target, and --json has it
    jobs = subprocess.run(
        [sys.executable, "-m", "gpuctl", "jobs"], capture_output=True, text=True, env=env,
        timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert f"slurm ({value[1]})" in jobs.stdout, jobs.stdout
    listed = subprocess.run(
        [sys.executable, "-m", "gpuctl", "jobs", "--json"], capture_output=True, text=True,
        env=env, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert [j["slurm_id"] for j in json.loads(listed.stdout)["jobs"]] == [value[1]]


def test_executor_slurm_reads_slurm_conf_and_partition_from_the_config(tmp_path: Path) -> None:
    from gpuctl.config import parse_config

    cfg = parse_config(
        '[jobs]\npartition = "short"\n[clusters.hpc]\nvia = "srun"\nslurm_conf = "/x/slurm.conf"\n'
        'partition = "gpu"\n',
        str(tmp_path / "config.toml"),
    )
    ex = Executor("slurm", config=cfg, store=False)
    assert ex.backend.client.slurm_conf == "/x/slurm.conf"  # type: ignore[attr-defined]
    assert ex.backend.partition == "short"  # type: ignore[attr-defined]  # [jobs] wins
    ex = Executor("slurm", config=cfg, partition="debug", slurm_conf="/y.conf", store=False)
    assert ex.backend.client.slurm_conf == "/y.conf"  # type: ignore[attr-defined]
    assert ex.backend.partition == "debug"  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=r"partition: bad name 'a\\n#SBATCH"):
        Executor("slurm", config=cfg, partition="a\n#SBATCH --wrap=id", store=False)


def test_the_scripts_gpuctl_writes_are_read_by_sbatch_as_written(
    slurm_cluster: Any, tmp_path: Path
) -> None:
    """A function name with ``$(...)``, newlines and quotes, and a job folder with spaces,
    ``$``, ``#`` and ``'``: the real sbatch takes the script (held, so nothing runs), the job
    name is the sanitized one and Slurm's output file is in that folder. Job folders sbatch
    could not read as written are refused before anything is written."""
    from gpuctl.accept.run import AcceptOptions
    from gpuctl.accept.slurm import SlurmJobSpec, batch_script
    from gpuctl.jobs.backends import SlurmBackend
    from gpuctl.jobs.hosts import LocalHost
    from gpuctl.reach.slurm import SlurmClient, SlurmValueError

    root = tmp_path / "odd $HOME #x 'q'"
    jobdir = root / "job1"
    jobdir.mkdir(parents=True)
    backend = SlurmBackend(
        LocalHost(),
        str(root),
        "/usr/bin/python3",
        partition=slurm_cluster.partition,
        nodelist=slurm_cluster.node,
        sbatch_args=["--hold", "--comment=two words"],
        client=SlurmClient(slurm_cluster.conf_path),
    )
    evil = "x$(touch /tmp/pwned)\n#SBATCH --wrap=id \"q\" 'r' `id`"
    (handle,) = backend.start([str(jobdir)], {"name": evil, "limits": {"cpus": 1}})
    job = handle["slurm_id"]
    try:
        info = slurm_cluster.run(["scontrol", "show", "job", job]).stdout
        assert "JobName=gpuctl-x_touch_tmp_pwned_SBATCH_--wrap_id_q_r_id\n" in info
        assert f"StdOut={root}/slurm-{job}.out" in info  # not an array: no %a placeholder
        assert f"WorkDir={root}\n" in info and "Comment=two words" in info
        assert f"ReqNodeList={slurm_cluster.node} " in info
        assert "JobState=PENDING Reason=JobHeldUser" in info
    finally:
        slurm_cluster.run(["scancel", job])
    # the acceptance script, in a folder with a space: sbatch reads its --output as written
    accept_job = tmp_path / "accept jobs" / "accept-1"
    accept_job.mkdir(parents=True)
    text = batch_script(
        accept_job,
        accept_job / "bundle.pyz",
        "/usr/bin/python3",
        SlurmJobSpec(nodelist=slurm_cluster.node, partition=slurm_cluster.partition),
        AcceptOptions(device="cpu"),
    )
    (accept_job / "job.sh").write_text(text)
    out = slurm_cluster.run(["sbatch", "--parsable", "--hold", str(accept_job / "job.sh")])
    job = out.stdout.strip().split(";")[0]
    try:
        info = slurm_cluster.run(["scontrol", "show", "job", job]).stdout
        assert f"StdOut={accept_job}/slurm-{job}.out" in info
    finally:
        slurm_cluster.run(["scancel", job])
    # refused before anything is written: a newline or a quote in the folder, %-patterns
    for bad in ("new\nline", 'quo"te', "100%"):
        folder = tmp_path / bad / "job2"
        folder.mkdir(parents=True)
        with pytest.raises(SlurmValueError, match="job folder: "):
            backend.start([str(folder)], {"name": "f", "limits": {}})
        assert not (folder / "job.sbatch").exists()
    with pytest.raises(SlurmValueError, match=r"^--nodes: bad hostlist"):
        SlurmJobSpec(nodelist=f"{slurm_cluster.node}\n#SBATCH --wrap=id")


def test_a_killed_supervisor_under_slurm_takes_its_processes_and_says_so(
    slurm_executor: Any, tmp_path: Path
) -> None:
    """The keeper is the batch step's process: a kill -9 of the supervisor inside it ends the
    job's children (the step would otherwise hold them until Slurm's time limit) and the report
    names the kill, not Slurm's FAILED."""
    from gpuctl.node import jobfiles
    from gpuctl_tests.jobs.test_subreaper import alive, start_children

    pid_file = tmp_path / "pids"
    job = slurm_executor().submit(start_children, str(pid_file))
    wait_until(lambda: pid_file.exists() and pid_file.read_text(), 60, "the job's children")
    pids = [int(p) for p in pid_file.read_text().split()]
    supervisor = json.loads(Path(job.jobdir, jobfiles.PIDFILE).read_text())["pid"]
    os.kill(supervisor, 9)
    with pytest.raises(JobFailed) as info:
        job.result(60)
    assert info.value.kind == "supervisor_killed", info.value
    assert not any(alive(p) for p in pids)
