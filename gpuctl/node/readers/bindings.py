"""Which pynvml the node uses: its own when installed and newer, else the one the bundle carries.

The bundle builder (``gpuctl/bundle.py``) copies the login side's nvidia-ml-py ``pynvml.py`` into
the zipapp as ``gpuctl/node/_vendor/pynvml.py`` with its version in ``pynvml.version``, so a node
whose system ``python3`` has no pynvml (RHEL's 3.6 or 3.9) still reads its GPUs through NVML.
``load()`` decides once per process and puts the chosen module in ``sys.modules["pynvml"]``, so
everything that imports pynvml afterwards (the acceptance suite's reads too) gets the same one.
``described()`` is what the agent's ``hello`` reports as ``bindings``.
"""

import os
import pkgutil
import re
import sys
from typing import Any, Optional, Tuple

VENDOR = "_vendor"  # folder of gpuctl/node inside the bundle; the bundle builder writes it
_DIST_INFO = re.compile(r"^(nvidia_ml_py3?|pynvml)-([0-9][0-9A-Za-z.+]*)\.(?:dist|egg)-info$")

_chosen = None  # type: Optional[Tuple[Any, str]]


# The package that holds ``readers`` (and the vendored folder): ``gpuctl.node`` in the bundle,
# ``gpuctl_runner`` in a job folder (the supervisor's copy, which carries pynvml too).
_NODE_PACKAGE = __name__.rsplit(".", 2)[0]


def bundled_version() -> Optional[str]:
    """The version of the pynvml this bundle carries, or None (running from a source tree)."""
    try:
        data = pkgutil.get_data(_NODE_PACKAGE, VENDOR + "/pynvml.version")
    except (OSError, ValueError):
        return None
    text = (data or b"").decode("ascii", "replace").strip()
    return text or None


def _version_key(version: str) -> Tuple[int, ...]:
    """Numeric parts of a version for comparison ("13.615.71" -> (13, 615, 71))."""
    parts = []
    for piece in version.split("."):
        digits = re.match(r"\d+", piece)
        if digits is None:
            break
        parts.append(int(digits.group()))
    return tuple(parts)


def system_pynvml() -> Tuple[Optional[str], Optional[str]]:
    """``(origin, version)`` of a pynvml the node's Python would import, or ``(None, None)``.

    The version comes from the distribution metadata beside it (nvidia-ml-py, nvidia-ml-py3 or the
    old pynvml project); None when there is none to read.
    """
    import importlib.util

    try:
        spec = importlib.util.find_spec("pynvml")
    except (ImportError, ValueError):
        return None, None
    if spec is None or not spec.origin or not os.path.isfile(spec.origin):
        return None, None
    origin = spec.origin
    site = os.path.dirname(origin)
    if os.path.basename(origin) == "__init__.py":  # the old pynvml project ships a package
        site = os.path.dirname(site)
    best = None  # type: Optional[str]
    try:
        names = sorted(os.listdir(site))
    except OSError:
        names = []
    for name in names:
        match = _DIST_INFO.match(name)
        if match is None:
            continue
        version = match.group(2)
        if best is None or _version_key(version) > _version_key(best):
            best = version
    return origin, best


def _import_bundled() -> Any:
    """Import the bundle's pynvml as ``pynvml`` (its folder is on sys.path only meanwhile)."""
    folder = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), VENDOR)
    sys.path.insert(0, folder)
    try:
        import pynvml

        return pynvml
    finally:
        try:
            sys.path.remove(folder)
        except ValueError:
            pass


def load() -> Tuple[Any, str]:
    """Import the pynvml to use and say which: ``(module, "bundled 13.615.71")``.

    The node's own pynvml wins only when its version is known and newer than the bundled one,
    and when it imports: a broken one gives way to the bundled one. Raises ImportError (with a
    one-line reason) when there is none at all; with no bundled one to fall back on, the error of
    a broken install propagates for the caller to report.
    """
    global _chosen
    if _chosen is not None:
        return _chosen
    loaded = sys.modules.get("pynvml")
    if loaded is not None:  # imported before us (a test, a user's function): say what it is
        _chosen = (loaded, "system %s" % (system_pynvml()[1] or "(version unknown)"))
        return _chosen
    bundled = bundled_version()
    origin, version = system_pynvml()
    use_system = origin is not None and (
        bundled is None
        or (version is not None and _version_key(version) > _version_key(bundled))
    )
    if use_system:
        try:
            import pynvml

            _chosen = (pynvml, "system %s" % (version or "(version unknown)"))
            return _chosen
        except Exception:  # a broken install of the node's: the bundle's, when there is one
            sys.modules.pop("pynvml", None)
            if bundled is None:
                raise
    if bundled is not None:
        _chosen = (_import_bundled(), "bundled %s" % bundled)
    else:
        raise ImportError("pynvml is not installed and this agent carries none")
    return _chosen


def described() -> Optional[str]:
    """The bindings ``load()`` chose ("bundled 13.615.71", "system 12.535.133"), or None."""
    return _chosen[1] if _chosen is not None else None
