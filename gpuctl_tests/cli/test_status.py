"""``gpuctl status`` and ``gpuctl --version`` as a user runs them: real subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys

from gpuctl import __version__
from gpuctl.node.protocol import SAMPLE_FIELDS, STATIC_FIELDS
from gpuctl_tests.helpers import node_env


def gpuctl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuctl", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env or node_env(),
    )


def test_version() -> None:
    r = gpuctl("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"gpuctl {__version__}"


def test_status_demo_json_lists_nodes_with_every_field() -> None:
    r = gpuctl("status", "--demo", "--json")
    assert r.returncode == 0, r.stderr
    nodes = json.loads(r.stdout)["nodes"]
    assert isinstance(nodes, list) and len(nodes) >= 2
    models = set()
    for node in nodes:
        assert node["state"] == "live" and node["reader"] == "simulated"
        assert node["driver"] and node["cuda"]
        assert node["gpus"], node
        for gpu in node["gpus"]:
            assert set(SAMPLE_FIELDS) <= set(gpu), set(SAMPLE_FIELDS) - set(gpu)
            assert gpu["state"] == "ok" and gpu["name"]
            assert 0 <= gpu["util_gpu"] <= 100 and gpu["mem_used"] <= gpu["mem_total"]
            models.add(gpu["name"])
    assert len(models) >= 2  # the demo is a mixed cluster
    assert "name" in STATIC_FIELDS


def test_status_demo_table() -> None:
    r = gpuctl("status", "--demo")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:3] == ["NODE", "GPU", "MODEL"]
    assert len(lines) > 8 and "sim-01" in lines[1]
    # the screen's badge names, never NVML's reason names
    assert "sw_power_cap" not in r.stdout and "sw_thermal" not in r.stdout


def test_status_without_driver_says_so_in_one_line(tmp_path) -> None:
    # No nvidia-smi on PATH and no libnvidia-ml: this machine as it is (no GPU here).
    env = node_env({"PATH": f"{tmp_path}:/usr/bin:/bin", "LD_LIBRARY_PATH": str(tmp_path)})
    r = gpuctl("status", env=env)
    assert r.returncode == 1
    err = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(err) == 1, r.stderr
    header, row = r.stdout.splitlines()  # a row that says so, not an empty table
    assert header.split()[:3] == ["NODE", "GPU", "MODEL"]
    assert row.split()[1:] == ["-", "no", "GPU", "driver"]
    assert "no NVIDIA driver" in err[0] and "gpuctl demo" in err[0]
    assert "Traceback" not in r.stderr


def test_bad_usage_is_one_line_not_a_traceback() -> None:
    r = gpuctl("status", "--timeout", "soon")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "invalid float" in r.stderr
