"""[MEMTEST]: device memory written with patterns and read back, word by word.

Over most of the free memory (``--memtest-mb`` sets the size; on a GPU the default is
``MEMTEST_FRACTION`` of what is free), as 64-bit words, like the memory tests of DCGM's diag
and cuda_memtest:

- walking ones: word i holds ``1 << ((i + b) % 64)``, for each starting bit b (every 8th b with
  ``--quick``), so every bit of every word is the lone 1 once and neighbours differ;
- walking zeros: the complement (a lone 0);
- address in address: word i holds its own index, then its complement: a word written through a
  faulty address line lands on another word, which then holds the wrong index.

Each pattern is written over the whole buffer before any of it is read back (an aliased
address or a cell that leaks shows only then), and compared on the device in chunks. A wrong
word fails the device with its byte offset in the buffer, its address, the pattern, and what
was written and read. ``--test-memtest-flip OFFSET`` (tests only) flips one bit of that byte
after the first pattern is written: the fault a bad cell makes.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuctl.workloads.accept_suite.suite import Suite

MEMTEST_FRACTION = 0.9  # of the free memory, on a GPU
CHUNK_WORDS = 1 << 24  # 128 MiB of words compared at a time (a multiple of 64 words)
CPU_MB = {True: 16, False: 32}  # MiB on the CPU (a test of the code, not of the memory)
MIN_WORDS = 1024


def patterns(quick: bool) -> "list[tuple[str, str, int]]":
    """(name, kind, parameter) of each pattern, in the order they run."""
    bits = range(0, 64, 8) if quick else range(64)
    out = [(f"walking ones, bit {b}", "ones", b) for b in bits]
    out += [(f"walking zeros, bit {b}", "zeros", b) for b in bits]
    out += [("address", "address", 0), ("address complement", "address_not", 0)]
    return out


class Memtest:
    """One device's buffer, the chunk-sized helpers, and what was found."""

    def __init__(self, torch: Any, device: Any, words: int) -> None:
        self.torch = torch
        self.buf = torch.empty(words, dtype=torch.int64, device=device)
        chunk = min(CHUNK_WORDS, words)
        self.chunk = chunk
        # chunk is a multiple of 64 unless the buffer is smaller: the walking patterns of every
        # chunk are then the same, made once per pattern
        self.index = torch.arange(chunk, dtype=torch.int64, device=device)
        self.expect = torch.empty(chunk, dtype=torch.int64, device=device)
        self.mask = torch.empty(chunk, dtype=torch.bool, device=device)
        self.one = torch.ones((), dtype=torch.int64, device=device)

    def prepare(self, kind: str, bit: int) -> None:
        """A walking pattern is the same in every chunk (a chunk is 64-word aligned): made once
        into ``expect``."""
        if kind in ("ones", "zeros"):
            torch = self.torch
            shift = torch.remainder(self.index + bit, 64)
            torch.bitwise_left_shift(self.one, shift, out=self.expect)
            if kind == "zeros":
                torch.bitwise_not(self.expect, out=self.expect)

    def fill(self, out: Any, kind: str, start: int) -> None:
        """The pattern for words ``start ..`` into ``out`` (at most a chunk)."""
        n = out.numel()
        if kind in ("ones", "zeros"):
            if out.data_ptr() != self.expect.data_ptr():
                out.copy_(self.expect[:n])
            return
        self.torch.add(self.index[:n], start, out=out)
        if kind == "address_not":
            self.torch.bitwise_not(out, out=out)

    def write(self, kind: str, bit: int) -> None:
        self.prepare(kind, bit)
        for start in range(0, self.buf.numel(), self.chunk):
            self.fill(self.buf[start : start + self.chunk], kind, start)

    def _compare(self, kind: str, start: int) -> Any:
        """The chunk at ``start`` against its pattern: ``mask`` marks the wrong words."""
        got = self.buf[start : start + self.chunk]
        n = got.numel()
        self.fill(self.expect[:n], kind, start)
        self.torch.ne(got, self.expect[:n], out=self.mask[:n])
        return got

    def check(self, kind: str, bit: int) -> "tuple[int, dict[str, Any] | None]":
        """(wrong words, the first one) after a ``write`` of the same pattern. Counted on the
        device, read once; only a failing pattern is scanned again for its first wrong word."""
        torch = self.torch
        total = torch.zeros((), dtype=torch.int64, device=self.buf.device)
        starts = range(0, self.buf.numel(), self.chunk)
        for start in starts:
            got = self._compare(kind, start)
            total += torch.count_nonzero(self.mask[: got.numel()])
        wrong = int(total)
        if not wrong:
            return 0, None
        self.prepare(kind, bit)  # the scan above may have overwritten a walking pattern's copy
        for start in starts:
            got = self._compare(kind, start)
            hits = self.mask[: got.numel()].nonzero()
            if hits.numel():
                i = int(hits[0, 0])
                word = start + i
                return wrong, {
                    "offset": word * 8,
                    "address": self.buf.data_ptr() + word * 8,
                    "expected": int(self.expect[i]) & 0xFFFFFFFFFFFFFFFF,
                    "read": int(got[i]) & 0xFFFFFFFFFFFFFFFF,
                }
        return wrong, None

    def flip(self, offset: int) -> None:
        """Flip the lowest bit of the byte at ``offset`` (the test seam)."""
        as_bytes = self.buf.view(self.torch.uint8)
        as_bytes[offset] = as_bytes[offset] ^ 1


def buffer_bytes(suite: "Suite", device: Any) -> int:
    """How much memory to test on ``device``."""
    a = suite.args
    if a.memtest_mb:
        return int(a.memtest_mb) << 20
    if suite.cuda:
        suite.torch.cuda.empty_cache()  # what earlier sections' tensors left cached is free
        free, _total = suite.torch.cuda.mem_get_info(device)
        # room next to the buffer for the chunk's index, pattern and mask, and temporaries
        return max(0, int(free * MEMTEST_FRACTION) - CHUNK_WORDS * 40)
    return CPU_MB[bool(a.quick)] << 20


def run(suite: "Suite") -> "dict[str, Any]":
    """[MEMTEST]: walking ones/zeros and address-in-address over most of free memory."""
    a = suite.args
    flip_at = a.test_memtest_flip
    results, failures = [], []
    for label, device, name in suite.devices():
        words = buffer_bytes(suite, device) // 8
        if words < MIN_WORDS:
            r = {"label": label, "index": device.index, "name": name, "bytes": words * 8}
            r.update(verdict="FAIL", reason=f"only {words * 8} bytes free to test")
            results.append(r)
            failures.append(f"memtest {label}: {r['reason']}")
            continue
        test = Memtest(suite.torch, device, words)
        begin, finish = suite.timer(device)
        begin()
        found: list[tuple[str, int, dict[str, Any]]] = []
        done = 0
        for pattern, kind, bit in patterns(bool(a.quick)):
            test.write(kind, bit)
            if flip_at is not None and done == 0:
                test.flip(flip_at)
            wrong, first = test.check(kind, bit)
            done += 1
            if wrong and first is not None:
                found.append((pattern, wrong, first))
        seconds = finish()
        nbytes = words * 8
        r = {
            "index": device.index,
            "label": label,
            "name": name,
            "bytes": nbytes,
            "patterns": done,
            "gbps": 3.0 * nbytes * done / max(seconds, 1e-9) / 1e9,  # write, read, and compare
            "wrong_words": sum(w for _, w, _ in found),
            "first_bad": None,
            "verdict": "PASS",
            "reason": None,
        }
        if found:
            pattern, wrong, first = found[0]
            r["first_bad"] = {"pattern": pattern, **first}
            r["verdict"] = "FAIL"
            r["reason"] = (
                f"{r['wrong_words']} wrong word(s) in {len(found)} of {done} patterns; first at "
                f"byte offset {first['offset']:#x} (address {first['address']:#x}) in "
                f"{pattern}: wrote {first['expected']:#018x}, read {first['read']:#018x}"
            )
            failures.append(f"memtest {label}: {r['reason']}")
        del test
        if suite.cuda:
            suite.torch.cuda.empty_cache()  # the later sections need the memory back
        results.append(r)
        suite.out.line(
            "{} {:.1f} MiB x {} patterns ({:.1f} GB/s)  {}{}".format(
                label,
                nbytes / 2**20,
                done,
                r["gbps"],
                r["verdict"],
                f" ({r['reason']})" if r["reason"] else "",
            )
        )
    summary = ", ".join(
        f"{r['label']} {r['bytes'] / 2**20:.0f} MiB {'clean' if r['verdict'] == 'PASS' else 'BAD'}"
        for r in results
    )
    return {
        "verdict": "FAIL" if failures else "PASS",
        "summary": summary,
        "devices": results,
        "failures": failures,
    }
