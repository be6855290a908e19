"""The node bundle: ``gpuctl/node`` and ``gpuctl/workloads`` as one zipapp named by content hash.

The zip is byte-for-byte reproducible (sorted entries, fixed timestamps), so the hash changes
exactly when node-side code changes, and a node that already holds ``gpuctl-node-<hash>.pyz``
needs no upload.

It also carries the login side's nvidia-ml-py ``pynvml.py`` (one pure-Python module, BSD; its
licence is the comment block that opens it, written beside it as ``LICENSE.nvidia-ml-py``) under
``gpuctl/node/_vendor/``, so a node whose ``python3`` has no pynvml reads its GPUs through NVML
(``gpuctl/node/readers/bindings.py`` chooses). A different nvidia-ml-py is a different hash.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import io
import os
import zipfile
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
NODE_PACKAGES = ("node", "workloads")
_MAIN = b"import sys\nfrom gpuctl.node.__main__ import main\nsys.exit(main())\n"
_EPOCH = (1980, 1, 1, 0, 0, 0)


VENDOR = "gpuctl/node/_vendor"  # readers/bindings.py reads it by this name


def _pynvml() -> tuple[str, bytes] | None:
    """``(version, source)`` of the installed nvidia-ml-py's ``pynvml.py``, or None."""
    try:
        dist = importlib.metadata.distribution("nvidia-ml-py")
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in dist.files or ():
        if file.name == "pynvml.py" and len(file.parts) == 1:
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                return dist.version, path.read_bytes()
    return None


def _licence(source: bytes) -> bytes:
    """The comment block that opens ``pynvml.py`` (its copyright and BSD licence), as text."""
    lines = []
    for line in source.decode("utf-8", "replace").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").removeprefix(" ").rstrip())
    return ("\n".join(lines).strip("\n") + "\n").encode()


def vendored() -> list[tuple[str, bytes]]:
    """The files of the pynvml the bundle (and every job folder's runner) carries, by name in
    the vendored folder: ``pynvml.py``, its version and licence; none without nvidia-ml-py."""
    found = _pynvml()
    if found is None:  # a login side without nvidia-ml-py: nodes use their own or smi
        return []
    version, source = found
    return [
        ("pynvml.py", source),
        ("pynvml.version", version.encode() + b"\n"),
        ("LICENSE.nvidia-ml-py", _licence(source)),
    ]


def _vendored() -> list[tuple[str, bytes]]:
    return [(f"{VENDOR}/{name}", data) for name, data in vendored()]


def _members() -> list[tuple[str, bytes]]:
    files = [
        ("__main__.py", _MAIN),
        ("gpuctl/__init__.py", (PACKAGE_DIR / "__init__.py").read_bytes()),
    ]
    for sub in NODE_PACKAGES:
        root = PACKAGE_DIR / sub
        if not root.is_dir():
            continue
        for path in sorted(root.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            rel = path.relative_to(PACKAGE_DIR.parent).as_posix()
            files.append((rel, path.read_bytes()))
    return sorted(files + _vendored())


def bundle_bytes() -> tuple[str, bytes]:
    """Return ``(hash, zip bytes)`` of the node bundle; the hash is 16 hex digits of sha256."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in _members():
            info = zipfile.ZipInfo(name, _EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, data)
    data = buf.getvalue()
    return hashlib.sha256(data).hexdigest()[:16], data


def bundle_name(digest: str) -> str:
    """The file name a bundle with this hash carries."""
    return f"gpuctl-node-{digest}.pyz"


def write_bundle(directory: str | os.PathLike[str]) -> Path:
    """Write the bundle into ``directory`` (created if missing) and return its path.

    Writes to a temporary name and renames, so a reader never sees a partial file.
    """
    digest, data = bundle_bytes()
    out_dir = Path(directory)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / bundle_name(digest)
    if target.exists() and target.read_bytes() == data:
        return target
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, target)
    return target
