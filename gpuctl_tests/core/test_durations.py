"""gpuctl's one duration grammar (``protocol.parse_seconds``), as every option that takes a
duration reads it: record and replay (``--duration``, ``--from``), acceptance ``--burn``, ``jobs
purge --older-than``. Before, record's grammar took ``1h30m`` and the others refused it, and
theirs took ``7d``, which record refused."""

from __future__ import annotations

import argparse

import pytest

from gpuctl.cli.jobs import parse_age
from gpuctl.cli.main import UserError
from gpuctl.cli.record import _duration
from gpuctl.fleet.recording.times import parse_duration
from gpuctl.node.protocol import MAX_DURATION_CEILING, parse_seconds
from gpuctl.workloads.accept_suite.sections import burn

SAME = {
    "90": 90.0,
    "2.5": 2.5,
    "90s": 90.0,
    "10m": 600.0,
    "1.5h": 5400.0,
    "7d": 7 * 86400.0,
    "2w": 14 * 86400.0,
    "1h30m": 5400.0,
    "1d12h": 1.5 * 86400.0,
    "1h2m3s": 3723.0,
    " 10M ": 600.0,
}
NOT_ONE = ["", "x", "-5", "inf", "nan", "h", "1m1h", "10 m", "1h-2m"]


@pytest.mark.parametrize(("text", "seconds"), SAME.items())
def test_every_option_reads_a_duration_alike(text: str, seconds: float) -> None:
    assert parse_seconds(text) == seconds
    assert parse_duration(text) == seconds
    assert _duration(text) == seconds
    assert parse_age(text) == seconds
    if seconds < MAX_DURATION_CEILING:  # a burn's own limit (a week), not the grammar's
        assert burn.parse_duration(text) == seconds


@pytest.mark.parametrize("text", NOT_ONE)
def test_what_is_not_a_duration_is_refused_by_every_option(text: str) -> None:
    assert parse_seconds(text) is None
    assert parse_duration(text) is None
    with pytest.raises(argparse.ArgumentTypeError):
        _duration(text)
    with pytest.raises(UserError):
        parse_age(text)
    with pytest.raises(ValueError):
        burn.parse_duration(text)


def test_replay_positions_may_be_zero_and_signed() -> None:
    assert parse_duration("0") is None and parse_duration("0", allow_zero=True) == 0.0
    assert parse_duration("+1m30s") == 90.0
