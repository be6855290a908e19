"""Runs a command job's argv in VENV2. Pickled by value: VENV2 has no gpuctl installed.

The command is a child of VENV2's Python, in its process group and session: the supervisor's
cancel, time limit and memory limit (TERM, grace, KILL to the group; the session's summed RSS)
and its subreaper cover it as they cover a function's own children.
"""

from collections.abc import Sequence


def run_command(argv: Sequence[str], interactive: bool = False) -> int:
    """Run ``argv`` with VENV2's ``bin`` first on PATH (``python`` is VENV2's python) in the
    current folder, its stdout and stderr this process's (the job's files); return 0.

    Raises ``SystemExit`` with the command's exit status when it is not 0 (negative: the signal
    that ended it), ``FileNotFoundError`` or ``PermissionError`` naming the command when it
    cannot be started. Not ``interactive`` (on a node): stdin is /dev/null and this Python
    ignores the stop signals while the command runs, so that the command, which gets the same
    signals from the supervisor, decides how it ends and its status is the one recorded.
    ``interactive`` (the debug executor): the terminal's stdin, Ctrl-C as in a shell.
    """
    import contextlib
    import errno
    import os
    import shutil
    import signal
    import subprocess
    import sys

    env = dict(os.environ)
    bindir = os.path.dirname(sys.executable)
    env["PATH"] = os.pathsep.join(p for p in (bindir, env.get("PATH")) if p)
    if sys.prefix != sys.base_prefix:  # a venv: what its activate script would say
        env["VIRTUAL_ENV"] = sys.prefix
    env.setdefault("PYTHONUNBUFFERED", "1")  # a Python command's prints reach the log at once
    program = argv[0]
    if os.sep not in program and shutil.which(program, path=env["PATH"]) is None:
        raise FileNotFoundError(
            errno.ENOENT, f"command not found on VENV2's PATH (its {bindir} first)", program
        )
    stops = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    saved = {s: signal.getsignal(s) for s in stops} if not interactive else {}
    try:
        for s in saved:
            # a handler, not SIG_IGN: the command starts with the default again (exec resets it)
            signal.signal(s, lambda signum, frame: None)
        stdin = None if interactive else subprocess.DEVNULL
        with subprocess.Popen(list(argv), env=env, stdin=stdin) as child:
            rc = child.wait()
    finally:
        for s, handler in saved.items():
            with contextlib.suppress(TypeError, ValueError):
                signal.signal(s, handler)
    if rc != 0:
        raise SystemExit(rc)
    return 0
