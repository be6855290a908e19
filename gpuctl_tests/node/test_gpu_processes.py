"""GPU processes as a node reports them, and the ``signal`` request, against real processes.

Real ``sleep`` processes are handed to the stand-in NVML's process list (``proc`` and
``procutil`` lines); the agent runs from the bundle under pyenv's Python 3.6.15, as on a node
with nothing installed, reads /proc for them, and signals them for real. Another user's process
is a ``sleep`` of a second Unix user made for the test (root only: ``useradd``, ``setpriv``).
"""

from __future__ import annotations

import os
import pwd
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuctl.bundle import write_bundle
from gpuctl.node.messages import SignalReply
from gpuctl.node.proc import descendants
from gpuctl_tests.helpers import AgentProcess, assert_reader_keeps_all, old_python, wait_until
from gpuctl_tests.node.nvml_stub import NvmlStub
from gpuctl_tests.processes import OTHER_USER, Start, as_user, other_user


def start_agent(
    stub: NvmlStub, tmp_path: Path, agents: list[AgentProcess], *args: str
) -> AgentProcess:
    env = stub.env()
    env.pop("PYTHONPATH", None)  # the bundle alone, as on a node
    bundle = write_bundle(tmp_path / "bundle")
    agent = AgentProcess(
        [old_python("3.6.15"), str(bundle), "agent", "--interval", "0.2", *args], env=env
    )
    agents.append(agent)
    assert agent.read()["type"] == "hello"
    return agent


def processes(sample: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """pid -> (GPU index, process) of a sample."""
    return {p["pid"]: {**p, "gpu": g["index"]} for g in sample["gpus"] for p in g["processes"]}


def sample_with(
    agent: AgentProcess, pids: set[int], pred: Callable[..., bool] | None = None
) -> dict[str, Any]:
    def ok(m: dict[str, Any]) -> bool:
        if m["type"] != "sample" or not pids <= processes(m).keys():
            return False
        return pred is None or pred(processes(m))

    return agent.read_until(ok, timeout=20)


def test_the_agent_reports_real_processes_with_their_host_facts_and_tree(
    nvml_lib_dir: Path, tmp_path: Path, agents: list[AgentProcess], procs: Start
) -> None:
    launcher = procs("sh", "-c", "sleep 301 & sleep 302 & wait")
    kids = wait_until(lambda: len(descendants(launcher.pid)) == 2 and descendants(launcher.pid))
    # both children exec'd sleep (the fork may still be the shell for a moment)
    wait_until(
        lambda: all(Path(f"/proc/{k}/cmdline").read_bytes().startswith(b"sleep") for k in kids)
    )
    lone = procs("sleep", "303")
    stub = NvmlStub(
        nvml_lib_dir,
        tmp_path / "nvml.conf",
        f"count 2\nproc 0 {kids[0]} 512\nproc 1 {kids[1]} 256\nproc 1 {lone.pid} 128\n"
        f"procutil 1 {kids[1]} 37 5\n",
    )
    agent = start_agent(stub, tmp_path, agents)
    pids = {*kids, lone.pid}
    first = sample_with(agent, pids)
    seen = processes(first)
    me = pwd.getpwuid(os.getuid()).pw_name
    commands = {seen[k]["command"] for k in kids}
    assert commands == {"sleep 301", "sleep 302"}
    assert seen[lone.pid]["command"] == "sleep 303"
    for pid in pids:
        p = seen[pid]
        assert (p["user"], p["uid"]) == (me, os.getuid())
        assert p["rss"] > 0
        assert abs(p["started"] - time.time()) < 120
        assert p.get("cpu") is None  # one read of /proc/PID/stat is no rate yet (null: left out)
    assert [seen[k]["ppid"] for k in kids] == [launcher.pid, launcher.pid]
    assert seen[lone.pid]["ppid"] == os.getpid()
    # GPU 0's only process has GPU 0's utilization; GPU 1's two have NVML's per-process answers
    assert (seen[kids[0]]["gpu"], seen[kids[0]]["mem"], seen[kids[0]]["sm"]) == (0, 512 << 20, 50)
    assert (seen[kids[1]]["gpu"], seen[kids[1]]["sm"]) == (1, 37)
    assert seen[lone.pid].get("sm") is None  # no utilization sample of it
    # The launcher is a parent, not a GPU process; no GPU process is listed as a parent.
    parents = {p["pid"]: p for p in first["parents"]}
    assert parents[launcher.pid]["command"] == "sh -c sleep 301 & sleep 302 & wait"
    assert parents[launcher.pid]["user"] == me
    assert not pids & parents.keys()
    # The next sample has %CPU: a sleeping process uses next to nothing.
    later = sample_with(agent, pids, lambda ps: ps[lone.pid].get("cpu") is not None)
    assert 0.0 <= processes(later)[lone.pid]["cpu"] < 50.0


def test_signal_ends_an_own_gpu_process_and_refuses_the_rest(
    nvml_lib_dir: Path, tmp_path: Path, agents: list[AgentProcess], procs: Start
) -> None:
    other = other_user()
    theirs = procs(*as_user(other), "sleep", "304")
    wait_until(lambda: os.stat(f"/proc/{theirs.pid}").st_uid == other.pw_uid)
    mine = procs("sleep", "305")
    stub = NvmlStub(
        nvml_lib_dir,
        tmp_path / "nvml.conf",
        f"count 1\nproc 0 {mine.pid} 64\nproc 0 {theirs.pid} 64\n",
    )
    agent = start_agent(stub, tmp_path, agents)
    seen = processes(sample_with(agent, {mine.pid, theirs.pid}))
    assert seen[theirs.pid]["user"] == OTHER_USER

    def ask(**fields: Any) -> dict[str, Any]:
        agent.send({"type": "signal", "id": "k", **fields})
        return agent.read_until(lambda m: m.get("id") == "k")

    refused = ask(pid=theirs.pid, signal="KILL")
    assert (refused["type"], refused["code"]) == ("error", "not_yours")
    assert OTHER_USER in refused["message"]
    assert ask(pid=os.getpid(), signal="TERM")["code"] == "not_gpu_process"
    assert ask(pid=mine.pid, signal="HUP")["code"] == "bad_argument"
    wrong_start = ask(pid=mine.pid, signal="TERM", started=seen[mine.pid]["started"] - 60)
    assert wrong_start["code"] == "no_process"
    assert mine.poll() is None and theirs.poll() is None

    done = ask(pid=mine.pid, signal="TERM", started=seen[mine.pid]["started"])
    assert (done["type"], done["pid"], done["signal"]) == ("ok", mine.pid, "TERM")
    assert_reader_keeps_all(SignalReply, done, "signal's reply")  # the login side's reading
    assert mine.wait(10) == -15
    assert theirs.poll() is None


def test_a_read_only_agent_refuses_signal(
    nvml_lib_dir: Path, tmp_path: Path, agents: list[AgentProcess], procs: Start
) -> None:
    mine = procs("sleep", "306")
    stub = NvmlStub(nvml_lib_dir, tmp_path / "nvml.conf", f"count 1\nproc 0 {mine.pid} 64\n")
    agent = start_agent(stub, tmp_path, agents, "--read-only")
    sample_with(agent, {mine.pid})
    agent.send({"type": "signal", "id": 1, "pid": mine.pid, "signal": "KILL"})
    reply = agent.read_until(lambda m: m.get("id") == 1)
    assert reply["code"] == "read_only"
    assert mine.poll() is None


def test_parents_are_walked_again_when_the_pids_change_or_after_a_while(procs: Start) -> None:
    """The ancestors' chain is kept for ``PARENTS_EVERY_S`` while the GPU pids stay the same
    (walking it read 4-5 /proc files per sample), and walked again at once for other pids."""
    from gpuctl.node.readers.procs import PARENTS_EVERY_S, ProcessNames

    launcher = procs("sh", "-c", "sleep 306 & wait")
    kid = wait_until(lambda: descendants(launcher.pid))[0]
    try:
        lone = procs("sleep", "307")
        now = [1000.0]
        names = ProcessNames(clock=lambda: now[0])
        assert launcher.pid in {p["pid"] for p in names.parents([kid])}
        names.forget_except([kid])
        launcher.kill()  # the chain changes: the kid goes to a new parent
        launcher.wait(10)
        wait_until(lambda: read_ppid(kid) != launcher.pid)
        now[0] += PARENTS_EVERY_S / 2  # the same pids, soon after: the chain as it was walked
        assert launcher.pid in {p["pid"] for p in names.parents([kid])}
        names.forget_except([kid])
        # other pids: walked at once (the lone sleep's parent is this test's process)
        assert {p["pid"] for p in names.parents([kid, lone.pid])} >= {os.getpid()}
        names.forget_except([kid, lone.pid])
        now[0] += PARENTS_EVERY_S  # and after a while, the same pids are walked again too
        assert launcher.pid not in {p["pid"] for p in names.parents([kid])}
    finally:  # orphaned by the kill: not among the processes the fixture ends
        os.kill(kid, signal.SIGKILL)


def read_ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_a_gpu_process_stat_file_is_opened_once_while_it_runs(
    procs: Start, monkeypatch: Any
) -> None:
    """/proc/PID/stat is read through a descriptor kept open while the pid stays a GPU process
    (open, read and close cost 0.07 ms against 0.04 ms a read on an H100's VM); once the process
    is gone its figures are null, not the last ones, and the descriptor is closed."""
    from gpuctl.node import proc
    from gpuctl.node.readers import procs as procs_module

    sleeper = procs("sleep", "308")
    # exec'd: mid-exec its stat showed an RSS of 0 (1 run in 12 here)
    wait_until(lambda: Path(f"/proc/{sleeper.pid}/cmdline").read_bytes().startswith(b"sleep"))
    path = f"/proc/{sleeper.pid}/stat"
    opened: list[str] = []
    real_os_open, real_open = os.open, open

    def os_open(name: Any, *args: Any, **kwargs: Any) -> int:
        opened.append(str(name))
        return real_os_open(name, *args, **kwargs)

    def builtin_open(name: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(str(name))
        return real_open(name, *args, **kwargs)

    names = procs_module.ProcessNames()
    monkeypatch.setattr(os, "open", os_open)
    for module in (proc, procs_module):  # the file object the reader used before
        monkeypatch.setattr(module, "open", builtin_open, raising=False)
    for _ in range(3):
        seen: set[int] = set()
        row = names.rows({sleeper.pid: None}, seen)[0]
        assert row["ppid"] == os.getpid() and row["rss"]
        names.forget_except(seen)
    assert [name for name in opened if name.endswith("/stat")] == [path]
    sleeper.kill()
    sleeper.wait(10)
    seen = set()
    row = names.rows({sleeper.pid: None}, seen)[0]
    assert (row["ppid"], row["rss"], row["started"]) == (None, None, None)
    names.forget_except(set())
    names.close()


def test_the_agent_tells_each_gpu_processs_slurm_job_from_its_cgroup(
    nvml_lib_dir: Path, tmp_path: Path, agents: list[AgentProcess], procs: Start
) -> None:
    """Three real ``sleep``s: one in a cgroup v1 folder laid out as Slurm's
    (``/slurm/uid_U/job_777/step_0/task_0``), one in a v2 one (``slurmstepd.scope/job_888/...``),
    one in none; the Python 3.6 agent sends each one's job (none for the third)."""
    from gpuctl_tests.harness.cgroups import V1, V2, moved_into, slurm_v1, slurm_v2

    v1, v2, plain = procs("sleep", "311"), procs("sleep", "312"), procs("sleep", "313")
    with moved_into(V1, slurm_v1(777), v1.pid), moved_into(V2, slurm_v2(888), v2.pid):
        stub = NvmlStub(
            nvml_lib_dir,
            tmp_path / "nvml.conf",
            f"count 2\nproc 0 {v1.pid} 64\nproc 1 {v2.pid} 64\nproc 1 {plain.pid} 64\n",
        )
        agent = start_agent(stub, tmp_path, agents)
        seen = processes(sample_with(agent, {v1.pid, v2.pid, plain.pid}))
        assert (seen[v1.pid]["gpu"], seen[v1.pid]["slurm_job"]) == (0, "777")
        assert (seen[v2.pid]["gpu"], seen[v2.pid]["slurm_job"]) == (1, "888")
        assert "slurm_job" not in seen[plain.pid]  # null: left out on the wire
