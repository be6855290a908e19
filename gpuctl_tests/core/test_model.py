"""Values from the wire: a number no GPU can report becomes None, never an exception later."""

from __future__ import annotations

from gpuctl.core.model import GpuProcess, GpuSample, GpuStatic, NodeInfo

HUGE = 10**400


def test_huge_and_non_finite_numbers_become_none() -> None:
    g = GpuSample.from_wire(
        {
            "index": 0,
            "util_gpu": HUGE,
            "mem_used": HUGE,
            "mem_total": -HUGE,
            "temp": 2**64,
            "power": HUGE,  # an int where a float goes: beyond any float
            "power_limit": float("inf"),
            "sm_clock": float("nan"),
            "processes": [{"pid": HUGE, "user": "u", "command": "c", "mem": HUGE}],
        },
        0.0,
    )
    assert (g.util_gpu, g.mem_used, g.mem_total, g.temp) == (None, None, None, None)
    assert (g.power, g.power_limit, g.sm_clock) == (None, None, None)
    assert g.processes == (GpuProcess(None, "u", "c", None),)
    # What the rest of the screen does with a sample must not raise.
    assert GpuStatic.from_wire({"mem_total": HUGE, "power_limit": HUGE}).mem_total is None


def test_big_but_real_numbers_stay() -> None:
    g = GpuSample.from_wire(
        {"index": 1, "mem_used": 2**63 - 1, "power": 1e308, "temp": -5, "ecc": {"x": 1}}, 0.0
    )
    assert g.mem_used == 2**63 - 1 and g.power == 1e308 and g.temp == -5
    assert NodeInfo.from_hello({"hostname": "h", "gpus": [{"index": 0}]}).gpus[0].index == 0
