"""The dead-man's switch without a closed link: an agent that hears nothing for its liveness
timeout stops every burner it started and exits, whatever keeps its stdin open (a frozen gpuctl,
a partitioned network); pings keep it alive; and the fleet pings, over real SSH too. The burner's
pid is checked in /proc, not just what the agent says."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpuctl_tests.helpers import REPO, AgentProcess, need_torch, node_env, wait_until
from gpuctl_tests.node.test_stress_plugin import (
    group_members,
    reply,
    running,
    start_agent,
    start_cpu_burn,
)

# real burners (or stops of every burner of this user here): these modules share one worker
pytestmark = pytest.mark.burners

need_torch(module=True)

LIVENESS = 3.0
SLACK = 5.0  # the brief: dead within liveness_timeout + 5 s


def burning_agent(agents: list[AgentProcess], *args: str) -> tuple[AgentProcess, int]:
    """An agent with a running CPU burner, its liveness off while torch starts (that takes
    longer than the short timeouts of these tests). Returns it and the burner's pid."""
    a = start_agent(agents, "--liveness-timeout", "0", *args)
    return a, start_cpu_burn(a)


def arm(a: AgentProcess, timeout: float) -> float:
    """Set the agent's liveness timeout; returns when the agent last heard something."""
    a.send({"type": "configure", "id": "arm", "liveness_timeout": timeout})
    sent = time.monotonic()
    assert a.read_until(lambda m: m.get("id") == "arm")["liveness_timeout"] == timeout
    return sent


def test_a_silent_link_stops_the_burner_within_the_liveness_timeout(
    agents: list[AgentProcess],
) -> None:
    """stdin stays open and nothing comes: as when the login process is frozen."""
    a, pid = burning_agent(agents, "--simulate", "1")
    silent_since = arm(a, LIVENESS)
    wait_until(lambda: not group_members(pid), LIVENESS + SLACK, "the burner to be stopped")
    took = time.monotonic() - silent_since
    assert LIVENESS - 0.5 <= took <= LIVENESS + SLACK, took
    last = a.read_until(lambda m: m["type"] == "error" and m.get("code") == "liveness")
    assert "heard nothing" in last["message"]
    done = a.read_until(lambda m: m.get("kind") == "burn" and m["detail"]["state"] == "done")
    assert "no word from gpuctl" in done["detail"]["reason"]
    assert a.proc.wait(5) == 0
    print(f"\nsilent link -> burner gone: {took:.2f} s (liveness_timeout {LIVENESS:g} s)")


def test_pings_keep_the_burner_alive_past_the_timeout(agents: list[AgentProcess]) -> None:
    a, pid = burning_agent(agents, "--simulate", "1")
    arm(a, 2.0)
    until = time.monotonic() + 3 * 2.0
    n = 0
    while time.monotonic() < until:
        n += 1
        a.send({"type": "ping", "id": n})
        assert reply(a, n)["type"] == "pong"
        time.sleep(0.5)  # the ping cadence (the fleet's is timeout / 3), not a wait
    assert running(pid) and a.proc.poll() is None
    wait_until(lambda: not group_members(pid), 2.0 + SLACK, "the burner to stop once pings stop")


def test_a_reader_that_stopped_reading_does_not_freeze_the_agent(
    agents: list[AgentProcess],
) -> None:
    """Eight GPUs sampled at 10 Hz fill the stdout pipe in about a second once nobody reads:
    an agent blocked in write() would never check liveness, and its burner would run on."""
    a, pid = burning_agent(agents, "--simulate", "8", "--interval", "0.1")
    silent_since = arm(a, LIVENESS)
    # From here on the test reads nothing: the pipe (64 KiB) fills.
    wait_until(lambda: not group_members(pid), LIVENESS + SLACK, "the burner to be stopped")
    assert time.monotonic() - silent_since <= LIVENESS + SLACK
    assert a.proc.wait(5) == 0


def test_the_node_enforces_the_burn_cap_and_its_own_ceiling(agents: list[AgentProcess]) -> None:
    a = start_agent(agents, "--simulate", "1", "--max-duration", "30")
    a.send({"type": "stress_start", "id": 1, "gpus": [0], "device": "cpu", "duration": 31})
    err = reply(a, 1)
    assert err["code"] == "bad_argument"
    assert err["message"] == "duration 31 s exceeds the maximum of 30 s (max_duration)"
    a.send({"type": "stress_start", "id": 2, "gpus": [0], "device": "cpu", "max_duration": 60})
    assert "exceeds this node's cap of 30 s" in reply(a, 2)["message"]
    a.send({"type": "configure", "id": 3, "max_duration": 8 * 86400})
    assert "this node's ceiling" in reply(a, 3)["message"]


# -- through the fleet, over real SSH, with the login process frozen -----------------------------
LOGIN = r"""
import asyncio, json, sys, time
from gpuctl.config import load_config
from gpuctl.fleet import control
from gpuctl.fleet.build import fleet_from_config

async def main():
    fleet = fleet_from_config(load_config(sys.argv[1]), liveness_timeout=float(sys.argv[2]))
    control.configure(fleet, {"max_duration": 600})
    await fleet.start()
    while not fleet.snapshot("n1").last_sample_t:
        await asyncio.sleep(0.05)
    session = fleet.nodes["n1"].session
    await control.set_stress(fleet, "n1", [0], True, options={
        "device": "cpu", "size": 64, "workload_python": sys.executable})
    while not (control.burn_of(fleet.snapshot("n1"), 0) or {}).get("pid"):
        await asyncio.sleep(0.05)
    status = await fleet.request("n1", {"type": "stress_status"})
    print(json.dumps({"burner": control.burn_of(fleet.snapshot("n1"), 0)["pid"],
                      "agent": session.info.pid, "cap": status["max_duration"],
                      "hello_liveness": session.info.liveness_timeout}), flush=True)
    await asyncio.sleep(3600)  # streaming and pinging until frozen or killed

asyncio.run(main())
"""


def _gone(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists() or not running(pid)


@pytest.mark.slow
@pytest.mark.sshd
def test_a_frozen_login_over_ssh_stops_the_burner(ssh_cluster: Any, tmp_path: Path) -> None:
    """The whole path: gpuctl's fleet over real sshd configures the agent and pings it; the
    login process is then stopped with SIGSTOP (TCP stays up, nothing is closed: the kernel
    reports nothing), and the burner on the node must be gone within liveness + 5 s."""
    ssh_cluster.start_nodes(["n1"])
    config = ssh_cluster.write_config(
        tmp_path / "config.toml", simulate=1, interval=0.5, bundle_dir=str(tmp_path / "b")
    )
    env = node_env({"OMP_NUM_THREADS": "1"})
    login = subprocess.Popen(
        [sys.executable, "-c", LOGIN, str(config), f"{LIVENESS:g}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )
    try:
        assert login.stdout is not None
        line = login.stdout.readline()
        assert line, login.stderr.read() if login.stderr else ""
        info = json.loads(line)
        burner, agent = int(info["burner"]), int(info["agent"])
        assert info["cap"] == 600  # the login side's [stress] max_duration reached the node
        assert running(burner) and running(agent)
        # Pings keep it going well past the timeout while the login process runs.
        deadline = time.monotonic() + 2 * LIVENESS
        while time.monotonic() < deadline:
            assert running(burner), "the burner stopped while gpuctl was pinging"
            time.sleep(0.2)  # sampling the burner's state over a span, not a wait for it
        login.send_signal(signal.SIGSTOP)
        frozen_at = time.monotonic()
        wait_until(lambda: _gone(burner), LIVENESS + SLACK, "the burner to die")
        took = time.monotonic() - frozen_at
        wait_until(lambda: _gone(agent), 10, "the agent to exit")
        print(f"\nfrozen login over ssh -> burner gone: {took:.2f} s (liveness {LIVENESS:g} s)")
        assert took <= LIVENESS + SLACK
    finally:
        login.send_signal(signal.SIGCONT)
        login.kill()
        login.wait(10)
