"""A node that leaves the fleet (``Fleet.remove_node``: a host the site's Prometheus stopped
holding, issue 29) leaves the screen: its rows, its share of the header's counts, a detail
screen open on it; the cursor moves to a neighbour, not back to the top; one notice says why.
The Prometheus side (when a host leaves) is tested with a real store in
``gpuctl_tests/fleet/test_prom.py``."""

from __future__ import annotations

from pathlib import Path

from textual.widgets import Label

from gpuctl.fleet.fixed_links import ReplayLink, recorded_node
from gpuctl.tui.screens.overview import OverviewScreen
from gpuctl_tests.helpers import open_detail, until
from gpuctl_tests.tui.conftest import SAMPLES, T0, replay_app, settle

WHY = "left the store (last sample 12m ago)"


def totals(app: object) -> str:
    return str(app.overview.query_one("#totals", Label).content)  # type: ignore[attr-defined]


def shown_nodes(app: object) -> list[str]:
    lines = app.overview.nodes.lines  # type: ignore[attr-defined]
    return list(dict.fromkeys(ln.node for ln in lines))


def notices(app: object) -> list[str]:
    return [n.message for n in app._notifications]  # type: ignore[attr-defined]


async def test_a_node_that_leaves_goes_from_the_list_header_and_selection(
    tmp_path: Path,
) -> None:
    app = replay_app(tmp_path)
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(pilot)
        assert shown_nodes(app) == ["gpu-a01", "gpu-b02", "gpu-c03"]
        assert "nodes 1/3 live" in totals(app) and "GPUs 6" in totals(app)
        assert app.store.trouble().get("xid") == 1  # gpu-a01's GPU 1
        app.overview.nodes.select("gpu-a01", 2)

        # The selected node leaves: its rows, GPUs and XID go; the cursor goes to the next node.
        app.fleet.remove_node("gpu-a01", WHY)
        await until(pilot, lambda: "gpu-a01" not in app.store.snaps, "gpu-a01 forgotten")
        await pilot.pause()
        assert shown_nodes(app) == ["gpu-b02", "gpu-c03"]
        assert app.store.order == ["gpu-b02", "gpu-c03"]
        assert app.overview.nodes.cursor == ("gpu-b02", 0)
        assert app.overview.selection() == ("gpu-b02", 0)
        assert "nodes 0/2 live" in totals(app) and "GPUs 2" in totals(app)
        assert app.store.trouble().get("xid", 0) == 0 and app.store.xids == set()
        assert f"gpu-a01 {WHY}" in notices(app)
        assert "gpu-a01" not in app.fleet.nodes

        # The last node shown leaves with the cursor on it: the cursor goes to the one before.
        app.overview.nodes.select("gpu-c03", None)
        app.fleet.remove_node("gpu-c03", WHY)
        await until(pilot, lambda: "gpu-c03" not in app.store.snaps, "gpu-c03 forgotten")
        await pilot.pause()
        assert shown_nodes(app) == ["gpu-b02"]
        assert app.overview.nodes.cursor == ("gpu-b02", 0)
        # nothing of it is kept by the list (a down node's painted state words, its tags)
        kept = app.overview.nodes
        assert not [d for d in (kept.painted, kept._down_shown, kept._tags) if "gpu-c03" in d]

        # It comes back (the store holds it again): a node again, at the end of the list.
        link = ReplayLink(recorded_node("gpu-a01", "4:H100", seed=3, t0=T0, samples=SAMPLES))
        app.fleet.add_node("gpu-a01", link)
        await until(
            pilot,
            lambda: (
                len(app.store.snaps.get("gpu-a01", ()) and app.store.snaps["gpu-a01"].gpus) == 4
            ),
            "gpu-a01 back with its GPUs",
        )
        await pilot.pause()
        assert shown_nodes(app) == ["gpu-b02", "gpu-a01"]
        assert "nodes 1/2 live" in totals(app)


async def test_a_detail_screen_on_a_node_that_leaves_closes(tmp_path: Path) -> None:
    app = replay_app(tmp_path)
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(pilot)
        assert (await open_detail(pilot, "gpu-b02", 0)).node == "gpu-b02"
        app.fleet.remove_node("gpu-b02", WHY)
        await until(pilot, lambda: isinstance(app.screen, OverviewScreen), "back on the overview")
        await pilot.pause()
        assert shown_nodes(app) == ["gpu-a01", "gpu-c03"]
        assert app.overview.nodes.cursor == ("gpu-c03", None)  # no GPUs: the node itself
        assert f"gpu-b02 {WHY}" in notices(app)


async def test_the_heatmap_cursor_moves_to_a_neighbour(tmp_path: Path) -> None:
    app = replay_app(tmp_path)
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(pilot)
        await pilot.press("m")
        heat = app.overview.heatmap
        await until(pilot, lambda: heat.names == ["gpu-a01", "gpu-b02", "gpu-c03"], "the map")
        heat.select("gpu-b02", 1)
        assert heat.selected() == ("gpu-b02", 1)
        app.fleet.remove_node("gpu-b02", WHY)
        await until(pilot, lambda: "gpu-b02" not in app.store.snaps, "gpu-b02 forgotten")
        await pilot.pause()
        assert heat.names == ["gpu-a01", "gpu-c03"]
        assert heat.selected() == ("gpu-c03", None)


async def test_many_nodes_leaving_at_once_are_one_notice(tmp_path: Path) -> None:
    app = replay_app(tmp_path)
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(pilot)
        for name in ("gpu-a01", "gpu-b02", "gpu-c03"):
            app.fleet.remove_node(name, WHY)
        await until(pilot, lambda: not app.store.snaps, "every node forgotten")
        await pilot.pause()
        assert shown_nodes(app) == []
        assert app.overview.nodes.cursor is None
        assert "nodes 0/0 live" in totals(app)
        (notice,) = [n for n in notices(app) if WHY in n]
        assert notice.count(WHY) == 3  # one notice, each node named
