"""Which config files are read, each read safely, and loaded: the site's files, then the
user's (or the one named by ``$GPUCTL_CONFIG`` or ``--config``), each owned by this user or root
and writable by nobody else, nor replaceable through its folders (``unsafe_owner_or_mode``,
``unsafe_folder``; ``unsafe_secret`` is the same rule for a file holding a secret)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from gpuctl import paths
from gpuctl.config.model import Config, ConfigError
from gpuctl.config.parse import parse_layers


def default_path() -> Path:
    """The user's config file (``gpuctl.paths.config_file()``), whether or not it exists."""
    return paths.config_file()


def config_files(path: str | os.PathLike[str] | None = None) -> list[tuple[str, bool]]:
    """The files ``load_config(path)`` reads, lowest precedence first, as ``(path, required)``:
    the site's files that exist, then ``path``, ``$GPUCTL_CONFIG`` or the user's file (required
    when named explicitly; the user's default file only when it exists)."""
    files = [(str(p), False) for p in reversed(paths.site_config_files()) if p.is_file()]
    if path is None:
        env = os.environ.get(paths.CONFIG_ENV)
        if env:
            files.append((env, True))
        elif default_path().is_file():
            files.append((str(default_path()), False))
    else:
        files.append((os.fspath(path), True))
    return files


def load_config(path: str | os.PathLike[str] | None = None) -> Config:
    """Read, merge and validate the config files (see the module docstring).

    ``path`` None means ``$GPUCTL_CONFIG``, else the user's file. No file at all gives an empty
    Config (this machine). A named file that is missing, or any mistake, raises ConfigError with
    one line ``path:line: message``.
    """
    layers = [(name, _read(name)) for name, _required in config_files(path)]
    if not layers:
        return Config()
    return parse_layers(layers)


def _read(name: str) -> str:
    try:
        with open(paths.expand(name), "rb") as f:
            why = unsafe_owner_or_mode(os.fstat(f.fileno())) or unsafe_folder(name)
            if why is not None:
                raise ConfigError(name, None, why)
            return f.read().decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(name, None, "no such file") from None
    except IsADirectoryError:
        raise ConfigError(name, None, "is a directory, not a config file") from None
    except PermissionError:
        raise ConfigError(name, None, "cannot read it: permission denied") from None
    except UnicodeDecodeError:
        raise ConfigError(name, None, "is not UTF-8 text") from None


CONFIG_RISK = "another user could run commands on every node through it"
HOSTFILE_RISK = "another user could choose the nodes gpuctl acts on through it"


def unsafe_owner_or_mode(st: os.stat_result, risk: str = CONFIG_RISK) -> str | None:
    """Why a config file (or a hostfile: ``risk`` says what is at stake) with this owner and
    mode may not be used, or None.

    The config is code: its ``setup`` lines, ``python`` and ``[jobs] setup`` run as this user
    on every node. So, like OpenSSH for its own config (``Bad owner or permissions``), a file
    must be owned by this user or root and writable by nobody else (no group or other write
    bit): on a shared login node another user who can write it runs commands as this user
    everywhere. Checked on the open file (``fstat``), so it is the file that is read."""
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid not in (0, os.geteuid()):
        who = f"owned by uid {st.st_uid}, neither you nor root"
    elif mode & 0o022:
        who = "writable by " + (
            "group and others"
            if mode & 0o022 == 0o022
            else "its group"
            if mode & 0o020
            else "others"
        )
    else:
        return None
    return (
        f"Bad owner or permissions (mode {mode:04o}, {who}): {risk}; it must be yours or "
        "root's, writable only by its owner (chmod go-w)"
    )


def unsafe_secret(st: os.stat_result, path: str) -> str | None:
    """Why a file holding a secret (``export --auth-file``, a store's token or password file)
    with this type, owner and mode may not be used, or None: not a regular file, owned by
    another user than this one or root, or readable or writable by others, or writable by its
    group (``mode & 0o026``; a group may read it: the group that scrapes). Checked on the open
    file (``fstat``), so it is the file that is read."""
    mode = stat.S_IMODE(st.st_mode)
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_uid not in (os.getuid(), 0):
        return f"owned by uid {st.st_uid}, not by you or root"
    if mode & 0o026:
        return (
            f"bad permissions {mode:04o}, other users could read or change the secret "
            f"(chmod 600 {path}, or 640 for a group that scrapes)"
        )
    return None


def unsafe_folder(name: str) -> str | None:
    """Why the folders holding a config file make it unsafe, or None: a folder on its path
    (links resolved, up to ``/``) that another user owns, or that its group or others may
    write without the sticky bit, lets them replace the file (renaming theirs over it), which
    its own mode cannot stop. Root's folders and the user's own pass; a sticky folder (``/tmp``)
    lets nobody rename another's file."""
    folder = os.path.dirname(os.path.realpath(paths.expand(name)))
    while True:
        try:
            st = os.stat(folder)
        except OSError:
            return None  # the file was read: a folder that cannot be looked at is not ours to judge
        mode = stat.S_IMODE(st.st_mode)
        if st.st_uid not in (0, os.geteuid()):
            return (
                f"Bad owner or permissions: its folder {folder} is owned by uid {st.st_uid}, "
                "neither you nor root, who could replace the file; keep the file in a folder "
                "of yours"
            )
        if mode & 0o022 and not mode & stat.S_ISVTX:
            return (
                f"Bad owner or permissions: its folder {folder} (mode {mode:04o}) is writable by "
                "others than you, who could replace the file (chmod go-w the folder)"
            )
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent
