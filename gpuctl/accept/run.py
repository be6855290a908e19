"""One acceptance run over some nodes: live progress, per-node outcomes, the cluster report.

The async API the CLI and the TUI share::

    run = start_fleet_run(fleet, ["node1", "node2"], AcceptOptions(quick=True))
    run.subscribe(listener)             # Progress values, on the event loop, keep it quick
    run.unsubscribe(listener)           # when the listener is done (after "finished")
    run.status["node1"]["compute"]      # "pending" | "running" | "PASS" | "WARN" | "FAIL" | "SKIP"
    report = await run.wait()           # the cluster report (dict), history recorded
    run.cancel()                        # stops the suites (accept_stop / scancel)

Three ways to run: ``start_fleet_run`` (each node's agent runs the single-node suite: SSH, srun
or local links alike), ``start_local_run`` (this machine, through a local agent) and
``gpuctl.accept.slurm.start_slurm_run`` (one batch job, DDP across nodes).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuctl import audit, service
from gpuctl.accept import consistency
from gpuctl.accept.expect import TYPED, Expectation, resolve
from gpuctl.accept.history import DEFAULT_THRESHOLD, Degradation, HistoryStore
from gpuctl.accept.results import outcome
from gpuctl.core import wire
from gpuctl.core.deadline import wait_for
from gpuctl.core.model import NodeEvent, NodeSnapshot, NodeState
from gpuctl.core.wire import JsonObject
from gpuctl.fleet.fleet import Fleet
from gpuctl.fleet.links import LocalLink
from gpuctl.fleet.session import LinkError, refusal
from gpuctl.node.messages import AcceptEvent, AcceptStarted
from gpuctl.workloads.accept_suite.peaks import format_floors
from gpuctl.workloads.accept_suite.schema import SCHEMA_VERSION, SECTIONS

CLUSTER_SCHEMA = "gpuctl.accept.cluster"
PENDING, RUNNING = "pending", "running"
ERROR = "ERROR"  # a node that produced no report (unreachable, crashed, cancelled)

ProgressListener = Callable[["Progress"], None]

SILENT_AFTER_S = 40.0
"""Seconds without a word from a node's suite after which the run says so ("silent" progress,
again every ``SILENT_AFTER_S / 4`` while the silence lasts)."""
RESULT_GRACE_S = 60.0
EARLY_EVENTS_MAX = 500  # a node's events held until its accept_start answer is read
"""Seconds past the suite's ``timeout`` that the login side waits for a node's result (its agent
stops the suite at ``timeout``); then the node ends with where it had got to."""


@dataclass(frozen=True, slots=True)
class AcceptOptions:
    """What the suite is asked to do on every node (``suite_args`` turns it into options)."""

    quick: bool = False
    prolog: bool = False  # seconds, NVML alone, no load (a Slurm prolog's check)
    device: str = "cuda"
    expect_gpus: int | None = None  # typed: every node (else ``expected``, then Slurm's gres)
    expected: Mapping[str, Expectation] = field(default_factory=dict)  # per node, from config
    gres_from: Mapping[str, str | None] = field(default_factory=dict)  # node -> its slurm_conf
    allow_no_gpu: bool = False
    floor: float | None = None  # one floor for every model and dtype (None: per model x dtype)
    floors: Mapping[str, Mapping[str, float]] | None = None  # [accept.floors]: model -> dtype
    dtypes: tuple[str, ...] | None = None  # GEMM dtypes (None: the suite's default)
    python: str | None = None  # VENV2 interpreter on the nodes; None: the agent's own
    timeout: float = 3600.0
    threshold: float = DEFAULT_THRESHOLD  # history: a drop beyond this is a degradation
    expect_model: str | None = None  # [SHAPE]: every GPU's name contains this
    expect_nvlinks: int | None = None  # [SHAPE]: active NVLinks per GPU
    expect_mig: str = "off"  # [SHAPE]: the MIG mode every GPU must be in
    memtest_mb: int | None = None  # [MEMTEST]: MiB tested (None: 90% of free)
    test_break_rank: int | None = None
    test_slow_compute: int | None = None
    extra_args: tuple[str, ...] = ()
    silent_after: float = SILENT_AFTER_S  # the login side's: a silent suite is said to be

    def suite_args(self, expectation: Expectation | None = None) -> list[str]:
        """Options for ``python -m gpuctl.workloads.accept_suite`` (``expectation``: the node's
        expected GPU count, ``gpuctl.accept.expect``; a typed ``expect_gpus`` wins)."""
        args = ["--device", self.device]
        if self.quick:
            args.append("--quick")
        if self.prolog:
            args.append("--prolog")
        if self.expect_gpus is not None:
            expectation = Expectation(self.expect_gpus, TYPED)
        if expectation is not None:
            args += ["--expect-gpus", str(expectation.count), "--expect-source", expectation.source]
        if self.allow_no_gpu:
            args.append("--allow-no-gpu")
        if self.floor is not None:
            args += ["--floor", str(self.floor)]
        if self.floors:
            args += ["--floors", format_floors({k: dict(v) for k, v in self.floors.items()})]
        if self.dtypes:
            args += ["--dtypes", ",".join(self.dtypes)]
        if self.expect_model:
            args += ["--expect-model", self.expect_model]
        if self.expect_nvlinks is not None:
            args += ["--expect-nvlinks", str(self.expect_nvlinks)]
        if self.expect_mig != "off":
            args += ["--expect-mig", self.expect_mig]
        if self.memtest_mb is not None:
            args += ["--memtest-mb", str(self.memtest_mb)]
        if self.test_break_rank is not None:
            args += ["--test-break-rank", str(self.test_break_rank)]
        if self.test_slow_compute is not None:
            args += ["--test-slow-compute", str(self.test_slow_compute)]
        return args + list(self.extra_args)


@dataclass(frozen=True, slots=True)
class Progress:
    """One step of a run, for listeners.

    ``kind``: "started" (the node's suite runs), "section" (``state`` start/end, ``verdict`` at
    the end), "line" (a human line of the suite, in ``text``), "silent" (nothing from the
    node's suite for ``AcceptOptions.silent_after``: ``text`` says which pid, where it had got
    to and for how long), "done" (the node finished; ``verdict``), "error" (the node could not
    run; ``text`` says why), "finished" (the whole run; ``node`` is "").
    """

    node: str
    kind: str
    section: str | None = None
    state: str | None = None
    verdict: str | None = None
    text: str = ""


@dataclass(slots=True)
class NodeOutcome:
    """How one node ended: its verdict, its report (None when it produced none) and why."""

    node: str
    verdict: str
    report: dict[str, Any] | None = None
    reason: str | None = None
    failures: list[str] = field(default_factory=list)
    degradations: list[Degradation] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # WARN results: noted, not failed


class AcceptRun:
    """The live state of one acceptance run. Create with a ``start_*`` function."""

    def __init__(self, nodes: list[str], options: AcceptOptions, via: str) -> None:
        self.nodes = list(nodes)
        self.options = options
        self.via = via
        self.started = time.time()
        self.status: dict[str, dict[str, str]] = {
            n: dict.fromkeys(SECTIONS, PENDING) for n in nodes
        }
        self.outcomes: dict[str, NodeOutcome] = {}
        self.lines: dict[str, list[str]] = {n: [] for n in nodes}
        self.report: dict[str, Any] | None = None
        self.report_paths: list[Path] = []
        self.job_id: str | None = None  # Slurm runs
        # where each node's run is (start_fleet_run): "section compute", "started pid 12, ..."
        self.stages: dict[str, str] = dict.fromkeys(nodes, "waiting for the fleet to connect")
        self._listeners: list[ProgressListener] = []
        self._task: asyncio.Task[dict[str, Any]] | None = None
        self._cancel: Callable[[], Awaitable[None]] | None = None

    # -- listening --------------------------------------------------------------------------
    def subscribe(self, listener: ProgressListener) -> None:
        """Call ``listener(progress)`` for every step from now on."""
        self._listeners.append(listener)

    def unsubscribe(self, listener: ProgressListener) -> None:
        """Stop calling ``listener`` (a no-op when it is not subscribed). Safe from inside a
        listener: ``emit`` calls the listeners subscribed when the step began."""
        with contextlib.suppress(ValueError):
            self._listeners.remove(listener)

    def emit(self, p: Progress) -> None:
        """Record a step in ``status``/``lines`` and tell the listeners (drivers call this)."""
        if p.node in self.status:
            if p.kind == "section" and p.section in SECTIONS:
                self.status[p.node][p.section] = (
                    RUNNING if p.state == "start" else (p.verdict or ERROR)
                )
            elif p.kind == "line":
                self.lines[p.node].append(p.text)
                del self.lines[p.node][:-500]
        for listener in list(self._listeners):
            listener(p)

    def relay(self, node: str, detail: AcceptEvent) -> None:
        """Turn one suite progress event into Progress (the suite's ``--events`` lines)."""
        kind = detail.get("event")
        if kind == "start":
            self.emit(Progress(node, "started"))
        elif kind == "section":
            self.emit(
                Progress(
                    node,
                    "section",
                    section=_str(detail.get("section")),
                    state=_str(detail.get("state")),
                    verdict=_str(detail.get("verdict")),
                    text=str(detail.get("summary") or ""),
                )
            )
        elif kind == "line":
            self.emit(
                Progress(
                    node,
                    "line",
                    section=_str(detail.get("section")),
                    text=str(detail.get("text", "")),
                )
            )

    def finish_node(self, outcome: NodeOutcome) -> None:
        """Record a node's end; sections never reported become ERROR when it has no report."""
        if outcome.report is not None:
            for name in SECTIONS:
                sec = (outcome.report.get("sections") or {}).get(name) or {}
                self.status[outcome.node][name] = str(sec.get("verdict") or ERROR)
        else:
            for name, state in self.status[outcome.node].items():
                if state in (PENDING, RUNNING):
                    self.status[outcome.node][name] = ERROR
        self.outcomes[outcome.node] = outcome
        kind = "done" if outcome.report is not None else "error"
        self.emit(Progress(outcome.node, kind, verdict=outcome.verdict, text=outcome.reason or ""))

    # -- life cycle --------------------------------------------------------------------------
    def _start(
        self,
        body: Awaitable[None],
        cancel: Callable[[], Awaitable[None]] | None,
        report_dir: str | os.PathLike[str] | None,
        history: HistoryStore | None,
    ) -> None:
        self._cancel = cancel

        async def main() -> dict[str, Any]:
            why = "the run ended without it"
            try:
                await body
            except asyncio.CancelledError:
                why = "cancelled (Ctrl-C or the run was stopped)"
                raise
            finally:
                for n in self.nodes:
                    if n not in self.outcomes:
                        self.finish_node(NodeOutcome(n, ERROR, reason=why))
            return self._conclude(report_dir, history)

        self._task = asyncio.get_running_loop().create_task(main(), name="accept-run")

    async def wait(self) -> dict[str, Any]:
        """Wait for the end and return the cluster report."""
        assert self._task is not None, "use a start_* function"
        return await self._task

    def done(self) -> bool:
        """True once the run has ended (like ``asyncio.Task.done``)."""
        return self._task is not None and self._task.done()

    async def cancel(self) -> None:
        """Stop the suites; ``wait()`` then returns with the nodes still running as ERROR."""
        if self._cancel is not None:
            with contextlib.suppress(Exception):
                await self._cancel()
        if self._task is not None and not self._task.done():
            self._task.cancel()

    def _conclude(
        self, report_dir: str | os.PathLike[str] | None, history: HistoryStore | None
    ) -> dict[str, Any]:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(self.started))
        folder = Path(report_dir) if report_dir is not None else None
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
        for node in self.nodes:
            o = self.outcomes[node]
            if o.report is None:
                continue
            if history is not None:
                try:
                    o.degradations = history.record(
                        node, o.report, threshold=self.options.threshold, via=self.via
                    )
                except Exception as e:  # history is a convenience: never lose the report to it
                    o.warnings.append(f"history not recorded: {e}")
                # A node below its own healthy past fails, even above the absolute floors.
                o.failures += [f"degraded {d.reason()}" for d in o.degradations]
                if o.degradations and o.verdict == "PASS":
                    o.verdict = "FAIL"
            if folder is not None:
                path = folder / f"accept-{node}-{stamp}.json"
                _write_json(path, o.report)
                self.report_paths.append(path)
        reported = {n: o.report for n, o in self.outcomes.items() if o.report is not None}
        for node, odd in consistency.odd_ones(reported).items():
            self.outcomes[node].warnings += [f"consistency: {w}" for w in odd]
        failures = [f"{n}: {f}" for n in self.nodes for f in self.outcomes[n].failures]
        failures += [
            f"{n}: {self.outcomes[n].reason}" for n in self.nodes if self.outcomes[n].report is None
        ]
        degradations = [d for n in self.nodes for d in self.outcomes[n].degradations]
        verdict = "PASS" if all(self.outcomes[n].verdict == "PASS" for n in self.nodes) else "FAIL"
        report: dict[str, Any] = {
            "schema": CLUSTER_SCHEMA,
            "schema_version": SCHEMA_VERSION,
            "via": self.via,
            "job_id": self.job_id,
            "started": self.started,
            "finished": time.time(),
            "options": {
                "quick": self.options.quick,
                "device": self.options.device,
                "suite_args": self.options.suite_args(),
            },
            "verdict": verdict,
            "failures": failures,
            "warnings": [f"{n}: {w}" for n in self.nodes for w in self.outcomes[n].warnings],
            "degradations": [d.to_dict() for d in degradations],
            "nodes": {
                n: {
                    "verdict": self.outcomes[n].verdict,
                    "reason": self.outcomes[n].reason,
                    "failures": self.outcomes[n].failures,
                    "warnings": self.outcomes[n].warnings,
                    "sections": dict(self.status[n]),
                    "report": self.outcomes[n].report,
                }
                for n in self.nodes
            },
        }
        if folder is not None and len(self.nodes) > 1:
            path = folder / f"accept-cluster-{stamp}.json"
            _write_json(path, report)
            self.report_paths.append(path)
        report["outcome"] = outcome(report)  # PASS | WARN | FAIL | ERROR (gpuctl.accept.results)
        self.report = report
        self.emit(Progress("", "finished", verdict=verdict))
        return report


def outcome_from_report(
    node: str, report: Mapping[str, Any] | None, reason: str | None
) -> NodeOutcome:
    """A NodeOutcome from a node report (or its absence and the reason)."""
    if report is None or report.get("schema_version") != SCHEMA_VERSION:
        why = reason or (
            f"report schema {report.get('schema_version')!r}, expected {SCHEMA_VERSION}"
            if report is not None
            else "no report"
        )
        return NodeOutcome(node, ERROR, None, why)
    fails = [str(f) for f in report.get("failures") or []]
    verdict = "PASS" if report.get("verdict") == "PASS" else "FAIL"
    warns = [str(w) for w in report.get("warnings") or []]
    return NodeOutcome(node, verdict, dict(report), reason, fails, warnings=warns)


# -- through the fleet's agents ----------------------------------------------------------------
@audit.audited(lambda a: ("accept", audit.nodes_text(a.arguments["nodes"]), "the suite via agents"))
def start_fleet_run(
    fleet: Fleet,
    nodes: list[str],
    options: AcceptOptions,
    *,
    report_dir: str | os.PathLike[str] | None = None,
    history: HistoryStore | None = None,
    python_for: Mapping[str, str | None] | None = None,
    settle_timeout: float = 60.0,
    via: str = "agent",
    read_only: bool | None = None,
    result_grace: float = RESULT_GRACE_S,
) -> AcceptRun:
    """Run the single-node suite on each node through its agent (the fleet must be started).

    A node whose suite says nothing for ``options.silent_after`` is reported ("silent"
    progress: its pid, its stage, the silence); one without a result ``result_grace`` after
    ``options.timeout`` is stopped (``accept_stop``) and ends ERROR with the stage it stopped at.
    So does one whose agent's link was lost or replaced during the run (the new agent does not
    know the run: waiting for its end would have waited the whole timeout).

    ``python_for`` names each node's VENV2 interpreter (default ``options.python``, else the
    agent's own). ``read_only`` is the caller's decision (None: ``gpuctl.service`` decides from
    the fleet, ``$GPUCTL_READ_ONLY`` and the config). Needs a running event loop; returns at
    once. Raises ``gpuctl.service.ReadOnlyError`` in read-only mode (ConfigError when the config
    that would say cannot be read), before anything starts.
    """
    service.check("the acceptance suite", read_only=read_only, fleet=fleet)
    run = AcceptRun(nodes, options, via)
    runs: dict[str, str] = {}  # node -> the agent's run id
    finished: dict[str, asyncio.Future[AcceptEvent]] = {}
    loop = asyncio.get_running_loop()
    active = True
    stage = run.stages  # where each node is
    heard = dict.fromkeys(nodes, time.monotonic())  # when each node's suite last said something
    agents: dict[str, object] = {}  # node -> the hello of the agent that runs its suite

    def where(node: str) -> str:
        return f"{stage[node]}, last output {time.monotonic() - heard[node]:.0f} s ago"

    # A node's events that came before its accept_start answer was read by ``one_outcome``:
    # the answer and the suite's first lines often arrive in one read (a suite that fails at
    # once: all of them), and the lines are dispatched before the awaiting task resumes.
    early: dict[str, list[AcceptEvent]] = {}

    def on_event(node: str, ev: NodeEvent) -> None:
        if not active or ev.kind != "accept" or node not in finished:
            return
        # through the agent's own definition: a field of another type is left out, not trusted
        detail = wire.parse(AcceptEvent, ev.detail)
        if detail is None:
            return
        if runs.get(node) is None:
            held = early.setdefault(node, [])
            if len(held) < EARLY_EVENTS_MAX:
                held.append(detail)
            return
        on_detail(node, detail)

    def on_detail(node: str, detail: AcceptEvent) -> None:
        if detail.get("run") != runs[node]:
            return
        heard[node] = time.monotonic()
        if detail.get("event") == "section" and detail.get("state") == "start":
            stage[node] = f"section {_str(detail.get('section')) or '?'}"
        elif detail.get("event") == "start" and stage[node].startswith("started"):
            stage[node] = "the suite started, before its first section"
        if detail.get("event") == "exit":
            if not finished[node].done():
                finished[node].set_result(detail)
        else:
            run.relay(node, detail)

    def on_snapshot(snap: NodeSnapshot) -> None:
        fut = finished.get(snap.name)
        if active and fut is not None and not fut.done() and snap.name in runs:
            if snap.state is NodeState.UNREACHABLE:
                why = f"link lost during the run: {snap.reason}"
            elif snap.info is not agents.get(snap.name) or (snap.reason or "").startswith(
                "reconnecting"
            ):  # a new agent (it knows nothing of the run), or the link to the old one broke
                why = f"the node's agent was replaced during the run ({snap.reason or 'new link'})"
            else:
                return
            fut.set_exception(LinkError("closed", f"{why}; stopped at: {where(snap.name)}"))

    # the run's own listeners, removed when it ends (nothing of a run stays on the fleet)
    fleet.on_event(on_event)
    fleet.subscribe(on_snapshot)

    expectations: dict[str, Expectation] = {}
    unknown: dict[str, str] = {}  # Slurm nodes whose expected GPU count could not be had

    async def one(node: str) -> None:
        outcome = await one_outcome(node)
        if node in unknown:
            outcome.warnings.append(f"expected GPU count unknown: {unknown[node]}")
        run.finish_node(outcome)

    async def one_outcome(node: str) -> NodeOutcome:
        finished[node] = loop.create_future()
        snap = fleet.snapshot(node)
        if snap.state is not NodeState.LIVE:
            return NodeOutcome(
                node, ERROR, reason=f"not reachable: {snap.reason or snap.state.value}"
            )
        python = (python_for or {}).get(node) or options.python
        stage[node] = "asking the agent to start the suite"
        heard[node] = time.monotonic()
        args = options.suite_args(expectations.get(node))
        if options.device == "sim":  # its agent runs here: the report names the simulated node
            args += ["--node-name", node]
        msg: JsonObject = {
            "type": "accept_start",
            "args": args,
            "timeout": options.timeout,
        }
        if python:
            msg["python"] = python
        try:
            reply = await fleet.request(node, msg, timeout=30)
        except LinkError as e:
            return NodeOutcome(node, ERROR, reason=f"{e.message}; stopped at: {where(node)}")
        error = refusal(reply)
        if error is not None:
            why = str(error.get("message"))
            if error.get("code") == "unknown_request":
                why = "this node's agent has no acceptance plugin (an old bundle?)"
            return NodeOutcome(node, ERROR, reason=why)
        started = wire.parse(AcceptStarted, reply)
        if started is None:
            return NodeOutcome(node, ERROR, reason="the agent's answer to accept_start has no run")
        runs[node] = started["run"]
        agents[node] = snap.info
        heard[node] = time.monotonic()
        stage[node] = f"started pid {started.get('pid', '?')}, before the suite's first line"
        for detail in early.pop(node, []):  # in the order they came; another run's are dropped
            on_detail(node, detail)
        limit = options.timeout + result_grace
        try:
            detail = await wait_for(finished[node], limit)
        except LinkError as e:
            return NodeOutcome(node, ERROR, reason=e.message)
        except TimeoutError:
            with contextlib.suppress(LinkError, TimeoutError):
                await fleet.request(node, {"type": "accept_stop"}, timeout=5)
            return NodeOutcome(
                node, ERROR, reason=f"no result within {limit:g} s; stopped at: {where(node)}"
            )
        report = detail.get("report")
        reason = detail.get("reason")
        if report is None:
            tail = " | ".join([*(detail.get("stderr_tail") or [])[-2:]])
            reason = f"{reason or 'no report'}" + (f": {tail}" if tail else "")
            reason += f"; stopped at: {stage[node]}"
        return outcome_from_report(node, report if isinstance(report, dict) else None, reason)

    async def watch() -> None:
        """Say so for each node whose suite has been silent for ``options.silent_after``."""
        every = max(0.05, options.silent_after / 4)
        while True:
            await asyncio.sleep(every)  # a timer: silence is a matter of time
            now = time.monotonic()
            for node in nodes:
                quiet = now - heard[node]
                if node not in run.outcomes and quiet >= options.silent_after:  # any stage
                    text = f"no output for {quiet:.0f} s ({stage[node]})"  # the news first
                    run.emit(Progress(node, "silent", text=text))

    async def body() -> None:
        nonlocal active
        watcher = asyncio.create_task(watch(), name="accept-silence")
        try:
            found, missing = await resolve(
                nodes, options.expect_gpus, options.expected, options.gres_from
            )
            expectations.update(found)
            unknown.update(missing)
            await fleet.wait_settled(settle_timeout)
            await asyncio.gather(*(one(n) for n in nodes))
        finally:
            watcher.cancel()
            active = False
            fleet.unsubscribe(on_event)  # the run is over: its listeners go
            fleet.unsubscribe(on_snapshot)

    async def cancel() -> None:
        for node in runs:
            with contextlib.suppress(LinkError, Exception):
                await fleet.request(node, {"type": "accept_stop"}, timeout=5)

    run._start(body(), cancel, report_dir, history)
    return run


async def start_local_run(
    options: AcceptOptions,
    *,
    report_dir: str | os.PathLike[str] | None = None,
    history: HistoryStore | None = None,
    node: str | None = None,
    read_only: bool | None = None,
) -> tuple[AcceptRun, Fleet]:
    """Run the suite on this machine through a local agent; stop the returned fleet after.

    Raises ``gpuctl.service.ReadOnlyError`` in read-only mode (see ``start_fleet_run``)."""
    service.check("the acceptance suite", read_only=read_only)
    name = node or socket.gethostname()
    fleet = Fleet({name: LocalLink(python=sys.executable, interval=5.0)})
    await fleet.start()
    run = start_fleet_run(
        fleet,
        [name],
        options,
        report_dir=report_dir,
        history=history,
        python_for={name: options.python or sys.executable},
        via="local",
        read_only=False,  # decided above
    )
    return run, fleet


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _write_json(path: Path, value: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value, indent=1, default=str))
    os.replace(tmp, path)
