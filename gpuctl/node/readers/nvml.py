"""The NVML reader: every GPU reading through pynvml (nvidia-ml-py), opened once.

pynvml (the node's own or the one the bundle carries, see ``bindings``) is imported inside
``NvmlReader.open`` only, so ``gpuctl.node`` stays standard library at import time. Each field is read in its own guard: an NVML error (NOT_SUPPORTED, NO_PERMISSION,
...) or a function this pynvml/driver pair lacks makes that one field null, never the others.
A field a GPU answers NOT_SUPPORTED is not asked again of that GPU (on an H100 SXM, the fan
speed alone cost 0.25 ms a sample). Per-process SM utilization (1.5 ms a call on an H100,
driver 580, whatever the window asked and with one call or two: the cost is the driver's) is
read only for a GPU with two processes or more (a lone process's SM % is the GPU's own
utilization, read every sample anyway: one process per GPU is the training job's shape), at
most every ``PROC_UTIL_EVERY_S`` (10 s: 0.15 ms a sample at 1 Hz; every 5 s it was 0.3 ms, a
third of the agent's 1 ms) while its pids stay the same, and at once when they change; the
samples in between repeat the last answer.
A GPU's process lists (compute and graphics) are read again when its used memory (read every
sample) changes, and at least every ``PROCS_EVERY_S``: a process that starts creates a context
in GPU memory and one that ends frees its own, so a list can change with the used memory
unchanged to the byte only if two such events cancel exactly within one sample; the samples
in between repeat the last lists (their processes' host figures are read every sample). On an
H100 the two lists cost 0.1-0.2 ms a sample and GPU (0.16-0.19 + 0.03 ms).
The lists NVML fills into a caller's buffer (running processes, per-process utilization) are
read with one driver call into a buffer kept between samples (``_OneCall``) where pynvml makes
two (the size, then the list) and converts every entry to a Python object: on an H100 those
the compute list cost 0.27 ms with pynvml and 0.16-0.19 ms with one call (one process).
The video encoder and decoder utilization cost what the utilization rates do (1.7 us of CPU a
call on an H100: ``benchmarks/nvml_call_cost.py``) and are read every sample. PCIe throughput
is not: NVML measures it inside the call over 20 ms (21 ms wall, 0.9 ms CPU per counter on an
H100), so each GPU's TX and RX are read once per ``PCIE_EVERY`` samples (60: once a minute at
1 Hz), GPU i on the samples where ``(tick - i) % PCIE_EVERY == 0`` (spread: a sample waits for
at most one GPU's two reads, 42 ms), and repeated in between: 0.03 ms of CPU per GPU per
sample on average (every ``SLOW_EVERY`` samples it was 0.18 ms, which alone would have taken
the agent past its 1 ms per H100 sample). The first sample reads every GPU's. NVML's
cumulative counters (``nvmlDeviceGetFieldValues`` of ``NVML_FI_DEV_PCIE_COUNT_TX_BYTES``/
``RX_BYTES``, a rate from two reads) may be far cheaper on drivers that have them: not
measured yet.
The slow readings (ECC counters, retired pages, remapped rows: 11 NVML field ids) are one
``nvmlDeviceGetFieldValues`` call per GPU into a buffer kept between reads, each field with its
own return code (a field NOT_SUPPORTED is null and left out of that GPU's later batches); they
were 8 calls (10 in the library). A driver or pynvml without the call (FUNCTION_NOT_FOUND), or one
that refuses it, gets the calls of old, one each, and the batch is not tried again
(``benchmarks/nvml_calls.py``).
GPU_IS_LOST turns the GPU's record into the "lost" state for good and queues one ``gpu_lost``
event. XID critical errors come from an NVML event set polled without blocking in ``events()``.
Python 3.6 syntax.
"""

import ctypes
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Set, Tuple, Union

from ..metrics import SLOW_READ_EVERY as PCIE_EVERY
from ..protocol import decode_throttle
from .base import Reader, ReaderUnavailable
from .procs import ProcessNames
from .emit import event, lost_record

if TYPE_CHECKING:
    from ..messages import EventMessage

# Alternatives for calls whose name depends on the pynvml / driver versions, newest first: the
# first one this pair supports is remembered.
THROTTLE = ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
COMPUTE_PROCS = (
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses",
)
GRAPHICS_PROCS = (
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses_v2",
    "nvmlDeviceGetGraphicsRunningProcesses",
)
POWER_LIMIT = ("nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetPowerManagementLimit")
Names = Union[str, Tuple[str, ...]]  # a pynvml function, or alternatives newest first

# nvml.h constants, fixed by the C ABI (kept here so an old pynvml lacking a name still works)
NOT_SUPPORTED = 3
GPU_IS_LOST = 15
FUNCTION_NOT_FOUND = 13
TEMPERATURE_GPU = 0
CLOCK_SM = 1
CLOCK_MEM = 2
ECC_CORRECTED, ECC_UNCORRECTED = 0, 1
ECC_VOLATILE, ECC_AGGREGATE = 0, 1
RETIRED_SINGLE_BIT, RETIRED_DOUBLE_BIT = 0, 1
EVENT_XID = 0x8
PSTATE_UNKNOWN = 32
PCIE_TX_BYTES, PCIE_RX_BYTES = 0, 1  # nvmlPcieUtilCounter_t
KB = 1024  # nvmlDeviceGetPcieThroughput answers KB/s
NOT_AVAILABLE = (1 << 64) - 1  # usedGpuMemory when the driver cannot tell (and the ulonglong -1)
MAX_EVENTS_PER_POLL = 256  # bounds one events() call if a GPU floods XIDs
PROC_UTIL_WINDOW_S = 5.0  # per-process SM %: NVML's samples of this last while, newest per pid
PROCS_EVERY_S = 5.0  # a GPU's process lists are read at least this often (see the docstring)
PROC_UTIL_EVERY_S = 10.0  # ... read this often per GPU (and at once when its pids change)
INSUFFICIENT_SIZE = 7
# The slow readings' NVML field ids (nvml.h NVML_FI_DEV_*), read with one
# nvmlDeviceGetFieldValues call: (id, the sample's key, the key inside it).
SLOW_FIELDS = (
    (3, "ecc", "volatile_corrected"),  # ECC_SBE_VOL_TOTAL
    (4, "ecc", "volatile_uncorrected"),  # ECC_DBE_VOL_TOTAL
    (5, "ecc", "aggregate_corrected"),  # ECC_SBE_AGG_TOTAL
    (6, "ecc", "aggregate_uncorrected"),  # ECC_DBE_AGG_TOTAL
    (29, "retired_pages", "single_bit"),  # RETIRED_SBE
    (30, "retired_pages", "double_bit"),  # RETIRED_DBE
    (31, "retired_pages", "pending"),  # RETIRED_PENDING
    (142, "remapped_rows", "correctable"),  # REMAPPED_COR
    (143, "remapped_rows", "uncorrectable"),  # REMAPPED_UNC
    (144, "remapped_rows", "pending"),  # REMAPPED_PENDING
    (145, "remapped_rows", "failure"),  # REMAPPED_FAILURE
)
FLAG_KEYS = ("pending", "failure")  # yes/no readings among them
# nvmlValueType_t -> the member of nvmlValue_t that holds the value
VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal",
                 6: "usVal"}
PROC_BUFFER = 8  # entries first kept for a process list (grown to twice what NVML asks for)
SAMPLE_BUFFER = 64  # ... and for per-process utilization samples (one per pid and NVML tick)


# nvml.h's structures, fixed by the C ABI: the one-call reads fill them directly.
class _ProcessInfoV1(ctypes.Structure):  # nvmlDeviceGet*RunningProcesses (no suffix)
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class _ProcessInfoV2(ctypes.Structure):  # ..._v2 and ..._v3 (nvmlProcessInfo_t)
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


class _UtilizationSample(ctypes.Structure):  # nvmlProcessUtilizationSample_t
    _fields_ = [("pid", ctypes.c_uint), ("timeStamp", ctypes.c_ulonglong),
                ("smUtil", ctypes.c_uint), ("memUtil", ctypes.c_uint),
                ("encUtil", ctypes.c_uint), ("decUtil", ctypes.c_uint)]


class _Value(ctypes.Union):  # nvmlValue_t
    _fields_ = [("dVal", ctypes.c_double), ("uiVal", ctypes.c_uint), ("ulVal", ctypes.c_ulong),
                ("ullVal", ctypes.c_ulonglong), ("sllVal", ctypes.c_longlong),
                ("siVal", ctypes.c_int), ("usVal", ctypes.c_ushort)]


class _FieldValue(ctypes.Structure):  # nvmlFieldValue_t
    _fields_ = [("fieldId", ctypes.c_uint32), ("scopeId", ctypes.c_uint32),
                ("timestamp", ctypes.c_int64), ("latencyUsec", ctypes.c_int64),
                ("valueType", ctypes.c_uint), ("nvmlReturn", ctypes.c_uint), ("value", _Value)]


# the functions read with one call, and the entry each fills
ONE_CALL = {
    "nvmlDeviceGetComputeRunningProcesses_v3": _ProcessInfoV2,
    "nvmlDeviceGetComputeRunningProcesses_v2": _ProcessInfoV2,
    "nvmlDeviceGetComputeRunningProcesses": _ProcessInfoV1,
    "nvmlDeviceGetGraphicsRunningProcesses_v3": _ProcessInfoV2,
    "nvmlDeviceGetGraphicsRunningProcesses_v2": _ProcessInfoV2,
    "nvmlDeviceGetGraphicsRunningProcesses": _ProcessInfoV1,
    "nvmlDeviceGetProcessUtilization": _UtilizationSample,
}


class _Lost(Exception):
    """Raised inside a GPU's read when NVML says the GPU fell off the bus."""


class NvmlReader(Reader):
    """Reads GPUs through pynvml; build it with ``NvmlReader.open()``."""

    name = "nvml"

    def __init__(self, nvml: Any) -> None:
        self._nv = nvml
        self._error = nvml.NVMLError
        self._resolved = {}  # type: Dict[Names, List[Any]]
        self._handles = []  # type: List[Any]
        self._uuids = []  # type: List[Optional[str]]
        self._lost = set()  # type: Set[int]
        self._pending = []  # type: List["EventMessage"]
        self._slow = {}  # type: Dict[int, Dict[str, Any]]
        self._pcie = {}  # type: Dict[int, Dict[str, Any]]  # GPU -> last PCIe throughput
        self._tick = 0  # samples taken: spreads the PCIe reads over PCIE_EVERY samples
        self._unsupported = set()  # type: Set[Any]  # (names, args) a GPU said NOT_SUPPORTED to
        self.batched = True  # the slow readings through nvmlDeviceGetFieldValues (_read_slow)
        self._field_fn = None  # type: Any
        self._field_buffers = {}  # type: Dict[Any, Any]
        # GPU -> (monotonic time, its pids, pid -> SM %) of the last per-process utilization read
        self._sm = {}  # type: Dict[int, Tuple[float, Any, Dict[int, Optional[int]]]]
        self.proc_util_every = PROC_UTIL_EVERY_S
        # GPU -> (its used memory, monotonic time, pid -> GPU memory, lists readable) when read
        self._procs = {}  # type: Dict[int, Tuple[int, float, Dict[int, Optional[int]], bool]]
        self.procs_every = PROCS_EVERY_S
        self._names = ProcessNames()
        self._parents = []  # type: List[Dict[str, Any]]
        self._index_of_handle = {}  # type: Dict[Any, int]
        count = nvml.nvmlDeviceGetCount()
        for i in range(count):
            handle = None
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
            except self._error as e:
                self._mark_lost(i, "no handle: %s" % (e,))
            self._handles.append(handle)
            if handle is not None:
                self._index_of_handle[_address(handle)] = i
        self._uuids = [self._read_static_uuid(i) for i in range(count)]
        self._static = [self._read_static(i) for i in range(count)]
        self._event_set = self._open_event_set()

    @classmethod
    def open(cls) -> "NvmlReader":
        """Import pynvml and initialise NVML; raises ReaderUnavailable(one-line reason)."""
        from . import bindings

        try:
            pynvml, _ = bindings.load()
        except ImportError as e:
            raise ReaderUnavailable("%s" % (e,))
        except Exception as e:  # a broken install must not stop the smi fallback
            raise ReaderUnavailable("pynvml failed to import: %s: %s" % (type(e).__name__, e))
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise ReaderUnavailable("nvmlInit failed: %s" % (e,))
        except Exception as e:
            raise ReaderUnavailable("nvmlInit failed: %s: %s" % (type(e).__name__, e))
        try:
            return cls(pynvml)
        except Exception as e:
            try:
                pynvml.nvmlShutdown()
            except Exception:
                pass
            raise ReaderUnavailable("NVML failed while listing GPUs: %s" % (e,))

    # -- calls ---------------------------------------------------------------------------------
    def _fn(self, names: Names) -> List[Any]:
        """The pynvml function for ``names`` (a name or a tuple of alternatives), or None."""
        fns = self._resolved.get(names)
        if fns is None:
            alternatives = (names,) if isinstance(names, str) else names
            fns = [self._one_call(n) or getattr(self._nv, n)
                   for n in alternatives if hasattr(self._nv, n)]
            self._resolved[names] = fns
        return fns

    def _one_call(self, name: str) -> Any:
        """A ``_OneCall`` for ``name`` when it is a list read and this pynvml lets us reach the
        library's function (its ``_nvmlGetFunctionPointer``), else None (pynvml's own)."""
        entry = ONE_CALL.get(name)
        if entry is None or not callable(getattr(self._nv, "_nvmlGetFunctionPointer", None)):
            return None
        return _OneCall(self._nv, name, entry)

    def _call(self, names: Names, *args: Any) -> Any:
        """Call the first alternative that exists in this pynvml and this driver's library.

        Raises the NVML error of the call, or _Unsupported when no alternative exists.
        """
        fns = self._fn(names)
        while fns:
            try:
                return fns[0](*args)
            except Exception as e:
                if len(fns) > 1 and self._missing(e):
                    fns.pop(0)  # the library lacks it: fall back for good
                    continue
                raise
        raise _Unsupported(names)

    def _missing(self, e: Exception) -> bool:
        if isinstance(e, self._error):
            return getattr(e, "value", None) == FUNCTION_NOT_FOUND
        return type(e).__name__ == "NVMLLibraryMismatchError"

    def _read(self, names: Names, *args: Any, key: Any = None) -> Any:
        """One guarded field read: the value, None when unreadable; raises _Lost.

        A read answered NOT_SUPPORTED is remembered under ``key`` (default: the call, the GPU's
        handle (by identity: the reader keeps its handles, and ctypes pointers do not hash) and
        the other arguments) and answered None from then on without a call.
        """
        if key is None:
            key = (names, id(args[0]), args[1:]) if args else names
        if key in self._unsupported:
            return None
        try:
            return self._call(names, *args)
        except self._error as e:
            value = getattr(e, "value", None)
            if value == GPU_IS_LOST:
                raise _Lost()
            if value == NOT_SUPPORTED:
                self._unsupported.add(key)
            return None
        except Exception:  # a missing function, an old pynvml's quirk: this field only
            return None

    # -- static facts --------------------------------------------------------------------------
    def versions(self) -> Dict[str, Optional[str]]:
        """Driver, CUDA ("12.4") and NVML version strings, each None when unreadable."""
        cuda = None
        try:
            v = self._call(("nvmlSystemGetCudaDriverVersion", "nvmlSystemGetCudaDriverVersion_v2"))
            if v:
                cuda = "%d.%d" % (v // 1000, (v % 1000) // 10)
        except Exception:
            pass
        return {
            "driver": self._text(self._system("nvmlSystemGetDriverVersion")),
            "cuda": cuda,
            "nvml": self._text(self._system("nvmlSystemGetNVMLVersion")),
        }

    def _system(self, name: str) -> Any:
        try:
            return self._call(name)
        except Exception:
            return None

    def static(self) -> List[Dict[str, Any]]:
        """Static facts per GPU (protocol.STATIC_FIELDS), read once at open."""
        return [dict(s) for s in self._static]

    def _read_static_uuid(self, i: int) -> Optional[str]:
        h = self._handles[i]
        if h is None:
            return None
        try:
            return self._text(self._read("nvmlDeviceGetUUID", h))
        except _Lost:
            self._mark_lost(i)
            return None

    def _read_static(self, i: int) -> Dict[str, Any]:
        h = self._handles[i]
        rec = {
            "index": i,
            "uuid": self._uuids[i],
            "name": None,
            "mem_total": None,
            "power_limit": None,
            "max_sm_clock": None,
            "max_mem_clock": None,
            "pcie_gen": None,
            "pcie_width": None,
            "mig_mode": None,
            "serial": None,
        }  # type: Dict[str, Any]
        if h is None or i in self._lost:
            return rec
        try:
            rec["name"] = self._text(self._read("nvmlDeviceGetName", h))
            mem = self._read("nvmlDeviceGetMemoryInfo", h)
            rec["mem_total"] = int(mem.total) if mem is not None else None
            limit = self._read(POWER_LIMIT, h)
            if limit is None:
                limit = self._read("nvmlDeviceGetPowerManagementDefaultLimit", h)
            rec["power_limit"] = _watts(limit)
            rec["max_sm_clock"] = self._read("nvmlDeviceGetMaxClockInfo", h, CLOCK_SM)
            rec["max_mem_clock"] = self._read("nvmlDeviceGetMaxClockInfo", h, CLOCK_MEM)
            rec["pcie_gen"] = self._read("nvmlDeviceGetMaxPcieLinkGeneration", h)
            rec["pcie_width"] = self._read("nvmlDeviceGetMaxPcieLinkWidth", h)
            mig = self._read("nvmlDeviceGetMigMode", h)
            rec["mig_mode"] = bool(mig[0]) if mig is not None else None
            rec["serial"] = self._text(self._read("nvmlDeviceGetSerial", h))
        except _Lost:
            self._mark_lost(i)
        return rec

    # -- samples -------------------------------------------------------------------------------
    def sample(self, slow: bool = True) -> List[Dict[str, Any]]:
        """One dict per GPU (protocol.SAMPLE_FIELDS); slow=True re-reads ECC and memory health."""
        out = []  # type: List[Dict[str, Any]]
        pids = set()  # type: Set[int]
        for i, h in enumerate(self._handles):
            if h is None or i in self._lost:
                out.append(lost_record(i, self._uuids[i]))
                continue
            try:
                rec = self._read_fast(i, h, pids)
                if slow or i not in self._slow:
                    self._slow[i] = self._read_slow(h)
                rec.update(self._slow[i])
                if i not in self._pcie or (self._tick - i) % PCIE_EVERY == 0:
                    self._pcie[i] = self._read_pcie(h)
                rec.update(self._pcie[i])
            except _Lost:
                self._mark_lost(i)
                rec = lost_record(i, self._uuids[i])
            out.append(rec)
        self._tick += 1
        self._parents = self._names.parents(pids)
        self._names.forget_except(pids)
        return out

    def parents(self) -> List[Dict[str, Any]]:
        """Ancestors of the last sample's GPU processes (``ProcessNames.parents``)."""
        return self._parents

    def _read_fast(self, i: int, h: Any, pids: Set[int]) -> Dict[str, Any]:
        util = self._read("nvmlDeviceGetUtilizationRates", h)
        mem = self._read("nvmlDeviceGetMemoryInfo", h)
        pstate = self._read("nvmlDeviceGetPerformanceState", h)
        mask = self._read(THROTTLE, h)
        enc = self._read("nvmlDeviceGetEncoderUtilization", h)
        dec = self._read("nvmlDeviceGetDecoderUtilization", h)
        return {
            "index": i,
            "uuid": self._uuids[i],
            "state": "ok",
            "util_gpu": _int(util.gpu) if util is not None else None,
            "util_mem": _int(util.memory) if util is not None else None,
            "mem_used": _int(mem.used) if mem is not None else None,
            "mem_total": _int(mem.total) if mem is not None else None,
            "temp": self._read("nvmlDeviceGetTemperature", h, TEMPERATURE_GPU),
            "power": _watts(self._read("nvmlDeviceGetPowerUsage", h)),
            "power_limit": _watts(self._read(POWER_LIMIT, h)),
            "sm_clock": self._read("nvmlDeviceGetClockInfo", h, CLOCK_SM),
            "mem_clock": self._read("nvmlDeviceGetClockInfo", h, CLOCK_MEM),
            "fan": self._read("nvmlDeviceGetFanSpeed", h),
            "pstate": "P%d" % pstate if pstate is not None and pstate != PSTATE_UNKNOWN else None,
            "enc": _int(enc[0]) if enc is not None else None,
            "dec": _int(dec[0]) if dec is not None else None,
            "throttle": decode_throttle(_int(mask)) if mask is not None else None,
            "processes": self._processes(i, h, pids, _int(mem.used) if mem is not None else None,
                                         _int(util.gpu) if util is not None else None),
            "mig": None,
        }

    def _processes(self, i: int, h: Any, pids: Set[int], mem_used: Optional[int],
                   util_gpu: Optional[int]) -> Optional[List[Dict[str, Any]]]:
        """Compute and graphics processes, one entry per pid (largest memory figure); the lists
        of the last read while the GPU's used memory ``mem_used`` stays the same (see the
        module docstring); ``util_gpu``: the GPU's utilization of this sample."""
        now = time.monotonic()
        kept = self._procs.get(i)
        if kept is not None and mem_used is not None and kept[0] == mem_used \
                and 0 <= now - kept[1] < self.procs_every:
            found, readable = kept[2], kept[3]
        else:
            found, readable = self._read_processes(h)
            if mem_used is not None:
                self._procs[i] = (mem_used, now, found, readable)
        if not readable:
            return None
        if not found:
            self._sm.pop(i, None)
            return self._names.rows(found, pids, None)
        if len(found) == 1 and util_gpu is not None:
            # One process: its SM % is the GPU's (both are the share of the sample period a
            # kernel ran; the GPU's counts the only process's), read this sample, without the
            # per-process call (1.5 ms on an H100): a training job's GPU, the common case.
            self._sm.pop(i, None)
            return self._names.rows(found, pids, {pid: util_gpu for pid in found})
        return self._names.rows(found, pids, self._process_sm(i, h, frozenset(found)))

    def _read_processes(self, h: Any) -> Tuple[Dict[int, Optional[int]], bool]:
        """pid -> GPU memory of the compute and graphics lists, and whether either was read."""
        found = {}  # type: Dict[int, Optional[int]]
        readable = False
        for names in (COMPUTE_PROCS, GRAPHICS_PROCS):
            procs = self._read(names, h)
            if procs is None:
                continue
            readable = True
            for p in procs:
                pid = _int(getattr(p, "pid", None))
                if pid is None:
                    continue
                mem = _int(getattr(p, "usedGpuMemory", None))
                if mem == NOT_AVAILABLE:
                    mem = None
                before = found.get(pid)
                if before is not None and (mem is None or mem < before):
                    continue
                found[pid] = mem
        return found, readable

    def _process_sm(self, i: int, h: Any, gpu_pids: Any) -> Dict[int, Optional[int]]:
        """pid -> SM % of its newest NVML utilization sample of the last few seconds (a pid
        without one ran no kernel then, or the GPU cannot tell: left out). Read again only
        after ``proc_util_every`` seconds or when the GPU's pids change."""
        now = time.monotonic()
        last = self._sm.get(i)
        if last is not None and last[1] == gpu_pids and now - last[0] < self.proc_util_every:
            return last[2]
        since = int((time.time() - PROC_UTIL_WINDOW_S) * 1e6)  # NVML stamps are microseconds
        samples = self._read("nvmlDeviceGetProcessUtilization", h, since,
                             key=("nvmlDeviceGetProcessUtilization", id(h), ()))
        newest = {}  # type: Dict[int, Tuple[int, Optional[int]]]
        for s in samples or ():
            pid = _int(getattr(s, "pid", None))
            stamp = _int(getattr(s, "timeStamp", None)) or 0
            util = _int(getattr(s, "smUtil", None))
            if pid is None or (pid in newest and newest[pid][0] > stamp):
                continue
            newest[pid] = (stamp, util if util is not None and 0 <= util <= 100 else None)
        sm = {pid: util for pid, (_, util) in newest.items()}
        self._sm[i] = (now, gpu_pids, sm)
        return sm

    def _read_pcie(self, h: Any) -> Dict[str, Any]:
        """PCIe TX and RX throughput in bytes/s (NVML's KB/s times ``KB``)."""
        tx = _int(self._read("nvmlDeviceGetPcieThroughput", h, PCIE_TX_BYTES))
        rx = _int(self._read("nvmlDeviceGetPcieThroughput", h, PCIE_RX_BYTES))
        return {"pcie_tx": tx * KB if tx is not None else None,
                "pcie_rx": rx * KB if rx is not None else None}

    def _read_slow(self, h: Any) -> Dict[str, Any]:
        """ECC counters, retired pages and remapped rows: one batched read of their NVML field
        ids, else (a driver or pynvml without ``nvmlDeviceGetFieldValues``) one call each."""
        if self.batched:
            values = self._field_values(h)
            if values is not None:
                return _slow_record(values)
        return self._read_slow_per_field(h)

    def _field_values(self, h: Any) -> Optional[Dict[int, Any]]:
        """Field id -> value of ``SLOW_FIELDS`` in one ``nvmlDeviceGetFieldValues`` call (a
        field whose own return code is an error is left out; NOT_SUPPORTED is not asked of this
        GPU again), or None when the batched call cannot be used: FUNCTION_NOT_FOUND (an old
        driver), NOT_SUPPORTED, a pynvml without it (then never again), another error (this
        read). Raises _Lost."""
        ids = [fid for fid, _, _ in SLOW_FIELDS if ("field", id(h), fid) not in self._unsupported]
        if not ids:
            return {}
        try:
            got = self._field_call(h, tuple(ids))
        except self._error as e:
            code = getattr(e, "value", None)
            if code == GPU_IS_LOST:
                raise _Lost()
            if code in (FUNCTION_NOT_FOUND, NOT_SUPPORTED):
                self.batched = False
            return None
        except Exception:  # _Unsupported: this pynvml lacks it; an old pynvml's quirk
            self.batched = False
            return None
        values = {}  # type: Dict[int, Any]
        for v in got:
            code = _int(v.nvmlReturn)
            if code == GPU_IS_LOST:
                raise _Lost()
            if code == NOT_SUPPORTED:
                self._unsupported.add(("field", id(h), _int(v.fieldId)))
            elif code == 0:
                member = VALUE_MEMBERS.get(_int(v.valueType) or 0)
                if member is not None:
                    values[_int(v.fieldId) or 0] = getattr(v.value, member)
        return values

    def _field_call(self, h: Any, ids: Tuple[int, ...]) -> Any:
        """``nvmlDeviceGetFieldValues(h, ids)`` into a buffer kept per GPU and ids (pynvml's
        builds one per call, each id in a try: that cost more CPU than the 8 calls it
        replaces); raises pynvml's NVMLError, FUNCTION_NOT_FOUND included."""
        fn = self._field_fn
        if fn is None:
            get = getattr(self._nv, "_nvmlGetFunctionPointer", None)
            if not callable(get):
                raise _Unsupported("nvmlDeviceGetFieldValues")
            fn = self._field_fn = get("nvmlDeviceGetFieldValues")
        key = (id(h), ids)
        buffer = self._field_buffers.get(key)
        if buffer is None:
            buffer = self._field_buffers[key] = (_FieldValue * len(ids))()
        for entry, fid in zip(buffer, ids):
            entry.fieldId = fid
            entry.scopeId = 0
        ret = fn(h, ctypes.c_int32(len(ids)), buffer)
        if ret != 0:
            raise self._nv.NVMLError(ret)
        return buffer

    def _read_slow_per_field(self, h: Any) -> Dict[str, Any]:
        counts = {}  # type: Dict[str, Optional[int]]
        for key, err, counter in (
            ("volatile_corrected", ECC_CORRECTED, ECC_VOLATILE),
            ("volatile_uncorrected", ECC_UNCORRECTED, ECC_VOLATILE),
            ("aggregate_corrected", ECC_CORRECTED, ECC_AGGREGATE),
            ("aggregate_uncorrected", ECC_UNCORRECTED, ECC_AGGREGATE),
        ):
            counts[key] = _int(self._read("nvmlDeviceGetTotalEccErrors", h, err, counter))
        single = self._read("nvmlDeviceGetRetiredPages", h, RETIRED_SINGLE_BIT)
        double = self._read("nvmlDeviceGetRetiredPages", h, RETIRED_DOUBLE_BIT)
        pending = self._read("nvmlDeviceGetRetiredPagesPendingStatus", h)
        retired = {
            "single_bit": len(single) if single is not None else None,
            "double_bit": len(double) if double is not None else None,
            "pending": bool(pending) if pending is not None else None,
        }
        rows = self._read("nvmlDeviceGetRemappedRows", h)
        remapped = None  # type: Optional[Dict[str, Any]]
        if rows is not None:
            remapped = {
                "correctable": _int(rows[0]),
                "uncorrectable": _int(rows[1]),
                "pending": bool(rows[2]),
                "failure": bool(rows[3]),
            }
        return {
            "ecc": counts if any(v is not None for v in counts.values()) else None,
            "retired_pages": retired if any(v is not None for v in retired.values()) else None,
            "remapped_rows": remapped,
        }

    # -- events --------------------------------------------------------------------------------
    def _open_event_set(self) -> Any:
        try:
            event_set = self._call("nvmlEventSetCreate")
        except Exception:
            return None
        registered = 0
        for h in self._handles:
            if h is None:
                continue
            try:
                self._call("nvmlDeviceRegisterEvents", h, EVENT_XID, event_set)
                registered += 1
            except Exception:  # NOT_SUPPORTED on some boards: no XIDs from that one
                pass
        if not registered:
            self._free_event_set(event_set)
            return None
        return event_set

    def _free_event_set(self, event_set: Any) -> None:
        try:
            self._call("nvmlEventSetFree", event_set)
        except Exception:
            pass

    def events(self) -> List["EventMessage"]:
        """XID and gpu_lost events since the last call; never blocks (NVML wait timeout 0)."""
        out, self._pending = self._pending, []
        if self._event_set is None:
            return out
        for _ in range(MAX_EVENTS_PER_POLL):
            try:
                data = self._call("nvmlEventSetWait", self._event_set, 0)
            except Exception:  # TIMEOUT: nothing waiting; anything else shows in the samples
                break
            if not (_int(data.eventType) or 0) & EVENT_XID:
                continue
            out.append(event("xid", self._index_of(data.device), {"xid": _int(data.eventData)}))
        return out

    def _index_of(self, handle: Any) -> Optional[int]:
        idx = self._index_of_handle.get(_address(handle))
        if idx is None:
            try:
                idx = self._call("nvmlDeviceGetIndex", handle)
            except Exception:
                idx = None
        return idx

    def _mark_lost(self, i: int, why: str = "GPU is lost") -> None:
        if i in self._lost:
            return
        self._lost.add(i)
        self._pending.append(event("gpu_lost", i, {"reason": why}))

    def close(self) -> None:
        """Free the event set and shut NVML down; never raises."""
        self._names.close()
        if self._event_set is not None:
            self._free_event_set(self._event_set)
            self._event_set = None
        try:
            self._nv.nvmlShutdown()
        except Exception:
            pass

    @staticmethod
    def _text(value: Any) -> Optional[str]:
        if isinstance(value, bytes):
            return value.decode("utf-8", "replace")
        return value if value is None else str(value)


class _OneCall(object):
    """An NVML list read with one driver call: ``fn(handle)`` for running processes,
    ``fn(handle, since)`` for per-process utilization; returns the filled entries (valid until
    the next call: the buffer is reused) and raises pynvml's NVMLError as pynvml would.

    pynvml asks the size first (a NULL buffer), then the list, and converts each entry; NVML
    fills a buffer that is large enough at once and says INSUFFICIENT_SIZE (with the count)
    otherwise, so the buffer grows to twice that and the call is made again."""

    def __init__(self, nv: Any, name: str, entry: Any) -> None:
        self._nv = nv
        self._name = name
        self._entry = entry
        self._utilization = entry is _UtilizationSample
        self._size = SAMPLE_BUFFER if self._utilization else PROC_BUFFER
        self._buffer = None  # type: Any
        self._fn = None  # type: Any
        self._count = ctypes.c_uint(0)

    def __call__(self, handle: Any, since: int = 0) -> List[Any]:
        if self._fn is None:  # FUNCTION_NOT_FOUND (NVMLError) when the library lacks it
            self._fn = self._nv._nvmlGetFunctionPointer(self._name)
        count = self._count
        for _ in range(4):
            if self._buffer is None:
                self._buffer = (self._entry * self._size)()
            count.value = self._size
            if self._utilization:
                ret = self._fn(handle, self._buffer, ctypes.byref(count),
                               ctypes.c_ulonglong(since))
            else:
                ret = self._fn(handle, ctypes.byref(count), self._buffer)
            if ret == 0:
                return self._buffer[:count.value] if count.value else []
            if ret != INSUFFICIENT_SIZE:
                raise self._nv.NVMLError(ret)
            self._size = max(self._size, int(count.value) * 2 + 5)
            self._buffer = None
        raise self._nv.NVMLError(INSUFFICIENT_SIZE)  # a list growing faster than we follow


class _Unsupported(Exception):
    """No alternative of a call exists in this pynvml."""


def _address(handle: Any) -> Any:
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except Exception:
        return id(handle)


def _int(value: Any) -> Optional[int]:
    if value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _slow_record(values: Dict[int, Any]) -> Dict[str, Any]:
    """The slow readings from their field values (``_field_values``): a group none of whose
    fields was read is None, as the per-field read gives it."""
    groups = {"ecc": {}, "retired_pages": {}, "remapped_rows": {}}  # type: Dict[str, Dict[str, Any]]
    for fid, key, part in SLOW_FIELDS:
        value = values.get(fid)
        if value is not None:
            value = bool(value) if part in FLAG_KEYS else _int(value)
        groups[key][part] = value
    return {key: group if any(v is not None for v in group.values()) else None
            for key, group in groups.items()}


def _watts(milliwatts: Any) -> Optional[float]:
    if milliwatts is None:
        return None
    return round(float(milliwatts) / 1000.0, 1)
