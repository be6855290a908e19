"""What ``gpuctl --version`` says: the release's version and, for a checkout, its commit.

The version is setuptools-scm's, fixed when gpuctl was built or installed (``gpuctl/_version.py``).
An editable install from a git checkout keeps running the checkout as it changes, so its version
alone can be stale: then the checkout's commit and whether it has changes are read from git.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from gpuctl import __version__


def checkout_commit(root: Path | None = None) -> str | None:
    """``"<short commit>"`` or ``"<short commit>, modified"`` when gpuctl runs from a git
    checkout; None for an installed copy or when git cannot tell (no git, a timeout)."""
    root = root or Path(__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return None

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    if not head:
        return None
    return f"{head}, modified" if dirty else head


def version_text() -> str:
    """One line: ``gpuctl 0.2.0`` for a release, with the checkout's commit for a checkout."""
    commit = checkout_commit()
    where = f" (checkout {commit})" if commit else ""
    return f"gpuctl {__version__}{where}"
