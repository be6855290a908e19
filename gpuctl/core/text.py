"""Text that came from outside (a node, a job, Slurm) made safe to put on a terminal.

Whatever a node sends is data: a process name may hold ``\\x1b]0;title\\x07`` (a terminal escape
that renames the window), ``\\x1b[2J`` (clear the screen), NUL bytes or C1 controls, or be
megabytes long. ``printable`` turns any value into a ``str`` that holds none of that: escape
sequences (CSI, OSC, DCS and their kin), the C0 and C1 control characters, DEL and the Unicode
bidirectional overrides are removed; tabs and line breaks become spaces on a one-line value.
It says nothing about markup: the TUI wraps the result in ``rich.text.Text``
(``gpuctl.tui.text.node_text``), never in markup. Standard library only.

``CleanText`` is the same step for a stream: the CLI's stdout and stderr go through it whatever
they are connected to (a terminal, a pipe into ``grep`` or ``tail`` that ends on a terminal, a
file a person will ``cat``), so a process name, a model or a job's output never reaches the
operator's terminal as an escape. What is meant to be bytes takes ``buffer`` explicitly
(``gpuctl logs --raw``, ``gpuctl result -o -``).
"""

from __future__ import annotations

import io
import re
from typing import Any, TextIO

ELLIPSIS = "…"

# An escape sequence as a terminal would swallow it: CSI (ESC [ params final), OSC/DCS/SOS/PM/APC
# strings up to their terminator (BEL or ESC \, or the end of the text when it never comes),
# or a two- or three-character escape (ESC ( B, ESC 7, ...). The 8-bit forms start with C1
# characters, which the control class below removes one by one.
_ESCAPE = re.compile(
    r"\x1b(?:"
    r"\[[0-?]*[ -/]*[@-~]?"  # CSI
    r"|[\]PX^_][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC, DCS, SOS, PM, APC
    r"|[ -/]*[0-~]?"  # nF / Fp / Fe / Fs escapes, or a lone ESC
    r")"
)
# C0 controls but tab and line breaks, DEL, C1 controls, the bidirectional embeddings, overrides
# and isolates (they reorder what follows on a terminal that honours them), and BOM.
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ufeff]")
_LINE_BREAKS = re.compile("\r\n|[\r\n\u2028\u2029\x85]")
# Anything a multi-line ``printable`` changes: escapes (ESC is C0), controls, CR and the other
# line breaks but ``\n``, the bidirectional controls. One C-level scan says a text is clean.
_CHANGED_MULTILINE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff]"
)
# What ``CleanText`` changes: the same but CR, which it keeps where it ends a line (CR LF).
_CHANGED_IN_STREAM = re.compile(
    "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff]"
)


def printable(value: object, *, one_line: bool = True, limit: int | None = None) -> str:
    """``value`` as text with nothing a terminal would act on.

    ``None`` becomes ""; bytes are decoded as UTF-8 (bad bytes become U+FFFD); anything else
    goes through ``str()``. With ``one_line`` (the default) tabs and line breaks become spaces;
    otherwise line breaks become ``\\n`` and tabs stay. ``limit`` cuts the result to that many
    characters, the last one an ellipsis. Never raises.
    """
    if value is None:
        text = ""
    elif isinstance(value, str):
        text = value
    elif isinstance(value, bytes | bytearray):
        text = bytes(value).decode("utf-8", "replace")
    else:
        try:
            text = str(value)
        except Exception:  # a huge int (str() refuses over 4300 digits) or a broken __str__
            text = f"<{type(value).__name__}>"
    # the common case costs one C-level scan: a line, or lines with nothing to change
    clean = text.isprintable() or (not one_line and not _CHANGED_MULTILINE.search(text))
    if not clean:
        text = _ESCAPE.sub("", text)
        text = _LINE_BREAKS.sub(" " if one_line else "\n", text)
        if one_line:
            text = text.replace("\t", " ")
        text = _CONTROL.sub("", text)
    if limit is not None and len(text) > limit:
        text = text[: max(0, limit - 1)] + ELLIPSIS
    return text


class CleanText(io.TextIOBase):
    """A text stream that lets no escape sequence or control character through: what a command
    prints may hold what a node sent (a process name, a model, an error text, a suite's line, a
    job's output), which must not retitle the window, write the clipboard or move the cursor,
    on a terminal or at the end of a pipe. Line breaks and tabs stay (``printable`` with
    ``one_line=False``); ``control`` writes gpuctl's own sequences (colours on a terminal)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        clean = text
        # most text is written as it is after a scan or three (C-level)
        if _CHANGED_IN_STREAM.search(text) or text.count("\r") != text.count("\r\n"):
            # a CR LF stays (a CSV's line ends; harmless on a terminal), a lone CR does not
            clean = "\r\n".join(printable(p, one_line=False) for p in text.split("\r\n"))
        self.stream.write(clean)
        return len(text)

    def control(self, sequence: str) -> None:
        """Write a control sequence of gpuctl's own (a live line's ``\r\x1b[K``) as it is."""
        self.stream.write(sequence)

    @property
    def buffer(self) -> Any:
        """The binary stream below, for output that is bytes on purpose (``logs --raw``):
        flush this stream first."""
        return self.stream.buffer

    def flush(self) -> None:
        self.stream.flush()

    def fileno(self) -> int:
        return self.stream.fileno()

    def isatty(self) -> bool:
        try:
            return bool(self.stream.isatty())
        except (AttributeError, ValueError, OSError):
            return False

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return str(getattr(self.stream, "encoding", "utf-8"))
