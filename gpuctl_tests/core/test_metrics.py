"""The metric registry (``gpuctl/node/metrics.py``) is the one definition of a GPU reading: the
wire's fields, the decode's types and bounds, the readers' records and the login side's tables
are its views. These tests fail as soon as one of them drifts from it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import msgspec
import msgspec.inspect as mi
import pytest

from gpuctl import metrics_table
from gpuctl.core.model import GpuSample
from gpuctl.fleet.session import decode_line
from gpuctl.node import metrics
from gpuctl.node.metrics import METRICS, SAMPLE_FIELDS
from gpuctl.node.readers.sim import SimReader

KINDS = {"int": mi.IntType, "float": mi.FloatType, "str": mi.StrType}
WIDE = {"int": (-(2**63), 2**63 - 1), "float": (-sys.float_info.max, sys.float_info.max)}


def test_gpu_sample_fields_are_the_wire_fields_in_order() -> None:
    fields = [f for f in GpuSample.__struct_fields__ if f != "t"]
    assert fields == list(SAMPLE_FIELDS)


@pytest.mark.parametrize("m", METRICS, ids=[m.key for m in METRICS])
def test_each_readings_type_and_bounds_are_the_registrys(m: metrics.Metric) -> None:
    (field,) = [f for f in mi.type_info(GpuSample).fields if f.name == m.key]
    assert isinstance(field.type, mi.UnionType) and field.default is None  # null: unknown
    (value_type,) = [t for t in field.type.types if not isinstance(t, mi.NoneType)]
    assert isinstance(value_type, KINDS[m.kind])
    if m.kind != "str":
        lo, hi = WIDE[m.kind] if m.lo is None else (m.lo, m.hi)
        assert (value_type.ge, value_type.le) == (lo, hi)


def test_a_reading_out_of_its_bounds_is_null_and_hides_nothing_else() -> None:
    line = msgspec.json.encode(
        {
            "type": "sample",
            "t": 1.7e9,
            "gpus": [{"index": 0, "enc": 101, "dec": 3, "pcie_tx": -1, "pcie_rx": 2048}],
        }
    )
    (g,) = decode_line(line).gpus  # type: ignore[union-attr]
    assert (g.enc, g.dec, g.pcie_tx, g.pcie_rx) == (None, 3, None, 2048)


def test_registry_rows_are_consistent() -> None:
    keys = [m.key for m in METRICS]
    names = [m.name for m in METRICS]
    assert len(set(keys)) == len(keys) and len(set(names)) == len(names)
    for m in METRICS:
        assert m.what and m.title and m.nvml, m.key
        assert m.history in (None, "B", "H", "f"), m.key
        if m.history in ("B", "H"):  # a whole-number column holds the reading as shown
            assert m.kind == "int" and m.scale == 1.0, m.key
        if {"sort", "heatmap"} & m.flags:
            assert m.kind != "str", m.key
    dcgm = [m.dcgm for m in METRICS if m.dcgm]
    assert len(set(dcgm)) == len(dcgm)


def test_the_simulated_reader_gives_every_reading() -> None:
    """The demo shows every column: each reading is a number (or P-state text) on some GPU."""
    gpus = SimReader.from_spec("6:H100,2:4090", seed=1).sample()
    for m in METRICS:
        assert any(g[m.key] is not None for g in gpus), m.key


def test_the_simulated_pcie_traffic_follows_the_work() -> None:
    """A training job's PCIe traffic comes in bursts of several GB/s, reaching past the
    lowest of the heat map's colours on the registry's 0-64 GB/s scale; a burn (its data stays
    on the GPU) and an idle GPU move next to nothing. It was a flat share of the link by
    utilization: a burn showed 12.7 GB/s in, an idle H100 126 MB/s, a job the same figure on
    every sample."""
    now = [0.0]
    reader = SimReader.from_spec("8:H100,8:A100", seed=3, clock=lambda: now[0])
    gpus = reader.gpus
    idle = [g.index for g in gpus if g.base_load == 0]
    busy = [g.index for g in gpus if g.base_load >= 0.7]
    burned = next(g.index for g in gpus if g.base_load >= 0.35 and g.index not in busy)
    assert idle and busy
    reader.simulate("load", {"gpus": [burned], "load": 1.0})
    rx: dict[int, list[float]] = {g.index: [] for g in gpus}
    tx: dict[int, list[float]] = {g.index: [] for g in gpus}
    for _ in range(120):
        now[0] += 1.0
        for rec in reader.sample():
            rx[rec["index"]].append(rec["pcie_rx"] / 1e9)
            tx[rec["index"]].append(rec["pcie_tx"] / 1e9)
    top = metrics.BY_KEY["pcie_rx"].heat[1]  # GB/s
    for i in busy:
        link = 63.0 if gpus[i].pcie_gen == 5 else 31.5
        assert max(rx[i]) >= 4 and max(tx[i]) >= 2, (i, max(rx[i]))  # bursts of GB/s
        assert min(rx[i]) < 1 and max(rx[i] + tx[i]) <= link, (i, rx[i])  # between bursts
        assert len({round(v, 1) for v in rx[i]}) > 20  # not one figure on every sample
    assert max(max(rx[i]) for i in busy) > top / 5  # past the heat map's lowest colour
    for i in idle:
        assert max(rx[i] + tx[i]) < 0.01, (i, max(rx[i] + tx[i]))
    assert max(rx[burned] + tx[burned]) < 0.05, rx[burned]


def test_fmt_prints_the_shown_unit() -> None:
    by = metrics.BY_KEY
    assert metrics.fmt(by["mem_used"], 12 * (1 << 30)) == "12.0G"
    assert metrics.fmt(by["pcie_rx"], 2_500_000_000) == "2.5GB/s"
    assert metrics.fmt(by["temp"], 45) == "45C"
    assert metrics.fmt(by["pstate"], "P0") == "P0"
    assert metrics.fmt(by["enc"], None) == "-"


def test_the_screens_tables_are_the_registrys_views() -> None:
    """The sorts, plots, filter words and heatmap are the metrics flagged for them."""
    from gpuctl.tui import view
    from gpuctl.tui.gpusort import SORTS
    from gpuctl.tui.screens.detail import PLOTS

    assert {column for _k, _t, column, _d in SORTS} - {"flags"} == {
        view.screen_word(m) for m in metrics.flagged("sort")
    }
    assert [name for _id, _title, series in PLOTS for name in series] == [
        m.name for m in metrics.flagged("plot")
    ]
    assert {m.name for m in metrics.flagged("filter")} <= view.FILTER_METRICS
    assert tuple(view.screen_word(m) for m in metrics.flagged("heatmap")) == view.METRICS


def test_filter_words_read_the_shown_unit() -> None:
    from gpuctl.core.model import NodeSnapshot, NodeState
    from gpuctl.tui.view import GpuFacts, parse_filter

    g = GpuSample(
        index=0, enc=40, dec=0, pcie_rx=3_000_000_000, mem_used=8 << 30, mem_total=32 << 30, fan=55
    )
    snap = NodeSnapshot(name="n", state=NodeState.LIVE, gpus=(g,))

    def hit(text: str) -> bool:
        return parse_filter(text).gpu_matches(snap, g, GpuFacts())

    assert hit("enc>30") and not hit("dec>0") and hit("pcie_rx>2.5") and not hit("pcie_rx>3.5")
    assert hit("mem=25") and hit("mem_gib=8") and hit("fan>=55")
    assert not hit("pcie_tx>0")  # unknown: no match


METRICS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def test_the_docs_metrics_table_is_the_one_the_registry_makes(tmp_path: Path) -> None:
    page = METRICS_PAGE.read_text(encoding="utf-8")
    assert metrics_table.with_table(page) == page, (
        "docs/metrics.md's GPU metrics table differs from the registry's: run "
        "`python -m gpuctl.metrics_table --write docs/metrics.md`"
    )
    for m in METRICS:
        assert f"| `{m.key}` | {m.what} |" in page
    start, end = metrics_table.TABLE_START, metrics_table.TABLE_END
    doc = tmp_path / "doc.md"
    doc.write_text(f"before\n{start}\nstale\n{end}\nafter\n")
    cmd = [sys.executable, "-m", "gpuctl.metrics_table"]
    r = subprocess.run([*cmd, "--write", str(doc)], capture_output=True, text=True, check=True)
    assert r.stderr == "" and "stale" not in doc.read_text()
    assert doc.read_text() == f"before\n{start}\n{metrics_table.markdown_table()}{end}\nafter\n"
    (tmp_path / "bare.md").write_text("no markers\n")
    r = subprocess.run([*cmd, "--write", str(tmp_path / "bare.md")], capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and "markers" in r.stderr
