"""Real-parts test infrastructure: OpenSSH servers and a one-node Slurm, started per test.

- ``sshd.SshCluster``: real ``/usr/sbin/sshd`` instances on 127.0.0.1, one per "node", with an
  OpenSSH ``ssh_config`` and ``known_hosts`` the client side (OpenSSH or asyncssh) can use.
- ``slurm.SlurmCluster``: a private munged + slurmctld + slurmd under a temporary folder.

Fixtures ``ssh_cluster`` and ``slurm_cluster`` in ``gpuctl_tests/conftest.py`` wrap them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path

# The user's pyenv, found once at import, before the test session sets a HOME of its own.
_HOME_PYENV = Path.home() / ".pyenv"


class HarnessError(RuntimeError):
    """A daemon did not start; the message carries the tail of its log."""


def log_tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file, or a note that it is missing."""
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        return f"(no log at {path}: {e.strerror})"
    return "\n".join(text.splitlines()[-lines:]) or f"(empty log {path})"


def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name may hold spaces and parentheses: fields start after the last ")"
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def all_pids() -> list[int]:
    """Every process id visible in /proc."""
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def descendants(roots: Iterable[int]) -> set[int]:
    """``roots`` and every process below them, from /proc parent links."""
    children: dict[int, list[int]] = {}
    for pid in all_pids():
        parent = _ppid(pid)
        if parent is not None:
            children.setdefault(parent, []).append(pid)
    found: set[int] = set()
    todo = [r for r in roots if Path(f"/proc/{r}").exists()]
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        found.add(pid)
        todo.extend(children.get(pid, ()))
    return found


def pids_with_env(token: str) -> set[int]:
    """Processes whose environment holds ``token`` (a ``NAME=value`` string).

    Session processes that daemonise or are reparented to init keep their environment, so this
    finds what a /proc parent walk misses.
    """
    needle = token.encode() + b"\0"
    found: set[int] = set()
    for pid in all_pids():
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if (b"\0" + env).find(b"\0" + needle) >= 0:
            found.add(pid)
    return found


def is_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def kill_pids(pids: Iterable[int], sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to each pid, ignoring those already gone."""
    for pid in pids:
        if pid == os.getpid():
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def wait_gone(pids: Iterable[int], timeout: float) -> set[int]:
    """Wait until none of ``pids`` is alive; returns those still alive at the deadline."""
    left = set(pids)
    deadline = time.monotonic() + timeout
    while True:
        left = {p for p in left if is_alive(p)}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.01)  # poll interval; the deadline decides


def cmdline(pid: int) -> str:
    """The command line of ``pid`` with spaces between arguments ("" when gone)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def clear_pyenv_lock_after_kill(killed_cmdlines: Iterable[str]) -> None:
    """Remove pyenv's rehash lock when we killed the ``pyenv rehash`` that held it.

    A session whose shell runs ``pyenv init`` (root's ~/.bashrc here) takes
    ``$PYENV_ROOT/shims/.pyenv-shim`` as a lock; SIGKILL leaves it behind and every later shell
    of this user then waits 60 s for it. Only removed while no rehash is running.
    """
    if not any("pyenv-rehash" in c for c in killed_cmdlines):
        return
    if any("pyenv-rehash" in cmdline(p) for p in all_pids()):
        return
    root = Path(os.environ.get("PYENV_ROOT") or _HOME_PYENV)
    with contextlib.suppress(OSError):
        (root / "shims" / ".pyenv-shim").unlink()
