"""The events screen (``e``): the trouble log (``gpuctl.fleet.troublelog``), newest first.

One row per trouble: when it was last and first seen, how often, node, GPU, its state (active,
ended, open, acked) and what it is, in the detail screen's words (``view.trouble_event``);
below, the selected row's evidence (the GPU's readings then) and its acknowledgement. ``/``
filters by node, GPU, kind and state (``node=sim-02 gpu=5 kind=xid unacked``; a bare word
matches node names), ``u`` shows the unacknowledged only, ``⏎`` acknowledges the selected row
with a note (its next occurrence is a new row). Everything a node sent reaches the screen as
text (``gpuctl.tui.text``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import DataTable, Footer, Input, Label, Static

from gpuctl.core.format import fmt_age
from gpuctl.fleet.troublelog import KINDS, STATES, Trouble, TroubleLog
from gpuctl.tui.text import node_str, node_text
from gpuctl.tui.view import trouble_event

COLUMNS = ("LAST", "FIRST", "×", "NODE", "GPU", "STATE", "WHAT")
CELL_LIMIT = 300
STATE_STYLE = {"active": "bold", "open": "", "ended": "dim", "acked": "dim"}
HOW_STYLE = {"alarm": "bold red", "warn": "yellow", "plain": ""}
EVIDENCE_UNITS = {
    "temp": " C",
    "power": " W",
    "power_limit": " W cap",
    "sm_clock": " MHz SM",
    "mem_clock": " MHz mem",
    "util_gpu": "% util",
    "util_mem": "% mem util",
    "fan": "% fan",
}


@dataclass(frozen=True)
class EventFilter:
    """What the events screen shows: each field None for any."""

    node: str | None = None
    gpu: int | None = None
    kind: str | None = None
    state: str | None = None  # one of ``troublelog.STATES`` (``Trouble.in_state``)
    words: tuple[str, ...] = ()  # parts of node names

    def keeps(self, row: Trouble) -> bool:
        return (
            (self.node is None or row.node == self.node)
            and (self.gpu is None or row.gpu == self.gpu)
            and (self.kind is None or row.kind == self.kind)
            and (self.state is None or row.in_state(self.state))
            and all(w in row.node for w in self.words)
        )


def parse_event_filter(text: str) -> tuple[EventFilter, str | None]:
    """``node=NAME gpu=N kind=KIND``, a state (``active ended open acked unacked``) and bare
    words (parts of node names) into
    a filter, and the one line that says what was not understood (None: all of it)."""
    fields: dict[str, Any] = {}
    words: list[str] = []
    for token in text.split():
        name, sep, value = token.replace(":", "=", 1).partition("=")
        if token in STATES:
            fields["state"] = token
        elif sep and name == "node" and value:
            fields["node"] = value
        elif sep and name == "gpu" and value.isdigit():
            fields["gpu"] = int(value)
        elif sep and name == "kind" and value in KINDS:
            fields["kind"] = value
        elif sep:
            return EventFilter(), (
                f"not a filter: {token!r} (node=NAME gpu=N kind={'|'.join(KINDS)} "
                f"{' '.join(STATES)})"
            )
        else:
            words.append(token)
    return EventFilter(words=tuple(words), **fields), None


def evidence_text(e: dict[str, Any]) -> str:
    """A GPU's readings kept with an event, for people: "87 C 612 W ... THERM"."""
    parts = []
    for key, unit in EVIDENCE_UNITS.items():
        value = e.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            parts.append(f"{value:.0f}{unit}")
    for key in ("temp", "power", "sm_clock"):
        span = e.get(f"{key}_range")
        if isinstance(span, list) and len(span) == 2 and span[0] != span[1]:
            parts.append(f"{key.replace('_', ' ')} {span[0]:.0f}..{span[1]:.0f} before")
    if isinstance(e.get("pstate"), str):
        parts.append(e["pstate"])
    if isinstance(e.get("throttle"), list) and e["throttle"]:
        parts.append("throttle " + " ".join(map(str, e["throttle"])))
    if isinstance(e.get("reason"), str):
        parts.append(e["reason"])
    return "  ".join(parts) or "no readings"


class NoteScreen(ModalScreen[str | None]):
    """Ask for the note of an acknowledgement; dismisses with it (None: cancelled)."""

    DEFAULT_CSS = """
    NoteScreen { align: center middle; }
    #note-box { width: 72; max-width: 100%; height: auto; border: thick $primary;
                background: $surface; padding: 1 2; }
    #note-question { width: 100%; margin-bottom: 1; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "cancel", id="note_cancel"),
    ]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(id="note-box"):
            yield Label(node_text(self.question, one_line=False), id="note-question")
            yield Input(placeholder="what was done (Enter acknowledges, Esc cancels)", id="note")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)


class EventsScreen(Screen[None]):
    """The trouble log, newest first (see the module's docstring)."""

    DEFAULT_CSS = """
    #events-title { dock: top; height: 1; background: $panel; color: $primary;
                    text-style: bold; }
    #events-table { height: 1fr; overflow-x: hidden; }
    #events-filter { display: none; height: 1; border: none; padding: 0 1; }
    #events-filter.shown { display: block; }
    #events-evidence { height: auto; max-height: 7; border-top: solid $panel; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "back", "back", id="events_back"),
        # over the table's own ⏎ (which the footer would show instead); in the filter box ⏎
        # applies the filter (``action_ack``)
        Binding("enter", "ack", "acknowledge", id="events_ack", priority=True),
        Binding("slash", "filter", "filter", id="events_filter"),
        Binding("u", "unacked", "unacked only", id="events_unacked"),
    ]

    def __init__(
        self,
        troubles: TroubleLog,
        *,
        by: str = "",
        start: str = "",
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``by``: who acknowledges (user@host); ``start``: the filter it opens with;
        ``clock``: the wall clock of the ages (a replay's is the recording's)."""
        super().__init__()
        self.troubles = troubles
        self.clock = clock
        self.by = by
        self.filter_text = start
        self.filter, _ = parse_event_filter(start)
        self.rows: list[Trouble] = []
        self._shown: tuple[int, EventFilter, int] | None = None
        self._ready = False

    def compose(self) -> ComposeResult:
        yield Static(id="events-title")
        yield Input(
            value=self.filter_text, placeholder="node=… gpu=… kind=… unacked", id="events-filter"
        )
        yield DataTable(id="events-table", cursor_type="row", zebra_stripes=True)
        yield Static(id="events-evidence")
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        table = self.query_one("#events-table", DataTable)
        for title in COLUMNS:
            table.add_column(title, key=title)
        self._ready = True
        self.changed()
        table.focus()

    # -- updates ----------------------------------------------------------------------------
    def changed(self) -> None:
        """Redraw when the log changed (the app calls this once a second) or the filter."""
        if not self._ready:
            return
        shown = (self.troubles.version, self.filter, int(self.clock() // 5))  # ages move on
        now = self.clock()
        if shown != self._shown:
            self._shown = shown
            self.rows = [r for r in self.troubles.newest() if self.filter.keeps(r)]
            table = self.query_one("#events-table", DataTable)
            selected = self.selected()
            table.clear()
            for r in self.rows:
                table.add_row(*self._cells(r, now), key=r.id)
            ids = [r.id for r in self.rows]
            if selected is not None and selected.id in ids:
                table.move_cursor(row=ids.index(selected.id), animate=False)
        self._title()
        self._evidence()

    def _cells(self, r: Trouble, now: float) -> list[Text]:
        words, how = trouble_event(r.kind, r.subject, r.detail)
        state = r.state
        dim = "dim" if state in ("acked", "ended") else ""
        return [
            Text(f"{fmt_age(max(0.0, now - r.last))} ago", style=dim),
            Text(f"{fmt_age(max(0.0, now - r.first))} ago", style="dim"),
            Text(str(r.count), style=dim),
            node_text(r.node, dim, limit=60),
            Text("-" if r.gpu is None else str(r.gpu), style=dim),
            Text(state, style=STATE_STYLE[state]),
            node_text(words, dim or HOW_STYLE[how], limit=CELL_LIMIT),
        ]

    def _title(self) -> None:
        total = len(self.troubles.rows)
        open_ = len(self.troubles.unacked())
        shown = f"{len(self.rows)} shown · " if len(self.rows) != total else ""
        where = f" · filter: {self.filter_text}" if self.filter_text.strip() else ""
        text = f" events · {shown}{total} kept · {open_} unacknowledged{where}"
        self.query_one("#events-title", Static).update(node_text(text), layout=False)

    def _evidence(self) -> None:
        row = self.selected()
        box = self.query_one("#events-evidence", Static)
        if row is None:
            box.update("no events" if not self.rows else "")
            return
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row.first))
        last = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row.last))
        where = row.node if row.gpu is None else f"{row.node} GPU {row.gpu}"
        lines = [f"{where}: {trouble_event(row.kind, row.subject, row.detail)[0]}"]
        lines.append(f"{row.id}  first {when}  last {last}  ×{row.count}")
        if row.ended is not None:
            lines[1] += "  ended " + time.strftime("%H:%M:%S", time.localtime(row.ended))
        if row.gpu is not None:
            lines.append("readings: " + evidence_text(row.evidence))
            if row.count > 1 and row.first_evidence:
                lines.append("at first: " + evidence_text(row.first_evidence))
        if row.acked is not None:
            at = time.strftime("%Y-%m-%d %H:%M", time.localtime(row.acked))
            lines.append(f"acknowledged {at} by {row.ack_by}: {row.ack_note or '(no note)'}")
        box.update(node_text("\n".join(lines), one_line=False, limit=2000))

    def on_data_table_row_highlighted(self, _event: DataTable.RowHighlighted) -> None:
        self._evidence()

    def selected(self) -> Trouble | None:
        table = self.query_one("#events-table", DataTable)
        if not self.rows or table.cursor_row < 0 or table.cursor_row >= len(self.rows):
            return None
        return self.rows[table.cursor_row]

    # -- actions ----------------------------------------------------------------------------
    def action_back(self) -> None:
        box = self.query_one("#events-filter", Input)
        if box.has_class("shown") and box.has_focus:
            box.remove_class("shown")
            self.query_one("#events-table", DataTable).focus()
            return
        self.app.pop_screen()

    def action_filter(self) -> None:
        box = self.query_one("#events-filter", Input)
        box.add_class("shown")
        box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id != "events-filter":
            return
        self.set_filter(event.value)
        event.input.remove_class("shown")
        self.query_one("#events-table", DataTable).focus()

    def set_filter(self, text: str) -> None:
        found, error = parse_event_filter(text)
        if error is not None:
            self.notify(error, severity="warning")
            return
        self.filter_text = text
        self.filter = found
        self.changed()

    def action_unacked(self) -> None:
        words = [w for w in self.filter_text.split() if w not in STATES]
        if self.filter.state != "unacked":
            words.append("unacked")
        self.query_one("#events-filter", Input).value = " ".join(words)
        self.set_filter(" ".join(words))

    def action_ack(self) -> None:
        box = self.query_one("#events-filter", Input)
        if box.has_focus:
            self.set_filter(box.value)
            box.remove_class("shown")
            self.query_one("#events-table", DataTable).focus()
            return
        row = self.selected()
        if row is None:
            self.notify("no event selected", severity="warning")
            return
        if row.acked is not None:
            self.notify(f"acknowledged already by {row.ack_by}", timeout=3)
            return
        what = trouble_event(row.kind, row.subject, row.detail)[0]
        where = row.node if row.gpu is None else f"{row.node} GPU {row.gpu}"
        question = f"Acknowledge {node_str(where)}: {node_str(what, limit=200)}?"

        def answered(note: str | None) -> None:
            if note is None:
                return
            self.troubles.ack(row.id, note, by=self.by)
            if self.troubles.error is not None:
                self.notify(f"not written: {self.troubles.error}", severity="error")
            self.changed()

        self.app.push_screen(NoteScreen(question), answered)
