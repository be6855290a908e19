"""Real kernel cgroups laid out as Slurm lays out a job's (for tests): a process moved into
``.../job_NNN/step_0/...`` reads, in its ``/proc/PID/cgroup``, as a task of that job."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

from gpuctl_tests.helpers import unavailable

CGROUPS = Path("/sys/fs/cgroup")


def _first(*paths: Path) -> Path:
    return next((p for p in paths if (p / "cgroup.procs").exists()), paths[-1])


# A v1 hierarchy without limits (nothing is held back), and the v2 one (beside v1 on a hybrid
# host); a host with v2 alone has its one hierarchy hold both layouts' folders.
V1 = _first(CGROUPS / "freezer", CGROUPS / "unified", CGROUPS)
V2 = _first(CGROUPS / "unified", CGROUPS)


def slurm_v1(job: int) -> str:
    """Slurm's cgroup v1 path of a job's step under a hierarchy."""
    return f"slurm/uid_{os.getuid()}/job_{job}/step_0/task_0"


def slurm_v2(job: int) -> str:
    """Slurm's cgroup v2 path (``slurmstepd.scope``) of a job's step."""
    return f"system.slice/slurmstepd.scope/job_{job}/step_0/user/task_0"


@contextlib.contextmanager
def moved_into(root: Path, path: str, pid: int) -> Iterator[Path]:
    """Move ``pid`` into ``root``/<a folder of this test>/``path`` (made here); on the way out
    it goes back to the hierarchy's root and the folders are removed. Skips (fails in CI) where
    the hierarchy cannot be written (not root, no such mount, a read-only one)."""
    if not (root / "cgroup.procs").exists() or not os.access(root / "cgroup.procs", os.W_OK):
        unavailable(f"cgroups: {root} cannot be written here (root and a writable mount needed)")
    top = root / f"gpuctl-test-{uuid.uuid4().hex[:8]}"
    folder = top / path
    try:
        folder.mkdir(parents=True)
        (folder / "cgroup.procs").write_text(f"{pid}\n")
    except OSError as e:
        _remove(top)
        unavailable(f"cgroups: cannot make or join {folder}: {e}")
    try:
        yield folder
    finally:
        with contextlib.suppress(OSError):
            (root / "cgroup.procs").write_text(f"{pid}\n")
        _remove(top)


def _remove(top: Path) -> None:
    """Remove a tree of cgroup folders (rmdir only: their files are the kernel's)."""
    if not top.exists():
        return
    for folder in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        with contextlib.suppress(OSError):
            folder.rmdir()
    with contextlib.suppress(OSError):
        top.rmdir()
