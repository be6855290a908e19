"""gpu-burn when present: find it (or find the CUDA toolkit and build it), run it, read it.

``python -m gpuctl.workloads.gpuburn run [--binary P | --source DIR] [--gpu ID] [--duration S]``
prints the same JSON lines as the torch burner (``step`` lines for discovery and building,
``progress`` about once per second per GPU, one ``summary`` per GPU with a verdict), and
``python -m gpuctl.workloads.gpuburn find`` prints what discovery finds.

Facts this relies on (shared/notes/gpu-burn.md): TIME must be the last argument; the compare
kernel is loaded from the working directory; progress is one line rewritten with ``\\r``;
error counters reset after each ``Summary at:`` block; gpu-burn exits 0 even with faulty GPUs,
so the verdict comes from its final ``Tested N GPUs:`` block, and a run without that block
failed. Its parent has no SIGTERM handler, so it runs in its own process group and the whole
group is signalled.

Reaching that summary: at the end of its TIME gpu-burn SIGTERMs its workers and sleeps ``-stts``
seconds (default 30) before it prints the summary; we pass a short ``-stts`` (``--stts``, 3 s)
and, once gpu-burn has begun its end (``Killing processes with SIGTERM``), a stop request waits
for the summary instead of killing it. A stop before that point cannot have a summary: gpu-burn
dies on SIGTERM without one, so the burn ends without a verdict (or FAULTY/DIED from what its
progress lines showed). ``elapsed`` is gpu-burn's own clock (its percentage of TIME), so the
agent's duration limit runs from gpu-burn's start, not from ours.

Reading it: a dead worker (``-1`` proc'd, `` (DIED!)``) is DIED with the CUDA error its stderr
gave (``Couldn't init a GPU test: ...``, ``Failure during compute: ...``), whatever its final
line says, and its error counter (its count plus -1, then garbage) is not counted; worker i is
the i-th CUDA_VISIBLE_DEVICES entry (its label), and gpu-burn's temperature column is mapped to
it only when gpu-burn burns every GPU of the node (see ``GpuBurnOutput.temp_slot``); gpu-burn
computes fp32, fp64 (``-d``) or tf32 (``-tc``) only, and every line says which (``dtype``).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuctl.node.proc import set_death_signal, signal_group, spawn
from gpuctl.node.stress import GPU_BURN_STTS_S

COMPARE_FILES = ("compare.fatbin", "compare.ptx")
EXIT_REASONS = {
    123: "all gpu-burn workers died",
    124: "a gpu-burn worker failed to set up its GPU",
    111: "a compute call failed",
    19: "no CUDA device",
    22: "gpu-burn refused its -m or -i argument",
}
Report = Callable[[str], None]


# -- toolkit discovery ------------------------------------------------------------------------
@dataclass(frozen=True)
class Toolkit:
    """A CUDA toolkit: ``root`` is what gpu-burn's Makefile calls CUDAPATH."""

    root: str
    nvcc: str
    how: str  # which rule found it, for the report


def _version_key(name: str) -> tuple[int, ...] | None:
    m = re.fullmatch(r"cuda-(\d+(?:\.\d+)*)", name)
    return tuple(int(p) for p in m.group(1).split(".")) if m else None


def toolkit_candidates(env: Mapping[str, str], root: str = "/") -> list[tuple[str, str]]:
    """``(how, bin folder)`` in search order: nvcc on PATH, $CUDA_HOME, $CUDA_PATH,
    /usr/local/cuda, /usr/local/cuda-* newest version first, /opt/cuda. ``root`` prefixes the
    fixed locations (tests lay out install trees under a temporary folder)."""
    out: list[tuple[str, str]] = []
    for d in env.get("PATH", "").split(os.pathsep):
        if d and _is_exe(os.path.join(d, "nvcc")):
            out.append(("nvcc on PATH", d))
            break
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if env.get(var):
            out.append((f"${var}", os.path.join(env[var], "bin")))
    local = os.path.join(root, "usr", "local")
    out.append(("/usr/local/cuda", os.path.join(local, "cuda", "bin")))
    try:
        names = os.listdir(local)
    except OSError:
        names = []
    versioned = sorted(
        ((key, n) for n in names if (key := _version_key(n)) is not None), reverse=True
    )
    out.extend((f"/usr/local/{n}", os.path.join(local, n, "bin")) for _, n in versioned)
    out.append(("/opt/cuda", os.path.join(root, "opt", "cuda", "bin")))
    return out


def _is_exe(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _has_headers(root: str) -> bool:
    return os.path.isfile(os.path.join(root, "include", "cuda_runtime.h"))


def nvcc_top(nvcc: str) -> str | None:
    """Ask nvcc where its toolkit is (``-dryrun`` prints ``#$ TOP=...``): an nvcc on PATH may
    be a wrapper script or a link far from its headers."""
    try:
        proc = subprocess.run(
            [nvcc, "-dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in (proc.stdout + proc.stderr).splitlines():
        m = re.match(r"#\$ TOP=(.+)$", line.strip())
        if m:
            return os.path.normpath(m.group(1))
    return None


def find_toolkit(
    env: Mapping[str, str] | None = None,
    root: str = "/",
    ask_nvcc: Callable[[str], str | None] = nvcc_top,
) -> tuple[Toolkit | None, list[str]]:
    """The first usable toolkit and, either way, one line per place looked at and why not."""
    env = os.environ if env is None else env
    looked: list[str] = []
    seen: set[str] = set()
    for how, bindir in toolkit_candidates(env, root):
        nvcc = os.path.join(bindir, "nvcc")
        if not _is_exe(nvcc):
            looked.append(f"{how}: no nvcc in {bindir}")
            continue
        real = os.path.realpath(nvcc)
        if real in seen:
            continue
        seen.add(real)
        top = os.path.dirname(os.path.dirname(real))
        if not _has_headers(top):
            asked = ask_nvcc(nvcc)
            if asked and _has_headers(asked):
                top = asked
            else:
                looked.append(f"{how}: {nvcc} has no include/cuda_runtime.h near it")
                continue
        return Toolkit(root=top, nvcc=nvcc, how=how), looked
    return None, looked


def find_gpu_burn(
    configured: str | None = None, env: Mapping[str, str] | None = None
) -> str | None:
    """A ``gpu_burn`` binary: the configured path (file or folder), else the first on PATH."""
    env = os.environ if env is None else env
    if configured:
        path = os.path.expanduser(configured)
        if os.path.isdir(path):
            path = os.path.join(path, "gpu_burn")
        return path if _is_exe(path) else None
    for d in env.get("PATH", "").split(os.pathsep):
        if d and _is_exe(os.path.join(d, "gpu_burn")):
            return os.path.join(d, "gpu_burn")
    return None


class BuildError(Exception):
    """gpu-burn could not be found or built; the message is one line saying what to do."""


# Files of a gpu-burn source folder that decide what a build produces (hashed for the key).
SOURCE_SUFFIXES = (".cpp", ".cu", ".h", ".hpp", ".cuh", ".c")
BUILD_PRODUCTS = ("gpu_burn", "*.o", "*.fatbin", "*.ptx", ".git")
# The compiler's or linker's own words for why a build failed; make's "*** [...] Error 1",
# "compilation terminated." and collect2's "ld returned 1 exit status" only say that it did.
CAUSE_RE = re.compile(
    r"fatal error|error:|cannot find -l|undefined reference|No such file|not found|"
    r"Permission denied|unsupported",
    re.IGNORECASE,
)
NOISE_RE = re.compile(
    r"^(make(\[\d+\])?: \*\*\*|compilation terminated\.|collect2: error: ld returned)"
)


def default_build_root(env: Mapping[str, str]) -> str:
    """Where built gpu-burns are kept on a node: ``~/.cache/gpuctl/gpu-burn``, beside the other
    folders gpuctl keeps on nodes (``gpuctl.paths.NODE_ENV_DIR``, the agent bundle's default)."""
    home = env.get("HOME") or os.path.expanduser("~")
    return os.path.join(home, ".cache", "gpuctl", "gpu-burn")


def build_key(source: str, toolkit: Toolkit, env: Mapping[str, str]) -> str:
    """A hash of what a build depends on: the source files (names and bytes), nvcc's real path,
    CUDAPATH and ``$COMPUTE`` (gpu-burn's Makefile reads it). A changed source rebuilds."""
    h = hashlib.sha256()
    for name, value in (
        ("nvcc", os.path.realpath(toolkit.nvcc)),
        ("cudapath", toolkit.root),
        ("compute", env.get("COMPUTE", "")),
    ):
        h.update(f"{name}={value}\0".encode())
    for folder, dirs, files in sorted(os.walk(source)):
        dirs[:] = sorted(d for d in dirs if d != ".git")
        for name in sorted(files):
            if name == "Makefile" or name.endswith(SOURCE_SUFFIXES):
                path = os.path.join(folder, name)
                h.update(os.path.relpath(path, source).encode() + b"\0")
                with open(path, "rb") as f:
                    h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()[:16]


def build_cause(output: str, limit: int = 3) -> list[str]:
    """The lines of a failed build's output that say why (the compiler's, the linker's)."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    causes: list[str] = []
    for ln in lines:
        if CAUSE_RE.search(ln) and not NOISE_RE.match(ln) and ln not in causes:
            causes.append(ln)
    if not causes:
        causes = [ln for ln in lines if not NOISE_RE.match(ln)][-1:] or lines[-1:]
    return [ln[:300] for ln in causes[:limit]]


def _built(folder: str) -> str | None:
    binary = os.path.join(folder, "gpu_burn")
    ok = _is_exe(binary) and any(os.path.exists(os.path.join(folder, c)) for c in COMPARE_FILES)
    return binary if ok else None


def build_gpu_burn(
    source: str,
    report: Report,
    *,
    env: Mapping[str, str] | None = None,
    root: str = "/",
    ask_nvcc: Callable[[str], str | None] = nvcc_top,
    timeout: float = 900,
    build_root: str | None = None,
) -> str:
    """gpu-burn built from ``source`` with ``make CUDAPATH=<toolkit>``, once per source and
    toolkit, reporting each step; returns the binary's path, raises BuildError.

    The build runs in a private copy of the source and the finished folder is renamed into
    place (``<build_root>/gpu-burn-<key>``, see ``build_key``), so nobody ever runs a binary
    that is being written (``Text file busy``); a lock file next to it (flock) makes the GPUs
    of one node build once and the others wait and reuse it."""
    env = dict(os.environ if env is None else env)
    source = os.path.abspath(os.path.expanduser(source))
    if not os.path.isfile(os.path.join(source, "Makefile")):
        raise BuildError(f"{source} is not a gpu-burn source folder (no Makefile)")
    toolkit, looked = find_toolkit(env, root, ask_nvcc)
    if toolkit is None:
        raise BuildError(
            "no CUDA toolkit found (looked at: "
            + "; ".join(looked)
            + "); set CUDA_HOME or install the toolkit"
        )
    report(f"CUDA toolkit {toolkit.root} (found by {toolkit.how}: {toolkit.nvcc})")
    build_root = os.path.abspath(os.path.expanduser(build_root or default_build_root(env)))
    key = build_key(source, toolkit, env)
    final = os.path.join(build_root, f"gpu-burn-{key}")
    binary = _built(final)
    if binary is not None:
        report(f"using {binary} (built before from {source})")
        return binary
    try:
        os.makedirs(build_root, mode=0o700, exist_ok=True)
        lock = open(os.path.join(build_root, f"gpu-burn-{key}.lock"), "a")  # noqa: SIM115
    except OSError as e:
        raise BuildError(f"cannot use the build folder {build_root}: {e.strerror or e}") from None
    with lock:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            report(f"waiting for another build of {source} ({lock.name})")
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        binary = _built(final)  # built while we waited
        if binary is not None:
            report(f"using {binary} (built meanwhile from {source})")
            return binary
        return _make(source, final, toolkit, env, report, timeout)


def _make(
    source: str,
    final: str,
    toolkit: Toolkit,
    env: dict[str, str],
    report: Report,
    timeout: float,
) -> str:
    """Build in a private copy of ``source`` and rename it to ``final`` (caller holds the lock)."""
    make = next(
        (
            os.path.join(d, "make")
            for d in env.get("PATH", "").split(os.pathsep)
            if d and _is_exe(os.path.join(d, "make"))
        ),
        None,
    )
    if make is None:
        raise BuildError("make not found on PATH: install make and a C++ compiler")
    work = f"{final}.{os.getpid()}.tmp"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(source, work, ignore=shutil.ignore_patterns(*BUILD_PRODUCTS))
    report(f"building: make CUDAPATH={toolkit.root} in {work} (a copy of {source})")
    env["PATH"] = os.pathsep.join([os.path.dirname(toolkit.nvcc), env.get("PATH", "")])
    log = f"{final}.build.log"
    try:
        proc = subprocess.run(
            [make, f"CUDAPATH={toolkit.root}"],
            cwd=work,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        shutil.rmtree(work, ignore_errors=True)
        raise BuildError(f"make in {source} took longer than {timeout:g} s") from None
    with open(log, "w") as f:
        f.write(proc.stdout)
    binary = _built(work)
    if proc.returncode != 0 or binary is None:
        shutil.rmtree(work, ignore_errors=True)
        cause = "; ".join(build_cause(proc.stdout)) or "no output"
        if proc.returncode == 0:
            cause = f"it made no gpu_burn with compare.fatbin or compare.ptx ({cause})"
        raise BuildError(
            f"make in {source} failed (exit {proc.returncode}): {cause} (full log: {log})"
        )
    try:
        os.rename(work, final)
    except OSError:  # another node sharing this folder (no shared lock there) was first
        shutil.rmtree(work, ignore_errors=True)
        if _built(final) is None:
            raise BuildError(f"cannot move the build of {source} to {final}") from None
    binary = os.path.join(final, "gpu_burn")
    report(f"built {binary}")
    return binary


# -- output parsing -------------------------------------------------------------------------
PROGRESS_RE = re.compile(
    r"^\s*(?P<pct>\d+(?:\.\d+)?)%\s+proc'd:(?P<procd>.*?)errors:(?P<errors>.*?)"
    r"(?:temps:(?P<temps>.*))?$"
)
PROCD_RE = re.compile(r"(-?\d+)\s*\(\s*(\d+(?:\.\d+)?)\s*Gflop/s\)")
# "-1  (DIED!)": a dead worker's counter is its last count plus -1 (then whatever its closed pipe
# leaves in gpu-burn's variable): the sign is part of the number, and the number means nothing.
ERRORS_RE = re.compile(r"(-?\d+)\s*(\((?:DIED!|WARNING!)\))?")
TEMPS_RE = re.compile(r"(-?\d+)\s*C|(--)")
FINAL_RE = re.compile(r"^\s*GPU\s+(\d+):\s*(OK|FAULTY)\s*$")
TESTED_RE = re.compile(r"^\s*Tested\s+(\d+)\s+GPUs:")
INIT_RE = re.compile(
    r"^\s*Initialized device (\d+) with (\d+) MB.*using (FLOATS|DOUBLES)(, using Tensor Cores)?"
)
# gpu-burn's start-up `nvidia-smi -L`: every GPU of the node, whatever CUDA_VISIBLE_DEVICES says
SMI_RE = re.compile(r"^\s*GPU\s+(\d+):\s*(.*?)\s*\(UUID:\s*(\S+?)\)\s*$")
# stderr: a worker's CUDA error, and the parent's report of a worker's closed pipe (no newline)
CUDA_ERROR_PREFIXES = ("Couldn't init a GPU test", "Failure during compute", "Couldn't init CUDA")
READ_ERROR_RE = re.compile(r"read\[(\d+)\] error -?\d+")
STDERR_PENDING_MAX = 4096
ENDING_RE = re.compile(r"^\s*Killing processes with SIGTERM")


@dataclass
class GpuState:
    """What gpu-burn has said about one of its workers."""

    index: int
    iterations: int = 0
    gflops: float = 0.0
    gflops_sum: float = 0.0
    samples: int = 0
    errors_now: int = 0  # since the last "Summary at:" (gpu-burn resets its counters there)
    errors_before: int = 0
    died: bool = False
    temp: int | None = None
    final: str | None = None  # OK | FAULTY from the last block
    dtype: str | None = None  # what its "Initialized device" line says it computes

    @property
    def errors(self) -> int:
        return self.errors_before + self.errors_now


@dataclass
class GpuBurnOutput:
    """Incremental parser of gpu-burn's stdout and stderr."""

    # The physical GPU (a CUDA_VISIBLE_DEVICES entry: index or UUID) of each worker, in gpu-burn's
    # order; None: every GPU, in PCI order (CUDA_DEVICE_ORDER=PCI_BUS_ID). See ``temp_slot``.
    devices: list[str] | None = None
    pinned: int | None = None  # gpu-burn's -i N, if given
    dtype: str | None = None  # what the command line asks for (a worker's init line says more)
    tail: list[str] = field(default_factory=list)  # the last lines of stderr
    gpus: dict[int, GpuState] = field(default_factory=dict)
    smi_uuids: list[str] = field(default_factory=list)
    cuda_errors: list[str] = field(default_factory=list)
    percent: float = 0.0
    tested: int | None = None
    all_died: bool = False
    failures: list[str] = field(default_factory=list)
    initialized: int = 0
    ending: bool = False  # gpu-burn's TIME is over: it is stopping its workers, summary next
    _pending: str = ""
    _peeked: str | None = None
    _err_pending: str = ""

    def gpu(self, i: int) -> GpuState:
        if i not in self.gpus:
            self.gpus[i] = GpuState(i)
        return self.gpus[i]

    def feed(self, text: str) -> list[int]:
        """Take a chunk of stdout; returns the GPUs whose progress changed."""
        data = self._pending + text
        parts = re.split(r"[\r\n]", data)
        self._pending = parts.pop()
        changed: list[int] = []
        for part in parts:
            if part.rstrip() == self._peeked:  # already taken from the unfinished line
                self._peeked = None
                continue
            changed.extend(self.line(part))
        # gpu-burn ends a progress line only when it starts the next one ("\r" first): take a
        # complete-looking unfinished line now instead of one update late.
        m = PROGRESS_RE.match(self._pending)
        pending = self._pending.rstrip()
        if m and pending != self._peeked and re.search(r"(C|--)$", pending):
            temps = TEMPS_RE.findall(m.group("temps") or "")
            if len(temps) == len(PROCD_RE.findall(m.group("procd"))):
                self._peeked = pending
                changed.extend(self._progress(m))
        return sorted(set(changed))

    def finish(self) -> list[int]:
        """The stream ended: parse what is left."""
        rest, self._pending = self._pending, ""
        if not rest.strip() or rest.rstrip() == self._peeked:
            return []
        return self.line(rest)

    def line(self, text: str) -> list[int]:
        m = PROGRESS_RE.match(text)
        if m:
            return self._progress(m)
        if "Summary at:" in text:
            for g in self.gpus.values():
                g.errors_before += g.errors_now
                g.errors_now = 0
            return []
        m = TESTED_RE.match(text)
        if m:
            self.tested = int(m.group(1))
            return []
        m = FINAL_RE.match(text)
        if m and self.tested is not None:
            self.gpu(int(m.group(1))).final = m.group(2)
            return []
        m = SMI_RE.match(text)
        if m and self.tested is None and int(m.group(1)) == len(self.smi_uuids):
            self.smi_uuids.append(m.group(3))
            return []
        m = INIT_RE.match(text)
        if m:
            self.initialized += 1
            # "device D" is the CUDA index: the worker's, or N with -i N (listed as GPU 0)
            worker = 0 if self.pinned is not None else int(m.group(1))
            kind = "fp64" if m.group(3) == "DOUBLES" else "tf32" if m.group(4) else "fp32"
            self.gpu(worker).dtype = kind
        if ENDING_RE.match(text):
            self.ending = True
        return []

    def stderr(self, text: str) -> None:
        """Take a chunk of stderr. gpu-burn's ``read[i] error N`` has no newline and repeats
        while a dead worker's pipe stays readable: it is cut out, and what waits for a newline
        is bounded."""
        data = self._err_pending + text
        for m in READ_ERROR_RE.finditer(data):
            self.gpu(int(m.group(1))).died = True
        data = READ_ERROR_RE.sub("", data)
        *lines, rest = data.split("\n")
        self._err_pending = rest[-STDERR_PENDING_MAX:]
        for ln in lines:
            self.stderr_line(ln)

    def stderr_finish(self) -> None:
        rest, self._err_pending = self._err_pending, ""
        self.stderr_line(rest)

    def label(self, i: int) -> int | str:
        """Worker ``i``'s GPU as CUDA_VISIBLE_DEVICES names it (its index when all are seen)."""
        return self.devices[i] if self.devices is not None and i < len(self.devices) else i

    def stderr_line(self, text: str) -> None:
        text = text.strip()
        if not text:
            return
        self.tail = [*self.tail[-19:], text[:500]]
        if "No clients are alive" in text:
            self.all_died = True
        if text.startswith(CUDA_ERROR_PREFIXES) or "No clients are alive" in text:
            self.failures.append(text[:500])
        if text.startswith(CUDA_ERROR_PREFIXES) and text not in self.cuda_errors:
            self.cuda_errors.append(text[:500])

    def temp_slot(self, i: int, workers: int) -> int | None:
        """The entry of gpu-burn's ``temps:`` column that is worker ``i``'s GPU, or None.

        gpu-burn reads ``nvidia-smi -q -d TEMPERATURE``, which lists every GPU of the node in
        nvidia-smi's order (the ``-L`` list it prints at start), into its workers' slots round
        robin: entry j is nvidia-smi's GPU j only when it burns as many GPUs as the node has;
        burning fewer, a slot cycles through several GPUs and belongs to none. Worker i's GPU
        is the i-th of CUDA_VISIBLE_DEVICES (an index in PCI order, or a UUID)."""
        smi = self.smi_uuids
        if not smi or len(smi) != workers:
            return None
        if self.devices is None:
            return i
        if i >= len(self.devices):
            return None
        entry = self.devices[i].strip()
        if entry.isdigit():
            return int(entry) if int(entry) < len(smi) else None
        found = [k for k, uuid in enumerate(smi) if entry and uuid.startswith(entry)]
        return found[0] if len(found) == 1 else None

    def _progress(self, m: re.Match[str]) -> list[int]:
        self.percent = float(m.group("pct"))
        procd = PROCD_RE.findall(m.group("procd"))
        errors = ERRORS_RE.findall(m.group("errors"))
        temps = TEMPS_RE.findall(m.group("temps") or "")
        changed = []
        for i, (n, g) in enumerate(procd):
            st = self.gpu(i)
            if int(n) < 0:
                st.died = True  # its count stays what it was; its rate is its last one
            else:
                st.iterations = max(st.iterations, int(n))
                st.gflops = float(g)
                st.gflops_sum += float(g)
                st.samples += 1
            if i < len(errors):
                if errors[i][1] == "(DIED!)" or int(errors[i][0]) < 0:
                    st.died = True  # its counter is no count any more: keep the last one
                elif not st.died:
                    st.errors_now = int(errors[i][0])
            slot = self.temp_slot(i, len(procd))
            if slot is not None and slot < len(temps):
                st.temp = int(temps[slot][0]) if temps[slot][0] else None
            else:
                st.temp = None
            changed.append(i)
        return changed

    def verdicts(
        self, stopped: bool, returncode: int | None, stderr_tail: str = ""
    ) -> list[dict[str, Any]]:
        """One ``{gpu, verdict, reason, errors}`` per worker (see the module docstring)."""
        out = []
        gpus = dict(self.gpus)
        if not gpus:
            gpus[0] = GpuState(0)
        why_exit = EXIT_REASONS.get(returncode or 0, f"exit code {returncode}")
        tail = f": {stderr_tail}" if stderr_tail else ""
        # A worker's CUDA error does not name its GPU: with one dead worker it is that one's.
        cuda = "; ".join(self.cuda_errors[:2]) or stderr_tail
        for i, st in sorted(gpus.items()):
            verdict: str | None
            if st.died or (self.all_died and st.final is None):
                verdict, reason = "DIED", "worker died" + (f": {cuda}" if cuda else "")
                if st.errors:
                    reason += f" (after {st.errors} errors)"
                if st.final == "OK":
                    reason += " (gpu-burn still listed it as OK)"
            elif self.tested is not None and st.final is not None:
                if st.final == "FAULTY" or st.errors:
                    verdict, reason = "FAULTY", f"{st.errors} errors (gpu-burn says {st.final})"
                else:
                    verdict, reason = "OK", None
            elif stopped:
                verdict = "FAULTY" if st.errors else None
                reason = "stopped before gpu-burn's final summary"
            else:
                verdict = "DIED"
                reason = f"gpu-burn ended without its final summary ({why_exit}){tail}"
            out.append({"gpu": i, "verdict": verdict, "reason": reason, "errors": st.errors})
        return out


# -- running --------------------------------------------------------------------------------
def gpu_burn_argv(
    binary: str,
    seconds: float,
    mem_fraction: float,
    dtype: str | None,
    stts: int = GPU_BURN_STTS_S,
) -> list[str]:
    """The command line; TIME is last (``gpu_burn 60 -d`` would run for 0 s). ``-tc`` (tensor
    core SGEMM) only for tf32: gpu-burn has only floats and doubles (see ``burn_dtype``)."""
    argv = [binary, "-m", f"{round(mem_fraction * 100)}%"]
    used = burn_dtype(dtype)
    if used == "fp64":
        argv.append("-d")
    elif used == "tf32":
        argv.append("-tc")
    argv += ["-stts", str(stts), str(burn_seconds(seconds))]
    return argv


def burn_dtype(requested: str | None) -> str:
    """What gpu-burn computes for a requested dtype: fp64 (``-d``), tf32 (``-tc``), else fp32
    (bf16 and fp16 too: gpu-burn has no half-precision GEMM)."""
    return requested if requested in ("fp64", "tf32") else "fp32"


def worker_devices(visible: str | None, pinned: int | None = None) -> list[str] | None:
    """The physical GPU of each gpu-burn worker from CUDA_VISIBLE_DEVICES: worker i burns the
    i-th visible device; with ``-i N`` the one worker burns the N-th. None: every GPU."""
    if visible is None:
        return None if pinned is None else [str(pinned)]
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if pinned is not None:
        return entries[pinned : pinned + 1]
    return entries


def burn_seconds(seconds: float) -> int:
    """gpu-burn's TIME for a duration (whole seconds, at least 1)."""
    return max(1, round(seconds))


def run_gpu_burn(
    binary: str,
    seconds: float,
    emit: Callable[[dict[str, Any]], None],
    *,
    mem_fraction: float = 0.9,
    dtype: str | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    grace: float = 3.0,
    gpu_label: str | None = None,
    stts: int = GPU_BURN_STTS_S,
) -> list[dict[str, Any]]:
    """Run gpu-burn, emit progress lines, return one summary dict per GPU.

    A stop (``should_stop()``) before gpu-burn's end SIGTERMs its group (no summary possible);
    during its end it waits up to ``stts + grace`` seconds for the summary, then SIGKILLs."""
    folder = os.path.dirname(os.path.abspath(binary))
    if not any(os.path.exists(os.path.join(folder, c)) for c in COMPARE_FILES):
        raise BuildError(
            f"no compare.fatbin or compare.ptx next to {binary}: keep gpu-burn's build folder "
            "together or rebuild it"
        )
    argv = gpu_burn_argv(binary, seconds, mem_fraction, dtype, stts)
    run_time = burn_seconds(seconds)
    if dtype is not None and burn_dtype(dtype) != dtype:
        emit(
            {
                "type": "step",
                "message": f"gpu-burn has no {dtype} GEMM: it burns {burn_dtype(dtype)} "
                "(the torch engine burns bf16 and fp16)",
            }
        )
    emit({"type": "step", "message": "running " + " ".join(argv)})
    # CUDA's device i is then nvidia-smi's GPU i (for the temperatures, see temp_slot)
    env = dict(os.environ, CUDA_DEVICE_ORDER="PCI_BUS_ID")
    # its own session, SIGKILL when we die; cwd: gpu-burn loads its compare kernel from there
    proc = spawn(argv, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    parsed = GpuBurnOutput(devices=worker_devices(env.get("CUDA_VISIBLE_DEVICES")))
    parsed.dtype = burn_dtype(dtype)
    last_emit: dict[int, float] = {}
    sel = selectors.DefaultSelector()
    assert proc.stdout is not None and proc.stderr is not None
    sel.register(proc.stdout, selectors.EVENT_READ, "out")
    sel.register(proc.stderr, selectors.EVENT_READ, "err")
    stopped = False
    term_at: float | None = None
    killed = False
    open_streams = 2
    while open_streams:
        for key, _ in sel.select(0.2):
            data = os.read(key.fileobj.fileno(), 1 << 16)  # type: ignore[union-attr]
            if not data:
                sel.unregister(key.fileobj)
                open_streams -= 1
                continue
            text = data.decode("utf-8", "replace")
            if key.data == "err":
                parsed.stderr(text)
                continue
            now = time.monotonic()
            was_ending = parsed.ending
            for i in parsed.feed(text):
                if now - last_emit.get(i, 0.0) >= 1.0:
                    last_emit[i] = now
                    emit(_progress(parsed.gpus[i], parsed, run_time, gpu_label))
            if parsed.ending and not was_ending:
                emit(
                    {
                        "type": "step",
                        "message": f"gpu-burn's time is up: it stops its workers, its summary "
                        f"follows in {stts} s",
                    }
                )
        now = time.monotonic()
        if proc.poll() is not None and not killed:
            # gpu-burn's parent is gone; workers it left behind would hold the pipes open.
            killed = True
            signal_group(proc.pid, signal.SIGKILL)
        if not stopped and should_stop():
            stopped = True
            term_at = now
            if parsed.ending:
                term_at += stts  # let it finish: its summary is seconds away
            else:
                signal_group(proc.pid, signal.SIGTERM)
        if term_at is not None and not killed and now - term_at >= grace:
            killed = True
            signal_group(proc.pid, signal.SIGKILL)
    parsed.finish()
    parsed.stderr_finish()
    code = proc.wait()
    signal_group(proc.pid, signal.SIGKILL)  # workers a dead parent left behind
    summaries = []
    tail = parsed.failures[-1] if parsed.failures else (parsed.tail[-1] if parsed.tail else "")
    for v in parsed.verdicts(stopped, code, tail):
        st = parsed.gpus.get(v["gpu"]) or GpuState(v["gpu"])
        summaries.append(
            {
                **_progress(st, parsed, run_time, gpu_label),
                "type": "summary",
                "verdict": v["verdict"],
                "reason": v["reason"],
                "exit_code": code,
            }
        )
    return summaries


def _progress(
    st: GpuState, parsed: GpuBurnOutput, run_time: int, label: str | None
) -> dict[str, Any]:
    mean = st.gflops_sum / st.samples if st.samples else 0.0
    elapsed = parsed.percent / 100.0 * run_time  # gpu-burn's clock: it counts from its start
    return {
        "type": "progress",
        "engine": "gpu-burn",
        "gpu": label if label is not None else parsed.label(st.index),
        "dtype": st.dtype or parsed.dtype,
        "iterations": st.iterations,
        "tflops": round(st.gflops / 1000, 4),
        "tflops_mean": round(mean / 1000, 4),
        "gflops_mean": round(mean, 2),
        "errors": st.errors,
        "temp": st.temp,
        "percent": parsed.percent,
        "elapsed": round(elapsed, 3),
    }


# -- command line ---------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpuctl.workloads.gpuburn")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="find or build gpu-burn, run it, JSON lines on stdout")
    run.add_argument("--binary", help="gpu_burn binary (or its folder); default: PATH")
    run.add_argument("--source", help="gpu-burn source folder to build from when none is found")
    run.add_argument(
        "--build-dir",
        help="where builds from --source are kept (default ~/.cache/gpuctl/gpu-burn)",
    )
    run.add_argument("--gpu", metavar="ID", help="pin to this GPU via CUDA_VISIBLE_DEVICES")
    run.add_argument("--duration", type=float, default=60.0, help="seconds (default 60)")
    run.add_argument("--mem-fraction", type=float, default=0.9)
    run.add_argument("--dtype", choices=("fp32", "tf32", "bf16", "fp16", "fp64"))
    run.add_argument(
        "--stts",
        type=int,
        default=GPU_BURN_STTS_S,
        help=f"gpu-burn's SIGTERM-to-SIGKILL wait at its end, s (default {GPU_BURN_STTS_S})",
    )
    sub.add_parser("find", help="print the gpu_burn binary and CUDA toolkit discovery finds")
    args = p.parse_args(argv)

    stopping: list[int] = []

    def emit(msg: dict[str, Any]) -> None:
        try:
            sys.stdout.write(json.dumps(msg, separators=(",", ":")) + "\n")
            sys.stdout.flush()
        except (BrokenPipeError, ValueError):
            stopping.append(-1)  # nobody reads us (the agent died): stop gpu-burn, not orphan it

    if args.command == "find":
        toolkit, looked = find_toolkit()
        emit(
            {
                "type": "find",
                "gpu_burn": find_gpu_burn(),
                "toolkit": toolkit.root if toolkit else None,
                "nvcc": toolkit.nvcc if toolkit else None,
                "how": toolkit.how if toolkit else None,
                "looked": looked,
            }
        )
        return 0
    if args.duration <= 0 or not 0.05 <= args.mem_fraction <= 0.99:
        p.error("--duration must be positive and --mem-fraction within 0.05..0.99")
    if not 0 <= args.stts <= 600:
        p.error("--stts must be within 0..600 seconds")
    if args.gpu is not None:
        os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        os.environ["CUDA_VISIBLE_DEVICES"] = str(args.gpu)
    parent = os.getppid()  # before anything: the agent's death signal still covers us here
    signal.signal(signal.SIGTERM, lambda s, f: stopping.append(s))
    signal.signal(signal.SIGINT, lambda s, f: stopping.append(s))
    try:
        # Our parent (the agent) gone: SIGTERM instead of the agent's SIGKILL, so that the
        # handler stops gpu-burn's group; already gone: stop now.
        set_death_signal(signal.SIGTERM, parent)
        binary = find_gpu_burn(args.binary)
        if binary is None and args.binary:
            raise BuildError(f"{args.binary} is not an executable gpu_burn")
        if binary is None:
            if not args.source:
                raise BuildError(
                    "no gpu_burn on PATH; name a gpu-burn source folder to build it from"
                )
            binary = build_gpu_burn(
                args.source,
                lambda m: emit({"type": "step", "message": m}),
                build_root=args.build_dir,
            )
        else:
            emit({"type": "step", "message": f"using {binary}"})
        summaries = run_gpu_burn(
            binary,
            args.duration,
            emit,
            mem_fraction=args.mem_fraction,
            dtype=args.dtype,
            should_stop=lambda: bool(stopping),
            gpu_label=args.gpu,
            stts=args.stts,
        )
    except BuildError as e:
        emit({"type": "summary", "engine": "gpu-burn", "verdict": "DIED", "reason": str(e)})
        return 3
    for s in summaries:
        emit(s)
    verdicts = {s["verdict"] for s in summaries}
    return 3 if "DIED" in verdicts else 1 if "FAULTY" in verdicts else 0


if __name__ == "__main__":
    sys.exit(main())
