"""The memory cgroup (v1 or v2) of this process: its limit, usage peak and OOM-kill count.

The supervisor records them before and after a job (``outcome.json``'s ``cgroup_before`` and
``cgroup_after``): what says that a job died of its cgroup's limit (the OOM killer's count went
up) rather than of the supervisor's own ``mem=`` watch. Reads ``/proc/self/cgroup`` and
``/proc/self/mountinfo`` to find the cgroup's folder, then its ``memory.*`` files. Standard
library only, Python 3.6.
"""

import os
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

if TYPE_CHECKING:
    from . import jobfiles


def _read_int(path: str) -> Optional[int]:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _read_keyed(path: str) -> Dict[str, int]:
    out = {}  # type: Dict[str, int]
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2:
                    try:
                        out[parts[0]] = int(parts[1])
                    except ValueError:
                        pass
    except OSError:
        pass
    return out


def _cgroup_dirs() -> Tuple[Optional[int], Optional[str]]:
    """(version, directory) of this process's memory cgroup, or (None, None)."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None, None
    v1_path = v2_path = None  # type: Optional[str]
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2_path = parts[2]
        elif "memory" in parts[1].split(","):
            v1_path = parts[2]
    mounts = []  # type: List[Tuple[str, str, str, str]]
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields = left.split()
                rfields = right.split()
                if len(fields) >= 5 and rfields:
                    mounts.append((fields[3], fields[4], rfields[0], rfields[-1]))
    except OSError:
        pass
    for version, want in ((1, v1_path), (2, v2_path)):
        if want is None:
            continue
        for root, point, fstype, opts in mounts:
            if version == 1 and not (fstype == "cgroup" and "memory" in opts.split(",")):
                continue
            if version == 2 and fstype != "cgroup2":
                continue
            rel = want
            if root != "/" and (want == root or want.startswith(root + "/")):
                rel = want[len(root):]
            candidate = os.path.join(point, rel.lstrip("/"))
            if os.path.isdir(candidate):
                return version, candidate
            if os.path.isdir(point):
                return version, point
    return None, None


def cgroup_memory() -> "jobfiles.CgroupMemory":
    """Memory limit, usage peak and OOM-kill count of this process's cgroup (v1 or v2)."""
    version, path = _cgroup_dirs()
    info = {"version": version, "path": path}  # type: jobfiles.CgroupMemory
    if path is None:
        return info
    if version == 2:
        info["limit_bytes"] = _read_int(os.path.join(path, "memory.max"))
        info["peak_bytes"] = _read_int(os.path.join(path, "memory.peak"))
        events = _read_keyed(os.path.join(path, "memory.events"))
        info["oom_kill"] = events.get("oom_kill")
        info["oom"] = events.get("oom")
    else:
        limit = _read_int(os.path.join(path, "memory.limit_in_bytes"))
        # v1 reports "no limit" as a huge page-rounded number.
        info["limit_bytes"] = limit if limit is not None and limit < (1 << 60) else None
        info["peak_bytes"] = _read_int(os.path.join(path, "memory.max_usage_in_bytes"))
        control = _read_keyed(os.path.join(path, "memory.oom_control"))
        info["oom_kill"] = control.get("oom_kill")
        info["failcnt"] = _read_int(os.path.join(path, "memory.failcnt"))
    return info
