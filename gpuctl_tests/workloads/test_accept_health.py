"""[HEALTH] and [PCIE] link facts read through the real nvidia-ml-py over the stand-in NVML.

A GPU cannot exist here, so the suite's NVML reads run against the stub library the node tests
compile (the same pynvml calls as on a node); the CUDA side is replaced by a GPU list.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
