"""The gpuctl TUI: ``GpuctlApp(fleet, ...)`` (also named ``make_app``); the CLI and the tests
inject the fleet and the job store.

Data flow: the fleet calls our listener on the event loop for every node change; the listener
keeps the newest snapshot per node in the store and posts one ``FleetChanged`` message ("latest
wins": queued ones collapse). The first message after a quiet spell schedules a flush a short
coalescing delay later; the flush applies every pending snapshot at once inside
``batch_update`` and repaints only the changed lines that are on screen. Nothing here awaits
the network: commands to nodes run in workers.

Node data is data: widgets show it through ``gpuctl.tui.text`` (``rich.text.Text``, control
characters removed, never markup) and every notification is plain text (``notify``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

from textual import events, on, work
from textual.app import App, SystemCommand
from textual.binding import Binding, BindingType
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.theme import Theme
from textual.worker import Worker, WorkerState

from gpuctl import paths, service
from gpuctl.accept.history import HistoryStore
from gpuctl.accept.run import AcceptOptions, AcceptRun, Progress, start_fleet_run
from gpuctl.config import TuiSettings
from gpuctl.core.format import counted
from gpuctl.core.model import NodeEvent, NodeSnapshot, NodeState
from gpuctl.core.text import printable
from gpuctl.fleet import control
from gpuctl.fleet.fleet import Fleet
from gpuctl.fleet.record import Recorder, new_recording_path
from gpuctl.jobs.store import JobStore
from gpuctl.tui.keys import offer
from gpuctl.tui.messages import AcceptProgress, FleetChanged
from gpuctl.tui.screens.accept_report import AcceptReportScreen
from gpuctl.tui.screens.confirm import ConfirmScreen
from gpuctl.tui.screens.detail import DetailScreen
from gpuctl.tui.screens.help import HelpRow, HelpScreen
from gpuctl.tui.screens.overview import OverviewScreen
from gpuctl.tui.screens.processes import ProcessScreen
from gpuctl.tui.store import FleetStore
from gpuctl.tui.themes import DEFAULT_THEME, ThemeMemory, load_themes
from gpuctl.tui.view import TROUBLE_TITLES
from gpuctl.tui.widgets.heatmap import Heatmap
from gpuctl.tui.widgets.overview import NodeList
from gpuctl.tui.widgets.panes import AcceptPane, JobsPane
from gpuctl.workloads.accept.schema import SECTIONS

COALESCE_S = 0.1  # how long a flush waits for more samples (p95 paint budget is 300 ms)
STOP_TIMEOUT_S = 10.0
NOTIFY_LIMIT = 400  # characters of a notification: a node's error text can be megabytes
OTHERS_SHOWN = 4  # GPUs named one by one when S asks about other users' processes
# Keys that change nodes: in read-only mode they stay (and say why they refuse) but the footer
# does not offer them.
MUTATING_KEYS = ("stress_gpu", "stress_node", "stress_cluster", "accept")
# Actions on the selected GPU or node (``check_action``): offered only where there is one.
SELECTION_KEYS = ("stress_gpu", "stress_node", "accept", "processes")

log = logging.getLogger("gpuctl.tui")


class GpuctlApp(App[int]):
    """Watch every GPU of every node; burn, accept, reconnect from the keyboard."""

    CSS_PATH = "app.tcss"
    TITLE = "gpuctl"
    ENABLE_COMMAND_PALETTE = True

    PANES = Binding.Group("panes")
    STRESS = Binding.Group("stress")  # "s S stress": the footer must fit 80 columns
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("s", "stress_gpu", "stress GPU", id="stress_gpu", group=STRESS),
        Binding("S", "stress_node", "stress node", id="stress_node", group=STRESS),
        # B and r are in help and the palette, not the footer: it must fit 80 columns.
        Binding("B", "stress_cluster", "stress all", id="stress_cluster", show=False),
        # "a accept" is in the acceptance pane's footer (action_pane), not the list's: 80 columns
        Binding("a", "accept", "accept", id="accept", show=False),
        Binding("r", "reconnect", "reconnect", id="reconnect", show=False),
        Binding("p", "processes", "procs", id="processes"),
        Binding("t", "next_theme", "theme", id="theme", show=False),
        Binding("R", "record", "record", id="record", show=False),
        Binding("1", "pane('gpus')", "GPUs pane", id="pane_gpus", group=PANES),
        Binding("2", "pane('jobs')", "jobs pane", id="pane_jobs", group=PANES),
        Binding("3", "pane('accept')", "acceptance pane", id="pane_accept", group=PANES),
        Binding("question_mark", "help", "help", id="help"),
        Binding("q", "quit", "quit", id="quit"),
    ]

    def __init__(
        self,
        fleet: Fleet,
        *,
        read_only: bool = False,
        simulated: bool = False,
        tui: TuiSettings | None = None,
        clock: Callable[[], float] | None = None,
        state_dir: Path | None = None,
        coalesce: float = COALESCE_S,
        manage_fleet: bool = True,
        job_store: JobStore | None = None,
        job_store_error: str | None = None,
        accept_options: Mapping[str, Any] | None = None,
    ) -> None:
        """Build the TUI over ``fleet`` (a ``gpuctl.fleet.fleet.Fleet``).

        ``tui`` is the config's ``[tui]`` settings (``theme``, ``keys``); ``clock`` is
        the wall clock for ages (tests freeze it); ``state_dir`` (default
        ``gpuctl.paths.state_dir()``) holds the remembered theme, and the acceptance history and
        reports of runs started with ``a``. With ``manage_fleet`` the app starts the fleet on
        mount and stops it on exit. ``job_store`` (a ``gpuctl.jobs.store.JobStore``) feeds the
        jobs pane; when it could not be opened, ``job_store_error`` is the one line the pane
        shows instead. ``accept_options`` overrides fields of the runs' ``AcceptOptions``
        (``python``, ``extra_args``, ...).
        """
        super().__init__()
        self.fleet = fleet
        self.read_only = read_only
        if read_only:
            self._bindings.key_to_bindings = {
                key: [replace(b, show=False) if b.id in MUTATING_KEYS else b for b in bindings]
                for key, bindings in self._bindings.key_to_bindings.items()
            }
        self.simulated = simulated
        self.tui_settings = tui if tui is not None else TuiSettings()
        self.store = FleetStore(fleet, clock or time.time)
        self.coalesce = coalesce
        self.manage_fleet = manage_fleet
        self.state_dir = state_dir if state_dir is not None else paths.state_dir()
        self.theme_memory = ThemeMemory(self.state_dir)
        self.accept_options = dict(accept_options or {})
        self.gpuctl_themes: list[str] = []
        self.selection: tuple[str, int | None] | None = None
        self.keymap: dict[str, str] = {}
        self._flush_scheduled = False
        self._theme_ready = False
        self.overview = OverviewScreen(
            self.store,
            simulated=simulated,
            read_only=read_only,
            job_store=job_store,
            job_store_error=job_store_error,
            history_path=self.state_dir / paths.ACCEPT_DB,
        )
        self.accept_run: AcceptRun | None = None
        self.crash: BaseException | None = None  # what ended the app, if something did
        self.on_flush: Callable[[set[str], dict[str, float]], None] | None = None
        # Coroutines to run as workers once the fleet is started (the demo's story).
        self.background: list[Callable[[], Awaitable[None]]] = []
        # (node, GPU) of burns the app's own background started (the demo's story): ``q`` and
        # ``S`` leave them out (quitting ends them with the simulated nodes); the user's ask.
        self.own_burns: set[tuple[str, int]] = set()
        self.recorder: Recorder | None = None  # ``R``: the fleet's stream into a file

    def get_default_screen(self) -> Screen[Any]:
        return self.overview

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Keys that act on the selected GPU or node work (and the footer offers them) where
        one is selected: the GPU list and the heatmap, the detail screen, and for ``a`` the
        acceptance pane's matrix too."""
        if action in SELECTION_KEYS:
            screen = self.screen_stack[-1] if self.screen_stack else None
            if isinstance(screen, DetailScreen):
                return True
            if screen is self.overview:
                pane = self.overview.current_pane()
                return pane == "gpus" or (action == "accept" and pane == "accept")
            return False
        return True

    # -- start and stop -----------------------------------------------------------------------
    async def on_mount(self) -> None:
        self._setup_themes()
        self._setup_keys()
        self.fleet.subscribe(self._on_snapshot)
        self.fleet.on_event(self._on_fleet_event)
        control.attach(self.fleet)  # burn events become annotations we can draw
        self.set_interval(1.0, self._tick)
        if self.manage_fleet:
            await self.fleet.start()
        for job in self.background:
            self.run_worker(job(), name="background", group="background", exit_on_error=False)

    async def on_unmount(self) -> None:
        if self.recorder is not None:
            self.action_record()  # a recording ends with the screen, whole
        if self.manage_fleet:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.fleet.stop(), STOP_TIMEOUT_S)

    def _setup_themes(self) -> None:
        for theme in load_themes():
            self.register_theme(theme)
            self.gpuctl_themes.append(theme.name)
        wanted = self.tui_settings.theme
        if isinstance(wanted, str) and f"gpuctl-{wanted}" in self.available_themes:
            wanted = f"gpuctl-{wanted}"
        remembered = self.theme_memory.load()
        for name in (wanted, remembered, DEFAULT_THEME):
            if isinstance(name, str) and name in self.available_themes:
                self.theme = name
                break
        if isinstance(wanted, str) and wanted not in self.available_themes:
            self.notify(
                f"unknown theme {wanted!r} in [tui] theme; known: {', '.join(self.gpuctl_themes)}",
                severity="warning",
            )
        self.theme_changed_signal.subscribe(self, self._theme_changed)
        self._theme_ready = True

    def _theme_changed(self, theme: Theme) -> None:
        if self._theme_ready:
            self.theme_memory.save(theme.name)

    def _setup_keys(self) -> None:
        keys = self.tui_settings.keys
        known = {row[2] for row in self.help_rows()}
        bad = [k for k in keys if k not in known or not isinstance(keys[k], str)]
        if bad:
            self.notify(
                f"[tui.keys]: unknown binding id {', '.join(map(repr, bad))}; press ? for the list",
                severity="warning",
            )
        self.keymap = {k: v for k, v in keys.items() if k in known and isinstance(v, str)}
        if self.keymap:
            self.set_keymap(self.keymap)

    # -- what reaches the terminal -------------------------------------------------------------
    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = True,
    ) -> None:
        """Show a notification, always as plain text: messages quote node names, node errors
        and config values, so ``markup`` is ignored and control characters are removed (every
        widget's ``notify`` lands here). Safe from any thread, like ``App.notify``."""
        del markup  # never: a node's error text is not ours to interpret
        super().notify(
            printable(message, limit=NOTIFY_LIMIT),
            title=printable(title, limit=80),
            severity=severity,
            timeout=timeout,
            markup=False,
        )

    def deliver_screenshot(
        self, filename: str | None = None, path: str | None = None, time_format: str | None = None
    ) -> str | None:
        """The palette's Screenshot: into ``path``, else ~/Downloads when there is one, else
        ``screenshots/`` in the state folder (made, 0700): a missing folder is no failure."""
        if path is None:
            downloads = Path.home() / "Downloads"
            try:
                folder = downloads if downloads.is_dir() else self.state_dir / paths.SCREENSHOTS
                path = str(paths.private_dir(folder) if folder != downloads else folder)
            except OSError as e:
                self.notify(f"screenshot not saved: {e}", severity="error")
                return None
        return super().deliver_screenshot(filename, path, time_format)

    def on_delivery_complete(self, event: events.DeliveryComplete) -> None:
        if event.name == "screenshot":  # said here, plainly: notify shows no markup
            event.prevent_default()
            self.notify(f"screenshot saved to {event.path}" if event.path else "screenshot saved")

    def on_delivery_failed(self, event: events.DeliveryFailed) -> None:
        if event.name == "screenshot":
            event.prevent_default()
            self.notify(f"screenshot not saved: {event.exception}", severity="error")

    def _handle_exception(self, error: Exception) -> None:
        # Textual ends the app (return code 1) and keeps a traceback, with local variables
        # (node data among them), to print on the restored terminal. The whole story goes to
        # gpuctl's log instead; the CLI prints one line naming it (gpuctl.cli.watch.run_tui).
        log.error(
            "the screen crashed: %s: %s", type(error).__name__, printable(error), exc_info=error
        )
        if self.crash is None:
            self.crash = error
        super()._handle_exception(error)

    # -- fleet -> screen ----------------------------------------------------------------------
    def _on_snapshot(self, snapshot: NodeSnapshot) -> None:
        if self.store.offer(snapshot):
            self.post_message(FleetChanged())

    def _on_fleet_event(self, node: str, event: NodeEvent) -> None:
        if event.kind == "xid" and event.gpu is not None:
            self.store.xids.add((node, event.gpu))
            xid = event.detail.get("xid", "?")
            self.notify(f"{node} GPU {event.gpu}: XID {xid}", severity="warning")
        elif event.kind == "gpu_lost":
            self.notify(f"{node} GPU {event.gpu} fell off the bus", severity="error")
        self._on_snapshot(self.fleet.snapshot(node))

    def on_fleet_changed(self, _message: FleetChanged) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.set_timer(self.coalesce, self._flush_pending)

    def _flush_pending(self) -> None:
        self._flush_scheduled = False
        if not self.overview.ready or not self.is_running:
            return  # the overview's mount posts FleetChanged again
        names, arrivals = self.store.take_pending()
        if not names:
            return
        with self.batch_update():
            self.overview.nodes_changed(names, arrivals)
            screen = self.screen
            if isinstance(screen, DetailScreen | ProcessScreen) and screen.node in names:
                screen.node_changed()
        if self.on_flush is not None:
            self.on_flush(names, arrivals)

    def _tick(self) -> None:
        """Once a second: ages of stale nodes move on, and so does the header."""
        if not self.overview.ready or not self.is_running:
            return
        self.overview.tick()
        if isinstance(self.screen, DetailScreen):
            self.screen.node_changed()

    # -- selection ----------------------------------------------------------------------------
    @on(NodeList.Selected)
    @on(Heatmap.Selected)
    @on(DetailScreen.GpuChosen)
    def _selected(
        self, event: NodeList.Selected | Heatmap.Selected | DetailScreen.GpuChosen
    ) -> None:
        self.selection = (event.node, event.gpu)

    def current_selection(self) -> tuple[str, int | None] | None:
        if isinstance(self.screen, DetailScreen):
            return self.screen.node, self.screen.gpu
        return self.overview.selection()

    # -- keys ---------------------------------------------------------------------------------
    def refuse(self, what: str) -> bool:
        """True (after saying so) when ``what`` ("stress", "acceptance") may not run: the
        service decides, from the read-only mode this app was started in."""
        from gpuctl.tui.serve import SERVED_WHY, served

        why = SERVED_WHY if served() else service.ANY_SOURCE  # the browser's own way out
        error = service.refusal(what, read_only=self.read_only, fleet=self.fleet, why=why)
        if error is not None:
            self.notify(f"read-only: {error.what} is disabled ({error.why})", severity="warning")
        return error is not None

    def _burning(self) -> list[tuple[str, int]]:
        return [b for b in control.burning(self.fleet) if b not in self.own_burns]

    def _others(self, targets: Mapping[str, Iterable[int] | None]) -> list[service.OthersGpu]:
        """GPUs among ``targets`` (node -> GPUs, None: all) running other users' processes."""
        found: list[service.OthersGpu] = []
        for node, gpus in targets.items():
            snap = self.store.snaps.get(node)
            if snap is not None:
                found += service.others_on(snap, gpus)
        return found

    def action_stress_gpu(self) -> None:
        if self.refuse("stress"):
            return
        sel = self.current_selection()
        if sel is None or sel[1] is None:
            self.notify("select a GPU first", severity="warning")
            return
        node, gpu = sel[0], sel[1]
        on = not self.store.is_burning(self.store.snaps[node], gpu)
        others = self._others({node: [gpu]}) if on else []
        if not others:
            self.stress(node, [gpu], on)
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.stress(node, [gpu], True)

        self.push_screen(
            ConfirmScreen(f"{others[0].line()}. Burn it anyway?", "Burn anyway"), answered
        )

    def action_stress_node(self) -> None:
        if self.refuse("stress"):
            return
        sel = self.current_selection()
        if sel is None:
            self.notify("select a node first", severity="warning")
            return
        node = sel[0]
        snap = self.store.snaps[node]
        on = not any(self.store.is_burning(snap, g.index) for g in snap.gpus)
        others = self._others({node: None}) if on else []
        if not others:
            self.stress(node, None, on)
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.stress(node, None, True)

        shown = OTHERS_SHOWN
        lines = "; ".join(f"GPU {o.gpu} {o.runs()}" for o in others[:shown])
        more = f"; {counted(len(others) - shown, 'more GPU')} too" if len(others) > shown else ""
        every = counted(len(snap.gpus), "GPU")
        question = f"On {node}, {lines}{more}. Burn all {every} of {node} anyway?"
        self.push_screen(ConfirmScreen(question, "Burn anyway"), answered)

    def action_stress_cluster(self) -> None:
        if self.refuse("stress"):
            return
        burning = self._burning()
        if burning:
            nodes = sorted({n for n, _ in burning})
            question = (
                f"Stop {counted(len(burning), 'burning GPU')} on {counted(len(nodes), 'node')}?"
            )

            def stop(yes: bool | None) -> None:
                if yes:
                    for n in nodes:
                        self.stress(n, None, False)

            self.push_screen(ConfirmScreen(question, "Stop all"), stop)
            return
        live = [s.name for s in self.store.snaps.values() if s.state is NodeState.LIVE]
        gpus = sum(len(self.store.snaps[n].gpus) for n in live)
        if not live:
            self.notify("no live node to stress", severity="warning")
            return

        def start(yes: bool | None) -> None:
            if yes:
                for n in live:
                    self.stress(n, None, True)

        question = f"Burn all {counted(gpus, 'GPU')} on {counted(len(live), 'live node')}?"
        others = self._others(dict.fromkeys(live))
        if others:
            question += f" {service.others_summary(others)}."
        self.push_screen(ConfirmScreen(question, "Burn anyway" if others else "Burn all"), start)

    def stress(self, node: str, gpus: list[int] | None, on: bool) -> None:
        what = "all GPUs" if gpus is None else f"GPU {','.join(map(str, gpus))}"
        self.notify(f"{node}: {'starting' if on else 'stopping'} stress on {what}")
        self.run_worker(
            control.set_stress(self.fleet, node, gpus, on, read_only=self.read_only),
            name=f"stress {node} {what}",
            group=f"node:{node}",
            exit_on_error=False,
        )

    def action_accept(self) -> None:
        if self.refuse("acceptance"):
            return
        run = self.accept_run
        if run is not None and not run.done():

            def cancel(yes: bool | None) -> None:
                if yes:
                    self.run_worker(run.cancel(), name="cancel acceptance", exit_on_error=False)

            self.push_screen(
                ConfirmScreen("Cancel the running acceptance suite?", "Cancel it"), cancel
            )
            return
        sel = self.current_selection()
        on_matrix = self.overview.query_one(AcceptPane).cursor_node()
        if isinstance(self.screen, OverviewScreen) and on_matrix in self.store.snaps:
            sel = (on_matrix, None)  # pane 3: the node under the matrix cursor
        if sel is None:
            self.notify("select a node first", severity="warning")
            return
        node = sel[0]
        snap = self.store.snaps[node]
        if snap.state is not NodeState.LIVE:
            self.notify(f"{node} is not live: {snap.state.value}", severity="warning")
            return
        simulated = snap.info is not None and snap.info.reader == "simulated"
        settings: dict[str, Any] = {"quick": True, "device": "cpu" if simulated else "cuda"}
        options = AcceptOptions(**{**settings, **self.accept_options})

        def start(yes: bool | None) -> None:
            if not yes:
                return
            try:  # recorded and written like the CLI's runs: the state dir
                history = HistoryStore(self.state_dir / paths.ACCEPT_DB)
            except (OSError, sqlite3.Error) as e:
                self.notify(
                    f"acceptance history unavailable ({e}): not recorded", severity="warning"
                )
                history = None
            run = start_fleet_run(
                self.fleet,
                [node],
                options,
                history=history,
                report_dir=self.state_dir / paths.REPORTS,
                read_only=self.read_only,
            )
            self.accept_run = run

            def relay(progress: Progress) -> None:
                self.post_message(AcceptProgress(progress))
                if progress.kind == "finished":
                    run.unsubscribe(relay)  # the run is over: nothing holds on to the app

            run.subscribe(relay)
            self.overview.query_one(AcceptPane).start(run, SECTIONS)
            self.action_pane("accept")

        where = "on its GPUs"
        if options.device == "sim":  # gpuctl demo: figures made from the simulated GPUs
            where = "on its simulated GPUs (a simulated run: no torch, nothing measured)"
        elif simulated:
            where = "on the CPU (simulated GPUs)"
        self.push_screen(
            ConfirmScreen(f"Run the quick acceptance suite on {node} {where}?", "Run"), start
        )

    def on_accept_progress(self, message: AcceptProgress) -> None:
        self.overview.query_one(AcceptPane).progress(message.progress)

    def action_reconnect(self) -> None:
        sel = self.current_selection()
        if sel is None:
            return
        self.notify(f"{sel[0]}: reconnecting")
        self.run_worker(
            self.fleet.reconnect(sel[0]),
            name=f"reconnect {sel[0]}",
            group=f"node:{sel[0]}",
            exit_on_error=False,
        )

    def action_record(self) -> None:
        """Start recording the fleet's stream into the state folder's ``recordings/``, or stop.

        Refused in a read-only browser screen: it writes on the server's disk without bound,
        and a read-only browser must not change what is on the server."""
        from gpuctl.tui.serve import SERVED_WHY, served

        if self.recorder is None and self.read_only and served():
            self.notify(f"read-only: recording is disabled ({SERVED_WHY})", severity="warning")
            return
        recorder, self.recorder = self.recorder, None
        if recorder is not None:
            recorder.close()
            self.notify(f"recorded {recorder.seconds:.0f} s into {recorder.path}")
            return
        try:
            self.recorder = Recorder(
                self.fleet, new_recording_path(self.state_dir / paths.RECORDINGS)
            )
        except OSError as e:
            self.notify(f"cannot record: {e}", severity="error")
            return
        self.notify(f"recording into {self.recorder.path}; R stops")

    def action_processes(self) -> None:
        """The process view of the selected GPU (or node)."""
        sel = self.current_selection()
        if sel is None or sel[0] not in self.store.snaps:
            self.notify("select a node or GPU first", severity="warning")
            return
        self.push_screen(ProcessScreen(self.store, sel[0], sel[1], read_only=self.read_only))

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state is WorkerState.ERROR:
            err = event.worker.error
            message = getattr(err, "message", None) or str(err) or type(err).__name__
            self.notify(f"{event.worker.name}: {message}", severity="error", timeout=8)

    def action_pane(self, pane: str) -> None:
        while self.screen is not self.overview and len(self.screen_stack) > 1:
            self.pop_screen()
        self.overview.show_pane(pane)
        offer(self, "accept", pane == "accept" and not self.read_only)

    def action_next_theme(self) -> None:
        names = self.gpuctl_themes or [self.theme]
        i = names.index(self.theme) if self.theme in names else -1
        self.theme = names[(i + 1) % len(names)]
        self.notify(f"theme: {self.theme}", timeout=2)

    def action_help(self) -> None:
        self.push_screen(
            HelpScreen(
                self.help_rows(),
                'Remap keys in config.toml: [tui.keys] stress_gpu = "x"   '
                "· ctrl+p: command palette",
            )
        )

    async def action_quit(self) -> None:
        burning = self._burning()
        if not burning:
            self.exit(0)
            return
        nodes = sorted({n for n, _ in burning})
        question = (
            f"{len(burning)} {'GPU is' if len(burning) == 1 else 'GPUs are'} burning on "
            f"{', '.join(nodes[:4])}"
            f"{' …' if len(nodes) > 4 else ''}. Stop them and quit?"
        )

        def answered(yes: bool | None) -> None:
            if yes:
                self.stop_and_exit(nodes)

        self.push_screen(ConfirmScreen(question, "Stop and quit", "Cancel"), answered)

    @work(exit_on_error=False, group="quit")
    async def stop_and_exit(self, nodes: list[str]) -> None:
        self.notify(f"stopping burns on {counted(len(nodes), 'node')}…")
        await asyncio.wait(
            [
                asyncio.ensure_future(
                    control.set_stress(self.fleet, n, None, False, read_only=self.read_only)
                )
                for n in nodes
            ],
            timeout=STOP_TIMEOUT_S,
        )
        # Closing the links stops anything still burning: the agents' dead-man's switch.
        self.exit(0)

    # -- bindings as data: help screen and command palette ------------------------------------
    def _binding_sources(self) -> Iterable[tuple[str, list[BindingType]]]:
        yield "everywhere", self.BINDINGS
        yield "overview", OverviewScreen.BINDINGS
        yield "GPU list", NodeList.BINDINGS
        yield "heatmap", Heatmap.BINDINGS
        yield "detail", DetailScreen.BINDINGS
        yield "processes", ProcessScreen.BINDINGS
        yield "jobs pane", JobsPane.BINDINGS
        yield "acceptance pane", AcceptPane.BINDINGS
        yield "acceptance report", AcceptReportScreen.BINDINGS

    def key_display(self, binding_id: str, default: str) -> str:
        """How the footer shows the key of ``binding_id`` as configured ([tui.keys])."""
        key = self.keymap.get(binding_id, default)
        return ", ".join(self.get_key_display(Binding(k.strip(), "")) for k in key.split(","))

    def help_rows(self) -> list[HelpRow]:
        """Every binding once: the same key doing the same in two places is one row that
        names both (``GPU list, heatmap``)."""
        rows: list[HelpRow] = []
        at: dict[tuple[str, str, str], int] = {}
        for where, bindings in self._binding_sources():
            for b in bindings:
                if not isinstance(b, Binding) or b.id is None:
                    continue
                key = self.key_display(b.id, b.key)
                what = b.tooltip or b.description  # the footer's word can be short
                i = at.get((b.id, key, what))
                if i is None:
                    at[(b.id, key, what)] = len(rows)
                    rows.append((key, what, b.id, where))
                elif where not in rows[i][3].split(", "):
                    rows[i] = (*rows[i][:3], f"{rows[i][3]}, {where}")
        return rows

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for b in self.BINDINGS:
            if isinstance(b, Binding) and b.id not in ("quit",):
                yield SystemCommand(
                    _title(b.description),
                    f"key {self.key_display(b.id or '', b.key)}",
                    partial(self.run_action, b.action),
                )
        if screen is self.overview:
            # the header's counts, each a filter (as a click on it): from the keyboard too
            for kind, n in self.store.trouble().items():
                if n:
                    yield SystemCommand(
                        f"Show trouble: {TROUBLE_TITLES[kind]} ({n})",
                        f"filter the list by {kind!r}; Esc clears it",
                        partial(self.overview.action_trouble, kind),
                    )
            for b in OverviewScreen.BINDINGS:
                if isinstance(b, Binding) and b.show:
                    yield SystemCommand(
                        _title(b.description),
                        f"key {self.key_display(b.id or '', b.key)}",
                        partial(self.run_action, b.action, self.overview),
                    )
            current = self.overview.current_pane()
            panes: dict[str, type[JobsPane | AcceptPane]] = {"jobs": JobsPane, "accept": AcceptPane}
            if current in panes:
                pane = self.overview.query_one(f"#pane-{current}")
                for b in panes[current].BINDINGS:
                    if isinstance(b, Binding):
                        yield SystemCommand(
                            _title(b.description),
                            f"key {self.key_display(b.id or '', b.key)}",
                            partial(self.run_action, b.action, pane),
                        )


def _title(description: str) -> str:
    return description[:1].upper() + description[1:]


# The constructor is the factory (one way to build the app): the CLI, the tests, the benchmark
# and the screenshot script all call it under this name.
make_app = GpuctlApp
