"""A yes/no question in a modal dialog; dismisses with True or False."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label

from gpuctl.tui.text import node_text


class ConfirmScreen(ModalScreen[bool]):
    """Ask before something that burns GPUs or stops them."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "yes", id="confirm_yes"),
        Binding("n,escape", "answer(False)", "no", id="confirm_no"),
    ]

    def __init__(self, question: str, yes: str = "Yes", no: str = "No") -> None:
        super().__init__()
        self.question = question
        self.yes = yes
        self.no = no

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-box"):
            # Questions name nodes and jobs: text, never markup.
            yield Label(node_text(self.question, one_line=False), id="confirm-question")
            with Horizontal(id="confirm-buttons"):
                yield Button(node_text(f"{self.yes} (y)"), id="confirm-yes", variant="error")
                yield Button(node_text(f"{self.no} (n)"), id="confirm-no", variant="primary")

    def on_mount(self) -> None:
        self.query_one("#confirm-no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "confirm-yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
