"""The single-node acceptance suite: sections, verdicts, the JSON report and the result line.

``python -m gpuctl.workloads.accept [--quick] [--device cuda|cpu] [--report-dir D] ...``

Every section returns a dict with ``verdict`` and ``summary`` (see ``schema``). Human lines go to
stdout prefixed with the section marker; ``[RESULT] SUCCESS`` or ``[RESULT] FAILURE: [...]`` is
always the last stdout line and the exit code is 0 or 1. With ``--events PATH`` (or
``--events-fd N``) the same progress is written as JSON lines for gpuctl to relay.

Faults of the predecessor's suite that this one avoids on purpose: no GPU is a failure (unless
``--allow-no-gpu``), throughput is judged (floor fraction of the datasheet peak and the
same-model rule), training runs a fixed number of steps and must cut the loss by a threshold, and
the all-reduce buffer is refilled before every collective.
"""

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback

from gpuctl.node.proc import spawn, stop_group

from . import peaks
from .render import summary_table
from .schema import (
    MARKERS,
    RESULT_FAILURE,
    RESULT_SUCCESS,
    SCHEMA,
    SCHEMA_VERSION,
    SECTIONS,
)
from .smoke import tiny_mlp, train_steps

DTYPES = ("fp32", "tf32", "bf16", "fp16")
BAD_THROTTLE = ("hw_slowdown", "hw_thermal", "hw_power_brake")
WARN_THROTTLE = ("sw_thermal",)
XID_CRITICAL = 0x0000000000000008  # nvmlEventTypeXidCriticalError
DDP_GRACE_S = 10.0  # torchrun's SIGTERM -> SIGKILL


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m gpuctl.workloads.accept",
        description="Acceptance suite of one node: prints [RESULT] and writes a JSON report.",
    )
    p.add_argument("--quick", action="store_true", help="short runs (seconds, not minutes)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--report-dir", default=".", help="folder for the JSON report")
    p.add_argument(
        "--report-name", help="report file name, {node} is replaced (default accept-NODE-TIME.json)"
    )
    p.add_argument("--node-name", help="node name in the report (default: Slurm's or hostname)")
    p.add_argument("--expect-gpus", type=int, help="fail when fewer GPUs are visible")
    p.add_argument("--allow-no-gpu", action="store_true", help="no GPU is a SKIP, not a failure")
    p.add_argument("--floor", type=float, default=0.6, help="minimum fraction of peak TFLOP/s")
    p.add_argument(
        "--same-model-tolerance",
        type=float,
        default=0.10,
        help="a GPU may be this fraction below the best GPU of its model",
    )
    p.add_argument("--membw-floor", type=float, default=0.5, help="minimum fraction of spec GB/s")
    p.add_argument("--pcie-floor", type=float, default=0.4, help="minimum fraction of link GB/s")
    p.add_argument(
        "--loss-drop",
        type=float,
        default=0.5,
        help="training must cut the loss by this fraction of the first batch's",
    )
    p.add_argument("--dtypes", default="fp32,tf32,bf16", help=f"comma list of {','.join(DTYPES)}")
    p.add_argument(
        "--ddp-procs", type=int, help="DDP processes on this node (default: GPUs, 2 on CPU)"
    )
    p.add_argument("--ddp-nnodes", type=int, default=1, help="nodes in the DDP job")
    p.add_argument("--rdzv-endpoint", help="HOST:PORT of the c10d rendezvous (default: local)")
    p.add_argument("--rdzv-id", default=None, help="rendezvous id shared by all nodes")
    p.add_argument("--ddp-timeout", type=float, help="seconds before DDP is declared hung")
    p.add_argument("--skip", action="append", default=[], choices=SECTIONS, help="skip a section")
    p.add_argument("--events", help="append JSON progress lines to this file ({node}: node name)")
    p.add_argument("--events-fd", type=int, help="write JSON progress lines to this descriptor")
    p.add_argument("--test-break-rank", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--test-slow-compute", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    bad = [d for d in dtypes if d not in DTYPES]
    if bad or not dtypes:
        p.error(f"--dtypes: unknown {','.join(bad) or 'empty'} (known: {','.join(DTYPES)})")
    args.dtypes = dtypes
    if not 0 < args.floor <= 1:
        p.error("--floor must be within (0, 1]")
    if args.test_slow_compute < 1:
        p.error("--test-slow-compute must be >= 1")
    return args


class Output:
    """Human lines on stdout, JSON progress events on an optional stream."""

    def __init__(self, events_path=None, events_fd=None):
        self.events = None
        if events_fd is not None:
            self.events = os.fdopen(events_fd, "w", buffering=1)
        elif events_path:
            os.makedirs(os.path.dirname(os.path.abspath(events_path)), exist_ok=True)
            self.events = open(events_path, "a", buffering=1)  # noqa: SIM115 (lives as long as the run)
        self.section = None

    def event(self, **fields):
        if self.events is None:
            return
        fields.setdefault("t", time.time())
        try:
            self.events.write(f"{json.dumps(fields, default=str)}\n")
        except (OSError, ValueError):
            self.events = None  # the reader went away; stdout still carries everything

    def line(self, text, section=None):
        section = section or self.section
        marker = f"[{MARKERS[section]}] " if section else ""
        sys.stdout.write(f"{marker}{text}\n")
        sys.stdout.flush()
        self.event(event="line", section=section, text=marker + text)

    def close(self):
        if self.events is not None:
            with contextlib.suppress(OSError):
                self.events.close()


# -- NVML (optional): names, health counters, XID events, throttle sampling ---------------------
class Nvml:
    """What the suite reads from NVML; every method degrades to None when NVML cannot answer."""

    def __init__(self):
        self.nv = None
        self.error = None
        self.handles = {}  # CUDA index -> NVML handle
        self.events = None
        self.xids = {}
        self.throttle = {}
        self._stop = threading.Event()
        self._thread = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nv = pynvml
        except Exception as e:  # ImportError, NVMLError, missing libnvidia-ml
            self.error = f"{type(e).__name__}: {e}"

    def _call(self, fn, *args):
        try:
            return fn(*args)
        except Exception:
            return None

    def map_devices(self, torch, count):
        """Match CUDA devices to NVML handles by UUID (CUDA_VISIBLE_DEVICES reorders them)."""
        if self.nv is None:
            return
        for i in range(count):
            props = torch.cuda.get_device_properties(i)
            uuid = getattr(props, "uuid", None)
            handle = None
            if uuid is not None:
                text = str(uuid)
                if not text.startswith("GPU-"):
                    text = f"GPU-{text}"
                handle = self._call(self.nv.nvmlDeviceGetHandleByUUID, text)
            if handle is None and "CUDA_VISIBLE_DEVICES" not in os.environ:
                handle = self._call(self.nv.nvmlDeviceGetHandleByIndex, i)
            if handle is not None:
                self.handles[i] = handle
        self.events = self._call(self.nv.nvmlEventSetCreate)
        if self.events is not None:
            for h in self.handles.values():
                self._call(self.nv.nvmlDeviceRegisterEvents, h, XID_CRITICAL, self.events)

    def driver(self):
        if self.nv is None:
            return None
        v = self._call(self.nv.nvmlSystemGetDriverVersion)
        return v.decode() if isinstance(v, bytes) else v

    def uuid(self, i):
        h = self.handles.get(i)
        v = self._call(self.nv.nvmlDeviceGetUUID, h) if h is not None else None
        return v.decode() if isinstance(v, bytes) else v

    def pcie(self, i):
        """(current gen, current width, max gen, max width) of GPU i, each None if unknown."""
        h = self.handles.get(i)
        if h is None:
            return None, None, None, None
        nv = self.nv
        return (
            self._call(nv.nvmlDeviceGetCurrPcieLinkGeneration, h),
            self._call(nv.nvmlDeviceGetCurrPcieLinkWidth, h),
            self._call(nv.nvmlDeviceGetMaxPcieLinkGeneration, h),
            self._call(nv.nvmlDeviceGetMaxPcieLinkWidth, h),
        )

    def poll_xids(self):
        """Drain the XID events NVML queued since ENV (timeout 0: never waits)."""
        if self.events is None:
            return
        wait = getattr(self.nv, "nvmlEventSetWait_v2", None) or self.nv.nvmlEventSetWait
        nvml_index = {self._call(self.nv.nvmlDeviceGetIndex, h): i for i, h in self.handles.items()}
        for _ in range(10000):  # bounded: a storm of events must not hang the suite
            data = self._call(wait, self.events, 0)
            if data is None:
                return
            gpu = nvml_index.get(self._call(self.nv.nvmlDeviceGetIndex, data.device))
            self.xids.setdefault(gpu, []).append(int(data.eventData))

    def _sample_throttle(self):
        from gpuctl.node.protocol import decode_throttle

        # Newer NVML names them "clock event reasons"; the bits are the same.
        read = (
            getattr(self.nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or self.nv.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        while not self._stop.wait(0.2):
            for i, h in self.handles.items():
                for name in decode_throttle(self._call(read, h)) or ():
                    self.throttle.setdefault(i, set()).add(name)

    def start_throttle_watch(self):
        if self.nv is None or not self.handles:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._sample_throttle, daemon=True)
        self._thread.start()

    def stop_throttle_watch(self):
        if self._thread is not None:
            self._stop.set()
            self._thread.join(2.0)
            self._thread = None

    def health(self, i):
        """ECC and remapped-row counters of GPU i (None where unsupported)."""
        h = self.handles.get(i)
        out = {
            "ecc_uncorrected_volatile": None,
            "ecc_uncorrected_aggregate": None,
            "remapped_rows": None,
        }
        if h is None:
            return out
        nv = self.nv
        out["ecc_uncorrected_volatile"] = self._call(
            nv.nvmlDeviceGetTotalEccErrors,
            h,
            nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            nv.NVML_VOLATILE_ECC,
        )
        out["ecc_uncorrected_aggregate"] = self._call(
            nv.nvmlDeviceGetTotalEccErrors,
            h,
            nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            nv.NVML_AGGREGATE_ECC,
        )
        rows = self._call(nv.nvmlDeviceGetRemappedRows, h)
        if rows is not None:
            corr, unc, pending, failure = rows
            out["remapped_rows"] = {
                "correctable": corr,
                "uncorrectable": unc,
                "pending": bool(pending),
                "failure": bool(failure),
            }
        return out

    def close(self):
        self.stop_throttle_watch()
        if self.nv is not None:
            if self.events is not None:
                self._call(self.nv.nvmlEventSetFree, self.events)
            self._call(self.nv.nvmlShutdown)


# -- the suite ----------------------------------------------------------------------------------
class Suite:
    def __init__(self, args, out, torch):
        self.args = args
        self.out = out
        self.torch = torch
        self.cuda = args.device == "cuda"
        self.nvml = None
        self.gpus = []  # [{index, name, ...}] for CUDA, [] on CPU
        self.no_gpu = False
        self.node = args.node_name or os.environ.get("SLURMD_NODENAME") or socket.gethostname()

    # helpers ------------------------------------------------------------------------------------
    def devices(self):
        """(label, torch.device, name) of each device under test."""
        if self.cuda:
            return [
                (f"gpu{int(g['index'])}", self.torch.device("cuda", g["index"]), g["name"])
                for g in self.gpus
            ]
        return [("cpu", self.torch.device("cpu"), "cpu")]

    def sync(self, device):
        if device.type == "cuda":
            self.torch.cuda.synchronize(device)

    def timer(self, device):
        """start(), stop() -> seconds: CUDA events on a GPU, perf_counter on the CPU."""
        torch = self.torch
        if device.type == "cuda":
            # Events record on the current device's stream: make it the one being measured.
            torch.cuda.set_device(device)
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)

            def begin():
                start.record()

            def finish():
                end.record()
                end.synchronize()
                return start.elapsed_time(end) / 1000.0

            return begin, finish
        state = {}

        def begin_cpu():
            state["t"] = time.perf_counter()

        def finish_cpu():
            return time.perf_counter() - state["t"]

        return begin_cpu, finish_cpu

    # ENV ----------------------------------------------------------------------------------------
    def section_env(self):
        torch = self.torch
        a = self.args
        info = {
            "hostname": socket.gethostname(),
            "node": self.node,
            "python": ".".join(str(v) for v in sys.version_info[:3]),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "driver": None,
            "nccl": None,
            "gpu_count": 0,
            "expected_gpus": None,
            "gpus": [],
            "nvidia_smi_l": [],
            "cpu_threads": torch.get_num_threads(),
        }
        self.out.line(
            f"host {info['hostname']} (node {self.node}), Python {info['python']}, "
            f"torch {info['torch']}, CUDA {info['cuda']}"
        )
        if not self.cuda:
            info["verdict"] = "PASS"
            info["summary"] = (
                f"CPU run ({int(info['cpu_threads'])} threads): judged on correctness, not on peaks"
            )
            self.out.line(info["summary"])
            return info
        expected = a.expect_gpus
        if expected is None:
            slurm = os.environ.get("SLURM_GPUS_ON_NODE")
            if slurm and slurm.isdigit():
                expected = int(slurm)
        info["expected_gpus"] = expected
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        info["gpu_count"] = count
        if count == 0:
            why = "torch.cuda.is_available() is False"
            if torch.version.cuda is None:
                why = f"this torch is a CPU-only build ({torch.__version__})"
            self.no_gpu = True
            if a.allow_no_gpu:
                info["verdict"] = "SKIP"
                info["summary"] = f"no GPU found ({why}); --allow-no-gpu: GPU sections skipped"
            else:
                info["verdict"] = "FAIL"
                info["summary"] = f"no GPU found ({why}); pass --allow-no-gpu to skip"
            self.out.line(info["summary"])
            return info
        self.nvml = Nvml()
        self.nvml.map_devices(torch, count)
        info["driver"] = self.nvml.driver()
        try:
            v = torch.cuda.nccl.version()
            info["nccl"] = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
        except Exception:
            info["nccl"] = None
        for i in range(count):
            props = torch.cuda.get_device_properties(i)
            uuid = self.nvml.uuid(i) or (str(props.uuid) if getattr(props, "uuid", None) else None)
            g = {
                "index": i,
                "name": props.name,
                "uuid": uuid,
                "model_key": peaks.model_key(props.name),
                "memory_bytes": props.total_memory,
                "capability": f"{int(props.major)}.{int(props.minor)}",
            }
            info["gpus"].append(g)
            info["nvidia_smi_l"].append(f"GPU {i}: {props.name} (UUID: {uuid})")
        self.gpus = info["gpus"]
        for line in info["nvidia_smi_l"]:
            self.out.line(line)
        self.out.line(
            f"driver {info['driver']}, NCCL {info['nccl']}, "
            f"NVML {'ok' if self.nvml.nv else self.nvml.error}"
        )
        if expected is not None and count < expected:
            info["verdict"] = "FAIL"
            info["summary"] = f"{int(count)} GPUs visible, {int(expected)} expected"
        else:
            models = sorted(set(g["name"] for g in self.gpus))
            info["verdict"] = "PASS"
            info["summary"] = f"{int(count)} GPU(s): {', '.join(models)}, driver {info['driver']}"
        self.out.line(info["summary"])
        return info

    # COMPUTE ------------------------------------------------------------------------------------
    def gemm_size(self):
        if self.cuda:
            return 8192
        return 512 if self.args.quick else 1024

    def measure_gemm(self, device, dtype, n, min_seconds, slow=1):
        """Time C = A @ B on preallocated matrices; returns figures and the result check.

        ``slow`` (test option) runs each timed product that many times while counting it once.
        """
        torch = self.torch
        tdtype = {
            "fp32": torch.float32,
            "tf32": torch.float32,
            "bf16": torch.bfloat16,
            "fp16": torch.float16,
        }[dtype]
        gen = torch.Generator(device=device).manual_seed(42)
        a = torch.rand(n, n, generator=gen, device=device, dtype=torch.float32).sub_(0.5).to(tdtype)
        b = torch.rand(n, n, generator=gen, device=device, dtype=torch.float32).sub_(0.5).to(tdtype)
        c = torch.empty(n, n, device=device, dtype=tdtype)
        first = torch.empty_like(c)
        old_tf32 = None
        if device.type == "cuda":
            old_tf32 = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
        try:
            torch.mm(a, b, out=first)
            for _ in range(2):  # warm-up: kernels chosen, clocks up
                torch.mm(a, b, out=c)
            begin, finish = self.timer(device)
            begin()
            torch.mm(a, b, out=c)
            one = max(finish(), 1e-6)
            if device.type == "cuda":  # let clocks and power settle before the timed loop
                for _ in range(int(min(10000, 0.5 * min_seconds / one))):
                    torch.mm(a, b, out=c)
            iters = int(min(10000, max(3, min_seconds / one)))
            begin()
            for _ in range(iters):
                for _ in range(slow):
                    torch.mm(a, b, out=c)
            seconds = finish()
            check = self.check_gemm(a, b, c, first, dtype)
        finally:
            if old_tf32 is not None:
                torch.backends.cuda.matmul.allow_tf32 = old_tf32
        tflops = 2.0 * n**3 * iters / seconds / 1e12
        return {
            "dtype": dtype,
            "n": n,
            "iters": iters,
            "seconds": seconds,
            "tflops": tflops,
            "check": check,
        }

    def check_gemm(self, a, b, c, first, dtype):
        """None when C is right: finite, identical to the first product, close to float64."""
        torch = self.torch
        if not bool(torch.isfinite(c).all()):
            return "result has NaN or Inf"
        if not torch.equal(c, first):
            diff = int((c != first).sum().item())
            return f"repeated product differs from the first in {int(diff)} elements"
        rows = min(16, a.shape[0])
        ref = a[:rows].double() @ b.double()
        err = float((c[:rows].double() - ref).norm() / ref.norm().clamp_min(1e-30))
        tol = {"fp32": 1e-4, "tf32": 5e-3, "bf16": 2e-2, "fp16": 5e-3}[dtype]
        if err > tol:
            return f"relative error {err:.2e} against float64 exceeds {tol:.0e}"
        return None

    def section_compute(self):
        a = self.args
        min_seconds = (0.5 if a.quick else 3.0) if self.cuda else (0.25 if a.quick else 1.0)
        if self.nvml is not None:
            self.nvml.start_throttle_watch()
        devices = []
        try:
            for label, device, name in self.devices():
                entry = {
                    "index": device.index if self.cuda else None,
                    "label": label,
                    "name": name,
                    "model_key": peaks.model_key(name) if self.cuda else None,
                    "results": [],
                }
                devices.append(entry)
                for dtype in a.dtypes:
                    r = self.compute_one(device, name, dtype, min_seconds)
                    entry["results"].append(r)
                    self.out.line(self.compute_line(label, r))
        finally:
            if self.nvml is not None:
                self.nvml.stop_throttle_watch()
        self.judge_same_model(devices)
        failures = []
        for d in devices:
            for r in d["results"]:
                if r["verdict"] == "FAIL":
                    failures.append(f"compute {d['label']} {r['dtype']}: {r['reason']}")
        best = {}
        for d in devices:
            for r in d["results"]:
                if r.get("tflops"):
                    best[r["dtype"]] = max(best.get(r["dtype"], 0.0), r["tflops"])
        summary = ", ".join(f"{k} {v:.3g} TFLOP/s" for k, v in best.items()) or "nothing ran"
        return {
            "verdict": "FAIL" if failures else "PASS",
            "summary": summary,
            "devices": devices,
            "floor": a.floor,
            "same_model_tolerance": a.same_model_tolerance,
            "failures": failures,
        }

    def compute_one(self, device, name, dtype, min_seconds):
        torch = self.torch
        base = {
            "dtype": dtype,
            "n": None,
            "iters": None,
            "seconds": None,
            "tflops": None,
            "peak_tflops": None,
            "fraction": None,
            "check": None,
            "reason": None,
        }
        if device.type == "cpu" and dtype == "tf32":
            return dict(base, verdict="SKIP", reason="no TF32 on the CPU")
        if device.type == "cuda" and (
            not peaks.has_unit(name, dtype)
            or (dtype == "bf16" and not torch.cuda.is_bf16_supported())
        ):
            return dict(base, verdict="SKIP", reason=f"{name} has no {dtype} unit")
        r = dict(base)
        r.update(
            self.measure_gemm(
                device, dtype, self.gemm_size(), min_seconds, self.args.test_slow_compute
            )
        )
        if r["check"] is not None:
            return dict(r, verdict="FAIL", reason=f"wrong result: {r['check']}")
        if device.type == "cpu":
            return dict(r, verdict="PASS", reason="result checked (CPU: no peak judged)")
        peak = peaks.peak_tflops(name, dtype)
        r["peak_tflops"] = peak
        if peak is None:
            return dict(r, verdict="PASS", reason=f"no reference peak for {name}")
        r["fraction"] = r["tflops"] / peak
        if r["fraction"] < self.args.floor:
            return dict(
                r,
                verdict="FAIL",
                reason=f"{r['tflops']:.1f} TFLOP/s is {r['fraction']:.2f} of the {peak:g} peak "
                f"(floor {self.args.floor:.2f})",
            )
        return dict(r, verdict="PASS")

    def judge_same_model(self, devices):
        """A GPU more than the tolerance below the best GPU of its model on this node fails."""
        tol = self.args.same_model_tolerance
        groups = {}
        for d in devices:
            for r in d["results"]:
                if r.get("tflops"):
                    groups.setdefault((d["name"], r["dtype"]), []).append((d, r))
        for (_name, _dtype), members in groups.items():
            if len(members) < 2:
                continue
            best = max(r["tflops"] for _, r in members)
            for d, r in members:
                if r["tflops"] < (1.0 - tol) * best and r["verdict"] != "FAIL":
                    r["verdict"] = "FAIL"
                    r["reason"] = (
                        f"{r['tflops']:.1f} TFLOP/s is {100 * (1 - r['tflops'] / best):.0f}% "
                        f"below the best {d['name']} here ({best:.1f})"
                    )

    @staticmethod
    def compute_line(label, r):
        if r["tflops"] is None:
            return f"{label} {r['dtype']:4} {r['verdict']}: {r['reason']}"
        frac = f" = {r['fraction']:.2f} of {r['peak_tflops']:g}" if r["fraction"] else ""
        why = f" ({r['reason']})" if r.get("reason") else ""
        return f"{label} {r['dtype']:4} {r['tflops']:8.3f} TFLOP/s{frac}  {r['verdict']}{why}"

    # MEMBW --------------------------------------------------------------------------------------
    def section_membw(self):
        torch = self.torch
        a = self.args
        results, failures = [], []
        for label, device, name in self.devices():
            if self.cuda:
                free, _total = torch.cuda.mem_get_info(device)
                nbytes = min((512 << 20) if a.quick else (2 << 30), free // 4)
            else:
                nbytes = (64 << 20) if a.quick else (256 << 20)
            numel = nbytes // 4
            src = torch.arange(numel, device=device, dtype=torch.int32)
            dst = torch.empty_like(src)
            dst.copy_(src)
            begin, finish = self.timer(device)
            begin()
            dst.copy_(src)
            one = max(finish(), 1e-6)
            iters = int(min(1000, max(3, (0.3 if a.quick else 2.0) / one)))
            dst.zero_()
            begin()
            for _ in range(iters):
                dst.copy_(src)
            seconds = finish()
            gbps = 2.0 * nbytes * iters / seconds / 1e9  # each byte read once and written once
            r = {
                "index": device.index,
                "label": label,
                "name": name,
                "bytes": nbytes,
                "iters": iters,
                "gbps": gbps,
                "peak_gbps": None,
                "fraction": None,
                "verdict": "PASS",
                "reason": None,
            }
            if not torch.equal(dst, src):
                r["verdict"], r["reason"] = "FAIL", "copy differs from its source"
            elif self.cuda:
                peak = peaks.peak_membw(name)
                r["peak_gbps"] = peak
                if peak:
                    r["fraction"] = gbps / peak
                    if r["fraction"] < a.membw_floor:
                        r["verdict"] = "FAIL"
                        r["reason"] = (
                            f"{gbps:.0f} GB/s is {r['fraction']:.2f} of the {peak:g} GB/s spec "
                            f"(floor {a.membw_floor:.2f})"
                        )
            del src, dst
            results.append(r)
            frac = f" = {r['fraction']:.2f} of {r['peak_gbps']:g}" if r["fraction"] else ""
            self.out.line(
                "{} copy {:.1f} GB/s{}  {}{}".format(
                    label,
                    gbps,
                    frac,
                    r["verdict"],
                    " ({})".format(r["reason"]) if r["reason"] else "",
                )
            )
            if r["verdict"] == "FAIL":
                failures.append(f"membw {label}: {r['reason']}")
        summary = ", ".join(f"{r['label']} {r['gbps']:.1f} GB/s" for r in results)
        return {
            "verdict": "FAIL" if failures else "PASS",
            "summary": summary,
            "devices": results,
            "floor": a.membw_floor,
            "failures": failures,
        }

    # PCIE ---------------------------------------------------------------------------------------
    def section_pcie(self):
        if not self.cuda:
            return {"verdict": "SKIP", "summary": "no host-device link on a CPU run", "devices": []}
        torch = self.torch
        a = self.args
        nbytes = (256 << 20) if a.quick else (1 << 30)
        host = torch.empty(nbytes // 4, dtype=torch.int32).pin_memory()
        host.copy_(torch.arange(nbytes // 4, dtype=torch.int32))
        back = torch.empty_like(host).pin_memory()
        results, failures = [], []
        for label, device, _name in self.devices():
            dev = torch.empty(nbytes // 4, dtype=torch.int32, device=device)
            dev.copy_(host, non_blocking=True)
            self.sync(device)
            iters = 3 if a.quick else 10
            figures = {}
            with torch.cuda.device(device):
                for direction, dst, src in (("h2d", dev, host), ("d2h", back, dev)):
                    begin, finish = self.timer(device)
                    begin()
                    for _ in range(iters):
                        dst.copy_(src, non_blocking=True)
                    figures[direction] = nbytes * iters / finish() / 1e9
            gen, width, max_gen, max_width = (
                self.nvml.pcie(device.index) if self.nvml else (None,) * 4
            )
            peak = peaks.pcie_peak(gen, width)
            r = {
                "index": device.index,
                "label": label,
                "h2d_gbps": figures["h2d"],
                "d2h_gbps": figures["d2h"],
                "link_gen": gen,
                "link_width": width,
                "max_link_gen": max_gen,
                "max_link_width": max_width,
                "peak_gbps": peak,
                "fraction": None,
                "verdict": "PASS",
                "reason": None,
            }
            if not torch.equal(back, host):
                r["verdict"], r["reason"] = "FAIL", "data changed on the round trip"
            elif peak:
                r["fraction"] = min(figures.values()) / peak
                if r["fraction"] < a.pcie_floor:
                    r["verdict"] = "FAIL"
                    r["reason"] = (
                        f"{min(figures.values()):.1f} GB/s is {r['fraction']:.2f} of gen{gen} "
                        f"x{width} ({peak:.1f} GB/s; floor {a.pcie_floor:.2f})"
                    )
                elif max_gen and max_width and (gen, width) < (max_gen, max_width):
                    r["verdict"] = "WARN"
                    r["reason"] = (
                        f"link runs gen{gen} x{width}, the GPU supports gen{max_gen} x{max_width}"
                    )
            del dev
            results.append(r)
            self.out.line(
                "{} h2d {:.1f} GB/s, d2h {:.1f} GB/s, link gen{} x{}  {}{}".format(
                    label,
                    r["h2d_gbps"],
                    r["d2h_gbps"],
                    gen,
                    width,
                    r["verdict"],
                    " ({})".format(r["reason"]) if r["reason"] else "",
                )
            )
            if r["verdict"] == "FAIL":
                failures.append(f"pcie {label}: {r['reason']}")
        verdict = (
            "FAIL"
            if failures
            else ("WARN" if any(r["verdict"] == "WARN" for r in results) else "PASS")
        )
        summary = ", ".join(
            f"{r['label']} {r['h2d_gbps']:.1f}/{r['d2h_gbps']:.1f} GB/s" for r in results
        )
        return {
            "verdict": verdict,
            "summary": summary,
            "devices": results,
            "floor": a.pcie_floor,
            "failures": failures,
        }

    # TRAIN --------------------------------------------------------------------------------------
    def section_train(self):
        torch = self.torch
        a = self.args
        steps = 80 if a.quick else 300
        results, failures = [], []
        for label, device, _name in self.devices():
            gen = torch.Generator().manual_seed(1234)
            teacher = torch.randn(32, 1, generator=gen)
            torch.manual_seed(0)
            model = tiny_mlp(torch, device)
            t = train_steps(torch, model, model.parameters(), teacher, gen, device, steps)
            first, final, finite, drop = t["first"], t["final"], t["finite"], t["drop"]
            r = {
                "index": device.index,
                "label": label,
                "steps": steps,
                "first_loss": first,
                "final_loss": final,
                "drop": drop,
                "verdict": "PASS",
                "reason": None,
            }
            if not finite:
                r["verdict"], r["reason"] = "FAIL", "loss became NaN or Inf"
            elif drop is None or drop < a.loss_drop:
                r["verdict"] = "FAIL"
                r["reason"] = (
                    f"loss {first:.4g} -> {final:.4g} in {steps} steps: "
                    f"fell {100 * (drop or 0):.0f}%, needs {100 * a.loss_drop:.0f}%"
                )
            results.append(r)
            self.out.line(
                f"{label} loss {first:.4g} -> {final:.4g} in {steps} steps "
                f"(-{100 * (drop or 0):.0f}%)  {r['verdict']}"
            )
            if r["verdict"] == "FAIL":
                failures.append(f"train {label}: {r['reason']}")
        return {
            "verdict": "FAIL" if failures else "PASS",
            "devices": results,
            "loss_drop": a.loss_drop,
            "failures": failures,
            "summary": ", ".join(f"{r['label']} -{100 * (r['drop'] or 0):.0f}%" for r in results),
        }

    # DDP ----------------------------------------------------------------------------------------
    def ddp_launch(self):
        """Run the DDP ranks of this node under torchrun; returns (rank results, error or None)."""
        a = self.args
        nproc = a.ddp_procs or (len(self.gpus) if self.cuda else 2)
        if nproc < 1:
            return [], "no DDP process to start", nproc
        if a.quick:
            numel = (16 << 20) if self.cuda else (1 << 20)
            iters, steps = 6, 60
        else:
            numel = (64 << 20) if self.cuda else (4 << 20)
            iters, steps = 21, 200
        timeout = a.ddp_timeout or (180.0 if a.quick else 600.0)
        endpoint = a.rdzv_endpoint or f"127.0.0.1:{int(free_port())}"
        outdir = tempfile.mkdtemp(prefix="gpuctl-ddp-")
        argv = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            str(a.ddp_nnodes),
            "--nproc-per-node",
            str(nproc),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            endpoint,
            "--rdzv-id",
            a.rdzv_id or f"gpuctl-accept-{int(os.getpid())}",
            "--max-restarts",
            "0",
            "-m",
            "gpuctl.workloads.accept.ddp",
            "--out",
            outdir,
            "--device",
            a.device,
            "--numel",
            str(numel),
            "--iters",
            str(iters),
            "--steps",
            str(steps),
            "--loss-drop",
            str(a.loss_drop),
            "--timeout",
            str(timeout),
            "--break-rank",
            str(a.test_break_rank),
        ]
        self.out.line(
            f"torchrun: {a.ddp_nnodes} node(s) x {nproc} process(es), "
            f"c10d rendezvous at {endpoint}",
            section="ddp_allreduce",
        )
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")
        # its own session; SIGTERM when the suite dies, so torchrun never outlives it
        proc = spawn(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            death_signal=signal.SIGTERM,
        )
        error = None
        try:
            output, _ = proc.communicate(timeout=timeout + 30)
        except subprocess.TimeoutExpired:
            stop_group(proc.pid, DDP_GRACE_S, proc)
            output, _ = proc.communicate()
            error = f"DDP did not finish within {timeout + 30:g} s (hung collective?)"
        finally:
            if proc.poll() is None:
                stop_group(proc.pid, DDP_GRACE_S, proc)
                proc.wait()
        tail = output.decode(errors="replace").strip().splitlines()[-8:]
        ranks = []
        for fname in sorted(os.listdir(outdir)):
            if fname.startswith("rank-") and fname.endswith(".json"):
                with open(os.path.join(outdir, fname)) as f:
                    ranks.append(json.load(f))
                os.unlink(os.path.join(outdir, fname))
        shutil.rmtree(outdir, ignore_errors=True)
        if error is None and len(ranks) < nproc:
            error = (
                f"{len(ranks)} of {nproc} local ranks reported "
                f"(torchrun exit {proc.returncode}): {' | '.join(tail[-3:])}"
            )
        if error is None and proc.returncode != 0 and not any(r.get("error") for r in ranks):
            error = f"torchrun exited {proc.returncode}: {' | '.join(tail[-3:])}"
        ranks.sort(key=lambda r: r["rank"])
        self._ddp = (ranks, error, nproc)
        return ranks, error, nproc

    def section_ddp_allreduce(self):
        ranks, error, nproc = self.ddp_launch()
        failures = []
        out = {
            "world_size": None,
            "nnodes": self.args.ddp_nnodes,
            "local_procs": nproc,
            "backend": None,
            "numel": None,
            "bytes": None,
            "iters": None,
            "algbw_gbps": None,
            "busbw_gbps": None,
            "ranks": [],
        }
        if error:
            failures.append(f"ddp: {error}")
        for r in ranks:
            ar = r.get("allreduce") or {}
            out["world_size"] = r["world_size"]
            out["backend"] = r["backend"]
            row = {
                "rank": r["rank"],
                "host": r["host"],
                "ok": bool(ar.get("ok")),
                "mismatches": ar.get("mismatches"),
                "first_bad": ar.get("first_bad"),
                "algbw_gbps": ar.get("algbw_gbps"),
                "busbw_gbps": ar.get("busbw_gbps"),
                "error": r.get("error"),
            }
            out["ranks"].append(row)
            if r.get("error") and not ar:
                failures.append(f"ddp rank {r['rank']}: {r['error']}")
            elif not row["ok"]:
                bad = ar.get("first_bad") or {}
                failures.append(
                    f"all-reduce rank {r['rank']}: {ar.get('mismatches')} wrong elements "
                    f"(first: iteration {bad.get('iteration')} index {bad.get('index')} "
                    f"got {bad.get('got')}, expected {bad.get('expected')})"
                )
        good = [r["allreduce"] for r in ranks if r.get("allreduce")]
        if good:
            out.update(numel=good[0]["numel"], bytes=good[0]["bytes"], iters=good[0]["iters"])
            # The slowest rank bounds the collective: report the lowest bandwidth seen.
            algbws = [g["algbw_gbps"] for g in good if g["algbw_gbps"]]
            if algbws:
                out["algbw_gbps"] = min(algbws)
                w = out["world_size"]
                out["busbw_gbps"] = out["algbw_gbps"] * 2 * (w - 1) / w
        for r in out["ranks"]:
            self.out.line(
                f"rank {r['rank']} on {r['host']}: "
                + (
                    f"all {out['numel']} elements right"
                    if r["ok"]
                    else f"WRONG ({r['mismatches']} mismatches) {r['error'] or ''}"
                )
            )
        if out["algbw_gbps"] is not None:
            self.out.line(
                f"all-reduce {out['bytes']} bytes x {out['world_size']} ranks: "
                f"algbw {out['algbw_gbps']:.3f} GB/s, busbw {out['busbw_gbps']:.3f} GB/s"
            )
        out["failures"] = failures
        out["verdict"] = "FAIL" if failures else "PASS"
        out["summary"] = (failures[0] if failures else None) or (
            f"busbw {out['busbw_gbps'] or 0:.3f} GB/s over {out['world_size']} ranks"
        )
        return out

    def section_ddp_train(self):
        ranks, error, _nproc = getattr(self, "_ddp", None) or self.ddp_launch()
        failures = []
        out = {
            "world_size": None,
            "steps": None,
            "ranks": [],
            "params_identical": None,
            "loss_drop": self.args.loss_drop,
        }
        if error:
            failures.append(f"ddp train: {error}")
        for r in ranks:
            tr = r.get("train")
            out["world_size"] = r["world_size"]
            if not tr:
                failures.append(f"ddp train rank {r['rank']}: {r.get('error') or 'no result'}")
                continue
            out["steps"] = tr["steps"]
            fell = tr["drop"] is not None and tr["drop"] >= self.args.loss_drop
            out["ranks"].append(
                {
                    "rank": r["rank"],
                    "first_loss": tr["first_loss"],
                    "final_loss": tr["final_loss"],
                    "drop": tr["drop"],
                    "ok": fell,
                    "params_identical": tr["params_identical"],
                    "params_max_diff": tr["params_max_diff"],
                }
            )
            self.out.line(
                f"rank {r['rank']} loss {tr['first_loss']:.4g} -> {tr['final_loss']:.4g} "
                f"(-{100 * (tr['drop'] or 0):.0f}%), parameters "
                + (
                    "identical across ranks"
                    if tr["params_identical"]
                    else f"DIFFER across ranks (max {tr['params_max_diff']:.3g})"
                )
            )
            if not fell:
                failures.append(
                    f"ddp train rank {r['rank']}: loss fell {100 * (tr['drop'] or 0):.0f}%, "
                    f"needs {100 * self.args.loss_drop:.0f}%"
                )
            if not tr["params_identical"]:
                failures.append(
                    f"ddp train rank {r['rank']}: parameters differ across ranks "
                    f"(max {tr['params_max_diff']:.3g})"
                )
        if out["ranks"]:
            out["params_identical"] = all(x["params_identical"] for x in out["ranks"])
        out["failures"] = failures
        out["verdict"] = "FAIL" if failures else "PASS"
        out["summary"] = (failures[0] if failures else None) or (
            f"loss fell on {len(out['ranks'])} rank(s), parameters "
            + ("identical" if out["params_identical"] else "differ")
        )
        return out

    # HEALTH -------------------------------------------------------------------------------------
    def section_health(self):
        if not self.cuda:
            return {"verdict": "SKIP", "summary": "no GPU on a CPU run (NVML not read)", "gpus": []}
        if self.nvml is None or self.nvml.nv is None:
            why = self.nvml.error if self.nvml else "NVML not opened"
            return {"verdict": "SKIP", "summary": f"NVML unavailable ({why})", "gpus": []}
        self.nvml.poll_xids()
        gpus, failures, warns = [], [], []
        for g in self.gpus:
            i = g["index"]
            h = self.nvml.health(i)
            h.update(
                index=i,
                xids=sorted(set(self.nvml.xids.get(i, []))),
                throttle=sorted(self.nvml.throttle.get(i, ())),
                verdict="PASS",
                reason=None,
            )
            problems = []
            if h["ecc_uncorrected_volatile"]:
                problems.append(f"{int(h['ecc_uncorrected_volatile'])} uncorrectable ECC errors")
            rows = h["remapped_rows"] or {}
            if rows.get("pending"):
                problems.append("row remapping pending (reset the GPU)")
            if rows.get("failure"):
                problems.append("row remapping failed")
            if h["xids"]:
                problems.append(f"XID {','.join(str(x) for x in h['xids'])} during the run")
            hw = [t for t in h["throttle"] if t in BAD_THROTTLE]
            if hw:
                problems.append(f"throttled during COMPUTE: {','.join(hw)}")
            soft = [t for t in h["throttle"] if t in WARN_THROTTLE]
            if problems:
                h["verdict"], h["reason"] = "FAIL", "; ".join(problems)
                failures.append(f"health gpu{i}: {h['reason']}")
            elif soft:
                h["verdict"], h["reason"] = (
                    "WARN",
                    f"throttled during COMPUTE: {','.join(soft)}",
                )
                warns.append(i)
            gpus.append(h)
            self.out.line(
                f"gpu{i} ECC uncorrected {h['ecc_uncorrected_volatile']}, "
                f"remapped rows {rows or None}, XID {h['xids'] or 'none'}, "
                f"throttle {','.join(h['throttle']) or 'none'}  {h['verdict']}"
                + (f" ({h['reason']})" if h["reason"] else "")
            )
        verdict = "FAIL" if failures else ("WARN" if warns else "PASS")
        return {
            "verdict": verdict,
            "gpus": gpus,
            "failures": failures,
            "summary": "; ".join(failures) or f"{len(gpus)} GPU(s) healthy",
        }

    # driver -------------------------------------------------------------------------------------
    def run(self):
        a = self.args
        sections = {}
        for name in SECTIONS:
            self.out.section = name
            self.out.event(event="section", section=name, state="start")
            t0 = time.monotonic()
            if name in a.skip:
                res = {"verdict": "SKIP", "summary": f"--skip {name}"}
            elif name != "env" and self.no_gpu:
                # ENV already failed (or was allowed to skip): one failure, not eight.
                res = {
                    "verdict": "SKIP",
                    "summary": f"no GPU{' (--allow-no-gpu)' if a.allow_no_gpu else ': see [ENV]'}",
                }
            else:
                try:
                    res = getattr(self, f"section_{name}")()
                except Exception as e:
                    traceback.print_exc()
                    msg = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}"
                    res = {
                        "verdict": "FAIL",
                        "summary": f"crashed: {msg}",
                        "failures": [f"{name} crashed: {msg}"],
                    }
            res["seconds"] = round(time.monotonic() - t0, 3)
            if res["verdict"] == "FAIL" and not res.get("failures"):
                res["failures"] = [f"{name}: {res.get('summary')}"]
            self.out.line(f"{res['verdict']} ({res['seconds']:.1f} s): {res.get('summary')}")
            self.out.event(
                event="section",
                section=name,
                state="end",
                verdict=res["verdict"],
                summary=res.get("summary"),
                seconds=res["seconds"],
            )
            sections[name] = res
        self.out.section = None
        if self.nvml is not None:
            self.nvml.close()
        return sections


def free_port():
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
    finally:
        s.close()


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if os.environ.get("LOCAL_RANK") is not None or os.environ.get("TORCHELASTIC_RUN_ID"):
        # One suite per node starts its own torchrun; eight suites per node would fight.
        msg = (
            "the suite runs once per node and starts torchrun itself; under torchrun, run "
            "gpuctl.workloads.accept.ddp instead"
        )
        sys.stdout.write(f"{RESULT_FAILURE}: {json.dumps([msg])}\n")
        return 2
    node = args.node_name or os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    args.node_name = node
    # "{node}" in a path names this node: one srun command line serves every node of a job.
    if args.events:
        args.events = args.events.replace("{node}", node)
    if args.report_name:
        args.report_name = args.report_name.replace("{node}", node)
    out = Output(args.events, args.events_fd)
    started = time.time()
    out.event(event="start", node=node, device=args.device, quick=args.quick, pid=os.getpid())
    try:
        import torch
    except ImportError as e:
        msg = f"torch is not importable by {sys.executable} ({e})"
        out.line(f"[ENV] {msg}")
        out.event(event="result", verdict="FAIL", failures=[msg], report=None)
        sys.stdout.write(f"{RESULT_FAILURE}: [{json.dumps(msg)}]\n")
        out.close()
        return 1
    suite = Suite(args, out, torch)
    sections = suite.run()
    failures = []
    for name in SECTIONS:
        failures.extend(sections[name].get("failures") or [])
    verdict = "FAIL" if any(s["verdict"] == "FAIL" for s in sections.values()) else "PASS"
    finished = time.time()
    report = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "node": suite.node,
        "hostname": socket.gethostname(),
        "started": started,
        "finished": finished,
        "duration_s": round(finished - started, 3),
        "device": args.device,
        "quick": args.quick,
        "options": {
            k: v
            for k, v in vars(args).items()
            if k not in ("events", "events_fd", "report_dir", "report_name")
        },
        "verdict": verdict,
        "failures": failures,
        "sections": sections,
    }
    path = None
    try:
        os.makedirs(args.report_dir, exist_ok=True)
        name = (
            args.report_name
            or f"accept-{suite.node}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(started))}.json"
        )
        path = os.path.join(args.report_dir, name)
        with open(f"{path}.tmp", "w") as f:
            json.dump(report, f, indent=1, default=str)
        os.replace(f"{path}.tmp", path)
    except OSError as e:
        failures.append(f"report not written to {args.report_dir}: {e}")
        verdict = report["verdict"] = "FAIL"
        path = None
    for line in summary_table(report):
        sys.stdout.write(f"{line}\n")
    if path:
        sys.stdout.write(f"report: {path}\n")
    out.event(event="result", verdict=verdict, failures=failures, report=path)
    out.close()
    if verdict == "PASS":
        sys.stdout.write(f"{RESULT_SUCCESS}\n")
    else:
        sys.stdout.write(f"{RESULT_FAILURE}: {json.dumps(failures)}\n")
    sys.stdout.flush()
    return 0 if verdict == "PASS" else 1
