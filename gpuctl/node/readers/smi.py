"""The nvidia-smi reader: the fallback when pynvml is missing, one CSV query per sample.

``nvidia-smi --query-gpu=FIELDS --format=csv,noheader,nounits`` prints one line per GPU. Values
in brackets (``[N/A]``, ``[Not Supported]``, ``[Unknown Error]``, ``[Insufficient
Permissions]``) become null; ``[GPU is lost]`` turns the GPU's record into the "lost" state and
queues one ``gpu_lost`` event. Drivers differ in the fields they accept (the throttle reasons
were renamed ``clocks_event_reasons``; remapped rows came with Ampere-era drivers), so ``open()``
finds the accepted set once and later queries ask only for those. Processes come from
``--query-compute-apps``, run alongside the GPU query. XIDs are not available this way.
Python 3.6 syntax, standard library only.
"""

import csv
import os
import re
import shutil
import subprocess
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Set, Tuple

from ..metrics import METRICS
from ..protocol import decode_throttle
from .base import Reader, ReaderUnavailable
from .procs import ProcessNames
from .emit import event, lost_record

if TYPE_CHECKING:
    from ..messages import EventMessage

TIMEOUT_S = 10.0  # nvidia-smi hangs on a wedged GPU; a sample must not wait forever
MIB = 1 << 20

STATIC_QUERY = (
    "index",
    "uuid",
    "name",
    "serial",
    "memory.total",
    "power.limit",
    "clocks.max.sm",
    "clocks.max.memory",
    "pcie.link.gen.max",
    "pcie.link.width.max",
    "mig.mode.current",
    "driver_version",
)
# Each entry: our name, then the nvidia-smi fields to try, newest name first: the registry's
# readings that nvidia-smi can give (PCIe throughput it cannot: null here), then the throttle.
FAST = tuple((m.key, m.smi) for m in METRICS if m.smi) + (
    ("throttle", ("clocks_event_reasons.active", "clocks_throttle_reasons.active")),
)
# A reading's text -> its wire value, by the registry's unit (nounits: memory comes in MiB).
_BY_UNIT = {"bytes": "mib", "W": "float", "": "pstate"}
SLOW = (
    ("ecc.volatile_corrected", ("ecc.errors.corrected.volatile.total",)),
    ("ecc.volatile_uncorrected", ("ecc.errors.uncorrected.volatile.total",)),
    ("ecc.aggregate_corrected", ("ecc.errors.corrected.aggregate.total",)),
    ("ecc.aggregate_uncorrected", ("ecc.errors.uncorrected.aggregate.total",)),
    ("retired_pages.single_bit", ("retired_pages.single_bit_ecc.count", "retired_pages.sbe")),
    ("retired_pages.double_bit", ("retired_pages.double_bit.count", "retired_pages.dbe")),
    ("retired_pages.pending", ("retired_pages.pending",)),
    ("remapped_rows.correctable", ("remapped_rows.correctable",)),
    ("remapped_rows.uncorrectable", ("remapped_rows.uncorrectable",)),
    ("remapped_rows.pending", ("remapped_rows.pending",)),
    ("remapped_rows.failure", ("remapped_rows.failure",)),
)
SLOW_GROUPS = (
    (
        "ecc",
        (
            "volatile_corrected",
            "volatile_uncorrected",
            "aggregate_corrected",
            "aggregate_uncorrected",
        ),
    ),
    ("retired_pages", ("single_bit", "double_bit", "pending")),
    ("remapped_rows", ("correctable", "uncorrectable", "pending", "failure")),
)
BOOL_KEYS = ("retired_pages.pending", "remapped_rows.pending", "remapped_rows.failure")
APPS_QUERY = ("gpu_uuid", "pid", "used_memory")
INVALID_FIELD = re.compile(r'Field "([^"]+)" is not a valid field')
LOST = "gpu is lost"
Apps = Dict[int, List[Tuple[int, Optional[int]]]]


class SmiError(Exception):
    """nvidia-smi failed; the message is one line."""


class SmiReader(Reader):
    """Reads GPUs by running nvidia-smi; build it with ``SmiReader.open()``."""

    name = "nvidia-smi"

    def __init__(self, binary: str) -> None:
        self._bin = binary
        self._names = ProcessNames()
        self._parents = []  # type: List[Dict[str, Any]]
        self._lost = set()  # type: Set[int]
        self._pending = []  # type: List["EventMessage"]
        self._slow = {}  # type: Dict[int, Dict[str, Any]]
        self._versions = {
            "driver": None, "cuda": None, "nvml": None}  # type: Dict[str, Optional[str]]
        static_fields, out = self._accepted(STATIC_QUERY)
        rows = self._parse(0, out, "", static_fields)
        if not rows:
            raise SmiError("nvidia-smi lists no GPUs")
        self._static = []  # type: List[Dict[str, Any]]
        self._uuids = []  # type: List[Optional[str]]
        for row in rows:
            values = dict(zip(static_fields, row))
            self._static.append(self._static_record(values))
            self._uuids.append(_value(values.get("uuid")))
            if self._versions["driver"] is None:
                self._versions["driver"] = _value(values.get("driver_version"))
        self._index_of_uuid = dict((u, i) for i, u in enumerate(self._uuids) if u)
        # What this driver accepts, chosen once: our key -> the nvidia-smi field.
        self._fast = self._choose(FAST)
        self._slow_fields = self._choose(SLOW)
        self._apps_ok = self._probe_apps()
        self._read_versions()

    @classmethod
    def open(cls) -> "SmiReader":
        """Find nvidia-smi and list the GPUs; raises ReaderUnavailable(one-line reason)."""
        binary = shutil.which("nvidia-smi")
        if binary is None:
            raise ReaderUnavailable("nvidia-smi is not on PATH")
        try:
            return cls(binary)
        except SmiError as e:
            raise ReaderUnavailable(str(e))

    # -- running nvidia-smi --------------------------------------------------------------------
    def _start(self, args: Sequence[str]) -> "subprocess.Popen[bytes]":
        env = dict(os.environ)
        env["LC_ALL"] = "C"  # numbers with a dot, messages in English
        try:
            return subprocess.Popen(
                [self._bin] + list(args),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
            )
        except OSError as e:
            raise SmiError("cannot run %s: %s" % (self._bin, e))

    def _finish(self, proc: "subprocess.Popen[bytes]") -> Tuple[int, str, str]:
        """Wait for a started nvidia-smi; returns (exit code, stdout text, stderr text)."""
        try:
            out, err = proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise SmiError("nvidia-smi did not answer within %g s" % TIMEOUT_S)
        return (proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))

    def _run(self, args: Sequence[str]) -> Tuple[int, str, str]:
        return self._finish(self._start(args))

    def _query_args(self, fields: Sequence[str]) -> List[str]:
        return ["--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"]

    def _parse(self, code: int, out: str, err: str,
               fields: Sequence[str]) -> List[List[str]]:
        """Rows of a --query-gpu run; raises SmiError with nvidia-smi's own words."""
        rows = [r for r in csv.reader(out.splitlines(), skipinitialspace=True) if r]
        if code != 0 or any(len(r) != len(fields) for r in rows):
            raise SmiError("nvidia-smi failed (exit %s): %s" % (code, _first_line(out, err)))
        return [[c.strip() for c in r] for r in rows]

    def _accepted(self, wanted: Sequence[str]) -> Tuple[List[str], str]:
        """The subset of ``wanted`` fields this nvidia-smi accepts (asked once, at open), and
        the output of the query that asked for exactly that subset."""
        fields = list(wanted)
        for _ in range(len(fields) + 1):
            code, out, err = self._run(self._query_args(fields))
            bad = INVALID_FIELD.search(out + err)
            if bad and bad.group(1) in fields:
                fields.remove(bad.group(1))
                continue
            if code != 0 or not out.strip():
                raise SmiError("nvidia-smi failed (exit %s): %s" % (code, _first_line(out, err)))
            return fields, out
        raise SmiError("nvidia-smi accepts none of the fields asked for")

    def _choose(self, table: Sequence[Tuple[str, Tuple[str, ...]]]) -> List[Tuple[str, str]]:
        """Our key -> the first of its nvidia-smi fields that this driver accepts."""
        candidates = []  # type: List[str]
        for _, alternatives in table:
            candidates.extend(alternatives)
        accepted = set(self._accepted(["index"] + candidates)[0])
        chosen = []  # type: List[Tuple[str, str]]
        for key, alternatives in table:
            for field in alternatives:
                if field in accepted:
                    chosen.append((key, field))
                    break
        return chosen

    def _probe_apps(self) -> bool:
        code, out, err = self._run(
            ["--query-compute-apps=" + ",".join(APPS_QUERY), "--format=csv,noheader,nounits"]
        )
        return code == 0 and not INVALID_FIELD.search(out + err)

    def _read_versions(self) -> None:
        """CUDA and NVML versions from ``nvidia-smi --version`` (newer drivers) or the banner."""
        try:
            code, out, err = self._run(["--version"])
            text = out if code == 0 else ""
            if "CUDA" not in text:
                code, out, err = self._run([])
                text = out if code == 0 else ""
        except SmiError:
            return
        cuda = re.search(r"CUDA Version\s*:?\s*([0-9][0-9.]*)", text)
        nvml = re.search(r"NVML version\s*:\s*([0-9][0-9.]*)", text)
        if cuda:
            self._versions["cuda"] = cuda.group(1)
        if nvml:
            self._versions["nvml"] = nvml.group(1)

    # -- static facts --------------------------------------------------------------------------
    def versions(self) -> Dict[str, Optional[str]]:
        """Driver, CUDA and NVML version strings as nvidia-smi reports them (None if unknown)."""
        return dict(self._versions)

    def static(self) -> List[Dict[str, Any]]:
        """Static facts per GPU (protocol.STATIC_FIELDS), read once at open."""
        return [dict(s) for s in self._static]

    def _static_record(self, v: Dict[str, str]) -> Dict[str, Any]:
        mig = _value(v.get("mig.mode.current"))
        return {
            "index": _int(v.get("index")),
            "uuid": _value(v.get("uuid")),
            "name": _value(v.get("name")),
            "mem_total": _mib(v.get("memory.total")),
            "power_limit": _float(v.get("power.limit")),
            "max_sm_clock": _int(v.get("clocks.max.sm")),
            "max_mem_clock": _int(v.get("clocks.max.memory")),
            "pcie_gen": _int(v.get("pcie.link.gen.max")),
            "pcie_width": _int(v.get("pcie.link.width.max")),
            "mig_mode": mig.lower() == "enabled" if mig is not None else None,
            "serial": _value(v.get("serial")),
        }

    # -- samples -------------------------------------------------------------------------------
    def sample(self, slow: bool = True) -> List[Dict[str, Any]]:
        """One dict per GPU (protocol.SAMPLE_FIELDS); slow=True also reads the slow fields.

        Raises SmiError when nvidia-smi itself fails (the agent reports it and carries on).
        """
        slow = slow or not self._slow
        pairs = list(self._fast) + (list(self._slow_fields) if slow else [])
        fields = ["index"] + [f for _, f in pairs]
        gpu_proc = self._start(self._query_args(fields))
        apps_proc = None
        if self._apps_ok:
            apps_proc = self._start(
                ["--query-compute-apps=" + ",".join(APPS_QUERY), "--format=csv,noheader,nounits"]
            )
        try:
            code, text, err = self._finish(gpu_proc)
            rows = self._parse(code, text, err, fields)
        finally:
            apps = self._apps(apps_proc) if apps_proc is not None else None
        by_index = {}  # type: Dict[int, Dict[str, str]]
        for row in rows:
            idx = _int(row[0])
            if idx is not None:
                by_index[idx] = dict(zip([k for k, _ in pairs], row[1:]))
        pids = set()  # type: Set[int]
        out = []  # type: List[Dict[str, Any]]
        for i in range(len(self._static)):
            values = by_index.get(i)
            if i in self._lost or values is None or any(_is_lost(v) for v in values.values()):
                self._mark_lost(i)
                out.append(lost_record(i, self._uuids[i]))
                continue
            rec = self._fast_record(i, values)
            if slow:
                self._slow[i] = self._slow_record(values)
            rec.update(self._slow.get(i) or _empty_slow())
            rec["processes"] = self._processes(apps, i, pids)
            rec["mig"] = None  # nvidia-smi's query has no per-instance readings
            out.append(rec)
        self._parents = self._names.parents(pids)
        self._names.forget_except(pids)
        return out

    def parents(self) -> List[Dict[str, Any]]:
        """Ancestors of the last sample's GPU processes (``ProcessNames.parents``)."""
        return self._parents

    def _fast_record(self, i: int, v: Dict[str, str]) -> Dict[str, Any]:
        text = _value(v.get("throttle"))
        try:
            mask = int(text, 16) if text is not None else None
        except ValueError:
            mask = None
        rec = {"index": i, "uuid": self._uuids[i], "state": "ok"}  # type: Dict[str, Any]
        for m in METRICS:
            kind = _BY_UNIT.get(m.unit)
            text = v.get(m.key)
            if kind is None:
                rec[m.key] = _int(text)
            elif kind == "mib":
                rec[m.key] = _mib(text)
            elif kind == "float":
                rec[m.key] = _float(text)
            else:
                pstate = _value(text)
                rec[m.key] = pstate if pstate and re.match(r"^P\d+$", pstate) else None
        rec["throttle"] = decode_throttle(mask)
        return rec

    def _slow_record(self, v: Dict[str, str]) -> Dict[str, Any]:
        rec = {}  # type: Dict[str, Any]
        for group, keys in SLOW_GROUPS:
            values = {}  # type: Dict[str, Any]
            for key in keys:
                full = group + "." + key
                values[key] = _bool(v.get(full)) if full in BOOL_KEYS else _int(v.get(full))
            rec[group] = values if any(x is not None for x in values.values()) else None
        return rec

    def _apps(self, proc: "subprocess.Popen[bytes]") -> Optional[Apps]:
        """GPU index -> [(pid, bytes or None)], or None when the query failed."""
        try:
            code, out, err = self._finish(proc)
        except SmiError:
            return None
        if code != 0:
            return None
        apps = {}  # type: Apps
        for row in csv.reader(out.splitlines(), skipinitialspace=True):
            if len(row) != len(APPS_QUERY):
                continue  # "No running processes found" and the like
            idx = self._index_of_uuid.get(row[0].strip())
            pid = _int(row[1])
            if idx is None or pid is None:
                continue
            apps.setdefault(idx, []).append((pid, _mib(row[2])))
        return apps

    def _processes(self, apps: Optional[Apps], i: int,
                   pids: Set[int]) -> Optional[List[Dict[str, Any]]]:
        if apps is None:
            return None
        found = {}  # type: Dict[int, Optional[int]]
        for pid, mem in apps.get(i, ()):
            if pid not in found or (mem is not None and (found[pid] or 0) < mem):
                found[pid] = mem
        return self._names.rows(found, pids)

    # -- events --------------------------------------------------------------------------------
    def events(self) -> List["EventMessage"]:
        """gpu_lost events since the last call (nvidia-smi cannot report XIDs)."""
        out, self._pending = self._pending, []
        return out

    def _mark_lost(self, i: int) -> None:
        if i in self._lost:
            return
        self._lost.add(i)
        self._pending.append(event("gpu_lost", i, {"reason": "nvidia-smi: GPU is lost"}))

    def close(self) -> None:
        """Nothing to release: every nvidia-smi run has already exited."""


def _first_line(out: str, err: str) -> str:
    for text in (err, out):
        for line in text.splitlines():
            if line.strip():
                return line.strip()[:200]
    return "no output"


def _value(raw: Optional[str]) -> Optional[str]:
    """The text of a CSV cell, None for nvidia-smi's "cannot tell" forms."""
    if raw is None:
        return None
    raw = raw.strip()
    if not raw or (raw.startswith("[") and raw.endswith("]")):
        return None
    if raw.lower() in ("n/a", "not supported", "unknown error", "unknown"):
        return None
    return raw


def _is_lost(raw: Optional[str]) -> bool:
    return raw is not None and LOST in raw.lower()


def _int(raw: Optional[str]) -> Optional[int]:
    v = _value(raw)
    if v is None:
        return None
    try:
        return int(v)
    except ValueError:
        try:
            return int(float(v))
        except ValueError:
            return None


def _float(raw: Optional[str]) -> Optional[float]:
    v = _value(raw)
    if v is None:
        return None
    try:
        return round(float(v), 1)
    except ValueError:
        return None


def _mib(raw: Optional[str]) -> Optional[int]:
    v = _int(raw)
    return v * MIB if v is not None else None


def _bool(raw: Optional[str]) -> Optional[bool]:
    v = _value(raw)
    if v is None:
        return None
    low = v.lower()
    if low in ("yes", "true", "enabled", "1"):
        return True
    if low in ("no", "false", "disabled", "0"):
        return False
    return None


def _empty_slow() -> Dict[str, Any]:
    return {"ecc": None, "retired_pages": None, "remapped_rows": None}
