"""``a``: the quick acceptance suite on the selected node (or cancel the one running).

The run is recorded and written like the CLI's (the state folder's history and reports); its
progress reaches the acceptance pane as ``AcceptProgress`` messages, posted from the run's
subscription, which ends with the run so that nothing holds on to the app.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gpuctl import paths
from gpuctl.accept.history import HistoryStore
from gpuctl.accept.run import AcceptOptions, AcceptRun, Progress, start_fleet_run
from gpuctl.core.model import NodeState
from gpuctl.tui.messages import AcceptProgress
from gpuctl.tui.screens.confirm import ConfirmScreen
from gpuctl.tui.screens.overview import OverviewScreen
from gpuctl.tui.widgets.panes import AcceptPane
from gpuctl.workloads.accept_suite.schema import SECTIONS

if TYPE_CHECKING:
    from gpuctl.tui.app import GpuctlApp


class AcceptController:
    """The acceptance key of ``app``. ``options`` override fields of the runs'
    ``AcceptOptions`` (``python``, ``extra_args``, ...); ``run`` is the latest run, if any."""

    def __init__(self, app: GpuctlApp, options: Mapping[str, Any] | None = None) -> None:
        self.app = app
        self.options = dict(options or {})
        self.run: AcceptRun | None = None

    def press(self) -> None:
        """Ask to cancel the run under way, else to start one on the selected node."""
        app = self.app
        if app.refuse("acceptance"):
            return
        run = self.run
        if run is not None and not run.done():

            def cancel(yes: bool | None) -> None:
                if yes:
                    app.run_worker(run.cancel(), name="cancel acceptance", exit_on_error=False)

            app.push_screen(
                ConfirmScreen("Cancel the running acceptance suite?", "Cancel it"), cancel
            )
            return
        sel = app.current_selection()
        on_matrix = app.overview.query_one(AcceptPane).cursor_node()
        if isinstance(app.screen, OverviewScreen) and on_matrix in app.store.snaps:
            sel = (on_matrix, None)  # pane 3: the node under the matrix cursor
        if sel is None:
            app.notify("select a node first", severity="warning")
            return
        node = sel[0]
        snap = app.store.snaps[node]
        if snap.state is not NodeState.LIVE:
            app.notify(f"{node} is not live: {snap.state.value}", severity="warning")
            return
        simulated = snap.info is not None and snap.info.reader == "simulated"
        settings: dict[str, Any] = {"quick": True, "device": "cpu" if simulated else "cuda"}
        options = AcceptOptions(**{**settings, **self.options})

        def start(yes: bool | None) -> None:
            if yes:
                self.start(node, options)

        where = "on its GPUs"
        if options.device == "sim":  # gpuctl demo: figures made from the simulated GPUs
            where = "on its simulated GPUs (a simulated run: no torch, nothing measured)"
        elif simulated:
            where = "on the CPU (simulated GPUs)"
        app.push_screen(
            ConfirmScreen(f"Run the quick acceptance suite on {node} {where}?", "Run"), start
        )

    def start(self, node: str, options: AcceptOptions) -> None:
        """Start the suite on ``node`` and show its progress in the acceptance pane."""
        app = self.app
        try:  # recorded and written like the CLI's runs: the state dir
            history = HistoryStore(app.state_dir / paths.ACCEPT_DB)
        except (OSError, sqlite3.Error) as e:
            app.notify(f"acceptance history unavailable ({e}): not recorded", severity="warning")
            history = None
        run = start_fleet_run(
            app.fleet,
            [node],
            options,
            history=history,
            report_dir=app.state_dir / paths.REPORTS,
            read_only=app.read_only,
        )
        self.run = run

        def relay(progress: Progress) -> None:
            app.post_message(AcceptProgress(progress))
            if progress.kind == "finished":
                run.unsubscribe(relay)  # the run is over: nothing holds on to the app

        run.subscribe(relay)
        app.overview.query_one(AcceptPane).start(run, SECTIONS)
        app.action_pane("accept")
