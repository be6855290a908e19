"""Themes are data files that load into Textual themes; the choice is remembered."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuctl.tui.themes import ThemeFileError, ThemeMemory, load_themes, parse_theme, theme_files

ROOT = Path(__file__).resolve().parents[2]


def test_shipped_themes_load() -> None:
    names = [t.name for t in load_themes()]
    assert {"gpuctl-dark", "gpuctl-light", "gpuctl-high-contrast"} <= set(names)
    assert {f.name for f in theme_files()} == {p.name for p in (ROOT / "themes").glob("*.toml")}


def test_no_colour_in_code_or_stylesheet() -> None:
    """Colours live in themes/*.toml only (STYLE.md): no hex colour in the TUI's code or TCSS."""
    import re

    offenders = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "gpuctl" / "tui").rglob("*")
        if p.suffix in (".py", ".tcss") and re.search(r"#[0-9a-fA-F]{6}\b", p.read_text())
    ]
    assert offenders == []


def test_broken_theme_file_says_which_and_why() -> None:
    with pytest.raises(ThemeFileError, match=r"^bad\.toml: unknown keys colour$"):
        parse_theme('name = "x"\nprimary = "#000000"\ncolour = 1\n', "bad.toml")
    with pytest.raises(ThemeFileError, match=r"^bad\.toml: a theme needs a name"):
        parse_theme('primary = "#000000"\n', "bad.toml")
    with pytest.raises(ThemeFileError, match=r"^bad\.toml: "):
        parse_theme("name = \n", "bad.toml")


def test_theme_memory_round_trip(tmp_path: Path) -> None:
    memory = ThemeMemory(tmp_path / "state")
    assert memory.load() is None
    memory.save("gpuctl-light")
    assert ThemeMemory(tmp_path / "state").load() == "gpuctl-light"
    (tmp_path / "state" / "tui.json").write_text("{not json")
    assert memory.load() is None
