"""Every ``--json`` output is one object with ``version`` and ``generated_at`` beside its data,
so that scripts can rely on it while gpuctl evolves."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuctl import __version__
from gpuctl.cli.common import JSON_VERSION
from gpuctl_tests.helpers import node_env

# command line -> the key holding its data
COMMANDS = [
    (["status", "--demo", "--json"], "nodes"),
    (["jobs", "--json"], "jobs"),
    (["config", "check", "--json"], "nodes"),
    (["accept", "history", "--json"], "nodes"),
    (["stress", "status", "--demo", "--json"], "burns"),
    (["stress", "run", "--device", "cpu", "--duration", "1", "--size", "64", "--json"], "devices"),
]


@pytest.mark.parametrize(("argv", "key"), COMMANDS, ids=[" ".join(c[0][:2]) for c in COMMANDS])
def test_every_json_output_is_an_object_with_version_and_time(
    argv: list[str], key: str, tmp_path: Path
) -> None:
    env = node_env({"GPUCTL_STATE_DIR": str(tmp_path / "state")})
    env["GPUCTL_CONFIG"] = str(tmp_path / "config.toml")
    (tmp_path / "config.toml").write_text("")
    before = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    r = subprocess.run(
        [sys.executable, "-m", "gpuctl", *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert isinstance(doc, dict)
    assert doc["version"] == JSON_VERSION and doc["gpuctl"] == __version__
    at = datetime.datetime.strptime(doc["generated_at"], "%Y-%m-%dT%H:%M:%SZ")
    assert at.replace(tzinfo=datetime.timezone.utc) >= before
    assert key in doc
