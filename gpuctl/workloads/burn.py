"""The torch GPU burner: back-to-back GEMMs whose results are checked, one process per GPU.

``python -m gpuctl.workloads.burn [--device cpu|cuda] [--gpu ID] [--dtype D] [--duration S]``

How it works
    A round is a chain of K products, each one the next one's input: ``X1 = A @ Q``,
    ``X2 = X1 @ Q``, ..., ``XK = X(K-1) @ Q`` into the round's result slot, every product
    written with ``matmul(out=)`` (beta=0, as a bare GEMM loop writes; the burner that
    accumulated products with ``addmm_`` ran at 0.93x of one on an H100), so every product lands
    in the checked value: a product's element feeds a whole row of the next, and a 1 % error in
    it flips the rounding of many of them. ``Q`` is a random orthogonal matrix (the Kronecker
    product of two small ones, so it costs nothing to make), dense like random data, so a chain
    neither grows nor shrinks; K is chosen so that a round lasts ~0.25 s (0.5 s on the CPU), at
    most ``MAX_CHAIN``. Each round's slot is compared with the first round's, computed once as
    the reference: the same GEMMs on the same inputs on the same device give the same bits, so
    the comparison is of bits (both viewed as integers of the element's width, ``ne`` counted on
    the device), not a tolerance: a tolerance wide enough for bf16's rounding (3 %) lets a 1 %
    error through, and any tolerance relative to the values misses a large error in a small
    element. Differing elements are errors; a NaN or Inf differs from a finite reference, and a
    non-finite reference is counted once. Result slots rotate through the memory the burner
    holds, so that memory is written and read too; two slots are allocated before the first GEMM
    and the rest while the burn goes (``SLOTS_PER_ROUND`` a round), so a GPU burns within
    seconds of the start instead of after allocating tens of GiB. ``--inject-error ROUND``
    (tests only) corrupts one element of that round's result to prove the check; with
    ``--inject-relative R`` the corruption is a relative change of R (0.01: 1 %) to the element
    of smallest magnitude.

    On CUDA nothing waits inside a round: the host queues the next round before it waits (on an
    event) for the previous one, error counts travel back by a non-blocking copy, and GEMM time
    and the time span are measured with device events. On the CPU, where everything is
    synchronous, the host clock measures the same things. ``duty`` is GEMM time over the span
    from the first round's start to the last round's end.

Output (stdout, one JSON object per line)
    ``{"type":"info", "message"}`` start-up facts (sizes, out-of-memory fallbacks); the one
    after the first GEMM also has ``startup`` (seconds since the start for ``torch``,
    ``device``, ``buffers`` and ``first_gemm``);
    ``{"type":"progress", ...}`` about once per second: iterations, tflops (since the previous
    line), tflops_mean, errors, elapsed, size, slots, dtype, duty (the figures count from the
    second round: the first makes the reference);
    ``{"type":"summary", ...}`` last: the same totals plus nonfinite, verdict (OK / FAULTY /
    DIED) and reason (a FAULTY one names the device and how many elements differed). Exit
    code: 0 OK, 1 FAULTY, 3 DIED, 2 bad usage.

SIGTERM or SIGINT ends the burn after the current round with a summary.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import sys
import time
from typing import Any

DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp64")
ELEMENT_BYTES = {"fp64": 8, "fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2}
DEFAULT_SIZE = {"cpu": 2048, "cuda": 8192}
ROUND_SECONDS = {"cpu": 0.5, "cuda": 0.25}
MIN_SIZE = 32
MAX_SLOTS = 4096
MAX_CHAIN = 256  # products per round at most: bf16's rounding of Q drifts a chain's size slowly
FIRST_SLOTS = 2  # result slots allocated before the first GEMM ...
SLOTS_PER_ROUND = 16  # ... and at most this many more after each round is queued
STARTED = time.monotonic()  # the burner's start, for the start-up figures
PIPELINE_DEPTH = 2  # CUDA rounds in flight: the GPU always has the next round queued
EXIT_OK, EXIT_FAULTY, EXIT_USAGE, EXIT_DIED = 0, 1, 2, 3


class OutOfMemory(Exception):
    """An allocation did not fit (a real one, or past ``--mem-budget``)."""


def parse_bytes(text: str) -> int:
    """``"512M"``, ``"2G"``, ``"1048576"`` -> bytes. Raises ValueError."""
    text = text.strip().upper().rstrip("B").rstrip("I")
    scale = 1
    if text and text[-1] in "KMGT":
        scale = 1024 ** ("KMGT".index(text[-1]) + 1)
        text = text[:-1]
    value = float(text)
    if value <= 0:
        raise ValueError("must be positive")
    return int(value * scale)


def buffer_bytes(size: int, slots: int, dtype: str) -> int:
    """Bytes held for a size and slot count: A, Q, the chain's scratch T, the reference R, the
    slots, a bool mask."""
    n2 = size * size
    return n2 * (ELEMENT_BYTES[dtype] * (4 + slots) + 1)


def orthogonal(torch: Any, size: int, seed: int, device: Any) -> Any:
    """A random ``size`` x ``size`` orthogonal matrix (float32, on ``device``): the Kronecker
    product of two random orthogonal factors whose sizes multiply to ``size`` (QR of small
    Gaussian matrices, so it takes milliseconds where a QR of the whole would take seconds).
    Dense: every entry is a product of two nonzero Gaussian-like numbers."""
    small = max(d for d in range(1, int(size**0.5) + 1) if size % d == 0)
    gen = torch.Generator().manual_seed(seed)
    factors = []
    for n in (small, size // small):
        q, r = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))
        factors.append((q * torch.sign(torch.diagonal(r))).float().to(device))  # Haar: signs
    return torch.kron(factors[0], factors[1])


def plan(size_cap: int, budget: int | None, dtype: str, slots: int | None) -> tuple[int, int]:
    """Pick ``(size, slots)``: the largest size up to ``size_cap`` that fits ``budget`` with one
    slot, then as many slots as fit (``slots`` fixes the count). Raises OutOfMemory."""
    size = size_cap
    if budget is not None:
        while size >= MIN_SIZE and buffer_bytes(size, slots or 1, dtype) > budget:
            size = shrink(size)
        if size < MIN_SIZE:
            raise OutOfMemory(f"{budget} bytes hold no {MIN_SIZE}x{MIN_SIZE} {dtype} buffers")
    if slots is None:
        if budget is None:
            slots = 2
        else:
            per_slot = size * size * ELEMENT_BYTES[dtype]
            slots = (budget - buffer_bytes(size, 0, dtype)) // per_slot
            slots = max(1, min(MAX_SLOTS, int(slots)))
    return size, slots


def shrink(size: int) -> int:
    """The next smaller size to try: 3/4, rounded down to a multiple of 32."""
    return (size * 3 // 4) // 32 * 32


def _memcmp() -> Any:
    try:
        import ctypes

        fn = ctypes.CDLL(None).memcmp
        fn.restype = ctypes.c_int
        fn.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
        return fn
    except (OSError, AttributeError):
        return None


_MEMCMP = _memcmp()


def bitwise_equal(x: Any, y: Any) -> bool:
    """Whether two contiguous CPU tensors hold the same bytes: memcmp runs at memory speed,
    about 6x faster than ``torch.equal`` (which matters for the CPU duty cycle)."""
    nbytes = x.numel() * x.element_size()
    if _MEMCMP is None or not (x.is_contiguous() and y.is_contiguous()):
        return bool(x.equal(y))
    return bool(_MEMCMP(x.data_ptr(), y.data_ptr(), nbytes) == 0)


class Clock:
    """Host-clock timing (CPU): marks are perf_counter values, always complete."""

    def mark(self) -> Any:
        return time.perf_counter()

    def seconds(self, a: Any, b: Any) -> float:
        return float(b - a)

    def ready(self, mark: Any) -> bool:
        return True

    def wait(self, mark: Any) -> None:
        pass


class CudaClock(Clock):
    """Device-event timing (CUDA): a mark is an event recorded on the current stream."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch

    def mark(self) -> Any:
        ev = self.torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def seconds(self, a: Any, b: Any) -> float:
        return float(a.elapsed_time(b)) / 1000.0

    def ready(self, mark: Any) -> bool:
        return bool(mark.query())

    def wait(self, mark: Any) -> None:
        mark.synchronize()


Round = collections.namedtuple("Round", "index start end done errors_at gemms")


class Burner:
    """Buffers, the GEMM rounds, the check and the running totals of one device."""

    def __init__(self, torch: Any, args: argparse.Namespace, emit: Any) -> None:
        self.torch = torch
        self.args = args
        self.emit = emit
        self.device = torch.device("cuda:0" if args.device == "cuda" else "cpu")
        self.cuda = args.device == "cuda"
        # Errors counted on the device and read back late (CUDA); tests switch it on for the CPU.
        self.deferred = self.cuda
        self.dtype_name = args.dtype
        self.tdtype = {
            "fp64": torch.float64,
            "fp32": torch.float32,
            "tf32": torch.float32,
            "bf16": torch.bfloat16,
            "fp16": torch.float16,
        }[args.dtype]
        self.clock: Clock = CudaClock(torch) if self.cuda else Clock()
        self.name = torch.cuda.get_device_name(0) if self.cuda else "cpu"
        self.oom_fallbacks = 0
        self.size = 0
        self.slots: list[Any] = []
        self.slots_planned = 0
        self.used = 0  # bytes allocated (for --mem-budget)
        self.startup: dict[str, float] = {}
        self.iterations = 0
        self.errors = 0
        self.nonfinite = 0
        self.gemm_seconds = 0.0
        self.span_seconds = 0.0
        self.first_start: Any = None

    # -- memory -------------------------------------------------------------------------
    def _budget(self) -> int | None:
        budget = self.args.mem_budget
        if self.cuda:
            free, _total = self.torch.cuda.mem_get_info()
            usable = int(free * self.args.mem_fraction)
            budget = usable if budget is None else min(budget, usable)
        return None if budget is None else int(budget)

    def allocate(self) -> None:
        """Allocate every buffer, stepping down in size on out-of-memory."""
        cap = self.args.size or DEFAULT_SIZE[self.args.device]
        if self.cuda:
            size, slots = plan(cap, self._budget(), self.dtype_name, self.args.slots)
        else:
            # On the CPU, --mem-budget limits allocation but does not size: that is how a
            # test drives the out-of-memory fallback for real.
            size, slots = cap, self.args.slots or 2
        while True:
            try:
                self._allocate(size, min(slots, FIRST_SLOTS))
                break
            except OutOfMemory as e:
                self._free()
                new_size, new_slots = shrink(size), max(1, slots // 2)
                if new_size < MIN_SIZE:
                    raise OutOfMemory(f"out of memory even at {size}x{size}: {e}") from None
                self.oom_fallbacks += 1
                self.emit(
                    {
                        "type": "info",
                        "message": f"out of memory at {size}x{size} with {slots} slots; "
                        f"retrying at {new_size}x{new_size} with {new_slots}",
                    }
                )
                size, slots = new_size, new_slots
        self.size = size
        self.slots_planned = slots
        self.startup["buffers"] = time.monotonic() - STARTED
        self.emit(
            {
                "type": "info",
                "message": f"{self.name}: {size}x{size} {self.dtype_name}, {slots} result slots "
                f"({len(self.slots)} before the first GEMM, the rest as it burns), "
                f"{buffer_bytes(size, slots, self.dtype_name) >> 20} MiB",
            }
        )

    def _empty(self, dtype: Any, elem: int) -> Any:
        """One size x size buffer; raises OutOfMemory (a real one, or past --mem-budget)."""
        torch = self.torch
        limit = self.args.mem_budget if not self.cuda else None
        nbytes = self.size * self.size * elem
        if limit is not None and self.used + nbytes > limit:
            raise OutOfMemory(f"{self.used + nbytes} bytes exceed the budget of {limit}")
        try:
            out = torch.empty((self.size, self.size), dtype=dtype, device=self.device)
        except (torch.OutOfMemoryError, MemoryError) as e:
            raise OutOfMemory(str(e).splitlines()[0] if str(e) else "no memory") from None
        except RuntimeError as e:  # older builds say "out of memory" in a RuntimeError
            if "out of memory" in str(e):
                raise OutOfMemory(str(e).splitlines()[0]) from None
            raise
        self.used += nbytes
        return out

    def _allocate(self, size: int, slots: int) -> None:
        torch = self.torch
        self.size, self.used = size, 0
        elem = ELEMENT_BYTES[self.dtype_name]
        gen = torch.Generator(device=self.device)
        gen.manual_seed(1234 + size)
        self.a = self._empty(self.tdtype, elem)
        self.q = self._empty(self.tdtype, elem)
        self.t = self._empty(self.tdtype, elem)
        # A uniform with variance 1 (each element of every product of the chain is then about
        # N(0, 1): far from fp16's range limit); Q orthogonal, so X @ Q keeps that.
        self.a.uniform_(-1.0, 1.0, generator=gen).mul_(3.0**0.5)
        self.q.copy_(orthogonal(torch, size, 1234 + size, self.device))
        self.ref = self._empty(self.tdtype, elem)
        self.mask = self._empty(torch.bool, 1)
        self.slots = [self._empty(self.tdtype, elem) for _ in range(slots)]
        self.err_dev = torch.zeros((), dtype=torch.int64, device=self.device)
        ring = PIPELINE_DEPTH + 2
        self.err_host = torch.zeros(ring, dtype=torch.int64, pin_memory=self.cuda)

    def grow(self) -> None:
        """Allocate up to SLOTS_PER_ROUND more result slots, until the planned count; an
        allocation that does not fit ends the growing (the slots held so far rotate)."""
        for _ in range(min(SLOTS_PER_ROUND, self.slots_planned - len(self.slots))):
            try:
                self.slots.append(self._empty(self.tdtype, ELEMENT_BYTES[self.dtype_name]))
            except OutOfMemory as e:
                self.emit(
                    {
                        "type": "info",
                        "message": f"{len(self.slots)} of {self.slots_planned} result slots: "
                        f"no memory for more ({e})",
                    }
                )
                self.slots_planned = len(self.slots)
                return

    def _free(self) -> None:
        for name in ("a", "q", "t", "ref", "mask", "err_dev", "err_host"):
            if hasattr(self, name):
                delattr(self, name)
        self.slots = []
        if self.cuda:
            self.torch.cuda.empty_cache()

    # -- compute ------------------------------------------------------------------------
    def gemms(self, out: Any, k: int, give_up: Any = None, tamper: Any = None) -> int:
        """The chain of K products, the last one into ``out`` (the others alternate between
        ``out`` and the scratch T so that it ends there); returns how many ran (fewer when
        ``give_up()`` says so). ``tamper(i, product)`` (tests) sees each product as it is made."""
        mm, q = self.torch.matmul, self.q
        src, dst, other = self.a, (out if k % 2 else self.t), (self.t if k % 2 else out)
        if give_up is None and tamper is None:
            for _ in range(k):
                mm(src, q, out=dst)
                src, dst, other = dst, other, dst
            return k
        for i in range(k):
            if i and give_up is not None and give_up():
                return i
            mm(src, q, out=dst)
            if tamper is not None:
                tamper(i, dst)
            src, dst, other = dst, other, dst
        return k

    def calibrate(self) -> int:
        """Time one GEMM (after a warm-up) and return K, the GEMMs per round."""
        out = self.slots[0]
        self.gemms(out, 1)  # warm-up: library handles, kernel choice
        done = self.clock.mark()
        self.clock.wait(done)
        self.startup["first_gemm"] = time.monotonic() - STARTED
        self.emit(
            {
                "type": "info",
                "message": f"first GEMM done {self.startup['first_gemm']:.2f} s after the start",
                "startup": {k: round(v, 3) for k, v in self.startup.items()},
            }
        )
        if self.args.gemms_per_round:
            return int(self.args.gemms_per_round)
        n = 1
        while True:  # time batches (doubling) until one lasts long enough to trust
            start = self.clock.mark()
            self.gemms(out, n)
            end = self.clock.mark()
            self.clock.wait(end)
            took = self.clock.seconds(start, end)
            if took >= 0.05 or n >= 1 << 16:
                break
            n *= 2
        one = max(1e-7, took / n)
        return max(1, min(MAX_CHAIN, round(ROUND_SECONDS[self.args.device] / one)))

    def set_reference(self, slot: Any, k: int) -> None:
        torch = self.torch
        self.ref.copy_(slot)
        # The comparison's integer views (same storage): bits, not values, are compared.
        itype = {8: torch.int64, 4: torch.int32, 2: torch.int16}[self.ref.element_size()]
        self.ref_bits = self.ref.view(itype)
        self.bits_type = itype
        finite = int(torch.isfinite(self.ref).sum())  # once, at start: a sync is fine here
        bad = self.ref.numel() - finite
        if bad:
            self.nonfinite += bad
            self.errors += bad
        del k

    def check(self, slot: Any) -> int | None:
        """Count the elements of ``slot`` whose bits differ from the reference's.

        CPU: returns the count (memcmp first; the element count only on a difference). CUDA:
        adds it to the device counter and returns None (no sync)."""
        torch = self.torch
        if not self.deferred and bitwise_equal(slot, self.ref):
            return 0
        torch.ne(slot.view(self.bits_type), self.ref_bits, out=self.mask)
        bad = torch.count_nonzero(self.mask)
        if not self.deferred:
            n = int(bad)
            if n:
                self.nonfinite += slot.numel() - int(torch.isfinite(slot).sum())
            return n
        self.err_dev.add_(bad)
        return None

    def inject(self, slot: Any) -> None:
        """Corrupt one element of a result (``--inject-error``): proves the check works. With
        ``--inject-relative R``: the element of smallest magnitude changed by R relative."""
        flat = slot.view(-1)
        relative = getattr(self.args, "inject_relative", None)
        if relative is None:
            i = flat.numel() // 2 + 1
            flat[i] = flat[i] * 2 + 1000
            return
        magnitude = flat.abs().float()
        magnitude[magnitude == 0] = float("inf")
        i = int(magnitude.argmin())
        flat[i] = (flat[i].double() * (1.0 + relative)).to(flat.dtype)

    # -- the loop -----------------------------------------------------------------------
    def run(self, should_stop: Any, duration: float | None) -> None:
        """Burn until ``should_stop()`` or ``duration`` seconds after calibration."""
        torch = self.torch
        k = self.calibrate()
        deadline = None if duration is None else time.monotonic() + duration
        flops_per_gemm = 2.0 * self.size**3
        pending: collections.deque[Round] = collections.deque()
        ring = len(self.err_host)
        last_print = time.monotonic()
        last_end: Any = None
        window_flops = 0.0
        window_start: Any = None
        r = 0
        injected = False
        while True:
            slot = self.slots[r % len(self.slots)]
            start = self.clock.mark()
            give_up = None
            if not self.cuda:
                # On a crowded CPU a round can take far longer than planned: a stop request
                # (or, after the reference round, 4x the planned time) cuts it short. A cut
                # round is counted but not checked (its sum is not the reference's).
                cut_at = time.monotonic() + 4 * ROUND_SECONDS["cpu"]
                give_up = (
                    should_stop if r == 0 else (lambda: should_stop() or time.monotonic() > cut_at)  # noqa: B023
                )
            done_k = self.gemms(slot, k, give_up)
            end = self.clock.mark()
            if done_k < k and r == 0:
                break  # stopped before a reference existed: nothing to report
            if r == 1:
                # Round 0 makes the reference (a one-time copy and scans): the figures start
                # with round 1, so start-up does not count against the rate or the duty.
                self.first_start = start
            if r == 0:
                self.set_reference(slot, k)
                host_errors = 0
            else:
                wanted = self.args.inject_error
                if wanted is not None and not injected and r >= wanted and done_k == k:
                    injected = True
                    self.inject(slot)
                n = self.check(slot) if done_k == k else 0
                host_errors = n if n is not None else 0
            errors_at = None
            if self.deferred:
                self.err_host[r % ring].copy_(self.err_dev, non_blocking=self.cuda)
                errors_at = r % ring
                done = self.clock.mark()
            else:
                done = end
                self.errors += host_errors
            pending.append(Round(r, start, end, done, errors_at, done_k))
            r += 1
            if len(self.slots) < self.slots_planned:
                self.grow()  # while the GPU works on the queued rounds
            # A duration shorter than two rounds still checks one product against the reference.
            late = deadline is not None and time.monotonic() >= deadline and r >= 2
            stop = should_stop() or late
            # Retire finished rounds; wait only when more than PIPELINE_DEPTH are queued.
            while pending and (
                stop or len(pending) > PIPELINE_DEPTH or self.clock.ready(pending[0].done)
            ):
                rd = pending.popleft()
                self.clock.wait(rd.done)
                if rd.errors_at is not None:
                    self.errors = int(self.err_host[rd.errors_at]) + self.nonfinite
                if rd.index == 0:
                    continue
                self.iterations += rd.gemms
                self.gemm_seconds += self.clock.seconds(rd.start, rd.end)
                self.span_seconds = self.clock.seconds(self.first_start, rd.end)
                window_flops += rd.gemms * flops_per_gemm
                if window_start is None:
                    window_start = rd.start
                last_end = rd.end
            now = time.monotonic()
            if last_end is not None and (now - last_print >= 1.0 or stop):
                window = self.clock.seconds(window_start, last_end)
                tflops = window_flops / window / 1e12 if window > 0 else 0.0
                self.emit(self.progress(tflops))
                last_print = now
                window_flops, window_start = 0.0, None
            if stop:
                break
        if self.deferred and self.errors:
            # Say how many mismatches were NaN/Inf: one scan per slot, after the fact.
            written = self.slots[: min(r, len(self.slots))]  # the others hold no result yet
            self.nonfinite += sum(s.numel() - int(torch.isfinite(s).sum()) for s in written)

    def where(self) -> str:
        """The device under test, for people: ``GPU <id> (<name>)`` or ``cpu``."""
        if not self.cuda:
            return "cpu"
        return f"GPU {self.args.gpu if self.args.gpu is not None else 0} ({self.name})"

    def totals(self) -> dict[str, Any]:
        flops = 2.0 * self.size**3 * self.iterations
        span = self.span_seconds
        mean = flops / span / 1e12 if span > 0 else 0.0
        return {
            "device": "cuda" if self.cuda else "cpu",
            "name": self.name,
            "gpu": self.args.gpu,
            "iterations": self.iterations,
            "tflops_mean": round(mean, 4),
            "gflops_mean": round(mean * 1000, 2),
            "errors": self.errors,
            "elapsed": round(span, 3),
            "size": self.size,
            "slots": len(self.slots),
            "dtype": self.dtype_name,
            "duty": round(self.gemm_seconds / span, 5) if span > 0 else 0.0,
        }

    def progress(self, tflops: float) -> dict[str, Any]:
        return {"type": "progress", **self.totals(), "tflops": round(tflops, 4)}


def default_dtype(torch: Any, device: str) -> str:
    """bf16 on GPUs that support it, fp16 on older GPUs, fp32 on the CPU."""
    if device == "cpu":
        return "fp32"
    return "bf16" if torch.cuda.is_bf16_supported() else "fp16"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m gpuctl.workloads.burn",
        description="Burn one device with checked back-to-back GEMMs; JSON lines on stdout.",
    )
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    p.add_argument(
        "--gpu", metavar="ID", help="pin to this GPU (index or UUID) via CUDA_VISIBLE_DEVICES"
    )
    p.add_argument("--dtype", choices=DTYPES, help="default: bf16 where supported, cpu fp32")
    p.add_argument("--duration", type=float, help="seconds to burn (default: until stopped)")
    p.add_argument(
        "--mem-fraction", type=float, default=0.9, help="share of free GPU memory to hold"
    )
    p.add_argument(
        "--mem-budget",
        metavar="BYTES",
        help="allocations past this fail as out-of-memory (e.g. 2G; tests the fallback)",
    )
    p.add_argument("--size", type=int, help="matrix size (default: cpu 2048, cuda 8192)")
    p.add_argument("--slots", type=int, help="result slots (default: cpu 2, cuda as memory fits)")
    p.add_argument("--gemms-per-round", type=int, help=argparse.SUPPRESS)
    p.add_argument(
        "--inject-error",
        type=int,
        nargs="?",
        const=1,
        metavar="ROUND",
        help="test only: corrupt one result of this round (default 1) to prove the check",
    )
    p.add_argument("--inject-relative", type=float, metavar="R", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.mem_budget is not None:
        try:
            args.mem_budget = parse_bytes(args.mem_budget)
        except ValueError:
            p.error(f"--mem-budget {args.mem_budget!r}: expected bytes like 512M or 2G")
    if not 0.05 <= args.mem_fraction <= 0.99:
        p.error("--mem-fraction must be within 0.05..0.99")
    if args.duration is not None and args.duration <= 0:
        p.error("--duration must be positive")
    if args.size is not None and args.size < MIN_SIZE:
        p.error(f"--size must be at least {MIN_SIZE}")
    if args.gpu is not None:
        # Before torch initialises CUDA: the burner then sees exactly this GPU as cuda:0.
        os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        os.environ["CUDA_VISIBLE_DEVICES"] = str(args.gpu)

    stopping = []

    def on_signal(signum: int, _frame: Any) -> None:
        stopping.append(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def emit(msg: dict[str, Any]) -> None:
        try:
            sys.stdout.write(json.dumps(msg, separators=(",", ":")) + "\n")
            sys.stdout.flush()
        except (BrokenPipeError, ValueError):
            stopping.append(-1)  # nobody reads us any more: stop

    burner: Burner | None = None
    verdict, reason = "OK", None
    try:
        import torch
    except ImportError as e:
        emit({"type": "summary", "verdict": "DIED", "reason": f"torch not importable: {e}"})
        return EXIT_DIED
    imported = time.monotonic() - STARTED
    try:
        if args.device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("no CUDA device visible to torch (use --device cpu to test)")
        if args.dtype is None:
            args.dtype = default_dtype(torch, args.device)
        if args.device == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = args.dtype == "tf32"
            # cuBLAS gives the same bits for the same GEMM on one stream; a fixed workspace
            # keeps it so whatever else runs (the check compares bits).
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        burner = Burner(torch, args, emit)
        burner.startup.update(torch=imported, device=time.monotonic() - STARTED)
        burner.allocate()
        burner.run(lambda: bool(stopping), args.duration)
        if burner.errors:
            verdict = "FAULTY"
            reason = (
                f"{burner.where()}: {burner.errors} element(s) of its results differ bit for bit "
                f"from the reference ({burner.size}x{burner.size} per round)"
            )
            if burner.nonfinite:
                reason += f" ({burner.nonfinite} NaN/Inf)"
    except OutOfMemory as e:
        verdict, reason = "DIED", str(e)
    except Exception as e:  # a CUDA error (Xid, ECC) ends the burn: say so, do not hide it
        verdict = "DIED"
        reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e) else ''}"
    summary: dict[str, Any] = {"type": "summary"}
    if burner is not None:
        summary.update(burner.totals())
        summary["nonfinite"] = burner.nonfinite
        summary["oom_fallbacks"] = burner.oom_fallbacks
    else:
        summary.update({"device": args.device, "gpu": args.gpu, "dtype": args.dtype})
    if stopping and stopping[0] > 0:
        summary["stopped_by"] = signal.Signals(stopping[0]).name
    summary.update({"verdict": verdict, "reason": reason})
    emit(summary)
    return {"OK": EXIT_OK, "FAULTY": EXIT_FAULTY}.get(verdict, EXIT_DIED)


if __name__ == "__main__":
    sys.exit(main())
