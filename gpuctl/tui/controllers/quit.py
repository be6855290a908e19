"""``q``: quit, after asking to stop the burns this session can see (the demo's own aside)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from gpuctl.core.format import counted
from gpuctl.fleet import control
from gpuctl.tui.screens.confirm import ConfirmScreen

if TYPE_CHECKING:
    from gpuctl.tui.app import GpuctlApp
    from gpuctl.tui.controllers.stress import StressController

STOP_TIMEOUT_S = 10.0  # how long quitting waits for the agents to stop their burns


class QuitController:
    """The quit flow of ``app``; ``stress`` tells which burns are the user's."""

    def __init__(self, app: GpuctlApp, stress: StressController) -> None:
        self.app = app
        self.stress = stress

    def quit(self) -> None:
        """Exit at once when nothing burns; else ask, then stop the burns and exit."""
        app = self.app
        burning = self.stress.burning()
        if not burning:
            app.exit(0)
            return
        nodes = sorted({n for n, _ in burning})
        question = (
            f"{len(burning)} {'GPU is' if len(burning) == 1 else 'GPUs are'} burning on "
            f"{', '.join(nodes[:4])}"
            f"{' …' if len(nodes) > 4 else ''}. Stop them and quit?"
        )

        def answered(yes: bool | None) -> None:
            if yes:
                app.run_worker(self.stop_and_exit(nodes), group="quit", exit_on_error=False)

        app.push_screen(ConfirmScreen(question, "Stop and quit", "Cancel"), answered)

    async def stop_and_exit(self, nodes: list[str]) -> None:
        """Stop the burns on ``nodes`` (waiting at most ``STOP_TIMEOUT_S``), then exit."""
        app = self.app
        app.notify(f"stopping burns on {counted(len(nodes), 'node')}…")
        await asyncio.wait(
            [
                asyncio.ensure_future(
                    control.set_stress(app.fleet, n, None, False, read_only=app.read_only)
                )
                for n in nodes
            ],
            timeout=STOP_TIMEOUT_S,
        )
        # Closing the links stops anything still burning: the agents' dead-man's switch.
        app.exit(0)
