"""A hostile node for the TUI tests: a stand-in agent speaking the real protocol whose every
string is markup, terminal escapes, control bytes or far too long, and whose numbers are huge.

``ScriptedAgentLink`` hands the fleet an ``AgentSession`` over a stream that holds the agent's
lines (encoded by ``gpuctl.node.protocol``, or raw bytes for what the encoder refuses, such as
NaN) and answers requests the way the agent's plugins do (stress, acceptance), so the fleet,
``gpuctl.fleet.control`` and ``gpuctl.accept.run`` all run as they do against a real node.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuctl.fleet.fixed_links import FailingLink
from gpuctl.fleet.fleet import Fleet
from gpuctl.fleet.links import STREAM_LIMIT, NodeLink
from gpuctl.fleet.session import AgentSession
from gpuctl.node import protocol
from gpuctl.workloads.accept_suite.schema import SCHEMA, SCHEMA_VERSION, SECTIONS

# Markup that Textual and Rich refuse or act on, terminal escapes (window title, clear screen),
# NUL, 8-bit CSI, NEL, DEL, a tab and a newline.
H = (
    "[bold]x[/ [link=file:///etc/passwd]y[/link] x[/b] a[/] "
    "\x1b]0;pwn\x07\x1b[2J\x00\x9b2J\x85\x7f\ttab\nnl"
)
SEEN = "[bold]x[/"  # what the screen must show of H, literally
LONG = H + "L" * 20_000
HUGE = 10**400  # valid JSON, beyond any float
AFTER_REPLY_S = 0.05  # the stand-in agent's suite "runs" this long
HOSTILE_BYTES = "".join(chr(c) for c in (*range(0x20), 0x7F, *range(0x80, 0xA0)))


def hostile_messages(now: float) -> list[dict[str, Any] | bytes]:
    """Hello, three samples and events, every field hostile; ``now`` is the fleet's clock."""
    hello = {
        "type": "hello",
        "protocol": protocol.PROTOCOL_VERSION,
        "agent": H,
        "hostname": LONG,
        "pid": HUGE,
        "python": H,
        "interval": 1.0,
        "reader": "nvml",
        "reader_error": H,
        "driver": H,
        "cuda": H,
        "nvml": H,
        "features": [H, "ping", "stress_start", "accept_start"],
        "gpus": [
            {
                "index": 0,
                "uuid": H,
                "name": H,
                "mem_total": HUGE,
                "power_limit": 1e308,
                "max_sm_clock": HUGE,
                "pcie_gen": H,
                "pcie_width": HUGE,
                "serial": LONG,
            },
            {"index": 1, "name": LONG, "mem_total": 80 << 30},
        ],
    }
    out: list[dict[str, Any] | bytes] = [hello]
    for k in range(3):
        out.append(
            {
                "type": "sample",
                "t": now - 2.5 + k,
                "seq": k,
                # launchers in a cycle of parents, a host of junk
                "parents": [
                    {"pid": 5, "ppid": 6, "user": H, "command": LONG, "started": H},
                    {"pid": 6, "ppid": 5, "user": LONG, "command": H, "started": -1e308},
                ],
                "host": {
                    "cpu": HUGE,
                    "cpus": H,
                    "mem_total": HUGE,
                    "load": [H, 1e308],
                    "net_rx": 1e308,
                    "net_tx": -5,
                    "mem_available": 1 << 30,
                },
                "gpus": [
                    {
                        "index": 0,
                        "state": "ok",
                        "uuid": H,
                        "util_gpu": HUGE,
                        "mem_used": HUGE,
                        "mem_total": 1,
                        "temp": HUGE,
                        "power": 1e308,
                        "power_limit": 1e-308,
                        "sm_clock": -HUGE,
                        "mem_clock": HUGE,
                        "pstate": H,
                        "throttle": [H, "sw_thermal", LONG],
                        "ecc": {H: HUGE, "volatile_uncorrected": HUGE},
                        "remapped_rows": {"pending": H},
                        "processes": [
                            {"pid": HUGE, "user": H, "command": LONG, "mem": HUGE},
                            {
                                "pid": 7,
                                "user": LONG,
                                "command": H,
                                "mem": 1 << 30,
                                "ppid": 5,
                                "sm": H,
                                "cpu": 1e308,
                                "rss": HUGE,
                                "started": 1e308,
                                "uid": HUGE,
                            },
                        ],
                    },
                    {
                        "index": 1,
                        "state": H,
                        "util_gpu": 50,
                        "mem_used": 1 << 30,
                        "mem_total": 80 << 30,
                        "temp": 60,
                        "power": 1e308,
                        "power_limit": 700.0,
                        "processes": [{"pid": 8, "user": H, "command": H, "mem": None}],
                    },
                ],
            }
        )
    out += [
        {"type": "event", "t": now - 1, "kind": "xid", "gpu": 0, "detail": {"xid": H, H: LONG}},
        {"type": "event", "t": now - 1, "kind": H, "gpu": None, "detail": {H: H}},
        {"type": "event", "t": now - 1, "kind": "gpu_lost", "gpu": HUGE, "detail": {}},
        {
            "type": "event",
            "t": now - 1,
            "kind": "burn",
            "gpu": 0,
            "detail": {
                "state": "running",
                "engine": H,
                "tflops": 1e308,
                "errors": HUGE,
                "verdict": H,
                "reason": H,
                "message": LONG,
            },
        },
        {
            "type": "event",
            "t": now - 1,
            "kind": "burn",
            "gpu": 1,
            "detail": {"state": H, "tflops": H, "errors": H, "verdict": LONG, "reason": LONG},
        },
    ]
    return out


def hostile_report() -> dict[str, Any]:
    """A node acceptance report of the current schema, every string and number hostile."""
    sections: dict[str, Any] = {s: {"verdict": H, "summary": H, "seconds": HUGE} for s in SECTIONS}
    sections["compute"] = {
        "verdict": "FAIL",
        "summary": LONG,
        "seconds": 1e308,
        "devices": [
            {
                "label": H,
                "name": LONG,
                "results": [
                    {
                        "dtype": H,
                        "tflops": 1e308,
                        "peak_tflops": HUGE,
                        "fraction": 1e308,
                        "verdict": H,
                    },
                    {"dtype": "bf16", "tflops": HUGE, "fraction": HUGE, "verdict": "FAIL"},
                ],
            }
        ],
    }
    sections["membw"]["devices"] = [
        {"label": H, "gbps": HUGE, "peak_gbps": 1e308, "fraction": HUGE, "verdict": H}
    ]
    sections["pcie"]["devices"] = [{"label": H, "h2d_gbps": HUGE, "d2h_gbps": 1e308}]
    sections["train"]["devices"] = [
        {
            "label": H,
            "steps": H,
            "first_loss": 1e308,
            "final_loss": -HUGE,
            "drop": HUGE,
            "verdict": H,
        }
    ]
    sections["ddp_allreduce"].update(
        {"world_size": H, "nnodes": H, "algbw_gbps": 1e308, "busbw_gbps": HUGE}
    )
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "node": H,
        "hostname": LONG,
        "started": 0,
        "duration_s": HUGE,
        "device": H,
        "quick": True,
        "verdict": "FAIL",
        "failures": [H, LONG],
        "sections": sections,
    }


def hostile_answer(req: dict[str, Any]) -> list[dict[str, Any]]:
    """What the hostile agent says to a request: refusals in markup and escapes, and an
    acceptance run whose every line, verdict and report field is hostile."""
    rid = req.get("id")
    kind = req.get("type")
    if kind in ("stress_start", "stress_stop"):
        return [{"type": "error", "code": H, "message": LONG, "id": rid}]
    if kind == "accept_start":
        run = "r-1"

        def ev(**detail: Any) -> dict[str, Any]:
            return {
                "type": "event",
                "t": 0,
                "kind": "accept",
                "gpu": None,
                "detail": {"run": run, **detail},
            }

        return [
            {"type": "ok", "request": kind, "id": rid, "run": run, "pid": 1},
            ev(event="start"),
            ev(event="section", section="env", state="start"),
            ev(event="line", section="env", text=LONG),
            ev(event="line", section="env", text=H),
            ev(event="section", section="env", state="end", verdict=H, summary=LONG),
            ev(event="section", section=H, state=H, verdict=H),
            ev(event="exit", rc=1, report=hostile_report(), reason=H, stderr_tail=[H, LONG]),
        ]
    if kind == "shutdown":
        return [{"type": "bye"}]
    return [{"type": "error", "code": "unknown_request", "message": H, "id": rid}]


class ScriptedAgentLink(NodeLink):
    """A stand-in agent: says ``messages`` (dicts are encoded, bytes go as they are), then
    answers each request with ``answer(request)``: the first message at once, the others
    (a suite's progress) a moment later, as a real agent's child process would."""

    kind = "ssh"

    def __init__(
        self,
        messages: list[dict[str, Any] | bytes],
        answer: Callable[[dict[str, Any]], list[dict[str, Any]]] = hostile_answer,
        *,
        together: bool = False,
    ) -> None:
        self.messages = messages
        self.answer = answer
        self.together = together  # the reply and what follows it in one read, as a fast child
        self.requests: list[dict[str, Any]] = []

    async def open(self) -> AgentSession:
        reader = asyncio.StreamReader(limit=STREAM_LIMIT)
        for msg in self.messages:
            reader.feed_data(msg if isinstance(msg, bytes) else protocol.encode(msg))
        link = self

        class Writer:
            def write(self, data: Any) -> None:
                for line in bytes(data).splitlines():
                    req = json.loads(line)
                    link.requests.append(req)
                    reply, *later = link.answer(req)
                    if link.together:
                        reader.feed_data(b"".join(protocol.encode(m) for m in (reply, *later)))
                    else:
                        reader.feed_data(protocol.encode(reply))
                    if later and not link.together:  # a real agent's child speaks after it
                        data = b"".join(protocol.encode(m) for m in later)
                        asyncio.get_running_loop().call_later(AFTER_REPLY_S, reader.feed_data, data)

        async def close() -> None:
            reader.feed_eof()

        return AgentSession(reader, Writer(), close=close)


def hostile_fleet(now: float) -> Fleet:
    """``evil`` (a live hostile agent), ``down`` (its connection error is hostile) and ``nan``
    (a hello, then a sample whose temperature is NaN: read as unknown)."""
    nan_hello = {**hostile_messages(now)[0], "hostname": "nan"}
    links: dict[str, NodeLink] = {
        "evil": ScriptedAgentLink(hostile_messages(now)),
        "down": FailingLink("refused", LONG),
        "nan": ScriptedAgentLink(
            [nan_hello, b'{"type":"sample","t":1,"seq":0,"gpus":[{"index":0,"temp":NaN}]}\n']
        ),
    }
    return Fleet(links, clock=lambda: now, stale_after=3.0, backoff_base=60.0, backoff_max=60.0)


def hostile_job_store(folder: Path) -> Any:
    """A job store with one failed job whose name, target, summary, report and logs are
    hostile."""
    from gpuctl.jobs.store import JobRecord, JobStore

    store = JobStore(folder / "jobs.sqlite")
    jobdir = folder / "jobs" / "e1"
    jobdir.mkdir(parents=True)
    (jobdir / "stdout.txt").write_text(f"{H}\n{LONG}\n{HOSTILE_BYTES}\n")
    (jobdir / "stderr.txt").write_text(f"{H}\n")
    backend = {"kind": "local", "job_root": str(folder / "jobs"), "python": "python3"}
    store.add(JobRecord("e1", H, H, backend, str(jobdir), "submitted", 1000.0))
    store.update(
        "e1",
        state="failed",
        kind=H,
        summary=LONG,
        started_at=1001.0,
        ended_at=1002.0,
        report={
            "kind": H,
            "title": H,
            "phase": H,
            "evidence": [H, LONG, HOSTILE_BYTES],
            "traceback": "\n".join([H] * 3),
            "remedy": H,
            "logs": {H: LONG},
        },
    )
    return store


CRASH_MESSAGE = "history is broken [bold]on purpose[/ \x1b[2J"


class CrashingFleet(Fleet):
    """A fleet whose GPU history cannot be read: the GPU list's sparklines raise while the
    screen draws, as a bug in a widget would."""

    def history(self, name: str, gpu: int) -> list[Any]:
        raise RuntimeError(CRASH_MESSAGE)


def crashing_fleet() -> Fleet:
    """One replayed node with GPUs, in a ``CrashingFleet``: the screen crashes on its first
    paint of a GPU row."""
    import time

    from gpuctl.fleet.fixed_links import ReplayLink, recorded_node

    node = recorded_node("crash-01", "2:H100", samples=3, t0=time.time() - 3)
    return CrashingFleet({"crash-01": ReplayLink(node)})
