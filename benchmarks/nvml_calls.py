"""NVML library calls and CPU per sample of the NVML reader, over the stand-in library.

Opens ``NvmlReader`` in this process on the stand-in ``libnvidia-ml.so.1`` the tests build with
gcc (real nvidia-ml-py on top), takes samples as the agent does (the slow readings every
``SLOW_EVERY``-th), and prints the device calls the library counted per sample (every function
of the stand-in that checks its handle: ``gpuctl_stub_calls``) and the reader's CPU per sample.
On a stand-in the calls are the honest figure: its functions do no work, so the CPU is pynvml's
and the reader's Python, not a driver's. ``--per-field`` reads the slow readings one call each
(what a driver without ``nvmlDeviceGetFieldValues`` gets, and what the reader did before it
batched them).

Measured on the 2-core login VM (8 GPUs, 600 samples, Python 3.11, nvidia-ml-py 13; 2026-11-29):
                library calls per GPU: all samples  fast  slow   CPU per GPU, slow sample
    batched                            12.1         12.0  13.1   31.2 us
    per-field                          13.0         12.0  22.1   32.7 us
The ECC counters, retired pages and remapped rows were 8 pynvml calls (10 in the library:
pynvml asks the retired pages' count first); batched they are one. On the stand-in the CPU
barely moves (its functions return at once; pynvml's own nvmlDeviceGetFieldValues, which builds
its array per call and tries each id as a tuple first, cost 46 us: the reader keeps its buffer);
on a driver each of the 10 calls is a round trip into it (not measured: no GPU here).

Usage: python3 benchmarks/nvml_calls.py [--gpus 8] [--samples 600] [--per-field]
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpuctl.node.protocol import SLOW_EVERY  # noqa: E402
from gpuctl_tests.node.nvml_stub import CONFIG_ENV, SOURCE, NvmlStub, build  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--samples", type=int, default=600)
    ap.add_argument("--per-field", action="store_true", help="the slow readings one call each")
    args = ap.parse_args()
    source = SOURCE.read_text()
    functions = sorted(set(re.findall(r"^nvmlReturn_t (nvmlDevice\w+)\(", source, re.M)))
    with tempfile.TemporaryDirectory() as tmp:
        stub = NvmlStub(build(Path(tmp)), Path(tmp) / "nvml.conf", f"count {args.gpus}\n")
        stub.preload()
        os.environ[CONFIG_ENV] = str(stub.config)
        from gpuctl.node.readers.nvml import NvmlReader

        reader = NvmlReader.open()
        reader.batched = not args.per_field
        before = sum(stub.calls(g, fn) for g in range(args.gpus) for fn in functions)
        cpu = {True: 0, False: 0}
        calls = {True: 0, False: 0}
        count = {True: 0, False: 0}
        for k in range(args.samples):
            slow = k % SLOW_EVERY == 0
            c0 = time.thread_time_ns()
            reader.sample(slow=slow)
            cpu[slow] += time.thread_time_ns() - c0
            after = sum(stub.calls(g, fn) for g in range(args.gpus) for fn in functions)
            calls[slow] += after - before
            count[slow] += 1
            before = after
        reader.close()
    total = args.gpus * args.samples
    how = "per-field" if args.per_field else "batched"
    print(f"{how}: {args.gpus} GPUs, {args.samples} samples")
    print(f"  library calls per GPU-sample   {(calls[True] + calls[False]) / total:6.1f}")
    for slow in (False, True):
        n = count[slow] * args.gpus
        print(
            f"  {'slow' if slow else 'fast'} samples: calls per GPU {calls[slow] / n:6.1f}, "
            f"CPU per GPU {cpu[slow] / n / 1e3:7.1f} us"
        )
    per_sample = (cpu[True] + cpu[False]) / args.samples / 1e3
    print(f"  CPU per sample (all GPUs)      {per_sample:7.1f} us")


if __name__ == "__main__":
    main()
