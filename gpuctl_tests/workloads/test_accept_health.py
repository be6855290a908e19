"""[HEALTH] and [PCIE] link facts read through the real nvidia-ml-py over the stand-in NVML.

A GPU cannot exist here, so the suite's NVML reads run against the stub library the node tests
compile (the same pynvml calls as on a node); the CUDA side is replaced by a GPU list.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from gpuctl_tests.node.nvml_stub import NvmlStub, build

SCRIPT = r"""
import json, sys
from gpuctl.workloads.accept_suite.nvml import Nvml
from gpuctl.workloads.accept_suite.sections import health
from gpuctl.workloads.accept_suite.suite import Suite, parse_args

nv = Nvml()
assert nv.nv is not None, nv.error
nv.handles = {i: nv.nv.nvmlDeviceGetHandleByIndex(i) for i in range(3)}
nv.events = nv.nv.nvmlEventSetCreate()
for h in nv.handles.values():
    nv.nv.nvmlDeviceRegisterEvents(h, 8, nv.events)
nv.start_throttle_watch()
for h in nv.handles.values():  # one utilization read per GPU: the stub's XID becomes due
    nv.nv.nvmlDeviceGetUtilizationRates(h)
import time
deadline = time.monotonic() + 10
while not nv.throttle.get(2) and time.monotonic() < deadline:
    time.sleep(0.05)
nv.stop_throttle_watch()
suite = Suite(parse_args(["--device", "cuda"]), None, None)
suite.nvml = nv
suite.gpus = [{"index": i} for i in range(3)]
class Lines:
    lines = []
    def line(self, text, section=None):
        self.lines.append(text)
suite.out = Lines()
res = health.run(suite)
res["lines"] = Lines.lines
res["pcie0"] = list(nv.pcie(0))
json.dump(res, sys.stdout)
"""

STUB = """
count 3
set 0 ecc_vol_unc 0
set 0 throttle 0x4
set 1 ecc_vol_unc 2
set 1 rows_pending 1
xid 1 79 0
set 2 throttle 0x28
set 0 pcie_gen 5
set 0 pcie_width 16
"""


def test_health_names_ecc_remapping_xid_and_throttling_per_gpu(tmp_path: Path) -> None:
    stub = NvmlStub(build(tmp_path), tmp_path / "nvml.conf", STUB)
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        env=stub.env(),
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    g0, g1, g2 = res["gpus"]
    assert g0["verdict"] == "PASS" and g0["throttle"] == ["sw_power_cap"]  # a cap is normal
    assert g1["verdict"] == "FAIL"
    assert "2 uncorrectable ECC errors" in g1["reason"]
    assert "row remapping pending" in g1["reason"] and "XID 79" in g1["reason"]
    assert g1["xids"] == [79] and g0["xids"] == []
    assert g2["verdict"] == "FAIL" and g2["throttle"] == ["hw_slowdown", "sw_thermal"]
    # the lines the acceptance pane shows and the reason say the screen's names, in its order
    assert g2["reason"] == "throttled during COMPUTE: HWSLOW"
    (line,) = [ln for ln in res["lines"] if ln.startswith("gpu2 ")]
    assert "throttle THERM HWSLOW," in line and "sw_thermal" not in line, line
    assert res["verdict"] == "FAIL" and len(res["failures"]) == 2
    assert res["pcie0"][2:] == [5, 16]  # max link gen/width as NVML reports them


# The links' script: the first one's suite and section, the counters read as [ENV] reads them.
LINKS_SCRIPT = (
    SCRIPT.replace("range(3)", "range(4)")
    .replace('parse_args(["--device", "cuda"])', 'parse_args(["--device", "cuda", *sys.argv[1:]])')
    .replace("res = health.run(suite)", "suite.note_link_errors()\nres = health.run(suite)")
)


def health(tmp_path: Path, script: str, stub_text: str, *args: str) -> dict[str, Any]:
    """The [HEALTH] section's result from ``script`` over a stand-in NVML of ``stub_text``."""
    stub = NvmlStub(build(tmp_path), tmp_path / "nvml.conf", stub_text)
    r = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        env=stub.env(),
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    res: dict[str, Any] = json.loads(r.stdout)
    return res


# Each counter read after the first adds counter_grow: between [ENV] and [HEALTH], gpu0's links
# stay clean, gpu1's NVLink CRC FLIT errors grow by 40 (noted), gpu2's PCIe replays by 500
# (fail), gpu3's NVLink retrains once (a recovery: fail). gpu0 starts with errors from before.
# gpu2's power cap (normal) is what the script's throttle watch waits to have seen.
LINKS_STUB = """
count 4
set 0 nvlink_crc_flit 7000
set 1 nvlink_crc_flit 12
set 1 counter_grow 40
set 2 pcie_replay 1
set 2 throttle 0x4
set 2 counter_grow 500
set 2 nvlinks 0
set 3 nvlink_recovery 3
set 3 counter_grow 1
"""


def test_health_judges_what_the_links_added_during_the_run(tmp_path: Path) -> None:
    g0, g1, g2, g3 = health(tmp_path, LINKS_SCRIPT, LINKS_STUB)["gpus"]
    assert g0["link_errors"] == dict.fromkeys(
        ("replay", "recovery", "crc_flit", "crc_data", "pcie_replay"), 0
    )  # read the same before and after
    assert g0["verdict"] == "PASS"  # 7,000 errors from before the run are not this run's
    assert g1["verdict"] == "WARN" and g1["reason"] == "40 NVLink CRC FLIT errors during the run"
    assert g2["verdict"] == "FAIL" and list(g2["link_errors"]) == ["pcie_replay"]  # no NVLink
    assert g2["reason"] == "500 PCIe replays during the run (more than 100)"
    assert g3["verdict"] == "FAIL"
    assert "1 NVLink recovery during the run (the link retrained)" in g3["reason"]
    g2 = health(tmp_path, LINKS_SCRIPT, LINKS_STUB, "--link-errors", "1000")["gpus"][2]
    assert g2["verdict"] == "WARN" and g2["reason"] == "500 PCIe replays during the run"
