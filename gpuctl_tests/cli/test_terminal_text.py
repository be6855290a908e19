"""What a command prints holds no escape sequence a node sent, on a terminal and through a pipe
alike (``gpuctl status | grep`` ends on a terminal too: issue 38.1)."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

from gpuctl_tests.helpers import node_env, wait_until

EVIL = "gpu\x1b]0;pwned\x07-\x1b[2J[bold]x[/\x9b1m\x00ok"
CODE = (
    "import sys\n"
    "from gpuctl.cli import main as m\n"
    "def hostile(args):\n"
    f"    print({EVIL!r}); print({EVIL!r}, file=sys.stderr); return 0\n"
    "m.COMMANDS = ('gpuctl.cli.status',)\n"
    "import gpuctl.cli.status as status\n"
    "status.run = hostile\n"
    "sys.exit(m.main(['status', '--demo']))\n"
)


def test_neither_a_terminal_nor_a_pipe_gets_an_escape(tmp_path: Path) -> None:
    env = node_env({"GPUCTL_STATE_DIR": str(tmp_path / "state")})
    piped = subprocess.run(
        [sys.executable, "-c", CODE], capture_output=True, text=True, env=env, timeout=60
    )
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout == "gpu-[bold]x[/1mok\n"  # the text, not what a terminal acts on
    assert piped.stderr.endswith("gpu-[bold]x[/1mok\n")

    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-c", CODE], stdin=follower, stdout=follower, stderr=follower, env=env
    )
    os.close(follower)
    out = b""

    def read_all() -> bool:
        nonlocal out
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the pty closed: the program is done
            return True
        out += chunk
        return not chunk

    wait_until(read_all, 60, "the program's output")
    assert proc.wait(30) == 0
    os.close(leader)
    text = out.decode("utf-8", "replace")
    assert "\x1b" not in text and "\x9b" not in text and "\x00" not in text and "\x07" not in text
    assert text.count("gpu-[bold]x[/1mok") == 2, text
