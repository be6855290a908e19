"""No two files of gpuctl import each other, directly or round a circle (docs/architecture.md's
import rule): what two files both need moves down a floor. Every import counts that runs, at a
module's top or inside a function; ``if TYPE_CHECKING:`` blocks do not (mypy alone reads them).

The agent's plugins (``node/agent`` <-> ``node/stress``, ``node/accept``) register with the
agent that imports them: that circle is the one the rule allows (today the plugins name the agent
in ``TYPE_CHECKING`` alone, so it is not one at run time). A circle still left would be named
in ``LEFT`` with why (none is today); the test fails on any other, and on one of these once it
is gone (so the list only shrinks)."""

from __future__ import annotations

import ast
from pathlib import Path

from gpuctl_tests.helpers import REPO

PACKAGE = REPO / "gpuctl"

LEFT: dict[frozenset[str], str] = {}


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        if "__pycache__" in path.parts:
            continue
        name = ".".join(path.relative_to(REPO).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = path
    return mods


def _imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    out: set[str] = set()
    is_package = path.name == "__init__.py"

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
                continue
            if isinstance(node, ast.Import):
                out.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = name.split(".") if is_package else name.split(".")[:-1]
                    parts = parts[: len(parts) - (node.level - 1)]
                    base = ".".join([*parts, *([node.module] if node.module else [])])
                subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in mods]
                out.update(subs)
                if len(subs) < len(node.names):
                    out.add(base)
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(node, field, None)
                if isinstance(inner, list):
                    visit([n for n in inner if isinstance(n, ast.stmt)])
                    for h in inner:
                        if isinstance(h, ast.ExceptHandler):
                            visit(h.body)

    visit(ast.parse(path.read_text()).body)
    return {m for m in out if m in mods and m != name}


def circles() -> list[frozenset[str]]:
    """Every set of gpuctl modules that import each other round a circle (Tarjan's SCCs)."""
    mods = _modules()
    graph = {m: _imports(m, p, mods) for m, p in mods.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[frozenset[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(frozenset(comp))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


PLUGINS = frozenset({"gpuctl.node.agent", "gpuctl.node.stress", "gpuctl.node.accept"})


def test_no_import_circle_but_the_agents_plugins_and_those_named() -> None:
    found = set(circles())
    found.discard(PLUGINS)  # allowed (today the plugins name the agent for mypy alone)
    new = [sorted(c) for c in found - set(LEFT)]
    assert not new, f"files that import each other: {new}: move what both need down a floor"
    gone = [sorted(c) for c in set(LEFT) - found]
    assert not gone, f"a named circle is gone or changed: {gone}: take it out of LEFT"


def test_the_finder_sees_a_circle_through_a_late_import(tmp_path: Path) -> None:
    """The walk counts imports inside functions and leaves TYPE_CHECKING blocks out."""
    a = ast.parse("def f():\n    from gpuctl import paths\n")
    b = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import gpuctl.paths\n")
    mods = {"gpuctl.paths": PACKAGE / "paths.py", "x": tmp_path / "x.py"}
    (tmp_path / "x.py").write_text(ast.unparse(a))
    assert _imports("x", tmp_path / "x.py", mods) == {"gpuctl.paths"}
    (tmp_path / "x.py").write_text(ast.unparse(b))
    assert _imports("x", tmp_path / "x.py", mods) == set()
