"""The supervisor's keeper: the process a backend starts, in front of the supervisor.

See ``keep``. It shares the job's signals with the supervisor: ``STOPPING`` (a cancel) and
``FORWARDED`` (Slurm's warning, stack dumps), which it forwards to the supervisor, which
forwards the latter to VENV2. Standard library only, Python 3.6.
"""

import os
import signal
import socket
import time
from typing import TYPE_CHECKING, Any, Callable

from . import jobfiles, proc
from .rendezvous import task_folder

if TYPE_CHECKING:
    from typing import Protocol  # novm (3.8+: only mypy reads this block; the node runs 3.6)

    class Supervisor(Protocol):
        """What the keeper asks of the supervisor (``supervisor.Supervisor``): a type of its
        own, so that the keeper, which the supervisor imports, imports nothing back."""

        def install_signals(self) -> None: ...

        def run(self) -> "jobfiles.Outcome": ...

# The job's signals: a cancel, and what the supervisor forwards to VENV2's python alone.
FORWARDED = ("SIGUSR1", "SIGUSR2")
STOPPING = ("SIGTERM", "SIGINT", "SIGHUP")


def keep(jobdir: str, supervisor: "Callable[[str], Supervisor]") -> int:
    """Run the supervisor (``supervisor(jobdir).run()``) in a forked child and stay in front of it as a child subreaper.

    What a SIGKILL to the supervisor (an admin's ``kill -9``, the OOM killer) would leave behind,
    the keeper ends: VENV2 dies of its parent-death signal, and the processes the function
    started (data loaders, servers, daemons in sessions of their own) reparent here, the nearest
    subreaper left. The keeper then kills every descendant and, when the supervisor wrote no
    outcome, writes one that names the signal, so the report says what happened instead of
    "lost". Signals meant for the job (a cancel's SIGTERM, Slurm's USR1 warning) are forwarded to
    the supervisor; the supervisor gets SIGTERM (a cancel) if the keeper dies. Returns the exit
    status for ``main``. Where a process cannot become a subreaper the supervisor runs in this
    process. ``supervisor`` is the class (``supervisor.Supervisor``): passed in, as the
    supervisor's module is a script in a job folder, not a module of the package beside it.
    """
    if not proc.become_subreaper():
        outcome = supervisor(jobdir).run()
        return 0 if outcome.get("exit_code") == 0 else 1
    names = STOPPING + FORWARDED
    sigs = set(getattr(signal, n) for n in names)
    # Blocked across the fork: a signal that arrives meanwhile waits for the right handler.
    signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    keeper = os.getpid()
    child = os.fork()
    if child == 0:
        code = 1
        try:
            sup = supervisor(jobdir)
            sup.install_signals()
            signal.pthread_sigmask(signal.SIG_UNBLOCK, sigs)
            proc.set_death_signal(signal.SIGTERM, parent=keeper)
            code = 0 if sup.run().get("exit_code") == 0 else 1
        finally:
            os._exit(code)

    def forward(signum: int, frame: Any) -> None:
        try:
            os.kill(child, signum)
        except OSError:
            pass

    for name in names:
        signal.signal(getattr(signal, name), forward)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, sigs)
    status = 0
    while True:
        try:
            pid, status = os.waitpid(-1, 0)  # reaps the orphans that reparent here, too
        except ChildProcessError:
            break
        if pid == child:
            break
    for name in names:
        signal.signal(getattr(signal, name), signal.SIG_DFL)
    left = proc.kill_descendants()
    try:  # one task of several writes in its rank's folder, as its supervisor did
        jobdir = task_folder(os.path.abspath(jobdir), {})
    except OSError:
        pass
    outcome_path = os.path.join(os.path.abspath(jobdir), jobfiles.OUTCOME)
    requeue = os.path.join(os.path.abspath(jobdir), jobfiles.REQUEUE)
    if os.WIFSIGNALED(status) and not os.path.exists(outcome_path) and not os.path.exists(
            requeue):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = "signal %d" % sig
        beat = jobfiles.read_json(os.path.join(os.path.abspath(jobdir), jobfiles.HEARTBEAT), {})
        killed = {
            "supervisor_killed": {"signal": name, "pid": child,
                                  "last_heartbeat": (beat or {}).get("t")},
            "phase": "supervisor", "keeper_pid": keeper, "hostname": socket.gethostname(),
            "exit_code": None, "signal_name": None, "descendants_killed": len(left),
            "ended_at": time.time(), "slurm_job_id": os.environ.get("SLURM_JOB_ID")
        }  # type: jobfiles.Outcome
        jobfiles.write_json(outcome_path, killed)
        return 1
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1
