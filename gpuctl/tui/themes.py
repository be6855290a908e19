"""Themes as data: ``themes/*.toml`` become ``textual.theme.Theme`` objects; the choice is kept.

Installed, the files are the package ``gpuctl.themes``; in a checkout they are the repository's
top-level ``themes/`` folder (setup.py maps one onto the other).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual.theme import Theme

from gpuctl import paths

if TYPE_CHECKING:  # importlib.abc's is deprecated from 3.12, importlib.resources.abc's is 3.11+
    from importlib.abc import Traversable

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

DEFAULT_THEME = "gpuctl-dark"
_THEME_KEYS = {
    "name",
    "primary",
    "secondary",
    "warning",
    "error",
    "success",
    "accent",
    "foreground",
    "background",
    "surface",
    "panel",
    "boost",
    "dark",
    "luminosity_spread",
    "text_alpha",
    "variables",
}
_REPO_THEMES = Path(__file__).resolve().parent.parent.parent / "themes"


class ThemeFileError(ValueError):
    """A theme file is broken; the message names the file and the problem."""


def theme_files() -> list[Traversable]:
    """Every ``*.toml`` theme file, sorted by name."""
    files: list[Traversable] = []
    try:
        folder: Traversable = resources.files("gpuctl.themes")
        files = [f for f in folder.iterdir() if f.name.endswith(".toml")]
    except (ImportError, TypeError, ValueError, OSError):
        pass  # a checkout: themes/ is not a package here
    if not files and _REPO_THEMES.is_dir():
        files = [f for f in _REPO_THEMES.iterdir() if f.name.endswith(".toml")]
    return sorted(files, key=lambda f: f.name)


def parse_theme(text: str, source: str) -> Theme:
    """Build a Theme from TOML text; raises ThemeFileError naming ``source``."""
    try:
        data: dict[str, Any] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ThemeFileError(f"{source}: {e}") from None
    unknown = set(data) - _THEME_KEYS
    if unknown:
        raise ThemeFileError(f"{source}: unknown keys {', '.join(sorted(unknown))}")
    if not isinstance(data.get("name"), str) or not isinstance(data.get("primary"), str):
        raise ThemeFileError(f"{source}: a theme needs a name and a primary colour")
    try:
        return Theme(**data)
    except (TypeError, ValueError) as e:
        raise ThemeFileError(f"{source}: {e}") from None


def load_themes(files: Iterable[Traversable] | None = None) -> list[Theme]:
    """Every theme shipped with gpuctl; raises ThemeFileError for a broken file."""
    return [parse_theme(f.read_text(encoding="utf-8"), f.name) for f in files or theme_files()]


class ThemeMemory:
    """Remembers the last theme chosen in a small JSON file under the user's state folder."""

    def __init__(self, state_dir: Path | None = None) -> None:
        self.path = (state_dir if state_dir is not None else paths.state_dir()) / paths.TUI_SETTINGS

    def load(self) -> str | None:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        theme = data.get("theme") if isinstance(data, dict) else None
        return theme if isinstance(theme, str) else None

    def save(self, theme: str) -> None:
        """Write the choice atomically; a read-only home only loses the memory, never the app."""
        try:
            paths.private_dir(self.path.parent)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"theme": theme}) + "\n", encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError:
            pass
