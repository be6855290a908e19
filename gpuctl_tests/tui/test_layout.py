"""The whole terminal (issue 26 §3): node headers whose driver and CUDA show at 120 columns,
rows that grow on a wide terminal, and a narrow one that drops the repeated model first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Label

from gpuctl.fleet.fixed_links import ReplayLink, recorded_node
from gpuctl.fleet.fleet import Fleet
from gpuctl.fleet.links import NodeLink
from gpuctl.tui import GpuctlApp, make_app
from gpuctl.tui.view import BAR_FULL, TAG_W, model_tags, models_text
from gpuctl.tui.widgets.heatmap import HeatLegend
from gpuctl.tui.widgets.overview import GpuColumns
from gpuctl_tests.helpers import until
from gpuctl_tests.tui.conftest import NOW, SAMPLES, T0, T_LAST, replay_app, rows_view, settle
from gpuctl_tests.tui.test_usability import all_shown, many_nodes, row_text


def head_text(app: object, node: str) -> str:
    """A node's header as painted: one line, or two joined."""
    nodes = app.overview.nodes  # type: ignore[attr-defined]
    ys = [i for i, ln in enumerate(nodes.lines) if ln.node == node and ln.kind.startswith("head")]
    nodes.scroll_to(y=ys[0], animate=False, immediate=True)
    top = int(nodes.scroll_offset.y)
    return "\n".join(nodes.render_line(y - top).text.rstrip() for y in ys)


@pytest.mark.parametrize("size", [(80, 24), (120, 40), (200, 60)])
async def test_every_header_shows_driver_and_cuda(tmp_path: Path, size: tuple[int, int]) -> None:
    """At 120 columns one header line was cut before the driver on every node."""
    app = replay_app(tmp_path)
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        await rows_view(pilot)
        for node in ("gpu-a01", "gpu-b02"):
            head = head_text(app, node)
            assert "driver 550.54.15" in head and "CUDA 12.4" in head, head
            assert "4× H100 80GB HBM3" in head or "2× A100" in head, head  # the model, once
            if size[0] >= 120:  # the host's load shows whole too
                assert "net ↓" in head and "↑" in head.split("net ↓")[1], head
        assert len(head_text(app, "gpu-a01").splitlines()) == (1 if size[0] >= 190 else 2)
        assert len(head_text(app, "gpu-c03").splitlines()) == 1  # nothing to say on a second


async def test_a_wide_terminal_grows_the_bars_and_the_headers_unfold(tmp_path: Path) -> None:
    """At 200 columns the bars stayed 8 cells wide and ~45% of the screen was empty."""
    app = replay_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        narrow = row_text(app, "gpu-a01", 2)  # 100% busy: its utilization bar is full
        assert narrow.split("100%")[0].count(BAR_FULL) == 8
        await pilot.resize_terminal(200, 60)
        await pilot.pause()
        wide = row_text(app, "gpu-a01", 2)
        assert wide.split("100%")[0].count(BAR_FULL) >= 16, wide
        assert len(wide.rstrip()) > 0.75 * 200, wide
        assert len(head_text(app, "gpu-a01").splitlines()) == 1
        titles = str(app.overview.query_one(GpuColumns).render())
        assert titles.index("MEMORY") - titles.index("UTIL") >= 16 + 7, titles
        await pilot.resize_terminal(120, 40)
        await pilot.pause()
        assert len(head_text(app, "gpu-a01").splitlines()) == 2


async def test_80_columns_drop_the_repeated_model_before_the_user(tmp_path: Path) -> None:
    app = replay_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await rows_view(pilot)
        row = row_text(app, "gpu-a01", 0)
        assert "H100" not in row and "job 48213 alice" in row, row
        titles = str(app.overview.query_one(GpuColumns).render())
        assert "MODEL" not in titles and "UTIL" in titles
        assert "H100" in head_text(app, "gpu-a01")


def mixed_app(tmp_path: Path, mixed: bool = True) -> GpuctlApp:
    """A node of H100s and RTX 4090s (or, ``mixed`` False, of H100s only) beside an A100 node."""
    spec = "2:H100,2:4090" if mixed else "4:H100"
    links: dict[str, NodeLink] = {
        "gpu-m04": ReplayLink(recorded_node("gpu-m04", spec, seed=5, t0=T0, samples=SAMPLES)),
        "gpu-b02": ReplayLink(recorded_node("gpu-b02", "2:A100", seed=4, t0=T0, samples=SAMPLES)),
    }
    return make_app(Fleet(links, clock=lambda: NOW), clock=lambda: NOW, state_dir=tmp_path)


async def shown(pilot: Pilot[Any]) -> None:
    app = pilot.app
    assert isinstance(app, GpuctlApp)
    await until(
        pilot,
        lambda: (
            all(s.last_sample_t == T_LAST for s in app.store.snaps.values())
            and not app.store.pending
            and not app._flush_scheduled
            and sum(ln.kind == "gpu" for ln in app.overview.nodes.lines) == 6
        ),
        "both nodes' last samples on screen",
    )


@pytest.mark.parametrize("width", [80, 100])
async def test_a_node_of_several_models_tags_each_gpu_when_the_model_column_is_gone(
    tmp_path: Path, width: int
) -> None:
    """Below 110 columns a node's model is in its header only; a node of several models said
    "4 GPUs" and its rows looked alike (issue 26). Its rows now carry a short tag under a MODEL
    title, and its header counts the models."""
    app = mixed_app(tmp_path)
    async with app.run_test(size=(width, 30)) as pilot:
        await shown(pilot)
        header = app.overview.query_one(GpuColumns)
        titles = str(header.render())
        assert titles.startswith("   # MODEL  "), titles
        assert len(titles) <= header.size.width and titles.endswith("OWNERS"), titles  # not cut
        rows = [row_text(app, "gpu-m04", i) for i in range(4)]
        assert [r[5:11] for r in rows] == ["H100  ", "H100  ", "4090  ", "4090  "], rows
        a100 = row_text(app, "gpu-b02", 0)
        assert a100[5:11] == "A100  ", a100  # every node tagged alike, under the same title
        util = titles.index("UTIL")  # the figures stay under their titles
        assert all(r[util : util + 5].strip().endswith("%") for r in rows) or width >= 90, rows
        assert "  2× H100 · 2× 4090  util" in head_text(app, "gpu-m04")
        assert "2× A100" in head_text(app, "gpu-b02")
        await pilot.resize_terminal(120, 30)  # wide: the same tags (issue 39.3: the full model
        await pilot.pause()  # on every row took 16 cells the flags and owner needed)
        assert row_text(app, "gpu-m04", 2)[5:11] == "4090  "
        assert str(app.overview.query_one(GpuColumns).render()).startswith("   # MODEL  UTIL")


async def test_a_fleet_of_one_model_per_node_has_no_tag_at_80_columns(tmp_path: Path) -> None:
    app = mixed_app(tmp_path, mixed=False)
    async with app.run_test(size=(80, 30)) as pilot:
        await shown(pilot)
        titles = str(app.overview.query_one(GpuColumns).render())
        assert "MODEL" not in titles and titles.startswith("   #  UTIL")
        assert "H100" not in row_text(app, "gpu-m04", 0)


def test_model_tags_tell_a_nodes_models_apart() -> None:
    assert model_tags({0: "NVIDIA H100 80GB HBM3", 1: "NVIDIA H100 80GB HBM3"}) == {
        0: "H100",
        1: "H100",
    }
    assert model_tags({0: "NVIDIA H100 80GB HBM3", 1: "NVIDIA GeForce RTX 4090"}) == {
        0: "H100",
        1: "4090",
    }
    # one word in common: each takes a word the other lacks, a figure first
    assert model_tags({0: "NVIDIA A100-SXM4-80GB", 1: "NVIDIA A100-SXM4-40GB"}) == {
        0: "80GB",
        1: "40GB",
    }
    assert model_tags({0: "NVIDIA H100", 1: "NVIDIA H100 PCIe", 2: None}) == {
        0: "H100",
        1: "PCIe",
        2: "?",
    }
    assert model_tags({0: "NVIDIA RTX A6000", 1: "Tesla V100-SXM2-32GB"}) == {0: "A6000", 1: "V100"}
    assert len(model_tags({0: "x" * 40, 1: "y" * 40})[0]) == TAG_W
    assert (
        models_text({0: "NVIDIA H100", 1: "NVIDIA L40S", 2: "NVIDIA H100"}) == "2× H100 · 1× L40S"
    )


async def test_80_columns_keep_the_units_fit_the_legend_and_start_compact(
    tmp_path: Path,
) -> None:
    """Issue 39.9: at 80 columns the header's figures were cut (``power 10.0``), the heatmap's
    legend lost its marks past ECC, and a row per GPU showed one and a half nodes. The figures
    are said shorter, their units kept; the legend takes two lines; more than two nodes start
    in the compact view (``v`` goes back to a row per GPU)."""
    app = replay_app(tmp_path)  # three nodes
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.pause()
        assert app.overview.nodes.compact
        label = app.overview.query_one("#totals", Label)
        totals = str(label.content)
        assert len(totals) <= label.size.width, (totals, label.size)
        assert "live" in totals and "GPUs" in totals and "%" in totals, totals
        assert totals.endswith((" W", " kW")), totals
        await pilot.press("m")
        await pilot.pause()
        legend = app.overview.query_one(HeatLegend)
        lines = legend.render().plain.splitlines()
        assert legend.size.height == len(lines) == 2, lines
        assert all(len(line) <= 80 for line in lines), lines
        for word in ("no data", "lost", "XID", "burning", "slowdown", "power cap", "no reading"):
            assert word in " ".join(lines), (word, lines)
        await pilot.press("escape", "v")
        assert not app.overview.nodes.compact
    wide = replay_app(tmp_path / "wide")
    async with wide.run_test(size=(200, 60)) as pilot:
        await settle(pilot)
        assert not wide.overview.nodes.compact  # room for a row per GPU
        assert str(wide.overview.query_one("#totals", Label).content).startswith("nodes 1/3 live")
        await pilot.press("m")
        await pilot.pause()
        assert wide.overview.query_one(HeatLegend).size.height == 1
    two = make_app(many_nodes(2), clock=lambda: NOW, state_dir=tmp_path / "two")
    async with two.run_test(size=(80, 24)) as pilot:
        await all_shown(pilot, 2)
        assert not two.overview.nodes.compact  # two nodes fit well enough
