"""[BURN]: every GPU burns at once for ``--burn`` (e.g. 10m) with the torch burner
(``gpuctl.workloads.burn``, one process per GPU), while NVML is read once a second per GPU:
power, SM clock, temperature and the clock event (throttle) reasons.

A GPU fails when its burner finds wrong results or dies, when it was throttled by heat or by a
power brake at any second (HW slowdown, HW thermal, HW power brake, SW thermal: a power cap is
normal under a burn), or when its median SM clock sags below the node's: more than
``max(5%, 3 x MAD)`` under the median of the GPUs' medians (the node's own spread sets the bar,
so eight GPUs that all run at 1.7 GHz are fine and the one at 1.4 GHz is the finding). The
first seconds (boost ramp, calibration) are left out of the clock figures. The per-second
arrays go into the report; the rendered report draws them (``render.burn_plots``).
"""

import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from typing import IO, TYPE_CHECKING, Any

from gpuctl.node.metrics import throttle_badge, throttle_order
from gpuctl.node.proc import json_object, spawn, stop_group
from gpuctl.node.protocol import MAX_DURATION_CEILING, decode_throttle, parse_seconds

if TYPE_CHECKING:
    from gpuctl.workloads.accept_suite.suite import Suite

BAD_THROTTLE = ("hw_slowdown", "hw_thermal", "hw_power_brake", "sw_thermal")
SAG_FLOOR = 0.05  # a GPU may run this fraction below the node's median clock ...
SAG_MADS = 3.0  # ... or this many median absolute deviations, whichever is wider
WARMUP_S = 10.0  # clock figures start after this (or after a fifth of the burn, if shorter)
INTERVAL_S = 1.0
GRACE_S = 120.0  # past the burn's length: start-up and calibration, then the burners are stopped
CPU_SIZE = 512  # matrix size of a CPU burn (tests): rounds stay short on two cores


def parse_duration(text: str) -> float:
    """Seconds from ``"10m"``, ``"90s"``, ``"1h"`` or a plain number of seconds (0: no burn).

    Raises ValueError with a one-line message naming the accepted forms."""
    seconds = parse_seconds(text)
    if seconds is None or seconds >= MAX_DURATION_CEILING:
        raise ValueError(f"--burn {text!r}: expected a duration such as 10m, 90s, 1h or 0")
    return seconds


def run(suite: "Suite") -> "dict[str, Any]":
    """[BURN]: all devices burn together for ``--burn`` seconds, traced at 1 Hz."""
    seconds = suite.args.burn
    if not seconds:
        return {"verdict": "SKIP", "summary": "no --burn duration (e.g. --burn 10m)"}
    if suite.cuda and suite.torch is not None:
        suite.torch.cuda.empty_cache()  # the earlier sections' cached blocks: the burners' now
    burners = _start(suite, seconds)
    trace = _Trace(suite)
    deadline = time.monotonic() + seconds + GRACE_S
    stopped = False
    try:
        while any(b.proc.poll() is None for b in burners):
            trace.sample()
            if time.monotonic() > deadline and not stopped:
                stopped = True
                for b in burners:  # SIGTERM: the burner ends its round and sends its summary
                    if b.proc.poll() is None:
                        os.killpg(b.proc.pid, signal.SIGTERM)
            trace.wait()
    finally:
        for b in burners:
            if b.proc.poll() is None:
                stop_group(b.proc.pid, 10.0, b.proc)
            b.proc.wait()
            b.reader.join(5.0)
    return judge(suite, seconds, burners, trace, stopped)


class _Burner:
    """One burner process and what its JSON lines said."""

    def __init__(self, label: str, argv: "list[str]") -> None:
        self.label = label
        self.argv = argv
        self.progress: list[dict[str, Any]] = []
        self.summary: dict[str, Any] | None = None
        self.other: list[str] = []
        self.proc = spawn(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=_env(),
            death_signal=signal.SIGTERM,
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        stream: IO[bytes] = self.proc.stdout  # type: ignore[assignment]
        for raw in stream:
            msg = json_object(raw)
            if msg is None:
                text = raw.decode("utf-8", "replace").strip()
                if text:
                    self.other = [*self.other[-19:], text[:300]]
            elif msg.get("type") == "progress":
                self.progress.append(msg)
            elif msg.get("type") == "summary":
                self.summary = msg


def _env() -> "dict[str, str]":
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _start(suite: "Suite", seconds: float) -> "list[_Burner]":
    base = [sys.executable, "-m", "gpuctl.workloads.burn", "--duration", f"{seconds:g}"]
    if not suite.cuda:
        argv = [*base, "--device", "cpu", "--size", str(CPU_SIZE)]
        return [_Burner("cpu", argv)]
    visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    out = []
    for g in suite.gpus:
        i = int(g["index"])
        # The burner pins itself with CUDA_VISIBLE_DEVICES=<--gpu>: a UUID (or the index this
        # process's own CUDA_VISIBLE_DEVICES maps i to) names the same GPU in every case.
        gpu = g.get("uuid") or (visible[i] if i < len(visible) else str(i))
        out.append(_Burner(f"gpu{i}", [*base, "--device", "cuda", "--gpu", str(gpu)]))
    return out


class _Trace:
    """Per-second NVML readings of every GPU NVML knows (none on a CPU run without it)."""

    def __init__(self, suite: "Suite") -> None:
        self.nvml = suite.nvml if suite.nvml is not None and suite.nvml.nv is not None else None
        indexes = sorted(self.nvml.handles) if self.nvml is not None else []
        names = {int(g["index"]): g.get("name") for g in suite.gpus}
        self.t0 = time.monotonic()
        self.next = self.t0
        self.t: list[float] = []
        self.gpus: list[dict[str, Any]] = [
            {
                "index": i,
                "label": f"gpu{i}",
                "name": names.get(i),
                "power_w": [],
                "sm_clock_mhz": [],
                "temp_c": [],
                "throttle": [],
            }
            for i in indexes
        ]

    def sample(self) -> None:
        if self.nvml is None:
            return
        self.t.append(round(time.monotonic() - self.t0, 2))
        for g in self.gpus:
            s = self.nvml.sample(g["index"])
            for key in ("power_w", "sm_clock_mhz", "temp_c", "throttle"):
                g[key].append(s[key])

    def wait(self) -> None:
        """Sleep to the next whole interval (1 Hz without drift; a slow read skips ahead)."""
        self.next += INTERVAL_S
        now = time.monotonic()
        if self.next < now:
            self.next = now
        time.sleep(self.next - now)


def judge(
    suite: "Suite", seconds: float, burners: "list[_Burner]", trace: _Trace, stopped: bool
) -> "dict[str, Any]":
    """The section's result: burner outcomes, throttling and clock sag per GPU, the trace."""
    failures: list[str] = []
    devices = []
    for b in burners:
        s = b.summary or {}
        verdict = s.get("verdict") or "DIED"
        reason = s.get("reason")
        if b.summary is None:
            reason = f"no summary (exit {b.proc.returncode}): {' | '.join(b.other[-3:])}"
        devices.append(
            {
                "label": b.label,
                "verdict": verdict,
                "reason": reason,
                "tflops_mean": s.get("tflops_mean"),
                "errors": s.get("errors"),
                "iterations": s.get("iterations"),
                "elapsed": s.get("elapsed"),
                "tflops": [p.get("tflops") for p in b.progress],
            }
        )
        if verdict != "OK":
            failures.append(f"burn {b.label}: {verdict} ({reason})")
        suite.out.line(
            f"{b.label} burner {verdict}: {s.get('tflops_mean')} TFLOP/s mean, "
            f"{s.get('errors')} errors over {s.get('elapsed')} s"
            + (f" ({reason})" if reason else "")
        )
    if stopped:
        failures.append(f"burn: burners still running {seconds + GRACE_S:g} s in; stopped")
    warm = min(WARMUP_S, seconds / 5)
    steady = [k for k, t in enumerate(trace.t) if t >= warm] or list(range(len(trace.t)))
    for g in trace.gpus:
        seen: dict[str, int] = {}
        for mask in g["throttle"]:
            for name in decode_throttle(mask) or ():
                seen[name] = seen.get(name, 0) + 1
        g["throttle_seconds"] = seen
        clocks = [g["sm_clock_mhz"][k] for k in steady if g["sm_clock_mhz"][k] is not None]
        g["sm_clock_median"] = statistics.median(clocks) if clocks else None
        powers = [p for p in g["power_w"] if p is not None]
        temps = [t for t in g["temp_c"] if t is not None]
        g["power_max_w"] = max(powers) if powers else None
        g["temp_max_c"] = max(temps) if temps else None
        g["problems"] = [
            f"throttled {throttle_badge(name)} for {seen[name]} of {len(g['throttle'])} s"
            for name in BAD_THROTTLE
            if seen.get(name)
        ]
    medians = [g["sm_clock_median"] for g in trace.gpus if g["sm_clock_median"] is not None]
    node_median = statistics.median(medians) if len(medians) > 1 else None
    allowed = None
    if node_median:
        mad = statistics.median(abs(m - node_median) for m in medians)
        allowed = max(SAG_FLOOR * node_median, SAG_MADS * mad)
        for g in trace.gpus:
            m = g["sm_clock_median"]
            if m is not None and m < node_median - allowed:
                sag, room = 100 * (1 - m / node_median), 100 * allowed / node_median
                g["problems"].append(
                    f"SM clock {m:g} MHz is {sag:.1f}% below the node's median "
                    f"{node_median:g} MHz (allowed {room:.1f}%)"
                )
    for g in trace.gpus:
        g["verdict"] = "FAIL" if g["problems"] else "PASS"
        g["reason"] = "; ".join(g.pop("problems")) or None
        if g["reason"]:
            failures.append(f"burn {g['label']}: {g['reason']}")
        took = g["throttle_seconds"]
        held = ", ".join(f"{throttle_badge(k)} {took[k]} s" for k in throttle_order(took))
        suite.out.line(
            f"{g['label']} max {g['power_max_w']} W, max {g['temp_max_c']} C, median SM clock "
            f"{g['sm_clock_median']} MHz, throttle "
            + (held or "none")
            + f"  {g['verdict']}"
            + (f" ({g['reason']})" if g["reason"] else "")
        )
    verdict = "FAIL" if failures else "PASS"
    if failures:
        summary = "; ".join(failures)
    else:
        summary = f"{len(burners)} device(s) burned {seconds:g} s" + (
            f", SM clocks within {100 * allowed / node_median:.1f}% of {node_median:g} MHz"
            if allowed and node_median
            else ""
        )
        if trace.nvml is None:
            summary += " (NVML unavailable: no power/clock/temperature trace)"
    return {
        "verdict": verdict,
        "summary": summary,
        "failures": failures,
        "burn_seconds": seconds,
        "interval_s": INTERVAL_S,
        "warmup_s": warm,
        "node_sm_clock_median": node_median,
        "sm_clock_allowed_mhz": allowed,
        "devices": devices,
        "trace": {"t": trace.t, "gpus": trace.gpus},
    }
