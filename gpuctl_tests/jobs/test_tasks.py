"""Jobs of several tasks through the real one-node Slurm: a gloo DDP job of 1 node x 2 tasks,
the rendezvous each rank sees, a rank that fails, and the refusals where Slurm is not used."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpuctl.cli.main import main
from gpuctl.jobs import Executor, JobFailed
from gpuctl.jobs.classify import JobFiles, combine_ranks
from gpuctl.jobs.records import BackendInfo
from gpuctl.jobs.report import FailureReport
from gpuctl_tests.helpers import wait_until

RENDEZVOUS = (
    "RANK",
    "LOCAL_RANK",
    "NODE_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SLURM_JOB_ID",
)


def train_ddp(steps: int) -> dict[str, Any]:
    """A tiny DDP regression on CPU with gloo (env:// rendezvous); each rank its own data."""
    import os

    import torch
    import torch.distributed as dist

    env = {k: os.environ.get(k) for k in RENDEZVOUS}
    dist.init_process_group("gloo")
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        gen = torch.Generator().manual_seed(100 + rank)
        x = torch.randn(256, 4, generator=gen)
        y = x @ torch.tensor([[1.0, -2.0, 3.0, 0.5]]).T + 0.3
        losses = []
        for _ in range(steps):
            opt.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
            losses.append(float(loss))
        flat = torch.cat([p.detach().flatten() for p in model.parameters()])
        every = [torch.zeros_like(flat) for _ in range(world)]
        dist.all_gather(every, flat)
        return {
            "rank": rank,
            "world": world,
            "losses": losses,
            "params": flat.tolist(),
            "params_equal": all(torch.equal(every[0], t) for t in every),
            "env": env,
            "jobdir": os.environ.get("GPUCTL_JOB_DIR"),
        }
    finally:
        dist.destroy_process_group()


@pytest.mark.slurm
def test_ddp_of_two_tasks_through_slurm(slurm_executor: Any) -> None:
    ex = slurm_executor(tasks_per_node=2, time_limit=300, python=sys.executable)  # torch
    job = ex.submit(train_ddp, 40)
    first = job.result(240)
    results = job.results()
    assert len(results) == 2 and results[0] == first
    assert [r["rank"] for r in results] == [0, 1]
    for r in results:
        assert r["world"] == 2 and r["params_equal"]
        assert r["losses"][-1] < 0.2 * r["losses"][0], r["losses"]
    assert results[0]["params"] == results[1]["params"]
    assert results[0]["losses"] != results[1]["losses"]  # each rank had its own data

    envs = [r["env"] for r in results]
    slurm_id = job.handle["slurm_id"]
    assert [e["RANK"] for e in envs] == ["0", "1"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1"]
    assert {e["NODE_RANK"] for e in envs} == {"0"}
    assert {e["WORLD_SIZE"] for e in envs} == {"2"}
    assert {e["LOCAL_WORLD_SIZE"] for e in envs} == {"2"}
    assert {e["SLURM_JOB_ID"] for e in envs} == {slurm_id}
    assert {e["MASTER_PORT"] for e in envs} == {str(15000 + int(slurm_id) % 15000)}
    assert len({e["MASTER_ADDR"] for e in envs}) == 1 and envs[0]["MASTER_ADDR"]

    # one folder per rank, each with its own outcome and result: no rank wrote another's files
    dirs = [Path(r["jobdir"]) for r in results]
    assert dirs == [Path(job.jobdir, f"rank-{i}") for i in (0, 1)]
    for i, d in enumerate(dirs):
        outcome = json.loads((d / "outcome.json").read_text())
        assert outcome["rank"] == i and outcome["exit_code"] == 0
        assert (d / "result.pkl").is_file() and (d / "meta.json").is_symlink()
        assert oct(d.stat().st_mode & 0o777) == "0o700"
    assert not Path(job.jobdir, "outcome.json").exists()
    script = Path(job.jobdir, "job.sbatch").read_text()
    assert "#SBATCH --ntasks-per-node=2" in script and "srun --kill-on-bad-exit=1" in script
    assert job.handle["tasks"] == 2 and job.state == "done"
    assert job.store is not None
    stored = job.store.get(job.id)
    assert stored is not None and stored.tasks == 2


def rank_one_raises() -> int:
    """Rank 1 raises at once; rank 0 waits for ever: only Slurm can end it."""
    import os
    import sys
    import threading

    print(f"rank {os.environ['RANK']} to stderr", file=sys.stderr, flush=True)
    if os.environ["RANK"] == "1":
        raise ValueError("rank one broke")
    threading.Event().wait()
    return 0


@pytest.mark.slurm
def test_a_failed_rank_fails_the_job_and_slurm_ends_the_others(
    slurm_executor: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    job = slurm_executor(tasks_per_node=2, grace=1).submit(rank_one_raises)
    started = time.monotonic()
    with pytest.raises(JobFailed) as info:
        job.result(120)
    took = time.monotonic() - started
    text = str(info.value)
    assert info.value.kind == "user_exception", text
    assert "rank 1 of 2" in text and "ValueError: rank one broke" in text
    assert "rank 0 of 2 did not finish" in text and "kill-on-bad-exit" in text
    # the function's own exception is the cause, with the node's traceback
    cause = info.value.__cause__
    assert isinstance(cause, ValueError) and str(cause) == "rank one broke"
    with pytest.raises(JobFailed):
        job.results()
    assert took < 100  # rank 0 never returns by itself: srun ended it
    report = job.report()
    assert report is not None and any("rank 1" in name for name in report.logs)
    # each rank's logs on the command line
    assert main(["logs", job.id, "--rank", "1", "--stderr"]) == 0
    assert capsys.readouterr().out == "rank 1 to stderr\n"
    assert main(["logs", job.id, "--stderr"]) == 0  # rank 0's, as before
    assert capsys.readouterr().out == "rank 0 to stderr\n"
    assert main(["logs", job.id, "--rank", "2"]) == 2
    assert capsys.readouterr().err == f"gpuctl: job {job.id} has ranks 0..1, not 2\n"


def test_several_tasks_need_slurm(make_executor: Any) -> None:
    with pytest.raises(ValueError, match="through Slurm only"):
        make_executor(nodes=2)
    with pytest.raises(ValueError, match="through Slurm only"):
        make_executor(tasks_per_node=2)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="whole number"):
            make_executor(tasks_per_node=bad)


@pytest.mark.slurm
def test_map_refuses_several_tasks(slurm_executor: Any) -> None:
    ex: Executor = slurm_executor(nodes=1, tasks_per_node=2)
    with pytest.raises(ValueError, match="one task per chunk"):
        ex.map_jobs(abs, [1, 2])
    assert os.path.isdir(ex.backend.job_root) is False or not os.listdir(ex.backend.job_root)


def test_gpuctl_jobs_shows_the_task_count(tmp_path: Path) -> None:
    from gpuctl.jobs import JobStore
    from gpuctl.jobs.store import JobRecord

    store = JobStore()  # the test's own state folder (GPUCTL_STATE_DIR)
    backend: BackendInfo = {"kind": "slurm", "handle": {"slurm_id": "77", "tasks": 4}}
    store.add(JobRecord("a" * 32, "train", "slurm", backend, str(tmp_path), "done", 1000.0))
    argv = [sys.executable, "-m", "gpuctl", "jobs"]
    shown = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
    assert "slurm (77, 4 tasks)" in shown.stdout, shown.stdout
    listed = subprocess.run([*argv, "--json"], capture_output=True, text=True, timeout=60)
    assert [j["tasks"] for j in json.loads(listed.stdout)["jobs"]] == [4]


def nap_in_every_rank() -> str:
    import os
    import time

    print(f"rank {os.environ['RANK']} up", flush=True)
    time.sleep(120)
    return os.environ["RANK"]


@pytest.mark.slurm
def test_dump_stacks_reaches_every_rank(slurm_executor: Any) -> None:
    """srun forwards the batch step's signals to its tasks: each rank's VENV2 gets SIGUSR2."""
    job = slurm_executor(tasks_per_node=2, grace=1).submit(nap_in_every_rank)
    stdout = [Path(job.jobdir, f"rank-{r}", "stdout.txt") for r in (0, 1)]
    wait_until(lambda: all(p.exists() and "up" in p.read_text() for p in stdout), 60, "ranks")
    job.dump_stacks()
    stderr = [Path(job.jobdir, f"rank-{r}", "stderr.txt") for r in (0, 1)]
    wait_until(lambda: all("nap_in_every_rank" in p.read_text() for p in stderr), 30, "both stacks")
    assert job.cancel()
    with pytest.raises(JobFailed) as info:
        job.result(60)
    assert info.value.kind == "cancelled", str(info.value)


def _report(kind: str) -> FailureReport:
    return FailureReport(kind=kind, phase="running", evidence=(f"{kind} here",), remedy="r")


def test_combined_report_leads_with_the_first_rank_to_fail() -> None:
    crash, user, ended = _report("crash"), _report("user_exception"), _report("cancelled")
    files = [
        JobFiles(outcome={"ended_at": 50.0, "hostname": "n1"}),
        JobFiles(outcome={"ended_at": 40.0, "hostname": "n1"}, error={"t": 30.0}),
        JobFiles(outcome={"ended_at": 45.0, "hostname": "n2"}, error={"t": 20.0}),
        None,
    ]
    report, lead = combine_ranks([ended, user, crash, None], files, job_id="j")
    assert lead == 2 and report is not None and report.kind == "crash"
    assert report.evidence[:4] == (
        "rank 2 of 4 (on n2) failed: VENV2 crashed [crash]",
        "rank 1 of 4 failed: the function raised an exception [user_exception]",
        "rank 0 of 4 did not finish: Slurm ended it when ranks 1, 2 failed "
        "(srun --kill-on-bad-exit)",
        "rank 3 of 4 finished",
    )
    # a cancel asked for is the job's verdict; a time limit met by every rank is one line
    cancelled, _ = combine_ranks([ended, ended], [None, None], cancel_requested=True)
    assert cancelled is not None and cancelled.kind == "cancelled"
    timeout = _report("time_limit")
    report, lead = combine_ranks([timeout] * 12, [None] * 12)
    assert lead == 0 and report is not None
    assert report.evidence[0] == (
        "ranks 0, 1, 2, 3, 4, 5, 6, 7 and 4 more of 12 failed: time limit reached [time_limit]"
    )
    assert combine_ranks([None, None], [None, None]) == (None, None)


@pytest.mark.slurm
def test_ddp_of_two_nodes_by_two_tasks(slurm_nodes: Any, venv1: str, tmp_path: Path) -> None:
    """2 nodes x 2 tasks on the multi-node test Slurm: each node in its own network namespace,
    so the ranks of node02 reach rank 0 over the bridge, at the address srun gave them."""
    from gpuctl.jobs import JobStore

    ex = Executor(
        "slurm",
        partition=slurm_nodes.partition,
        slurm_conf=str(slurm_nodes.conf_path),
        job_root=str(tmp_path / "shared-jobs"),
        store=JobStore(),
        supervisor_python=venv1,
        python=sys.executable,  # torch
        nodes=2,
        tasks_per_node=2,
        time_limit=300,
    )
    try:
        job = ex.submit(train_ddp, 40)
        job.result(300)
        results = job.results()
    finally:
        slurm_nodes.cancel_all()
    assert [r["rank"] for r in results] == [0, 1, 2, 3]
    for r in results:
        assert r["world"] == 4 and r["params_equal"]
        assert r["losses"][-1] < 0.2 * r["losses"][0], r["losses"]
    envs = [r["env"] for r in results]
    assert [e["NODE_RANK"] for e in envs] == ["0", "0", "1", "1"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "0", "1"]
    assert {e["LOCAL_WORLD_SIZE"] for e in envs} == {"2"}
    # rank 0's node, by the address of its own namespace: not this machine's loopback
    assert {e["MASTER_ADDR"] for e in envs} == {slurm_nodes.net.addresses[0]}
    assert len({tuple(r["params"]) for r in results}) == 1
