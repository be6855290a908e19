"""Shared fixtures. Test helpers live in gpuctl_tests/helpers.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpuctl_tests.helpers import AgentProcess


@pytest.fixture
def agents() -> Iterator[list[AgentProcess]]:
    """A list to put AgentProcess objects in; every one is closed after the test."""
    started: list[AgentProcess] = []
    yield started
    for a in started:
        a.close()
