"""A function whose file imports its neighbours (a sibling module, a sibling package): they travel
with the payload, so VENV2 needs nothing but cloudpickle, on this machine and over SSH."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from gpuctl_tests.helpers import node_env


def project(root: Path) -> tuple[Path, str]:
    """train.py beside helpers_<tag>.py and the package pkg_<tag>/ (names unique per test, as
    the in-process CLI keeps what it imported)."""
    tag = uuid.uuid4().hex[:8]
    root.mkdir()
    (root / f"helpers_{tag}.py").write_text(
        "import json\nSCALE = 3\n\ndef scaled(x):\n    return json.loads(json.dumps(x)) * SCALE\n"
    )
    pkg = root / f"pkg_{tag}"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .sub.deep import offset\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "deep.py").write_text("def offset():\n    return 100\n")
    (root / "train.py").write_text(
        f"import helpers_{tag}\n"
        f"from pkg_{tag} import offset\n"
        f"from helpers_{tag} import scaled\n\n"
        "def main(x):\n"
        f"    return helpers_{tag}.scaled(x) + scaled(1) + offset()\n"
    )
    return root / "train.py", tag


def gpuctl(cwd: Path, *argv: str, config: Path | None = None) -> Any:
    env = node_env({"GPUCTL_STATE_DIR": str(cwd / "state")})
    env.pop("GPUCTL_CONFIG", None)
    head = ["--config", str(config)] if config is not None else []
    return subprocess.run(
        [sys.executable, "-m", "gpuctl", *head, *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )


def test_sibling_modules_and_packages_travel_with_a_local_job(tmp_path: Path) -> None:
    train, _ = project(tmp_path / "proj")
    elsewhere = tmp_path / "elsewhere"  # not the project: nothing of it is on VENV2's path
    elsewhere.mkdir()
    r = gpuctl(
        elsewhere,
        "submit",
        f"{train}:main",
        "--args",
        "[2]",
        "--wait",
        "--python",
        sys.executable,
        "--supervisor-python",
        sys.executable,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[1] == str(2 * 3 + 3 + 100)


@pytest.mark.sshd
def test_sibling_modules_and_packages_travel_over_ssh(ssh_cluster: Any, tmp_path: Path) -> None:
    ssh_cluster.start_node("j1", simulate="1", python=sys.executable)
    config = ssh_cluster.write_config(tmp_path / "c.toml", workload_python=sys.executable)
    train, _ = project(tmp_path / "proj")
    r = gpuctl(
        tmp_path,
        "submit",
        f"{train}:main",
        "--args",
        "[5]",
        "--target",
        "j1",
        "--wait",
        config=config,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[1] == str(5 * 3 + 3 + 100)


@pytest.mark.sshd
def test_gpuctl_jobs_follows_an_ssh_job_to_its_end(ssh_cluster: Any, tmp_path: Path) -> None:
    """Nobody calls ``result``: ``gpuctl jobs`` itself reads the job folder on the node."""
    import json

    from gpuctl_tests.helpers import wait_until

    ssh_cluster.start_node("j2", simulate="1", python=sys.executable)
    config = ssh_cluster.write_config(tmp_path / "c.toml", workload_python=sys.executable)
    train, _ = project(tmp_path / "proj")
    r = gpuctl(
        tmp_path, "submit", f"{train}:main", "--args", "[1]", "--target", "j2", config=config
    )
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.strip()

    def state() -> str:
        out = gpuctl(tmp_path, "jobs", "--json", config=config)
        (job,) = [j for j in json.loads(out.stdout)["jobs"] if j["id"] == job_id]
        return str(job["state"])

    assert wait_until(lambda: state() == "done", 60, "gpuctl jobs to see the job done")

    # and `jobs purge` removes its folder on the node, then its row
    listed = json.loads(gpuctl(tmp_path, "jobs", "--json", config=config).stdout)["jobs"]
    (folder,) = [j["jobdir"].split(":", 1)[-1] for j in listed if j["id"] == job_id]
    assert Path(folder).is_dir()
    r = gpuctl(tmp_path, "jobs", "purge", "--older-than", "0", config=config)
    assert r.returncode == 0 and r.stdout.startswith("purged 1 job(s)"), r.stdout + r.stderr
    assert not Path(folder).exists()
    assert json.loads(gpuctl(tmp_path, "jobs", "--json", config=config).stdout)["jobs"] == []
