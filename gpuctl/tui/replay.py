"""The screen on a recording (``gpuctl replay FILE``): the same app over a fleet of replayed
nodes, read-only, on the recording's clock, with the recorded time in the header and seek keys."""

from __future__ import annotations

from typing import Any, ClassVar

from textual.binding import Binding, BindingType
from textual.widgets import Label

from gpuctl.fleet.recording.replayer import Replayer
from gpuctl.fleet.recording.times import format_time
from gpuctl.fleet.troublelog import TroubleLog
from gpuctl.tui.app import GpuctlApp

SHOW_EVERY_S = 0.25


class ReplayApp(GpuctlApp):
    """``GpuctlApp`` over ``replayer``'s fleet; the replay plays as a background worker."""

    SEEK = Binding.Group("±10s")
    BINDINGS: ClassVar[list[BindingType]] = [
        *GpuctlApp.BINDINGS,
        # "␣ pause  [ ] ±10s": the footer keeps "? help  q quit" in 80 columns
        Binding(
            "space",
            "replay_pause",
            "pause",
            id="replay_pause",
            key_display="␣",
            tooltip="pause or resume the replay",
        ),
        Binding("comma", "replay_step(-1)", "back 1 s", id="replay_back_1s", show=False),
        Binding("full_stop", "replay_step(1)", "on 1 s", id="replay_on_1s", show=False),
        Binding(
            "left_square_bracket",
            "replay_step(-10)",
            "back 10 s",
            id="replay_back_10s",
            group=SEEK,
        ),
        Binding(
            "right_square_bracket", "replay_step(10)", "on 10 s", id="replay_on_10s", group=SEEK
        ),
        Binding(
            "left_curly_bracket", "replay_step(-60)", "back 1 min", id="replay_back_1m", show=False
        ),
        Binding(
            "right_curly_bracket", "replay_step(60)", "on 1 min", id="replay_on_1m", show=False
        ),
        Binding("minus", "replay_speed(0.5)", "slower", id="replay_slower", show=False),
        Binding("plus", "replay_speed(2)", "faster", id="replay_faster", show=False),
    ]

    def __init__(self, replayer: Replayer, **kwargs: Any) -> None:
        """``kwargs`` go to ``GpuctlApp`` (``state_dir``, ``tui``, ...); a replay is
        always read-only and its clock is the recording's."""
        kwargs["read_only"] = True
        kwargs["clock"] = replayer.now
        # the recording's trouble, on its clock: not the state folder's log of what happened
        kwargs.setdefault("trouble_log", TroubleLog(None, clock=replayer.now))
        kwargs.setdefault(
            "simulated", all(link.kind == "simulated" for link in replayer.links.values())
        )
        super().__init__(replayer.fleet(), **kwargs)
        # "? help  q quit" last, as on every screen: after the replay's keys, not among them
        # (bindings merge in the order of the base class's keys)
        keys = self._bindings.key_to_bindings
        for key in [k for k, found in keys.items() if any(b.id in ("help", "quit") for b in found)]:
            keys[key] = keys.pop(key)
        self.replayer = replayer
        self.background.append(replayer.play)
        self._problems_told = 0
        self._damage_told = False

    def on_ready(self) -> None:
        self.overview.query_one("#header").mount(
            Label(self.position_text(), id="mark-replay", classes="marker"), after="#brand"
        )
        self.set_interval(SHOW_EVERY_S, self._show_position)

    def position_text(self) -> str:
        """`` REPLAY <recorded time> +m:ss/m:ss x<speed> [paused|end] ``."""
        r = self.replayer
        now = r.now()
        state = " paused" if r.paused else (" end" if now >= r.reader.end else "")
        return (
            f" REPLAY {format_time(now)} {_clock(now - r.reader.start)}/"
            f"{_clock(r.reader.end - r.reader.start)} x{r.speed:g}{state} "
        )

    def _show_position(self) -> None:
        self._tell_problems()
        labels = self.overview.query("#mark-replay")
        if not labels:
            return  # not mounted yet
        label = labels.first(Label)
        text = self.position_text()
        if str(label.content) != text:
            label.update(text)

    def _tell_problems(self) -> None:
        """A notification for each new line of what the recording could not give (a damaged
        index, a frame skipped), as ``gpuctl replay --export-csv`` prints them."""
        reader = self.replayer.reader
        if reader.damaged is not None and not self._damage_told:
            self._damage_told = True
            self.notify(
                f"damaged index ({reader.damaged}): reading frames in order", severity="warning"
            )
        for problem in reader.problems[self._problems_told :]:
            self.notify(problem, severity="warning")
        self._problems_told = len(reader.problems)

    def action_replay_pause(self) -> None:
        self.replayer.toggle_pause()
        self._show_position()

    def action_replay_step(self, seconds: float) -> None:
        self.replayer.seek(self.replayer.now() + seconds)
        self._show_position()

    def action_replay_speed(self, factor: float) -> None:
        self.replayer.set_speed(self.replayer.speed * factor)
        self._show_position()


def _clock(seconds: float) -> str:
    s = max(0, int(seconds))
    h, rest = divmod(s, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"
