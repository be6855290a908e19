"""``gpuctl accept --prolog`` (#43.3): the check a Slurm prolog or ``HealthCheckProgram`` runs
on the node itself: seconds, no load, never hangs. Through the real CLI, the real local agent
and the suite over the stand-in NVML (real nvidia-ml-py)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from gpuctl_tests.accept.test_cli import gpuctl
from gpuctl_tests.helpers import wait_until
from gpuctl_tests.node.nvml_stub import NvmlStub, build


def stub_env(tmp_path: Path, text: str) -> dict[str, str]:
    stub = NvmlStub(build(tmp_path), tmp_path / "nvml.conf", text)
    return stub.env()


def test_prolog_fails_a_node_with_ecc_errors_in_seconds_and_keeps_no_history(
    tmp_path: Path,
) -> None:
    env = stub_env(tmp_path, "count 2\nset 1 ecc_vol_unc 2\n")
    t0 = time.monotonic()
    r = gpuctl(tmp_path, "--local", "--prolog", env=env)
    print(f"gpuctl accept --local --prolog took {time.monotonic() - t0:.2f} s")  # a figure
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("[RESULT] FAILURE") and "health gpu1: 2 uncorrectable ECC errors" in last
    assert "[COMPUTE] SKIP (0.0 s): --prolog: no load" in r.stdout
    # the readings in words, not Python's reprs of a dict or a list
    gpu1 = next(ln for ln in r.stdout.splitlines() if ln.startswith("[HEALTH] gpu1 "))
    assert "remapped rows 1 correctable, 0 uncorrectable, XID none," in gpu1, gpu1
    assert not set("{}[]'") & set(gpu1.removeprefix("[HEALTH]")), gpu1
    history = gpuctl(tmp_path, "history", env=env)
    assert history.returncode == 0 and history.stdout.startswith("no acceptance runs recorded")
    healthy = gpuctl(tmp_path, "--local", "--prolog", env=stub_env(tmp_path, "count 2\n"))
    assert healthy.returncode == 0, healthy.stdout[-2000:]
    # [DDP]'s two sections (all-reduce, training) skipped for one reason: said once
    ddp = [ln for ln in healthy.stdout.splitlines() if ln.startswith("[DDP] ")]
    assert ddp == ["[DDP] SKIP (0.0 s): --prolog: no load"], ddp


def test_prolog_ends_with_error_by_its_deadline_when_the_node_hangs(tmp_path: Path) -> None:
    """The node's agent freezes (SIGSTOP, as a driver call stuck in the kernel would hold it):
    the check still ends, at --timeout plus its grace, as ERROR (3) in one line."""
    parent, me = tmp_path / "parent", tmp_path / "suite"
    freeze = tmp_path / "freeze"  # stands in for the suite's Python: stops the agent above it
    freeze.write_text(
        f"#!/bin/sh\necho $$ > {me}\necho $PPID > {parent}\nkill -STOP $PPID\nexec sleep 300\n"
    )
    freeze.chmod(0o755)
    env = stub_env(tmp_path, "count 1\n")
    t0 = time.monotonic()
    r = gpuctl(tmp_path, "--local", "--prolog", "--timeout", "2", "--python", str(freeze), env=env)
    took = time.monotonic() - t0
    agent, suite = int(parent.read_text()), int(me.read_text())
    try:
        assert r.returncode == 3, r.stdout[-2000:] + r.stderr[-2000:]
        assert r.stdout.strip().splitlines()[-1] == (
            '[RESULT] FAILURE: ["no verdict within 12 s (--prolog\'s deadline)"]'
        )
        assert r.stderr.strip().splitlines()[-1] == (
            "gpuctl: accept: no verdict within 12 s (--prolog's deadline): the node could not "
            "be checked"
        )
        assert took < 60, took  # the deadline, not the run's 60 s result grace
    finally:
        os.kill(agent, signal.SIGCONT)
    # No orphans: the agent, its link gone, ends and takes the suite's process with it.
    wait_until(lambda: not alive(agent), 30, "the frozen agent to end once it runs again")
    wait_until(lambda: not alive(suite), 30, "the suite's process to end")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_prolog_refuses_load_and_a_cpu_run_in_one_line(tmp_path: Path) -> None:
    for extra, words in (
        (("--burn", "1m"), "--burn loads the GPUs: leave it out of --prolog"),
        (("--device", "cpu"), "--prolog checks the GPUs through NVML: leave out --device cpu"),
    ):
        r = gpuctl(tmp_path, "--local", "--prolog", *extra)
        assert r.returncode == 2 and r.stderr.strip() == f"gpuctl: {words}", r.stderr


def test_junit_makes_its_missing_folder_as_report_dir_does(tmp_path: Path) -> None:
    """``--junit PATH`` refused a folder that did not exist yet where ``--report-dir`` makes
    it: made now (the umask's mode); a PATH that is a folder, or under a file, is one line."""
    junit = tmp_path / "ci" / "out" / "accept.xml"
    old = os.umask(0o027)  # the gpuctl process's umask (a child inherits it)
    try:
        r = gpuctl(
            tmp_path,
            "--local",
            "--prolog",
            "--junit",
            str(junit),
            env=stub_env(tmp_path, "count 1\n"),
        )
    finally:
        os.umask(old)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert junit.read_text().startswith("<?xml") and f"junit: {junit}" in r.stdout
    for made in (junit.parent, junit.parent.parent):
        assert made.stat().st_mode & 0o777 == 0o750, oct(made.stat().st_mode)
    for bad, words in (
        (tmp_path / "ci", f"--junit {tmp_path / 'ci'}: a folder, not a file"),
        (junit / "x.xml", f"--junit {junit / 'x.xml'}: {junit} is not a folder"),
    ):
        r = gpuctl(tmp_path, "--local", "--prolog", "--junit", str(bad))
        assert r.returncode == 2 and r.stderr.startswith(f"gpuctl: {words}"), r.stderr
        assert len(r.stderr.splitlines()) == 1, r.stderr
