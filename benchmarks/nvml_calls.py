"""What each NVML call the agent makes (or could make) costs on this machine's GPUs.

For every call: wall time and CPU time of this thread per call (median of ``--repeat`` calls
per GPU, a short pause between them, as the agent's 1 Hz loop would make them), and what it
answered on the first GPU (or the NVML error). It decides which fields the agent reads every
sample and which at the slow cadence: a call that blocks (``nvmlDeviceGetPcieThroughput``
samples the link over a window, per NVML's documentation) would hold the agent's loop for that
long per GPU per direction.

Usage (a node with a GPU, the nvidia-ml-py bindings importable):
    python3 benchmarks/nvml_calls.py [--repeat 20] [--pause 0.05]
Stdlib + pynvml only (no gpuctl import): it runs from any copy of the tree.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any


def calls(nv: Any) -> list[tuple[str, Callable[[Any], Any]]]:
    """(name, call on a handle) for each call to time; a name the bindings lack is skipped."""
    out: list[tuple[str, Callable[[Any], Any]]] = [
        ("UtilizationRates", nv.nvmlDeviceGetUtilizationRates),
        ("MemoryInfo", nv.nvmlDeviceGetMemoryInfo),
        ("Temperature", lambda h: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
        ("PowerUsage", nv.nvmlDeviceGetPowerUsage),
        ("EnforcedPowerLimit", nv.nvmlDeviceGetEnforcedPowerLimit),
        ("ClockInfo(SM)", lambda h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
        ("ClockInfo(MEM)", lambda h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)),
        ("PerformanceState", nv.nvmlDeviceGetPerformanceState),
        ("FanSpeed", nv.nvmlDeviceGetFanSpeed),
        ("EncoderUtilization", nv.nvmlDeviceGetEncoderUtilization),
        ("DecoderUtilization", nv.nvmlDeviceGetDecoderUtilization),
        ("ComputeRunningProcesses", nv.nvmlDeviceGetComputeRunningProcesses),
        ("GraphicsRunningProcesses", nv.nvmlDeviceGetGraphicsRunningProcesses),
        ("ProcessUtilization", lambda h: nv.nvmlDeviceGetProcessUtilization(h, 0)),
    ]
    if hasattr(nv, "nvmlDeviceGetCurrentClocksEventReasons"):
        out.append(("ClocksEventReasons", nv.nvmlDeviceGetCurrentClocksEventReasons))
    if hasattr(nv, "NVML_PCIE_UTIL_TX_BYTES"):
        out += [
            (
                "PcieThroughput(TX)",
                lambda h: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES),
            ),
            (
                "PcieThroughput(RX)",
                lambda h: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_RX_BYTES),
            ),
        ]
    return out


def short(value: Any) -> str:
    text = str(value) if hasattr(value, "_fields_") else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=20, help="calls per GPU per call kind")
    p.add_argument("--pause", type=float, default=0.05, help="seconds between two calls")
    a = p.parse_args()
    try:
        import pynvml as nv
    except ImportError:
        print("nvml_calls: pynvml (nvidia-ml-py) is not importable here")
        return 2
    try:
        nv.nvmlInit()
    except Exception as e:
        print(f"nvml_calls: NVML did not start: {e}")
        return 2
    n = nv.nvmlDeviceGetCount()
    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
    print(
        f"# {n} GPU(s): {nv.nvmlDeviceGetName(handles[0]) if n else '-'}, "
        f"driver {nv.nvmlSystemGetDriverVersion()}, {a.repeat} calls per GPU"
    )
    print(f"{'call':26s} {'wall ms':>9s} {'cpu ms':>9s}  first GPU's answer")
    for name, call in calls(nv):
        walls: list[float] = []
        cpus: list[float] = []
        answer: Any = None
        for _ in range(a.repeat):
            for i, h in enumerate(handles):
                w0, c0 = time.perf_counter(), time.thread_time()
                try:
                    value: Any = call(h)
                except Exception as e:
                    value = f"{type(e).__name__}: {e}"
                cpus.append((time.thread_time() - c0) * 1e3)
                walls.append((time.perf_counter() - w0) * 1e3)
                if i == 0 and answer is None:
                    answer = value
            time.sleep(a.pause)
        print(
            f"{name:26s} {statistics.median(walls):9.3f} {statistics.median(cpus):9.3f}  "
            f"{short(answer)}"
        )
    nv.nvmlShutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
