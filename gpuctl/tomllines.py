"""Where each key of a TOML text is written: the line numbers ``tomllib`` does not give.

``tomllib`` (``tomli`` on Python 3.10) reports the line of a syntax error, and nothing else:
the dict it returns has no positions. A config mistake found after parsing (an unknown key, a
value out of range) must still say ``path:line: key: message`` (``gpuctl.config.ConfigError``),
so this module reads the text once more, line by line, for table headers and ``key =`` lines
only: ``key_lines(text)`` maps each table and dotted key path to the line it is first written
on. It is no parser: ``tomllib`` has accepted the text before this runs, so it only has to skip
what could look like a key and is not (the lines inside multi-line strings and arrays).
Best effort by design: a key it misses (one inside an inline table) takes the line of the
nearest enclosing key or table that it found, else the file's name alone.

Why not gone: ``tomli`` is the same parser as ``tomllib`` (the one Python 3.11 took in), with
the same errors and no positions, so taking it as a dependency would not give key lines either.
"""

from __future__ import annotations

import re

_KEY_PART = re.compile(r"\s*(?:\"((?:[^\"\\]|\\.)*)\"|'([^']*)'|([A-Za-z0-9_-]+))\s*")


def split_key(text: str) -> tuple[tuple[str, ...], int] | None:
    """Parse a dotted TOML key at the start of ``text``; returns (parts, chars consumed)."""
    parts: list[str] = []
    pos = 0
    while True:
        m = _KEY_PART.match(text, pos)
        if not m:
            return None
        if m.group(1) is not None:
            parts.append(m.group(1).encode().decode("unicode_escape"))
        else:
            parts.append(m.group(2) if m.group(2) is not None else m.group(3))
        pos = m.end()
        if pos < len(text) and text[pos] == ".":
            pos += 1
            continue
        return tuple(parts), pos


def key_lines(text: str) -> dict[tuple[str, ...], int]:
    """Map each table header and key path to its (first) line number, best effort.

    Multi-line strings and arrays are skipped so their contents are not read as keys.
    """
    found: dict[tuple[str, ...], int] = {}
    table: tuple[str, ...] = ()
    depth = 0  # open brackets of a multi-line array
    in_string: str | None = None
    for no, line in enumerate(text.splitlines(), 1):
        if in_string is not None:
            if line.count(in_string) % 2 == 1:
                in_string = None
            continue
        stripped = line.strip()
        if depth > 0:
            depth += _bracket_balance(stripped)
            continue
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith("["):
            inner = stripped[2:] if stripped.startswith("[[") else stripped[1:]
            parsed = split_key(inner)
            if parsed:
                table = parsed[0]
                found.setdefault(table, no)
            continue
        parsed = split_key(stripped)
        if not parsed or not stripped[parsed[1] :].startswith("="):
            continue
        keys, end = parsed
        found.setdefault((*table, *keys), no)
        value = stripped[end + 1 :].strip()
        for quote in ('"""', "'''"):
            if value.startswith(quote) and value.count(quote) == 1:
                in_string = quote
        if value.startswith("["):
            depth = _bracket_balance(value)
    return found


def _bracket_balance(s: str) -> int:
    s = re.sub(r"\"(?:[^\"\\]|\\.)*\"|'[^']*'", "", s).split("#", 1)[0]
    return s.count("[") - s.count("]")
