"""``?``: every key binding with what it does and its id (the name to remap it by)."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Static

from gpuctl.tui.text import node_text

HelpRow = tuple[str, str, str, str]  # key, description, id, where


class HelpScreen(ModalScreen[None]):
    """The key bindings table; any of escape, q or ? closes it."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,question_mark", "close", "close", id="help_close"),
    ]

    def __init__(self, rows: list[HelpRow], note: str = "") -> None:
        super().__init__()
        self.rows = rows
        self.note = note

    def compose(self) -> ComposeResult:
        with Vertical(id="help-box"):
            yield Static("Keys", id="help-title")
            yield DataTable(id="help-table", cursor_type="row", zebra_stripes=True)
            yield Static(node_text(self.note), id="help-note")

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("key", "does", Text("id (remap in [tui.keys])"), "where")
        for row in self.rows:
            table.add_row(*(node_text(c) for c in row))  # keys come from the user's config
        table.focus()

    def action_close(self) -> None:
        self.dismiss(None)
