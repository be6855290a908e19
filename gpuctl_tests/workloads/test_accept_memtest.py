"""[MEMTEST] on the CPU: the patterns themselves, and the suite finding a flipped bit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from gpuctl.workloads.accept_suite.schema import SECTIONS
from gpuctl.workloads.accept_suite.sections import memtest
from gpuctl_tests.helpers import need_torch, node_env

torch = need_torch(module=True)

OTHERS = [a for s in SECTIONS if s not in ("env", "memtest") for a in ("--skip", s)]


def run_memtest(
    tmp_path: Path, *args: str
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    argv = [sys.executable, "-m", "gpuctl.workloads.accept_suite", "--device", "cpu", "--quick"]
    argv += ["--report-dir", str(tmp_path), "--memtest-mb", "4", *OTHERS, *args]
    proc = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        env=node_env({"OMP_NUM_THREADS": "1"}),
        timeout=240,
        stdin=subprocess.DEVNULL,
    )
    (report,) = [json.loads(p.read_text()) for p in tmp_path.glob("*.json")]
    return proc, dict(report["sections"]["memtest"])


def test_clean_memory_passes_every_pattern(tmp_path: Path) -> None:
    proc, section = run_memtest(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (dev,) = section["devices"]
    assert section["verdict"] == "PASS" and dev["verdict"] == "PASS"
    assert dev["bytes"] == 4 << 20 and dev["patterns"] == len(memtest.patterns(True)) == 18
    assert dev["wrong_words"] == 0 and dev["first_bad"] is None
    assert "[MEMTEST] cpu 4.0 MiB x 18 patterns" in proc.stdout


def test_a_flipped_bit_is_found_with_the_device_and_its_offset(tmp_path: Path) -> None:
    # The lowest bit of byte 0x3039 flips after the first pattern (walking ones, bit 0) is
    # written: word 0x3038 / 8 = 1543 held 1 << (1543 % 64) = 1 << 7, reads 1 << 7 | 1 << 8.
    proc, section = run_memtest(tmp_path, "--test-memtest-flip", str(0x3039))
    assert proc.returncode == 1
    (dev,) = section["devices"]
    assert dev["verdict"] == "FAIL" and dev["wrong_words"] == 1
    bad = dev["first_bad"]
    assert bad["pattern"] == "walking ones, bit 0" and bad["offset"] == 0x3038
    assert (bad["expected"], bad["read"]) == (1 << 7, 1 << 7 | 1 << 8)
    reason = (
        "1 wrong word(s) in 1 of 18 patterns; first at byte offset 0x3038 (address "
        f"{bad['address']:#x}) in walking ones, bit 0: wrote 0x0000000000000080, "
        "read 0x0000000000000180"
    )
    assert dev["reason"] == reason
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("[RESULT] FAILURE") and f"memtest cpu: {reason}" in last


def test_walking_patterns_and_an_address_fault_only_the_address_pattern_sees() -> None:
    test = memtest.Memtest(torch, torch.device("cpu"), 4096)
    test.write("ones", 3)
    words = test.buf.tolist()
    assert words[0] == 1 << 3 and words[60] == -(1 << 63) and words[61] == 1 and words[64] == 8
    test.write("zeros", 3)
    assert test.buf[0].item() == ~(1 << 3)
    assert test.check("zeros", 3) == (0, None)
    # An address line stuck: writes meant for words 1024..2047 land on 0..1023 as well.
    for kind in ("ones", "address"):
        test.write(kind, 0)
        test.buf[1024:2048] = test.buf[0:1024].clone()
        wrong, first = test.check(kind, 0)
        if kind == "ones":
            assert wrong == 0  # the same pattern repeats every 64 words: it cannot tell
        else:
            assert wrong == 1024 and first is not None and first["offset"] == 1024 * 8
            assert (first["expected"], first["read"]) == (1024, 0)
