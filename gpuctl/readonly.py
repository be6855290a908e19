"""The read-only rule: why a session is read-only, decided once from its sources.

The sources, first match wins: ``--read-only`` (``flag``), ``$GPUCTL_READ_ONLY`` set to
anything but 0/false/no/off (a typo must not lift a safety switch), then ``read_only = true``
in the config. ``gpuctl.context.Context`` decides by this rule when it is built;
``gpuctl.service`` refuses actions by that decision (``Guard``). Below both, so neither imports
the other to reach it.

Headless: standard library (``gpuctl.config`` for the type alone).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuctl.config import Config

READ_ONLY_ENV = "GPUCTL_READ_ONLY"
_ENV_OFF = ("", "0", "false", "no", "off")


def env_read_only() -> bool:
    """True when ``$GPUCTL_READ_ONLY`` turns read-only mode on (any value but 0/false/no/off)."""
    return os.environ.get(READ_ONLY_ENV, "").strip().lower() not in _ENV_OFF


def read_only_reason(*, flag: bool = False, config: Config | None = None) -> str | None:
    """Why a session is read-only (the source and how to lift it, in words), or None: the
    decision a ``gpuctl.context.Context`` makes once when it is built (which reads the
    config: nothing here reads a file).

    ``flag`` is a ``--read-only`` option; ``config`` the session's config (None: none counts,
    the demo's simulated nodes).
    """
    if flag:
        return "--read-only is given: run without it"
    if env_read_only():
        return f"{READ_ONLY_ENV} is set: unset it"
    if config is not None and config.read_only:
        return f"{config.path or 'the config'} sets read_only = true: set it to false there"
    return None
