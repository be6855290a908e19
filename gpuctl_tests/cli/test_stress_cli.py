"""``gpuctl stress`` as a user runs it: real subprocesses, real agents, real CPU burners."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpuctl.service import user_name
from gpuctl_tests.helpers import AgentProcess, need_torch, node_env, wait_until

# real burners (or stops of every burner of this user here): these modules share one worker
pytestmark = pytest.mark.burners

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
    need_torch()
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
    # GPU 1 of both runs another user's job in the demo: --force burns it anyway
    r = gpuctl(
        "stress",
        "start",
        "--demo",
        "sim-0[1-2]",
        "--gpus",
        "1",
        "--duration",
        "1",
        "--force",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    burns = json.loads(r.stdout)["burns"]
    assert [(b["node"], b["gpu"]) for b in burns] == [("sim-01", 1), ("sim-02", 1)]
    assert all(b["verdict"] == "OK" and b["engine"] == "sim" for b in burns)
    assert all(b["owner"]["user"] == user_name() for b in burns)
    # GPU 0 of sim-02 runs nothing: no --force needed
    r = gpuctl("stress", "start", "--demo", "sim-02", "--gpus", "0", "--duration", "1")
    assert r.returncode == 0, r.stderr
    assert "sim-02 gpu0  done" in r.stdout and "duration reached" in r.stdout


def test_start_refuses_gpus_running_other_users_processes() -> None:
    """The demo's GPUs 1 run jobs of chen (sim-01) and bob (sim-02): nothing starts without
    --force, and each such GPU is one line naming the users and their processes."""
    r = gpuctl("stress", "start", "--demo", "sim-0[1-2]", "--gpus", "0,1", "--duration", "1")
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == [
        "gpuctl: sim-01 GPU 0 runs processes of dana (1): --force burns it anyway",
        "gpuctl: sim-01 GPU 1 runs processes of chen (1): --force burns it anyway",
        "gpuctl: sim-02 GPU 1 runs processes of bob (1): --force burns it anyway",
    ]
    assert r.stdout == ""  # no burn started, not even on sim-02's free GPU 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("stress", "start", "--demo", "nosuch"), "not configured: nosuch"),
        (("stress", "start", "--demo", "--gpus", "a,b"), "--gpus 'a,b': expected indices"),
        (("stress", "start", "--demo", "--read-only"), "read-only mode: stress is disabled"),
        (("stress", "run", "--device", "cpu", "--duration", "0"), "--duration must be positive"),
        (
            ("stress", "start", "--demo"),
            "stress start: name the nodes (e.g. gpu[01-04]) or say --all for every node",
        ),
        (
            ("stress", "stop", "--demo", "--gpus", "1"),
            "stress stop: name the nodes (e.g. gpu[01-04]) or say --all for every node",
        ),
        (("stress", "stop", "--demo", "sim-01", "--all"), "stress stop: name nodes or say --all"),
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


def _cpu_burner(agents: list[AgentProcess], owner: dict[str, str]) -> int:
    """A CPU burner started by an agent of its own (another gpuctl session) for ``owner``;
    returns its pid once it runs."""
    a = AgentProcess([sys.executable, "-m", "gpuctl.node", "agent", "--simulate", "1"], env=ENV)
    agents.append(a)
    assert a.read(20)["type"] == "hello"
    a.send(
        {
            "type": "stress_start",
            "id": 1,
            "gpus": [0],
            "device": "cpu",
            "size": 64,
            "duration": 120,
            "owner": owner,
        }
    )
    assert a.read_until(lambda m: m.get("id") == 1)["type"] == "ok"
    ev = a.read_until(lambda m: m.get("kind") == "burn" and m["detail"]["state"] == "running", 90)
    return int(ev["detail"]["pid"])


def _alive(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # gone, or gone between open and read
        return False
    return text.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


@pytest.mark.slow
def test_stop_stops_only_the_callers_burners_and_names_the_others(
    tmp_path: Path, agents: list[AgentProcess]
) -> None:
    """Two other gpuctl sessions burn on this machine: one of this user (another terminal),
    one of mallory (the test runs as one uid: her session is an agent told so). ``stress
    status`` shows both with their owners; ``stress stop`` wants nodes or --all; ``--all``
    stops this user's burner and names mallory's, which survives until ``--any-owner``."""
    need_torch()
    cfg = tmp_path / "config.toml"
    cfg.write_text("read_only = false\n")  # no clusters: this machine
    mine = _cpu_burner(agents, {"user": user_name(), "host": "other-terminal", "session": "t2"})
    hers = _cpu_burner(agents, {"user": "mallory", "host": "login2", "session": "m1"})

    r = gpuctl("--config", str(cfg), "stress", "status", "--json")
    assert r.returncode == 0, r.stderr
    owners = {b["pid"]: b["owner"] for b in json.loads(r.stdout)["burns"]}
    assert owners[mine]["user"] == user_name() and owners[hers]["user"] == "mallory"
    r = gpuctl("--config", str(cfg), "stress", "status")
    assert r.stdout.splitlines()[0].split() == [
        "NODE",
        "GPU",
        "ENGINE",
        "PID",
        "OWNER",
        "RUNNING",
        "LEFT",
    ]
    (row,) = [ln for ln in r.stdout.splitlines() if f" {hers} " in ln]
    assert "mallory@login2" in row

    r = gpuctl("--config", str(cfg), "stress", "stop")
    assert r.returncode == 2 and "or say --all" in r.stderr
    assert _alive(mine) and _alive(hers)

    r = gpuctl("--config", str(cfg), "stress", "stop", "--all")
    assert r.returncode == 0, r.stderr
    assert f"localhost: stopping 1 burners (pids {mine})" in r.stdout
    assert (
        f"localhost: left alone (not yours; --any-owner stops them): pid {hers} on CPU of "
        "mallory@login2" in r.stdout
    )
    wait_until(lambda: not _alive(mine), 30, "this user's burner to stop")
    assert _alive(hers)

    r = gpuctl("--config", str(cfg), "stress", "stop", "--all", "--any-owner")
    assert r.returncode == 0, r.stderr
    assert f"pids {hers}" in r.stdout
    wait_until(lambda: not _alive(hers), 30, "mallory's burner to stop with --any-owner")


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
            "--force",
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
