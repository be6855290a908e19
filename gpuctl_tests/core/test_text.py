"""``printable``: what a node sent, made safe for a terminal cell."""

from __future__ import annotations

import re

import pytest

from gpuctl.core.text import printable

ESC_CASES = [
    ("\x1b]0;pwn\x07title", "title"),  # OSC ended by BEL: renames the window
    ("\x1b]8;;file:///etc/passwd\x1b\\link\x1b]8;;\x1b\\", "link"),  # OSC 8 hyperlink
    ("\x1b[2Jcleared", "cleared"),  # CSI: clear the screen
    ("\x1b[38;2;255;0;0mred\x1b[0m", "red"),
    ("\x1bPq#0;2;0;0;0\x1b\\sixel", "sixel"),  # DCS
    ("\x1b7saved\x1b8", "saved"),  # two-character escapes
    ("\x1b(Bcharset", "charset"),
    ("\x9b2Jc1", "2Jc1"),  # 8-bit CSI: the C1 character goes, the rest is text
    ("\x1b]0;never ended", ""),  # an OSC with no terminator swallows the rest
    ("trailing\x1b", "trailing"),
]


@pytest.mark.parametrize(("raw", "shown"), ESC_CASES)
def test_escape_sequences_are_removed(raw: str, shown: str) -> None:
    assert printable(raw) == shown


def test_no_control_character_survives() -> None:
    every = "".join(chr(c) for c in range(0x110))
    out = printable(every, one_line=False)
    assert not [c for c in out if (ord(c) < 0x20 and c not in "\t\n") or 0x7F <= ord(c) <= 0x9F]
    assert "\t" in out and "\n" in out and "ÿ" in out  # text around them stays
    one = printable(every)
    assert not [c for c in one if ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F]


def test_line_breaks_and_tabs() -> None:
    assert printable("a\tb\r\nc\nd\re\u2028f") == "a b c d e f"
    assert printable("a\tb\r\nc\u2029d", one_line=False) == "a\tb\nc\nd"


def test_markup_is_left_as_text() -> None:
    """Markup is not this function's business: it is shown literally (``Text``, not markup)."""
    assert printable("[bold]x[/ [link=file:///etc/passwd]y[/link]") == (
        "[bold]x[/ [link=file:///etc/passwd]y[/link]"
    )


def test_bidi_overrides_and_bom_go_other_unicode_stays() -> None:
    assert printable("\u202eevil\u202c \ufeffok") == "evil ok"
    assert printable("GPU 0 · 80°C ✓ 日本 \u00a0nbsp") == "GPU 0 · 80°C ✓ 日本 \u00a0nbsp"


def test_any_value_becomes_text() -> None:
    assert printable(None) == ""
    assert printable(b"\xffok\x1b[1m") == "\ufffdok"
    assert printable(3.5) == "3.5"
    assert printable(float("nan")) == "nan"
    assert printable(10**5000) == "<int>"  # str() refuses it: still a value, never a raise

    class Broken:
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert printable(Broken()) == "<Broken>"


def test_limit_cuts_with_an_ellipsis() -> None:
    assert printable("abcdef", limit=4) == "abc…"
    assert printable("abcd", limit=4) == "abcd"
    assert printable("x" * 10**6, limit=10) == "x" * 9 + "…"


def test_lines_with_nothing_to_change_are_kept_and_the_rest_are_cleaned() -> None:
    """The multi-line fast path (one scan, then the text as it is) lets nothing through that
    the full path removes: every character of the BMP after a line break."""
    for code in range(0x10000):
        c = chr(code)
        out = printable(f"a\n{c}b", one_line=False)
        if c in "\r\u2028\u2029\x85":
            assert out == "a\n\nb", hex(code)
        elif c == "\x1b":
            assert out == "a\n"  # "ESC b" is an escape sequence of its own
        elif re.fullmatch(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", c):
            assert out == "a\nb", hex(code)  # the controls but tab and line feed
        elif c in "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\ufeff":
            assert out == "a\nb", hex(code)
        else:
            assert out == f"a\n{c}b", hex(code)


def test_the_cli_stream_keeps_line_ends_and_removes_the_rest() -> None:
    """``CleanText``, the CLI's stdout and stderr: CR LF stays (a CSV's line ends), a lone CR
    (it would let a line overwrite another) becomes a line break, escapes go, each write
    answers the length it was given."""
    import io

    from gpuctl.core.text import CleanText

    out = io.StringIO()
    stream = CleanText(out)
    for text in ("a\x1b]52;c;eA==\x07b\r\n", "c\rd\r\n", "e\x9bf\n", "ok\r\n", "\u202egnp.exe\n"):
        assert stream.write(text) == len(text)
    assert out.getvalue() == "ab\r\nc\nd\r\nef\nok\r\ngnp.exe\n"
