"""``gpuctl logs ID --tail N / --head N`` and ``job.stdout(tail=N)``: only the lines shown are
read from the node, locally and over SSH. Measured on a log of 40 MB by what the ``gpuctl logs``
process read (its files, and what its SSH connection received) and its peak RSS: reading the log
whole costs its size, reading its tail or head costs what a log of three lines does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuctl.cli.main import main
from gpuctl.config import load_config
from gpuctl.jobs import EnvSpec, Executor, Job, JobStore
from gpuctl_tests.helpers import node_env

LINES = 400_000  # of 100 bytes: a 40 MB stdout
MB = 1 << 20


def chatty(lines: int) -> int:
    import sys

    row = "x" * 86
    write = sys.stdout.write
    for i in range(lines):
        write(f"line {i:07d} {row}\n")
    print("the last word", file=sys.stderr)
    return lines


# What gpuctl itself read, said on stderr as it exits: from files (rchar of /proc/self/io: read
# calls), from its SSH connections (what asyncssh's protocol received), and its peak RSS (VmHWM:
# ru_maxrss would count the RSS of the parent it was forked from, kept across exec).
MEASURED = """
import runpy, sys
import asyncssh.connection

received = [0]
data_received = asyncssh.connection.SSHConnection.data_received

def counted(self, data, datatype=None):
    received[0] += len(data)
    return data_received(self, data, datatype)

asyncssh.connection.SSHConnection.data_received = counted
sys.argv[0] = "gpuctl"
try:
    runpy.run_module("gpuctl", run_name="__main__")
finally:
    io = dict(line.split(": ") for line in open("/proc/self/io").read().splitlines())
    status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
    peak = int(status["VmHWM"].split()[0]) * 1024
    print(int(io["rchar"]) + received[0], peak, file=sys.stderr)
"""


def gpuctl_read(env: dict[str, str], *argv: str) -> tuple[str, int, int]:
    """``gpuctl ARGV`` in a process of its own: its stdout, the bytes it read, its peak RSS."""
    proc = subprocess.run(
        [sys.executable, "-c", MEASURED, *argv], env=env, capture_output=True, timeout=300
    )
    *err, last = proc.stderr.decode().splitlines()
    assert proc.returncode == 0, err
    read, peak = last.split()
    return proc.stdout.decode(), int(read), int(peak)


def check_tail_and_head(job: Job, small: Job, env: dict[str, str]) -> None:
    """``job``'s stdout is LINES lines, ``small``'s a few: the CLI's and the API's tail and head
    show what they should, and reading the tail of the big log costs no more memory than that
    of the small one, far less than reading it whole."""
    assert job.result(300) == LINES and small.result(300) == 3
    last = [f"line {i:07d} {'x' * 86}" for i in range(LINES - 3, LINES)]
    assert job.stdout(tail=3).splitlines() == last
    assert job.stdout(head=2).splitlines()[1] == f"line 0000001 {'x' * 86}"
    assert job.stderr(tail=1) == "the last word\n" and job.stdout(tail=0) == ""
    out, tail_read, tail_rss = gpuctl_read(env, "logs", job.id, "--tail", "3")
    assert out.splitlines() == ["=== stdout ===", *last, "=== stderr ===", "the last word"]
    out, head_read, head_rss = gpuctl_read(env, "logs", job.id[:10], "--head", "1", "--stdout")
    assert out == f"line 0000000 {'x' * 86}\n"
    _, small_read, small_rss = gpuctl_read(env, "logs", small.id, "--tail", "3")
    whole, whole_read, whole_rss = gpuctl_read(env, "logs", job.id, "--stdout")
    assert len(whole) == LINES * 100
    print(
        f"\ngpuctl logs, bytes read / peak RSS (MiB): --tail 3 {tail_read / MB:.2f} / "
        f"{tail_rss / MB:.1f}, --head 1 {head_read / MB:.2f} / {head_rss / MB:.1f}, "
        f"a 3-line log --tail 3 {small_read / MB:.2f} / {small_rss / MB:.1f}, "
        f"the 40 MB log whole {whole_read / MB:.2f} / {whole_rss / MB:.1f}"
    )
    assert max(tail_read, head_read) < small_read + MB  # a log of 3 lines, or one of 40 MB
    assert max(tail_rss, head_rss) < small_rss + 8 * MB
    assert whole_read > tail_read + 0.9 * LINES * 100  # reading it whole, for comparison
    assert whole_rss > tail_rss + 35 * MB


def test_tail_and_head_read_only_what_they_show_here(
    make_executor: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ex = make_executor()
    job, small = ex.submit(chatty, LINES), ex.submit(chatty, 3)
    env = node_env({"GPUCTL_STATE_DIR": os.environ["GPUCTL_STATE_DIR"]})
    env.pop("GPUCTL_CONFIG", None)
    with capsys.disabled():
        check_tail_and_head(job, small, env)


@pytest.mark.sshd
def test_tail_and_head_read_only_what_they_show_over_ssh(
    ssh_cluster: Any,
    venv1: str,
    env_root: str,
    env_spec: EnvSpec,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ssh_cluster.start_node("gpu1", python=venv1)
    config_path = ssh_cluster.write_config(tmp_path / "config.toml")
    ex = Executor(
        "gpu1",
        config=load_config(config_path),
        env=env_spec,
        env_root=env_root,
        job_root=str(tmp_path / "remote-jobs"),
        store=JobStore(),
    )
    job, small = ex.submit(chatty, LINES), ex.submit(chatty, 3)
    env = node_env(
        {"GPUCTL_STATE_DIR": os.environ["GPUCTL_STATE_DIR"], "GPUCTL_CONFIG": str(config_path)}
    )
    with capsys.disabled():
        check_tail_and_head(job, small, env)


def ticks(gate: str) -> None:
    import os
    import time

    for i in range(1000):
        print("tick", i)
    print("waiting", flush=True)
    while not os.path.exists(gate):  # the last line only once the test saw the rest
        time.sleep(0.05)
    print("done", flush=True)


def test_follow_from_the_tail_then_what_comes(make_executor: Any, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    job = make_executor().submit(ticks, str(gate))
    env = node_env({"GPUCTL_STATE_DIR": os.environ["GPUCTL_STATE_DIR"]})
    env.pop("GPUCTL_CONFIG", None)
    argv = [sys.executable, "-m", "gpuctl", "logs", job.id, "-f", "--tail", "2", "--stdout"]
    follow = subprocess.Popen(
        argv, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert follow.stdout is not None
        first = [follow.stdout.readline() for _ in range(2)]
        assert first in (["tick 998\n", "tick 999\n"], ["tick 999\n", "waiting\n"])
        if first[1] != "waiting\n":
            assert follow.stdout.readline() == "waiting\n"  # it followed on from there
        gate.touch()
        rest, err = follow.communicate(timeout=60)  # it ends when the job does
    finally:
        if follow.poll() is None:
            follow.kill()
        gate.touch()
    assert (follow.returncode, rest, err) == (0, "done\n", "")


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--tail", "-1"], "--tail takes a number of lines, 0 or more, not -1"),
        (["--head", "2", "-f"], "--head and -f do not go together"),
        (["--head", "2", "--tail", "2"], "not allowed with argument"),
    ],
)
def test_tail_and_head_mistakes_are_one_line(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        rc = main(["logs", "0" * 32, *argv])
    except SystemExit as e:  # argparse's own: the two options together
        rc = int(str(e.code))
    assert rc == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") <= 2, err
