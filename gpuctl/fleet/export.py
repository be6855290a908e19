"""The fleet as one Prometheus / OpenMetrics endpoint: ``gpuctl export``.

Its parts, one mechanism each: ``gpuctl.fleet.exportmetrics`` declares the metric families (names
after DCGM exporter's, in its units) and how each GPU gauge reads a sample; ``exporttext``
writes the exposition (``FleetExporter``: formatted per changed snapshot, gzipped when asked;
``XidCounts``); ``exporthttp`` serves it (``MetricsServer``: one thread's event loop, bounded
connections, stalled answers cut; ``Credential`` of ``--auth-file``). This module names the
endpoint's default address and gathers what the CLI, the tests and the benchmarks use.
"""

from __future__ import annotations

from gpuctl.fleet.exporthttp import (
    OPENMETRICS_TYPE,
    READ_TIMEOUT,
    TEXT_TYPE,
    AuthFileError,
    Credential,
    MetricsServer,
    local_uid,
    peer_of,
    wants_gzip,
    wants_openmetrics,
)
from gpuctl.fleet.exportmetrics import FAMILIES, METRICS, XID_MAX, XIDS_PER_GPU, GpuMetric
from gpuctl.fleet.exporttext import GZIP_LEVEL, FleetExporter, XidCounts

__all__ = [
    "DEFAULT_LISTEN",
    "FAMILIES",
    "GZIP_LEVEL",
    "METRICS",
    "OPENMETRICS_TYPE",
    "READ_TIMEOUT",
    "TEXT_TYPE",
    "XIDS_PER_GPU",
    "XID_MAX",
    "AuthFileError",
    "Credential",
    "FleetExporter",
    "GpuMetric",
    "MetricsServer",
    "XidCounts",
    "local_uid",
    "peer_of",
    "wants_gzip",
    "wants_openmetrics",
]

DEFAULT_LISTEN = "127.0.0.1:9400"  # DCGM exporter's port: the scrape config stays the same
