"""The session's context: what gpuctl decides once at start-up and hands to what it builds.

A ``Context`` holds the config (read and checked once), the read-only decision (made once, from
``--read-only``, ``$GPUCTL_READ_ONLY`` and the config's ``read_only``: ``gpuctl.readonly``
gives the order and the words; ``gpuctl.service`` refuses actions by it), the state folder
and the job store in it (``job_store()``: opened at its first use, then the session's one: the
job commands, the screen's jobs pane and ``gpuctl.jobs``' executors and ``attach`` all take it
from here). The owner of the burns a session starts is not in it: ``service.me()`` is already
made once per process, and nothing else decides it. The CLI builds one per command
(``gpuctl.cli.common.session``) and installs it as the process's; the TUI, the fleet
builder, the job runner and the service take what they need from it instead of reading the
config file again or probing objects for attributes.

Why once: before, every mutating action that had no decision of its caller's read the config
file from disk again, so a session's read-only mode could change under it halfway through (and
a file broken meanwhile refused every action), and a command read the file up to three times
before it ran (the read-only decision, the command, its fleet). A session is now what it was
when it started: to change its mode, start it again.

The Python API (``gpuctl.fleet.control``, ``gpuctl.accept.run``, ``gpuctl.jobs``) called
without a context or a decision uses ``current()``: the context the CLI installed, else one
built from ``$GPUCTL_CONFIG`` (or the XDG files) and the environment at the first action that
needs it, kept for the rest of the process. A config that cannot be read is not kept: each
action that needs it refuses with its one-line ``ConfigError``.

Headless: standard library, ``gpuctl.config``, ``gpuctl.paths`` and ``gpuctl.readonly``
(``gpuctl.jobs.store`` is imported at the first ``job_store()``).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gpuctl import paths, readonly
from gpuctl.config import Config, load_config

if TYPE_CHECKING:
    from gpuctl.jobs.store import JobStore


class _Opened:
    """What a context opens at its first use and keeps (the frozen ``Context`` holds this one
    mutable box): its job store. A lock, for the threads of one session (the jobs pane's
    worker, a map's submits) that may ask first at the same time."""

    __slots__ = ("job_store", "lock")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.job_store: JobStore | None = None


@dataclass(frozen=True, slots=True)
class Context:
    """One session's settings and decisions (see the module docstring).

    ``read_only_why``: why the session is read-only, in words naming how to lift it, or None
    when it is not; ``state_dir``: the folder of the remembered theme, the acceptance history,
    the recordings and the job store (``gpuctl.paths.state_dir()``).
    """

    config: Config = field(default_factory=Config)
    read_only_why: str | None = None
    state_dir: Path = field(default_factory=paths.state_dir)
    _opened: _Opened = field(default_factory=_Opened, init=False, repr=False, compare=False)

    @property
    def read_only(self) -> bool:
        """True when mutating actions are refused in this session."""
        return self.read_only_why is not None

    @classmethod
    def of(cls, config: Config, *, flag: bool = False, use_config: bool = True) -> Context:
        """The context of an already read ``config``: read-only decided now from ``flag``
        (``--read-only``), the environment and (unless not ``use_config``: the demo's
        simulated nodes) the config's ``read_only``."""
        why = readonly.read_only_reason(flag=flag, config=config if use_config else None)
        return cls(config, why)

    @classmethod
    def load(
        cls, config_path: str | os.PathLike[str] | None = None, *, flag: bool = False
    ) -> Context:
        """Read the config (``gpuctl.config.load_config(config_path)``) and decide. Raises
        ConfigError with one line when it cannot be read."""
        return cls.of(load_config(config_path), flag=flag)

    def job_store(self) -> JobStore:
        """The session's job store (``jobs.sqlite`` in ``state_dir``): opened (made, brought up
        to date) at the first call, the same object after. Raises ``StoreError`` (one line)
        when it cannot be opened; nothing is kept then, and the next call tries again.

        Nothing to close at the end: the store holds no connection between its operations
        (each opens and closes its own, which is what lets several gpuctl processes share the
        file and a damaged file be moved away under a running screen)."""
        opened = self._opened
        with opened.lock:
            if opened.job_store is None:
                from gpuctl.jobs.store import JobStore, store_path

                opened.job_store = JobStore(store_path(self.state_dir))
            return opened.job_store


_current: Context | None = None


def current() -> Context:
    """The process's context: the one installed (by the CLI), else one built now from
    ``$GPUCTL_CONFIG`` (or the XDG files) and the environment and kept. Raises ConfigError
    when the config cannot be read (nothing is kept then)."""
    global _current
    if _current is None:
        _current = Context.load()
    return _current


def install(context: Context | None) -> None:
    """Make ``context`` the process's (None: forget it; the next ``current()`` builds one)."""
    global _current
    _current = context
