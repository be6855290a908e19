"""The node bundle: reproducible, named by content, runs the agent under Python 3.6."""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import gpuctl.bundle
from gpuctl.bundle import bundle_bytes, bundle_name, write_bundle
from gpuctl.node import jobfiles
from gpuctl_tests.helpers import REPO, AgentProcess, old_python


def bare_env() -> dict[str, str]:
    """No PYTHONPATH: whatever the agent imports must come from the bundle itself."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    return env


def test_bundle_is_reproducible_and_named_by_its_hash(tmp_path: Path) -> None:
    digest, data = bundle_bytes()
    assert bundle_bytes() == (digest, data)
    assert re.fullmatch(r"[0-9a-f]{16}", digest)
    assert hashlib.sha256(data).hexdigest()[:16] == digest
    first = write_bundle(tmp_path / "a")
    second = write_bundle(tmp_path / "b")
    assert first.name == second.name == bundle_name(digest) == f"gpuctl-node-{digest}.pyz"
    assert first.read_bytes() == second.read_bytes() == data
    assert write_bundle(tmp_path / "a") == first  # writing again is a no-op


def test_bundle_holds_the_node_side_only() -> None:
    _, data = bundle_bytes()
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        names = zf.namelist()
    assert "__main__.py" in names
    for needed in (
        "gpuctl/node/agent.py",
        "gpuctl/node/protocol.py",
        "gpuctl/node/readers/nvml.py",
        "gpuctl/node/readers/smi.py",
        "gpuctl/node/readers/sim.py",
        "gpuctl/node/supervisor.py",
        # the supervisor's modules: ``gpuctl-node-<hash>.pyz supervisor JOBDIR`` imports them
        *(f"gpuctl/node/{m}.py" for m in jobfiles.RUNNER_MODULES),
    ):
        assert needed in names
    for name in names:
        assert (
            name == "__main__.py"
            or name == "gpuctl/__init__.py"
            or name.startswith(("gpuctl/node/", "gpuctl/workloads/"))
        ), name
        assert "__pycache__" not in name


def test_hash_follows_node_code_and_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = tmp_path / "gpuctl"
    shutil.copytree(gpuctl.bundle.PACKAGE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(gpuctl.bundle, "PACKAGE_DIR", copy)
    before, _ = bundle_bytes()
    cli = copy / "cli" / "main.py"
    cli.write_text(cli.read_text() + "\n# login-side change\n")
    assert bundle_bytes()[0] == before
    agent = copy / "node" / "agent.py"
    agent.write_text(agent.read_text() + "\n# node-side change\n")
    assert bundle_bytes()[0] != before


@pytest.mark.parametrize(
    ("spec", "count", "name"),
    [
        ("4", 4, "NVIDIA H100 80GB HBM3"),
        ("2:A100", 2, "NVIDIA A100-SXM4-80GB"),
    ],
)
def test_bundle_agent_streams_under_python36(
    tmp_path: Path, agents: list[AgentProcess], spec: str, count: int, name: str
) -> None:
    python = old_python("3.6.15")
    bundle = write_bundle(tmp_path)
    agent = AgentProcess(
        [python, str(bundle), "agent", "--simulate", spec, "--interval", "0.1"], env=bare_env()
    )
    agents.append(agent)
    hello = agent.read()
    assert (hello["type"], hello["python"], hello["reader"]) == ("hello", "3.6.15", "simulated")
    assert [g["name"] for g in hello["gpus"]] == [name] * count
    samples = [agent.read_until(lambda m: m["type"] == "sample") for _ in range(3)]
    assert [s["seq"] for s in samples] == [0, 1, 2]
    assert all(len(s["gpus"]) == count for s in samples)
    agent.send({"type": "shutdown"})
    agent.read_until(lambda m: m["type"] == "bye")
    assert agent.proc.wait(10) == 0


def test_agent_bundle_command_writes_it(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gpuctl", "agent-bundle", str(tmp_path / "b")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        check=True,
    )
    path = Path(out.stdout.strip())
    assert path.exists() and path.name == bundle_name(bundle_bytes()[0])


def test_node_code_needs_nothing_newer_than_python36() -> None:
    """vermin's static check, plus a real Python 3.6 compiling every node-side file."""
    # vermin from this interpreter (the test extra), never whatever PATH happens to hold
    node = REPO / "gpuctl" / "node"
    vermin = [sys.executable, "-c", "import sys; from vermin import main; sys.exit(main())"]
    result = subprocess.run(
        # --eval-annotations: a 3.6 module's annotations are evaluated when it is imported
        [*vermin, "-q", "--no-tips", "--eval-annotations", "--violations", "-t=3.6-", str(node)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    python = old_python("3.6.15")
    files = [str(p) for p in sorted(node.rglob("*.py"))]
    compiled = subprocess.run(
        [
            python,
            "-c",
            "import sys, ast\nfor f in sys.argv[1:]: ast.parse(open(f, 'rb').read(), f)",
            *files,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert compiled.returncode == 0, compiled.stderr
