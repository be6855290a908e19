"""gpuctl's own log: a rotating file in the state folder, and ``-v`` lines on stderr.

Every command logs to ``<state>/logs/gpuctl.log`` (``gpuctl.paths.log_dir()``; ``--log-file PATH``
picks another file) through the ``gpuctl`` logger: 5 MB per file, three old files kept, folder
0700 (a folder ``--log-file`` names is made 0700 when missing and left as it is when not). The
file is where a failure's whole story goes (a traceback included); the terminal gets one line
that names the file. ``-v`` copies INFO lines to stderr, ``-vv`` DEBUG lines, except while the
TUI owns the terminal.

What is logged is what gpuctl did and why it failed: never a key, a password, an environment or
a payload.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import sys
from pathlib import Path

from gpuctl import paths

LOG_NAME = paths.LOG_NAME
MAX_BYTES = 5 << 20
BACKUPS = 3
FORMAT = "%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s"

_file: Path | None = None
_stderr: logging.Handler | None = None


def default_log_file() -> Path:
    """``<state>/logs/gpuctl.log``."""
    return paths.log_dir() / LOG_NAME


def setup(verbose: int = 0, log_file: str | os.PathLike[str] | None = None) -> Path | None:
    """Send the ``gpuctl`` logger to the log file (and to stderr with ``verbose``).

    Returns the log file in use, or None when it cannot be opened (a read-only home): gpuctl
    then logs nowhere but still runs. Calling it again replaces the earlier handlers.
    """
    global _file, _stderr
    logger = logging.getLogger("gpuctl")
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    _file = None
    path = paths.expand(log_file) if log_file else default_log_file()
    try:
        # a folder the user named keeps its mode; gpuctl's own logs/ is made private
        paths.private_dir(path.parent, ours=not log_file)
        fh = logging.handlers.RotatingFileHandler(
            path, maxBytes=MAX_BYTES, backupCount=BACKUPS, encoding="utf-8", delay=False
        )
        os.chmod(path, 0o600)
    except OSError:
        fh = None
    if fh is not None:
        fh.setLevel(logging.DEBUG if verbose >= 2 else logging.INFO)
        fh.setFormatter(logging.Formatter(FORMAT))
        logger.addHandler(fh)
        _file = path
    _stderr = None
    if verbose:
        _stderr = logging.StreamHandler(sys.stderr)
        _stderr.setLevel(logging.DEBUG if verbose >= 2 else logging.INFO)
        _stderr.setFormatter(logging.Formatter("gpuctl: %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(_stderr)
    return _file


def quiet_terminal() -> None:
    """Stop copying log lines to stderr (the TUI is about to draw there)."""
    global _stderr
    if _stderr is not None:
        logging.getLogger("gpuctl").removeHandler(_stderr)
        _stderr = None


def log_file() -> Path | None:
    """The log file ``setup`` opened, or None."""
    return _file


def where() -> str:
    """``" (log: PATH)"`` for a one-line error message, or "" when nothing is logged."""
    return f" (log: {_file})" if _file is not None else ""
