"""Messages the app and its screens exchange (messages up, attributes down)."""

from __future__ import annotations

from typing import Any

from textual.message import Message


class FleetChanged(Message):
    """Some node changed; the store's pending set says which (latest wins)."""

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, FleetChanged)


class AcceptProgress(Message):
    """A step of the running acceptance suite (``gpuctl.accept.run.Progress``)."""

    def __init__(self, progress: Any) -> None:
        super().__init__()
        self.progress = progress
