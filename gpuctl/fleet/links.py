"""Ways to start an agent on a node and get an ``AgentSession`` to it.

A link knows how to reach one node; ``open()`` starts the agent there and returns the session
before the handshake. ``LocalLink`` runs it as a subprocess of this machine; ``ThreadSimLink``
runs the real agent loop in a thread over OS pipes with simulated GPUs (demo and UI tests: a
thousand GPUs without a thousand processes). SSH and srun links live in their own modules.
"""

from __future__ import annotations

import asyncio
import functools
import os
import sys
import threading
from typing import TYPE_CHECKING, Any

from gpuctl.core.deadline import wait_for
from gpuctl.fleet.session import (
    AgentSession,
    LineFeed,
    LineFeedProtocol,
    LinkError,
    keep_stderr,
    start_piped,
    stderr_ended,
)
from gpuctl.node import protocol

if TYPE_CHECKING:
    from gpuctl.config import NodeConfig
    from gpuctl.core.model import GpuSample

_PKG_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STREAM_LIMIT = 4 * protocol.MAX_LINE  # a sample of many GPUs can exceed asyncio's 64 KiB default


class NodeLink:
    """How to reach one node. Subclasses set ``kind`` and implement ``open()``."""

    kind = "?"
    # The agent starts with ``--read-only`` (it refuses stress and acceptance requests):
    # ``gpuctl.service`` refuses on this side first for a fleet with such a link.
    read_only = False
    # Each open session holds a process's pipes or a connection (``fd_room`` counts them); a
    # replayed node holds none.
    holds_files = True
    # The node's entry of the config (its ``workload_python`` runs the burns): a link built from
    # one (SSH, srun, and a Prometheus node's agent) sets it; None for the others (a local or
    # simulated agent, a replayed node).
    node: NodeConfig | None = None

    async def open(self) -> AgentSession:
        """Start the agent and return its session (handshake not yet done).

        Raises LinkError with a reason token and a one-line message.
        """
        raise NotImplementedError

    def describe(self) -> str:
        """A short human description: where this link goes."""
        return self.kind

    @property
    def read_only_why(self) -> str | None:
        """Why no action can go through this link whatever the mode (a node seen through
        Prometheus has no agent), in words; None when it can act."""
        return None

    async def history(self, end: float) -> list[GpuSample] | None:
        """The node's GPUs as a store behind the link kept them before ``end``, oldest first
        (``Fleet.backfill``), or None when no store keeps any (every link but a node seen
        through Prometheus: ``gpuctl.fleet.prom.PromLink``)."""
        return None

    def forget_deploy(self) -> None:
        """The agent spoke another protocol version: deploy it afresh on the next ``open()``."""

    async def aclose(self) -> None:
        """Release what the link holds between sessions (an SSH connection); the fleet calls
        this when it stops."""


class LocalLink(NodeLink):
    """The agent as a child process on this machine (``python -m gpuctl.node agent``)."""

    kind = "local"

    def __init__(
        self,
        *,
        python: str | None = None,
        interval: float = 1.0,
        simulate: str | None = None,
        seed: int = 0,
        extra_args: tuple[str, ...] = (),
        read_only: bool = False,
    ) -> None:
        self.python = python or sys.executable
        self.read_only = read_only
        self.interval = interval
        self.simulate = simulate
        self.seed = seed
        self.extra_args = extra_args
        if simulate:
            self.kind = "simulated"

    def argv(self) -> list[str]:
        argv = [self.python, "-m", "gpuctl.node", "agent", "--interval", str(self.interval)]
        if self.simulate:
            argv += ["--simulate", self.simulate, "--seed", str(self.seed)]
        if self.read_only:
            argv.append("--read-only")
        return argv + list(self.extra_args)

    async def open(self) -> AgentSession:
        env = dict(os.environ)
        # The child must import the same gpuctl as this process, installed or not.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PKG_ROOT, env.get("PYTHONPATH")) if p)
        try:  # its lines handed on from the pipes' callbacks, as srun's are
            piped = await start_piped(self.argv(), env, limit=STREAM_LIMIT)
        except FileNotFoundError:
            raise LinkError("no_python", f"python not found: {self.python}") from None
        proc = piped.proc
        assert proc.stdin is not None

        async def close() -> None:
            if proc.stdin is not None and not proc.stdin.is_closing():
                proc.stdin.close()
            try:
                await wait_for(proc.wait(), 3.0)
            except TimeoutError:
                proc.kill()
                await proc.wait()

        session = AgentSession(piped.out, proc.stdin, close=close)
        piped.err.push_to(functools.partial(keep_stderr, session.stderr_tail), stderr_ended)
        return session

    def describe(self) -> str:
        return "simulated" if self.simulate else "local"


class _PipeWriter:
    """Blocking writes to a pipe fd; requests are tiny, so this never stalls the loop."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def write(self, data: Any) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]


class ThreadSimLink(NodeLink):
    """The real agent loop with simulated GPUs, in a thread of this process, over OS pipes."""

    kind = "simulated"

    def __init__(
        self, spec: str, *, seed: int = 0, interval: float = 1.0, read_only: bool = False
    ) -> None:
        from gpuctl.node.readers.sim import parse_spec

        parse_spec(spec)  # raises ValueError early for a bad spec
        self.read_only = read_only
        self.spec = spec
        self.seed = seed
        self.interval = interval

    async def open(self) -> AgentSession:
        from gpuctl.node.agent import Agent, install_plugins
        from gpuctl.node.readers.sim import SimReader

        req_r, req_w = os.pipe()
        out_r, out_w = os.pipe()
        agent = Agent(
            SimReader.from_spec(self.spec, seed=self.seed),
            None,
            interval=self.interval,
            in_fd=req_r,
            out=os.fdopen(out_w, "wb"),
            read_only=self.read_only,
            on_host=False,  # this process's machine is not the simulated node
        )
        install_plugins(agent)

        def run() -> None:
            try:
                agent.run()
            finally:
                agent.out.close()
                os.close(req_r)

        thread = threading.Thread(target=run, name=f"sim-agent-{self.seed}", daemon=True)
        thread.start()
        loop = asyncio.get_running_loop()
        reader = LineFeed(limit=STREAM_LIMIT)
        transport, _ = await loop.connect_read_pipe(
            lambda: LineFeedProtocol(reader), os.fdopen(out_r, "rb")
        )
        writer = _PipeWriter(req_w)
        closed = False

        async def close() -> None:
            nonlocal closed
            if closed:
                return
            closed = True
            os.close(req_w)  # EOF on the agent's stdin: it stops, as over a real link
            await asyncio.to_thread(thread.join, 5.0)
            transport.close()

        return AgentSession(reader, writer, close=close)
