"""Wheels made by the tests themselves, for a package source that holds exactly what a test
needs (no machine image's package folder, no network): ``make_wheel`` writes a valid wheel
(METADATA, WHEEL, RECORD with hashes) from a mapping of files; ``wheel_of`` one of an installed
distribution's files (a pure-Python one), under its own version or another."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import re
import zipfile
from pathlib import Path


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"sha256={digest.decode()}"


def make_wheel(folder: Path, name: str, version: str, files: dict[str, bytes]) -> Path:
    """A pure-Python wheel of distribution ``name`` ``version`` holding ``files`` (path in the
    wheel -> bytes) plus its dist-info; returns its path."""
    norm = re.sub(r"[-_.]+", "_", name).lower()
    info = f"{norm}-{version}.dist-info"
    files = dict(files)
    files[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    ).encode()
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: gpuctl-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = "".join(f"{p},{_record_hash(d)},{len(d)}\n" for p, d in files.items())
    files[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{norm}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for p, d in files.items():
            z.writestr(p, d)
    return path


def wheel_of(dist: str, folder: Path, version: str | None = None) -> Path:
    """A wheel of the installed distribution ``dist``'s own files (not its dist-info), under
    ``version`` (default: the installed one; another version is also written into the
    package's ``__version__`` line)."""
    d = importlib.metadata.distribution(dist)
    have = d.version
    files: dict[str, bytes] = {}
    for f in d.files or ():
        parts = Path(str(f)).parts
        if not parts or parts[0].endswith((".dist-info", "..")) or "__pycache__" in parts:
            continue
        if parts[0] == ".." or str(f).endswith(".pyc"):
            continue
        data = Path(str(d.locate_file(f))).read_bytes()
        if version and version != have and str(f).endswith(".py"):
            data = data.replace(
                f'__version__ = "{have}"'.encode(), f'__version__ = "{version}"'.encode()
            )
        files[str(f)] = data
    return make_wheel(folder, d.metadata["Name"], version or have, files)
