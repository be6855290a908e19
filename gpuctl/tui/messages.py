"""Messages the app and its screens exchange (messages up, attributes down)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.message import Message

if TYPE_CHECKING:
    from gpuctl.accept.run import Progress


class FleetChanged(Message):
    """Some node changed; the store's pending set says which (latest wins)."""

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, FleetChanged)


class GpuSelected(Message):
    """A widget's cursor moved onto ``node``'s GPU ``gpu`` (None: the node itself); each widget
    that has a cursor posts its own subclass (``NodeList.Selected``, ``Heatmap.Selected``)."""

    def __init__(self, node: str, gpu: int | None) -> None:
        super().__init__()
        self.node = node
        self.gpu = gpu


class AcceptProgress(Message):
    """A step of the running acceptance suite (``gpuctl.accept.run.Progress``)."""

    def __init__(self, progress: Progress) -> None:
        super().__init__()
        self.progress = progress
