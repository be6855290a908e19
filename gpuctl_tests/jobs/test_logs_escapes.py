"""A job's output is the job's: escapes it prints (a clipboard write, a window title, a link, a
cursor move) reach ``gpuctl logs`` through a pipe (``gpuctl logs ID | tail``) as text without
them, whole and followed; ``--raw`` gives the bytes as the job wrote them (issue 38.1)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from gpuctl_tests.helpers import node_env

# What a terminal acts on: OSC 52 (write the clipboard), OSC 0 (the window's title), OSC 8 (a
# link), CSI (move the cursor up, clear the screen), an 8-bit CSI, a bare carriage return.
OUT = (
    "a\x1b]52;c;cm0gLXJmIH4=\x07b \x1b]0;pwned\x1b\\c \x1b]8;;http://x.invalid/\x07link"
    "\x1b]8;;\x07 \x1b[3A\x1b[2Jd\x9b1me\rf\n"
)
ERR = "warn\x1b]0;err-title\x07ed\n"
CLEAN_OUT = "ab c link d1me\nf\n"  # the text around the sequences (an 8-bit CSI's "1m")
CLEAN_ERR = "warned\n"


def noisy() -> int:
    import sys

    sys.stdout.write(OUT)
    sys.stderr.write(ERR)
    return 0


def _logs(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "gpuctl", "logs", *argv],
        env=env,
        capture_output=True,  # stdout a pipe: `gpuctl logs ID | tail`
        timeout=120,
    )


def test_logs_through_a_pipe_hold_no_escape_and_raw_keeps_the_bytes(make_executor: Any) -> None:
    job = make_executor().submit(noisy)
    assert job.result(120) == 0
    env = node_env({"GPUCTL_STATE_DIR": os.environ["GPUCTL_STATE_DIR"]})
    env.pop("GPUCTL_CONFIG", None)
    for argv in ([job.id], [job.id, "-f"]):  # read whole, and followed until the job's end
        r = _logs(env, *argv)
        assert r.returncode == 0, r.stderr
        out, err = r.stdout.decode(), r.stderr.decode()
        for text in (out, err):
            assert not {c for c in text if c not in "\n" and not c.isprintable()}, repr(text)
        if "-f" in argv:  # stdout here, stderr to stderr
            assert (out, err) == (CLEAN_OUT, CLEAN_ERR)
        else:
            assert out == f"=== stdout ===\n{CLEAN_OUT}=== stderr ===\n{CLEAN_ERR}"
    r = _logs(env, job.id, "--stdout", "--tail", "2")
    assert r.stdout.decode() == CLEAN_OUT
    raw = _logs(env, job.id, "--stdout", "--raw")
    assert raw.returncode == 0 and raw.stdout == OUT.encode()
    followed = _logs(env, job.id, "-f", "--raw")
    assert (followed.stdout, followed.stderr) == (OUT.encode(), ERR.encode())
