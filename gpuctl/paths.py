"""Where gpuctl keeps its files on the login side: the one place that decides it.

Everything follows the XDG base directory specification, on every platform (a cluster's login
node is Linux; a laptop running gpuctl behaves the same way):

=================  ================================================  =========================
what               where                                             override
=================  ================================================  =========================
user config        ``$XDG_CONFIG_HOME/gpuctl/config.toml``            ``$GPUCTL_CONFIG``,
                   (``~/.config``)                                   ``--config PATH``
site config        ``<each of $XDG_CONFIG_DIRS>/gpuctl/config.toml``
                   (``/etc/xdg``): read first, the user's file
                   overrides it key by key
state              ``$XDG_STATE_HOME/gpuctl`` (``~/.local/state``):   ``$GPUCTL_STATE_DIR``
                   ``jobs.sqlite``, ``accept.sqlite``, ``tui.json``,
                   ``reports/``, ``accept-jobs/``, ``logs/``,
                   ``events.jsonl`` (the trouble log),
                   ``recordings/`` (``R`` in the screen)
job folders        ``<state>/jobs`` (they hold results: not cache)    ``[jobs] dir``
cache              ``$XDG_CACHE_HOME/gpuctl`` (``~/.cache``)          ``$GPUCTL_CACHE_DIR``
=================  ================================================  =========================

``~`` is expanded in every value, an override included. A relative XDG value is ignored, as the
specification says. Folders gpuctl creates are mode 0700, the parents it creates too: they hold
job payloads, results and logs that are nobody else's business.

On a node, paths are the node's (``bundle_dir``, a job folder of an SSH node): they are resolved
there, by the node's shell, not here.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

APP = "gpuctl"
STATE_ENV = "GPUCTL_STATE_DIR"
CACHE_ENV = "GPUCTL_CACHE_DIR"
CONFIG_ENV = "GPUCTL_CONFIG"
CONFIG_NAME = "config.toml"
# The state folder's files and folders (``state_dir()``, or a screen's own state folder): named
# here only, so that whoever looks for one finds where it lives in one place.
JOBS_DB = "jobs.sqlite"  # the job store
ACCEPT_DB = "accept.sqlite"  # acceptance history
TUI_SETTINGS = "tui.json"  # the screen's remembered theme and layout
REPORTS = "reports"  # acceptance reports
RECORDINGS = "recordings"  # `R` in the screen
EVENTS = "events.jsonl"  # the trouble log (gpuctl.fleet.troublelog, `gpuctl events`)
SCREENSHOTS = "screenshots"  # where no Downloads folder is
ACCEPT_JOBS = "accept-jobs"  # acceptance runs through Slurm
LOGS = "logs"
LOG_NAME = "gpuctl.log"
# On a node (resolved by the node's shell): where job folders and VENV2 builds go by default.
NODE_JOB_DIR = "~/.local/state/gpuctl/jobs"
NODE_ENV_DIR = "~/.cache/gpuctl/envs"


def expand(path: str | os.PathLike[str]) -> Path:
    """``path`` with a leading ``~`` (or ``~user``) expanded."""
    return Path(os.path.expanduser(os.fspath(path)))


def _xdg(var: str, default: str) -> Path:
    value = os.environ.get(var, "").strip()
    if value:
        p = expand(value)
        if p.is_absolute():
            return p
    return expand(default)


def config_file() -> Path:
    """The user's config file (``$XDG_CONFIG_HOME/gpuctl/config.toml``), existing or not."""
    return _xdg("XDG_CONFIG_HOME", "~/.config") / APP / CONFIG_NAME


def site_config_files() -> list[Path]:
    """The site's config files, most important first (``$XDG_CONFIG_DIRS``, default
    ``/etc/xdg``), existing or not."""
    raw = os.environ.get("XDG_CONFIG_DIRS", "").strip() or "/etc/xdg"
    out: list[Path] = []
    for part in raw.split(os.pathsep):
        p = expand(part.strip()) if part.strip() else None
        if p is not None and p.is_absolute() and p / APP / CONFIG_NAME not in out:
            out.append(p / APP / CONFIG_NAME)
    return out


def is_xdg_variable(name: str) -> bool:
    """True for an XDG base-directory variable (``XDG_CONFIG_HOME``, ...): this machine's
    folders, which a node has its own of (a job is not told it misses them)."""
    return name.startswith("XDG_")


def state_dir() -> Path:
    """gpuctl's state folder: ``$GPUCTL_STATE_DIR``, else ``$XDG_STATE_HOME/gpuctl``
    (``~/.local/state/gpuctl``). Not created here: see ``private_dir``."""
    env = os.environ.get(STATE_ENV, "").strip()
    if env:
        return expand(env)
    return _xdg("XDG_STATE_HOME", "~/.local/state") / APP


def cache_dir() -> Path:
    """gpuctl's cache folder: ``$GPUCTL_CACHE_DIR``, else ``$XDG_CACHE_HOME/gpuctl``."""
    env = os.environ.get(CACHE_ENV, "").strip()
    if env:
        return expand(env)
    return _xdg("XDG_CACHE_HOME", "~/.cache") / APP


def log_dir() -> Path:
    """Where gpuctl's own log files go (``<state>/logs``)."""
    return state_dir() / LOGS


def jobs_dir(configured: str | os.PathLike[str] | None = None) -> Path:
    """Where job folders of this machine (local and Slurm jobs) go: ``configured`` (the
    config's ``[jobs] dir``, a shared file system for Slurm), else ``<state>/jobs``."""
    return expand(configured) if configured else state_dir() / "jobs"


def private_dir(path: str | os.PathLike[str], *, ours: bool = True) -> Path:
    """Create ``path`` (and the parents it lacks) with mode 0700; return it.

    ``ours``: the folder is one of gpuctl's own (the state folder, its ``logs/``, the config
    folder): one that already exists wider than 0700 is made private, when it belongs to the
    user (a shared file system's root keeps its mode). A folder a user named (``--log-file
    DIR/x.log``, ``--config DIR/c.toml``) is not ours: what is missing is made 0700, what
    exists keeps its mode (``--log-file ~/gpuctl.log`` must not close the home folder). Raises
    OSError when it cannot be created.
    """
    p = expand(path)
    missing: list[Path] = []
    q = p
    while not q.exists() and q != q.parent:
        missing.append(q)
        q = q.parent
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):
            folder.mkdir(mode=0o700)
        # mkdir's mode is masked by the umask: say it once more
        with contextlib.suppress(OSError):
            os.chmod(folder, 0o700)
    st = p.stat()
    if ours and p not in missing and st.st_uid == os.getuid() and st.st_mode & 0o077:
        with contextlib.suppress(OSError):
            os.chmod(p, 0o700)
    return p
