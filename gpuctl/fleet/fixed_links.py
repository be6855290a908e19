"""Deterministic links for UI tests and screenshots: a node that replays fixed protocol lines.

``ReplayLink`` hands the fleet a session whose stream holds a hello and a fixed list of messages,
then stays open and silent, so the node shows exactly those samples with no clock or thread
involved. ``recorded_node`` makes such a list from the simulated reader with a stepped clock: the
same numbers on every run. ``FailingLink`` is a node that cannot be reached, with its reason.
"""

from __future__ import annotations

from gpuctl.core.wire import JsonObject
from gpuctl.fleet.links import STREAM_LIMIT, NodeLink
from gpuctl.fleet.session import AgentSession, LineFeed, LinkError
from gpuctl.node import protocol

# Who a recorded node's burners run as (uid, user): a service account of the recorded cluster,
# not whoever replays it, so a replay looks the same on every machine.
RECORDED_BURNER = (1900, "gpuctl")


class _Discard:
    """The request side of a replayed node: requests go nowhere (and time out)."""

    def write(self, data: bytes | str) -> None:
        pass


class ReplayLink(NodeLink):
    """A node whose agent said ``messages`` (a hello first) and then nothing more."""

    def __init__(self, messages: list[JsonObject], kind: str = "simulated") -> None:
        self.messages = messages
        self.kind = kind

    async def open(self) -> AgentSession:
        reader = LineFeed(limit=STREAM_LIMIT)
        for msg in self.messages:
            reader.feed_data(protocol.encode(msg))

        async def close() -> None:
            reader.feed_eof()

        return AgentSession(reader, _Discard(), close=close)


class FailingLink(NodeLink):
    """A node that never answers: every ``open()`` raises LinkError(reason, message)."""

    def __init__(self, reason: str, message: str, kind: str = "ssh") -> None:
        self.reason = reason
        self.message = message
        self.kind = kind

    async def open(self) -> AgentSession:
        raise LinkError(self.reason, self.message)


def recorded_node(
    hostname: str,
    spec: str,
    *,
    seed: int = 0,
    t0: float = 1_700_000_000.0,
    samples: int = 30,
    interval: float = 1.0,
    load: dict[int, float] | None = None,
    events: list[JsonObject] | None = None,
) -> list[JsonObject]:
    """Hello plus ``samples`` samples of simulated GPUs at ``t0 + k * interval``, then events.

    ``load`` sets GPUs' burn load (index -> 0..1) from the start. Raises ValueError for a bad
    spec.
    """
    from gpuctl.node.readers.sim import SimReader

    now = [0.0]
    reader = SimReader.from_spec(spec, seed=seed, clock=lambda: now[0])
    reader.wall = lambda: t0 + now[0]  # processes' start times follow the replayed clock
    reader.burner = RECORDED_BURNER  # not the user replaying it: the same on every machine
    for index, value in (load or {}).items():
        reader.simulate("load", {"gpus": [index], "load": value})
    versions = reader.versions()
    statics = reader.static()
    out: list[JsonObject] = [  # as the agent writes them: the node's writers
        dict(
            protocol.hello_message(
                hostname=hostname,
                pid=4242,
                python="3.11.7",
                interval=interval,
                reader=reader.name,
                reader_error=None,
                bindings=None,
                versions=versions,
                features=["ping", "simulate", "snapshot"],
                gpus=statics,
            )
        )
    ]
    for k in range(samples):
        now[0] = k * interval
        gpus = reader.sample(slow=k % protocol.SLOW_EVERY == 0)
        msg = protocol.sample_message(
            k, gpus, statics, reader.parents(), reader.host(), t=t0 + k * interval
        )
        out.append(dict(msg))
    out.extend(events or [])
    return out
