"""The stress plugin in a real agent subprocess: real CPU burners, checked in /proc."""

from __future__ import annotations

import json
import os
import pwd
import signal
import stat
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpuctl.bundle import write_bundle
from gpuctl.fleet import control
from gpuctl.fleet.fleet import simulated_fleet
from gpuctl.node.messages import BurnState, StressReply, StressStatus
from gpuctl_tests.helpers import (
    AgentProcess,
    all_live,
    assert_reader_keeps_all,
    fleet_changes,
    need_torch,
    node_env,
    old_python,
    wait_until,
    wait_until_async,
)

# real burners (or stops of every burner of this user here): these modules share one worker
pytestmark = pytest.mark.burners

need_torch(module=True)

CPU_BURN = {"type": "stress_start", "gpus": [0], "device": "cpu", "size": 64}


def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, process group) of a live process, None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[2])


def running(pid: int) -> bool:
    st = proc_stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def group_members(pgid: int) -> list[int]:
    """Processes (not zombies) in a process group, from /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = proc_stat(int(entry))
            if st is not None and st[1] == pgid and st[0] not in ("Z", "X"):
                out.append(int(entry))
    return out


def start_agent(
    agents: list[AgentProcess],
    *args: str,
    env: dict[str, str] | None = None,
    argv: list[str] | None = None,
) -> AgentProcess:
    base = node_env({"OMP_NUM_THREADS": "1", **(env or {})})
    a = AgentProcess(argv or [sys.executable, "-m", "gpuctl.node", "agent", *args], env=base)
    agents.append(a)
    hello = a.read(20)
    assert hello["type"] == "hello"
    assert "stress_start" in hello["features"]
    return a


def burn_event(a: AgentProcess, states: tuple[str, ...], timeout: float = 90) -> dict[str, Any]:
    msg = a.read_until(
        lambda m: m.get("kind") == "burn" and m["detail"]["state"] in states, timeout
    )
    return msg


def reply(a: AgentProcess, req_id: int, timeout: float = 10) -> dict[str, Any]:
    return a.read_until(lambda m: m.get("id") == req_id, timeout)


def start_cpu_burn(a: AgentProcess, **extra: Any) -> int:
    """Start a CPU burn on 'GPU' 0 and return the burner's pid once it makes progress."""
    a.send({**CPU_BURN, "id": 1, **extra})
    ok = reply(a, 1)
    assert ok["type"] == "ok" and ok["started"] == [0], ok
    ev = burn_event(a, ("running",))
    pid = ev["detail"]["pid"]
    assert running(pid)
    assert group_members(pid) == [pid]  # its own process group (session)
    return int(pid)


def test_sigkill_of_the_agent_takes_the_burner_with_it(agents: list[AgentProcess]) -> None:
    a = start_agent(agents, "--simulate", "1")
    pid = start_cpu_burn(a)
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait(5)
    wait_until(lambda: not group_members(pid), 10, "the burner to die with its agent")


@pytest.mark.slow
def test_closing_stdin_stops_every_burner(agents: list[AgentProcess]) -> None:
    a = start_agent(agents, "--simulate", "1")
    pid = start_cpu_burn(a)
    assert a.proc.stdin is not None
    a.proc.stdin.close()
    t0 = time.monotonic()
    wait_until(lambda: not group_members(pid), 2.0, "the burner to stop when stdin closed")
    assert a.proc.wait(5) == 0
    assert time.monotonic() - t0 < 3


@pytest.mark.slow
def test_stop_reports_free_only_when_the_process_is_gone(agents: list[AgentProcess]) -> None:
    a = start_agent(agents, "--simulate", "2")
    pid = start_cpu_burn(a)
    a.send({"type": "stress_status", "id": 2})
    status = reply(a, 2)
    assert [b["gpu"] for b in status["burns"]] == [0]
    assert status["burns"][0]["state"] == "running"
    a.send({"type": "stress_stop", "gpus": "all", "id": 3})
    assert reply(a, 3)["stopping"] == [0]
    done = burn_event(a, ("done", "failed"))
    assert not group_members(pid), "reported free while the burner still runs"
    assert done["detail"]["state"] == "done"
    assert done["detail"]["verdict"] == "OK"
    assert done["detail"]["reason"] == "stopped on request"


@pytest.mark.slow
def test_duration_ends_a_burn(agents: list[AgentProcess]) -> None:
    a = start_agent(agents, "--simulate", "1")
    pid = start_cpu_burn(a, duration=1)
    done = burn_event(a, ("done", "failed"))
    assert done["detail"]["verdict"] == "OK", done
    assert done["detail"]["reason"] == "duration reached"
    assert done["detail"]["iterations"] > 0
    assert not group_members(pid)


def write_script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_agent_enforces_the_limit_on_a_burner_that_ignores_sigterm(
    agents: list[AgentProcess], tmp_path: Path
) -> None:
    # A "python" that ignores SIGTERM and has a child: the agent must SIGKILL the whole group.
    stubborn = write_script(
        tmp_path / "python",
        "trap '' TERM\nsleep 600 &\n"
        'echo \'{"type":"progress","iterations":1,"errors":0}\'\nwait\n',
    )
    a = start_agent(agents, "--simulate", "1", env={"GPUCTL_STRESS_GRACE": "0.5"})
    a.send({**CPU_BURN, "id": 1, "duration": 0.5, "workload_python": stubborn})
    assert reply(a, 1)["type"] == "ok"
    pid = burn_event(a, ("running",))["detail"]["pid"]
    assert len(wait_until(lambda: len(group_members(pid)) == 2 and group_members(pid))) == 2
    stopping = burn_event(a, ("stopping",))
    assert stopping["detail"]["state"] == "stopping"
    done = burn_event(a, ("done", "failed"))
    assert done["detail"]["reason"] == "duration limit reached (killed after 0.5 s)"
    assert not group_members(pid)


def test_a_dying_burner_is_reported_with_its_last_words(
    agents: list[AgentProcess], tmp_path: Path
) -> None:
    broken = write_script(tmp_path / "python", "echo 'No module named torch' >&2\nexit 3\n")
    a = start_agent(agents, "--simulate", "1")
    a.send({**CPU_BURN, "id": 1, "workload_python": broken})
    done = burn_event(a, ("done", "failed"))
    assert done["detail"]["state"] == "failed"
    assert done["detail"]["verdict"] == "DIED"
    assert done["detail"]["reason"] == "burner exited with code 3: No module named torch"
    a.send({**CPU_BURN, "id": 2, "workload_python": str(tmp_path / "missing")})
    failed = burn_event(a, ("failed",))
    assert failed["detail"]["reason"].startswith("cannot start ")


def test_a_burner_writing_nan_does_not_stop_the_agent(
    agents: list[AgentProcess], tmp_path: Path
) -> None:
    """NaN in a progress line was relayed as is, then the agent's encoder refused it and the
    agent stopped silently (and its burners with it). Now it travels as null."""
    odd = write_script(
        tmp_path / "python",
        'echo \'{"type":"progress","iterations":5,"tflops":NaN,"errors":Infinity}\'\n'
        'echo \'{"type":"progress","iterations":' + "9" * 200_000 + "}'\n"
        "exec sleep 600\n",
    )
    a = start_agent(agents, "--simulate", "1")
    a.send({**CPU_BURN, "id": 1, "workload_python": odd})
    assert reply(a, 1)["type"] == "ok"
    running_ev = burn_event(a, ("running",))
    assert running_ev["detail"]["tflops"] is None and running_ev["detail"]["errors"] is None
    assert running_ev["detail"]["iterations"] == 5
    a.send({"type": "ping", "id": 2})
    assert reply(a, 2)["type"] == "pong"  # still there
    assert a.proc.poll() is None and running(running_ev["detail"]["pid"])


def test_bad_requests_get_one_line_errors(agents: list[AgentProcess]) -> None:
    a = start_agent(agents, "--simulate", "2")
    cases = [
        ({"gpus": [7]}, "no GPU 7"),
        ({"gpus": "some"}, "gpus must be"),
        ({"gpus": [0], "dtype": "fp8"}, "dtype must be"),
        ({"gpus": [0], "engine": "magic"}, "engine must be"),
        ({"gpus": [0], "duration": 4000}, "exceeds the maximum of 3600"),
        ({"gpus": [0], "max_duration": 7200}, "exceeds this node's cap of 3600"),
        ({"gpus": [0], "duration": 60, "max_duration": 30}, "exceeds the maximum of 30"),
        ({"gpus": [0], "mem_fraction": 2}, "mem_fraction must be"),
        ({"gpus": [0], "owner": "alice"}, "owner must be an object"),
        ({"gpus": [0], "owner": {"user": "alice", "host": "h"}}, "owner session must be"),
        ({"gpus": [0], "owner": {"user": "a\x00b", "host": "h", "session": "s"}}, "owner user"),
        ({"gpus": [0], "owner": {"user": "a", "host": "h" * 257, "session": "s"}}, "owner host"),
    ]
    for i, (fields, text) in enumerate(cases, start=10):
        a.send({"type": "stress_start", "id": i, **fields})
        err = reply(a, i)
        assert err["type"] == "error" and err["code"] == "bad_argument", err
        assert text in err["message"]
    a.send({"type": "stress_stop", "others": True, "owner_user": 7, "id": 98})
    assert "owner_user must be" in reply(a, 98)["message"]
    a.send({"type": "stress_status", "id": 99})
    assert reply(a, 99)["burns"] == []


def test_simulated_burn_heats_the_gpu_and_cools_on_stop(agents: list[AgentProcess]) -> None:
    a = start_agent(agents, "--simulate", "2:H100", "--interval", "0.2")

    def gpu0() -> dict[str, Any]:
        return a.read_until(lambda m: m["type"] == "sample")["gpus"][0]

    before = gpu0()
    a.send({"type": "stress_start", "gpus": [0], "id": 1, "duration": 60})
    ok = reply(a, 1)
    assert ok["engine"] == "sim" and ok["started"] == [0]
    a.send({"type": "stress_start", "gpus": [0, 1], "id": 2, "duration": 60})
    assert reply(a, 2)["busy"] == [0]
    ev = burn_event(a, ("running",))
    hot = wait_until(lambda: (g := gpu0())["util_gpu"] >= 95 and g, 10, "full utilization")
    hot = wait_until(lambda: (g := gpu0())["temp"] >= before["temp"] + 2 and g, 10, "heat")
    assert hot["power"] > before["power"]
    assert any(p["command"] == "gpuctl-burn" for p in hot["processes"])
    progress = a.read_until(
        lambda m: m.get("kind") == "burn" and "tflops" in m["detail"] and m["gpu"] == 0
    )
    assert 500 < progress["detail"]["tflops"] < 989  # a fraction of the H100's dense bf16 peak
    assert ev["detail"]["ends_at"] > time.time() + 50
    a.send({"type": "stress_stop", "gpus": [0, 1], "id": 3})
    reply(a, 3)
    assert burn_event(a, ("done",))["detail"]["reason"] == "stopped on request"
    wait_until(lambda: gpu0()["util_gpu"] < 50, 10, "the GPU to idle after the burn")


@pytest.mark.slow
def test_old_python_agent_from_the_bundle_runs_the_burner_from_the_bundle(
    agents: list[AgentProcess], tmp_path: Path
) -> None:
    py36 = old_python("3.6.15")
    bundle = write_bundle(tmp_path / "b")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["OMP_NUM_THREADS"] = "1"
    a = AgentProcess([py36, str(bundle), "agent", "--simulate", "1"], env=env)
    agents.append(a)
    assert a.read(20)["python"].startswith("3.6.")
    # VENV2 is this interpreter (torch); it imports gpuctl.workloads from the zip.
    a.send({**CPU_BURN, "id": 1, "duration": 1, "workload_python": sys.executable})
    assert reply(a, 1)["type"] == "ok"
    done = burn_event(a, ("done", "failed"))
    assert done["detail"]["verdict"] == "OK", done


def _parent(pid: int) -> int | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    return int(text[text.rindex(")") + 2 :].split()[1])


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return b""


@pytest.mark.slow
@pytest.mark.sshd
async def test_ssh_link_drop_stops_the_burner(ssh_cluster: Any, tmp_path: Path) -> None:
    """The SSH connection dies (sshd killed) while the agent lives: the agent sees its stdin
    close and stops its burners; none is left within 2 s."""
    import asyncio

    from gpuctl.config import load_config
    from gpuctl.fleet import control
    from gpuctl.fleet.build import fleet_from_config

    await asyncio.to_thread(ssh_cluster.start_nodes, ["n1"])
    path = ssh_cluster.write_config(
        tmp_path / "config.toml", simulate=1, interval=0.2, bundle_dir=str(tmp_path / "b")
    )
    fleet = fleet_from_config(load_config(path), backoff_base=30)
    changes = fleet_changes(fleet)

    await fleet.start()
    try:
        await wait_until_async(
            lambda: fleet.snapshot("n1").last_sample_t, 30, "n1 live", wake=changes
        )
        agent_pid = int(fleet.nodes["n1"].session.info.pid)  # type: ignore[union-attr]
        await control.set_stress(
            fleet,
            "n1",
            [0],
            True,
            options={"device": "cpu", "size": 64, "workload_python": sys.executable},
        )
        burner = await wait_until_async(
            lambda: (control.burn_of(fleet.snapshot("n1"), 0) or {}).get("pid"),
            60,
            "burner",
            wake=changes,
        )
        assert running(burner) and _parent(burner) == agent_pid
        # Drop the link: SIGKILL every sshd above the agent (session and listener), not the
        # agent itself, as when the connection or the node's sshd dies.
        sshds, pid = [], _parent(agent_pid)
        while pid and pid > 1:
            if _cmdline(pid).startswith(b"sshd") or b"/sshd" in _cmdline(pid).split(b"\0")[0]:
                sshds.append(pid)
            pid = _parent(pid)
        assert sshds, "the agent does not run under sshd"
        for p in sshds:
            os.kill(p, signal.SIGKILL)
        t0 = time.monotonic()
        wait_until(lambda: not group_members(burner), 2.0, "the burner to stop on link loss")
        wait_until(lambda: not running(agent_pid), 5.0, "the agent to exit")
        assert time.monotonic() - t0 < 5
    finally:
        await fleet.stop()


# -- the gpu-burn engine, end to end: an agent over the stand-in NVML, a stand-in gpu_burn ------
@pytest.fixture
def gpu_node(tmp_path: Path) -> dict[str, str]:
    """Environment of an agent that sees 2 GPUs (stand-in NVML) and a gpu_burn on PATH (the
    stand-in gpu_burn, on a node of the same 2 GPUs)."""
    from gpuctl_tests.node.nvml_stub import NvmlStub, build
    from gpuctl_tests.workloads import gpuburn_standin

    stub = NvmlStub(build(tmp_path / "nvml"), tmp_path / "nvml.conf", "count 2\n")
    folder = tmp_path / "gpu-burn"
    gpuburn_standin.install(folder)
    env = stub.env()
    env["PATH"] = f"{folder}{os.pathsep}{env.get('PATH', '')}"
    env["GPUCTL_STRESS_GRACE"] = "2"
    env["STANDIN_GPUS"] = "2"
    env["STANDIN_UUIDS"] = ",".join(f"GPU-5718a1c0-0000-4000-8000-{i:012d}" for i in range(2))
    env["STANDIN_RECORD"] = str(folder / "record.json")
    return env


def standin_record(env: dict[str, str]) -> dict[str, Any]:
    return dict(json.loads(Path(env["STANDIN_RECORD"]).read_text()))


def test_gpu_burn_engine_through_the_agent(
    agents: list[AgentProcess], gpu_node: dict[str, str]
) -> None:
    # Its end: TIME, then -stts seconds, then the OK/FAULTY summary the verdict comes from.
    a = AgentProcess([sys.executable, "-m", "gpuctl.node", "agent"], env=gpu_node)
    agents.append(a)
    hello = a.read(20)
    assert hello["reader"] == "nvml" and len(hello["gpus"]) == 2
    uuid = hello["gpus"][1]["uuid"]
    a.send({"type": "stress_start", "id": 1, "gpus": [1], "duration": 1, "dtype": "fp64"})
    ok = reply(a, 1)
    assert ok["engine"] == "gpu-burn", ok  # auto: a gpu_burn on PATH wins
    done = burn_event(a, ("done", "failed"))["detail"]
    assert done["state"] == "done" and done["verdict"] == "OK", done
    assert done["reason"] == "duration reached"
    assert done["engine"] == "gpu-burn" and done["iterations"] > 0 and done["tflops"] > 0
    record = standin_record(gpu_node)
    assert record["argv"] == ["-m", "90%", "-d", "-stts", "3", "1"]
    assert record["visible"] == uuid  # pinned by UUID, not by index


def gpu_burn_to_its_end(
    agents: list[AgentProcess], env: dict[str, str], **start: Any
) -> dict[str, Any]:
    """Start a 1 s gpu-burn burn through a new agent; the detail of its last event."""
    a = AgentProcess([sys.executable, "-m", "gpuctl.node", "agent"], env=env)
    agents.append(a)
    a.read(20)
    a.send({"type": "stress_start", "id": 1, "duration": 1, "engine": "gpu-burn", **start})
    assert reply(a, 1)["type"] == "ok"
    return dict(burn_event(a, ("done", "failed"))["detail"])


def test_gpu_burn_faulty_gpu_through_the_agent(
    agents: list[AgentProcess], gpu_node: dict[str, str]
) -> None:
    env = {**gpu_node, "STANDIN_FAULTY": "1"}  # physical GPU 1 computes wrong results
    done = gpu_burn_to_its_end(agents, env, gpus=[1])
    assert done["verdict"] == "FAULTY" and done["errors"] > 0, done
    assert "gpu-burn says FAULTY" in done["reason"]


def test_gpu_burn_says_the_dtype_it_burns(
    agents: list[AgentProcess], gpu_node: dict[str, str]
) -> None:
    done = gpu_burn_to_its_end(agents, gpu_node, gpus=[0], dtype="bf16")
    assert done["verdict"] == "OK" and done["dtype"] == "fp32", done  # no bf16 in gpu-burn
    assert "-tc" not in standin_record(gpu_node)["argv"]


def test_gpu_burn_engine_dies_with_a_killed_agent(
    agents: list[AgentProcess], gpu_node: dict[str, str]
) -> None:
    a = AgentProcess([sys.executable, "-m", "gpuctl.node", "agent"], env=gpu_node)
    agents.append(a)
    a.read(20)
    a.send({"type": "stress_start", "id": 1, "gpus": [0], "engine": "gpu-burn"})
    assert reply(a, 1)["type"] == "ok"
    wrapper = burn_event(a, ("running",))["detail"]["pid"]
    gpu_burn_group = int(standin_record(gpu_node)["pid"])
    assert group_members(gpu_burn_group)
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait(5)
    wait_until(
        lambda: not group_members(wrapper) and not group_members(gpu_burn_group),
        2.0,
        "the wrapper, gpu_burn and its worker to die with the agent",
    )


MALLORY = {"user": "mallory", "host": "login2", "session": "5e55"}


def _environ_owner(pid: int) -> dict[str, Any] | None:
    for entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        if entry.startswith(b"GPUCTL_BURN_OWNER="):
            return json.loads(entry.split(b"=", 1)[1])  # type: ignore[no-any-return]
    return None


@pytest.mark.slow
def test_a_burn_carries_its_owner_and_other_sessions_see_it_and_spare_it(
    agents: list[AgentProcess], tmp_path: Path
) -> None:
    """The node side under Python 3.6, from the bundle: the owner sent in stress_start is in the
    burn's events, in stress_status and in the burner's environment, where another session's
    agent reads it back; a stop limited to another user leaves the burner alone and says so.
    Every message of the stress plugin here is read by the login side through its one
    definition (``gpuctl.node.messages``) whole: no key it does not know, none dropped."""
    py36 = old_python("3.6.15")
    bundle = write_bundle(tmp_path / "b")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["OMP_NUM_THREADS"] = "1"

    def agent36() -> AgentProcess:
        a = AgentProcess([py36, str(bundle), "agent", "--simulate", "1"], env=env)
        agents.append(a)
        assert a.read(20)["python"].startswith("3.6.")
        return a

    owner_agent, other = agent36(), agent36()
    owner_agent.send(
        {**CPU_BURN, "id": 1, "duration": 120, "owner": MALLORY, "workload_python": sys.executable}
    )
    started = reply(owner_agent, 1)
    assert started["type"] == "ok"
    assert_reader_keeps_all(StressReply, started, "stress_start's reply")
    ev = burn_event(owner_agent, ("running",))
    assert_reader_keeps_all(BurnState, ev["detail"], "a burn event's detail")
    assert ev["detail"]["owner"] == MALLORY
    pid = int(ev["detail"]["pid"])
    assert _environ_owner(pid) == MALLORY
    owner_agent.send({"type": "stress_status", "id": 2})
    status = reply(owner_agent, 2)
    assert_reader_keeps_all(StressStatus, status, "stress_status's reply")
    assert status["burns"][0]["owner"] == MALLORY

    other.send({"type": "stress_status", "id": 3})
    status = reply(other, 3)
    assert_reader_keeps_all(StressStatus, status, "stress_status's reply (others)")
    (seen,) = [b for b in status["others"] if b["pid"] == pid]
    assert seen["owner"] == MALLORY and seen["device"] == "cpu"

    other.send({"type": "stress_stop", "others": True, "owner_user": "alice", "id": 4})
    spared = reply(other, 4)
    assert_reader_keeps_all(StressReply, spared, "stress_stop's reply (kept)")
    # (the stop sees every burner on the machine: another test's may run beside this one)
    assert spared["others"] == []  # nobody's burner is alice's
    (kept,) = [b for b in spared["kept"] if b["pid"] == pid]
    assert kept["owner"] == MALLORY
    assert running(pid)  # not signalled (the agent signals before it replies)

    other.send({"type": "stress_stop", "others": True, "owner_user": "mallory", "id": 6})
    stopped = reply(other, 6)
    assert_reader_keeps_all(StressReply, stopped, "stress_stop's reply")
    assert stopped["others"] == [pid]  # no other test's burner is mallory's
    assert [b for b in stopped["kept"] if b["pid"] == pid] == []
    done = burn_event(owner_agent, ("done", "failed"))
    assert_reader_keeps_all(BurnState, done["detail"], "a burn event's detail (its end)")
    assert "iterations" in done["detail"]  # the burner's figures, relayed
    assert done["detail"]["owner"] == MALLORY
    owner_agent.send({"type": "stress_status", "id": 7})  # a finished burn, as status has it
    status = reply(owner_agent, 7)
    assert status["burns"][0]["state"] in ("done", "failed")
    assert_reader_keeps_all(StressStatus, status, "stress_status's reply (ended)")
    wait_until(lambda: not group_members(pid), 10, "mallory's burner to stop")


def test_a_burner_without_an_owner_mark_has_none(agents: list[AgentProcess]) -> None:
    """A burner gpuctl did not mark (started by hand, an older gpuctl) is nobody's we know:
    a stop limited to a user leaves it alone; an owner inherited by the agent is not passed on."""
    a = start_agent(agents, "--simulate", "1", env={"GPUCTL_BURN_OWNER": json.dumps(MALLORY)})
    pid = start_cpu_burn(a, duration=60)
    assert _environ_owner(pid) is None
    b = start_agent(agents, "--simulate", "1")
    b.send({"type": "stress_stop", "others": True, "owner_user": "mallory", "id": 7})
    stop = reply(b, 7)
    assert stop["others"] == []  # nobody else's burner is mallory's
    # (another test's burner may run beside this one: it is kept or stopped by its own owner)
    assert [(k["pid"], k["owner"]) for k in stop["kept"] if k["pid"] == pid] == [(pid, None)]
    assert running(pid)


async def test_a_node_simulated_in_gpuctl_neither_lists_nor_stops_this_machines_burners(
    agents: list[AgentProcess],
) -> None:
    """The demo's nodes run in a thread of gpuctl: a stop on sim-01 (other sessions' burns of
    this user too, as the screen's stop asks) signalled every real burner of this user on the
    login machine, and its status listed them as sim-01's. An agent on a machine still does."""
    a = start_agent(agents, "--simulate", "1")
    pid = start_cpu_burn(a, duration=60)
    fleet = simulated_fleet([("sim-01", "2:H100")], interval=0.2)
    try:
        await fleet.start()
        await wait_until_async(
            lambda: all_live(fleet.snapshots()), 30, "sim-01 live", wake=fleet_changes(fleet)
        )
        status = await fleet.request("sim-01", {"type": "stress_status"})
        assert status["others"] == [], status
        stop = await control.stop_burners(fleet, "sim-01")
        assert (stop["others"], stop["kept"]) == ([], []), stop
    finally:
        await fleet.stop()
    assert running(pid)
    b = start_agent(agents, "--simulate", "1")  # an agent on this machine sees it
    b.send({"type": "stress_status", "id": 5})
    assert pid in [o["pid"] for o in reply(b, 5)["others"]]


def test_a_simulated_burner_is_the_agents_users_and_ends_as_a_real_one(
    agents: list[AgentProcess],
) -> None:
    """Issue 39.8: a simulated burner ran as user ``gpuctl`` (the process view refused to
    stop your own burn) and an XID 79 left its GPU reading and burning. The burner is the
    agent's user's; SIGTERM to it ends its burn, and XID 79 takes the GPU off the bus: a lost
    record, and its burn ends as a burner on a lost GPU dies."""
    a = start_agent(agents, "--simulate", "2:H100", "--interval", "0.2")
    a.send({"type": "stress_start", "gpus": [0, 1], "id": 1, "duration": 60})
    assert reply(a, 1)["started"] == [0, 1]

    def burner(sample: dict[str, Any], gpu: int) -> list[dict[str, Any]]:
        return [p for p in sample["gpus"][gpu]["processes"] if p["command"] == "gpuctl-burn"]

    sample = a.read_until(lambda m: m["type"] == "sample" and burner(m, 0) and burner(m, 1))
    (proc,) = burner(sample, 0)
    assert (proc["uid"], proc["user"]) == (os.geteuid(), pwd.getpwuid(os.geteuid()).pw_name)
    assert proc["started"] <= time.time()
    a.send({"type": "signal", "pid": proc["pid"], "signal": "TERM", "id": 2})
    assert reply(a, 2)["type"] == "ok"
    done = burn_event(a, ("done", "failed"), timeout=10)
    assert (done["gpu"], done["detail"]["reason"]) == (0, "burner stopped by SIGTERM")
    a.send({"type": "simulate", "action": "xid", "gpu": 1, "xid": 79, "id": 3})
    died = burn_event(a, ("done", "failed"), timeout=10)
    assert died["gpu"] == 1 and died["detail"]["verdict"] == "DIED"
    assert died["detail"]["reason"] == "burner died: its GPU fell off the bus"
    after = a.read_until(lambda m: m["type"] == "sample" and m["gpus"][1]["state"] == "lost")
    lost = after["gpus"][1]
    assert lost.get("util_gpu") is None and not lost.get("processes")
    assert not burner(after, 0)
