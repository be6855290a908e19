"""The suite's output: human lines on stdout (each with its section's marker) and JSON progress
events on an optional stream (a file, or the descriptor the agent reads)."""

import contextlib
import json
import os
import sys
import time
from typing import IO, Any

from .schema import MARKERS


class Output:
    """Human lines on stdout, JSON progress events on an optional stream."""

    def __init__(self, events_path: "str | None" = None, events_fd: "int | None" = None) -> None:
        self.events: IO[str] | None = None
        if events_fd is not None:
            self.events = os.fdopen(events_fd, "w", buffering=1)
        elif events_path:
            os.makedirs(os.path.dirname(os.path.abspath(events_path)), exist_ok=True)
            self.events = open(events_path, "a", buffering=1)  # noqa: SIM115 (lives as long as the run)
        self.section: str | None = None

    def event(self, **fields: Any) -> None:
        """One JSON progress line (``t`` added), if anyone reads them."""
        if self.events is None:
            return
        fields.setdefault("t", time.time())
        try:
            self.events.write(f"{json.dumps(fields, default=str)}\n")
        except (OSError, ValueError):
            self.events = None  # the reader went away; stdout still carries everything

    def line(self, text: str, section: "str | None" = None) -> None:
        """A human line with its section's marker (also sent as a ``line`` event)."""
        section = section or self.section
        marker = f"[{MARKERS[section]}] " if section else ""
        sys.stdout.write(f"{marker}{text}\n")
        sys.stdout.flush()
        self.event(event="line", section=section, text=marker + text)

    def close(self) -> None:
        if self.events is not None:
            with contextlib.suppress(OSError):
                self.events.close()
