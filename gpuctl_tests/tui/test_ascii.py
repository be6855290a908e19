"""ASCII mode: with ``[tui] ascii = true`` (``--ascii``, or a C locale) nothing but ASCII reaches
the terminal, on the main screen, the heatmap and the detail screen; every glyph the TUI's code
draws has its twin in the one table (``gpuctl.tui.glyphs.GLYPHS``)."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest
from textual.widgets import DataTable

from gpuctl.cli.common import add_ascii_option
from gpuctl.config import TuiSettings
from gpuctl.tui import glyphs
from gpuctl_tests.helpers import open_detail
from gpuctl_tests.tui.conftest import replay_app, rows_view, settle
from gpuctl_tests.tui.test_hostile import drawn

TUI = Path(glyphs.__file__).parent


def not_ascii(text: str) -> list[str]:
    return sorted({c for c in text if not c.isascii()})


@pytest.mark.parametrize("size", [(80, 24), (120, 40), (200, 60)], ids=lambda s: f"{s[0]}x{s[1]}")
async def test_ascii_mode_draws_only_ascii_on_the_main_screen_heatmap_and_detail(
    tmp_path: Path, size: tuple[int, int]
) -> None:
    app = replay_app(tmp_path, tui=TuiSettings(ascii=True))
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        await rows_view(pilot)  # the rows' bars, sparklines, degrees and badges
        assert "gpu-a01" in drawn(app)
        assert not_ascii(drawn(app)) == [], "the GPU list"
        await pilot.press("v")  # one line per node: its bars and state dots
        assert not_ascii(drawn(app)) == [], "the compact list"
        await pilot.press("v", "m")
        await pilot.pause()
        assert app.overview.mode != "list"
        assert not_ascii(drawn(app)) == [], "the heatmap"
        await pilot.press("escape")
        await open_detail(pilot, "gpu-a01", 2)
        await pilot.pause()
        text = drawn(app)
        assert "gpu-a01" in text
        assert not_ascii(text) == [], "the detail screen"


async def test_without_ascii_mode_the_glyphs_are_drawn(tmp_path: Path) -> None:
    """The other side: the same screen with Unicode draws its glyphs (the test above could not
    pass by drawing nothing)."""
    app = replay_app(tmp_path, tui=TuiSettings(ascii=False))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await rows_view(pilot)
        assert not_ascii(drawn(app)) != []


def literal_glyphs(path: Path) -> set[str]:
    """The non-ASCII characters of ``path``'s string literals that draw something (not the
    invisible ones ``core.text`` removes), docstrings left out."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return {
        c
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        if id(node) not in docstrings
        for c in node.value
        if not c.isascii() and c.isprintable()
    }


def test_every_glyph_of_the_tui_has_its_ascii_twin_in_the_one_table() -> None:
    files = [*TUI.rglob("*.py"), TUI.parent / "core" / "format.py", TUI.parent / "core" / "text.py"]
    missing = {
        f"{path.relative_to(TUI.parent)}: {c!r}"
        for path in files
        for c in literal_glyphs(path)
        if c not in glyphs.GLYPHS
    }
    assert not missing, "add each glyph's ASCII twin to gpuctl/tui/glyphs.py GLYPHS"
    for glyph, twin in glyphs.GLYPHS.items():
        assert twin.isascii() and len(twin) == 1, glyph  # one cell for one cell: no layout moves


def test_shapes_without_an_entry_get_a_twin_of_their_width() -> None:
    assert glyphs.to_ascii("╭─┤ 85°C ▕█▌⣿ 漢") == "+-+ 85 C :#|. ??"


@pytest.mark.parametrize(
    ("environ", "encoding", "ascii"),
    [
        ({"LANG": "en_US.UTF-8"}, "utf-8", False),
        ({}, "utf-8", False),  # nothing set: an ssh session, usually a Unicode terminal
        ({"LANG": "C"}, "utf-8", True),  # Python's UTF-8 mode for a C locale
        ({"LANG": "C", "LC_CTYPE": "C.UTF-8"}, "utf-8", True),  # coerced (PEP 538)
        ({"LC_ALL": "POSIX", "LANG": "en_US.UTF-8"}, "utf-8", True),
        ({"LC_ALL": "en_US.UTF-8", "LANG": "C"}, "utf-8", False),
        ({"LANG": "en_US.UTF-8"}, "ascii", True),
        ({"LANG": "en_US.ISO-8859-1"}, "latin-1", True),  # no box drawing in latin-1
    ],
)
def test_the_locale_decides_when_nothing_is_set(
    environ: dict[str, str], encoding: str, ascii: bool
) -> None:
    assert glyphs.locale_is_ascii(environ, encoding) is ascii


def test_the_flag_and_the_key_win_over_the_locale(monkeypatch: pytest.MonkeyPatch) -> None:
    p = argparse.ArgumentParser()
    add_ascii_option(p)
    assert p.parse_args(["--ascii"]).ascii is True and p.parse_args([]).ascii is None
    monkeypatch.setenv("LANG", "C")
    monkeypatch.delenv("LC_ALL", raising=False)
    monkeypatch.delenv("LC_CTYPE", raising=False)
    assert glyphs.wanted(None) is True
    assert glyphs.wanted(True) is True and glyphs.wanted(False) is False
    # a browser's screen (gpuctl serve) shows Unicode whatever the server's locale
    monkeypatch.setenv("TEXTUAL_DRIVER", "textual.drivers.web_driver:WebDriver")
    assert glyphs.wanted(None) is False and glyphs.wanted(True) is True


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=lambda s: f"{s[0]}x{s[1]}")
async def test_ascii_mode_names_the_enter_key_in_the_footer_and_the_help(
    tmp_path: Path, size: tuple[int, int]
) -> None:
    """Enter's glyph has a one-cell twin ``<``, which reads as a key of its own: the footer and
    the help say ``Enter`` in ASCII mode, and the events screen's footer still fits."""
    from gpuctl.tui.screens.events import EventsScreen
    from gpuctl.tui.screens.help import HelpScreen
    from gpuctl_tests.helpers import until
    from gpuctl_tests.tui.test_usability import footer_items

    app = replay_app(tmp_path, tui=TuiSettings(ascii=True))
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        await pilot.press("e")
        await until(pilot, lambda: isinstance(app.screen, EventsScreen), "the events screen")
        await pilot.pause()
        footer = drawn(app).splitlines()[-1]
        assert "Enter acknowledge" in footer and "< acknowledge" not in footer, footer
        items = footer_items(app)
        assert [w for w, _, _ in items][-2:] == ["help", "quit"], items
        assert max(right for _, _, right in items) <= size[0], items
        assert not_ascii(drawn(app)) == []
        await pilot.press("escape", "question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), "help")
        await pilot.pause()
        table = app.screen.query_one("#help-table", DataTable)
        keys = [str(table.get_row_at(i)[0]) for i in range(table.row_count)]
        assert "Enter" in keys and keys.index("Enter") < keys.index("esc"), keys
