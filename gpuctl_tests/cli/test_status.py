"""``gpuctl status`` and ``gpuctl --version`` as a user runs them: real subprocesses."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from gpuctl import __version__
from gpuctl.fleet.fleet import simulated_fleet
from gpuctl.fleet.status import collect
from gpuctl.node.protocol import SAMPLE_FIELDS, STATIC_FIELDS
from gpuctl_tests.cli.test_pipes import local_node
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
    # the installed version; from a checkout, its commit after it (gpuctl.version)
    assert r.returncode == 0 and r.stdout.split(" (checkout ")[0].strip() == f"gpuctl {__version__}"


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


def test_status_fits_120_columns_and_its_stdout_holds_only_rows(
    nvml_lib_dir: Path, tmp_path: Path
) -> None:
    """Issue 39.5: the header and a flagged row of a node with a long name wrapped in 120
    columns (123 to 134 wide); the ``reader`` line came on stdout, so ``status | awk`` read a
    row that is none; and nothing said that a one-shot does not see XIDs."""
    script = f"count 4\nset 0 throttle 0x2c\nproc 0 {os.getpid()} 100\nset 3 throttle 0x4\n"
    env = local_node(nvml_lib_dir, tmp_path, script, node="gpu-node-017")
    r = gpuctl("status", env=env)  # a pipe: no terminal, no $COLUMNS
    assert r.returncode == 0, r.stderr
    header, *rows = r.stdout.splitlines()
    assert header.split()[:3] == ["NODE", "GPU", "MODEL"] and len(rows) == 4
    assert [row.split()[:3] for row in rows] == [["gpu-node-017", str(i), "H100"] for i in range(4)]
    assert rows[0].split()[-3:] == ["THERM", "HWSLOW", "PWRCAP"]  # the one order (throttle_order)
    assert max(map(len, r.stdout.splitlines())) <= 120, r.stdout
    assert {"UTIL", "MEMORY", "TEMP", "POWER", "USER", "FLAGS"} <= set(header.split())
    err = r.stderr.splitlines()
    assert [line for line in err if line.startswith("reader gpu-node-017: NVML")], err
    assert [line for line in err if line.startswith("gpuctl: XIDs: a one-shot status does not")]
    doc = gpuctl("status", "--json", env=env)
    assert json.loads(doc.stdout)["xids_watched"] is False and doc.stderr == ""
    wide = gpuctl("status", env={**env, "COLUMNS": "200"})  # room for every column
    assert {"ENC", "DEC", "TX", "RX"} <= set(wide.stdout.split())
    assert max(map(len, wide.stdout.splitlines())) > 120


def test_the_table_drops_the_codec_and_pcie_columns_first_to_fit() -> None:
    from gpuctl.cli.status import render_table

    fleet = simulated_fleet([("sim-01", "4:H100"), ("sim-02", "4:A100")])
    snaps = asyncio.run(collect(fleet, 30))
    full = render_table(snaps)
    assert "NVIDIA" not in full and "H100 80GB HBM3" in full  # short model names
    assert max(map(len, full.splitlines())) > 100
    for width in (200, 120, 100):
        lines = render_table(snaps, width=width).splitlines()
        assert max(map(len, lines)) <= width, width
        assert lines[0].split()[:4] == ["NODE", "GPU", "MODEL", "UTIL"]
    narrow = render_table(snaps, width=60).splitlines()[0].split()  # all it drops, no more
    assert narrow == ["NODE", "GPU", "MODEL", "UTIL", "MEMORY", "TEMP", "POWER", "USER", "FLAGS"]
