"""The single-node acceptance suite's runner: options, the sections in order, the JSON report
and the result line.

``python -m gpuctl.workloads.accept_suite [--quick] [--device cuda|cpu] [--report-dir D] ...``

Every section (one module each in ``sections``) returns a dict with ``verdict`` and ``summary``
(see ``schema``). Human lines go to stdout prefixed with the section marker; ``[RESULT] SUCCESS``
or ``[RESULT] FAILURE: [...]`` is always the last stdout line and the exit code is 0 or 1. With
``--events PATH`` (or ``--events-fd N``) the same progress is written as JSON lines for gpuctl to
relay.

Faults of the predecessor's suite that this one avoids on purpose: no GPU is a failure (unless
``--allow-no-gpu``), throughput is judged (floor fraction of the datasheet peak and the
same-model rule), training runs a fixed number of steps and must cut the loss by a threshold, and
the all-reduce buffer is refilled before every collective.
"""

import argparse
import json
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from gpuctl.workloads.burn import parse_bytes

from . import peaks
from .nvml import Nvml
from .output import Output
from .render import summary_table
from .schema import (
    MARKERS,
    RESULT_FAILURE,
    RESULT_SUCCESS,
    SCHEMA,
    SCHEMA_VERSION,
    SECTIONS,
)
from .sections import RUNNERS
from .sections.burn import parse_duration
from .sections.ddp import parse_floors
from .sections.env import run_prolog

DTYPES = ("fp32", "tf32", "bf16", "fp16")
PROLOG_SECTIONS = ("env", "shape", "health")  # --prolog: what NVML and the node tell at once


def parse_args(argv: "list[str]") -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m gpuctl.workloads.accept_suite",
        description="Acceptance suite of one node: prints [RESULT] and writes a JSON report.",
    )
    p.add_argument("--quick", action="store_true", help="short runs (seconds, not minutes)")
    p.add_argument(
        "--prolog",
        action="store_true",
        help="seconds and no load, for a Slurm prolog or HealthCheckProgram: [ENV] through "
        "NVML (no torch), [SHAPE] and [HEALTH]; every other section SKIP",
    )
    p.add_argument(
        "--device",
        choices=("cuda", "cpu", "sim"),
        default="cuda",
        help="sim: a simulated run on a simulated node's GPUs (its agent passes --sim-facts)",
    )
    p.add_argument("--sim-facts", help=argparse.SUPPRESS)  # JSON: the simulated GPUs now
    p.add_argument("--report-dir", default=".", help="folder for the JSON report")
    p.add_argument(
        "--report-name", help="report file name, {node} is replaced (default accept-NODE-TIME.json)"
    )
    p.add_argument("--node-name", help="node name in the report (default: Slurm's or hostname)")
    p.add_argument("--expect-gpus", type=int, help="fail when fewer GPUs are visible")
    p.add_argument(
        "--expect-source", default="--expect-gpus", help="where the expected count came from"
    )
    p.add_argument("--allow-no-gpu", action="store_true", help="no GPU is a SKIP, not a failure")
    p.add_argument(
        "--floor",
        type=float,
        help="one minimum fraction of peak TFLOP/s for every model and dtype (default: per "
        "model and dtype, peaks.FLOORS)",
    )
    p.add_argument(
        "--floors",
        default="",
        help="floors per model and dtype, e.g. L40S:fp32=0.4,H100-SXM:bf16=0.7 (win over --floor)",
    )
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
    p.add_argument("--expect-model", help="[SHAPE]: every GPU's name contains this (e.g. H100)")
    p.add_argument("--expect-nvlinks", type=int, help="[SHAPE]: active NVLinks per GPU")
    p.add_argument(
        "--expect-mig", choices=("on", "off"), default="off", help="[SHAPE]: MIG mode (off)"
    )
    p.add_argument(
        "--burn", default="0", help="[BURN]: burn every GPU this long, e.g. 10m (0: skip)"
    )
    p.add_argument(
        "--sweep-max",
        help="[DDP] all-reduce/all-gather size sweep up to this many bytes (e.g. 1G; 0: none; "
        "default 1G on GPUs, 64M with --quick)",
    )
    p.add_argument(
        "--busbw-floor",
        help="[DDP] all-reduce busbw floor in GB/s at the sweep's largest size: 360, or per "
        "topology (GPUs per node x nodes) 8x1=360,8x2=180",
    )
    p.add_argument(
        "--p2p-floor",
        type=float,
        default=0.7,
        help="[P2P] a GPU pair below this fraction of the median pair's GB/s fails",
    )
    p.add_argument(
        "--link-errors",
        type=int,
        default=100,
        help="[HEALTH]: NVLink CRC/replay errors or PCIe replays a GPU may add during the run "
        "(more fail, fewer are noted; an NVLink recovery always fails)",
    )
    p.add_argument("--test-p2p-devices", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--test-slow-pair", help=argparse.SUPPRESS)  # "I,J": that pair copies 8x
    p.add_argument("--test-kernel-log", help=argparse.SUPPRESS)  # a file read as the kernel log
    p.add_argument("--test-sysfs-root", default="/sys", help=argparse.SUPPRESS)
    p.add_argument("--skip", action="append", default=[], choices=SECTIONS, help="skip a section")
    p.add_argument("--events", help="append JSON progress lines to this file ({node}: node name)")
    p.add_argument("--events-fd", type=int, help="write JSON progress lines to this descriptor")
    p.add_argument("--test-break-rank", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--test-slow-rank", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--test-slow-compute", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument(
        "--memtest-mb", type=int, help="MiB of memory [MEMTEST] tests (default: 90%% of free)"
    )
    p.add_argument("--test-memtest-flip", type=int, metavar="OFFSET", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    bad = [d for d in dtypes if d not in DTYPES]
    if bad or not dtypes:
        p.error(f"--dtypes: unknown {','.join(bad) or 'empty'} (known: {','.join(DTYPES)})")
    args.dtypes = dtypes
    try:
        args.burn = parse_duration(args.burn)
        args.busbw_floor = parse_floors(args.busbw_floor) if args.busbw_floor else None
    except ValueError as e:
        p.error(str(e))
    if args.sweep_max is not None:
        try:
            args.sweep_max = 0 if args.sweep_max.strip() == "0" else parse_bytes(args.sweep_max)
        except ValueError:
            p.error(f"--sweep-max {args.sweep_max!r}: expected bytes such as 64K, 1G or 0")
    if args.floor is not None and not 0 < args.floor <= 1:
        p.error("--floor must be within (0, 1]")
    try:
        args.floors = peaks.parse_floors(args.floors)
    except ValueError as e:
        p.error(f"--floors: {e}")
    if args.test_slow_compute < 1:
        p.error("--test-slow-compute must be >= 1")
    if args.memtest_mb is not None and args.memtest_mb < 1:
        p.error("--memtest-mb must be at least 1")
    if args.link_errors < 0:
        p.error("--link-errors must be 0 or more")
    if args.prolog and args.device == "cpu":
        p.error("--prolog checks the GPUs through NVML: leave out --device cpu")
    if args.device == "sim" and not args.sim_facts:
        p.error("--device sim runs on a simulated node, whose agent passes --sim-facts")
    return args


def no_torch(error: ImportError) -> str:
    """The one line a run without torch says: which Python lacks it and the two ways out
    (the README's install has no torch: the suite runs with the nodes' Python with torch)."""
    why = "" if error.name == "torch" else f" ({error})"  # torch there, a part of it broken
    return (
        f"torch is not importable by {sys.executable}{why}: install it there, or set "
        "`[accept] python` / `--python`"
    )


def _env_without_torch(suite: "Suite", message: str) -> "dict[str, Any]":
    """[ENV] of a Python without torch: FAIL, saying so once; the sections after it SKIP."""
    suite.blocked = "needs torch: see [ENV]"
    return {
        "verdict": "FAIL",
        "summary": message,
        "failures": [message],
        "hostname": socket.gethostname(),
        "python": sys.executable,
        "torch": None,
    }


class Suite:
    """What the sections share: options, output, torch, the devices under test, NVML."""

    def __init__(self, args: argparse.Namespace, out: Any, torch: Any) -> None:
        self.args = args
        self.out = out
        self.torch = torch
        self.cuda = args.device == "cuda"
        self.nvml: Nvml | None = None
        self.gpus: list[dict[str, Any]] = []  # [{index, name, ...}] for CUDA, [] on CPU
        self.no_gpu = False
        self.node = args.node_name or os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        # [DDP]: (rank results, error or None, local processes), run once for both sections
        self.ddp_result: tuple[list[dict[str, Any]], str | None, int] | None = None
        self.runners = RUNNERS  # section name -> its runner (a simulated run has its own)
        # Each GPU's link error counters when [ENV] ran, before any load ([HEALTH] compares).
        self.links_before: dict[int, dict[str, Any]] = {}
        # Why every section after [ENV] is skipped (no torch): said once, by [ENV].
        self.blocked: str | None = None

    # helpers for the sections ------------------------------------------------------------------
    def note_link_errors(self) -> None:
        """Each GPU's link error counters before any load: [HEALTH] says what the run added."""
        if self.nvml is not None and self.nvml.nv is not None:
            self.links_before = {
                int(g["index"]): self.nvml.link_errors(g["index"]) for g in self.gpus
            }

    def devices(self) -> "list[tuple[str, Any, str]]":
        """(label, torch.device, name) of each device under test."""
        if self.cuda:
            return [
                (f"gpu{int(g['index'])}", self.torch.device("cuda", g["index"]), g["name"])
                for g in self.gpus
            ]
        return [("cpu", self.torch.device("cpu"), "cpu")]

    def sync(self, device: Any) -> None:
        """Wait for the device's queued work (a no-op on the CPU)."""
        if device.type == "cuda":
            self.torch.cuda.synchronize(device)

    def timer(self, device: Any) -> "tuple[Callable[[], None], Callable[[], float]]":
        """start(), stop() -> seconds: CUDA events on a GPU, perf_counter on the CPU."""
        torch = self.torch
        if device.type == "cuda":
            # Events record on the current device's stream: make it the one being measured.
            torch.cuda.set_device(device)
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)

            def begin() -> None:
                start.record()

            def finish() -> float:
                end.record()
                end.synchronize()
                return float(start.elapsed_time(end)) / 1000.0

            return begin, finish
        state: dict[str, float] = {}

        def begin_cpu() -> None:
            state["t"] = time.perf_counter()

        def finish_cpu() -> float:
            return time.perf_counter() - state["t"]

        return begin_cpu, finish_cpu

    # the driver --------------------------------------------------------------------------------
    def run(self) -> "dict[str, dict[str, Any]]":
        """Every section in order; a crash in one is that section's FAIL, not the run's end."""
        a = self.args
        sections: dict[str, dict[str, Any]] = {}
        # the last verdict line's marker and words
        last_said: tuple[str, str, Any] | None = None
        for name in SECTIONS:
            self.out.section = name
            self.out.event(event="section", section=name, state="start")
            t0 = time.monotonic()
            res: dict[str, Any]
            if name in a.skip:
                res = {"verdict": "SKIP", "summary": f"--skip {name}"}
            elif a.prolog and name not in PROLOG_SECTIONS:
                res = {"verdict": "SKIP", "summary": "--prolog: no load"}
            elif name != "env" and self.blocked is not None:
                res = {"verdict": "SKIP", "summary": self.blocked}
            elif name != "env" and self.no_gpu:
                # ENV already failed (or was allowed to skip): one failure, not eight.
                res = {
                    "verdict": "SKIP",
                    "summary": f"no GPU{' (--allow-no-gpu)' if a.allow_no_gpu else ': see [ENV]'}",
                }
            else:
                try:
                    res = self.runners[name](self)
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
            said = (MARKERS[name], res["verdict"], res.get("summary"))
            # [ENV] said why, once; and the two [DDP] sections skipped for one reason (--prolog,
            # no GPU) print one line, not the same one twice
            if not (name != "env" and self.blocked is not None) and said != last_said:
                self.out.line(f"{res['verdict']} ({res['seconds']:.1f} s): {res.get('summary')}")
            last_said = said
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


def main(argv: "list[str] | None" = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if os.environ.get("LOCAL_RANK") is not None or os.environ.get("TORCHELASTIC_RUN_ID"):
        # One suite per node starts its own torchrun; eight suites per node would fight.
        msg = (
            "the suite runs once per node and starts torchrun itself; under torchrun, run "
            "gpuctl.workloads.accept_suite.ddp_rank instead"
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
    torch: Any = None
    missing: str | None = None
    if args.device == "sim":  # simulated GPUs: figures from their state, no torch
        from . import simulated
    elif args.prolog:  # NVML alone: seconds, and a prolog's Python may have no torch
        pass
    else:
        try:
            import torch
        except ImportError as e:
            missing = no_torch(e)
    suite = Suite(args, out, torch)
    if args.device == "sim":
        suite.runners = simulated.runners(args.sim_facts)
    elif args.prolog:
        suite.runners = {**RUNNERS, "env": run_prolog}
    elif missing is not None:
        suite.runners = {**RUNNERS, "env": lambda s: _env_without_torch(s, missing)}
    sections = suite.run()
    failures: list[str] = []
    warnings: list[str] = []
    for name in SECTIONS:
        failures.extend(sections[name].get("failures") or [])
        warnings.extend(sections[name].get("warnings") or [])
    verdict = "FAIL" if any(s["verdict"] == "FAIL" for s in sections.values()) else "PASS"
    finished = time.time()
    report = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "node": suite.node,
        # a simulated node's run is the login machine's process: the host is the simulated node
        "hostname": suite.node if args.device == "sim" else socket.gethostname(),
        "started": started,
        "finished": finished,
        "duration_s": round(finished - started, 3),
        "device": args.device,
        "simulated": args.device == "sim",  # figures made from simulated GPUs, not measured
        "quick": args.quick,
        "prolog": args.prolog,
        "options": {
            k: v
            for k, v in vars(args).items()
            if k not in ("events", "events_fd", "report_dir", "report_name")
        },
        "verdict": verdict,
        "failures": failures,
        "warnings": warnings,
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
    for warning in warnings:
        sys.stdout.write(f"[WARN] {warning}\n")
    out.event(event="result", verdict=verdict, failures=failures, report=path)
    out.close()
    if verdict == "PASS":
        sys.stdout.write(f"{RESULT_SUCCESS}\n")
    else:
        sys.stdout.write(f"{RESULT_FAILURE}: {json.dumps(failures)}\n")
    sys.stdout.flush()
    return 0 if verdict == "PASS" else 1
