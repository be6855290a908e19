"""Read-only mode end to end: every mutating command refuses, and so do the agents.

Sources of read-only: the top-level ``gpuctl --read-only``, ``GPUCTL_READ_ONLY=1``, a command's
own ``--read-only`` and ``read_only = true`` in the config. The CLI refuses in one line before
anything starts; agents started with ``--read-only`` (which the links pass when the mode is on)
refuse ``stress_*``/``accept_*`` requests with error code ``read_only`` whatever asks.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from gpuctl import audit
from gpuctl.config import load_config
from gpuctl.fleet.build import fleet_from_config
from gpuctl.fleet.fleet import simulated_fleet
from gpuctl.fleet.links import LocalLink
from gpuctl.fleet.ssh import agent_script
from gpuctl_tests.helpers import AgentProcess, node_env

# real burners (or stops of every burner of this user here): these modules share one worker
pytestmark = pytest.mark.burners

# (argv after gpuctl, extra env, config text or None, what the refusal names, how to lift it)
CASES = [
    (["--read-only", "submit", "job.py:f"], {}, None, "submitting jobs", "run without it"),
    (["submit", "job.py:f"], {"GPUCTL_READ_ONLY": "1"}, None, "submitting jobs", "unset it"),
    (["submit", "job.py:f"], {}, "read_only = true\n", "submitting jobs", "set it to false"),
    (["--read-only", "cancel", "0123"], {}, None, "cancelling jobs", "run without it"),
    (["cancel", "0123"], {}, "read_only = true\n", "cancelling jobs", "set it to false"),
    (["--read-only", "stress", "start", "--demo"], {}, None, "stress is", "without it"),
    (["stress", "start", "--demo", "--read-only"], {}, None, "stress is", "without it"),
    (["stress", "stop"], {"GPUCTL_READ_ONLY": "yes"}, None, "stress is", "unset it"),
    (["submit", "job.py:f"], {"GPUCTL_READ_ONLY": "ture"}, None, "submitting jobs", "unset it"),
    (
        ["stress", "run", "--device", "cpu"],
        {},
        "read_only = true\n",
        "stress is",
        "set it to false",
    ),
    (["--read-only", "accept", "--local"], {}, None, "acceptance suite", "run without it"),
    (["accept", "--local"], {}, "read_only = true\n", "acceptance suite", "set it to false"),
]


def _run(tmp: Path, argv: list[str], env: dict[str, str], config: str | None) -> Any:
    full_env = node_env({"GPUCTL_STATE_DIR": str(tmp / "state"), **env})
    full_env.pop("GPUCTL_CONFIG", None)
    cmd = [sys.executable, "-m", "gpuctl"]
    if config is not None:
        (tmp / "config.toml").write_text(config)
        cmd += ["--config", str(tmp / "config.toml")]
    return subprocess.run(
        [*cmd, *argv], capture_output=True, text=True, timeout=60, env=full_env, cwd=tmp
    )


def test_every_mutating_command_refuses_in_one_line(tmp_path: Path) -> None:
    def one(i: int) -> Any:
        case_dir = tmp_path / str(i)
        case_dir.mkdir()
        (case_dir / "job.py").write_text("def f():\n    return 1\n")
        argv, env, config, _, _ = CASES[i]
        return _run(case_dir, argv, env, config)

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(one, range(len(CASES))))
    for (argv, env, config, what, lift), r in zip(CASES, results, strict=True):
        where = f"{argv} {env} {config!r}"
        assert r.returncode == 2, (where, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1, (where, r.stderr)
        assert lines[0].startswith("gpuctl: read-only mode: "), where
        assert "is disabled" in lines[0], where
        assert what in lines[0] and lift in lines[0], (where, lines[0])
        assert r.stdout == "", where
    # refused before anything started: the state folder holds gpuctl's log and the audit
    # log's refusal (not the demo's: it writes none), no job store, no history, no job folder
    for i, (argv, *_) in enumerate(CASES):
        state = tmp_path / str(i) / "state"
        demo = "--demo" in argv
        kept = {"logs"} if demo else {"logs", audit.AUDIT_FILE}
        assert {p.name for p in state.iterdir()} == kept, CASES[i]
        if not demo:
            (entry,) = (json.loads(line) for line in (state / audit.AUDIT_FILE).open())
            words = [w for w in argv if not w.startswith("-")][:2]
            assert entry["action"] in ("_".join(words), words[0]), (argv, entry)
            assert entry["outcome"].startswith("refused: read-only mode: "), entry


def test_a_broken_config_stops_mutating_commands_that_do_not_read_it(tmp_path: Path) -> None:
    """``submit --target local`` does not need the config, but the config may say read-only:
    when it cannot be read, the command refuses rather than guess."""
    (tmp_path / "job.py").write_text("def f():\n    return 1\n")
    r = _run(tmp_path, ["submit", "job.py:f"], {}, "read_only = true\nread_only = false\n")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("gpuctl: ") and "config.toml" in r.stderr
    assert len(r.stderr.splitlines()) == 1
    assert {p.name for p in (tmp_path / "state").iterdir()} <= {"logs"}


def test_reading_commands_still_work_in_read_only_mode(tmp_path: Path) -> None:
    r = _run(tmp_path, ["--read-only", "jobs", "--json"], {}, None)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["jobs"] == []
    r = _run(tmp_path, ["config", "check"], {}, "read_only = true\n")
    assert r.returncode == 0, r.stderr


def test_read_only_env_off_values_do_not_refuse(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text("def f():\n    return 41 + 1\n")
    r = _run(tmp_path, ["submit", "job.py:f", "--wait"], {"GPUCTL_READ_ONLY": "0"}, None)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "42"


def test_a_read_only_agent_refuses_mutating_requests() -> None:
    agent = AgentProcess.start("--simulate", "2:H100", "--interval", "0.2", "--read-only")
    try:
        hello = agent.read()
        assert hello["type"] == "hello" and hello["read_only"] is True
        for n, kind in enumerate(("stress_start", "accept_start", "stress_stop")):
            agent.send({"type": kind, "id": n, "gpus": [0], "duration": 5})
            reply = agent.read_until(lambda m, n=n: m.get("id") == n)
            assert reply["type"] == "error" and reply["code"] == "read_only", reply
            assert kind in reply["message"]
        # reading and simulating stay allowed
        agent.send({"type": "simulate", "id": "s", "action": "load", "gpus": [0], "load": 1.0})
        assert agent.read_until(lambda m: m.get("id") == "s")["type"] == "ok"
        agent.send({"type": "snapshot", "id": "snap"})
        snap = agent.read_until(lambda m: m.get("id") == "snap")
        assert snap["type"] == "sample" and len(snap["gpus"]) == 2
        # no burner child was started
        kids = Path(f"/proc/{agent.proc.pid}/task/{agent.proc.pid}/children").read_text()
        assert kids.split() == []
    finally:
        assert agent.close() == 0


def test_an_agent_without_read_only_does_not_refuse() -> None:
    agent = AgentProcess.start("--simulate", "1", "--interval", "0.2")
    try:
        assert agent.read()["read_only"] is False
        agent.send({"type": "stress_start", "id": 1, "gpus": [0], "duration": 1})
        reply = agent.read_until(lambda m: m.get("id") == 1)
        assert reply.get("code") != "read_only", reply
        agent.send({"type": "stress_stop", "id": 2})
        agent.read_until(lambda m: m.get("id") == 2)
    finally:
        agent.close()


def test_links_pass_read_only_to_their_agents() -> None:
    assert "--read-only" in LocalLink(read_only=True).argv()
    assert "--read-only" not in LocalLink().argv()
    config = load_config_text("[clusters.c]\nnodes = ['n1']\nvia = 'ssh'\n")
    (node,) = config.nodes()
    assert "--read-only" in agent_script(node, "/b", "x.pyz", read_only=True)
    assert "--read-only" not in agent_script(node, "/b", "x.pyz")


def load_config_text(text: str) -> Any:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "c.toml"
        p.write_text(text)
        return load_config(str(p))


@pytest.mark.parametrize("flag", [None, True])
async def test_fleet_from_a_read_only_config_starts_read_only_agents(
    tmp_path: Path, flag: bool | None
) -> None:
    text = "[clusters.sim]\nnodes = ['s1']\nvia = 'local'\nsimulate = '1'\ninterval = 0.2\n"
    if flag is None:
        text = "read_only = true\n" + text
    config = load_config_text(text)
    fleet = fleet_from_config(config, read_only=flag)
    await fleet.start()
    try:
        await fleet.wait_settled(20)
        reply = await fleet.request("s1", {"type": "stress_start", "gpus": [0], "duration": 1})
        assert reply["type"] == "error" and reply["code"] == "read_only", reply
    finally:
        await fleet.stop()


async def test_read_only_demo_fleet_refuses_stress() -> None:
    fleet = simulated_fleet([("d1", "1")], interval=0.2, read_only=True)
    await fleet.start()
    try:
        await fleet.wait_settled(10)
        reply = await fleet.request("d1", {"type": "accept_start", "quick": True})
        assert reply["code"] == "read_only", reply
    finally:
        await fleet.stop()


def test_the_mutating_table_names_real_commands() -> None:
    """A renamed command function must not silently leave read-only mode."""
    import importlib

    from gpuctl.cli.main import MUTATING_FUNCS, mutation

    for module, name in MUTATING_FUNCS:
        func = getattr(importlib.import_module(module), name)
        assert mutation(func) is not None, (module, name)
    from gpuctl.cli import accept, jobs, status

    assert mutation(accept.run) and mutation(jobs.run_submit) and mutation(jobs.run_cancel)
    assert mutation(status.run) is None and mutation(accept.run_history) is None


async def test_ssh_agents_of_a_read_only_config_refuse_stress(
    ssh_cluster: Any, tmp_path: Path
) -> None:
    ssh_cluster.start_node("r1", simulate="1")
    cfg = ssh_cluster.write_config(tmp_path / "c.toml", simulate=1, interval=0.3)
    cfg.write_text("read_only = true\n" + cfg.read_text())
    fleet = fleet_from_config(load_config(str(cfg)))
    await fleet.start()
    try:
        await fleet.wait_settled(20)
        info = fleet.snapshot("r1").info
        assert info is not None
        reply = await fleet.request("r1", {"type": "stress_start", "gpus": [0], "duration": 1})
        assert reply["type"] == "error" and reply["code"] == "read_only", reply
    finally:
        await fleet.stop()


def test_a_command_reads_its_config_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The read-only decision, the command's config and its fleet come from one read of the
    file (the command's ``gpuctl.context.Context``), installed as the process's session."""
    from gpuctl import context
    from gpuctl.cli.common import build_fleet, load_user_config, session
    from gpuctl.cli.main import build_parser, read_only_source
    from gpuctl.config import files

    path = tmp_path / "c.toml"
    path.write_text("read_only = true\n[fleet]\nstale_after = 7\n")
    reads: list[str] = []
    real = files._read

    def counting(name: str) -> str:
        reads.append(name)
        return real(name)

    monkeypatch.setattr(files, "_read", counting)
    args = build_parser().parse_args(["watch", "--config", str(path)])
    assert read_only_source(args) == f"{path} sets read_only = true: set it to false there"
    assert load_user_config(args).fleet.stale_after == 7.0
    fleet = build_fleet(args)
    assert fleet.stale_after == 7.0 and fleet.nodes
    assert reads == [str(path)]
    assert context.current() is session(args)
