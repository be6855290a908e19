"""``gpuctl doctor`` against real sshd nodes: each problem named on its own line with its fix,
the healthy node passing every check; a real Slurm for the node's state."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuctl_tests.harness.sshd import SshCluster, keygen
from gpuctl_tests.helpers import node_env, old_python

pytestmark = [pytest.mark.sshd, pytest.mark.slow]


def doctor(tmp_path: Path, config: Path, *args: str, env: dict[str, str] | None = None) -> Any:
    full = node_env({"GPUCTL_STATE_DIR": str(tmp_path / "state"), **(env or {})})
    full.pop("GPUCTL_CONFIG", None)
    return subprocess.run(
        [sys.executable, "-m", "gpuctl", "--config", str(config), "doctor", *args],
        capture_output=True,
        text=True,
        env=full,
        cwd=tmp_path,
        timeout=300,
    )


def by_node(doc: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for c in doc["checks"]:
        out.setdefault(c["node"], {})[c["check"]] = c
    return out


@pytest.fixture
def nodes(ssh_cluster: SshCluster, tmp_path: Path) -> dict[str, Any]:
    """good, rekeyed (host key changed), chatty (login banner), nopython, oldpython (2.7),
    nogpu (no NVML, no nvidia-smi), wrongkey (a key the node refuses), unknown (not in
    known_hosts), notmine (a bundle folder of another user), oldvenv (jobs' Python 3.9)."""
    ssh_cluster.start_nodes(["good", "rekeyed", "nopython", "notmine", "oldvenv"], simulate="2")
    ssh_cluster.start_node("chatty", simulate="2", banner="Welcome to chatty, have fun")
    ssh_cluster.start_node("oldpython", simulate="2", python=old_python("2.7.18"))
    ssh_cluster.start_node("nogpu", simulate=None)
    ssh_cluster.start_nodes(["wrongkey", "unknown"], simulate="2")
    ssh_cluster["rekeyed"].rotate_host_key()
    other = tmp_path / "other_key"
    keygen(other, "not-authorized")
    text = ssh_cluster.ssh_config_path.read_text()
    text = text.replace(
        f"Host wrongkey\n    HostName 127.0.0.1\n    Port {ssh_cluster['wrongkey'].port}\n"
        f"    User {ssh_cluster.user}\n    IdentityFile {ssh_cluster.client_key_path}",
        f"Host wrongkey\n    HostName 127.0.0.1\n    Port {ssh_cluster['wrongkey'].port}\n"
        f"    User {ssh_cluster.user}\n    IdentityFile {other}",
    )
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    text = text.replace(
        f"Port {ssh_cluster['unknown'].port}\n    User {ssh_cluster.user}\n"
        f"    IdentityFile {ssh_cluster.client_key_path}\n    IdentitiesOnly yes\n"
        f"    UserKnownHostsFile {ssh_cluster.known_hosts_path}",
        f"Port {ssh_cluster['unknown'].port}\n    User {ssh_cluster.user}\n"
        f"    IdentityFile {ssh_cluster.client_key_path}\n    IdentitiesOnly yes\n"
        f"    UserKnownHostsFile {empty}",
    )
    ssh_cluster.ssh_config_path.write_text(text)
    foreign = tmp_path / "foreign-bundles"
    foreign.mkdir(mode=0o700)
    os.chown(foreign, 65534, 65534)  # nobody's (the tests run as root in CI)
    common = {
        "known_hosts": None,
        "workload_python": sys.executable,
        "bundle_dir": str(tmp_path / "bundles"),
    }
    simulated = [n for n in ssh_cluster.nodes if n != "nogpu"]
    config = ssh_cluster.write_config(
        tmp_path / "config.toml",
        nodes=simulated,
        simulate="2",
        overrides={
            "nopython": {"python": "/nope/python3"},
            "notmine": {"bundle_dir": str(foreign)},
            "oldvenv": {"workload_python": old_python("3.9.18")},
        },
        extra=ssh_cluster.cluster_toml("real", "nogpu", simulate=None, **common),
        **common,
    )
    return {"config": config}


def test_doctor_names_each_problem_with_its_fix(
    nodes: dict[str, Any], tmp_path: Path, ssh_cluster: SshCluster
) -> None:
    if os.getuid() != 0:
        pytest.skip("a folder of another user needs root")
    r = doctor(tmp_path, nodes["config"], "--json")
    assert r.returncode == 1, r.stderr
    checks = by_node(json.loads(r.stdout))

    good = checks["good"]
    assert {c["state"] for c in good.values()} <= {"ok", "skip"}, good
    assert good["ssh config"]["detail"].startswith(
        f"HostName 127.0.0.1, Port {ssh_cluster['good'].port}, User {ssh_cluster.user}, "
        "ProxyJump none"
    )
    assert good["agent"]["detail"].startswith("2 simulated GPU(s)")
    assert (good["NVML"]["state"], good["NVML"]["detail"]) == ("skip", "simulated GPUs")
    assert good["jobs VENV2"]["state"] == "ok" and "cloudpickle" in good["jobs VENV2"]["detail"]
    assert good["login shell"]["state"] == "ok"

    def bad(node: str, check: str, state: str = "fail") -> dict[str, Any]:
        c = checks[node][check]
        assert c["state"] == state, (node, check, c)
        others = [k for k, v in checks[node].items() if v["state"] in ("warn", "fail")]
        assert others == [check], (node, others)  # the one problem, on its own line
        return c

    c = bad("rekeyed", "host key")
    assert "CHANGED" in c["detail"] and "ssh-keygen -R" in c["detail"]
    c = bad("chatty", "login shell", "warn")
    assert "Welcome to chatty" in c["detail"] and "interactive" in c["fix"]
    c = bad("nopython", "python")
    assert "no python at '/nope/python3'" in c["detail"] and 'set python = "' in c["fix"]
    c = bad("oldpython", "python")
    assert "is Python 2.7.18" in c["detail"] and "3.6" in c["detail"]
    c = bad("nogpu", "agent")
    assert "reads no GPU" in c["detail"] and "NVIDIA driver" in c["fix"]
    c = bad("wrongkey", "login")
    assert c["fix"] is not None and "ssh-copy-id" in c["fix"]
    c = bad("unknown", "host key")
    assert "unknown host key" in c["detail"] and "ssh-keyscan" in c["detail"]
    c = bad("notmine", "bundle dir")
    assert "belongs to uid 65534" in c["detail"] and "bundle_dir" in c["fix"]
    c = bad("oldvenv", "jobs VENV2", "warn")
    assert "Python 3.9.18" in c["detail"] and "workload_python" in c["fix"]


def test_doctor_text_is_one_line_per_check_and_exit_zero_when_all_pass(
    ssh_cluster: SshCluster, tmp_path: Path
) -> None:
    ssh_cluster.start_node("fine", simulate="1")
    config = ssh_cluster.write_config(
        tmp_path / "config.toml",
        simulate="1",
        workload_python=sys.executable,
        bundle_dir=str(tmp_path / "b"),
    )
    r = doctor(tmp_path, config, "fine")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    names = [ln.split()[0] for ln in lines]
    assert names.count("fine") == 9 and set(names) <= {"login", "fine"}
    doc = json.loads(doctor(tmp_path, config, "fine", "--json").stdout)
    assert len(doc["checks"]) == len(lines) and doc["ok"] is True
    assert r.stderr.strip().startswith(f"{len(lines)} checks: ")
    assert "WARN" not in r.stdout and "FAIL" not in r.stdout
    # a name that is not in the config is reached as the ssh config says: no such host
    r = doctor(tmp_path, config, "nosuchhost")
    assert r.returncode == 1
    login = [
        ln for ln in r.stdout.splitlines() if ln.split()[:3] == ["nosuchhost", "login", "FAIL"]
    ]
    assert len(login) == 1 and "FAIL" in login[0] and "cannot resolve nosuchhost" in login[0]


@pytest.mark.slurm
def test_doctor_shows_the_nodes_slurm_state(
    ssh_cluster: SshCluster, slurm_cluster: Any, tmp_path: Path
) -> None:
    if shutil.which("sinfo") is None:
        pytest.skip("no Slurm clients")
    ssh_cluster.start_node("localhost", simulate="1")  # the test Slurm's node is "localhost"
    config = ssh_cluster.write_config(
        tmp_path / "config.toml",
        simulate="1",
        workload_python=sys.executable,
        bundle_dir=str(tmp_path / "b"),
        slurm_conf=slurm_cluster.env["SLURM_CONF"],
    )
    r = doctor(tmp_path, config, "--json")
    checks = by_node(json.loads(r.stdout))
    assert checks["login"]["Slurm"]["state"] == "ok", checks["login"]
    state = checks["localhost"]["Slurm"]
    assert state["state"] == "ok" and "debug" in state["detail"] and "2 GPU(s)" in state["detail"]
