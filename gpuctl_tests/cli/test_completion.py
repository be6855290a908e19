"""Shell completions come from gpuctl's own parser (argcomplete): a real bash completes
commands, subcommands and options; zsh and fish get their scripts."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuctl_tests.helpers import node_env


def _gpuctl_on_path(tmp_path: Path) -> dict[str, str]:
    """An environment whose PATH has a ``gpuctl`` command running this checkout."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "gpuctl"
    exe.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m gpuctl "$@"\n')
    exe.chmod(0o755)
    env = node_env()
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    return env


def _complete(env: dict[str, str], line: str) -> list[str]:
    words = line.split(" ")
    script = (
        "source <(gpuctl completion bash)\n"
        f"COMP_WORDS=({' '.join(shlex.quote(w) for w in words)})\n"
        f"COMP_CWORD={len(words) - 1}\n"
        f"COMP_LINE={shlex.quote(line)}\nCOMP_POINT={len(line)}\n"
        "_python_argcomplete gpuctl\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    bash = shutil.which("bash") or "/bin/bash"
    r = subprocess.run([bash, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return sorted(w.strip() for w in r.stdout.splitlines() if w.strip())


def test_bash_completes_commands_subcommands_and_options(tmp_path: Path) -> None:
    env = _gpuctl_on_path(tmp_path)
    assert _complete(env, "gpuctl sta") == ["status"]
    assert _complete(env, "gpuctl stress st") == ["start", "status", "stop"]
    assert "--json" in _complete(env, "gpuctl status --")
    assert _complete(env, "gpuctl config i") == ["init"]
    assert {"bash", "fish", "zsh"} <= set(_complete(env, "gpuctl completion "))


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_zsh_and_fish_scripts_name_gpuctl(shell: str, tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "gpuctl", "completion", shell],
        capture_output=True,
        text=True,
        env=node_env(),
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert "gpuctl" in r.stdout and "_ARGCOMPLETE" in r.stdout


def test_node_names_complete_from_the_config_and_job_ids_from_the_store(tmp_path: Path) -> None:
    from gpuctl.jobs.store import JobRecord, JobStore

    env = _gpuctl_on_path(tmp_path)
    conf = tmp_path / "config.toml"
    conf.write_text('[clusters.lab]\nnodes = "gpu[01-03],dgx-a"\n')
    env["GPUCTL_CONFIG"] = str(conf)
    env["GPUCTL_STATE_DIR"] = str(tmp_path / "state")
    assert _complete(env, "gpuctl status gp") == ["gpu01", "gpu02", "gpu03"]
    assert _complete(env, "gpuctl watch dg") == ["dgx-a"]
    assert _complete(env, "gpuctl doctor gpu0") == ["gpu01", "gpu02", "gpu03"]
    assert _complete(env, "gpuctl accept --nodes gpu02") == ["gpu02"]
    store = JobStore(tmp_path / "state" / "jobs.sqlite")
    for job_id in ("abc123" + "0" * 26, "abd456" + "0" * 26, "ffe789" + "0" * 26):
        store.add(
            JobRecord(
                id=job_id,
                name="train.py:main",
                target="local",
                backend={"kind": "local"},  # type: ignore[typeddict-item]
                jobdir=f"/tmp/{job_id}",
                state="done",
                created_at=1.0,
            )
        )
    assert _complete(env, "gpuctl logs ab") == ["abc123" + "0" * 26, "abd456" + "0" * 26]
    assert _complete(env, "gpuctl result ff") == ["ffe789" + "0" * 26]
