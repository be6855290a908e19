"""The user's own code, shipped with a job: the importable modules and packages of the project
the submitter runs from, so that a function that imports them when it runs (``def main(): from
model import MLP``) finds them in VENV2 on every target, with no shared file system.

The project is the folder the submitting script's imports come from (``python train.py``: the
script's folder; ``python -m proj.train``: the folder holding ``proj``; a REPL or a notebook: the
current folder) and the folder of the file a function was loaded from (``gpuctl submit
train.py:main``). Its top-level ``*.py`` modules and its packages (folders with ``__init__.py``,
every file in them) ship; installed distributions (editable installs too: VENV2 is expected to
have them) and gpuctl do not. Content-addressed like the runner: ``<job root>/code-<hash>`` on the
target's host, written once per content (one archive, unpacked there), and put first on VENV2's
``sys.path`` (and ``PYTHONPATH``, for the processes the function starts) by the worker.

``limit`` caps the bytes shipped (modules already imported here come first), ``exclude`` lists
``fnmatch`` patterns matched against each file's and folder's name and each module's dotted
name. What is left out is named in ``meta.json`` (``unshipped``: name -> [path, why]) for the
report of a job that then misses it: "your module `model` (`/path/model.py`) was not shipped:
...".
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import importlib.metadata
import io
import os
import sys
import sysconfig
import tarfile
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuctl.jobs.hosts import Host, HostError
from gpuctl.node import jobfiles

DEFAULT_LIMIT = 64 << 20  # bytes of the user's code per job: source, not data
DEFAULT_EXCLUDE = ("__pycache__", "*.pyc", "*.pyo", ".*")
NEVER_SHIPPED = frozenset({"gpuctl", jobfiles.RUNNER_PACKAGE})
COMPLETE = ".complete"  # written last into a code folder: the folder is whole


@dataclass(frozen=True)
class Unit:
    """One top-level module (``model.py``) or package (``pkg/``) of the project."""

    name: str
    path: str  # the module's file or the package's folder
    files: tuple[tuple[str, str], ...]  # (path in the code folder, path here)
    size: int


@dataclass(frozen=True)
class UserCode:
    """What ships with a job: ``files`` (path in the code folder, path here), their ``digest``,
    and what was left out (``unshipped``: module name -> (path, why))."""

    files: tuple[tuple[str, str], ...] = ()
    digest: str = ""
    unshipped: dict[str, tuple[str, str]] = field(default_factory=dict)

    def folder(self, root: str) -> str:
        """The code folder under the job root ``root``."""
        return f"{root}/code-{self.digest[:16]}"

    def modules(self) -> dict[str, str]:
        """The modules that ship, by dotted name: the real path here of each one's file
        (``pkg/__init__.py`` is ``pkg``). In VENV2 each imports, under that name, from the
        code folder."""
        out = {}
        for rel, path in self.files:
            if rel.endswith(".py"):
                name = rel[:-3].replace("/", ".").removesuffix(".__init__")
                out[name] = os.path.realpath(path)
        return out

    def ships(self, name: str) -> bool:
        """Whether the module ``name`` imported here is one that ships: VENV2 imports the same
        file under the same name (so it pickles by reference, as plain Python pickles it)."""
        mod = sys.modules.get(name)
        path = getattr(mod, "__file__", None)
        if not isinstance(path, str) or not path:
            return False
        return self.modules().get(name) == os.path.realpath(path)


@functools.cache
def installed_roots() -> tuple[str, ...]:
    """The folders Python's own and installed modules live in (stdlib, site-packages)."""
    where = sysconfig.get_paths()
    bases = (where.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib"))
    return tuple(os.path.realpath(b) + os.sep for b in bases if b)


@functools.lru_cache(maxsize=65536)
def is_user_file(path: str) -> bool:
    """True for a file outside the standard library and site-packages: the user's own."""
    real = os.path.realpath(path)
    if real.startswith(installed_roots()):
        return False
    return "site-packages" not in real and "dist-packages" not in real


def is_user_module(name: str) -> bool:
    """True for a module imported from a file outside the standard library and site-packages."""
    mod = sys.modules.get(name)
    path = getattr(mod, "__file__", None)
    if mod is None or not isinstance(path, str) or not path or name == "__main__":
        return False
    return name.split(".")[0] != "gpuctl" and is_user_file(path)


@functools.cache
def installed_top_levels() -> frozenset[str]:
    """Top-level import names that belong to an installed distribution (editable ones too)."""
    return frozenset(importlib.metadata.packages_distributions())


def _fmt(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n / 1024:.1f} KiB"


def _not_installed_dir(path: str) -> bool:
    """A folder that is not the standard library's, site-packages or this Python's ``bin`` (a
    console script's, e.g. ``pytest``)."""
    real = os.path.realpath(path)
    scripts = {sysconfig.get_path("scripts")}
    scripts |= {os.path.join(p, "bin") for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    return real not in {os.path.realpath(p) for p in scripts} and is_user_file(
        os.path.join(real, "x.py")
    )


def _import_root(file: str, name: str) -> str:
    """The ``sys.path`` folder module ``name`` (dotted) was imported from, given its file."""
    folder = os.path.dirname(os.path.realpath(file))
    for _ in range(name.count(".")):
        folder = os.path.dirname(folder)
    return folder


def project_roots(fn: Callable[..., Any]) -> list[str]:
    """The folders whose modules ship with ``fn``'s job (see the module docstring)."""
    roots: list[str] = []
    main = sys.modules.get("__main__")
    file = getattr(main, "__file__", None)
    spec = getattr(main, "__spec__", None)
    name = str(getattr(spec, "name", "") or "")
    if isinstance(file, str) and file:
        if name.split(".")[0] not in NEVER_SHIPPED:
            roots.append(_import_root(file, name))
    elif main is not None and sys.argv[:1] != ["-c"]:
        roots.append(os.getcwd())  # a REPL or a notebook imports from the current folder
    mod = sys.modules.get(str(getattr(fn, "__module__", "") or ""))
    mfile = getattr(mod, "__file__", None)
    if mod is not None and mod is not main and isinstance(mfile, str) and "." not in mod.__name__:
        roots.append(os.path.dirname(os.path.realpath(mfile)))  # a file loaded by path
    out: list[str] = []
    for root in roots:
        if root not in out and os.path.isdir(root) and _not_installed_dir(root):
            out.append(root)
    return out


OUTSIDE = (
    "it is outside the folders whose modules ship with a job (the submitting script's folder, "
    "or the file `gpuctl submit` loaded): submit from a script in your project's folder, or "
    "install your project into VENV2 (`pip install -e`)"
)


def local_module(name: str) -> str | None:
    """The file here of the user's own top-level module ``name`` (not installed, not the
    standard library), found without importing it; None when it is no such module."""
    import importlib.machinery

    if not name.isidentifier() or name in NEVER_SHIPPED or name in installed_top_levels():
        return None
    mod = sys.modules.get(name)
    path = getattr(mod, "__file__", None)
    if mod is None:
        try:
            spec = importlib.machinery.PathFinder.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        path = spec.origin if spec is not None else None
    if not isinstance(path, str) or not os.path.isfile(path) or not is_user_file(path):
        return None
    return path


INSTALLED = (
    "an installed distribution here has a module of that name (an editable install of your "
    "project?), so VENV2 is expected to have it: install it into VENV2 too"
)
STDLIB = (
    "it has the name of a module of Python's standard library, which it would hide in VENV2: "
    "rename it"
)


def _excluded_why(pattern: str) -> str:
    return (
        f"the pattern {pattern!r} of --ship-exclude / Executor(ship_exclude=...) leaves it out: "
        "remove it to ship it"
    )


def _excluded(name: str, patterns: Sequence[str]) -> str | None:
    return next((p for p in patterns if fnmatch.fnmatchcase(name, p)), None)


def _package_files(
    top: str, exclude: Sequence[str], unshipped: dict[str, tuple[str, str]]
) -> tuple[list[tuple[str, str]], int]:
    """Every file of the package folder ``top`` (but the excluded), and their size."""
    files: list[tuple[str, str]] = []
    size = 0
    for folder, dirs, names in os.walk(top):
        rel = os.path.relpath(folder, os.path.dirname(top))
        dotted = rel.replace(os.sep, ".")
        for d in list(dirs):
            pattern = _excluded(d, (*DEFAULT_EXCLUDE, *exclude)) or _excluded(
                f"{dotted}.{d}", exclude
            )
            if pattern:
                dirs.remove(d)
                if pattern in exclude and os.path.exists(os.path.join(folder, d, "__init__.py")):
                    why = _excluded_why(pattern)
                    unshipped[f"{dotted}.{d}"] = (os.path.join(folder, d), why)
        dirs.sort()
        for n in sorted(names):
            path = os.path.join(folder, n)
            module = f"{dotted}.{n[:-3]}" if n.endswith(".py") else ""
            pattern = _excluded(n, (*DEFAULT_EXCLUDE, *exclude)) or (
                _excluded(module, exclude) if module else None
            )
            if pattern:
                if pattern in exclude and module:
                    why = _excluded_why(pattern)
                    unshipped[module] = (path, why)
                continue
            if not os.path.isfile(path) or not os.access(path, os.R_OK):
                continue  # a socket, a broken link, a file this user cannot read
            files.append((f"{rel}/{n}".replace(os.sep, "/"), path))
            size += os.path.getsize(path)
    return files, size


def _units(root: str, exclude: Sequence[str], unshipped: dict[str, tuple[str, str]]) -> list[Unit]:
    """The top-level modules and packages in ``root`` that may ship."""
    installed = installed_top_levels()
    units = []
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError:
        return []
    for entry in entries:
        is_module = entry.name.endswith(".py") and entry.is_file() and os.access(entry, os.R_OK)
        name = entry.name[:-3] if is_module else entry.name
        if not name.isidentifier() or name in NEVER_SHIPPED:
            continue
        if not is_module and not (
            entry.is_dir() and os.path.isfile(os.path.join(entry.path, "__init__.py"))
        ):
            continue
        if name in installed:
            unshipped[name] = (entry.path, INSTALLED)
            continue
        if name in sys.stdlib_module_names:
            unshipped[name] = (entry.path, STDLIB)
            continue
        pattern = _excluded(entry.name, (*DEFAULT_EXCLUDE, *exclude)) or _excluded(name, exclude)
        if pattern:
            if pattern in exclude:
                why = _excluded_why(pattern)
                unshipped[name] = (entry.path, why)
            continue
        if is_module:
            units.append(Unit(name, entry.path, ((entry.name, entry.path),), entry.stat().st_size))
        else:
            files, size = _package_files(entry.path, exclude, unshipped)
            units.append(Unit(name, entry.path, tuple(files), size))
    return units


@functools.lru_cache(maxsize=8192)
def _file_digest(path: str, size: int, mtime_ns: int, ino: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def collect(
    fn: Callable[..., Any], *, limit: int = DEFAULT_LIMIT, exclude: Sequence[str] = ()
) -> UserCode:
    """The user code that ships with ``fn``'s job: the modules and packages of its project
    (``project_roots``), those already imported here first, up to ``limit`` bytes."""
    unshipped: dict[str, tuple[str, str]] = {}
    units: dict[str, Unit] = {}
    for root in project_roots(fn):
        for unit in _units(root, exclude, unshipped):
            units.setdefault(unit.name, unit)  # the first root wins, as on sys.path
    order = sorted(units.values(), key=lambda u: (u.name not in sys.modules, u.name))
    total = 0
    files: list[tuple[str, str]] = []
    for unit in order:
        if limit <= 0:
            unshipped[unit.name] = (
                unit.path,
                "shipping your code is off (--ship-limit 0 / Executor(ship_limit=0)): "
                "give it a limit",
            )
            continue
        if total + unit.size > limit:
            why = (
                f"it is {_fmt(unit.size)}, and your project's code would then be "
                f"{_fmt(total + unit.size)}, over the limit of {_fmt(limit)}: leave out what the "
                "job does not import (--ship-exclude / Executor(ship_exclude=[...])) or raise "
                "the limit (--ship-limit / Executor(ship_limit=...))"
            )
            unshipped[unit.name] = (unit.path, why)
            continue
        total += unit.size
        files += unit.files
    if not files:
        return UserCode(unshipped=unshipped)
    digest = hashlib.sha256()
    for rel, path in sorted(files):
        st = os.stat(path)
        digest.update(
            f"{rel}\0{_file_digest(path, st.st_size, st.st_mtime_ns, st.st_ino)}\0".encode()
        )
    return UserCode(tuple(sorted(files)), digest.hexdigest(), unshipped)


# Unpacks the archive $1 into the new folder $2, then makes it the code folder $3 unless
# another submitter's copy got there first.
# A folder already there with its mark is another submitter's complete copy: ours goes. One
# without it (a purge cut off midway, a hand's ``rm``) is replaced, never used as it is.
_UNPACK = (
    'tar -x -f "$1" -C "$2" && rm -f "$1" && '
    f'if [ -e "$3/{COMPLETE}" ]; then rm -rf "$2"; '
    'else rm -rf "$3" && mv "$2" "$3" || rm -rf "$2"; fi'
)


def _private(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.mode = 0o700 if info.isdir() else 0o600
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def ship(host: Host, root: str, code: UserCode) -> str | None:
    """Copy ``code`` into its folder under the job root ``root`` on ``host`` unless a complete
    copy is there already; returns the folder (None when nothing ships).

    One archive streams to the host and ``tar`` unpacks it there into a new folder that is then
    renamed into place, ``.complete`` in it: one transfer whatever the number of files, and a
    folder that is never seen half written."""
    if not code.files:
        return None
    folder = code.folder(root)
    if host.touch(folder, when=f"{folder}/{COMPLETE}"):  # complete: reused, marked used
        return folder
    tmp = f"{folder}.tmp-{uuid.uuid4().hex[:8]}"
    archive = f"{tmp}.tar"
    writer = host.open_atomic(archive, 0o600)
    try:
        with tarfile.open(fileobj=writer, mode="w|") as tar:  # type: ignore[call-overload]
            for rel, path in code.files:
                tar.add(path, arcname=rel, recursive=False, filter=_private)
            mark = _private(tarfile.TarInfo(COMPLETE))
            tar.addfile(mark, io.BytesIO(b""))
    except BaseException:
        writer.abort()
        raise
    writer.commit()
    host.mkdir(tmp, 0o700)
    rc, _, err = host.run(["sh", "-c", _UNPACK, "sh", archive, tmp, folder], timeout=600)
    if rc != 0:
        host.run(["rm", "-rf", tmp, archive], timeout=60)
        why = err.decode("utf-8", "replace").strip().splitlines()[-1:] or [f"exit {rc}"]
        raise HostError(f"unpacking your code into {folder} on {host.name} failed: {why[0]}")
    return folder
