"""The gpuctl TUI: ``GpuctlApp(fleet, ...)`` (also named ``make_app``); the CLI and the tests
inject the fleet and the job store.

Data flow: the fleet calls our listener on the event loop for every node change; the listener
keeps the newest snapshot per node in the store ("latest wins"), and the first one after a
quiet spell schedules a flush a short coalescing delay later (on the loop's own timer:
``_schedule_flush``; the overview's mount asks by a ``FleetChanged`` message); the flush
applies every pending snapshot at once inside ``batch_update`` and repaints only the changed
lines that are on screen. Nothing here awaits the network: commands to nodes run in workers.

Node data is data: widgets show it through ``gpuctl.tui.text`` (``rich.text.Text``, control
characters removed, never markup) and every notification is plain text (``notify``).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

from textual import events, on
from textual.app import App, SystemCommand
from textual.binding import Binding, BindingType
from textual.filter import LineFilter
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.scrollbar import ScrollBar
from textual.theme import Theme
from textual.worker import Worker, WorkerState

from gpuctl import paths, service
from gpuctl.config import TuiSettings
from gpuctl.core.deadline import wait_for
from gpuctl.core.model import NodeEvent, NodeSnapshot
from gpuctl.core.text import printable
from gpuctl.fleet import control
from gpuctl.fleet.fleet import Fleet, end_tasks
from gpuctl.fleet.troublelog import TroubleLog
from gpuctl.jobs.store import JobStore
from gpuctl.tui import glyphs
from gpuctl.tui.controllers import (
    AcceptController,
    ActivityController,
    QuitController,
    RecordController,
    StressController,
)
from gpuctl.tui.fleet_store import FleetStore
from gpuctl.tui.keys import offer
from gpuctl.tui.messages import AcceptProgress, FleetChanged
from gpuctl.tui.screens.accept_report import AcceptReportScreen
from gpuctl.tui.screens.detail import DetailScreen
from gpuctl.tui.screens.events import EventsScreen
from gpuctl.tui.screens.help import HelpRow, HelpScreen
from gpuctl.tui.screens.overview import OverviewScreen
from gpuctl.tui.screens.processes import ProcessScreen
from gpuctl.tui.themes import DEFAULT_THEME, ThemeMemory, load_themes
from gpuctl.tui.view import TROUBLE_TITLES
from gpuctl.tui.widgets.heatmap import Heatmap
from gpuctl.tui.widgets.overview import NodeList
from gpuctl.tui.widgets.panes import AcceptPane, JobsPane
from gpuctl.tui.widgets.scrollbar import LineScrollBar

COALESCE_S = 0.1  # how long a flush waits for more samples (p95 paint budget is 300 ms)
STOP_TIMEOUT_S = 10.0
NOTIFY_LIMIT = 400  # characters of a notification: a node's error text can be megabytes
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
        Binding("e", "events", "events", id="events", show=False),
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
        trouble_log: TroubleLog | None = None,
    ) -> None:
        """Build the TUI over ``fleet`` (a ``gpuctl.fleet.fleet.Fleet``).

        ``tui`` is the config's ``[tui]`` settings (``theme``, ``keys``, ``confirm_burn``);
        ``clock`` is the wall clock for ages (tests freeze it); ``state_dir`` (default
        ``gpuctl.paths.state_dir()``) holds the remembered theme, and the acceptance history and
        reports of runs started with ``a``. With ``manage_fleet`` the app starts the fleet on
        mount and stops it on exit. ``job_store`` (a ``gpuctl.jobs.store.JobStore``) feeds the
        jobs pane; when it could not be opened, ``job_store_error`` is the one line the pane
        shows instead. ``accept_options`` overrides fields of the runs' ``AcceptOptions``
        (``python``, ``extra_args``, ...). ``trouble_log`` keeps the fleet's trouble (``e``):
        by default the state folder's, kept in memory only for a simulated fleet.
        """
        super().__init__()
        ScrollBar.renderer = LineScrollBar  # horizontal ones a line, not a row-like block
        self.fleet = fleet
        self.read_only = read_only
        if read_only:
            self._bindings.key_to_bindings = {
                key: [replace(b, show=False) if b.id in MUTATING_KEYS else b for b in bindings]
                for key, bindings in self._bindings.key_to_bindings.items()
            }
        self.simulated = simulated
        self.tui_settings = tui if tui is not None else TuiSettings()
        # ASCII mode: every line drawn through the glyph table's filter (``tui.glyphs``)
        self.ascii = glyphs.wanted(self.tui_settings.ascii)
        self._ascii_filter = glyphs.AsciiFilter()
        self.store = FleetStore(fleet, clock or time.time)
        self.coalesce = coalesce
        self.manage_fleet = manage_fleet
        self.state_dir = state_dir if state_dir is not None else paths.state_dir()
        self.theme_memory = ThemeMemory(self.state_dir)
        self.gpuctl_themes: list[str] = []
        self.selection: tuple[str, int | None] | None = None
        self.keymap: dict[str, str] = {}
        self._flush_scheduled = False
        self._flush_context: contextvars.Context | None = None  # the app's (``on_mount``)
        self._theme_ready = False
        self.overview = OverviewScreen(
            self.store,
            simulated=simulated,
            read_only=read_only,
            job_store=job_store,
            job_store_error=job_store_error,
            history_path=self.state_dir / paths.ACCEPT_DB,
        )
        self.trouble_error: str | None = None  # why the state folder's trouble log is not kept
        if trouble_log is None and simulated:
            # a simulated cluster's trouble is not the site's; on the app's clock
            trouble_log = TroubleLog(None, clock=self.store.clock)
        elif trouble_log is None:
            try:
                trouble_log = TroubleLog.open(self.state_dir / paths.EVENTS)
            except OSError as e:
                self.trouble_error = f"the trouble log is kept in memory only: {e}"
                trouble_log = TroubleLog(None)
        self.trouble_log = trouble_log
        self.store.troubles = trouble_log
        self.crash: BaseException | None = None  # what ended the app, if something did
        self.on_flush: Callable[[set[str], dict[str, float]], None] | None = None
        # Coroutines to run as workers once the fleet is started (the demo's story).
        self.background: list[Callable[[], Awaitable[None]]] = []
        self._background_tasks: list[asyncio.Task[None]] = []  # their workers' tasks
        # The feature flows (``gpuctl.tui.controllers``): what the keys do with the fleet.
        self.stress_flow = StressController(self)
        self.accept_flow = AcceptController(self, accept_options)
        self.record_flow = RecordController(self)
        self.quit_flow = QuitController(self, self.stress_flow)
        self.activity_flow = ActivityController(self)

    def get_line_filters(self) -> Sequence[LineFilter]:
        filters = super().get_line_filters()
        return [*filters, self._ascii_filter] if self.ascii else filters

    def get_key_display(self, binding: Binding) -> str:
        """A key as the footer, help and palette show it; in ASCII mode by its name where its
        glyph's one-cell twin would not read as that key (``glyphs.KEY_NAMES``: Enter)."""
        shown = super().get_key_display(binding)
        return glyphs.KEY_NAMES.get(shown, shown) if self.ascii else shown

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
        # the context a flush runs in (``_schedule_flush``): the app's, as its own timers have it
        self._flush_context = contextvars.copy_context()
        self.fleet.subscribe(self._on_snapshot)
        self.fleet.on_event(self._on_fleet_event)
        self.fleet.on_removed(self._on_node_removed)
        control.attach(self.fleet)  # burn events become annotations we can draw
        self.trouble_log.watch(self.fleet)
        if self.trouble_error is not None:
            self.notify(self.trouble_error, severity="warning")
        self.ticker = self.set_interval(1.0, self._tick)  # a test pauses it
        self.activity_flow.start()
        if self.manage_fleet:
            await self.fleet.start()
        for job in self.background:
            self.run_worker(
                self._background(job), name="background", group="background", exit_on_error=False
            )

    async def _background(self, job: Callable[[], Awaitable[None]]) -> None:
        task = asyncio.current_task()  # the worker's: ``on_unmount`` ends it
        if task is not None:
            self._background_tasks.append(task)
        await job()

    async def on_unmount(self) -> None:
        self.record_flow.close()  # a recording ends with the screen, whole
        # Textual cancels its workers once and does not wait: on Python 3.11 a request's
        # wait_for can lose that cancel, and the demo's story went on while the fleet stopped
        # (``asyncio.run`` cancels it once more at exit: lost again, the process never exits).
        # Ended as ``running_fleet`` ends it for ``export`` and ``record``, before the fleet.
        await end_tasks(self._background_tasks)
        if self.manage_fleet:
            with contextlib.suppress(TimeoutError):
                await wait_for(self.fleet.stop(), STOP_TIMEOUT_S)
        self.trouble_log.close()  # the rows that changed since their last write

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
            self._schedule_flush()

    def _on_fleet_event(self, node: str, event: NodeEvent) -> None:
        if event.kind == "xid" and event.gpu is not None:
            self.store.xids.add((node, event.gpu))
            xid = event.detail.get("xid", "?")
            self.notify(f"{node} GPU {event.gpu}: XID {xid}", severity="warning")
        elif event.kind == "gpu_lost":
            self.notify(f"{node} GPU {event.gpu} fell off the bus", severity="error")
        if node in self.fleet.nodes:  # not one removed as its last event came
            self._on_snapshot(self.fleet.snapshot(node))

    def _on_node_removed(self, node: str, why: str) -> None:
        """A node left the fleet: its rows go at the next flush (``FleetStore.leave``)."""
        if self.store.leave(node, why):
            self._schedule_flush()

    def on_fleet_changed(self, _message: FleetChanged) -> None:
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        """Flush ``coalesce`` seconds from now, unless a flush is due already. On the event
        loop's own timer, in the app's context: a Textual timer is a task of its own; with the
        message that asked for it, 8-9 a second at 4,096 GPUs, it cost the screen ~0.3 % of a
        core (``benchmarks/tui_load.py --compare``, four alternated pairs, each lower)."""
        if self._flush_scheduled:
            return
        self._flush_scheduled = True
        asyncio.get_running_loop().call_later(
            self.coalesce, self._flush_guarded, context=self._flush_context
        )

    def _flush_guarded(self) -> None:
        """``_flush_pending``, whose error ends the app as one in a Textual timer does (the
        loop's timer would only log it)."""
        try:
            self._flush_pending()
        except Exception as error:  # handed to the app, as Textual's timers do
            self._handle_exception(error)

    def _flush_pending(self) -> None:
        self._flush_scheduled = False
        if not self.overview.ready or not self.is_running:
            return  # the overview's mount posts FleetChanged again
        removed = self.store.take_removed()
        names, arrivals = self.store.take_pending()
        if not names and not removed:
            return
        with self.batch_update():
            if removed:
                self._nodes_removed(removed)
            if names:
                self.overview.nodes_changed(names, arrivals)
                screen = self.screen
                if isinstance(screen, DetailScreen | ProcessScreen) and screen.node in names:
                    screen.node_changed()
        if self.on_flush is not None and names:
            self.on_flush(names, arrivals)

    def _nodes_removed(self, removed: dict[str, str]) -> None:
        """Nodes the store just forgot: the list and header without them, a detail or process
        screen of one closed (with what was opened over it), and one notice naming them (the
        fleet's log has each: ``Fleet.remove_node``)."""
        self.overview.nodes_removed(removed)
        stack = self.screen_stack
        showing = [
            i
            for i, s in enumerate(stack)
            if isinstance(s, DetailScreen | ProcessScreen) and s.node in removed
        ]
        if showing:
            for _ in range(len(stack) - showing[0]):
                self.pop_screen()
        if self.selection is not None and self.selection[0] in removed:
            self.selection = self.overview.selection()
        lines = [f"{node} {why}" for node, why in removed.items()]
        if len(lines) > 3:
            lines[2:] = [f"and {len(lines) - 2} more nodes left (the log names each)"]
        self.notify("; ".join(lines), timeout=8)

    def _tick(self) -> None:
        """Once a second: ages of stale nodes move on, and so does the header."""
        if not self.overview.ready or not self.is_running:
            return
        self.overview.tick()
        self.trouble_log.tick()  # others' acknowledgements read, changed rows written
        if isinstance(self.screen, DetailScreen):
            self.screen.node_changed()
        elif isinstance(self.screen, EventsScreen):
            self.screen.changed()

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

    def action_stress_gpu(self) -> None:
        self.stress_flow.gpu()

    def action_stress_node(self) -> None:
        self.stress_flow.node()

    def action_stress_cluster(self) -> None:
        self.stress_flow.cluster()

    def action_accept(self) -> None:
        self.accept_flow.press()

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
        """Start recording the fleet's stream into the state folder's ``recordings/``, or stop
        (``RecordController``)."""
        self.record_flow.toggle()

    def action_processes(self) -> None:
        """The process view of the selected GPU (or node)."""
        sel = self.current_selection()
        if sel is None or sel[0] not in self.store.snaps:
            self.notify("select a node or GPU first", severity="warning")
            return
        self.push_screen(ProcessScreen(self.store, sel[0], sel[1], read_only=self.read_only))

    def action_events(self) -> None:
        """The trouble log's screen (of the GPU the detail screen shows, from there)."""
        me = service.me()
        start = ""
        if isinstance(self.screen, DetailScreen):
            gpu = "" if self.screen.gpu is None else f" gpu={self.screen.gpu}"
            start = f"node={self.screen.node}{gpu}"
        by = f"{me.user}@{me.host}"
        self.push_screen(EventsScreen(self.trouble_log, by=by, start=start, clock=self.store.clock))

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
        self.quit_flow.quit()

    # -- bindings as data: help screen and command palette ------------------------------------
    def _binding_sources(self) -> Iterable[tuple[str, list[BindingType]]]:
        yield "everywhere", self.BINDINGS
        yield "overview", OverviewScreen.BINDINGS
        yield "GPU list", NodeList.BINDINGS
        yield "heatmap", Heatmap.BINDINGS
        yield "detail", DetailScreen.BINDINGS
        yield "processes", ProcessScreen.BINDINGS
        yield "events", EventsScreen.BINDINGS
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
        # moving about first (arrows, Enter, Esc), then the rest in the screens' order
        return sorted(rows, key=lambda r: NAV_KEYS.index(r[0]) if r[0] in NAV_KEYS else 99)

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


# the keys that move about, in the order the help lists them first
NAV_KEYS = ("↑", "↓", "←", "→", "pgup", "pgdn", "home", "end", "⏎", glyphs.KEY_NAMES["⏎"], "esc")


def _title(description: str) -> str:
    return description[:1].upper() + description[1:]


# The constructor is the factory (one way to build the app): the CLI, the tests, the benchmark
# and the screenshot script all call it under this name.
make_app = GpuctlApp
