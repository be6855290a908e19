"""Who runs a GPU process: user and command line from /proc, shared by the NVML and smi readers.

Python 3.6, standard library only. Lookups are cached per pid by ``ProcessNames`` and the cache
forgets pids that stop showing up, so a busy GPU costs two small /proc reads per new process,
not per sample.
"""

import pwd
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple

MAX_COMMAND = 200  # characters: enough to tell jobs apart, small enough for one sample line


def process_user(pid: int) -> Optional[str]:
    """Return the name of the real user running ``pid`` (uid as text if unnamed), or None."""
    try:
        with open("/proc/%d/status" % pid, "rb") as f:
            for line in f:
                if line.startswith(b"Uid:"):
                    uid = int(line.split()[1])
                    break
            else:
                return None
    except (OSError, ValueError, IndexError):
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def process_command(pid: int) -> Optional[str]:
    """Return the command line of ``pid`` (arguments joined by spaces, truncated), or None."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            raw = f.read(4 * MAX_COMMAND)
        if not raw.strip(b"\0"):  # a kernel thread or a zombie: fall back to its name
            with open("/proc/%d/comm" % pid, "rb") as f:
                raw = f.read(64).strip()
    except OSError:
        return None
    text = raw.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace").strip()
    if len(text) > MAX_COMMAND:
        text = text[: MAX_COMMAND - 3] + "..."
    return text or None


class ProcessNames(object):
    """Cache of (user, command) per pid; ``forget_except(pids)`` drops pids no longer seen."""

    def __init__(self) -> None:
        self._cache = {}  # type: Dict[int, Tuple[Optional[str], Optional[str]]]

    def lookup(self, pid: int) -> Tuple[Optional[str], Optional[str]]:
        """Return ``(user, command)`` for ``pid``; either may be None (pid in another namespace)."""
        hit = self._cache.get(pid)
        if hit is None:
            hit = (process_user(pid), process_command(pid))
            self._cache[pid] = hit
        return hit

    def forget_except(self, pids: Iterable[int]) -> None:
        """Drop cached pids not in ``pids`` (so a reused pid is looked up afresh)."""
        for pid in list(self._cache):
            if pid not in pids:
                del self._cache[pid]

    def rows(self, found: Dict[int, Optional[int]], seen: Set[int]) -> List[Dict[str, Any]]:
        """The sample's ``processes`` list for ``found`` (pid -> GPU memory in bytes or None),
        by pid, with user and command; every pid is added to ``seen``."""
        out = []  # type: List[Dict[str, Any]]
        for pid in sorted(found):
            seen.add(pid)
            user, command = self.lookup(pid)
            out.append({"pid": pid, "user": user, "command": command, "mem": found[pid]})
        return out
