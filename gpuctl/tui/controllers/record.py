"""``R``: record the fleet's stream into the state folder's ``recordings/``, or stop."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuctl import paths
from gpuctl.fleet.recording.writer import Recorder, new_recording_path

if TYPE_CHECKING:
    from gpuctl.tui.app import GpuctlApp


class RecordController:
    """The recording of ``app``: ``recorder`` while one runs, else None."""

    def __init__(self, app: GpuctlApp) -> None:
        self.app = app
        self.recorder: Recorder | None = None

    def toggle(self) -> None:
        """Start recording, or stop and say where it went.

        Refused in a read-only browser screen: it writes on the server's disk without bound,
        and a read-only browser must not change what is on the server."""
        from gpuctl.tui.serve import SERVED_WHY, served

        app = self.app
        if self.recorder is None and app.read_only and served():
            app.notify(f"read-only: recording is disabled ({SERVED_WHY})", severity="warning")
            return
        recorder, self.recorder = self.recorder, None
        if recorder is not None:
            recorder.close()
            app.notify(f"recorded {recorder.seconds:.0f} s into {recorder.path}")
            return
        try:
            self.recorder = Recorder(
                app.fleet, new_recording_path(app.state_dir / paths.RECORDINGS)
            )
        except OSError as e:
            app.notify(f"cannot record: {e}", severity="error")
            return
        app.notify(f"recording into {self.recorder.path}; R stops")

    def close(self) -> None:
        """End a running recording whole (the screen is closing)."""
        if self.recorder is not None:
            self.toggle()
