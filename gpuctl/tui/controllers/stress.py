"""Stress from the keyboard: ``s`` a GPU, ``S`` a node, ``B`` every live node (or stop all).

Each key asks the service first (read-only mode, a fleet that cannot act), then the user before
a burn starts, naming its target and how long it lasts (``s`` on a GPU without other users'
processes asks only while ``[tui] confirm_burn`` is true, the default; ``S`` and ``B`` always
ask, and a burn over other users' processes always names them), and starts or stops the burns in
workers (``gpuctl.fleet.control.set_stress``) so the screen never waits on the network. Stopping
asks nothing, but for ``B``'s stop of every burn.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from gpuctl import service
from gpuctl.core.format import counted
from gpuctl.core.model import NodeState
from gpuctl.fleet import control
from gpuctl.tui.screens.confirm import ConfirmScreen

if TYPE_CHECKING:
    from gpuctl.tui.app import GpuctlApp

OTHERS_SHOWN = 4  # GPUs named one by one when S asks about other users' processes


class StressController:
    """The stress keys of ``app``. ``own_burns``: (node, GPU) of burns the app's own
    background started (the demo's story): ``q`` and ``B`` leave them out (quitting ends them
    with the simulated nodes); the user's ask."""

    def __init__(self, app: GpuctlApp) -> None:
        self.app = app
        self.own_burns: set[tuple[str, int]] = set()

    def burning(self) -> list[tuple[str, int]]:
        """The fleet's burning GPUs, but for the app's own burns."""
        return [b for b in control.burning(self.app.fleet) if b not in self.own_burns]

    def others(self, targets: Mapping[str, Iterable[int] | None]) -> list[service.OthersGpu]:
        """GPUs among ``targets`` (node -> GPUs, None: all) running other users' processes."""
        found: list[service.OthersGpu] = []
        for node, gpus in targets.items():
            snap = self.app.store.snaps.get(node)
            if snap is not None:
                found += service.others_on(snap, gpus)
        return found

    def gpu(self) -> None:
        """``s``: burn the selected GPU, or stop its burn."""
        app = self.app
        if app.refuse("stress"):
            return
        sel = app.current_selection()
        if sel is None or sel[1] is None:
            app.notify("select a GPU first", severity="warning")
            return
        node, gpu = sel[0], sel[1]
        on = not app.store.is_burning(app.store.snaps[node], gpu)
        others = self.others({node: [gpu]}) if on else []
        if not on or not (others or app.tui_settings.confirm_burn):
            self.start(node, [gpu], on)
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.start(node, [gpu], True)

        lasts = self.lasts(node)
        if others:
            question, yes = f"{others[0].line()}. Burn it anyway for {lasts}?", "Burn anyway"
        else:
            question, yes = f"Burn {node} GPU {gpu} for {lasts}?", "Burn"
        app.push_screen(ConfirmScreen(question, yes), answered)

    def node(self) -> None:
        """``S``: burn every GPU of the selected node, or stop its burns."""
        app = self.app
        if app.refuse("stress"):
            return
        sel = app.current_selection()
        if sel is None:
            app.notify("select a node first", severity="warning")
            return
        node = sel[0]
        snap = app.store.snaps[node]
        on = not any(app.store.is_burning(snap, g.index) for g in snap.gpus)
        if not on:
            self.start(node, None, False)
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.start(node, None, True)

        others = self.others({node: None})
        every = counted(len(snap.gpus), "GPU")
        lasts = self.lasts(node)
        if not others:
            question = f"Burn all {every} of {node} for {lasts}?"
            app.push_screen(ConfirmScreen(question, "Burn all"), answered)
            return
        shown = OTHERS_SHOWN
        lines = "; ".join(f"GPU {o.gpu} {o.runs()}" for o in others[:shown])
        more = f"; {counted(len(others) - shown, 'more GPU')} too" if len(others) > shown else ""
        question = f"On {node}, {lines}{more}. Burn all {every} of {node} anyway for {lasts}?"
        app.push_screen(ConfirmScreen(question, "Burn anyway"), answered)

    def cluster(self) -> None:
        """``B``: stop every burn when some run, else burn every live node (after asking)."""
        app = self.app
        if app.refuse("stress"):
            return
        burning = self.burning()
        if burning:
            nodes = sorted({n for n, _ in burning})
            question = (
                f"Stop {counted(len(burning), 'burning GPU')} on {counted(len(nodes), 'node')}?"
            )

            def stop(yes: bool | None) -> None:
                if yes:
                    for n in nodes:
                        self.start(n, None, False)

            app.push_screen(ConfirmScreen(question, "Stop all"), stop)
            return
        live = [s.name for s in app.store.snaps.values() if s.state is NodeState.LIVE]
        gpus = sum(len(app.store.snaps[n].gpus) for n in live)
        if not live:
            app.notify("no live node to stress", severity="warning")
            return

        def start(yes: bool | None) -> None:
            if yes:
                for n in live:
                    self.start(n, None, True)

        lasts = self.lasts(live[0])
        question = (
            f"Burn all {counted(gpus, 'GPU')} on {counted(len(live), 'live node')} for {lasts}?"
        )
        others = self.others(dict.fromkeys(live))
        if others:
            question += f" {service.others_summary(others)}."
        app.push_screen(ConfirmScreen(question, "Burn anyway" if others else "Burn all"), start)

    def lasts(self, node: str) -> str:
        """How long a burn started now on ``node`` lasts, in words: "60 min"."""
        return duration_words(control.burn_seconds(self.app.fleet, node))

    def start(self, node: str, gpus: list[int] | None, on: bool) -> None:
        """Start (``on``) or stop the burns on ``gpus`` of ``node`` (None: all) in a worker."""
        app = self.app
        what = "all GPUs" if gpus is None else f"GPU {','.join(map(str, gpus))}"
        app.notify(f"{node}: {'starting' if on else 'stopping'} stress on {what}")
        app.run_worker(
            control.set_stress(app.fleet, node, gpus, on, read_only=app.read_only),
            name=f"stress {node} {what}",
            group=f"node:{node}",
            exit_on_error=False,
        )


def duration_words(seconds: float) -> str:
    """A burn's length as a question says it: "45 s", "60 min", "3 h", "1.5 h"."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.3g} h"
