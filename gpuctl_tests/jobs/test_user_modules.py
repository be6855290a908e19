"""The user's own modules imported inside the function (``def main(): from model import MLP``)
are there when it runs, on this machine and over SSH: the project's modules and packages ship
with the payload (``gpuctl.jobs.usercode``), into a content-addressed ``code-<hash>`` folder under
the job root, written once per content. A module that does not ship (left out by
``ship_exclude``, over ``ship_limit``) is named as the user's own, never as a package to
install.

The submitter is a real ``train.py`` run as a script from another folder, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuctl_tests.helpers import node_env

TRAIN = """\
import json
import sys

import model  # imported at the top and again inside the function: a common style


def main(x):
    from model import MLP
    import data
    from nets.layers import depth
    import model

    return [MLP(3).forward(data.batch(x)), depth(), model.__file__]


def uses_a_library(x):
    import mylib  # on this side's sys.path, outside the project's folder

    return mylib.twice(x)


if __name__ == "__main__":
    from gpuctl.config import load_config
    from gpuctl.jobs import Executor, JobFailed

    opts = json.loads(sys.argv[1])
    config = opts.pop("config", None)
    sys.path[1:1] = opts.pop("path", [])
    fn = globals()[opts.pop("fn", "main")]
    ex = Executor(opts.pop("target"), config=load_config(config) if config else None, **opts)
    try:
        out = {"result": ex.submit(fn, 2).result(120)}
    except JobFailed as e:
        out = {"kind": e.kind, "text": str(e), "remedy": e.report.remedy}
    print(json.dumps(out))
"""


def project(root: Path) -> Path:
    """train.py beside model.py, data.py and the package nets/ (nothing of them installed)."""
    (root / "nets").mkdir(parents=True)
    (root / "model.py").write_text(
        "class MLP:\n    def __init__(self, n):\n        self.n = n\n\n"
        "    def forward(self, x):\n        return x * self.n\n"
    )
    (root / "data.py").write_text("def batch(x):\n    return x + 5\n")
    (root / "nets" / "__init__.py").write_text("")
    (root / "nets" / "layers.py").write_text("def depth():\n    return 12\n")
    (root / "train.py").write_text(TRAIN)
    return root / "train.py"


def run_python(
    argv: list[str], cwd: Path, options: dict[str, Any], stdin: str | None = None
) -> dict[str, Any]:
    """Run ``python ARGV OPTIONS`` (OPTIONS as JSON) from ``cwd``; its JSON answer."""
    cwd.mkdir(exist_ok=True)
    r = subprocess.run(
        [sys.executable, *argv, json.dumps(options)],
        input=stdin,
        capture_output=True,
        text=True,
        env=node_env(),
        cwd=cwd,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


def run_train(train: Path, cwd: Path, **options: Any) -> dict[str, Any]:
    """Run ``python train.py OPTIONS`` from ``cwd`` (not the project); its JSON answer."""
    return run_python([str(train)], cwd, options)


def code_folders(job_root: Path) -> list[Path]:
    return sorted(job_root.glob("code-*"))


def test_own_modules_imported_inside_the_function_run_locally(
    venv1: str, venv2: str, tmp_path: Path
) -> None:
    train = project(tmp_path / "proj")
    (train.parent / "queue.py").write_text("")  # the name of a standard library module
    (train.parent / "notes.txt").write_text("")  # not a module
    jobs = tmp_path / "jobs"
    opts = {"target": "local", "python": venv2, "supervisor_python": venv1, "job_root": str(jobs)}
    out = run_train(train, tmp_path / "elsewhere", **opts)
    assert "result" in out, out.get("text")
    value, depth, where = out["result"]
    assert (value, depth) == ((2 + 5) * 3, 12)
    # VENV2 imported the shipped copy, not the project's folder
    (folder,) = code_folders(jobs)
    assert where == str(folder / "model.py")
    # Python's own bytecode caches aside (VENV2 imports the shipped modules from here)
    shipped = {
        str(p.relative_to(folder)) for p in folder.rglob("*") if "__pycache__" not in p.parts
    }
    assert shipped == {
        ".complete", "data.py", "model.py", "train.py", "nets", "nets/__init__.py",
        "nets/layers.py",
    }  # fmt: skip
    (meta,) = [json.loads(m.read_text()) for m in jobs.glob("*/meta.json")]
    assert meta["code"] == str(folder)
    assert meta["unshipped"]["queue"][1].startswith("it has the name of a module of Python's")

    # the same code again: the folder is reused; changed code: a folder of its own
    assert "result" in run_train(train, tmp_path / "elsewhere", **opts)
    assert code_folders(jobs) == [folder]
    (train.parent / "data.py").write_text("def batch(x):\n    return x + 6\n")
    out = run_train(train, tmp_path / "elsewhere", **opts)
    assert out["result"][0] == (2 + 6) * 3
    assert len(code_folders(jobs)) == 2


@pytest.mark.sshd
def test_own_modules_imported_inside_the_function_run_over_ssh(
    ssh_cluster: Any, venv1: str, venv2: str, tmp_path: Path
) -> None:
    ssh_cluster.start_node("m1", simulate="1", python=venv1)
    config = ssh_cluster.write_config(tmp_path / "c.toml")
    train = project(tmp_path / "proj")
    jobs = tmp_path / "remote-jobs"
    out = run_train(
        train,
        tmp_path / "elsewhere",
        target="m1",
        config=str(config),
        python=venv2,
        job_root=str(jobs),
    )
    assert "result" in out, out.get("text")
    value, depth, where = out["result"]
    assert (value, depth) == (21, 12)
    (folder,) = code_folders(jobs)  # written over SFTP into the node's job root
    assert where == str(folder / "model.py")


@pytest.mark.slurm
def test_own_modules_imported_inside_the_function_run_through_slurm(
    slurm_cluster: Any, venv1: str, venv2: str, tmp_path: Path
) -> None:
    train = project(tmp_path / "proj")
    jobs = tmp_path / "shared-jobs"
    out = run_train(
        train,
        tmp_path / "elsewhere",
        target="slurm",
        partition=slurm_cluster.partition,
        slurm_conf=str(slurm_cluster.conf_path),
        python=venv2,
        supervisor_python=venv1,
        job_root=str(jobs),
    )
    assert "result" in out, out.get("text")
    value, depth, where = out["result"]
    assert (value, depth) == (21, 12)
    (folder,) = code_folders(jobs)
    assert where == str(folder / "model.py")


def test_a_module_left_out_is_named_as_the_users_own(
    venv1: str, venv2: str, tmp_path: Path
) -> None:
    train = project(tmp_path / "proj")
    opts = {"target": "local", "python": venv2, "supervisor_python": venv1}
    out = run_train(
        train,
        tmp_path / "elsewhere",
        job_root=str(tmp_path / "jobs"),
        ship_exclude=["data"],
        **opts,
    )
    assert out.get("kind") == "module_missing", out
    data = train.parent / "data.py"
    assert f"your module `data` (`{data}`) was not shipped: the pattern 'data'" in out["text"]
    assert "ship_exclude" in out["remedy"]
    # never a package index for the user's own file
    assert "install" not in out["remedy"] and "packages" not in out["remedy"]

    # over the size limit: a package with a large file in it
    big = train.parent / "nets" / "weights.bin"
    big.write_bytes(b"\0" * (2 << 20))
    out = run_train(
        train, tmp_path / "elsewhere", job_root=str(tmp_path / "jobs2"), ship_limit="1M", **opts
    )
    assert out.get("kind") == "module_missing", out
    nets = train.parent / "nets"
    assert f"your module `nets` (`{nets}`) was not shipped: it is 2.0 MiB" in out["text"]
    assert "over the limit of 1.0 MiB" in out["text"] and "ship_limit" in out["remedy"]
    assert "install" not in out["remedy"]


def test_a_module_of_the_users_outside_the_project_is_named_as_theirs(
    venv1: str, venv2: str, tmp_path: Path
) -> None:
    train = project(tmp_path / "proj")
    lib = tmp_path / "lib"  # on the submitter's sys.path, not in the project's folder
    lib.mkdir()
    (lib / "mylib.py").write_text("def twice(x):\n    return 2 * x\n")
    out = run_train(
        train,
        tmp_path / "elsewhere",
        target="local",
        python=venv2,
        supervisor_python=venv1,
        job_root=str(tmp_path / "jobs"),
        path=[str(lib)],
        fn="uses_a_library",
    )
    assert out.get("kind") == "module_missing", out
    mylib = lib / "mylib.py"
    assert f"your module `mylib` (`{mylib}`) was not shipped: it is outside" in out["text"]
    assert "pip install -e" in out["remedy"] and "environment's packages" not in out["remedy"]


PACKAGED = """\
import json
import sys


def main(x):
    from proj.model import scale
    import common

    return scale(x) + common.BIAS


if __name__ == "__main__":
    from gpuctl.jobs import Executor

    ex = Executor("local", **json.loads(sys.argv[1]))
    print(json.dumps({"result": ex.submit(main, 2).result(120)}))
"""


@pytest.mark.parametrize("how", ["-m", "stdin"])
def test_a_package_run_with_dash_m_and_a_script_on_stdin_ship_their_folder(
    how: str, venv1: str, venv2: str, tmp_path: Path
) -> None:
    """``python -m proj.train`` imports from the folder holding ``proj``; a script read from
    stdin (a REPL, a notebook) from the current folder: that folder's modules ship."""
    root = tmp_path / "root"
    (root / "proj").mkdir(parents=True)
    (root / "proj" / "__init__.py").write_text("")
    (root / "proj" / "model.py").write_text("def scale(x):\n    return 10 * x\n")
    (root / "proj" / "train.py").write_text(PACKAGED)
    (root / "common.py").write_text("BIAS = 1\n")
    opts = {"python": venv2, "supervisor_python": venv1, "job_root": str(tmp_path / "jobs")}
    if how == "-m":
        assert run_python(["-m", "proj.train"], root, opts) == {"result": 21}
    else:
        assert run_python(["-"], root, opts, stdin=PACKAGED) == {"result": 21}


class _Counted:
    """A LocalHost whose calls are counted by name: each is one round trip on an SSH host."""

    def __init__(self) -> None:
        from gpuctl.jobs.hosts import LocalHost

        self.calls: list[str] = []
        host = LocalHost()
        for name in ("exists", "touch", "run", "mkdir", "open_atomic"):
            real = getattr(host, name)
            setattr(self, name, self._count(name, real))
        self.name = host.name

    def _count(self, name: str, real: Any) -> Any:
        def call(*a: Any, **k: Any) -> Any:
            self.calls.append(name)
            return real(*a, **k)

        return call


def test_code_already_on_the_node_is_reused_in_one_round_trip_and_a_half_written_copy_is_not(
    tmp_path: Path,
) -> None:
    """A reused code folder costs one round trip (check its completion mark and mark it used
    for ``jobs purge`` together; it was ``exists`` then ``touch``); a folder without its mark
    (a copy cut off while unpacking) is shipped again, never reused."""
    from gpuctl.jobs.hosts import Host, LocalHost
    from gpuctl.jobs.usercode import COMPLETE, UserCode, ship

    src = tmp_path / "model.py"
    src.write_text("X = 1\n")
    code = UserCode(files=(("model.py", str(src)),), digest="ab" * 32)
    root = str(tmp_path / "jobs")
    Path(root).mkdir(mode=0o700)
    host: Any = _Counted()
    folder = ship(host, root, code)
    assert folder and (Path(folder) / COMPLETE).exists()
    host.calls.clear()
    assert ship(host, root, code) == folder
    assert host.calls == ["touch"]
    (Path(folder) / COMPLETE).unlink()  # half written: no mark
    host.calls.clear()
    assert ship(host, root, code) == folder
    assert host.calls[0] == "touch" and "open_atomic" in host.calls
    assert (Path(folder) / COMPLETE).exists()
    # the shell form an SSH host runs, here through the local shell
    local = LocalHost()
    assert Host.touch(local, folder, when=f"{folder}/{COMPLETE}")
    assert not Host.touch(local, folder, when=f"{folder}/missing")
