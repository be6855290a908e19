"""NVML on a node with nothing installed: the bundle carries the login side's pynvml.

Run for real: the bundle under pyenv's Python 3.6.15 (which has no pynvml) over the stand-in
``libnvidia-ml.so.1``, a node's own newer or older pynvml beside it, and a real sshd node whose
``python3`` is 3.6, seen through ``gpuctl status`` and ``gpuctl doctor``.
"""

from __future__ import annotations

import importlib.metadata
import io
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import msgspec
import pytest

import gpuctl.bundle
from gpuctl.bundle import bundle_bytes, write_bundle
from gpuctl.core.model import NodeInfo, Sample
from gpuctl.fleet.session import decode_line, statics
from gpuctl.node.protocol import SAMPLE_FIELDS
from gpuctl_tests.harness.sshd import NODE_PATH, SshCluster
from gpuctl_tests.helpers import AgentProcess, node_env, old_python
from gpuctl_tests.node import smi_stub
from gpuctl_tests.node.nvml_stub import CONFIG_ENV, NvmlStub

VERSION = importlib.metadata.version("nvidia-ml-py")
INSTALLED = Path(str(importlib.metadata.distribution("nvidia-ml-py").locate_file("pynvml.py")))
SCRIPT = "count 2\nset 0 throttle 0x44\nset 1 pstate 8\nset 1 rows_pending 1\nxid 1 48 2\n"


def agent_env(stub: NvmlStub, pythonpath: Path | None = None) -> dict[str, str]:
    """The stub as the node's NVML; no PYTHONPATH but the one given (a node's own site)."""
    env = stub.env()
    env.pop("PYTHONPATH", None)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return env


def start_agent(
    python: str, bundle: Path, env: dict[str, str], agents: list[AgentProcess]
) -> AgentProcess:
    agent = AgentProcess([python, str(bundle), "agent", "--interval", "0.1"], env=env)
    agents.append(agent)
    return agent


def test_the_bundle_carries_the_installed_pynvml_and_its_licence() -> None:
    _, data = bundle_bytes()
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        source = zf.read("gpuctl/node/_vendor/pynvml.py")
        version = zf.read("gpuctl/node/_vendor/pynvml.version").decode().strip()
        licence = zf.read("gpuctl/node/_vendor/LICENSE.nvidia-ml-py").decode()
    assert source == INSTALLED.read_bytes()
    assert version == VERSION
    assert licence.startswith("Copyright (c)") and "NVIDIA Corporation" in licence
    assert "Redistribution and use in source and binary forms" in licence
    assert "#" not in licence and "from ctypes" not in licence  # the comment block, as text


def test_the_bundle_hash_follows_the_nvidia_ml_py_version(monkeypatch: pytest.MonkeyPatch) -> None:
    before, _ = bundle_bytes()
    source = INSTALLED.read_bytes()
    monkeypatch.setattr(gpuctl.bundle, "_pynvml", lambda: ("99.0.1", source))
    assert bundle_bytes()[0] != before
    monkeypatch.setattr(gpuctl.bundle, "_pynvml", lambda: (VERSION, source + b"\n# patched\n"))
    assert bundle_bytes()[0] != before
    monkeypatch.setattr(gpuctl.bundle, "_pynvml", lambda: (VERSION, source))
    assert bundle_bytes()[0] == before


def test_python36_without_pynvml_reads_nvml_through_the_bundled_bindings(
    nvml_lib_dir: Path, tmp_path: Path, agents: list[AgentProcess]
) -> None:
    python = old_python("3.6.15")
    stub = NvmlStub(nvml_lib_dir, tmp_path / "nvml.conf", SCRIPT)
    env = agent_env(stub)
    bare = subprocess.run([python, "-c", "import pynvml"], env=env, capture_output=True, timeout=30)
    assert bare.returncode != 0, "this Python 3.6 must have no pynvml of its own for this test"

    agent = start_agent(python, write_bundle(tmp_path / "b"), env, agents)
    hello = agent.read()
    assert (hello["python"], hello["reader"], hello["reader_error"]) == ("3.6.15", "nvml", None)
    assert hello["bindings"] == f"bundled {VERSION}"
    assert (hello["driver"], hello["nvml"]) == ("550.54.15", "12.550.54.15")

    sample = agent.read_until(lambda m: m["type"] == "sample")
    gpus = sorted(sample["gpus"], key=lambda g: g["index"])
    assert len(gpus) == 2
    read = decode_line(json.dumps(sample), statics(msgspec.convert(hello, NodeInfo)))
    assert isinstance(read, Sample)
    for g, got in zip(gpus, read.gpus, strict=True):
        assert set(g) <= set(SAMPLE_FIELDS) and None not in g.values()  # protocol 2's shape
        full = got.to_dict()
        assert set(full) == set(SAMPLE_FIELDS)
        # every field the stand-in gives arrives (what the hello holds, from the hello):
        # nothing is null but ``mig`` (no GPU in MIG mode; agents do not read instances)
        assert [k for k, v in full.items() if v is None] == ["mig"], full
        assert full["processes"] == () and full["state"] == "ok"
    assert gpus[0]["throttle"] == ["sw_power_cap", "hw_thermal"]
    assert gpus[1]["pstate"] == "P8" and gpus[1]["remapped_rows"]["pending"] is True
    assert gpus[0]["ecc"]["aggregate_corrected"] == 10

    xid = agent.read_until(lambda m: m["type"] == "event" and m["kind"] == "xid")
    assert (xid["gpu"], xid["detail"]) == (1, {"xid": 48})
    agent.send({"type": "shutdown"})
    agent.read_until(lambda m: m["type"] == "bye")
    assert agent.proc.wait(10) == 0


def node_site(root: Path, dist: str) -> Path:
    """A node's own site folder: the real pynvml.py and the metadata folder ``dist`` names."""
    root.mkdir(parents=True)
    shutil.copy(INSTALLED, root / "pynvml.py")
    (root / dist).mkdir()
    (root / dist / "METADATA").write_text(f"Name: nvidia-ml-py\nVersion: {dist.split('-')[1]}\n")
    return root


@pytest.mark.parametrize(
    ("dist", "bindings"),
    [
        ("nvidia_ml_py-999.1.2.dist-info", "system 999.1.2"),  # newer than the bundle's: it wins
        ("nvidia_ml_py-12.535.77.dist-info", f"bundled {VERSION}"),  # older: the bundle's
        ("pynvml-11.5.0.dist-info", f"bundled {VERSION}"),  # the old pynvml project
        ("unrelated-1.0.dist-info", f"bundled {VERSION}"),  # a version nobody can read
    ],
)
def test_the_nodes_own_pynvml_is_used_only_when_newer(
    nvml_lib_dir: Path, tmp_path: Path, agents: list[AgentProcess], dist: str, bindings: str
) -> None:
    python = old_python("3.6.15")
    stub = NvmlStub(nvml_lib_dir, tmp_path / "nvml.conf", "count 1\n")
    site = node_site(tmp_path / "site", dist)
    agent = start_agent(python, write_bundle(tmp_path / "b"), agent_env(stub, site), agents)
    hello = agent.read()
    assert (hello["reader"], hello["bindings"]) == ("nvml", bindings)
    assert agent.read_until(lambda m: m["type"] == "sample")["gpus"][0]["temp"] == 40


def test_a_broken_newer_pynvml_of_the_nodes_gives_way_to_the_bundled_one(
    nvml_lib_dir: Path, tmp_path: Path, agents: list[AgentProcess]
) -> None:
    python = old_python("3.6.15")
    stub = NvmlStub(nvml_lib_dir, tmp_path / "nvml.conf", "count 1\n")
    site = node_site(tmp_path / "site", "nvidia_ml_py-999.0.0.dist-info")
    (site / "pynvml.py").write_text("raise OSError('half-installed')\n")
    agent = start_agent(python, write_bundle(tmp_path / "b"), agent_env(stub, site), agents)
    hello = agent.read()
    assert (hello["reader"], hello["bindings"]) == ("nvml", f"bundled {VERSION}")


def test_a_broken_driver_falls_back_to_smi_and_says_why(
    tmp_path: Path, agents: list[AgentProcess]
) -> None:
    """No libnvidia-ml at all: the bundled bindings load, NVML cannot, nvidia-smi reads."""
    python = old_python("3.6.15")
    bin_dir = tmp_path / "bin"
    smi_stub.install(bin_dir, tmp_path / "smi.json", smi_stub.default_data())
    env = node_env({smi_stub.DATA_ENV: str(tmp_path / "smi.json")})
    env["PATH"] = f"{bin_dir}{os.pathsep}{NODE_PATH}"
    for name in ("PYTHONPATH", "LD_LIBRARY_PATH", CONFIG_ENV):
        env.pop(name, None)
    agent = start_agent(python, write_bundle(tmp_path / "b"), env, agents)
    hello = agent.read()
    assert (hello["reader"], hello["bindings"]) == ("nvidia-smi", f"bundled {VERSION}")
    assert hello["reader_error"].startswith("NVML: nvmlInit failed: ")


def run_gpuctl(tmp_path: Path, config: Path, *args: str) -> Any:
    env = node_env({"GPUCTL_STATE_DIR": str(tmp_path / "state")})
    env.pop("GPUCTL_CONFIG", None)
    return subprocess.run(
        [sys.executable, "-m", "gpuctl", "--config", str(config), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )


@pytest.mark.sshd
@pytest.mark.slow
def test_over_sshd_a_python36_node_is_on_nvml_and_status_and_doctor_say_so(
    ssh_cluster: SshCluster, nvml_lib_dir: Path, tmp_path: Path
) -> None:
    python = old_python("3.6.15")
    stub = NvmlStub(nvml_lib_dir, tmp_path / "nvml.conf", "count 2\n")
    ssh_cluster.start_node(
        "nv36",
        simulate=None,
        python=python,
        env={"LD_LIBRARY_PATH": str(nvml_lib_dir), CONFIG_ENV: str(stub.config)},
    )
    # a node on the fallback: a stand-in nvidia-smi and no NVML library, python3 also 3.6
    bin_dir = tmp_path / "smi-bin"
    smi_stub.install(bin_dir, tmp_path / "smi.json", smi_stub.default_data())
    (bin_dir / "python3").write_text(f'#!/bin/sh\nexec "{python}" "$@"\n')
    (bin_dir / "python3").chmod(0o755)
    ssh_cluster.start_node(
        "smi36",
        simulate=None,
        env={"PATH": f"{bin_dir}:{NODE_PATH}", smi_stub.DATA_ENV: str(tmp_path / "smi.json")},
    )
    config = ssh_cluster.write_config(
        tmp_path / "config.toml",
        known_hosts=None,
        workload_python=sys.executable,
        bundle_dir=str(tmp_path / "bundles"),
    )

    r = run_gpuctl(tmp_path, config, "status", "--json")
    assert r.returncode == 0, r.stderr
    nodes = {n["name"]: n for n in json.loads(r.stdout)["nodes"]}
    assert (nodes["nv36"]["python"], nodes["nv36"]["reader"]) == ("3.6.15", "nvml")
    assert nodes["nv36"]["bindings"] == f"bundled {VERSION}"
    assert len(nodes["nv36"]["gpus"]) == 2
    assert nodes["smi36"]["reader"] == "nvidia-smi"
    assert nodes["smi36"]["reader_error"].startswith("NVML: nvmlInit failed: ")

    r = run_gpuctl(tmp_path, config, "status")
    readers = [ln for ln in r.stderr.splitlines() if ln.startswith("reader ")]  # stdout: rows
    assert readers == [
        f"reader nv36: NVML, pynvml bundled {VERSION}",
        f"reader smi36: nvidia-smi ({nodes['smi36']['reader_error']})",
    ], r.stderr

    r = run_gpuctl(tmp_path, config, "doctor", "--json")
    checks = {(c["node"], c["check"]): c for c in json.loads(r.stdout)["checks"]}
    nv = checks[("nv36", "NVML")]
    assert (nv["state"], nv["detail"]) == ("ok", f"NVML, pynvml bundled {VERSION}")
    smi = checks[("smi36", "NVML")]
    assert smi["state"] == "warn" and "nvmlInit failed" in smi["detail"]
    assert "libnvidia-ml.so.1" in smi["fix"]
    assert checks[("smi36", "agent")]["state"] == "ok"
