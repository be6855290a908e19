"""The data-is-data rule, read from the source: no widget hands an f-string to an API that
parses markup, and nothing in the TUI parses markup or ANSI on purpose. (The hostile-node test
in test_hostile.py checks the same on the screen; this one names the line.)"""

from __future__ import annotations

import ast
from pathlib import Path

from rich.text import Text

from gpuctl.tui.text import node_content, node_str, node_text

TUI = Path(__file__).resolve().parents[2] / "gpuctl" / "tui"
# Widget methods and constructors that parse a str argument as markup (or write it raw).
TAKES_MARKUP = {"update", "write", "add_row", "add_rows", "update_cell", "add_column"}
WIDGETS = {"Label", "Static", "Button"}
NEVER = {"from_markup", "from_ansi"}


def offences(source: str, name: str = "<test>") -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        where = f"{name}:{node.lineno}"
        if called in NEVER:
            found.append(f"{where}: {called}() parses its text")
        for kw in node.keywords:
            if kw.arg == "markup" and not (
                isinstance(kw.value, ast.Constant) and kw.value.value is False
            ):
                found.append(f"{where}: markup= other than False")
        if called in TAKES_MARKUP or called in WIDGETS:
            for arg in node.args:
                if isinstance(arg, ast.JoinedStr) or (
                    isinstance(arg, ast.BinOp) and isinstance(arg.op, ast.Add | ast.Mod)
                ):
                    found.append(f"{where}: {called}() of a built string: use node_text()")
    return found


def test_no_widget_parses_a_built_string_as_markup() -> None:
    found = []
    for path in sorted(TUI.rglob("*.py")):
        found += offences(path.read_text(), str(path.relative_to(TUI)))
    assert found == []


def test_the_rule_sees_what_it_bans() -> None:
    bad = """
label = Label(f"host {name}")
static.update("node " + name)
table.add_row(f"{cmd}", "x")
log.write(f"{node}: {line}")
app.notify(text, markup=True)
Text.from_markup(name)
Content.from_markup(name)
Text.from_ansi(output)
"""
    assert len(offences(bad)) == 8
    good = """
label = Label(node_text(name))
static.update(node_text(f"host {name}"))
table.add_row(Text("a"), node_text(cmd))
app.notify(f"{node}: {text}", markup=False)
"""
    assert offences(good) == []


def test_node_text_is_text_never_markup() -> None:
    t = node_text("[bold]x[/ \x1b[2J", "bold", limit=20)
    assert isinstance(t, Text) and t.plain == "[bold]x[/ " and not t.spans
    assert str(t.style) == "bold"
    assert node_str("a\x1b]0;t\x07b\nc") == "ab c"
    assert node_content(("[b]\x1b[1m", "$primary"), "\nz").plain == "[b]\nz"
