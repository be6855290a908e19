"""The service layer: one decision on read-only mode for the Python API as for the CLI and the
TUI, and whose processes run on a GPU. Real fleets (simulated agents in threads) where a node
is needed; the jobs API's refusals are in ``gpuctl_tests/jobs/test_read_only.py``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuctl import context, readonly, service
from gpuctl.accept.run import AcceptOptions, start_fleet_run, start_local_run
from gpuctl.accept.slurm import SlurmJobSpec, start_slurm_run
from gpuctl.config import ConfigError
from gpuctl.context import Context
from gpuctl.core.model import GpuProcess, GpuSample, NodeSnapshot, NodeState
from gpuctl.fleet import control
from gpuctl.fleet.fleet import Fleet, simulated_fleet
from gpuctl_tests.helpers import node_env

ENV_LINE = "read-only mode: stress is disabled (GPUCTL_READ_ONLY is set: unset it)"


@pytest.fixture
def config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``$GPUCTL_CONFIG`` names a file of the test's own (empty until written)."""
    path = tmp_path / "config.toml"
    path.write_text("")
    monkeypatch.setenv("GPUCTL_CONFIG", str(path))
    return path


def _write(path: Path, text: str) -> None:
    path.write_text(text)


def _listing(path: Path) -> list[Path]:
    return list(path.iterdir())


# -- the decision ------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["1", "yes", "ture", " On "])
def test_the_environment_turns_it_on(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(readonly.READ_ONLY_ENV, value)
    with pytest.raises(service.ReadOnlyError) as e:
        service.check("stress")
    assert str(e.value) == ENV_LINE
    assert (e.value.what, e.value.why) == ("stress", "GPUCTL_READ_ONLY is set: unset it")


@pytest.mark.parametrize("value", ["", "0", "false", "No", "off"])
def test_off_values_do_not(value: str, monkeypatch: pytest.MonkeyPatch, config_file: Path) -> None:
    monkeypatch.setenv(readonly.READ_ONLY_ENV, value)
    service.check("stress")  # nothing raised


def test_the_config_turns_it_on_and_a_broken_one_refuses(config_file: Path) -> None:
    config_file.write_text("read_only = true\n")
    with pytest.raises(service.ReadOnlyError, match="sets read_only = true: set it to false"):
        service.check("submitting jobs")
    config_file.write_text("read_only = true\nread_only = false\n")  # cannot be read
    context.install(None)  # a new session reads it
    with pytest.raises(ConfigError):
        service.check("submitting jobs")
    with pytest.raises(ConfigError):  # and keeps refusing: nothing is kept of a broken one
        service.check("submitting jobs")


@pytest.mark.parametrize("start", [True, False])
def test_a_session_keeps_the_mode_it_started_with_when_the_file_changes(
    start: bool, config_file: Path
) -> None:
    """The config is read once per session (``gpuctl.context``): rewriting the file does not
    turn read-only mode on or off under a running session, nor does breaking it; the next
    session reads the file as it is then."""
    config_file.write_text(f"read_only = {'true' if start else 'false'}\n")

    def refused() -> bool:
        return service.refusal("stress") is not None

    assert refused() is start
    config_file.write_text(f"read_only = {'false' if start else 'true'}\n")
    assert refused() is start
    config_file.write_text("read_only = [\n")  # broken: this session does not look
    assert refused() is start
    config_file.write_text(f"read_only = {'false' if start else 'true'}\n")
    context.install(None)  # a new session
    assert refused() is not start


def test_a_context_decides_once_and_its_guard_keeps_the_decision(
    config_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config_file.write_text("read_only = true\n")
    session = Context.load()
    assert session.read_only_why == f"{config_file} sets read_only = true: set it to false there"
    config_file.write_text("")
    monkeypatch.setenv(readonly.READ_ONLY_ENV, "1")  # later changes reach no built context
    assert str(service.Guard(context=session).refusal("stress")).endswith("set it to false there)")
    assert Context.load(flag=False).read_only_why != session.read_only_why
    monkeypatch.delenv(readonly.READ_ONLY_ENV)
    assert Context.load().read_only is False
    assert service.refusal("stress", context=session) is not None
    assert service.refusal("stress", context=Context.load()) is None


def test_the_callers_decision_wins_over_what_it_would_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``read_only=False``: the caller decided (the CLI before the command, the TUI at start)
    and nothing is read again; ``True`` refuses with the caller's words."""
    monkeypatch.setenv(readonly.READ_ONLY_ENV, "1")
    service.check("stress", read_only=False)
    monkeypatch.delenv(readonly.READ_ONLY_ENV)
    with pytest.raises(service.ReadOnlyError, match=r"\(started read-only\)$"):
        service.check("stress", read_only=True, why="started read-only")


# -- the Python API refuses ----------------------------------------------------------------------
async def test_set_stress_refuses_on_a_read_only_fleet_before_asking_the_agent() -> None:
    fleet = simulated_fleet([("n1", "2")], interval=0.2, read_only=True)
    requests: list[str] = []
    real = fleet.request

    async def counting(name: str, msg: dict[str, object], timeout: float = 10.0) -> object:
        requests.append(str(msg.get("type")))
        return await real(name, msg, timeout)

    fleet.request = counting  # type: ignore[assignment,method-assign]
    await fleet.start()
    try:
        await fleet.wait_settled(10)
        for on in (True, False):
            with pytest.raises(service.ReadOnlyError, match="fleet's agents run with --read-only"):
                await control.set_stress(fleet, "n1", [0], on)
            # the caller's "not read-only" does not lift the fleet's
            with pytest.raises(service.ReadOnlyError):
                await control.set_stress(fleet, "n1", [0], on, read_only=False)
        with pytest.raises(service.ReadOnlyError):
            await control.stop_burners(fleet, "n1", any_owner=True)
        with pytest.raises(service.ReadOnlyError, match="the acceptance suite is disabled"):
            start_fleet_run(fleet, ["n1"], AcceptOptions(quick=True, device="cpu"))
        assert requests == []  # refused here, not by the agent
        assert control.burning(fleet) == []
    finally:
        await fleet.stop()


async def test_set_stress_refuses_in_read_only_mode_of_env_and_config(
    monkeypatch: pytest.MonkeyPatch, config_file: Path
) -> None:
    fleet = simulated_fleet([("n1", "1")], interval=0.2)
    await fleet.start()
    try:
        await fleet.wait_settled(10)
        monkeypatch.setenv(readonly.READ_ONLY_ENV, "1")
        with pytest.raises(service.ReadOnlyError) as e:
            await control.set_stress(fleet, "n1", [0], True)
        assert str(e.value) == ENV_LINE
        monkeypatch.delenv(readonly.READ_ONLY_ENV)
        _write(config_file, "read_only = true\n")
        context.install(None)  # each session decides once: a new one for each setting
        with pytest.raises(service.ReadOnlyError, match=str(config_file)):
            await control.set_stress(fleet, "n1", [0], True)
        with pytest.raises(service.ReadOnlyError):
            start_fleet_run(fleet, ["n1"], AcceptOptions(quick=True, device="cpu"))
        assert control.burning(fleet) == []
        _write(config_file, "read_only = false\n")
        context.install(None)
        reply = await control.set_stress(fleet, "n1", [0], True, duration=30)
        assert reply["started"] == [0]
        burn = control.burn_of(fleet.snapshot("n1"), 0) or {}
        assert burn["owner"] == service.me().to_wire()
        await control.set_stress(fleet, "n1", [0], False)
    finally:
        await fleet.stop()


async def test_local_and_slurm_acceptance_runs_refuse_before_starting_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(readonly.READ_ONLY_ENV, "1")
    options = AcceptOptions(quick=True, device="cpu")
    with pytest.raises(service.ReadOnlyError, match="the acceptance suite is disabled"):
        await start_local_run(options, report_dir=tmp_path / "reports")
    with pytest.raises(service.ReadOnlyError):
        await start_slurm_run(options, SlurmJobSpec(nnodes=1), job_dir=tmp_path / "jobs")
    assert _listing(tmp_path) == []  # no report folder, no job folder, no sbatch


# -- owners ------------------------------------------------------------------------------------
def test_owner_is_this_user_and_host_with_a_session_per_process() -> None:
    me = service.me()
    assert me is service.me() and me.user == service.user_name()
    assert service.Owner.from_wire(me.to_wire()) == me
    assert service.owner_text(me.to_wire()) == f"{me.user}@{me.host}"
    assert service.owner_text({"user": "x"}) == "an unknown owner"
    assert service.owner_text(None) == "an unknown owner"
    probe = "from gpuctl import service; print(service.me().session)"
    sessions = {
        subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, env=node_env()
        ).stdout.strip()
        for _ in range(2)
    }
    assert len(sessions) == 2 and me.session not in sessions


def test_stop_request_limits_to_this_user_unless_any_owner() -> None:
    assert service.stop_request([1]) == {
        "type": "stress_stop",
        "gpus": [1],
        "others": True,
        "owner_user": service.user_name(),
    }
    assert "owner_user" not in service.stop_request(None, any_owner=True)
    assert json.dumps(service.stop_request(None))  # a protocol line


# -- other users' processes ---------------------------------------------------------------------
def _snap(*gpus: list[str | None], burning: tuple[int, ...] = ()) -> NodeSnapshot:
    samples = tuple(
        GpuSample(
            index=i,
            t=0.0,
            processes=tuple(GpuProcess(100 + k, u, "python", None) for k, u in enumerate(users)),
        )
        for i, users in enumerate(gpus)
    )
    return NodeSnapshot(
        "gpu03",
        NodeState.LIVE,
        gpus=samples,
        annotations={g: {"burn": {"state": "running"}} for g in burning},
    )


def test_others_on_names_users_and_counts_and_leaves_the_callers_own_out() -> None:
    snap = _snap(["me", "me"], ["alice", "me", "alice"], [None, "bob", "alice"], ["bob"])
    found = service.others_on(snap, user="me")
    assert [o.line() for o in found] == [
        "gpu03 GPU 1 runs processes of alice (2)",
        "gpu03 GPU 2 runs processes of alice (1), an unknown user (1), bob (1)",
        "gpu03 GPU 3 runs processes of bob (1)",
    ]
    assert service.others_summary(found) == (
        "3 GPUs run processes of other users: alice (3), bob (2), an unknown user (1)"
    )
    assert service.others_summary(found[:1]) == found[0].line()
    assert service.others_summary([]) == ""
    assert [o.gpu for o in service.others_on(snap, [0, 3], user="me")] == [3]
    # a GPU already burning is not started again: nothing to ask about it
    assert [o.gpu for o in service.others_on(_snap(["bob"], burning=(0,)), user="me")] == []


def test_others_on_defaults_to_this_processes_user() -> None:
    snap = _snap([service.user_name()], ["someone-else"])
    assert [o.gpu for o in service.others_on(snap)] == [1]


def test_a_fleet_of_links_without_read_only_is_not_read_only() -> None:
    from gpuctl.fleet.fixed_links import FailingLink

    assert not service.fleet_read_only(Fleet({"x": FailingLink("refused", "no")}))
    assert service.fleet_read_only(simulated_fleet([("a", "1")], read_only=True))


def test_the_environment_switch_is_read_in_one_module() -> None:
    """One decision, one module (DESIGN.md): no other login-side module names the variable
    (documentation aside), so none can decide read-only mode by itself."""
    import ast

    from gpuctl_tests.helpers import REPO

    def names_it(path: Path) -> bool:
        tree = ast.parse(path.read_text(), str(path))
        return any(
            isinstance(n, ast.Constant) and n.value == readonly.READ_ONLY_ENV
            for n in ast.walk(tree)
        )

    home = REPO / "gpuctl" / "readonly.py"
    assert names_it(home)  # the check can see it where it is
    others = [
        str(p.relative_to(REPO))
        for p in sorted((REPO / "gpuctl").rglob("*.py"))
        if p != home and names_it(p)
    ]
    assert others == []
