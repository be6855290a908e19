"""``--prolog``: the acceptance suite's seconds-long mode for a Slurm prolog or
``HealthCheckProgram`` (#43.3): the GPUs NVML sees, their build and their health, no load and
no torch; always a verdict and an exit code, within its deadline.

The suite runs for real (its own process) over the stand-in NVML through the real nvidia-ml-py,
with a kernel log file; torch is there but must not be imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from gpuctl_tests.helpers import REPO
from gpuctl_tests.node.nvml_stub import NvmlStub, build

# gpu0 idles at PCIe Gen1 (an idle GPU lowers it: not judged without load) but trained to x8
# (judged); gpu1 has uncorrectable ECC errors; gpu2 is throttled by hardware now.
STUB = """
count 3
set 0 curr_pcie_gen 1
set 0 curr_pcie_width 8
set 1 ecc_vol_unc 2
set 2 throttle 0x8
"""


def run_prolog(
    tmp_path: Path, stub_text: str, *extra: str, driver: bool = True
) -> tuple[int, str, dict]:
    """The suite's ``--prolog`` over a stand-in NVML (``driver=False``: one that says no driver
    is loaded): its exit code, stdout and report."""
    stub = NvmlStub(build(tmp_path), tmp_path / "nvml.conf", stub_text)
    log = tmp_path / "kern.log"
    log.write_text("")
    env = stub.env({"PYTHONPATH": str(REPO)})
    if not driver:
        del env["GPUCTL_NVML_STUB"]
    t0 = time.monotonic()
    r = subprocess.run(
        [
            sys.executable,
            "-X",
            "importtime",  # stderr names every module imported: torch must not be one
            "-m",
            "gpuctl.workloads.accept_suite",
            "--prolog",
            "--report-dir",
            str(tmp_path / "reports"),
            "--report-name",
            "r.json",
            "--test-kernel-log",
            str(log),
            "--test-sysfs-root",
            str(tmp_path / "sys"),
            *extra,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    print(f"the prolog took {time.monotonic() - t0:.2f} s")  # a figure, not a check
    report = json.loads((tmp_path / "reports" / "r.json").read_text())
    imported = {line.rsplit("|", 1)[-1].strip() for line in r.stderr.splitlines() if "|" in line}
    assert "torch" not in imported and ("pynvml" in imported or not driver)
    return r.returncode, r.stdout, report


def test_prolog_checks_build_and_health_without_torch_or_load(tmp_path: Path) -> None:
    code, out, report = run_prolog(tmp_path, STUB, "--expect-gpus", "3")
    assert code == 1, out
    assert report["prolog"] is True and report["sections"]["env"]["torch"] is None
    assert report["sections"]["env"]["verdict"] == "PASS"
    assert report["sections"]["env"]["gpu_count"] == 3
    ran = {k for k, v in report["sections"].items() if v["verdict"] != "SKIP"}
    assert ran == {"env", "shape", "health"}
    for name in ("compute", "burn", "ddp_allreduce", "memtest"):
        assert report["sections"][name]["summary"] == "--prolog: no load"
    failures = report["failures"]
    assert "shape gpu0: PCIe x8, capable of x16" in failures  # the width is judged
    assert not any("Gen1" in f for f in failures)  # an idle GPU's generation is not
    assert any(f.startswith("health gpu1:") and "2 uncorrectable ECC" in f for f in failures)
    assert any(f.startswith("health gpu2:") and "throttled now: HWSLOW" in f for f in failures)
    assert out.splitlines()[-1].startswith("[RESULT] FAILURE")


def test_prolog_passes_a_healthy_node_and_fails_a_missing_gpu(tmp_path: Path) -> None:
    code, out, report = run_prolog(tmp_path, "count 2\n", "--expect-gpus", "2")
    assert code == 0, out
    assert out.splitlines()[-1] == "[RESULT] SUCCESS"
    code, out, report = run_prolog(tmp_path / "short", "count 2\n", "--expect-gpus", "3")
    assert code == 1
    assert report["sections"]["env"]["summary"].endswith(
        "2 of 3 GPUs visible (expected: --expect-gpus)"
    )


def test_prolog_without_nvml_fails_in_one_line(tmp_path: Path) -> None:
    """No driver (the stand-in says so without its config): the node must not take jobs."""
    code, out, report = run_prolog(tmp_path, "count 1\n", driver=False)
    assert code == 1
    assert "[ENV] FAIL" in out and "NVML cannot be opened" in out
    assert report["sections"]["shape"]["verdict"] == "SKIP"


def test_prolog_refuses_a_cpu_run() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "gpuctl.workloads.accept_suite", "--prolog", "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert r.returncode == 2 and "--prolog checks the GPUs through NVML" in r.stderr
