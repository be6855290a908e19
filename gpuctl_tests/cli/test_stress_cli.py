"""``gpuctl stress`` as a user runs it: real subprocesses, real agents, real CPU burners."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpuctl_tests.helpers import node_env, wait_until

ENV = node_env({"OMP_NUM_THREADS": "1"})


def gpuctl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuctl", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env or ENV,
    )


def test_run_on_the_cpu_prints_the_json_summary() -> None:
    pytest.importorskip("torch")
    r = gpuctl("stress", "run", "--device", "cpu", "--duration", "1", "--size", "64", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    (dev,) = out["devices"]
    assert dev["device"] == "cpu" and dev["verdict"] == "OK" and dev["errors"] == 0
    assert dev["iterations"] > 0 and dev["gflops_mean"] > 0
    assert dev["tflops_mean"] == pytest.approx(dev["gflops_mean"] / 1000, rel=0.01, abs=1e-4)
    assert 0.5 < dev["duty"] <= 1.0
    assert out["verdict"] == "OK"


def test_run_on_a_machine_without_gpus_is_one_line() -> None:
    from gpuctl.node.readers import open_reader

    if open_reader(None)[0] is not None:
        pytest.skip("this machine has GPUs")
    r = gpuctl("stress", "run", "--duration", "1")
    assert r.returncode == 2
    assert r.stderr.strip() == (
        "gpuctl: no GPU found on this machine; to test the burner: --device cpu"
    )


def test_start_on_the_demo_follows_burns_to_their_end() -> None:
    r = gpuctl(
        "stress", "start", "--demo", "sim-0[1-2]", "--gpus", "1", "--duration", "1", "--json"
    )
    assert r.returncode == 0, r.stderr
    burns = json.loads(r.stdout)["burns"]
    assert [(b["node"], b["gpu"]) for b in burns] == [("sim-01", 1), ("sim-02", 1)]
    assert all(b["verdict"] == "OK" and b["engine"] == "sim" for b in burns)
    r = gpuctl("stress", "start", "--demo", "sim-01", "--gpus", "1", "--duration", "1")
    assert r.returncode == 0, r.stderr
    assert "sim-01 gpu1  done" in r.stdout and "duration reached" in r.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("stress", "start", "--demo", "nosuch"), "not configured: nosuch"),
        (("stress", "start", "--demo", "--gpus", "a,b"), "--gpus 'a,b': expected indices"),
        (("stress", "start", "--demo", "--read-only"), "read-only mode: stress is disabled"),
        (("stress", "run", "--device", "cpu", "--duration", "0"), "--duration must be positive"),
    ],
)
def test_user_mistakes_are_one_line(args: tuple[str, ...], message: str) -> None:
    r = gpuctl(*args)
    assert r.returncode == 2
    assert r.stderr.strip() == f"gpuctl: {message}" or message in r.stderr.strip()
    assert len(r.stderr.strip().splitlines()) == 1


def test_config_read_only_refuses_start_and_stop(tmp_path: Path) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text("read_only = true\n")
    for command in ("start", "stop"):
        r = gpuctl("--config", str(cfg), "stress", command)
        assert r.returncode == 2
        assert "read-only mode" in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_status_and_stop_reach_a_burner_another_session_started(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    cfg = tmp_path / "config.toml"
    cfg.write_text("read_only = false\n")  # no clusters: this machine
    other = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuctl.workloads.burn",
            "--device",
            "cpu",
            "--size",
            "64",
            "--duration",
            "120",
        ],
        stdout=subprocess.DEVNULL,
        env=ENV,
        start_new_session=True,  # as the agent starts them
    )
    try:
        r = gpuctl("--config", str(cfg), "stress", "status", "--json")
        assert r.returncode == 0, r.stderr
        mine = [b for b in json.loads(r.stdout)["burns"] if b["pid"] == other.pid]
        assert mine and mine[0]["engine"] == "torch" and mine[0]["device"] == "cpu"
        assert mine[0]["duration"] == 120.0
        r = gpuctl("--config", str(cfg), "stress", "stop")
        assert r.returncode == 0, r.stderr
        assert str(other.pid) in r.stdout
        wait_until(lambda: other.poll() is not None, 10, "the other session's burner to stop")
        assert other.returncode == 0  # SIGTERM: it stopped cleanly with its summary
    finally:
        if other.poll() is None:
            other.kill()
        other.wait()


def test_ctrl_c_stops_the_burns_and_reports_them() -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuctl",
            "stress",
            "start",
            "--demo",
            "sim-01",
            "--gpus",
            "0",
            "--duration",
            "600",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("burning 1 GPUs"):
                break
        proc.send_signal(signal.SIGINT)
        rest = proc.stdout.read()
        assert proc.wait(30) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "sim-01 gpu0  done" in rest and "stopped on request" in rest
