"""DESIGN.md's import rules, checked: each headless package is imported in a fresh interpreter
and ``sys.modules`` says what came with it.

Every check fails (never skips) when its subject is missing, and checks that the probe imported
every module of the package, so that an empty walk cannot pass for a clean one."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuctl_tests.helpers import REPO, node_env

# Imports every module of the named packages (walking sub-packages), then prints sys.modules.
PROBE = r"""
import importlib, json, pkgutil, sys
for name in sys.argv[1:]:
    module = importlib.import_module(name)
    if hasattr(module, "__path__"):
        for info in pkgutil.walk_packages(module.__path__, name + "."):
            if not info.name.endswith(".__main__"):  # a program, not a module to import
                importlib.import_module(info.name)
print(json.dumps(sorted(sys.modules)))
"""

# The agent as it starts: open the simulated reader, build the Agent, install its plugins.
AGENT_PROBE = r"""
import json, sys
from gpuctl.node.agent import Agent, install_plugins
from gpuctl.node.readers import open_reader
reader, _ = open_reader("2")
install_plugins(Agent(reader, None, interval=1.0, in_fd=0, out=sys.stdout.buffer))
print(json.dumps(sorted(sys.modules)))
"""

LOGIN_ONLY = ("textual", "asyncssh", "cloudpickle", "platformdirs", "hostlist", "plotext")
# The login side's packages and modules that draw nothing: never textual, never torch.
HEADLESS = (
    "gpuctl.core",
    "gpuctl.fleet",
    "gpuctl.jobs",
    "gpuctl.reach",
    "gpuctl.accept",
    "gpuctl.config",
    "gpuctl.paths",
    "gpuctl.logs",
    "gpuctl.service",
    "gpuctl.context",
    "gpuctl.tomllines",
)


def _run(script: str, *packages: str) -> set[str]:
    result = subprocess.run(
        [sys.executable, "-c", script, *packages],
        capture_output=True,
        text=True,
        timeout=120,
        env=node_env(),
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return set(json.loads(result.stdout.strip().splitlines()[-1]))


@functools.cache
def _baseline() -> frozenset[str]:
    """What a bare interpreter has loaded already (site hooks from .pth files and the like)."""
    base = frozenset(_run(PROBE))
    # Subtracted from every probe: had a site hook loaded one of these, no check could fail.
    assert not top(set(base)) & {"gpuctl", "textual", "torch", *LOGIN_ONLY}, sorted(base)
    return base


def loaded(*packages: str, script: str = PROBE) -> set[str]:
    """The module names that importing ``packages`` (and all their modules) loads."""
    return _run(script, *packages) - _baseline()


def top(modules: set[str]) -> set[str]:
    return {m.split(".")[0] for m in modules}


def modules_of(package: str) -> set[str]:
    """Every module of ``package`` by its files (``__main__`` aside); fails when it is missing."""
    path = REPO / Path(*package.split("."))
    if path.with_suffix(".py").is_file():
        return {package}
    assert (path / "__init__.py").is_file(), f"{package} is missing: {path}"
    names = set()
    for f in path.rglob("*.py"):
        parts = f.relative_to(REPO).with_suffix("").parts
        if parts[-1] == "__main__" or not (f.parent / "__init__.py").is_file():
            continue
        names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def loaded_all(package: str) -> set[str]:
    """``loaded(package)``, after checking the probe imported every one of its modules."""
    modules = loaded(package)
    missed = modules_of(package) - modules
    assert not missed, f"the probe did not import {sorted(missed)}"
    return modules


def third_party(modules: set[str]) -> set[str]:
    """Top-level names that are neither the standard library nor gpuctl."""
    allowed = set(sys.stdlib_module_names) | set(sys.builtin_module_names) | {"gpuctl", "__main__"}
    return {m for m in top(modules) if m not in allowed}


def gpuctl_outside(modules: set[str], *inside: str) -> set[str]:
    return {m for m in modules if m.startswith("gpuctl.") and not m.startswith(inside)}


def test_node_is_standard_library_and_self_contained() -> None:
    modules = loaded_all("gpuctl.node")
    assert "gpuctl.node.agent" in modules and "gpuctl.node.readers.nvml" in modules
    assert third_party(modules) == set()  # not even pynvml: that one is imported lazily
    assert gpuctl_outside(modules, "gpuctl.node") == set()


def test_running_agent_with_plugins_stays_node_side() -> None:
    modules = loaded(script=AGENT_PROBE)
    assert third_party(modules) == set()
    assert gpuctl_outside(modules, "gpuctl.node") == set()


def test_core_is_plain_data() -> None:
    modules = loaded_all("gpuctl.core")
    # msgspec holds the wire's one schema (its Structs decode agents' lines in C); it brings
    # typing_extensions along. Nothing else.
    assert third_party(modules) <= {"msgspec", "typing_extensions"}
    # and the metric registry and the plugins' messages: plain data, the one definition of a
    # GPU reading and of a stress or acceptance message for both sides
    assert gpuctl_outside(modules, "gpuctl.core") <= {
        "gpuctl.node",
        "gpuctl.node.metrics",
        "gpuctl.node.messages",
    }


@pytest.mark.parametrize("package", HEADLESS)
def test_headless_packages_never_load_textual_or_torch(package: str) -> None:
    modules = loaded_all(package)
    assert not top(modules) & {"textual", "rich", "torch"}
    assert not {m for m in modules if m.startswith(("gpuctl.tui", "gpuctl.cli"))}


def test_workloads_never_reach_the_login_side() -> None:
    modules = loaded_all("gpuctl.workloads")
    assert not top(modules) & set(LOGIN_ONLY)
    assert gpuctl_outside(modules, "gpuctl.node", "gpuctl.workloads") == set()


def test_probe_sees_what_it_should() -> None:
    """The check itself can fail: importing the TUI does load textual (and never torch)."""
    modules = loaded_all("gpuctl.tui")
    assert "textual" in top(modules) and "gpuctl.tui.app" in modules
    assert "torch" not in top(modules)


def test_a_missing_package_fails_the_check() -> None:
    """A package that is not there is a failure, never a skip or an empty pass."""
    with pytest.raises(AssertionError, match=r"gpuctl\.nothing is missing"):
        modules_of("gpuctl.nothing")
    with pytest.raises(AssertionError):
        _run(PROBE, "gpuctl.nothing")
