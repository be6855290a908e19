"""Every glyph the screen draws, with its ASCII twin: the one table of ASCII mode.

The list, the header, the heatmap, the sparklines and bars, the detail screen's plots and
Textual's own borders and scrollbars draw characters a terminal without Unicode (``LANG=C``, an
old serial console) shows as garbage. In ASCII mode (``[tui] ascii = true``, ``--ascii``, or
automatically when the locale cannot encode these glyphs: ``wanted``) the app adds
``AsciiFilter`` to Textual's line filters: every line of every widget goes out with each
non-ASCII character replaced by its twin, one cell for one cell, so no layout moves. ``GLYPHS``
names gpuctl's own (``gpuctl_tests/tui/test_ascii.py`` fails on a glyph in the TUI's code
without a twin); box drawing, block elements and braille (borders, plots) are mapped by their
shape (``twin``); anything else, node text included, becomes ``?`` (``??`` when two cells wide).
"""

from __future__ import annotations

import os
import sys
import unicodedata
from collections.abc import Mapping

from rich.cells import get_character_cell_size
from rich.segment import Segment
from textual.color import Color
from textual.filter import LineFilter

# gpuctl's glyphs -> their ASCII twins (each one cell, as the glyph)
GLYPHS: dict[str, str] = {
    "·": ".",  # separator of words in titles and status lines
    "°": " ",  # 85°C -> 85 C
    "×": "x",  # counts: 8× H100, XID×2
    "…": "~",  # cut text, still connecting
    "±": "+",
    "≤": "<",  # at or below a threshold (allocated but idle: traffic ≤5%)
    "↓": "v",  # sort order, network in
    "↑": "^",  # sort order, network out
    "←": "<",
    "→": ">",
    "⏎": "<",  # the Enter key, where not drawn as a key (``KEY_NAMES``)
    "␣": "_",  # the space key in the footer
    "▶": ">",  # the cursor's row; a running stage
    "◀": "<",  # the heatmap's cursor
    "●": "*",  # node live
    "◐": "o",  # node stale
    "○": "o",  # node connecting
    "✖": "X",  # node down
    "✕": "!",  # GPU lost (X is the heatmap's XID)
    # sparklines and bars: the eighths of a cell
    "▁": "_",
    "▂": "_",
    "▃": "-",
    "▄": "-",
    "▅": "=",
    "▆": "=",
    "▇": "#",
    "█": "#",
    "▏": "|",
    "▎": "|",
    "▍": "|",
    "▌": "|",
    "▋": "#",
    "▊": "#",
    "▉": "#",
    # the process tree's branches
    "├": "+",
    "└": "`",
    "│": "|",
    "─": "-",
    "━": "=",  # a horizontal scrollbar's thumb (on a ─ track)
}

# Keys the footer, the help and the palette name in ASCII mode (``GpuctlApp.get_key_display``)
# instead of their glyph's twin, which would not read as the key (``<`` for Enter).
KEY_NAMES: dict[str, str] = {"⏎": "Enter"}


def twin(char: str) -> str:
    """The ASCII twin of ``char`` (itself when ASCII), as many cells wide."""
    if char.isascii():
        return char
    found = GLYPHS.get(char)
    if found is not None:
        return found
    code = ord(char)
    name = unicodedata.name(char, "")
    if 0x2500 <= code <= 0x257F:  # box drawing: borders, frames
        if any(w in name.split() for w in ("AND", "DOWN", "UP", "ARC")):
            return "+"  # corners and junctions
        if "HORIZONTAL" in name:
            return "=" if "DOUBLE" in name else "-"
        return "|" if "VERTICAL" in name else "+"
    if 0x2580 <= code <= 0x259F:  # block elements: bars, scrollbars, plot cells
        return "#" if "FULL" in name or "SHADE" in name else ":"
    if code == 0x2800:
        return " "
    if 0x2801 <= code <= 0x28FF:  # braille: plot dots
        return "."
    if unicodedata.category(char) == "Zs":  # no-break and other spaces
        return " "
    if unicodedata.combining(char):
        return ""
    return "?" * max(1, get_character_cell_size(char))


class _Table(dict[int, str]):
    """``str.translate``'s table: each code point's twin, worked out once."""

    def __missing__(self, code: int) -> str:
        value = twin(chr(code))
        self[code] = value
        return value


TABLE = _Table()


def to_ascii(text: str) -> str:
    return text if text.isascii() else text.translate(TABLE)


class AsciiFilter(LineFilter):
    """Textual's line filter of ASCII mode: every segment's text through ``to_ascii``."""

    def apply(self, segments: list[Segment], background: Color) -> list[Segment]:
        if all(s.text.isascii() for s in segments):
            return segments
        return [
            s if s.text.isascii() else Segment(to_ascii(s.text), s.style, s.control)
            for s in segments
        ]


C_LOCALES = {"C", "POSIX"}
COERCED = {"C.UTF-8", "C.utf8", "C.UTF8", "UTF-8"}  # what Python sets for a C locale (PEP 538)


def locale_is_ascii(environ: Mapping[str, str], encoding: str | None) -> bool:
    """Whether the terminal's locale cannot show the glyphs: the output's ``encoding`` cannot
    encode them, or the locale asked for is C or POSIX by name (``LANG=C``; Python runs it as
    UTF-8 anyway: PEP 538 sets ``LC_CTYPE=C.UTF-8`` and PEP 540 turns UTF-8 mode on, so the
    encoding alone hides it). No locale set at all is not taken for ASCII: an ssh session
    without ``LANG`` usually ends at a terminal that shows Unicode."""
    try:
        "".join(GLYPHS).encode(encoding or "ascii")
    except (LookupError, UnicodeEncodeError):
        return True
    lc_all = environ.get("LC_ALL", "")
    if lc_all:
        return lc_all in C_LOCALES
    ctype, lang = environ.get("LC_CTYPE", ""), environ.get("LANG", "")
    if ctype in COERCED and lang in C_LOCALES:
        return True  # coerced from LANG=C by Python, not chosen
    return (ctype or lang) in C_LOCALES


def wanted(setting: bool | None) -> bool:
    """ASCII mode: as the config or ``--ascii`` says (``setting``), else from the locale; never
    by itself in a browser (``gpuctl serve``: the server's locale says nothing of it)."""
    if setting is not None:
        return setting
    stream = sys.__stdout__
    encoding = getattr(stream, "encoding", None) if stream is not None else None
    if not locale_is_ascii(os.environ, encoding):
        return False
    from gpuctl.tui.serve import served  # only here: it brings aiohttp's server (~12 MB)

    return not served()
