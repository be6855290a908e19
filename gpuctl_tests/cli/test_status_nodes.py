"""``gpuctl status NODES`` / ``gpuctl watch NODES`` and ``--hostfile``: ad-hoc nodes without a
config (real sshd nodes reached as the user's ssh config says); the status table as a gpustat
user reads it (USER column, the screen's badge names, colour only on a terminal, a row for a
node without a driver)."""

from __future__ import annotations

import getpass
import os
import pty
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuctl.cli.common import build_fleet
from gpuctl.cli.main import build_parser
from gpuctl.cli.status import BOLD, DIM, RESET
from gpuctl.config import load_config
from gpuctl.config.nodes import COMMAND_LINE, select_nodes
from gpuctl_tests.helpers import node_env
from gpuctl_tests.node.nvml_stub import CONFIG_ENV, NvmlStub


def gpuctl(*args: str, env: dict[str, str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuctl", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        **kw,
    )


@pytest.fixture
def two_nodes(ssh_cluster: Any, nvml_lib_dir: Path, tmp_path: Path) -> dict[str, str]:
    """gpu01 and gpu02 in the user's ~/.ssh/config, no gpuctl config; their agents read the
    stand-in NVML: 2 GPUs each, GPU 0 power-capped, GPU 1 running this test's process."""
    stub = NvmlStub(
        nvml_lib_dir,
        tmp_path / "nvml.conf",
        f"count 2\nset 0 throttle 0x4\nproc 1 {os.getpid()} 100\n",
    )
    ssh_cluster.start_nodes(
        ["gpu01", "gpu02"],
        simulate=None,
        env={"LD_LIBRARY_PATH": str(stub.lib_dir), CONFIG_ENV: str(stub.config)},
    )
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(ssh_cluster.ssh_config_path.read_text())
    return node_env({"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")})


def test_status_of_a_hostlist_and_a_hostfile_without_a_config(
    two_nodes: dict[str, str], tmp_path: Path
) -> None:
    r = gpuctl("status", "gpu[01-02]", env=two_nodes)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == [
        "NODE", "GPU", "MODEL", "UTIL", "MEMORY", "TEMP", "POWER", "SM", "MHz", "ENC", "DEC",
        "PCIe", "TX", "PCIe", "RX", "USER", "FLAGS"
    ]  # fmt: skip
    assert [line.split()[:2] for line in lines[1:5]] == [
        ["gpu01", "0"], ["gpu01", "1"], ["gpu02", "0"], ["gpu02", "1"]
    ]  # fmt: skip
    assert lines[1].split()[-1] == "PWRCAP"  # the screen's badge, not sw_power_cap
    assert lines[2].split()[-1] == getpass.getuser()  # USER: who runs on GPU 1
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# the MPI job's nodes\ngpu02 slots=2\n\ngpu01\n")
    r = gpuctl("status", "--json", "--hostfile", str(hostfile), env=two_nodes)
    assert r.returncode == 0, r.stderr
    import json

    assert [n["name"] for n in json.loads(r.stdout)["nodes"]] == ["gpu02", "gpu01"]


@pytest.mark.parametrize(
    ("argv", "first_line"),
    [
        (["status", "gpu[01-"], "gpuctl: NODES: bad hostlist 'gpu[01-'"),
        (
            ["status", "--hostfile", "/no/such/hosts"],
            "gpuctl: --hostfile /no/such/hosts: no such file",
        ),
        (["watch", "gpu[3-1]"], "gpuctl: NODES: bad hostlist 'gpu[3-1]'"),
        (["watch", "--hostfile", "/no/such/hosts"], "gpuctl: --hostfile /no/such/hosts: no such"),
    ],
)
def test_bad_nodes_are_one_line(argv: list[str], first_line: str, tmp_path: Path) -> None:
    r = gpuctl(*argv, env=node_env({"HOME": str(tmp_path)}), stdin=subprocess.DEVNULL)
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines()[0].startswith(first_line), r.stderr
    assert len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr


def test_a_hostfile_line_that_is_no_hostlist_names_its_line(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("gpu01\ngpu[7-\n")
    r = gpuctl("status", "--hostfile", str(hostfile), env=node_env({"HOME": str(tmp_path)}))
    assert r.returncode == 2
    assert r.stderr.startswith(f"gpuctl: {hostfile}:2: bad hostlist 'gpu[7-'"), r.stderr


def test_a_hostfile_others_may_write_is_refused_as_a_config_would_be(tmp_path: Path) -> None:
    """The nodes a hostfile names are where stress, acceptance runs and jobs go: a file another
    user may write is refused in one line, as the config is
    (``config.files.unsafe_owner_or_mode``)."""
    hostfile = tmp_path / "hosts"
    hostfile.write_text("gpu01\n")
    hostfile.chmod(0o666)
    r = gpuctl("status", "--hostfile", str(hostfile), env=node_env({"HOME": str(tmp_path)}))
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert r.stderr.startswith(
        f"gpuctl: --hostfile {hostfile}: Bad owner or permissions (mode 0666, writable by group "
        "and others): another user could choose the nodes gpuctl acts on through it"
    ), r.stderr


def test_configured_nodes_keep_their_settings_others_get_the_defaults(tmp_path: Path) -> None:
    conf = tmp_path / "config.toml"
    conf.write_text(
        '[clusters.lab]\nnodes = "gpu[01-04]"\npython = "/opt/py/bin/python3"\nuser = "ops"\n'
    )
    config = select_nodes(load_config(str(conf)), ["gpu03", "dgx-a", "gpu01", "gpu03"])
    assert {c: [n.name for n in cl.nodes] for c, cl in config.clusters.items()} == {
        "lab": ["gpu01", "gpu03"],
        COMMAND_LINE: ["dgx-a"],
    }
    gpu03 = config.clusters["lab"].nodes[1]
    assert (gpu03.python, gpu03.user) == ("/opt/py/bin/python3", "ops")
    dgx = config.clusters[COMMAND_LINE].nodes[0]
    assert (dgx.python, dgx.user, dgx.via) == ("python3", None, "ssh")
    # what `gpuctl watch NODES` starts
    args = build_parser().parse_args(["--config", str(conf), "watch", "gpu[02-03],dgx-a"])
    assert sorted(build_fleet(args).nodes) == ["dgx-a", "gpu02", "gpu03"]


def test_status_colours_only_on_a_terminal(two_nodes: dict[str, str]) -> None:
    leader, follower = pty.openpty()
    try:
        r = subprocess.run(
            [sys.executable, "-m", "gpuctl", "status", "gpu01"],
            stdout=follower,
            stderr=subprocess.PIPE,
            timeout=120,
            env=two_nodes,
        )
        os.close(follower)
        follower = -1
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the other end is closed and drained
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(leader)
        if follower >= 0:
            os.close(follower)
    assert r.returncode == 0, r.stderr
    shown = b"".join(chunks).decode()
    assert f"{DIM}PWRCAP{RESET}" in shown  # a power cap is normal under load: dim, not red
    assert shown.startswith(f"{BOLD}NODE")
    plain = gpuctl("status", "gpu01", env=two_nodes)
    assert "\x1b[" not in plain.stdout and "PWRCAP" in plain.stdout  # a pipe: no colour
    no_color = gpuctl("status", "gpu01", env={**two_nodes, "NO_COLOR": "1"})
    assert "\x1b[" not in no_color.stdout
