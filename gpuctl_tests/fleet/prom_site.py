"""The sites the Prometheus source's tests read (``test_prom*.py``): three nodes of two GPUs
behind stand-in DCGM exporters, scraped by a real Prometheus of their own; the fixtures are
given to every test of the folder by ``conftest.py``."""

from __future__ import annotations

import copy
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpuctl.config import parse_config
from gpuctl.fleet.build import fleet_from_config
from gpuctl.fleet.fleet import Fleet
from gpuctl_tests.cli.test_status_nodes import gpuctl as run_gpuctl
from gpuctl_tests.harness.prometheus import (
    Prometheus,
    StandInExporter,
    StartedStores,
    Store,
)
from gpuctl_tests.helpers import node_env

NODES = ("node-a", "node-b", "node-c")


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"


@dataclass
class Site:
    prom: Prometheus
    exporters: dict[str, StandInExporter]


@pytest.fixture(scope="module")
def stores() -> Iterator[StartedStores]:
    stores = StartedStores()
    with stores.stack:
        yield stores


@pytest.fixture
def store(stores: StartedStores) -> Iterator[Store]:
    """A Prometheus of the test's own (``StartedStores``): the test serves its held ports."""
    with stores.take() as got:
        yield got


def three_nodes(stores: StartedStores) -> Iterator[Site]:
    """Three nodes of two GPUs each behind their own stand-in exporter, scraped every second
    by a Prometheus of their own; ready once every series has three samples (the scrape period
    can be read)."""
    with stores.take() as (prom, socks):
        exporters = {n: StandInExporter(n, sock=s) for n, s in zip(NODES, socks, strict=True)}
        try:
            prom.wait_for("count_over_time(DCGM_FI_DEV_GPU_UTIL[1m]) >= 3", 2 * len(NODES))
            yield Site(prom, exporters)
        finally:
            for e in exporters.values():
                e.close()


@pytest.fixture
def site(stores: StartedStores) -> Iterator[Site]:
    """``three_nodes``, the test's own: it may change what the exporters serve."""
    yield from three_nodes(stores)


@pytest.fixture(scope="module")
def _steady(stores: StartedStores) -> Iterator[Site]:
    yield from three_nodes(stores)


def _served(site: Site) -> object:
    return {
        name: (copy.deepcopy((e.gpus, e.jobs, e.mig)), e.serving, e.clock)
        for name, e in site.exporters.items()
    }


@pytest.fixture
def steady_site(_steady: Site) -> Iterator[Site]:
    """``three_nodes`` shared by the module's tests that only read them: a Prometheus takes some
    8 s to start and scrape three times (5 s of it before the first scrape: its discovery
    manager sends target updates every 5 s, a fixed period), once instead of once a test. A
    test that changes an exporter takes ``site``; this one checks that none was changed."""
    before = _served(_steady)
    yield _steady
    assert _served(_steady) == before, "this test changes an exporter: give it `site`"


def site_fleet(url: str, extra: str = "", **kw: Any) -> Fleet:
    config = parse_config(f'[clusters.site]\nprometheus = "{url}"\n{extra}')
    return fleet_from_config(config, interval=0.5, **kw)


def gpuctl(*args: str) -> subprocess.CompletedProcess[str]:
    return run_gpuctl(*args, env=node_env())
