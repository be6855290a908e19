"""What each NVML call of a sample costs on a real GPU: wall and CPU time per call, median.

Decides which readings of ``gpuctl/node/metrics.py`` are read every sample and which are
``slow``. Calls libnvidia-ml.so.1 through ctypes (no pynvml needed; pynvml adds its own
Python overhead on top, the same for every call). Needs a GPU.

Measured on an H100 80GB HBM3, driver 580.159.04, 200 calls each (median):
    nvmlDeviceGetUtilizationRates, Temperature, PowerUsage, ClockInfo, PerformanceState,
    CurrentClocksEventReasons                 2.5 us wall, 1.6 us CPU
    nvmlDeviceGetMemoryInfo                   8.4 us wall, 7.5 us CPU
    nvmlDeviceGetFanSpeed (NOT_SUPPORTED)   160 us wall, 159 us CPU (asked once: nvml.py)
    nvmlDeviceGetEncoderUtilization, DecoderUtilization   2.5 us wall, 1.7 us CPU: per sample
    nvmlDeviceGetPcieThroughput (TX or RX)  21 ms wall, 0.9 ms CPU: it samples 20 ms itself,
                                            so the reader spreads it (``slow``)

Usage: python3 benchmarks/nvml_call_cost.py [--calls 200] [--gpu 0]
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--gpu", type=int, default=0)
    args = ap.parse_args()
    lib = ctypes.CDLL("libnvidia-ml.so.1")
    lib.nvmlInit_v2()
    h = ctypes.c_void_p()
    lib.nvmlDeviceGetHandleByIndex_v2(args.gpu, ctypes.byref(h))
    util, mem = (ctypes.c_uint * 4)(), (ctypes.c_ulonglong * 4)()
    v, period, mask, state = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_ulonglong(), ctypes.c_int()
    ref = ctypes.byref
    calls: list[tuple[str, tuple[object, ...]]] = [
        ("nvmlDeviceGetUtilizationRates", (h, util)),
        ("nvmlDeviceGetMemoryInfo", (h, mem)),
        ("nvmlDeviceGetTemperature", (h, 0, ref(v))),
        ("nvmlDeviceGetPowerUsage", (h, ref(v))),
        ("nvmlDeviceGetClockInfo", (h, 1, ref(v))),
        ("nvmlDeviceGetPerformanceState", (h, ref(state))),
        ("nvmlDeviceGetCurrentClocksEventReasons", (h, ref(mask))),
        ("nvmlDeviceGetFanSpeed", (h, ref(v))),
        ("nvmlDeviceGetEncoderUtilization", (h, ref(v), ref(period))),
        ("nvmlDeviceGetDecoderUtilization", (h, ref(v), ref(period))),
        ("nvmlDeviceGetPcieThroughput", (h, 0, ref(v))),
        ("nvmlDeviceGetPcieThroughput", (h, 1, ref(v))),
    ]
    print(f"{'call':<44} {'wall us':>9} {'cpu us':>8}  rc")
    for name, call_args in calls:
        fn = getattr(lib, name)
        walls, cpus, rc = [], [], 0
        for _ in range(args.calls):
            w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
            rc = fn(*call_args)
            cpus.append(time.thread_time_ns() - c0)
            walls.append(time.perf_counter_ns() - w0)
        print(
            f"{name:<44} {statistics.median(walls) / 1e3:9.1f} "
            f"{statistics.median(cpus) / 1e3:8.1f}  {rc}"
        )
    lib.nvmlShutdown()


if __name__ == "__main__":
    main()
