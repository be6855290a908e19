"""The agent's stress plugin: starts, watches and always stops GPU burners.

Requests (added to the agent by ``install(agent)``; Python 3.6, standard library only)
    stress_start  gpus (list of indices | "all"), engine ("auto" | "torch" | "gpu-burn"),
                  dtype, duration (s, default: the cap), max_duration (s: lowers the cap for
                  this request; above the agent's cap it is refused), mem_fraction,
                  workload_python (VENV2's python, default this agent's), gpu_burn (path of a
                  gpu_burn binary), gpu_burn_source (a gpu-burn source folder to build from),
                  device ("cuda" | "cpu": "cpu" runs the torch burner on the CPU, for tests),
                  size (matrix size), owner ({user, host, session}: who starts the burn, see
                  below; optional)
                  -> ok {started, busy, engine, ends_at}
    stress_stop   gpus (list | "all"), others (bool: also burners this agent did not start,
                  found in /proc: another gpuctl session's), owner_user (a user name: of those
                  other burners only the ones whose owner has this user; the rest, and burners
                  with no owner, are left alone and listed in ``kept``)
                  -> ok {stopping (GPUs of this agent's burns), others (pids signalled), kept
                  (burners left alone: pid, gpu, gpu_index, device, engine, owner)}
    stress_status                           -> stress {burns, others, max_duration}
                  ``others``: burners found in /proc (pid, engine, gpu, gpu_index, device,
                  duration, age, owner)

Owners: ``owner`` is ``{"user": ..., "host": ..., "session": ...}``, strings of 1..256 printable
characters (anything else is refused as bad_argument): the login user, the login host and that
gpuctl process's session id. The agent records it on the burn, reports it in the burn's events
and in ``stress_status``, and puts it in the burner's environment as ``GPUCTL_BURN_OWNER``
(JSON), which ``scan_burners`` reads back from ``/proc/PID/environ`` (same uid, so readable):
another session's agent sees whose a burner is. A burner without it (started by hand, or by an
older gpuctl) has owner null.

The cap is the agent's ``max_duration`` (``agent --max-duration``, default
``protocol.DEFAULT_MAX_DURATION``; gpuctl sets it from its config with ``configure``), never above
``protocol.MAX_DURATION_CEILING``. A longer request is refused with a one-line error.

Events: ``{"type":"event","kind":"burn","gpu":N,"detail":{state, engine, tflops, tflops_mean,
errors, iterations, ends_at, verdict, reason, owner, ...}}`` with state "starting" | "running" |
"stopping" | "done" | "failed". "done" or "failed" is sent only once the burner's process group
is gone: the GPU is free then.

Dead-man's switch: every burner is started by ``proc.spawn`` (its own session, SIGKILL as its
parent-death signal), so it dies with the agent even when the agent is SIGKILLed; the agent's
close hook stops every burner when stdin closes (gpuctl quit, SSH link lost) or when the agent
heard nothing for its liveness timeout (a frozen login, a partition); every burn ends at its
duration, which cannot exceed the cap, and the agent enforces it. Stopping is SIGTERM to the
group, then SIGKILL after a grace period.

On a simulated reader the plugin drives the simulated GPUs' load instead of starting torch and
emits synthetic progress, so the demo burns without torch or a GPU.
"""

import json
import os
import signal
import subprocess
import sys
import time
from typing import IO, TYPE_CHECKING, Any, Callable, Dict, List, Optional, cast

from . import proc, protocol
from .messages import PROGRESS

if TYPE_CHECKING:
    from .agent import Agent
    from .messages import BurnerInfo, BurnState, GpuBurn, OwnerWire, StressReply, StressStatus

GRACE_S = 5.0  # SIGTERM -> SIGKILL on stop and on the duration limit
CLOSE_GRACE_S = 1.0  # shorter when the agent itself is going away
# A burner's duration counts from its first progress line (torch import and CUDA start-up can
# take a while); the agent's limit before that line is duration + this allowance.
STARTUP_S = 120.0
# gpu-burn's -stts: at the end of its TIME it SIGTERMs its workers, sleeps this long (its default
# is 30 s), then prints its OK/FAULTY summary. The agent waits that long past a gpu-burn burn's
# duration before it stops the burn itself (a stop would kill gpu-burn before its summary).
GPU_BURN_STTS_S = 3
END_ALLOWANCE_S = {"gpu-burn": GPU_BURN_STTS_S + 2.0}
ENGINES = ("auto", "torch", "gpu-burn")
DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp64")
ACTIVE = ("starting", "running", "stopping")
TAIL_LINES = 20
BURN_OWNER_ENV = "GPUCTL_BURN_OWNER"  # a burner's owner (JSON), read back from /proc/PID/environ
OWNER_FIELDS = ("user", "host", "session")
OWNER_LIMIT = 256  # characters of one owner field
ENVIRON_LIMIT = 1 << 20  # bytes of /proc/PID/environ read

# Dense peaks (TFLOP/s: fp64, fp32, tf32, bf16/fp16) for the simulated burn's synthetic rate.
SIM_PEAKS = (
    ("H200", (67.0, 67.0, 494.5, 989.0)),
    ("H100", (67.0, 67.0, 494.5, 989.0)),
    ("A100", (19.5, 19.5, 156.0, 312.0)),
    ("L40S", (1.4, 91.6, 183.0, 362.0)),
    ("A6000", (1.2, 38.7, 77.4, 154.8)),
    ("4090", (1.3, 82.6, 82.6, 165.2)),
    ("V100", (7.8, 15.7, 15.7, 125.0)),
)
SIM_EFFICIENCY = 0.8  # what a real short bf16 GEMM run reaches of the dense peak


def find_on_path(name: str, path: Optional[str] = None) -> Optional[str]:
    """The first executable ``name`` on PATH, or None (``shutil.which`` without the import)."""
    for d in (path if path is not None else os.environ.get("PATH", "")).split(os.pathsep):
        candidate = os.path.join(d or ".", name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


BURNER_MODULES = {"gpuctl.workloads.burn": "torch", "gpuctl.workloads.gpuburn": "gpu-burn"}


def _arg(argv: List[str], flag: str) -> Optional[str]:
    try:
        return argv[argv.index(flag) + 1]
    except (ValueError, IndexError):
        return None


def check_owner(value: Any) -> "Optional[OwnerWire]":
    """``value`` as an owner dict (see the module docstring), None for None; raises ValueError
    with a one-line reason for anything else."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError("owner must be an object {user, host, session}")
    for key in OWNER_FIELDS:
        text = value.get(key)
        if not isinstance(text, str) or not 0 < len(text) <= OWNER_LIMIT \
                or not text.isprintable():
            raise ValueError("owner %s must be 1..%d printable characters" % (key, OWNER_LIMIT))
    return {"user": value["user"], "host": value["host"], "session": value["session"]}


def read_owner(environ: bytes) -> "Optional[OwnerWire]":
    """The owner a burner's environment (``/proc/PID/environ``) names, or None."""
    prefix = BURN_OWNER_ENV.encode() + b"="
    for entry in environ.split(b"\0"):
        if entry.startswith(prefix):
            try:
                return check_owner(protocol.parse_json(entry[len(prefix):]))
            except ValueError:
                return None
    return None


def scan_burners(proc_root: str = "/proc") -> "List[BurnerInfo]":
    """gpuctl burners of this user running on this machine, whoever started them: one dict
    (pid, engine, gpu, device, duration, age, owner) per process group leader."""
    uid = os.getuid()
    btime = proc.boot_time(proc_root)
    out = []  # type: List[BurnerInfo]
    for entry in os.listdir(proc_root):
        if not entry.isdigit():
            continue
        pid = int(entry)
        base = os.path.join(proc_root, entry)
        try:
            if os.stat(base).st_uid != uid:
                continue
            with open(os.path.join(base, "cmdline"), "rb") as f:
                argv = [a.decode("utf-8", "replace") for a in f.read().split(b"\0")]
        except OSError:
            continue
        module = _arg(argv, "-m")
        if module not in BURNER_MODULES:
            continue
        stat = proc.read_stat(pid, proc_root)
        if stat is None or stat.state in ("Z", "X") or stat.pgrp != pid:
            continue  # gone, a zombie, or not the leader of its own group
        try:
            with open(os.path.join(base, "environ"), "rb") as f:
                owner = read_owner(f.read(ENVIRON_LIMIT))
        except OSError:
            owner = None
        age = None
        if btime is not None:
            age = round(time.time() - (btime + stat.start_ticks / float(proc.CLOCK_TICKS)), 1)
        text = _arg(argv, "--duration")
        try:
            duration = float(text) if text is not None else None
        except ValueError:
            duration = None
        out.append({"pid": pid, "engine": BURNER_MODULES[str(module)],
                    "gpu": _arg(argv, "--gpu"), "device": _arg(argv, "--device") or "cuda",
                    "duration": duration, "age": age, "owner": owner})
    return sorted(out, key=lambda b: int(b["pid"]))


class Burn(object):
    """One burner on one GPU (a process group, or a simulated load)."""

    def __init__(self, gpu: int, engine: str, duration: float, ends_at: float,
                 dtype: Optional[str], owner: "Optional[OwnerWire]" = None) -> None:
        self.gpu = gpu
        self.owner = owner  # who started it (see the module docstring), or None
        self.engine = engine
        self.duration = duration
        self.ends_at = ends_at  # unix time, for people
        self.deadline = time.monotonic() + duration + STARTUP_S  # monotonic, for enforcement
        self.dtype = dtype
        self.state = "starting"
        self.proc = None  # type: Optional[subprocess.Popen[bytes]]
        self.pgid = None  # type: Optional[int]
        self.streams = []  # type: List[IO[bytes]]  # open output pipes of the burner
        self.stderr_tail = []  # type: List[str]
        self.progress = {}  # type: Dict[str, Any]
        self.summary = None  # type: Optional[Dict[str, Any]]
        self.stop_reason = None  # type: Optional[str]
        self.term_at = None  # type: Optional[float]
        self.killed = False
        self.reason = None  # type: Optional[str]
        self.verdict = None  # type: Optional[str]
        self.last_emit = 0.0
        self.iterations = 0.0
        self.started = time.monotonic()

    def note(self, text: str) -> None:
        """Keep a line of the burner's stderr (or non-JSON stdout) for the failure reason."""
        self.stderr_tail.append(text[:500])
        del self.stderr_tail[:-TAIL_LINES]

    def detail(self) -> "BurnState":
        d = {
            "state": self.state,
            "engine": self.engine,
            "ends_at": self.ends_at,
            # what the burner says it computes (gpu-burn has no bf16), else what was asked
            "dtype": self.progress.get("dtype") or self.dtype,
            "verdict": self.verdict,
            "reason": self.reason,
            "pid": self.proc.pid if self.proc is not None else None,
            "owner": self.owner,
        }  # type: BurnState
        for key in PROGRESS:  # BurnState's keys, which mypy cannot see through a loop
            if key in self.progress:
                d[key] = self.progress[key]  # type: ignore[literal-required]
        return d


class StressPlugin(object):
    """Burners of one agent; see the module docstring."""

    def __init__(self, agent: "Agent", grace: float = GRACE_S,
                 close_grace: float = CLOSE_GRACE_S) -> None:
        self.agent = agent
        try:  # tests shorten the SIGTERM -> SIGKILL grace
            grace = float(os.environ.get("GPUCTL_STRESS_GRACE", grace))
        except ValueError:
            pass
        self.grace = grace
        self.close_grace = close_grace
        self.burns = {}  # type: Dict[int, Burn]  # until its process group is gone
        self.finished = {}  # type: Dict[int, BurnState]  # detail of the last ended burn
        self.sim_clocks = {}  # type: Dict[int, float]  # sm clock fraction (simulated)
        # pgid -> SIGTERM time, for other sessions' burners we were asked to stop
        self.foreign = {}  # type: Dict[int, float]
        reader = agent.reader
        self.simulated = reader is not None and getattr(reader, "name", None) == "simulated"
        self.statics = {g["index"]: g for g in (reader.static() if reader is not None else [])}

    @property
    def max_duration(self) -> float:
        """The agent's cap on every burn (s)."""
        return self.agent.max_duration

    def _simulate(self, action: str, fields: Dict[str, Any]) -> None:
        getattr(self.agent.reader, "simulate")(action, fields)

    # -- requests ------------------------------------------------------------------------------
    def on_start(self, msg: Dict[str, Any], req_id: Any) -> None:
        agent = self.agent
        try:
            opts = self._parse_start(msg)
        except ValueError as e:
            agent.reply_error("bad_argument", str(e), req_id)
            return
        started, busy = [], []
        ends_at = time.time() + opts["duration"]
        for gpu in opts["gpus"]:
            if gpu in self.burns:
                busy.append(gpu)
                continue
            burn = Burn(gpu, opts["engine"], opts["duration"], ends_at, opts["dtype"],
                        opts["owner"])
            self.burns[gpu] = burn
            self.finished.pop(gpu, None)
            started.append(gpu)
        if opts["engine"] == "sim":
            if started:
                self._simulate("load", {"gpus": started, "load": 1.0})
            for gpu in started:
                self.burns[gpu].state = "running"
                self.burns[gpu].deadline = time.monotonic() + opts["duration"]
        reply = {"type": "ok", "request": "stress_start", "id": req_id, "started": started,
                 "busy": busy, "engine": opts["engine"], "ends_at": ends_at,
                 "duration": opts["duration"]}  # type: StressReply
        agent.send(reply)
        for gpu in started:
            burn = self.burns[gpu]
            self._emit(burn)
            if opts["engine"] != "sim":
                self._spawn(burn, opts)

    def _parse_start(self, msg: Dict[str, Any]) -> Dict[str, Any]:
        device = msg.get("device", "cuda")
        if device not in ("cuda", "cpu"):
            raise ValueError("device must be \"cuda\" or \"cpu\"")
        gpus = self._gpus(msg.get("gpus"), allow_any=device == "cpu")
        engine = msg.get("engine") or "auto"
        if engine not in ENGINES:
            raise ValueError("engine must be one of %s" % ", ".join(ENGINES))
        dtype = msg.get("dtype")
        if dtype is not None and dtype not in DTYPES:
            raise ValueError("dtype must be one of %s" % ", ".join(DTYPES))
        cap = self.max_duration
        limit = _number(msg, "max_duration", cap, 1.0, protocol.MAX_DURATION_CEILING)
        if limit > cap:
            raise ValueError("max_duration %g s exceeds this node's cap of %g s (gpuctl's "
                             "[stress] max_duration)" % (limit, cap))
        duration = _number(msg, "duration", limit, 0.5, protocol.MAX_DURATION_CEILING)
        if duration > limit:
            raise ValueError("duration %g s exceeds the maximum of %g s (max_duration)"
                             % (duration, limit))
        mem_fraction = _number(msg, "mem_fraction", 0.9, 0.05, 0.99)
        python = msg.get("workload_python") or sys.executable
        if not isinstance(python, str):
            raise ValueError("workload_python must be a path")
        size = msg.get("size")
        if size is not None and (isinstance(size, bool) or not isinstance(size, int)
                                 or not 32 <= size <= 65536):
            raise ValueError("size must be an integer within 32..65536")
        gpu_burn = msg.get("gpu_burn")
        source = msg.get("gpu_burn_source")
        for name, value in (("gpu_burn", gpu_burn), ("gpu_burn_source", source)):
            if value is not None and not isinstance(value, str):
                raise ValueError("%s must be a path" % name)
        owner = check_owner(msg.get("owner"))
        if self.simulated and device == "cuda":
            engine = "sim"
        elif engine == "auto":
            found = gpu_burn or find_on_path("gpu_burn")
            engine = "gpu-burn" if device == "cuda" and found else "torch"
        if engine == "gpu-burn" and device == "cpu":
            raise ValueError("gpu-burn needs a GPU; use engine torch with device cpu")
        return {"gpus": gpus, "engine": engine, "dtype": dtype, "duration": duration,
                "mem_fraction": mem_fraction, "python": python, "device": device,
                "size": size, "gpu_burn": gpu_burn, "source": source, "owner": owner}

    def _gpus(self, value: Any, allow_any: bool = False) -> List[int]:
        if value is None or value == "all":
            if not self.statics:
                raise ValueError("this node has no GPUs the agent can see")
            return sorted(self.statics)
        if not isinstance(value, list) or not value:
            raise ValueError("gpus must be a list of GPU indices or \"all\"")
        out = []  # type: List[int]
        for g in value:
            if isinstance(g, bool) or not isinstance(g, int) or g < 0:
                raise ValueError("bad GPU index %r" % (g,))
            if g not in self.statics and not (allow_any and g < 1024):
                raise ValueError("no GPU %d on this node (%d GPUs)" % (g, len(self.statics)))
            if g not in out:
                out.append(g)
        return out

    def on_stop(self, msg: Dict[str, Any], req_id: Any) -> None:
        value = msg.get("gpus", "all")
        if value is None or value == "all":
            gpus = sorted(self.burns)
        elif isinstance(value, list) and all(isinstance(g, int) for g in value):
            gpus = [g for g in value if g in self.burns]
        else:
            self.agent.reply_error("bad_argument", "gpus must be a list of indices or \"all\"",
                                   req_id)
            return
        owner_user = msg.get("owner_user")
        if owner_user is not None and not isinstance(owner_user, str):
            self.agent.reply_error("bad_argument", "owner_user must be a user name", req_id)
            return
        for gpu in gpus:
            self.stop(self.burns[gpu], "stopped on request")
        others, kept = [], []  # type: List[int], List[BurnerInfo]
        if msg.get("others"):
            wanted = None if value is None or value == "all" else set(value)
            for b in self.others():
                b["gpu_index"] = self._gpu_index(b["gpu"])
                if wanted is not None and b["gpu_index"] not in wanted:
                    continue
                owner = b.get("owner")
                if owner_user is not None and (owner is None or owner["user"] != owner_user):
                    kept.append(b)  # another user's, or nobody's we know: not ours to stop
                    continue
                proc.signal_group(b["pid"], signal.SIGTERM)
                self.foreign[b["pid"]] = time.monotonic()
                others.append(b["pid"])
        reply = {"type": "ok", "request": "stress_stop", "id": req_id, "stopping": gpus,
                 "others": others, "kept": kept}  # type: StressReply
        self.agent.send(reply)
        self._finish_sim()

    def others(self) -> "List[BurnerInfo]":
        """Burners on this machine that this agent did not start (none for a node simulated
        inside another program: ``Agent.on_host``)."""
        if not self.agent.on_host:
            return []
        mine = set(b.pgid for b in self.burns.values() if b.pgid is not None)
        try:
            found = [b for b in scan_burners() if b["pid"] not in mine]
        except OSError:
            return []
        if self.simulated:  # simulated GPUs have no real burners; CPU test burns are real
            found = [b for b in found if b["device"] == "cpu"]
        return found

    def _gpu_index(self, gpu_arg: Optional[str]) -> Optional[int]:
        for index, static in self.statics.items():
            if gpu_arg in (str(index), static.get("uuid")):
                return int(index)
        try:
            return int(str(gpu_arg))
        except (TypeError, ValueError):
            return None

    def on_status(self, msg: Dict[str, Any], req_id: Any) -> None:
        burns = []  # type: List[GpuBurn]
        for gpu in sorted(set(self.burns) | set(self.finished)):
            burn = self.burns.get(gpu)
            d = cast("GpuBurn", dict(burn.detail() if burn is not None else self.finished[gpu]))
            d["gpu"] = gpu
            burns.append(d)
        others = self.others()
        for b in others:
            b["gpu_index"] = self._gpu_index(b["gpu"])
        status = {"type": "stress", "id": req_id, "burns": burns, "others": others,
                  "max_duration": self.max_duration, "simulated": self.simulated,
                  "gpu_burn": find_on_path("gpu_burn")}  # type: StressStatus
        self.agent.send(status)

    # -- processes -----------------------------------------------------------------------------
    def _spawn(self, burn: Burn, opts: Dict[str, Any]) -> None:
        gpu_id = str(burn.gpu)
        static = self.statics.get(burn.gpu) or {}
        if opts["device"] == "cuda" and static.get("uuid") and not self.simulated:
            gpu_id = static["uuid"]  # stable whatever CUDA_VISIBLE_DEVICES the agent inherited
        if burn.engine == "gpu-burn":
            argv = [opts["python"], "-m", "gpuctl.workloads.gpuburn", "run",
                    "--gpu", gpu_id, "--duration", "%g" % burn.duration,
                    "--stts", str(GPU_BURN_STTS_S),
                    "--mem-fraction", "%g" % opts["mem_fraction"]]
            if opts["gpu_burn"]:
                argv += ["--binary", opts["gpu_burn"]]
            if opts["source"]:
                argv += ["--source", opts["source"]]
        else:
            argv = [opts["python"], "-m", "gpuctl.workloads.burn", "--device", opts["device"],
                    "--duration", "%g" % burn.duration,
                    "--mem-fraction", "%g" % opts["mem_fraction"]]
            if opts["device"] == "cuda":
                argv += ["--gpu", gpu_id]
            if opts["size"]:
                argv += ["--size", str(opts["size"])]
        if burn.dtype:
            argv += ["--dtype", burn.dtype]
        try:
            # cwd /: imports come from PYTHONPATH (the bundle), not a stray checkout
            env = proc.bundle_env()
            env.pop(BURN_OWNER_ENV, None)  # the agent's own, if it inherited one, is not this
            if burn.owner is not None:
                env[BURN_OWNER_ENV] = json.dumps(burn.owner, sort_keys=True)
            child = proc.spawn(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env=env, cwd="/")
        except OSError as e:
            burn.state, burn.verdict = "failed", None
            burn.reason = "cannot start %s: %s" % (opts["python"], e.strerror or e)
            self._end(burn)
            return
        burn.proc = child
        burn.pgid = child.pid  # a session leader's group id is its pid
        assert child.stdout is not None and child.stderr is not None
        out = proc.JsonLines(on_text=burn.note)
        err = proc.LineBuffer()
        self._watch(burn, child.stdout, lambda data: self._messages(burn, out.feed(data)),
                    lambda: self._messages(burn, out.finish()))
        self._watch(burn, child.stderr, lambda data: _notes(burn, err.feed(data)),
                    lambda: _notes(burn, err.finish()))

    def _watch(self, burn: Burn, stream: IO[bytes], on_data: Callable[[bytes], None],
               on_end: Callable[[], None]) -> None:
        fd = stream.fileno()
        os.set_blocking(fd, False)
        burn.streams.append(stream)

        def on_readable() -> None:
            try:
                data = os.read(fd, 1 << 16)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if data:
                on_data(data)
                return
            on_end()
            self._close_stream(burn, stream)
            self._reap(burn)

        self.agent.add_reader(stream, on_readable)

    def _close_stream(self, burn: Burn, stream: IO[bytes]) -> None:
        self.agent.remove_reader(stream)
        stream.close()
        if stream in burn.streams:
            burn.streams.remove(stream)

    def _messages(self, burn: Burn, msgs: List[Dict[str, Any]]) -> None:
        for msg in msgs:
            self._message(burn, msg)

    def _message(self, burn: Burn, msg: Dict[str, Any]) -> None:
        kind = msg.get("type")
        if kind == "progress":
            burn.progress.update(msg)
            burn.progress.pop("message", None)
            if burn.state == "starting":
                burn.state = "running"
                elapsed = msg.get("elapsed")
                if not isinstance(elapsed, (int, float)) or not 0 <= elapsed <= burn.duration:
                    elapsed = 0.0
                burn.deadline = time.monotonic() - elapsed + burn.duration
                burn.ends_at = time.time() - elapsed + burn.duration
            self._emit(burn)
        elif kind == "summary":
            burn.summary = msg
            for key in ("tflops", "tflops_mean", "errors", "iterations", "elapsed", "size",
                        "duty", "temp", "dtype"):
                if key in msg:
                    burn.progress[key] = msg[key]
        elif kind in ("info", "step"):
            burn.progress["message"] = str(msg.get("message", ""))[:300]
            self._emit(burn)
        else:
            burn.note(str(msg)[:500])

    def stop(self, burn: Burn, reason: str) -> None:
        """Ask a burner to stop (SIGTERM to its group); SIGKILL follows after the grace."""
        if burn.state not in ACTIVE or burn.stop_reason is not None:
            return
        burn.stop_reason = reason
        burn.state = "stopping"
        if burn.engine == "sim":
            return
        if burn.proc is not None and burn.pgid is not None and burn.proc.poll() is None:
            proc.signal_group(burn.pgid, signal.SIGTERM)
        burn.term_at = time.monotonic()
        self._emit(burn)

    def _reap(self, burn: Burn) -> bool:
        """Finish a burn once its leader has exited, its pipes are closed and its group is
        gone (members left behind by a dead leader are SIGKILLed)."""
        if burn.proc is None or burn.pgid is None or burn.proc.poll() is None or burn.streams:
            return False
        if proc.group_alive(burn.pgid):
            proc.signal_group(burn.pgid, signal.SIGKILL)
            return False
        code = burn.proc.returncode
        summary = burn.summary
        if summary is not None:
            verdict = summary.get("verdict")
            burn.verdict = verdict if isinstance(verdict, str) else None
            burn.reason = str(summary.get("reason") or burn.stop_reason or "duration reached")
            burn.state = "failed" if burn.verdict == "DIED" else "done"
        elif burn.stop_reason is not None:
            burn.verdict = "FAULTY" if burn.progress.get("errors") else None
            burn.reason = burn.stop_reason + (" (killed after %g s)" % self.grace
                                              if burn.killed else "")
            burn.state = "done"
        else:
            last = burn.stderr_tail[-1] if burn.stderr_tail else ""
            burn.state, burn.verdict = "failed", "DIED"
            how = ("signal %s" % _signame(-code)) if code < 0 else "code %d" % code
            burn.reason = "burner exited with %s%s" % (how, (": " + last) if last else "")
        self._end(burn)
        return True

    def _end(self, burn: Burn) -> None:
        self.burns.pop(burn.gpu, None)
        self._emit(burn)
        self.finished[burn.gpu] = burn.detail()

    def _emit(self, burn: Burn) -> None:
        burn.last_emit = time.monotonic()
        self.agent.send(protocol.event_message("burn", burn.gpu, burn.detail()))

    # -- hooks ---------------------------------------------------------------------------------
    def tick(self, now: float) -> None:
        for pgid, term_at in list(self.foreign.items()):
            if not proc.group_alive(pgid):
                del self.foreign[pgid]
            elif now >= term_at + self.grace:
                proc.signal_group(pgid, signal.SIGKILL)
                del self.foreign[pgid]
        if self.simulated:
            self._sim_ended()
        for burn in list(self.burns.values()):
            if burn.engine == "sim":
                self._tick_sim(burn, now)
                continue
            allowance = self.grace + END_ALLOWANCE_S.get(burn.engine, 0.0)
            if burn.state in ("starting", "running") and now >= burn.deadline + allowance:
                # The burner should have ended itself at its duration: enforce it.
                self.stop(burn, "duration limit reached")
            if burn.term_at is not None and not burn.killed and now >= burn.term_at + self.grace:
                burn.killed = True
                if burn.pgid is not None:
                    proc.signal_group(burn.pgid, signal.SIGKILL)
            self._reap(burn)
        self._finish_sim()

    def _tick_sim(self, burn: Burn, now: float) -> None:
        if burn.state == "running" and now >= burn.deadline:
            burn.stop_reason = "duration reached"
            burn.state = "stopping"
            return
        if burn.state != "running" or now - burn.last_emit < 1.0:
            return
        dt = now - burn.last_emit if burn.progress else 0.0
        tflops = self._sim_tflops(burn)
        burn.iterations += tflops * 1e12 * dt / (2.0 * 8192 ** 3)
        elapsed = now - burn.started
        mean = burn.progress.get("tflops_mean")
        mean = tflops if mean is None else (mean * (elapsed - dt) + tflops * dt) / max(elapsed,
                                                                                         1e-9)
        burn.progress.update({"tflops": round(tflops, 1), "tflops_mean": round(mean, 1),
                              "errors": 0, "iterations": int(burn.iterations),
                              "elapsed": round(elapsed, 1), "size": 8192,
                              "dtype": burn.dtype or "bf16"})
        self._emit(burn)

    def _sim_ended(self) -> None:
        """Simulated burners that ended on their own (a signal from the process view, their
        GPU lost) end their burns as a real burner's exit would (``_reap``)."""
        ended = getattr(self.agent.reader, "ended_burns")()  # type: Dict[int, str]
        for gpu, how in sorted(ended.items()):
            burn = self.burns.get(gpu)
            if burn is None or burn.engine != "sim" or burn.state not in ACTIVE:
                continue
            if how in ("TERM", "INT"):  # a burner ends its burn on both (``workloads.burn``)
                burn.state, burn.verdict = "done", None
                burn.reason = burn.stop_reason or "burner stopped by SIG%s" % how
            elif how == "lost":
                burn.state, burn.verdict = "failed", "DIED"
                burn.reason = "burner died: its GPU fell off the bus"
            else:
                burn.state, burn.verdict = "failed", "DIED"
                burn.reason = "burner exited with signal SIG%s" % how
            self._end(burn)

    def _finish_sim(self) -> None:
        done = [b for b in self.burns.values() if b.engine == "sim" and b.state == "stopping"]
        if not done:
            return
        self._simulate("load", {"gpus": [b.gpu for b in done], "load": 0.0})
        for burn in done:
            burn.state = "done"
            burn.verdict = "OK" if burn.stop_reason == "duration reached" else None
            burn.reason = burn.stop_reason
            self._end(burn)

    def _sim_tflops(self, burn: Burn) -> float:
        name = (self.statics.get(burn.gpu) or {}).get("name", "")
        peaks = next((p for key, p in SIM_PEAKS if key in name), SIM_PEAKS[1][1])
        col = {"fp64": 0, "fp32": 1, "tf32": 2}.get(burn.dtype or "bf16", 3)
        return peaks[col] * SIM_EFFICIENCY * self.sim_clocks.get(burn.gpu, 1.0)

    def on_sample(self, gpus: List[Dict[str, Any]]) -> None:
        if not self.simulated:
            return
        for g in gpus:
            static = self.statics.get(g.get("index", -1)) or {}
            clock, top = g.get("sm_clock"), static.get("max_sm_clock")
            if clock and top:
                self.sim_clocks[g["index"]] = min(1.0, float(clock) / top)

    def close(self) -> None:
        """Stop every burner and wait until each process group is gone (the agent is exiting)."""
        reason = "agent stopped"
        if self.agent.stop_reason == "liveness":
            reason = "agent stopped: no word from gpuctl for %g s" % self.agent.liveness_timeout
        for burn in list(self.burns.values()):
            self.stop(burn, reason)
        self._finish_sim()
        deadline = time.monotonic() + self.close_grace
        killed = False
        while self.burns:
            for burn in list(self.burns.values()):
                if burn.proc is not None and burn.proc.poll() is not None:
                    for stream in list(burn.streams):
                        self._close_stream(burn, stream)
                self._reap(burn)
            if not self.burns:
                break
            now = time.monotonic()
            if now >= deadline and not killed:
                killed = True
                for burn in self.burns.values():
                    burn.killed = True
                    if burn.pgid is not None:
                        proc.signal_group(burn.pgid, signal.SIGKILL)
            if now >= deadline + proc.KILL_WAIT_S:
                break  # unkillable (a GPU hung in the kernel): nothing more a process can do
            time.sleep(proc.POLL_S)  # polling the children's exit; the agent loop is over


def _notes(burn: Burn, lines: List[bytes]) -> None:
    for line in lines:
        if line.strip():
            burn.note(line.decode("utf-8", "replace").rstrip())


def _number(msg: Dict[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = msg.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ValueError("%s must be a number within %g..%g" % (key, low, high))
    return float(value)


def _signame(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return str(num)


def install(agent: "Agent") -> StressPlugin:
    """Add the stress requests and hooks to ``agent``; returns the plugin."""
    plugin = StressPlugin(agent)
    agent.handlers["stress_start"] = plugin.on_start
    agent.handlers["stress_stop"] = plugin.on_stop
    agent.handlers["stress_status"] = plugin.on_status
    agent.tick_hooks.append(plugin.tick)
    agent.close_hooks.append(plugin.close)
    agent.sample_hooks.append(plugin.on_sample)
    setattr(agent, "stress", plugin)
    return plugin
