"""Real processes for the process-view tests: ``sleep``s of this user and of a second Unix user.

``started_processes`` (a fixture's body) starts processes, each in its own session, and kills
what is left after the test;
``other_user`` is a second Unix user, made with ``useradd`` when missing (root only: the test
skips with the reason otherwise); ``as_user`` is the argv prefix that runs a command as that user
(``setpriv``, which execs: the pid is the command's).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from collections.abc import Callable, Iterator

import pytest

OTHER_USER = "gpuctl-other"
Start = Callable[..., "subprocess.Popen[bytes]"]


def started_processes() -> Iterator[Start]:
    """For a fixture: yields ``start(*argv)``, which starts a process (``start("sleep",
    "300")``); every one still running is killed after."""
    started: list[subprocess.Popen[bytes]] = []

    def start(*argv: str) -> subprocess.Popen[bytes]:
        p = subprocess.Popen(argv, start_new_session=True)
        started.append(p)
        return p

    yield start
    for p in started:
        if p.poll() is None:
            os.killpg(p.pid, 9)
            p.wait(5)


def other_user() -> pwd.struct_passwd:
    """A second Unix user for "another user's process"; made with useradd when missing."""
    if os.geteuid() != 0:
        pytest.skip("needs root: another user's process is a sleep of a second Unix user")
    for tool in ("useradd", "setpriv"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is missing: cannot run a process as a second Unix user")
    try:
        return pwd.getpwnam(OTHER_USER)
    except KeyError:
        pass
    subprocess.run(
        ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", OTHER_USER],
        check=True,
        capture_output=True,
    )
    return pwd.getpwnam(OTHER_USER)


def as_user(user: pwd.struct_passwd) -> list[str]:
    """The argv prefix that runs a command as ``user`` (setpriv execs it: same pid)."""
    return ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups"]
