"""[SHAPE] and the passive checks of [HEALTH] (kernel-log XIDs, PCIe AER, pending retirements),
read through the real nvidia-ml-py over the stand-in NVML, a kernel log file and a sysfs tree.

No GPU exists here: the suite's NVML reads run against the stub library (the same pynvml calls
as on a node) and the CUDA side is a GPU list, as in ``test_accept_health``.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuctl.workloads.accept_suite import nodehealth
from gpuctl_tests.node.nvml_stub import NvmlStub, build

SCRIPT = r"""
import json, sys
from gpuctl.workloads.accept_suite.nvml import Nvml
from gpuctl.workloads.accept_suite.sections import health, shape
from gpuctl.workloads.accept_suite.suite import Suite, parse_args

nv = Nvml()
assert nv.nv is not None, nv.error
n = nv.nv.nvmlDeviceGetCount()
nv.handles = {i: nv.nv.nvmlDeviceGetHandleByIndex(i) for i in range(n)}
suite = Suite(parse_args(["--device", "cuda", *sys.argv[1:]]), None, None)
suite.nvml = nv
suite.gpus = [{"index": i, "name": "NVIDIA H100 80GB HBM3"} for i in range(n)]
class Lines:
    lines = []
    def line(self, text, section=None):
        self.lines.append(text)
suite.out = Lines()
json.dump({"shape": shape.run(suite), "health": health.run(suite), "lines": Lines.lines,
           "node": suite.node}, sys.stdout)
"""

# Four H100s (stub default: max PCIe Gen5 x16, 18 NVLinks, ECC and persistence on) with:
# gpu1 trained down to Gen3 x8, gpu2 with persistence and ECC off, gpu3 with two NVLinks down
# and a row remapping pending.
STUB = """
count 4
set 1 curr_pcie_gen 3
set 1 curr_pcie_width 8
set 2 persistence 0
set 2 ecc_mode 0
set 3 nvlinks_active 16
set 3 rows_pending 1
"""

# The stub puts GPU i at PCI 0000:(0x18 + 0x10 i):00.0: gpu0 = 18, gpu3 = 48.
KERNEL_LOG = """\
[    2.000000] nvidia: loading out-of-tree module taints kernel.
[ 4242.123456] NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', GPU has fallen off the bus.
[ 4300.000001] NVRM: Xid (PCI:0000:48:00): 13, pid=1234, name=python, Graphics Exception: ESR 0x50
[ 4300.000002] NVRM: Xid (PCI:0000:48:00): 13, pid=1234, name=python, Graphics Exception: ESR 0x51
[ 4400.000000] NVRM: Xid (PCI:0000:c1:00): 48, pid=77, name=other, An uncorrectable double bit error
"""


def _aer(folder: Path, correctable: int, nonfatal: int, fatal: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "aer_dev_correctable").write_text(
        f"RxErr 0\nBadTLP {correctable}\nBadDLLP 0\nRollover 0\nTimeout 0\n"
        f"NonFatalErr 0\nCorrIntErr 0\nHeaderOF 0\nTOTAL_ERR_COR {correctable}\n"
    )
    (folder / "aer_dev_nonfatal").write_text(
        f"Undefined 0\nDLP 0\nSDES 0\nTLP 0\nFCP 0\nCmpltTO {nonfatal}\nCmpltAbrt 0\n"
        f"TOTAL_ERR_NONFATAL {nonfatal}\n"
    )
    (folder / "aer_dev_fatal").write_text(f"Undefined 0\nDLP {fatal}\nTOTAL_ERR_FATAL {fatal}\n")


def sysfs_tree(root: Path, gpu0_nonfatal: int = 2) -> Path:
    """/sys as the kernel lays it out: devices under their root port, bus/pci/devices links."""
    devices = root / "bus" / "pci" / "devices"
    devices.mkdir(parents=True)
    for i in range(4):
        port = root / "devices" / "pci0000:00" / f"0000:00:0{i + 1}.0"
        _aer(port, correctable=5 if i == 0 else 0, nonfatal=0, fatal=0)
        gpu = port / f"0000:{0x18 + 0x10 * i:02x}:00.0"
        _aer(gpu, correctable=0, nonfatal=gpu0_nonfatal if i == 0 else 0, fatal=0)
        (devices / gpu.name).symlink_to(gpu)
    return root


def run_with_stub(
    tmp_path: Path, script: str, stub_text: str, *args: str, timeout: float = 60
) -> dict[str, Any]:
    """Run ``script`` (which prints one JSON line last) over a stub NVML scripted by
    ``stub_text``; returns that JSON."""
    stub = NvmlStub(build(tmp_path), tmp_path / "nvml.conf", stub_text)
    r = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        env=stub.env(),
        timeout=timeout,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


def run_script(tmp_path: Path, stub_text: str, *args: str) -> dict[str, Any]:
    return run_with_stub(tmp_path, SCRIPT, stub_text, *args)


def test_shape_fails_a_gpu_trained_down_persistence_ecc_and_nvlink_naming_gpu_and_figures(
    tmp_path: Path,
) -> None:
    log = tmp_path / "kern.log"
    log.write_text(KERNEL_LOG)
    res = run_script(tmp_path, STUB, "--test-kernel-log", str(log))
    shape = res["shape"]
    g0, g1, g2, g3 = shape["gpus"]
    assert shape["verdict"] == "FAIL"
    assert g0["verdict"] == "PASS" and g0["pci"] == "0000:18:00.0"
    assert (g0["link_gen"], g0["link_width"], g0["nvlinks_active"]) == (5, 16, 18)
    assert g1["verdict"] == "FAIL"
    assert (g1["link_gen"], g1["link_width"], g1["max_link_gen"]) == (3, 8, 5)
    assert "shape gpu1: PCIe x8, capable of x16; PCIe Gen3, capable of Gen5" in shape["failures"]
    assert g2["reason"] == "ECC off; persistence mode off"
    assert g2["ecc_mode"] is False and g2["persistence"] is False
    assert g3["reason"] == "NVLink 16 of 18 links active"
    assert len(shape["failures"]) == 3
    line = "gpu1 NVIDIA H100 80GB HBM3 at 0000:28:00.0: PCIe Gen3 x8 (max Gen5 x16)"
    assert any(x.startswith(line) for x in res["lines"])


def test_a_node_that_lost_a_gpu_fails_shape_with_the_count(tmp_path: Path) -> None:
    """7 of 8 GPUs on the bus (NVML sees the whole node, whatever CUDA is shown): the figure
    and where the 8 came from; with all 8 there, or no expectation, the count passes."""
    res = run_script(tmp_path, "count 7\n", "--expect-gpus", "8", "--expect-source", "gres gpu:8")
    shape = res["shape"]
    assert shape["verdict"] == "FAIL" and shape["nvml_gpu_count"] == 7
    short = f"{res['node']}: 7 of 8 GPUs visible (expected: gres gpu:8)"
    assert shape["failures"] == [f"shape: {short}"]
    assert all(g["verdict"] == "PASS" for g in shape["gpus"])  # the 7 there are fine
    ok = run_script(tmp_path / "eight", "count 8\n", "--expect-gpus", "8")["shape"]
    assert ok["verdict"] == "PASS" and ok["nvml_gpu_count"] == 8
    # inside a Slurm job the job's own count is the expectation
    assert run_script(tmp_path / "none", "count 7\n")["shape"]["verdict"] == "PASS"


def test_health_reads_kernel_log_xids_aer_counters_and_pending_remaps(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(KERNEL_LOG)
    sysfs = sysfs_tree(tmp_path / "sys")
    res = run_script(tmp_path, STUB, "--test-kernel-log", str(log), "--test-sysfs-root", str(sysfs))
    health = res["health"]
    g0, g1, _g2, g3 = health["gpus"]
    assert health["verdict"] == "FAIL" and health["kernel_log"] == str(log)
    # gpu0: XID 79 in the kernel log and two non-fatal AER errors fail; the root port's
    # correctable errors are noted in the same reason.
    assert g0["verdict"] == "FAIL"
    assert [x["xid"] for x in g0["kernel_xids"]] == [79]
    assert g0["aer"]["device"] == {"correctable": 0, "nonfatal": 2, "fatal": 0}
    assert g0["aer"]["port_address"] == "0000:00:01.0" and g0["aer"]["port"]["correctable"] == 5
    assert g0["reason"] == (
        "kernel log XID 79 (GPU has fallen off the bus); PCIe AER 2 nonfatal errors on the GPU"
    )
    assert g1["verdict"] == "PASS" and g1["aer"]["device"]["nonfatal"] == 0
    # gpu3: a pending row remap fails it; XID 13 twice (an application's fault) alone would not.
    assert g3["verdict"] == "FAIL"
    assert g3["reason"] == "row remapping pending (reset the GPU)"
    assert [x["xid"] for x in g3["kernel_xids"]] == [13, 13]
    # An XID of a device that is not under test is reported, not pinned on a GPU.
    assert [(x["pci"], x["xid"]) for x in health["node_xids"]] == [("0000:c1:00", 48)]
    assert any("health gpu0: kernel log XID 79" in f for f in health["failures"])


def test_application_xids_and_correctable_aer_errors_warn(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(KERNEL_LOG.splitlines()[2] + "\n")  # one XID 13 on gpu3
    sysfs = sysfs_tree(tmp_path / "sys", gpu0_nonfatal=0)
    res = run_script(
        tmp_path, "count 4\n", "--test-kernel-log", str(log), "--test-sysfs-root", str(sysfs)
    )
    health = res["health"]
    assert health["verdict"] == "WARN", health["failures"]
    assert health["gpus"][3]["reason"] == "kernel log XID 13"
    assert health["gpus"][0]["reason"] == "PCIe AER 5 correctable errors on the port 0000:00:01.0"
    assert res["shape"]["verdict"] == "PASS"


def test_an_unreadable_kernel_log_is_a_warning_not_a_pass(tmp_path: Path) -> None:
    res = run_script(tmp_path, "count 2\n", "--test-kernel-log", str(tmp_path / "absent"))
    health = res["health"]
    assert health["verdict"] == "WARN"
    assert health["kernel_log"] is None and "No such file" in health["kernel_log_error"]
    assert "XIDs not checked" in health["summary"]


def test_kernel_log_without_root_says_why_for_every_source(tmp_path: Path) -> None:
    """The real sources, read as an unprivileged user on a kernel that restricts dmesg."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run a reader as another user")
    if Path("/proc/sys/kernel/dmesg_restrict").read_text().strip() != "1":
        pytest.skip("kernel.dmesg_restrict is 0: anyone may read the kernel log here")
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv missing")
    nobody = pwd.getpwnam("nobody")
    # The module (standard library only) goes in on stdin: nobody may not read this checkout.
    code = Path(nodehealth.__file__).read_text()
    code += "\nimport json\nprint(json.dumps(kernel_log()))\n"
    r = subprocess.run(
        [
            setpriv,
            f"--reuid={nobody.pw_uid}",
            f"--regid={nobody.pw_gid}",
            "--clear-groups",
            "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable,
            "-I",
            "-",
        ],
        input=code,
        capture_output=True,
        text=True,
        cwd="/",
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    lines, why = json.loads(r.stdout)
    assert lines is None
    assert "dmesg:" in why and "/dev/kmsg: Operation not permitted" in why
    assert "journalctl:" in why


def test_xid_lines_and_pci_addresses_in_every_spelling() -> None:
    xids = nodehealth.parse_xids(
        [
            "NVRM: Xid (PCI:0000:3b:00): 94, pid=9, name=x, Contained: SM (0x1).",
            "kernel: NVRM: Xid (PCI:0001:AF:00.0): 31, pid=5, Ch 00000008, MMU Fault",
            "NVRM: GPU at PCI:0000:3b:00: GPU-abc",
        ]
    )
    assert [(x["pci"], x["xid"], x["hardware"]) for x in xids] == [
        ("0000:3b:00", 94, True),
        ("0001:af:00", 31, False),
    ]
    assert nodehealth.pci_key("00000000:3B:00.0") == "0000:3b:00"
