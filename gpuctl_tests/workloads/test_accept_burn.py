"""[BURN]: the sustained burn runs the real torch burner (on the CPU here) while the suite reads
power, SM clock, temperature and throttle reasons once a second through the real nvidia-ml-py
over the stand-in NVML, and judges throttling and clock sag per GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from gpuctl_tests.helpers import need_torch, node_env
from gpuctl_tests.workloads.test_accept_shape import run_with_stub

need_torch(module=True)

SCRIPT = r"""
import json, sys
import torch
from gpuctl.workloads.accept_suite.nvml import Nvml
from gpuctl.workloads.accept_suite.render import summary_table
from gpuctl.workloads.accept_suite.sections import burn
from gpuctl.workloads.accept_suite.suite import Suite, parse_args

nv = Nvml()
assert nv.nv is not None, nv.error
nv.handles = {i: nv.nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nv.nvmlDeviceGetCount())}
suite = Suite(parse_args(["--device", "cpu", *sys.argv[1:]]), None, torch)
suite.nvml = nv
class Lines:
    lines = []
    def line(self, text, section=None):
        self.lines.append(text)
suite.out = Lines()
res = burn.run(suite)
report = {"sections": {"burn": res}}
print(json.dumps({"burn": res, "lines": Lines.lines, "rendered": summary_table(report)}))
"""


def run_burn(tmp_path: Path, stub_text: str, *args: str) -> dict[str, Any]:
    return run_with_stub(tmp_path, SCRIPT, stub_text, *args, timeout=180)


# gpu0 at its power cap (normal under a burn), gpu1 thermally throttled, gpu3's clock sagging.
STUB = """
count 4
set 0 throttle 0x4
set 0 sm_clock 1755
set 1 throttle 0x40
set 1 sm_clock 1740
set 1 temp 91
set 2 sm_clock 1770
set 3 sm_clock 1500
set 3 power_mw 412345
"""


def test_burn_traces_every_gpu_and_fails_throttling_and_a_sagging_clock(tmp_path: Path) -> None:
    out = run_burn(tmp_path, STUB, "--burn", "3s")
    res = out["burn"]
    assert res["verdict"] == "FAIL"
    # the real burner ran and checked its results
    (cpu,) = res["devices"]
    assert cpu["label"] == "cpu" and cpu["verdict"] == "OK" and cpu["iterations"] > 0
    assert cpu["errors"] == 0 and cpu["tflops"]
    trace = res["trace"]
    g0, g1, g2, g3 = trace["gpus"]
    n = len(trace["t"])
    assert n >= 3  # one reading a second for the burn's length (and its start-up)
    assert trace["t"] == sorted(trace["t"]) and trace["t"][-1] >= 2.5
    for g in trace["gpus"]:
        assert len(g["power_w"]) == len(g["sm_clock_mhz"]) == len(g["temp_c"]) == n
    assert set(g3["power_w"]) == {412.3} and set(g1["temp_c"]) == {91}
    assert set(g0["sm_clock_mhz"]) == {1755} and set(g0["throttle"]) == {4}
    assert g0["verdict"] == "PASS"  # a power cap is not a failure
    assert g1["verdict"] == "FAIL" and g1["reason"] == f"throttled HWTHERM for {n} of {n} s"
    assert g2["verdict"] == "PASS"
    # medians 1755, 1740, 1770, 1500: node median 1747.5, MAD 15 -> 5% (87.4 MHz) allowed
    assert res["node_sm_clock_median"] == 1747.5
    assert g3["reason"] == (
        "SM clock 1500 MHz is 14.2% below the node's median 1747.5 MHz (allowed 5.0%)"
    )
    assert res["failures"] == [
        f"burn gpu1: throttled HWTHERM for {n} of {n} s",
        "burn gpu3: SM clock 1500 MHz is 14.2% below the node's median 1747.5 MHz (allowed 5.0%)",
    ]
    # its line in the screen's names: THERM, HWTHERM, PWRCAP (not sw_thermal)
    (line,) = [ln for ln in out["lines"] if ln.startswith("gpu1 ")]
    assert f"throttle HWTHERM {n} s  FAIL" in line, line
    # the rendered report draws the three traces, each GPU with its index as the marker
    rendered = "\n".join(out["rendered"])
    for title in ("[BURN] power (W)", "[BURN] SM clock (MHz)", "[BURN] temperature (C)"):
        assert title in rendered
    assert "3 gpu3" in rendered and "1 gpu1" in rendered  # the plots' legends


def test_the_node_spread_sets_the_clock_bar(tmp_path: Path) -> None:
    """Clocks 1755, 1600, 1900, 1620: median 1687.5, MAD 77.5, so 3 x MAD (13.8%) is the bar and
    1600 MHz (5.2% below) passes where a flat 5% would have failed it."""
    stub = "count 4\nset 0 sm_clock 1755\nset 1 sm_clock 1600\nset 2 sm_clock 1900\n"
    stub += "set 3 sm_clock 1620\n"
    res = run_burn(tmp_path, stub, "--burn", "2s")["burn"]
    assert res["verdict"] == "PASS", res["failures"]
    assert res["node_sm_clock_median"] == 1687.5 and res["sm_clock_allowed_mhz"] == 232.5
    assert "SM clocks within 13.8% of 1687.5 MHz" in res["summary"]


def test_burn_is_skipped_without_a_duration_and_bad_durations_are_one_line() -> None:
    from gpuctl.workloads.accept_suite.sections.burn import parse_duration

    assert [parse_duration(x) for x in ("10m", "90s", "1h", "0", "2.5")] == [
        600.0,
        90.0,
        3600.0,
        0.0,
        2.5,
    ]
    r = subprocess.run(
        [sys.executable, "-m", "gpuctl.workloads.accept_suite", "--device", "cpu", "--burn", "ten"],
        env=node_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert (
        r.stderr.strip()
        .splitlines()[-1]
        .endswith("--burn 'ten': expected a duration such as 10m, 90s, 1h or 0")
    )
