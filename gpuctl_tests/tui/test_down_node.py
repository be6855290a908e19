"""Issue 26: a node that went down says in its header when it was last seen and when the fleet
tries it next, and the countdown moves on by itself (the fleet's own next try, not a guess)."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest

from gpuctl.core.model import NodeState
from gpuctl.fleet.fixed_links import FailingLink, ReplayLink, recorded_node
from gpuctl.fleet.fleet import Fleet
from gpuctl.fleet.links import NodeLink
from gpuctl.fleet.session import AgentSession, LinkError
from gpuctl.tui import make_app
from gpuctl_tests.tui.conftest import T0, T_LAST
from gpuctl_tests.tui.test_panes import until

LATER = T_LAST + 125.0  # the frozen "now": the node's last sample was 2 minutes ago


class GoneAfterOneSession(NodeLink):
    """A node that streamed its recording once, then refuses every connection."""

    kind = "ssh"

    def __init__(self) -> None:
        self.first = ReplayLink(recorded_node("gpu-d04", "2:H100", seed=5, t0=T0, samples=40))
        self.opened = 0

    async def open(self) -> AgentSession:
        self.opened += 1
        if self.opened == 1:
            session = await self.first.open()
            await session.close()  # the recording ends: the link closes after it
            return session
        raise LinkError("refused", "connection refused by 10.0.0.14:22")


def header_text(app: object, node: str) -> str:
    nodes = app.overview.nodes  # type: ignore[attr-defined]
    y = next(i for i, ln in enumerate(nodes.lines) if ln.node == node and ln.kind == "head")
    nodes.scroll_to(y=y, animate=False, immediate=True)
    return "".join(s.text for s in nodes.render_line(y - int(nodes.scroll_offset.y)))


async def down_waiting_to_retry(pilot: Any, app: Any, fleet: Any, node: str) -> float:
    """Wait until ``node`` is down on the screen with its retry planned; return when it is."""
    await until(
        pilot,
        lambda: (
            app.store.snaps[node].state is NodeState.UNREACHABLE
            and fleet.retry_at(node) is not None
            and not app.store.pending
        ),
        f"{node} down, waiting to retry",
    )
    at = fleet.retry_at(node)
    assert at is not None
    return float(at)


async def test_a_down_nodes_header_says_when_last_seen_and_when_the_next_try_is(
    tmp_path: Path,
) -> None:
    now = [LATER]
    link = GoneAfterOneSession()
    # backoff long enough that no retry comes while the test reads the screen
    fleet = Fleet(
        {"gpu-d04": link},
        clock=lambda: now[0],
        backoff_base=30.0,
        backoff_max=60.0,
        rng=random.Random(1),
    )
    app = make_app(fleet, clock=lambda: now[0], state_dir=tmp_path / "state")
    async with app.run_test(size=(160, 30)) as pilot:
        at = await down_waiting_to_retry(pilot, app, fleet, "gpu-d04")
        left = math.ceil(at - now[0])
        assert 15 <= left <= 30  # 30 s x jitter 0.5..1
        await pilot.pause()
        text = header_text(app, "gpu-d04")
        assert (
            f"✖ unreachable · retry in {left}s · last seen 2m ago · closed: agent link closed"
            in text
        ), text
        # a second later (the app's once-a-second tick) the countdown has moved on
        now[0] += 1.0
        await until(
            pilot,
            lambda: f"retry in {left - 1}s" in header_text(app, "gpu-d04"),
            "the countdown to tick",
        )
        # the compact view says the same on the node's one line
        await pilot.press("v")
        await until(pilot, lambda: app.overview.nodes.compact, "the compact view")
        await pilot.pause()
        text = node_line(app, "gpu-d04")
        assert "✖ down  unreachable · retry in" in text, text
        assert "last seen 2m ago · closed: agent link closed" in text, text


@pytest.mark.parametrize("width", [80, 120])
async def test_a_down_nodes_row_says_its_state_next_try_and_last_seen_before_the_reason(
    tmp_path: Path, width: int
) -> None:
    """Issue 39.4: an unreachable node's row led with its reason (an SSH error: long), and at
    80 and 120 columns the next try and when it was last seen were cut off at the edge.
    State, next try and last seen come first, in the header of the rows view and on the
    compact view's line; the long reason last, cut where the line ends."""
    now = [LATER]
    why = "permission denied (publickey,gssapi-keyex) for gpuadmin@gpu-d04 via bastion-01"
    fleet = Fleet(
        {"gpu-d04": FailingLink("auth", why), "gpu-d05": FailingLink("auth", why)},
        clock=lambda: now[0],
        backoff_base=30.0,
        backoff_max=60.0,
        rng=random.Random(1),
    )
    app = make_app(fleet, clock=lambda: now[0], state_dir=tmp_path / "state")
    async with app.run_test(size=(width, 24)) as pilot:
        at = await down_waiting_to_retry(pilot, app, fleet, "gpu-d04")
        left = math.ceil(at - now[0])
        await pilot.pause()
        first = f"unreachable · retry in {left}s · never seen"
        assert app.overview.nodes.compact is False  # two nodes: a row per GPU
        header = header_text(app, "gpu-d04")
        assert f"{first} · auth: permission denied" in header[:width], (header, width)
        await pilot.press("v")
        await until(pilot, lambda: app.overview.nodes.compact, "the compact view")
        await pilot.pause()
        line = node_line(app, "gpu-d04")
        assert first in line[:width], (line, width)


def node_line(app: object, node: str) -> str:
    nodes = app.overview.nodes  # type: ignore[attr-defined]
    y = next(i for i, ln in enumerate(nodes.lines) if ln.node == node and ln.kind == "node")
    return "".join(s.text for s in nodes.render_line(y - int(nodes.scroll_offset.y)))
