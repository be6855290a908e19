"""``?``: every key binding with what it does and its id (the name to remap it by), then a
legend of the badges, the heatmap's marks and the colours."""

from __future__ import annotations

from typing import ClassVar

from rich.color import Color, ColorParseError
from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Static

from gpuctl.tui.text import node_text
from gpuctl.tui.widgets.heatmap import ALARMS, MARKS, MINOR

HelpRow = tuple[str, str, str, str]  # key, description, id, where

# The GPU row's badges: what each means, and the theme colour it is drawn in.
BADGES: tuple[tuple[str, str, str], ...] = (
    ("LOST", "fell off the bus: reset the node", "error"),
    ("XID", "the driver reported an XID", "error"),
    ("ECC", "uncorrected ECC errors", "error"),
    ("REMAP", "row remap pending or failed", "error"),
    ("THERM", "slowed: too hot (software)", "warning"),
    ("HWTHERM", "slowed: too hot (hardware)", "warning"),
    ("HWSLOW", "slowed by the hardware", "warning"),
    ("PWRBRAKE", "slowed: external power brake", "warning"),
    ("PWRCAP", "at its power limit: normal", "text-muted"),
    ("BURN", "a stress burn runs (s S B)", "accent"),
)
COLOURS: tuple[tuple[str, str, str], ...] = (
    ("red", "a fault; over 85 °C", "error"),
    ("yellow", "slowdown, stale, warm", "warning"),
    ("blue", "utilization (busy is fine)", "primary"),
    ("grey", "normal states, stale rows", "text-muted"),
)


class HelpTable(DataTable[Text]):
    """The help's rows: Home and End go to the first and last row (not sideways)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("home", "first_row", "first", show=False),
        Binding("end", "last_row", "last", show=False),
    ]

    def action_first_row(self) -> None:
        self.move_cursor(row=0)

    def action_last_row(self) -> None:
        self.move_cursor(row=max(0, self.row_count - 1))


class HelpScreen(ModalScreen[None]):
    """The key bindings table and the legend; any of escape, q or ? closes it."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,question_mark", "close", "close", id="help_close"),
    ]

    def __init__(self, rows: list[HelpRow], note: str = "") -> None:
        super().__init__()
        self.rows = rows
        self.note = note

    def compose(self) -> ComposeResult:
        with Vertical(id="help-box"):
            yield Static("Keys, badges and colours  ·  esc, q or ? closes this", id="help-title")
            yield HelpTable(id="help-table", cursor_type="row", zebra_stripes=True)
            yield Static(node_text(self.note), id="help-note")

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        # "id": the note under the table says how to remap by it (a long header was cut at 80)
        table.add_columns("key", "does", "id", "where")
        for row in self.rows:
            table.add_row(*(node_text(c) for c in row))  # keys come from the user's config
        for sample, meaning, where in self.legend():
            table.add_row(sample, Text(meaning), Text(""), Text(where))
        table.focus()

    def legend(self) -> list[tuple[Text, str, str]]:
        """Rows after the keys: each badge, heatmap mark and colour with what it means, drawn
        in the colour the screen draws it in."""
        variables = self.app.current_theme.to_color_system().generate()

        def style(name: str) -> Style:
            try:  # a theme's hex colour; "text-muted" is a blend ("auto 60%"): dim
                return Style(color=Color.parse(variables.get(name, "")), bold=True)
            except ColorParseError:
                return Style(dim=True, bold=True)

        rows = [(Text(b, style(c)), meaning, "badge") for b, meaning, c in BADGES]
        for mark, meaning in MARKS:
            colour = "error" if mark in ALARMS else "text-muted" if mark in MINOR else "foreground"
            rows.append((Text(mark, style(colour)), meaning, "heatmap mark"))
        rows += [(Text(word, style(c)), meaning, "colour") for word, meaning, c in COLOURS]
        return rows

    def action_close(self) -> None:
        self.dismiss(None)
