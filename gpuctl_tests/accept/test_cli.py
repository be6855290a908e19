"""``gpuctl accept`` end to end: this machine, nodes through their agents, SSH, Slurm, history."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuctl.workloads.accept_suite.schema import MARKERS, SCHEMA, SCHEMA_VERSION, SECTIONS
from gpuctl_tests.helpers import node_env, old_python

LIGHT = ("--skip", "train", "--skip", "ddp_allreduce", "--skip", "ddp_train")


def gpuctl(
    tmp_path: Path, *args: str, config: str = "", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    cfg = tmp_path / "config.toml"
    if not cfg.exists() or config:
        cfg.write_text(config)
    e = node_env({"GPUCTL_STATE_DIR": str(tmp_path / "state"), "GPUCTL_CONFIG": str(cfg)})
    e.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "gpuctl", "accept", *args],
        capture_output=True,
        text=True,
        env=e,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )


def lines(r: subprocess.CompletedProcess[str]) -> list[str]:
    return r.stdout.strip().splitlines()


def reports(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("accept-*.json"))]


@pytest.mark.slow
def test_local_quick_cpu_run_is_done_when(tmp_path: Path) -> None:
    d = tmp_path / "D"
    r = gpuctl(tmp_path, "--local", "--device", "cpu", "--quick", "--report-dir", str(d))
    out = lines(r)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert out[-1] == "[RESULT] SUCCESS"
    # Progress came through the agent while it ran: every section's marker lines.
    for marker in set(MARKERS.values()):
        assert any(ln.startswith(f"[{marker}]") for ln in out), marker
    assert any(ln.startswith("[PCIE] SKIP") for ln in out)  # clearly a SKIP on the CPU
    (report,) = reports(d)
    assert (report["schema"], report["schema_version"]) == (SCHEMA, SCHEMA_VERSION)
    assert report["node"] == socket.gethostname()
    assert report["verdict"] == "PASS" and report["failures"] == []
    assert set(report["sections"]) == set(SECTIONS)
    for name in ("env", "compute", "membw", "train", "ddp_allreduce", "ddp_train", "health"):
        assert report["sections"][name]["verdict"] in ("PASS", "SKIP"), name
    secs = report["sections"]
    fp32 = secs["compute"]["devices"][0]["results"][0]
    assert fp32["dtype"] == "fp32" and fp32["tflops"] > 0 and fp32["check"] is None
    assert secs["membw"]["devices"][0]["gbps"] > 0
    assert secs["train"]["devices"][0]["drop"] >= 0.5
    ar = secs["ddp_allreduce"]
    n = ar["world_size"]
    assert n == 2 and ar["backend"] == "gloo"
    assert ar["algbw_gbps"] > 0
    assert ar["busbw_gbps"] == pytest.approx(ar["algbw_gbps"] * 2 * (n - 1) / n)
    assert [x["mismatches"] for x in ar["ranks"]] == [0, 0]
    assert ar["iters"] > 2  # several refilled collectives, the first one untimed
    dt = secs["ddp_train"]
    assert dt["params_identical"] is True
    assert all(x["drop"] >= 0.5 for x in dt["ranks"]) and len(dt["ranks"]) == 2
    assert secs["health"]["verdict"] == "SKIP"
    # ... and it is in the history.
    h = gpuctl(tmp_path, "history")
    assert h.returncode == 0 and socket.gethostname() in h.stdout and "PASS" in h.stdout


@pytest.mark.slow
def test_a_slowed_second_run_is_flagged_as_degraded(tmp_path: Path) -> None:
    base = ("--local", "--device", "cpu", "--quick", "--skip", "membw", *LIGHT)
    # One torch thread: two test workers' OpenMP teams on two cores spin against each other and
    # once made the healthy run's fp32 figure 7x low (CI, 2026-11-29), under the slowed one's.
    one = {"OMP_NUM_THREADS": "1"}
    first = gpuctl(tmp_path, *base, env=one)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    assert "DEGRADED" not in first.stdout
    second = gpuctl(tmp_path, *base, "--test-slow-compute", "20", env=one)
    node = socket.gethostname()
    assert any(
        ln.startswith(f"[HISTORY] DEGRADED {node} compute/cpu/fp32:") for ln in lines(second)
    ), second.stdout[-2000:]
    # The floor passed (a CPU run is judged on correctness); the history alone fails it.
    assert second.returncode == 1
    assert lines(second)[-1].startswith("[RESULT] FAILURE:")
    assert "degraded compute/cpu/fp32" in lines(second)[-1]

    trend = gpuctl(tmp_path, "history", node)
    assert trend.returncode == 0
    row = next(ln for ln in lines(trend) if ln.startswith("compute/cpu/fp32"))
    assert row.split()[1] in ("█▁", "▇▁", "▆▁")  # high, then low
    hist = json.loads(gpuctl(tmp_path, "history", node, "--json").stdout)["nodes"]
    assert [r["degradations"] != [] for r in hist[node]["runs"]] == [True, False]


def test_read_only_mode_refuses(tmp_path: Path) -> None:
    r = gpuctl(tmp_path, "--local", "--device", "cpu", config="read_only = true\n")
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "read-only mode" in r.stderr
    assert "Traceback" not in r.stderr


def test_user_mistakes_are_one_line(tmp_path: Path) -> None:
    r = gpuctl(tmp_path, "--nodes", "gpu[01-02]", "--device", "cpu")
    assert r.returncode == 2 and "no nodes configured" in r.stderr
    r = gpuctl(tmp_path, "--local", "--floor", "3")
    assert r.returncode == 2 and "--floor" in r.stderr
    r = gpuctl(tmp_path, "history", "nosuchnode")
    assert r.returncode == 2 and "no acceptance runs recorded for nosuchnode" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.slow
def test_two_nodes_through_their_agents_give_one_cluster_report(tmp_path: Path) -> None:
    config = f'[clusters.lab]\nnodes = "n[1-2]"\nvia = "local"\npython = "{sys.executable}"\n'
    d = tmp_path / "D"
    r = gpuctl(
        tmp_path, "--device", "cpu", "--quick", "--skip", "membw", *LIGHT,
        "--report-dir", str(d), config=config,
    )  # fmt: skip
    out = lines(r)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert out[-1] == "[RESULT] SUCCESS"
    for n in ("n1", "n2"):  # progress per node while it ran
        assert any(ln.startswith(f"{n}: [COMPUTE]") for ln in out)
        assert any(ln.startswith(n) and ln.split()[-1] == "PASS" for ln in out)
    cluster = json.loads(next(d.glob("accept-cluster-*.json")).read_text())
    assert cluster["verdict"] == "PASS" and set(cluster["nodes"]) == {"n1", "n2"}
    assert cluster["nodes"]["n1"]["sections"]["compute"] == "PASS"
    assert cluster["nodes"]["n1"]["sections"]["train"] == "SKIP"


@pytest.mark.slow
@pytest.mark.sshd
def test_over_ssh_the_node_agent_on_python36_runs_the_suite_in_venv2(
    tmp_path: Path, ssh_cluster: Any
) -> None:
    ssh_cluster.start_node("node1", python=old_python("3.6.15"), simulate=None)
    cfg = ssh_cluster.write_config(
        tmp_path / "config.toml", workload_python=sys.executable, simulate=None
    )
    d = tmp_path / "D"
    r = gpuctl(
        tmp_path, "--nodes", "node1", "--device", "cpu", "--quick", "--skip", "membw", *LIGHT,
        "--report-dir", str(d), config=cfg.read_text(),
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert lines(r)[-1] == "[RESULT] SUCCESS"
    (report,) = reports(d)
    venv2 = f"{sys.version_info[0]}.{sys.version_info[1]}."  # this interpreter, not the 3.6
    assert report["sections"]["env"]["python"].startswith(venv2)
    assert report["sections"]["compute"]["verdict"] == "PASS"


@pytest.mark.slow
@pytest.mark.slurm
def test_through_slurm_a_two_task_job_runs_gathers_and_reports(
    tmp_path: Path, slurm_cluster: Any
) -> None:
    d = tmp_path / "D"
    jobs = tmp_path / "jobs"
    r = gpuctl(
        tmp_path, "--via", "slurm", "--device", "cpu", "--quick", "--skip", "train",
        "--skip", "membw", "--job-dir", str(jobs), "--report-dir", str(d),
        env=slurm_cluster.env,
    )  # fmt: skip
    out = lines(r)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert out[-1] == "[RESULT] SUCCESS"
    job_id = out[0].split()[3].rstrip(":")
    assert out[0].startswith("submitted Slurm job")
    script = next(jobs.glob("*/job.sh")).read_text()
    assert "#SBATCH --nodes=1" in script and "#SBATCH --ntasks-per-node=2" in script
    assert "--rdzv-endpoint" in script
    done = [
        ln for ln in Path(slurm_cluster.jobcomp_path).read_text().splitlines()
        if f"JobId={job_id} " in ln
    ]  # fmt: skip
    assert done and "JobState=COMPLETED" in done[0] and "ProcCnt=2" in done[0]
    (report,) = reports(d)
    assert report["node"] == slurm_cluster.node
    ar = report["sections"]["ddp_allreduce"]
    assert ar["verdict"] == "PASS" and ar["world_size"] == 2 and ar["busbw_gbps"] > 0
    assert report["sections"]["ddp_train"]["params_identical"] is True
    assert {s for s in SECTIONS} == set(report["sections"])


def test_login_side_never_imports_torch() -> None:
    code = (
        "import sys, gpuctl.cli.accept, gpuctl.accept.slurm, gpuctl.accept.run; "
        "sys.exit('torch' in sys.modules or 'textual' in sys.modules)"
    )
    r = subprocess.run([sys.executable, "-c", code], env=node_env(), capture_output=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.slurm
def test_a_job_slurm_refuses_is_one_line(tmp_path: Path, slurm_cluster: Any) -> None:
    r = gpuctl(
        tmp_path, "--via", "slurm", "--device", "cpu", "--partition", "nosuchpartition",
        "--job-dir", str(tmp_path / "jobs"), env=slurm_cluster.env,
    )  # fmt: skip
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.startswith("gpuctl: sbatch") and r.stderr.count("\n") == 1
    assert "Traceback" not in r.stderr
    # no job will ever read the folder written for it: it goes (each holds the ~0.3 MB bundle)
    assert not list((tmp_path / "jobs").iterdir())


@pytest.mark.slurm
def test_a_node_list_carrying_a_batch_line_is_refused_before_anything_is_written(
    tmp_path: Path, slurm_cluster: Any
) -> None:
    before = slurm_cluster.jobs()
    jobs = tmp_path / "jobs"
    pwned = tmp_path / "pwned"
    r = gpuctl(
        tmp_path, "--via", "slurm", "--device", "cpu", "--job-dir", str(jobs),
        "--nodes", f"{slurm_cluster.node}\n#SBATCH --wrap=touch {pwned}",
        env=slurm_cluster.env,
    )  # fmt: skip
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.startswith(f"gpuctl: --nodes: bad hostlist '{slurm_cluster.node}\\n#SBATCH")
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert not list(jobs.rglob("job.sh")) and slurm_cluster.jobs() == before
    # a partition name from the config is checked the same way
    r = gpuctl(
        tmp_path, "--via", "slurm", "--device", "cpu", "--job-dir", str(jobs),
        config='[accept]\npartition = "debug\\n#SBATCH --wrap=id"\n', env=slurm_cluster.env,
    )  # fmt: skip
    assert r.returncode == 2 and r.stderr.startswith("gpuctl: [accept] partition: bad name")
    assert not list(jobs.rglob("job.sh")) and slurm_cluster.jobs() == before


@pytest.mark.slow
@pytest.mark.slurm
def test_via_slurm_submits_with_the_configs_slurm_conf(
    tmp_path: Path, slurm_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No SLURM_CONF in the environment: the cluster's slurm_conf (and partition) from the
    config reach sbatch and squeue."""
    monkeypatch.delenv("SLURM_CONF", raising=False)
    env = {k: v for k, v in slurm_cluster.env.items() if k != "SLURM_CONF"}
    config = (
        f'[clusters.hpc]\nvia = "srun"\nslurm_conf = "{slurm_cluster.conf_path}"\n'
        f'partition = "{slurm_cluster.partition}"\n'
    )
    jobs = tmp_path / "jobs"
    only_env = [a for s in SECTIONS if s != "env" for a in ("--skip", s)]
    r = gpuctl(
        tmp_path, "--via", "slurm", "--device", "cpu", "--quick", *only_env,
        "--job-dir", str(jobs), "--report-dir", str(tmp_path / "D"), config=config, env=env,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert lines(r)[-1] == "[RESULT] SUCCESS"
    job_id = lines(r)[0].split()[3].rstrip(":")
    script = next(jobs.glob("*/job.sh")).read_text()
    assert f"#SBATCH --partition={slurm_cluster.partition}" in script
    done = Path(slurm_cluster.jobcomp_path).read_text()
    assert f"JobId={job_id} " in done


@pytest.mark.slow
@pytest.mark.slurm
def test_through_slurm_two_nodes_rendezvous_and_report_each(
    tmp_path: Path, slurm_nodes: Any
) -> None:
    """Two nodes of the multi-node test Slurm (each its own network namespace and hostname):
    one torchrun rendezvous across both, one report per node, DDP over four ranks."""
    d = tmp_path / "D"
    r = gpuctl(
        tmp_path, "--via", "slurm", "--device", "cpu", "--quick", "--skip", "train",
        "--skip", "membw", "--nodes", "node[01-02]", "--job-dir", str(tmp_path / "jobs"),
        "--report-dir", str(d), env=slurm_nodes.env,
    )  # fmt: skip
    out = lines(r)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert out[-1] == "[RESULT] SUCCESS"
    script = next((tmp_path / "jobs").glob("*/job.sh")).read_text()
    assert "#SBATCH --nodes=2" in script
    found = reports(d)
    (cluster,) = [rep for rep in found if "nodes" in rep]
    assert cluster["verdict"] == "PASS" and sorted(cluster["nodes"]) == ["node01", "node02"]
    by_node = {rep["node"]: rep for rep in found if "node" in rep}
    assert sorted(by_node) == ["node01", "node02"]
    for name, rep in by_node.items():
        assert rep["sections"]["env"]["hostname"] == name  # ran on that node
        ar = rep["sections"]["ddp_allreduce"]
        assert ar["verdict"] == "PASS" and ar["world_size"] == 4 and ar["topology"] == "2x2"
        assert {r["host"] for r in ar["ranks"]} == {name}
        assert rep["sections"]["ddp_train"]["params_identical"] is True
