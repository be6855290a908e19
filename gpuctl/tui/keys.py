"""Which keys the footer offers, changed while the app runs (a pane shown, a filter kept)."""

from __future__ import annotations

from dataclasses import replace

from textual.binding import Binding
from textual.dom import DOMNode
from textual.widget import Widget
from textual.widgets import Input

# n / N: the next and previous GPU in trouble, in the list, the compact view and the heatmap
# (each calls its own ``action_problem``). The footer says "n trouble" (80 columns); help and
# the palette show the tooltip.
TROUBLE_KEYS = (
    Binding("n", "problem(1)", "trouble", id="next_problem", tooltip="next GPU in trouble"),
    Binding(
        "N",
        "problem(-1)",
        "previous trouble",
        show=False,
        id="prev_problem",
        tooltip="previous GPU in trouble",
    ),
)


def offer(node: DOMNode, binding_id: str, shown: bool, description: str | None = None) -> None:
    """Show (or hide) ``node``'s binding ``binding_id`` in the footer, under whatever key the
    user mapped it to; its key works either way. ``description`` renames it."""
    bindings = node._bindings.key_to_bindings
    changed = False
    for key, found in bindings.items():
        if any(b.id == binding_id for b in found):
            bindings[key] = [
                replace(b, show=shown, description=description or b.description)
                if b.id == binding_id
                else b
                for b in found
            ]
            changed = True
    if changed:
        node.refresh_bindings()


def escape_filter(box: Input, back_to: Widget) -> bool:
    """Esc on a screen with a filter box (the main screen's ``/``, the process view's): close
    the box, clearing it, and give the focus ``back_to``; else clear a kept filter. False when
    there was no filter (Esc then does the screen's own thing: leave the heatmap, go back)."""
    if box.display:
        box.value = ""
        box.display = False
        back_to.focus()
        return True
    if box.value:
        box.value = ""
        return True
    return False
