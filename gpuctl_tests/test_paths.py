"""gpuctl.paths: XDG folders honoured, ``~`` expanded in every override, private folders."""

from __future__ import annotations

import ast
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpuctl import paths
from gpuctl.jobs.store import JobStore
from gpuctl_tests.helpers import REPO


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_xdg_variables_decide_every_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUCTL_STATE_DIR", raising=False)
    monkeypatch.delenv("GPUCTL_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "c"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "s"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "k"))
    monkeypatch.setenv("XDG_CONFIG_DIRS", f"{tmp_path / 'site1'}:{tmp_path / 'site2'}")
    assert paths.config_file() == tmp_path / "c" / "gpuctl" / "config.toml"
    assert paths.state_dir() == tmp_path / "s" / "gpuctl"
    assert paths.cache_dir() == tmp_path / "k" / "gpuctl"
    assert paths.log_dir() == tmp_path / "s" / "gpuctl" / "logs"
    assert paths.jobs_dir() == tmp_path / "s" / "gpuctl" / "jobs"
    assert paths.site_config_files() == [
        tmp_path / "site1" / "gpuctl" / "config.toml",
        tmp_path / "site2" / "gpuctl" / "config.toml",
    ]


def test_defaults_without_xdg_variables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    for var in ("XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME", "XDG_CONFIG_DIRS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("GPUCTL_STATE_DIR", raising=False)
    assert paths.config_file() == tmp_path / ".config" / "gpuctl" / "config.toml"
    assert paths.state_dir() == tmp_path / ".local" / "state" / "gpuctl"
    assert paths.cache_dir() == tmp_path / ".cache" / "gpuctl"
    assert paths.site_config_files() == [Path("/etc/xdg/gpuctl/config.toml")]


def test_tilde_is_expanded_in_every_override(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("GPUCTL_STATE_DIR", "~/st")
    monkeypatch.setenv("GPUCTL_CACHE_DIR", "~/ca")
    monkeypatch.setenv("XDG_CONFIG_HOME", "~/cfg")
    assert paths.state_dir() == tmp_path / "st"
    assert paths.cache_dir() == tmp_path / "ca"
    assert paths.config_file() == tmp_path / "cfg" / "gpuctl" / "config.toml"
    assert paths.jobs_dir("~/shared/jobs") == tmp_path / "shared" / "jobs"


def test_a_relative_xdg_value_is_ignored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("GPUCTL_STATE_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", "relative/state")
    monkeypatch.setenv("XDG_CONFIG_DIRS", "relative:/abs/site")
    assert paths.state_dir() == tmp_path / ".local" / "state" / "gpuctl"
    assert paths.site_config_files() == [Path("/abs/site/gpuctl/config.toml")]


def test_private_dir_makes_every_folder_it_creates_0700(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        made = paths.private_dir(tmp_path / "a" / "b" / "c")
    finally:
        os.umask(old)
    assert made.is_dir()
    for p in (tmp_path / "a", tmp_path / "a" / "b", made):
        assert mode(p) == 0o700, p
    wide = tmp_path / "wide"
    wide.mkdir(mode=0o755)
    wide.chmod(0o755)
    paths.private_dir(wide, ours=False)  # a folder the user named keeps its mode
    assert mode(wide) == 0o755
    paths.private_dir(wide)
    assert mode(wide) == 0o700


def test_a_state_dir_with_tilde_makes_no_folder_named_tilde(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job store under GPUCTL_STATE_DIR=~/x lands in $HOME/x, private, from any cwd."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GPUCTL_STATE_DIR", "~/x")
    monkeypatch.chdir(tmp_path)
    store = JobStore()
    assert store.path == home / "x" / "jobs.sqlite"
    assert not (tmp_path / "~").exists()
    assert mode(home / "x") == 0o700


def test_job_folders_of_local_jobs_are_state_not_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUCTL_STATE_DIR", str(tmp_path / "st"))
    from gpuctl.jobs import Executor

    ex = Executor("local", store=False)
    assert ex.backend.job_root == str(tmp_path / "st" / "jobs")


# the state folder's names, spelled in gpuctl.paths only ("reports" and "logs" too, which as
# words also name other things: a Slurm run's report folder, `gpuctl jobs logs`)
STATE_NAMES = {
    paths.JOBS_DB,
    paths.ACCEPT_DB,
    paths.TUI_SETTINGS,
    paths.RECORDINGS,
    paths.SCREENSHOTS,
    paths.ACCEPT_JOBS,
    paths.LOG_NAME,
}


def test_no_module_but_paths_decides_where_files_live() -> None:
    """platformdirs, XDG or state-folder variables read by hand, and the state folder's file
    names stay out of the package: gpuctl.paths decides (docstrings may name them). One
    exception, by name: the node side's ``other_tools_config_dirs``, where pip and uv on a node
    read their own configuration (not gpuctl's files; gpuctl.paths is not on a node)."""
    offenders = []
    for path in sorted((REPO / "gpuctl").rglob("*.py")):
        if path.name == "paths.py" and path.parent.name == "gpuctl":
            continue
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef) and fn.name == "other_tools_config_dirs":
                fn.body = []  # its constants are the XDG names of pip's and uv's folders
        docs = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                if any(n.split(".")[0] == "platformdirs" for n in names):
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno}: platformdirs")
            elif (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docs
                and (
                    node.value.startswith("XDG_")
                    or node.value == "GPUCTL_STATE_DIR"
                    or node.value in STATE_NAMES
                )
            ):
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.value}")
    assert offenders == []


def test_paths_import_nothing_heavy() -> None:
    code = (
        "import sys, gpuctl.paths; print(sorted(m for m in sys.modules if m.startswith('gpuctl')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['gpuctl', 'gpuctl.paths']"


def test_a_shared_jobs_dir_gets_one_folder_per_user() -> None:
    import pwd

    from gpuctl.jobs.targets import per_user

    me = pwd.getpwuid(os.getuid()).pw_name
    assert per_user("/shared/jobs/") == per_user("/shared/jobs") == f"/shared/jobs/{me}"
    assert per_user(None) is None and per_user("") is None
