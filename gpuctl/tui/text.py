"""The one way node data reaches the screen: ``node_text(value)``, a ``rich.text.Text``.

Everything a node, a job or Slurm sent (hostnames, process names and command lines, error texts,
burn reasons, gpu-burn output, suite lines, event details, job names) is data. It is shown as a
``Text`` built from ``gpuctl.core.text.printable`` (escape sequences and control characters
removed), never parsed as Textual or Rich markup: ``Static.update(f"...{name}")``,
``Label(f"...")``, a ``str`` cell in a ``DataTable``, ``Content.from_markup`` and
``Text.from_markup``/``from_ansi`` all parse markup, and a process named ``[bold]x[/`` would
crash the screen. Widgets drawn with the Line API put ``node_str(value)`` into their segments.
Notifications go through ``GpuctlApp.notify``, which does the same for the whole message.
"""

from __future__ import annotations

import os

from rich.style import Style
from rich.text import Text
from textual.content import Content

from gpuctl.core.text import printable


def node_str(value: object, *, limit: int | None = None, one_line: bool = True) -> str:
    """``value`` as a plain string safe for a segment of a Line-API widget."""
    return printable(value, one_line=one_line, limit=limit)


def node_text(
    value: object,
    style: str | Style = "",
    *,
    limit: int | None = None,
    one_line: bool = True,
) -> Text:
    """``value`` as a ``Text`` in ``style``: never markup, no control characters.

    ``limit`` cuts it to that many characters (an ellipsis last); ``one_line`` (the default)
    turns tabs and line breaks into spaces, for a table cell or a header line.
    """
    return Text(printable(value, one_line=one_line, limit=limit), style=style, end="")


def node_content(*parts: object, one_line: bool = False) -> Content:
    """A ``Content`` assembled from parts, each a value or a ``(value, style)`` pair, every value
    made printable; for lines that mix gpuctl's words with node data in theme styles
    (``"$primary bold"``). Multi-line unless ``one_line``."""
    pieces: list[str | tuple[str, str]] = []
    for part in parts:
        if isinstance(part, tuple) and len(part) == 2 and isinstance(part[1], str):
            pieces.append((printable(part[0], one_line=one_line), part[1]))
        else:
            pieces.append(printable(part, one_line=one_line))
    return Content.assemble(*pieces)


def short_path(path: object, width: int | None = None) -> str:
    """A path to show: under the home folder ``~``-relative, and when still wider than
    ``width`` cut in the middle of its folders (the file's name stays whole while it fits)."""
    text = str(path)
    home = os.path.expanduser("~")
    if home not in ("", "/", "~") and (text == home or text.startswith(home + os.sep)):
        text = "~" + text[len(home) :]
    if width is None or len(text) <= width or width < 2:
        return text
    tail = max(len(os.path.basename(text)) + 1, width // 2)
    head = width - 1 - tail
    if head <= 0:
        return "…" + text[len(text) - (width - 1) :]
    return text[:head] + "…" + text[-tail:]
