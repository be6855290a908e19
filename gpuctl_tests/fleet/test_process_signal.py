"""Signalling GPU processes from the login side (``control.signal_process``): a real local agent
over the stand-in NVML, real ``sleep`` processes of this user and of a second Unix user."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from gpuctl import readonly, service
from gpuctl.fleet import control
from gpuctl.fleet.fleet import Fleet
from gpuctl.fleet.links import LocalLink
from gpuctl.node.readers.procs import user_of
from gpuctl_tests.fleet.test_fleet_local import wait_for_state
from gpuctl_tests.node.nvml_stub import CONFIG_ENV, NvmlStub
from gpuctl_tests.processes import OTHER_USER, Start, as_user, other_user


def stub_fleet(
    nvml_lib_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str, **kw: bool
) -> Fleet:
    """One local node whose agent (a subprocess) reads the stub scripted with ``script``."""
    stub = NvmlStub(nvml_lib_dir, tmp_path / "nvml.conf", script)
    monkeypatch.setenv("LD_LIBRARY_PATH", str(stub.lib_dir))
    monkeypatch.setenv(CONFIG_ENV, str(stub.config))
    monkeypatch.delenv(readonly.READ_ONLY_ENV, raising=False)
    link = LocalLink(python=sys.executable, interval=0.2, **kw)
    return Fleet({"n1": link})


async def test_own_process_ends_and_another_users_is_refused_on_both_sides(
    nvml_lib_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, procs: Start
) -> None:
    other = other_user()
    mine = procs("sleep", "310")
    theirs = procs(*as_user(other), "sleep", "311")
    script = f"count 2\nproc 0 {mine.pid} 100\nproc 1 {theirs.pid} 100\n"
    fleet = stub_fleet(nvml_lib_dir, tmp_path, monkeypatch, script)
    await fleet.start()
    try:

        def both(snaps: list) -> bool:  # type: ignore[type-arg]
            pids = {p.pid for g in snaps[0].gpus for p in g.processes}
            return {mine.pid, theirs.pid} <= pids

        await wait_for_state(fleet, both)
        snap = fleet.snapshot("n1")
        seen = control.find_process(snap, theirs.pid)
        assert seen is not None and seen.user == OTHER_USER
        with pytest.raises(control.ProcessError) as refused:
            await control.signal_process(fleet, "n1", theirs.pid, "KILL", read_only=False)
        assert refused.value.reason == "not_yours"
        assert f"belongs to {OTHER_USER}" in str(refused.value)
        # Past the login side's check (a process it thinks is ours), the agent refuses too.
        monkeypatch.setattr(service, "user_name", lambda: OTHER_USER)
        with pytest.raises(control.ProcessError) as agent_refused:
            await control.signal_process(fleet, "n1", theirs.pid, "KILL", read_only=False)
        assert agent_refused.value.reason == "not_yours"
        assert user_of(os.geteuid()) in str(agent_refused.value)
        monkeypatch.undo()
        assert theirs.poll() is None

        with pytest.raises(control.ProcessError) as not_gpu:
            await control.signal_process(fleet, "n1", os.getpid(), read_only=False)
        assert not_gpu.value.reason == "not_gpu_process"
        with pytest.raises(service.ReadOnlyError):
            await control.signal_process(fleet, "n1", mine.pid, read_only=True)
        assert mine.poll() is None

        reply = await control.signal_process(fleet, "n1", mine.pid, "KILL", read_only=False)
        assert (reply.get("pid"), reply.get("signal")) == (mine.pid, "KILL")
        assert mine.wait(10) == -9
        assert theirs.poll() is None
    finally:
        await fleet.stop()


async def test_a_read_only_fleet_refuses_before_asking(
    nvml_lib_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, procs: Start
) -> None:
    mine = procs("sleep", "312")
    fleet = stub_fleet(
        nvml_lib_dir, tmp_path, monkeypatch, f"count 1\nproc 0 {mine.pid} 100\n", read_only=True
    )
    await fleet.start()
    try:
        await wait_for_state(fleet, lambda s: bool(s[0].gpus and s[0].gpus[0].processes))
        with pytest.raises(service.ReadOnlyError) as refused:
            await control.signal_process(fleet, "n1", mine.pid)
        assert "signalling processes is disabled" in str(refused.value)
        assert mine.poll() is None
    finally:
        await fleet.stop()
