"""Stress control from the login side: start and stop burns, and show them on the fleet.

Burn state lives in the fleet's per-GPU annotations (``fleet.annotate(node, gpu, burn={...})``)
so that the TUI and the CLI read one source. The ``burn`` annotation is a
``gpuctl.node.messages.BurnState`` (the agent's stress messages are defined there, beside
their writer): ``state`` ("starting" | "running" | "stopping" | "done" |
"failed"), ``engine``, ``tflops``, ``errors``, ``ends_at`` (unix time), ``verdict`` ("OK" |
"FAULTY" | "DIED" | None), ``reason``, plus what the burner reports (tflops_mean, iterations,
temp, dtype, message), and ``owner`` (``{user, host, session}`` of the gpuctl that started it).
It is fed by the agents' ``burn`` events, checked field by field where they enter
(``burn_from_wire``); a node whose link drops has its active burns marked failed, because its
agent stops them (the dead-man's switch). The agents' replies are checked the same way into
``StressReply`` and ``StressStatus``.

``signal_process`` sends SIGTERM, SIGINT or SIGKILL to a GPU process of the caller's own user (the
process view's kill keys): refused for another user's process, here and by the agent, and in
read-only mode.

Starting and stopping are mutating actions: ``set_stress`` and ``stop_burners`` ask
``gpuctl.service`` first and raise ``ReadOnlyError`` in read-only mode (the caller's
``read_only``, a fleet built read-only, ``$GPUCTL_READ_ONLY``, the config). Every burn started
here carries ``service.me()`` as its owner.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuctl import audit, service
from gpuctl.core import wire
from gpuctl.core.model import (
    BURNING_STATES,
    GpuProcess,
    NodeEvent,
    NodeSnapshot,
    NodeState,
    burn_from_wire,
)
from gpuctl.core.wire import JsonObject
from gpuctl.fleet.fleet import Fleet
from gpuctl.fleet.session import LinkError, refusal
from gpuctl.node import protocol
from gpuctl.node.messages import BurnState, SignalReply, StressReply

ACTIVE_STATES = BURNING_STATES
REQUEST_TIMEOUT = 20.0
# Keys of a config's [stress] table that become stress_start fields.
OPTION_KEYS = (
    "duration",
    "max_duration",
    "engine",
    "dtype",
    "mem_fraction",
    "gpu_burn",
    "gpu_burn_source",
    "workload_python",
)


class StressError(LinkError):
    """The agent refused a stress request; the message is its one-line reason."""


async def _ask(
    fleet: Fleet,
    node: str,
    msg: JsonObject,
    timeout: float,
    error_type: type[LinkError] = StressError,
) -> JsonObject:
    """The agent's reply to ``msg``; ``error_type`` (StressError) when it refuses (its code and
    one-line reason), LinkError when it does not answer."""
    reply = await fleet.request(node, msg, timeout)
    error = refusal(reply)
    if error is not None:
        code, why = error.get("code", "refused"), error.get("message", "refused")
        raise error_type(code, f"{node}: {why}")
    return reply


def _mark_stopping(fleet: Fleet, node: str, gpus: list[int]) -> None:
    """Show the burns on ``gpus`` that the agent is stopping as "stopping"."""
    for gpu in gpus:
        current = burn_of(fleet.snapshot(node), gpu)
        if current is not None and current.get("state") in ("starting", "running"):
            fleet.annotate(node, gpu, burn={**current, "state": "stopping"})


def configure(fleet: Fleet, options: Mapping[str, Any]) -> None:
    """Defaults for this fleet's burns from a config's ``[stress]`` table (unknown keys are
    ignored: the config loader reports them). ``max_duration`` (default
    ``protocol.DEFAULT_MAX_DURATION``) also becomes every agent's cap, which the node enforces.
    A value no agent accepts is not an error here: it stays a stress_start field, which the
    agent refuses with its one-line reason when a burn starts."""
    fleet.stress_defaults = {k: options[k] for k in OPTION_KEYS if k in options}
    cap = options.get("max_duration")
    if (
        isinstance(cap, int | float)
        and not isinstance(cap, bool)
        and 1 <= cap <= protocol.MAX_DURATION_CEILING
    ):
        fleet.configure_agents(max_duration=float(cap))
    attach(fleet)


def attach(fleet: Fleet) -> None:
    """Translate the fleet's burn events into annotations (idempotent)."""
    if fleet.burns_tracked:
        return
    fleet.burns_tracked = True

    def on_event(node: str, event: NodeEvent) -> None:
        if event.kind != "burn" or event.gpu is None:
            return
        fleet.annotate(node, event.gpu, burn=burn_from_wire(event.detail))

    def on_snapshot(snap: NodeSnapshot) -> None:
        if snap.state is not NodeState.UNREACHABLE:
            return
        for gpu, ann in list(snap.annotations.items()):
            burn = ann.get("burn")
            if burn is not None and burn.get("state") in ACTIVE_STATES:
                fleet.annotate(
                    snap.name,
                    gpu,
                    burn={
                        **burn,
                        "state": "failed",
                        "verdict": None,
                        "reason": "link lost: the agent stops its burners (dead-man's switch)",
                    },
                )

    fleet.on_event(on_event)
    fleet.subscribe(on_snapshot)


def burn_seconds(fleet: Fleet, node: str) -> float:
    """How long a burn ``set_stress`` starts on ``node`` lasts, as its agent decides it: the
    config's ``[stress] duration``, else its ``max_duration``, else the agent's cap (what the
    fleet configured, else what the agent said in its hello, else the protocol's default)."""
    for key in ("duration", "max_duration"):
        value = fleet.stress_defaults.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            return float(value)
    cap = fleet.agent_options.get("max_duration")
    if cap is None and node in fleet.nodes:
        info = fleet.snapshot(node).info
        cap = info.max_duration if info is not None else None
    return float(cap) if cap else protocol.DEFAULT_MAX_DURATION


def burn_of(snap: NodeSnapshot, gpu: int) -> BurnState | None:
    """The burn annotation of one GPU, or None."""
    return snap.burn(gpu)


def burning(fleet: Fleet) -> list[tuple[str, int]]:
    """``(node, gpu)`` of every burn that is starting, running or stopping."""
    return [
        (snap.name, gpu)
        for snap in fleet.snapshots()
        for gpu in sorted(snap.annotations)
        if snap.burning(gpu)
    ]


def _workload_python(fleet: Fleet, node: str) -> str | None:
    cfg = fleet.nodes[node].link.node
    return cfg.workload_python if cfg is not None else None


@audit.audited_async(
    lambda a: (
        "stress_start" if a.arguments["on"] else "stress_stop",
        a.arguments["node"],
        audit.gpus_text(a.arguments["gpus"])
        + (f" for {a.arguments['duration']:g} s" if a.arguments["duration"] else ""),
    )
)
async def set_stress(
    fleet: Fleet,
    node: str,
    gpus: list[int] | None,
    on: bool,
    *,
    duration: float | None = None,
    dtype: str | None = None,
    engine: str = "auto",
    options: Mapping[str, Any] | None = None,
    read_only: bool | None = None,
) -> StressReply:
    """Start (``on``) or stop burns on ``gpus`` of ``node`` (None: every GPU of the node); a
    stop reaches the burns this fleet's agent started (``stop_burners`` reaches other sessions').

    ``options`` adds stress_start fields (mem_fraction, max_duration, gpu_burn, size, device,
    ...) over the fleet's configured defaults; the burn's ``owner`` is this process
    (``service.me()``). ``read_only`` is the caller's decision (None: the service decides from
    the fleet, ``$GPUCTL_READ_ONLY`` and the config). Returns the agent's reply. Raises
    ``service.ReadOnlyError`` in read-only mode (``gpuctl.config.ConfigError`` when the config
    that would say cannot be read), LinkError when the node is not connected or does not
    answer, StressError (a LinkError) when the agent refuses, with its one-line reason.
    """
    service.check("stress", read_only=read_only, fleet=fleet)
    attach(fleet)
    if node not in fleet.nodes:
        raise StressError("unknown_node", f"no node named {node!r}")
    target: list[int] | str = "all" if gpus is None else list(gpus)
    if on:
        msg: JsonObject = {**fleet.stress_defaults, **(options or {})}
        msg.update({"type": "stress_start", "gpus": target, "owner": service.me().to_wire()})
        if engine != "auto" or "engine" not in msg:
            msg["engine"] = engine
        if duration is not None:
            msg["duration"] = duration
        if dtype is not None:
            msg["dtype"] = dtype
        if "workload_python" not in msg:
            python = _workload_python(fleet, node)
            if python:
                msg["workload_python"] = python
    else:
        msg = {"type": "stress_stop", "gpus": target}
    # Each GPU's burn before asking: the burn's first events can come in the same read as
    # the answer and be handled before this reads it (a burner that cannot start: "starting",
    # "failed"); a burn that changed meanwhile is this one's news, not to be put back.
    before = fleet.snapshot(node).annotations if on else {}
    asked = {gpu: ann.get("burn") for gpu, ann in before.items()}
    reply = wire.parse(StressReply, await _ask(fleet, node, msg, REQUEST_TIMEOUT)) or {}
    snap = fleet.snapshot(node)
    if on:
        for gpu in reply.get("started", []):
            current = burn_of(snap, gpu)
            if current is not None and current is not asked.get(gpu):
                continue  # its own events came first: they say where it is
            if current is None or current.get("state") not in ACTIVE_STATES:
                fleet.annotate(
                    node,
                    gpu,
                    burn={
                        "state": "starting",
                        "engine": reply.get("engine"),
                        "ends_at": reply.get("ends_at"),
                        "errors": 0,
                        "verdict": None,
                        "reason": None,
                        "owner": service.me().to_wire(),
                    },
                )
    else:
        _mark_stopping(fleet, node, reply.get("stopping", []))
    return reply


@audit.audited_async(
    lambda a: (
        "stress_stop",
        a.arguments["node"],
        audit.gpus_text(a.arguments["gpus"])
        + (", any user's burners" if a.arguments["any_owner"] else ", other sessions' too"),
    )
)
async def stop_burners(
    fleet: Fleet,
    node: str,
    gpus: list[int] | None = None,
    *,
    any_owner: bool = False,
    read_only: bool | None = None,
    timeout: float = REQUEST_TIMEOUT,
) -> StressReply:
    """Stop the burners on ``gpus`` of ``node`` (None: all) that this fleet's agent started and
    those other gpuctl sessions started there: of the latter only the caller's user's (any of
    their sessions), unless ``any_owner``.

    Returns the agent's reply: ``stopping`` (GPUs of this fleet's burns), ``others`` (pids of
    other sessions' burners it stopped), ``kept`` (burners it left alone: pid, gpu_index,
    device, engine, owner). Raises ``service.ReadOnlyError`` in read-only mode, LinkError when
    the node does not answer, StressError when the agent refuses.
    """
    service.check("stress", read_only=read_only, fleet=fleet)
    attach(fleet)
    if node not in fleet.nodes:
        raise StressError("unknown_node", f"no node named {node!r}")
    request = service.stop_request(gpus, any_owner=any_owner)
    reply = wire.parse(StressReply, await _ask(fleet, node, request, timeout)) or {}
    _mark_stopping(fleet, node, reply.get("stopping", []))
    return reply


# -- GPU processes ------------------------------------------------------------------------------
SIGNALS = ("TERM", "INT", "KILL")


class ProcessError(LinkError):
    """A signal to a GPU process refused, here or by the agent; the message is one line
    (reasons: bad_argument, unknown_node, not_gpu_process, no_process, not_yours, read_only)."""


def find_process(snap: NodeSnapshot, pid: int) -> GpuProcess | None:
    """The GPU process ``pid`` of the latest sample of ``snap``, or None."""
    for g in snap.gpus:
        for p in g.processes:
            if p.pid == pid:
                return p
    return None


@audit.audited_async(
    lambda a: (
        "signal",
        a.arguments["node"],
        f"pid {a.arguments['pid']} SIG{a.arguments['signal']}",
    )
)
async def signal_process(
    fleet: Fleet,
    node: str,
    pid: int,
    signal: str = "TERM",
    *,
    read_only: bool | None = None,
    timeout: float = REQUEST_TIMEOUT,
) -> SignalReply:
    """Send SIGTERM (``signal="TERM"``), SIGINT (``"INT"``) or SIGKILL (``"KILL"``) to GPU
    process ``pid`` of ``node``: only a process of the caller's own user, as the latest sample
    shows it (the agent checks the process's uid against its own too, and its start time, so a
    pid reused meanwhile is left alone).

    Returns the agent's reply. Raises ``service.ReadOnlyError`` in read-only mode,
    ProcessError (a LinkError) when the process is not a GPU process of the node, is another
    user's, or the agent refuses; LinkError when the node does not answer.
    """
    service.check("signalling processes", read_only=read_only, fleet=fleet)
    if signal not in SIGNALS:
        raise ProcessError("bad_argument", f"signal must be TERM, INT or KILL, not {signal!r}")
    if node not in fleet.nodes:
        raise ProcessError("unknown_node", f"no node named {node!r}")
    proc = find_process(fleet.snapshot(node), pid)
    if proc is None:
        raise ProcessError("not_gpu_process", f"{node}: pid {pid} is not a GPU process there")
    why = service.not_mine(proc.user)
    if why is not None:
        raise ProcessError("not_yours", f"{node}: pid {pid} {why}")
    msg: JsonObject = {"type": "signal", "pid": pid, "signal": signal}
    if proc.started is not None:
        msg["started"] = proc.started
    reply = await _ask(fleet, node, msg, timeout, ProcessError)
    return wire.parse(SignalReply, reply) or {}
