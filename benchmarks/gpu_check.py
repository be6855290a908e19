"""The GPU checks of issue 27 in one command: the agent's NVML cost, the burner against a bare
GEMM loop and its start-up, and the one-GPU acceptance DDP verdict.

    PYTHONPATH=$PWD python3 benchmarks/gpu_check.py            # a machine with NVIDIA GPUs
    PYTHONPATH=$PWD python3 benchmarks/gpu_check.py --device cpu --quick   # a dry run here

Three parts, each a subprocess with its own time limit (one failing or hanging does not stop
the others), all of them within ``--budget`` seconds (default 400):

agent  CPU milliseconds per sample for all GPUs: a bare pynvml loop over the fields a monitor
       shows (the baseline); the NVML reader in this process at 1 Hz and where its CPU goes
       (per NVML function, host(), events(), the sample line's JSON); then the real agent from
       the bundle under ``python3 -S`` at 1 Hz, the old agent (``--old``, default ./agent_old,
       a base commit's ``gpuctl`` package placed there by hand, see below) and this tree's,
       alternated, ``--agent-rounds`` times each: the A/B on this GPU; which fields came back
       null. A helper process keeps a small CUDA context busy
       meanwhile, so every GPU-0 sample has a process to look up. The old agent: in a git
       checkout, ``--old-ref`` (default the base of the agent's issue-27 cuts) is taken with
       ``git archive``; in a copy without .git, place it first (untracked, not ignored: it
       travels with the tree; at the root, outside what ruff, mypy and pytest look at), e.g.
       ``mkdir -p agent_old && git archive 1679462 gpuctl | tar -x -C agent_old``; without
       one, only this tree's agent is run.
       Only this part: ``--parts agent`` (about 2.5 minutes).
burn   bf16 and tf32, alternated: a bare ``matmul(out=)`` loop (benchmarks/burn_rate.py) and
       the burner, ``--seconds`` each, ``--rounds`` times, with TFLOP/s, ratio, duty, errors
       and the GPU's mean power and SM clock during each; a bare ``addmm_`` loop (the old
       burner's accumulating GEMM) as a diagnostic; then ``python -m gpuctl.workloads.burn``
       as a process: seconds from its start to its first GEMM (and where they went).
       Each round also runs the bare loop on the burner's own operands (a Gaussian times an
       orthogonal Q): at the power cap the operands' bits set the clock, so the burner's own
       overhead is its rate over that loop's, and the ratio per MHz of SM clock says the same.
ddp    the acceptance suite's DDP sections alone with one rank: ddp_allreduce must SKIP.
agentprof  (only when asked: ``--parts agentprof``, about 1 minute) the bundle's agent under
       cProfile at 1 Hz: its CPU per sample and the functions that take it.
startup  (only when asked: ``--parts startup``, under a minute) ``import torch`` in fresh
       processes (the first may read from disk), the device's first use, the RSS of a process
       holding torch, and ``-X importtime``'s biggest imports: the floor of a burner's start.

With ``--device cpu`` the agent part runs over the stand-in libnvidia-ml.so.1 the tests build
(gcc) and the other parts on the CPU: a check that the script itself works.
Output: this text, and ``gpu_check.log`` + ``gpu_check.json`` under ``$OUT`` when it is set
(else under ``--out``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PART_LIMITS = {"agent": 175.0, "burn": 200.0, "ddp": 120.0, "agentprof": 90.0, "startup": 120.0}
# Fields a monitor shows, for the bare pynvml baseline (what nvtop/nvitop read per GPU).
BARE_FIELDS = 9  # see bare_pynvml
OLD_DIR = REPO / "agent_old"  # a base commit's gpuctl package, placed by hand (see the docstring)
OLD_REF = "1679462"  # the agent before its issue-27 CPU cuts (one-call lists, host reads, ...)


def say(text: str = "") -> None:
    print(text, flush=True)


def save(results: Path, part: str, data: dict[str, Any]) -> None:
    (results / f"{part}.json").write_text(json.dumps(data, indent=1, default=str))


# -- agent ---------------------------------------------------------------------------------
def holder(device: str) -> subprocess.Popen[bytes]:
    """A process on GPU 0 while the agent is measured: small GEMMs every 20 ms (CUDA), or a
    sleep that the stand-in NVML lists as GPU 0's process (CPU)."""
    if device == "cpu":
        return subprocess.Popen(["sleep", "600"])
    code = (
        "import sys, time, torch\n"
        "x = torch.rand(1024, 1024, device='cuda')\n"
        "print('ready', flush=True)\n"
        "while True:\n"
        "    y = x @ x\n"
        "    torch.cuda.synchronize()\n"
        "    time.sleep(0.02)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    proc.stdout.readline()  # its CUDA context exists
    return proc


def bare_pynvml(nv: Any, samples: int, pause: float) -> float:
    """CPU ms per sample of plain pynvml calls for what a monitor shows, all GPUs."""
    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]

    calls = [
        ("nvmlDeviceGetUtilizationRates", ()),
        ("nvmlDeviceGetMemoryInfo", ()),
        ("nvmlDeviceGetTemperature", (0,)),
        ("nvmlDeviceGetPowerUsage", ()),
        ("nvmlDeviceGetClockInfo", (1,)),
        ("nvmlDeviceGetClockInfo", (2,)),
        ("nvmlDeviceGetPerformanceState", ()),
        ("nvmlDeviceGetCurrentClocksEventReasons", ()),
        ("nvmlDeviceGetEnforcedPowerLimit", ()),
    ]
    fns = [(getattr(nv, name), args) for name, args in calls if hasattr(nv, name)]

    def one() -> None:
        for h in handles:
            for fn, args in fns:
                with contextlib.suppress(nv.NVMLError):  # NOT_SUPPORTED
                    fn(h, *args)

    one()
    used = 0.0
    for _ in range(samples):
        t = time.process_time()
        one()
        used += time.process_time() - t
        time.sleep(pause)
    return used / samples * 1000


def reader_cost(reader: Any, samples: int, pause: float, old: bool) -> float:
    """CPU ms per ``reader.sample`` at the agent's cadence of slow reads; ``old`` forgets what
    the new reader remembers before every sample (NOT_SUPPORTED answers, per-process SM %),
    which is what the reader before issue 27 did."""
    from gpuctl.node import protocol

    used = 0.0
    for seq in range(samples):
        if old:
            reader._unsupported.clear()
            reader._sm.clear()
        t = time.process_time()
        reader.sample(slow=seq % protocol.SLOW_EVERY == 0)
        used += time.process_time() - t
        time.sleep(pause)
    return used / samples * 1000


class Timed:
    """pynvml with the CPU time of every function call added up by name (a profile of the
    reader's NVML calls on this machine's driver)."""

    def __init__(self, nv: Any) -> None:
        self._nv = nv
        self.used: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._nv, name)
        if name == "_nvmlGetFunctionPointer":  # the reader's one-call list reads: the C function
            return lambda fname: self._timed(f"{fname} (one call)", attr(fname))
        if not callable(attr) or not name.startswith("nvml"):
            return attr
        return self._timed(name, attr)

    def _timed(self, name: str, attr: Any) -> Any:
        def timed(*args: Any) -> Any:
            t = time.process_time()
            try:
                return attr(*args)
            finally:
                self.used[name] = self.used.get(name, 0.0) + time.process_time() - t
                self.calls[name] = self.calls.get(name, 0) + 1

        return timed


def profile(reader: Any, samples: int, pause: float) -> list[str]:
    """The new way's CPU per sample by pynvml function, plus the agent's other reader calls
    (events, host, parents), most expensive first."""
    from gpuctl.node import protocol

    nv = reader._nv
    timed = reader._nv = Timed(nv)
    reader._resolved = {}  # resolve the functions through the timing proxy
    other: dict[str, float] = {"events()": 0.0, "host()": 0.0, "parents()": 0.0, "encode": 0.0}
    reader.events(), reader.host(), reader.parents()  # imports and first reads: not counted
    try:
        for seq in range(samples):
            gpus = reader.sample(slow=seq % protocol.SLOW_EVERY == 0)
            for label, fn in (
                ("events()", reader.events),
                ("host()", reader.host),
                ("parents()", reader.parents),
            ):
                t = time.process_time()
                fn()
                other[label] += time.process_time() - t
            msg = {"type": "sample", "t": time.time(), "seq": seq, "gpus": gpus,
                   "parents": reader.parents(), "host": reader.host()}  # fmt: skip
            t = time.process_time()
            protocol.encode(msg)  # the sample line's JSON, as the agent sends it
            other["encode"] += time.process_time() - t
            time.sleep(pause)
    finally:
        reader._nv, reader._resolved = nv, {}
    rows = [(v, f"{k} x{timed.calls[k] / samples:.1f}") for k, v in timed.used.items()]
    rows += [(v, k) for k, v in other.items()]
    rows.sort(reverse=True)
    return [f"{v / samples * 1000:7.3f} ms  {k}" for v, k in rows[:16]]


def old_bundle(a: argparse.Namespace, tmp: Path) -> tuple[str | None, str]:
    """The old agent's bundle (written by its own ``gpuctl.bundle``, so it carries this python's
    nvidia-ml-py as the new one does) and where it came from; None and why when there is none."""
    src = Path(a.old)
    if not (src / "gpuctl" / "node").is_dir():
        if not (REPO / ".git").exists():
            return None, (
                f"no old agent under {src} and no .git here: place one with `mkdir -p {src} && "
                f"git archive {a.old_ref} gpuctl | tar -x -C {src}` in a checkout"
            )
        src = tmp / "old-src"
        src.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", a.old_ref, "gpuctl"],
            capture_output=True, timeout=60,
        )  # fmt: skip
        if archive.returncode:
            return None, f"git archive {a.old_ref}: {archive.stderr.decode().strip()[:200]}"
        subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True)
        origin = f"git {a.old_ref}"
    else:
        origin = str(src)
    env = dict(os.environ, PYTHONPATH=str(src))
    code = "import sys; from gpuctl.bundle import write_bundle; print(write_bundle(sys.argv[1]))"
    made = subprocess.run(
        [sys.executable, "-c", code, str(tmp / "old")],
        capture_output=True, text=True, env=env, cwd=src, timeout=60,
    )  # fmt: skip
    if made.returncode:
        return None, f"the old bundle failed to build: {made.stderr.strip()[-300:]}"
    return made.stdout.strip(), origin


def run_agent(label: str, bundle: str, env: dict[str, str], samples: int) -> float:
    """CPU ms per sample of the bundle's agent under ``python3 -S`` at 1 Hz (with this
    python3's site-packages if the bundle carries no pynvml)."""
    from benchmarks import agent_cpu

    try:
        return agent_cpu.measure(label, [sys.executable, "-S", bundle], [], env, 1.0, samples)
    except Exception as e:  # e.g. a bundle without pynvml: the python3's own then
        say(f"[agent] {e}; again with this python3's site-packages:")
        return agent_cpu.measure(label, [sys.executable, bundle], [], env, 1.0, samples)


def part_agent(a: argparse.Namespace, results: Path) -> int:
    from gpuctl.bundle import write_bundle
    from gpuctl.node.readers.nvml import NvmlReader

    out: dict[str, Any] = {}
    n = 6 if a.quick else 10
    hold = holder(a.device)
    try:
        reader = NvmlReader.open()
        nv = reader._nv
        gpus = len(reader.static())
        say(f"[agent] NVML {reader.versions()}, {gpus} GPU(s), bindings {nv.__file__}")
        static_nulls = {
            s["index"]: sorted(k for k, v in s.items() if v is None) for s in reader.static()
        }
        first = reader.sample(slow=True)
        nulls = {g["index"]: sorted(k for k, v in g.items() if v is None) for g in first}
        procs = {g["index"]: len(g.get("processes") or ()) for g in first}
        say(f"[agent] null fields per GPU (sample): {nulls}")
        say(f"[agent] null fields per GPU (static): {static_nulls}")
        say(f"[agent] processes per GPU: {procs}")
        out.update(gpus=gpus, null_sample=nulls, null_static=static_nulls, processes=procs)
        bare = bare_pynvml(nv, n, 0.05)
        say(f"[agent] bare pynvml ({BARE_FIELDS} calls x {gpus} GPU): {bare:.3f} ms CPU/sample")
        new = reader_cost(reader, n, 1.0 if not a.quick else 0.25, old=False)
        say(f"[agent] reader (1 Hz, {n} samples): {new:.3f} ms CPU/sample")
        out.update(bare_ms=bare, reader_ms=new)
        say(f"[agent] where the reader's CPU goes, per sample ({n} samples at 1 Hz):")
        rows = profile(reader, n, 1.0 if not a.quick else 0.25)
        for row in rows:
            say(f"[agent]   {row}")
        out["profile"] = rows
        reader.close()
        with tempfile.TemporaryDirectory(prefix="gpuctl-check-") as tmp:
            bundle = str(write_bundle(Path(tmp) / "bundle"))
            old, origin = old_bundle(a, Path(tmp))
            say(f"[agent] old agent: {old and Path(old).name} from {origin}")
            say(f"[agent] new agent: {Path(bundle).name} from this tree")
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            # 20: a window of 12 holds one or two of the 10 s per-process utilization reads
            # (1.5 ms each on an H100): +-0.12 ms of noise a run
            samples = 6 if a.quick else 20
            say(f"[agent] the real agents, bundles under python3 -S, 1 Hz, {samples} samples "
                f"each, alternated:")  # fmt: skip
            runs: dict[str, list[float]] = {"old": [], "new": []}
            for _ in range(a.agent_rounds):
                if old is not None:
                    runs["old"].append(run_agent("old agent (bundle, -S)", old, env, samples))
                runs["new"].append(run_agent("new agent (bundle, -S)", bundle, env, samples))
        agent = statistics.mean(runs["new"])
        out.update(agent_ms=agent, agent_runs=runs, old_origin=origin)
        ab = "no old agent to compare"
        if runs["old"]:
            before = statistics.mean(runs["old"])
            out["agent_old_ms"] = before
            ab = f"old {before:.3f} -> new {agent:.3f} ms ({agent / before:.2f}x)"
        say(
            f"[agent] RESULT agent {agent:.3f} ms CPU/sample for {gpus} GPU(s) "
            f"(target <= 1 ms per H100): {ab}; reader {new:.3f} ms; bare pynvml {bare:.3f} ms"
        )
    finally:
        hold.kill()
        hold.wait()
        save(results, "agent", out)
    return 0


# -- burn ----------------------------------------------------------------------------------
class Power:
    """GPU 0's power (W) and SM clock (MHz) every 0.2 s while a run goes (CUDA only)."""

    def __init__(self, device: str) -> None:
        self.nv: Any = None
        self.rows: list[tuple[float, float]] = []
        self.mhz: float | None = None  # the last run's median SM clock
        if device != "cuda":
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nv, self.h = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception as e:
            say(f"[burn] no power readings: {e}")

    def during(self, fn: Any, *args: Any) -> tuple[Any, str]:
        """``fn(*args)`` and a note of the power and clock while it ran."""
        self.mhz = None
        if self.nv is None:
            return fn(*args), ""
        self.rows, stop = [], threading.Event()

        def poll() -> None:
            while not stop.wait(0.2):
                try:
                    watts = self.nv.nvmlDeviceGetPowerUsage(self.h) / 1000
                    mhz = self.nv.nvmlDeviceGetClockInfo(self.h, 1)
                    self.rows.append((watts, mhz))
                except Exception:
                    pass

        t = threading.Thread(target=poll, daemon=True)
        t.start()
        try:
            result = fn(*args)
        finally:
            stop.set()
            t.join()
        if not self.rows:
            return result, ""
        w = statistics.mean(r[0] for r in self.rows)
        c = self.mhz = statistics.median(r[1] for r in self.rows)
        return result, f"  {w:5.0f} W {c:5.0f} MHz"


def rate(gflops: float) -> str:
    """A GEMM rate for people: TFLOP/s on a GPU, GFLOP/s where it is small (the CPU)."""
    return f"{gflops / 1000:8.2f} TFLOP/s" if gflops >= 1000 else f"{gflops:8.2f} GFLOP/s"


def addmm_loop(torch: Any, device: str, size: int, dtype: Any, seconds: float) -> float:
    """GFLOP/s of back-to-back ``c.addmm_(a, b)`` (beta=1), as the old burner accumulated."""
    dev = torch.device("cuda:0" if device == "cuda" else "cpu")
    a = torch.rand(size, size, device=dev).to(dtype)
    b = torch.rand(size, size, device=dev).to(dtype)
    c = torch.zeros_like(a)

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    c.addmm_(a, b)
    sync()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(8):
            c.addmm_(a, b)  # sums of rand products: bf16 and fp32 hold them for minutes
        n += 8
        sync()
    took = time.perf_counter() - start
    return 2.0 * size**3 * n / took / 1e9


def first_gemm(a: argparse.Namespace) -> dict[str, Any]:
    """Start the burner as a process; seconds from Popen to each of its first lines."""
    cmd = [sys.executable, "-m", "gpuctl.workloads.burn", "--device", a.device]
    cmd += ["--duration", "6"] if a.device == "cuda" else ["--size", "256", "--duration", "1"]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert proc.stdout is not None
    seen: dict[str, Any] = {}
    last: dict[str, Any] = {}
    for line in proc.stdout:
        at = time.monotonic() - t0
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        last = msg
        if msg.get("type") == "info":
            say(f"[burn]   +{at:6.2f} s  {msg['message']}")
            if "startup" in msg:
                seen.update(first_gemm_wall_s=round(at, 3), startup=msg["startup"])
        elif msg.get("type") == "progress" and "first_progress_s" not in seen:
            seen["first_progress_s"] = round(at, 3)
            say(f"[burn]   +{at:6.2f} s  first progress line: {msg.get('tflops')} TFLOP/s")
    proc.wait()
    seen["summary"] = last
    return seen


def part_burn(a: argparse.Namespace, results: Path) -> int:
    from benchmarks import burn_rate

    torch = burn_rate.torch
    device = a.device
    size = 8192 if device == "cuda" else 256
    seconds = a.seconds if device == "cuda" else 1.0
    rounds = a.rounds
    power = Power(device)
    out: dict[str, Any] = {"size": size, "seconds": seconds, "dtypes": {}}
    dtypes = ("bf16", "tf32") if device == "cuda" else ("bf16", "fp32")
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    say(f"[burn] {name}, {size}x{size}, {seconds:g} s per run, {rounds} alternations per dtype")
    try:
        for dtype in dtypes:
            if device == "cuda":
                torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
            pairs = []
            for i in range(rounds):
                bare, pw_bare = power.during(burn_rate.bare_loop, device, size, dtype, seconds)
                mhz_bare = power.mhz
                same, pw_same = power.during(
                    burn_rate.bare_loop, device, size, dtype, seconds, "burner"
                )
                b, pw_burn = power.during(burn_rate.burner_run, device, size, dtype, seconds)
                ratio = b["gflops_mean"] / bare
                # the power cap sets the clock by the operands' bits: per MHz, the burner's own cost
                per_clock = (
                    (b["gflops_mean"] / power.mhz) / (bare / mhz_bare)
                    if power.mhz and mhz_bare
                    else None
                )
                pairs.append(
                    {
                        "bare_gflops": bare,
                        **b,
                        "ratio": ratio,
                        "bare_same_operands_gflops": same,
                        "ratio_same_operands": b["gflops_mean"] / same,
                        "ratio_per_clock": per_clock,
                    }
                )
                say(
                    f"[burn] {dtype} #{i + 1}: bare {rate(bare)}{pw_bare} | bare on the burner's "
                    f"operands {rate(same)}{pw_same} | burner {rate(b['gflops_mean'])}{pw_burn} "
                    f"duty {b['duty']:.4f} errors {b['errors']} | ratio {ratio:.3f}, "
                    f"same operands {b['gflops_mean'] / same:.3f}"
                    + (f", per MHz {per_clock:.3f}" if per_clock else "")
                )
            acc, pw_acc = power.during(
                addmm_loop, torch, device, size, burn_rate.TORCH_DTYPES[dtype], min(5.0, seconds)
            )
            bare_med = statistics.median(p["bare_gflops"] for p in pairs)
            burn_med = statistics.median(p["gflops_mean"] for p in pairs)
            say(
                f"[burn] {dtype} bare addmm_ loop (beta=1, the old burner's GEMM): "
                f"{rate(acc)}{pw_acc} = {acc / bare_med:.3f}x bare matmul(out=)"
            )
            peak = burn_rate.peak_for(name, dtype) if device == "cuda" else None
            frac = f", {burn_med / 1000 / peak:.1%} of the {peak:g} TFLOP/s peak" if peak else ""
            say(
                f"[burn] RESULT {dtype}: burner/bare {burn_med / bare_med:.3f} (median of "
                f"{rounds}; target >= 0.95){frac}; errors "
                f"{sum(p['errors'] for p in pairs)}; duty {min(p['duty'] for p in pairs):.4f} "
                "(lowest)"
            )
            same_med = statistics.median(p["ratio_same_operands"] for p in pairs)
            clocks = [p["ratio_per_clock"] for p in pairs if p["ratio_per_clock"]]
            say(
                f"[burn] RESULT {dtype}: burner / bare loop on the burner's own operands "
                f"{same_med:.3f} (the burner's overhead; target >= 0.95)"
                + (f"; per MHz vs the rand loop {statistics.median(clocks):.3f}" if clocks else "")
            )
            out["dtypes"][dtype] = {
                "pairs": pairs,
                "ratio_median": burn_med / bare_med,
                "ratio_same_operands_median": same_med,
                "addmm_gflops": acc,
                "addmm_over_bare": acc / bare_med,
            }
            save(results, "burn", out)
        if device == "cuda":
            torch.cuda.empty_cache()
        say("[burn] the burner as a process (python -m gpuctl.workloads.burn), default memory:")
        fg = first_gemm(a)
        out["first_gemm"] = fg
        s = fg.get("summary", {})
        say(
            f"[burn] RESULT first GEMM {fg.get('first_gemm_wall_s')} s after Popen (target < 3 s; "
            f"burner's own clock {fg.get('startup')}); summary: {s.get('verdict')}, "
            f"{s.get('slots')} slots, {s.get('tflops_mean')} TFLOP/s, errors {s.get('errors')}"
        )
    finally:
        save(results, "burn", out)
    return 0


# -- ddp -----------------------------------------------------------------------------------
def part_ddp(a: argparse.Namespace, results: Path) -> int:
    from gpuctl.workloads.accept_suite.schema import SECTIONS

    keep = {"env", "ddp_allreduce", "ddp_train"}
    skip = [x for s in SECTIONS if s not in keep for x in ("--skip", s)]
    with tempfile.TemporaryDirectory(prefix="gpuctl-check-ddp-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "gpuctl.workloads.accept_suite",
            "--device",
            a.device,
            "--quick",
        ]
        cmd += ["--report-dir", tmp, "--ddp-procs", "1", *skip]
        say(f"[ddp] {' '.join(cmd[1:])}")
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=110)
        for line in proc.stdout.splitlines():
            if line.startswith(("[DDP]", "[RESULT]", "[ENV]")) or "SECTION" in line:
                say(f"[ddp]   {line}")
        if proc.returncode not in (0, 1):
            say(f"[ddp] exit {proc.returncode}: {proc.stderr.strip()[-1500:]}")
        reports = list(Path(tmp).glob("*.json"))
        out: dict[str, Any] = {"exit": proc.returncode}
        if reports:
            sections = json.loads(reports[0].read_text())["sections"]
            for name in ("ddp_allreduce", "ddp_train"):
                sec = sections.get(name, {})
                out[name] = {"verdict": sec.get("verdict"), "summary": sec.get("summary")}
                say(f"[ddp] RESULT {name}: {sec.get('verdict')} ({sec.get('summary')})")
        save(results, "ddp", out)
    ok = out.get("ddp_allreduce", {}).get("verdict") == "SKIP"
    return 0 if ok else 1


# The bundle's agent run under cProfile (runpy, ``-S``), for where its CPU goes beyond the
# reader's own (on the H100 the agent cost 1.02 ms a sample where its reader alone cost 0.48).
# The profiler starts at SIGUSR1 (sent once the agent has settled: imports are not a sample's).
_PROFILED = (
    "import cProfile, runpy, signal, sys\n"
    "bundle, out = sys.argv[1], sys.argv[2]\n"
    "sys.argv = [bundle] + sys.argv[3:]\n"
    "prof = cProfile.Profile()\n"
    "signal.signal(signal.SIGUSR1, lambda *_: prof.enable())\n"
    "try:\n"
    "    runpy.run_path(bundle, run_name='__main__')\n"
    "except SystemExit:\n"
    "    pass\n"
    "prof.disable()\n"
    "prof.dump_stats(out)\n"
)


def part_agentprof(a: argparse.Namespace, results: Path) -> int:
    """The real agent (bundle, ``python3 -S``, 1 Hz) under cProfile, with a process on GPU 0:
    its CPU per sample (schedstat, profiler's overhead included) and the functions that
    take it, per sample, by own time."""
    import pstats

    from benchmarks import agent_cpu
    from gpuctl.bundle import write_bundle

    samples = 8 if a.quick else 40
    hold = holder(a.device)
    out: dict[str, Any] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="gpuctl-check-") as tmp:
            bundle = str(write_bundle(Path(tmp) / "bundle"))
            prof = Path(tmp) / "agent.prof"
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            cmd = [sys.executable, "-S", "-c", _PROFILED, bundle, str(prof)]
            agent = agent_cpu.Agent(cmd, ["--interval", "1"], env)
            try:
                hello = agent.next_message()
                for _ in range(3):
                    agent.next_sample()
                agent.proc.send_signal(signal.SIGUSR1)
                agent.next_sample()
                first = agent.next_sample()
                start = agent_cpu.cpu_ns(agent.proc.pid)
                last = first
                for _ in range(samples):
                    last = agent.next_sample()
                used = agent_cpu.cpu_ns(agent.proc.pid) - start
                count = int(str(last["seq"])) - int(str(first["seq"]))
            finally:
                agent.close()
            per = used / count / 1e6
            say(f"[agentprof] reader {hello.get('reader')}, {count} samples: {per:.3f} ms CPU "
                f"a sample under the profiler")  # fmt: skip
            stats = pstats.Stats(str(prof))
            total_calls = max(1, count + 1)  # the profiled samples: the window and one before
            rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:25]  # type: ignore[attr-defined]
            out["ms_per_sample"] = per
            out["top"] = []
            for (file, line, fn), (_cc, nc, tt, ct, _callers) in rows:
                where = f"{Path(file).name}:{line}({fn})" if line else fn
                own, cum = tt / total_calls * 1000, ct / total_calls * 1000
                row = f"{own:8.3f} ms own {cum:8.3f} ms cum  x{nc / total_calls:6.1f}  {where}"
                out["top"].append(row)
                say(f"[agentprof]   {row}")
    finally:
        hold.kill()
        hold.wait()
        save(results, "agentprof", out)
    return 0


_STARTUP = """
import sys, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) // 1024 for l in f if l.startswith("VmRSS"))
imported = rss()
dev = torch.device(sys.argv[1])
x = torch.ones(1, device=dev)
if dev.type == "cuda":
    torch.cuda.synchronize()
t2 = time.perf_counter()
print(f"{t1 - t0:.3f} {t2 - t1:.3f} {imported} {rss()}")
"""


def part_startup(a: argparse.Namespace, results: Path) -> int:
    """Where a burner's start-up goes before its first GEMM: ``import torch`` in a fresh
    process, ``--rounds`` + 1 times (the first may read the libraries from disk), then the
    device's first use; the RSS of a process holding torch (what a pre-started, waiting burner
    would cost a node); the imports that take the time (``-X importtime``, by own time)."""
    out: dict[str, Any] = {"runs": []}
    try:
        for i in range(a.rounds + 1):
            cmd = [sys.executable, "-c", _STARTUP, a.device]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            imp, dev, rss_imp, rss_dev = r.stdout.split()[-4:]
            out["runs"].append(
                {"import_s": float(imp), "device_s": float(dev), "rss_mb": int(rss_imp),
                 "rss_device_mb": int(rss_dev)}
            )  # fmt: skip
            say(f"[startup] #{i + 1}: import torch {imp} s, first device use {dev} s; RSS "
                f"{rss_imp} MB after the import, {rss_dev} MB after the device's first "
                "use")  # fmt: skip
        r = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", "import torch"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        rows = []
        for line in r.stderr.splitlines():
            parts = line.split("|")
            if (
                line.startswith("import time:")
                and len(parts) == 3
                and parts[0][12:].strip().isdigit()
            ):
                rows.append((int(parts[0][12:]), int(parts[1]), parts[2].rstrip()))
        total = max((c for _, c, _ in rows), default=0)
        say(f"[startup] -X importtime: {total / 1e6:.3f} s in all; by own time:")
        for own, cum, name in sorted(rows, reverse=True)[:12]:
            say(f"[startup]   {own / 1e6:7.3f} s own {cum / 1e6:7.3f} s cum  {name.strip()}")
        out["importtime_top"] = sorted(rows, reverse=True)[:12]
        imports = [r["import_s"] for r in out["runs"][1:]] or [out["runs"][0]["import_s"]]
        say(f"[startup] RESULT import torch {out['runs'][0]['import_s']:.3f} s first, "
            f"{statistics.median(imports):.3f} s median after; a process holding torch "
            f"{out['runs'][-1]['rss_mb']} MB RSS")  # fmt: skip
    finally:
        save(results, "startup", out)
    return 0


PARTS = {"agent": part_agent, "burn": part_burn, "ddp": part_ddp, "agentprof": part_agentprof,
         "startup": part_startup}  # fmt: skip


# -- the driver ----------------------------------------------------------------------------
def run_part(name: str, a: argparse.Namespace, results: Path, limit: float, log: Any) -> str:
    cmd = [sys.executable, __file__, "--part", name, "--results", str(results)]
    cmd += ["--device", a.device, "--seconds", str(a.seconds), "--rounds", str(a.rounds)]
    cmd += ["--quick"] if a.quick else []
    cmd += ["--old", a.old, "--old-ref", a.old_ref, "--agent-rounds", str(a.agent_rounds)]
    env = dict(os.environ)
    if a.device == "cpu" and name in ("agent", "agentprof"):
        from gpuctl_tests.node.nvml_stub import CONFIG_ENV, build

        lib = build(results / "stub")
        conf = results / "stub" / "nvml.conf"
        # two H100s that, like SXM parts, have no fan and no retired pages; GPU 0 has a
        # process (the holder's pid is not known here: any pid will do for NVML's list)
        conf.write_text(
            "count 2\nerror 0 3 fan retired\nerror 1 3 fan retired\n"
            f"proc 0 {os.getpid()} 1024\nprocutil 0 {os.getpid()} 37 5\n"
        )
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (str(lib), env.get("LD_LIBRARY_PATH")) if p
        )
        env[CONFIG_ENV] = str(conf)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        start_new_session=True,
    )  # fmt: skip

    def forward() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            log.write(line)
            log.flush()

    t = threading.Thread(target=forward, daemon=True)
    t.start()
    try:
        rc = proc.wait(timeout=limit)
        status = "ok" if rc == 0 else f"exit {rc}"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the part's own session: its children too
        proc.wait()
        status = f"TIMED OUT after {limit:.0f} s"
    t.join(5)
    line = f"== part {name}: {status} in {time.monotonic() - started:.1f} s"
    say(line)
    log.write(line + "\n")
    return status


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument(
        "--parts", default="agent,burn,ddp", help="comma list: agent,burn,ddp,agentprof,startup"
    )
    p.add_argument("--seconds", type=float, default=10.0, help="each bare/burner run (CUDA)")
    p.add_argument("--rounds", type=int, default=2, help="bare/burner alternations per dtype")
    p.add_argument("--budget", type=float, default=400.0, help="seconds for all parts")
    p.add_argument("--quick", action="store_true", help="fewer samples (a dry run)")
    p.add_argument("--old", default=str(OLD_DIR), help="folder holding the old agent's gpuctl")
    p.add_argument("--old-ref", default=OLD_REF, help="git ref of the old agent (with .git)")
    p.add_argument("--agent-rounds", type=int, default=2, help="old/new agent alternations")
    p.add_argument("--out", help="folder for gpu_check.log/.json (default: $OUT, else a temp)")
    p.add_argument("--part", choices=tuple(PARTS), help=argparse.SUPPRESS)
    p.add_argument("--results", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.part:
        return PARTS[a.part](a, Path(a.results))
    out = Path(a.out or os.environ.get("OUT") or tempfile.mkdtemp(prefix="gpu-check-"))
    out.mkdir(parents=True, exist_ok=True)
    results = out / "parts"
    results.mkdir(exist_ok=True)
    deadline = time.monotonic() + a.budget
    statuses = {}
    with open(out / "gpu_check.log", "a") as log:
        head = f"gpu_check {time.strftime('%Y-%m-%d %H:%M:%S')} device {a.device}, {sys.version}"
        say(head)
        log.write(head + "\n")
        for name in (x.strip() for x in a.parts.split(",") if x.strip()):
            left = deadline - time.monotonic()
            if left < 10:
                statuses[name] = "not run: out of budget"
                say(f"== part {name}: not run, {left:.0f} s of the budget left")
                continue
            statuses[name] = run_part(name, a, results, min(PART_LIMITS[name], left), log)
    merged: dict[str, Any] = {"device": a.device, "status": statuses}
    for f in sorted(results.glob("*.json")):
        merged[f.stem] = json.loads(f.read_text())
    (out / "gpu_check.json").write_text(json.dumps(merged, indent=1, default=str))
    say(f"== {statuses}; written to {out}/gpu_check.log and gpu_check.json")
    return 0 if all(s == "ok" for s in statuses.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
