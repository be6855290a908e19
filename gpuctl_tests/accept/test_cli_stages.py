"""``gpuctl accept`` with the stages of issue 14 end to end on this machine: ``--burn``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuctl_tests.accept.test_cli import gpuctl, lines, reports

SKIP_REST = tuple(
    a for s in ("compute", "membw", "train", "ddp_allreduce", "ddp_train") for a in ("--skip", s)
)


@pytest.mark.slow
def test_burn_on_the_command_line_runs_the_burner_through_the_agent(tmp_path: Path) -> None:
    d = tmp_path / "reports"
    r = gpuctl(
        tmp_path,
        "--local",
        "--device",
        "cpu",
        "--quick",
        "--no-history",
        "--report-dir",
        str(d),
        "--burn",
        "3s",
        *SKIP_REST,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert any(ln.startswith("[BURN] cpu burner OK:") for ln in lines(r)), r.stdout
    (report,) = reports(d)
    burn = report["sections"]["burn"]
    assert burn["verdict"] == "PASS" and burn["burn_seconds"] == 3.0
    (cpu,) = burn["devices"]
    assert cpu["verdict"] == "OK" and cpu["iterations"] > 0 and cpu["elapsed"] > 1.5
    assert report["options"]["burn"] == 3.0


def test_a_bad_burn_duration_is_one_line(tmp_path: Path) -> None:
    r = gpuctl(tmp_path, "--local", "--device", "cpu", "--burn", "soon")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "--burn 'soon': expected a duration such as 10m, 90s, 1h or 0" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.slurm
def test_through_slurm_the_ddp_job_sweeps_sizes_and_keys_its_topology(
    tmp_path: Path, slurm_cluster: Any
) -> None:
    """The Slurm launch path (one batch job, torchrun per node) carries the size sweep and the
    busbw floor of its topology (2 ranks per node x 1 node)."""
    d = tmp_path / "D"
    r = gpuctl(
        tmp_path, "--via", "slurm", "--device", "cpu", "--quick", "--no-history",
        "--job-dir", str(tmp_path / "jobs"), "--report-dir", str(d),
        "--busbw-floor", "2x1=0.000001", "--skip", "compute", "--skip", "membw",
        "--skip", "train", "--skip", "ddp_train",
        env=slurm_cluster.env,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (report,) = reports(d)
    ar = report["sections"]["ddp_allreduce"]
    assert ar["topology"] == "2x1" and ar["busbw_floor_gbps"] == 0.000001
    reduce = ar["sweep"]["all_reduce"]
    assert reduce[0]["size"] == 8 and reduce[-1]["size"] == 64 << 10  # --quick on a CPU
    assert all(x["wrong"] == 0 for x in reduce + ar["sweep"]["all_gather"])
    assert "# all_reduce: 2 ranks (2x1 = GPUs per node x nodes), gloo" in r.stdout
