"""Simulated GPUs for the demo and the UI tests: plausible numbers, a story when burned.

Each GPU follows simple first-order physics: under load its utilization goes to 100%, its power
to the limit and its temperature climbs towards a target with a time constant of ~20 s (hot
under a burn, warm under a job); past the slowdown temperature its SM clock drops and
``sw_thermal`` throttling is reported: a burned GPU throttles, a busy one does not. Randomness
comes from one seeded ``random.Random`` and time from an injectable clock, so a test that steps
the clock gets the same numbers every run.
"""

import os
import random
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Optional, Tuple

from .base import Reader
from .emit import event, lost_record
from .procs import user_of

if TYPE_CHECKING:
    from ..messages import EventMessage

# name, memory GiB, power limit W, idle W, max SM MHz, max mem MHz, pcie gen, width
MODELS = {
    "H100": ("NVIDIA H100 80GB HBM3", 80, 700, 70, 1980, 2619, 5, 16),
    "H200": ("NVIDIA H200", 141, 700, 75, 1980, 3201, 5, 16),
    "A100": ("NVIDIA A100-SXM4-80GB", 80, 400, 55, 1410, 1593, 4, 16),
    "A100-40": ("NVIDIA A100-SXM4-40GB", 40, 400, 50, 1410, 1215, 4, 16),
    "L40S": ("NVIDIA L40S", 48, 350, 35, 2520, 9001, 4, 16),
    "A6000": ("NVIDIA RTX A6000", 48, 300, 25, 2100, 8001, 4, 16),
    "4090": ("NVIDIA GeForce RTX 4090", 24, 450, 20, 2760, 10501, 4, 16),
    "V100": ("Tesla V100-SXM2-32GB", 32, 300, 40, 1530, 877, 3, 16),
}
DEFAULT_MODEL = "H100"
AMBIENT_C = 32.0
HOT_C = 88.0  # where a burned GPU settles
# Where a GPU busy with a job settles at 100%: warm, below the slowdown. At HOT_C for every load,
# the demo's busy GPUs (a 95% job) crossed SLOWDOWN_C after two minutes and 4-7 of them showed
# THERM, where the story has one GPU burning until it throttles.
JOB_HOT_C = 78.0
SLOWDOWN_C = 84.0  # above this the SM clock drops and sw_thermal is reported
TAU_S = 20.0
GIB = 1 << 30
# Boards with a fan of their own (the data-centre ones are cooled by the chassis: fan null).
FANNED = ("NVIDIA RTX A6000", "NVIDIA GeForce RTX 4090")
PCIE_LANE_BYTES = {3: 0.985e9, 4: 1.969e9, 5: 3.938e9}  # bytes/s of one lane per generation
SIM_UIDS = {"alice": 1001, "bob": 1002, "chen": 1003, "dana": 1004}
BURN_PID = 9000  # + the GPU's index: the pid of a simulated burner
# XIDs after which the GPU is gone from the driver's view (NVML answers GPU_IS_LOST): its
# readings and processes stop, as ``simulate(action="lose")`` makes them stop.
LOST_XIDS = (79,)


def parse_spec(spec: Any) -> List[str]:
    """Parse "8", "8:H100" or "2:A100,2:H100" into a list of model keys, one per GPU.

    Raises ValueError with a one-line message for a bad spec.
    """
    models = []  # type: List[str]
    for part in str(spec).split(","):
        part = part.strip()
        count, _, model = part.partition(":")
        model = model.strip() or DEFAULT_MODEL
        try:
            n = int(count)
        except ValueError:
            raise ValueError("bad --simulate %r: expected N or N:MODEL (e.g. 8:H100)" % spec)
        if n < 0 or n > 1024:
            raise ValueError("bad --simulate %r: GPU count must be 0..1024" % spec)
        key = _model_key(model)
        if key is None:
            raise ValueError(
                "bad --simulate %r: unknown model %r (known: %s)"
                % (spec, model, ", ".join(sorted(MODELS)))
            )
        models.extend([key] * n)
    return models


def _model_key(name: str) -> Optional[str]:
    for key in MODELS:
        if key.lower() == name.lower():
            return key
    return None


class SimGpu(object):
    def __init__(self, index: int, model: str, rng: random.Random, host_seed: int) -> None:
        (self.name, mem_gib, self.power_limit, self.idle_w, self.max_sm, self.max_mem,
         self.pcie_gen, self.pcie_width) = MODELS[model]
        self.index = index
        self.uuid = "GPU-%08x-%04x-%04x-%04x-%012x" % (
            host_seed & 0xFFFFFFFF, index, 0x5100, 0xA000 + index, rng.getrandbits(48))
        self.mem_total = mem_gib * GIB
        self.temp = AMBIENT_C + rng.uniform(0, 6)
        # A background "job" load so an idle demo is not all zeros.
        self.base_load = rng.choice((0.0, 0.0, 0.05, 0.35, 0.7, 0.95))
        self.base_mem = rng.uniform(0.02, 0.12) + 0.7 * self.base_load
        self.burn = 0.0  # set by simulate(load=...)
        self.held = False  # simulate(hold=...): a job holds it and computes nothing
        self.burn_started = 0.0  # wall clock time the burn's load began
        self.util = 100.0 * self.base_load
        self.temp += 40.0 * self.base_load  # a GPU that has been busy is warm already
        self.lost = False
        self.xids = []  # type: List[int]
        self.processes = []  # type: List[Dict[str, Any]]
        if self.base_load > 0:
            self.processes.append({
                "pid": 4000 + 97 * index, "user": rng.choice(("alice", "bob", "chen", "dana")),
                "command": "python train.py", "mem": int(self.base_mem * self.mem_total)})
        # Host-side facts of the simulated processes come from a generator of their own, so
        # that adding them changed none of the GPU readings above.
        own = random.Random(host_seed * 1009 + index)
        for p in self.processes:
            p.update({"uid": SIM_UIDS.get(p["user"]), "ppid": 3000 + p["pid"] % 1000,
                      "age": own.uniform(600, 30 * 3600), "rss": int(own.uniform(2, 40) * GIB),
                      "cpu_base": own.uniform(60, 140)})
        # Video work (NVENC / NVDEC) on a few GPUs, from a generator of its own as above.
        video = random.Random(host_seed * 7919 + index)
        self.enc = video.choice((0,) * 7 + (12, 35))
        self.dec = video.choice((0,) * 5 + (20, 45, 70))
        # PCIe traffic, from a generator of its own as above (``pcie``).
        self._pcie = random.Random(host_seed * 104729 + index)

    def step(self, dt: float, rng: random.Random) -> None:
        load = max(self.burn, self.base_load)
        target_util = 100.0 * load if self.burn else min(100.0, 100.0 * load + rng.gauss(0, 6))
        if self.held and not self.burn:
            target_util = 0.0  # a notebook left open on it: memory held, nothing computed
        self.util = max(0.0, min(100.0, self.util + (target_util - self.util) * min(1.0, dt)))
        top = HOT_C if self.burn else JOB_HOT_C
        hot_target = AMBIENT_C + (top - AMBIENT_C) * (self.util / 100.0) ** 0.8
        alpha = min(1.0, dt / TAU_S)
        self.temp += (hot_target - self.temp) * alpha + rng.gauss(0, 0.15)

    def _process(self, p: Dict[str, Any], epoch: float) -> Dict[str, Any]:
        """A process as the protocol carries it: its host fields follow the GPU's load."""
        share = self.util / 100.0
        return {"pid": p["pid"], "user": p["user"], "command": p["command"], "mem": p["mem"],
                "uid": p["uid"], "ppid": p["ppid"], "sm": int(round(self.util)),
                "cpu": round(p["cpu_base"] * max(share, 0.05), 1), "rss": p["rss"],
                "started": round(epoch - p["age"], 2)}

    def parents(self) -> List[Dict[str, Any]]:
        """The launcher of each simulated job (a shell running its job script)."""
        return [{"pid": p["ppid"], "ppid": 1, "uid": p["uid"], "user": p["user"],
                 "command": "bash job.sh", "started": None} for p in self.processes]

    def pcie(self, link: float) -> Tuple[int, int]:
        """PCIe bytes/s (TX: GPU to host, RX: host to GPU) over a ``link`` of that many bytes/s
        each way. A training job moves data in bursts: its input batches come in and gradients
        go out to the network (GPUDirect to the NIC crosses PCIe), several to tens of GB/s on a
        burst's sample (a third to half of its samples at full load), a few hundred MB/s
        between; a burn's data stays on the GPU and an idle GPU moves next to nothing (tens and
        a few MB/s). It was a flat share of the link by utilization (a burn at 100% showed
        12.7 GB/s in, every busy GPU the same figure), all in the lowest of the heat map's five
        colours on the registry's 0-64 GB/s scale (PCIe gen5 x16, ~63 GB/s each way)."""
        r = self._pcie
        if self.burn:
            return int(link * r.uniform(0.0001, 0.0003)), int(link * r.uniform(0.0002, 0.0005))
        share = self.util / 100.0 if self.base_load > 0 else 0.0
        if share <= 0.02:
            return int(link * r.uniform(0.0, 0.00003)), int(link * r.uniform(0.0, 0.00005))
        scale = 0.4 + 0.6 * share
        if r.random() < 0.15 + 0.35 * share:  # a burst
            return (int(link * scale * r.uniform(0.05, 0.5)),
                    int(link * scale * r.uniform(0.1, 0.6)))
        return int(link * scale * r.uniform(0.002, 0.01)), int(link * scale * r.uniform(0.005, 0.03))

    def clock(self) -> Tuple[int, bool]:
        """The SM clock now (MHz) and whether heat holds it down (``sw_thermal``)."""
        if self.temp > SLOWDOWN_C:
            over = min(1.0, (self.temp - SLOWDOWN_C) / (HOT_C + 4 - SLOWDOWN_C))
            return int(self.max_sm * (1.0 - 0.25 * over)), True
        return (self.max_sm if self.util > 2.5 else 345), False

    def read(self, rng: random.Random, epoch: float,
             burner: Optional[Tuple[int, str]] = None) -> Optional[Dict[str, Any]]:
        if self.lost:
            return None
        util = int(round(self.util))
        throttle = []  # type: List[str]
        sm, hot = self.clock()
        if hot:
            throttle.append("sw_thermal")
        power = self.idle_w + (self.power_limit - self.idle_w) * (util / 100.0) ** 1.3
        power = min(float(self.power_limit), power + rng.gauss(0, 2.0))
        if power >= self.power_limit * 0.98:
            throttle.append("sw_power_cap")
        if util <= 2:
            throttle.append("gpu_idle")
        # A burn takes most of what the job leaves: what the processes hold adds up to at most
        # what is used, and what is used to at most what there is.
        burn_frac = min(0.9, 0.97 - self.base_mem) if self.burn else 0.0
        mem_frac = self.base_mem + burn_frac
        procs = [self._process(p, epoch) for p in self.processes]
        tx, rx = self.pcie(PCIE_LANE_BYTES.get(self.pcie_gen, 1e9) * self.pcie_width)
        if self.burn:
            # A burner is the agent's child: the agent's user runs it (yours, so ``k`` may
            # stop it, as on a real node), not a user of its own.
            uid, user = burner or (os.geteuid(), user_of(os.geteuid()))
            procs.append({"pid": BURN_PID + self.index, "user": user, "uid": uid,
                          "command": "gpuctl-burn", "mem": int(burn_frac * self.mem_total),
                          "sm": util, "cpu": 100.0, "rss": 3 * GIB, "ppid": None,
                          "started": round(self.burn_started, 2)})
        return {
            "index": self.index, "uuid": self.uuid, "state": "ok",
            "util_gpu": util, "util_mem": int(util * 0.6),
            "mem_used": int(mem_frac * self.mem_total), "mem_total": self.mem_total,
            "temp": int(round(self.temp)), "power": round(max(0.0, power), 1),
            "power_limit": float(self.power_limit), "sm_clock": sm, "mem_clock": self.max_mem,
            "fan": int(30 + 0.6 * util) if self.name in FANNED else None,
            "pstate": "P0" if util > 2 else "P8",
            "enc": self.enc if util > 2 else 0, "dec": self.dec if util > 2 else 0,
            "pcie_tx": tx, "pcie_rx": rx,
            "throttle": throttle, "processes": procs, "mig": None,
        }


class SimReader(Reader):
    """A reader of simulated GPUs (see the module docstring)."""

    name = "simulated"

    def __init__(self, models: List[str], seed: int = 0,
                 clock: Callable[[], float] = time.monotonic, hostname_seed: int = 0) -> None:
        self._rng = random.Random(seed)
        self._clock = clock
        self._last = clock()
        self.gpus = [SimGpu(i, m, self._rng, hostname_seed + seed) for i, m in enumerate(models)]
        self._pending_events = []  # type: List["EventMessage"]
        self._slow = [None] * len(self.gpus)  # type: List[Optional[Dict[str, Any]]]
        # simulate(action="stall"): a hung driver call
        self._stall_until = None  # type: Optional[float]
        # The wall clock simulated processes started by (replays set a fixed one).
        self.wall = time.time  # type: Callable[[], float]
        self._epoch = None  # type: Optional[float]
        # (uid, user) burners run as: None, this agent's user's (a burner is the agent's child);
        # a recording made for replays sets one of its own, the same on every machine.
        self.burner = None  # type: Optional[Tuple[int, str]]
        # GPU -> the signal that ended its burner (``signal``), until ``ended_burns`` is read
        self._ended_burns = {}  # type: Dict[int, str]

    @classmethod
    def from_spec(cls, spec: Any, seed: int = 0,
                  clock: Callable[[], float] = time.monotonic) -> "SimReader":
        """Build from a ``--simulate`` spec (see parse_spec); raises ValueError for a bad one."""
        return cls(parse_spec(spec), seed=seed, clock=clock)

    def versions(self) -> Dict[str, Optional[str]]:
        return {"driver": "550.54.15", "cuda": "12.4", "nvml": "12.550.54.15"}

    def static(self) -> List[Dict[str, Any]]:
        return [{
            "index": g.index, "uuid": g.uuid, "name": g.name, "mem_total": g.mem_total,
            "power_limit": float(g.power_limit), "max_sm_clock": g.max_sm,
            "max_mem_clock": g.max_mem, "pcie_gen": g.pcie_gen, "pcie_width": g.pcie_width,
            "mig_mode": False, "serial": "SIM%010d" % (g.index + 1),
        } for g in self.gpus]

    def sample(self, slow: bool = True) -> List[Dict[str, Any]]:
        if self._stall_until is not None:
            # Like a hung NVML call: the whole agent waits, so the node goes stale upstream.
            wait = self._stall_until - time.monotonic()
            self._stall_until = None
            if wait > 0:
                time.sleep(wait)
        now = self._clock()
        dt = max(0.0, min(30.0, now - self._last))
        self._last = now
        if self._epoch is None:
            self._epoch = self.wall()
        out = []  # type: List[Dict[str, Any]]
        for g in self.gpus:
            g.step(dt, self._rng)
            rec = g.read(self._rng, self._epoch, self.burner)
            if rec is None:
                out.append(lost_record(g.index, g.uuid))
                continue
            if slow or self._slow[g.index] is None:
                self._slow[g.index] = {
                    "ecc": {"volatile_corrected": 0, "volatile_uncorrected": 0,
                            "aggregate_corrected": 3 if g.index == 5 else 0,
                            "aggregate_uncorrected": 0},
                    "retired_pages": None,
                    "remapped_rows": {"correctable": 0, "uncorrectable": 0,
                                      "pending": False, "failure": False},
                }
            rec.update(self._slow[g.index] or {})
            out.append(rec)
        return out

    def accept_facts(self) -> List[Dict[str, Any]]:
        """What a simulated acceptance run judges (``gpuctl.workloads.accept_suite.simulated``):
        each GPU's static facts and its state now (temperature, SM clock under load, heat
        throttling, XIDs, lost), read without stepping the simulation."""
        out = []  # type: List[Dict[str, Any]]
        for static, g in zip(self.static(), self.gpus):
            sm, hot = g.clock()
            facts = dict(static)
            # Under the suite's load an idle GPU clocks up; heat holds a hot one down.
            facts.update({"temp": round(g.temp, 1), "sm_clock": sm if hot else g.max_sm,
                          "lost": g.lost,
                          "throttle": ["sw_thermal"] if hot else [], "xids": list(g.xids),
                          "driver": self.versions()["driver"]})
            out.append(facts)
        return out

    def events(self) -> List["EventMessage"]:
        out, self._pending_events = self._pending_events, []
        return out

    def parents(self) -> List[Dict[str, Any]]:
        seen = {}  # type: Dict[int, Dict[str, Any]]
        for g in self.gpus:
            if not g.lost:
                for p in g.parents():
                    seen.setdefault(p["pid"], p)
        return [seen[pid] for pid in sorted(seen)]

    def host(self) -> Optional[Dict[str, Any]]:
        """A host that follows its GPUs: the jobs' data loaders keep CPUs and the network busy."""
        gpus = [g for g in self.gpus if not g.lost]
        load = sum(g.util for g in gpus) / (100.0 * len(gpus)) if gpus else 0.0
        cpus = 16 * max(1, len(self.gpus))
        return {"cpu": round(4.0 + 40.0 * load, 1), "cpus": cpus,
                "mem_total": 2 * GIB * cpus * 8, "mem_available": int(GIB * cpus * (14 - 8 * load)),
                "load": [round(cpus * (0.05 + 0.4 * load), 2)] * 3,
                "net_rx": round(2e6 + 1.2e9 * load, 1), "net_tx": round(1e6 + 0.4e9 * load, 1)}

    def signal(self, pid: Any, name: Any, gpu_pids: Iterable[int],
               started: Any = None) -> Tuple[Optional[str], str]:
        """Simulated processes belong to simulated users: a process of this user's uid ends,
        any other is refused as a real node refuses it. A burner is this agent's user's: it
        ends (its burn's load with it), and ``ended_burns`` tells the stress plugin how."""
        if name not in ("TERM", "INT", "KILL"):
            return "bad_argument", "signal must be TERM, INT or KILL"
        for g in self.gpus:
            if g.burn and not g.lost and pid == BURN_PID + g.index:
                # the burner is this agent's user's: it ends, and its burn with it
                g.burn = 0.0
                self._ended_burns[g.index] = name
                return None, "SIG%s sent to pid %s" % (name, pid)
            for p in g.processes:
                if p["pid"] != pid:
                    continue
                if p["uid"] != os.geteuid():
                    return "not_yours", "pid %s belongs to %s: only your own processes" % (
                        pid, p["user"])
                g.processes.remove(p)
                return None, "SIG%s sent to pid %s" % (name, pid)
        return "not_gpu_process", "pid %r is not a GPU process of this node" % (pid,)

    def ended_burns(self) -> Dict[int, str]:
        """The GPUs whose burner ended since the last call, and how: a signal's name ("TERM",
        "INT", "KILL") or "lost" (its GPU fell off the bus). The stress plugin ends their burns as a
        real burner's exit ends them."""
        out, self._ended_burns = self._ended_burns, {}
        return out

    def close(self) -> None:
        pass

    # -- control, for the demo and the tests ---------------------------------------------
    def simulate(self, action: Any, msg: Dict[str, Any]) -> None:
        """Apply a ``simulate`` request; raises ValueError with a one-line reason."""
        if action == "load":
            load = float(msg.get("load", 1.0))
            if not 0.0 <= load <= 1.0:
                raise ValueError("load must be within 0..1")
            for g in self._select(msg.get("gpus")):
                if load and not g.burn:
                    g.burn_started = self.wall()
                g.burn = load
        elif action == "xid":
            g = self._one(msg.get("gpu"))
            xid = int(msg.get("xid", 79))
            g.xids.append(xid)
            self._pending_events.append(event("xid", g.index, {"xid": xid}))
            if xid in LOST_XIDS and not g.lost:  # fallen off the bus: nothing reads it now
                self._lose(g)
        elif action == "lose":
            self._lose(self._one(msg.get("gpu")))
        elif action == "hold":  # a job that holds a GPU's memory and computes nothing
            g = self._one(msg.get("gpu"))
            user = str(msg.get("user") or "bob")[:32]
            g.base_load, g.held, g.base_mem = 0.0, True, 0.25  # its memory is the job's
            g.processes = [{
                "pid": 4000 + 97 * g.index + 1, "user": user, "command": "python notebook.py",
                "mem": int(g.base_mem * g.mem_total), "uid": SIM_UIDS.get(user),
                "ppid": 3000 + g.index, "age": 5400.0, "rss": 6 * GIB, "cpu_base": 2.0}]
        elif action == "stall":
            seconds = float(msg.get("seconds", 10.0))
            if not 0.0 < seconds <= 60.0:
                raise ValueError("stall seconds must be within 0..60")
            self._stall_until = time.monotonic() + seconds
        else:
            raise ValueError(
                "unknown simulate action %r (load, xid, lose, hold, stall)" % (action,))

    def _lose(self, g: SimGpu) -> None:
        """``g`` falls off the bus: no readings, no processes; its burner dies with it."""
        g.lost = True
        self._pending_events.append(event("gpu_lost", g.index, {}))
        if g.burn:
            g.burn = 0.0
            self._ended_burns[g.index] = "lost"

    def _one(self, idx: Any) -> SimGpu:
        if not isinstance(idx, int) or not 0 <= idx < len(self.gpus):
            raise ValueError("no GPU %r here (0..%d)" % (idx, len(self.gpus) - 1))
        return self.gpus[idx]

    def _select(self, idxs: Any) -> List[SimGpu]:
        if idxs is None or idxs == "all":
            return list(self.gpus)
        if not isinstance(idxs, list):
            raise ValueError("gpus must be a list of indices or \"all\"")
        return [self._one(i) for i in idxs]
