"""Agent plugin: run the acceptance suite on this node and relay its progress (protocol v1).

Requests
    accept_start  ``python`` (VENV2 interpreter; default this one), ``args`` (list of suite
                  options such as ``--quick``, ``--device cpu``; ``--device sim`` on simulated
                  GPUs: the agent passes the suite their state, ``--sim-facts``), ``timeout``
                  (s, default 3600)
                  -> ok {request, id, run, pid} | error busy / bad_argument / spawn_failed
    accept_stop   -> ok (the running suite, if any, is terminated; its exit event follows)

Events (``{"type": "event", "kind": "accept", "gpu": null, "t", "detail": {...}}``)
    ``detail.run`` names the run; ``detail.event`` is what the suite wrote on its progress
    descriptor (``start``, ``section`` with ``state`` start/end and ``verdict``, ``line``,
    ``result``) and finally ``exit``: ``rc``, ``report`` (the JSON report as an object, or null),
    ``reason`` (why there is no report, or null), ``stdout_tail`` and ``stderr_tail``.

The suite runs as ``python -m gpuctl.workloads.accept_suite`` with this bundle on PYTHONPATH,
started by ``proc.spawn`` (its own session, SIGTERM as its parent-death signal): when the agent
stops (stdin closed, link lost, liveness timeout) the close hook stops it and everything it started.

Its report and output go to a private folder ``$TMPDIR/gpuctl-accept-*`` (mode 0700), removed
once the exit event is built, or when the agent stops. The agent holds a lock on
``owner.lock`` in that folder for as long as the run lives; an agent that was SIGKILLed cannot
remove its folder, so every agent, when it starts, removes the folders of this user whose lock
nobody holds any more. Standard library only, Python 3.6 syntax.
"""

import fcntl
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, cast

from . import proc, protocol

if TYPE_CHECKING:
    from .agent import Agent
    from .messages import AcceptEvent, AcceptStarted

_OWNED = ("--report-dir", "--report-name", "--events", "--events-fd", "--sim-facts")
SIM_FACTS_NAME = "sim-facts.json"
TAIL_LINES = 20
FOLDER_PREFIX = "gpuctl-accept-"
LOCK_NAME = "owner.lock"
REPORT_NAME = "report.json"
OUT_NAME = "suite-out.log"
ERR_NAME = "suite-err.log"
CLOSE_GRACE_S = 1.0  # SIGTERM -> SIGKILL when the agent itself is going away


def _tail(path: str, lines: int = TAIL_LINES) -> List[str]:
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 16384))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    return text.splitlines()[-lines:]


class RunFolder(object):
    """A run's private folder, locked by this process while it exists (see the module
    docstring)."""

    def __init__(self) -> None:
        self.path = tempfile.mkdtemp(prefix=FOLDER_PREFIX)  # mode 0700
        self._lock = None  # type: Optional[int]
        try:
            fd = os.open(os.path.join(self.path, LOCK_NAME), os.O_WRONLY | os.O_CREAT, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self._lock = fd  # not inherited by the suite: Python's descriptors are CLOEXEC
        except OSError:
            shutil.rmtree(self.path, ignore_errors=True)
            raise

    def join(self, name: str) -> str:
        return os.path.join(self.path, name)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None


def sweep_orphan_folders(root: Optional[str] = None) -> List[str]:
    """Remove this user's ``gpuctl-accept-*`` folders in ``root`` (default the temporary folder)
    whose owner is gone (nobody holds their lock). Returns the folders removed."""
    root = root or tempfile.gettempdir()
    removed = []  # type: List[str]
    try:
        names = os.listdir(root)
    except OSError:
        return removed
    uid = os.getuid()
    for name in names:
        if not name.startswith(FOLDER_PREFIX):
            continue
        path = os.path.join(root, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if st.st_uid != uid or not os.path.isdir(path) or os.path.islink(path):
            continue
        try:
            fd = os.open(os.path.join(path, LOCK_NAME), os.O_RDONLY)
        except FileNotFoundError:
            fd = None  # made by an older agent (no lock) or half made: nobody owns it
        except OSError:
            continue
        try:
            if fd is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    continue  # a live agent's run
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        finally:
            if fd is not None:
                os.close(fd)
    return removed


class AcceptRun(object):
    """One running suite: its process, progress pipe and private folder."""

    def __init__(self, plugin: "AcceptPlugin", run_id: str, argv: List[str],
                 env: Dict[str, str], folder: RunFolder, deadline: float) -> None:
        self.plugin = plugin
        self.run_id = run_id
        self.folder = folder
        self.deadline = deadline
        self.events = proc.JsonLines()
        self.killed_reason = None  # type: Optional[str]
        read_fd, write_fd = os.pipe()
        self.out_path = folder.join(OUT_NAME)
        self.err_path = folder.join(ERR_NAME)
        argv = argv + ["--events-fd", str(write_fd), "--report-dir", folder.path,
                       "--report-name", REPORT_NAME]
        try:
            with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
                self.proc = proc.spawn(argv, stdout=out, stderr=err, env=env,
                                       pass_fds=(write_fd,), death_signal=signal.SIGTERM)
        except OSError:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        self.pipe = os.fdopen(read_fd, "rb", buffering=0)  # type: Optional[Any]
        plugin.agent.add_reader(self.pipe, self.on_readable)

    def send(self, detail: "AcceptEvent") -> None:
        detail["run"] = self.run_id
        self.plugin.agent.send(protocol.event_message("accept", None, detail))

    def on_readable(self) -> None:
        if self.pipe is None:
            return
        try:
            data = self.pipe.read(65536)
        except OSError:
            data = b""
        if not data:
            self.plugin.agent.remove_reader(self.pipe)
            self.pipe.close()
            self.pipe = None
            self._relay(self.events.finish())
            return
        self._relay(self.events.feed(data))

    def _relay(self, details: List[Dict[str, Any]]) -> None:
        # the suite's progress lines, as it wrote them: AcceptEvent's keys (a test checks them)
        for detail in details:
            self.send(cast("AcceptEvent", detail))

    def kill(self, reason: str) -> None:
        if self.proc.poll() is None:
            self.killed_reason = reason
            proc.signal_group(self.proc.pid, signal.SIGTERM)

    def poll(self, now: float) -> bool:
        """True once the suite has exited and its exit event has been sent."""
        if self.proc.poll() is None:
            if now > self.deadline:
                self.kill("timed out")
            return False
        if self.pipe is not None:  # drain what the suite wrote before it exited
            self.on_readable()
            if self.pipe is not None:
                return False
        # whatever the suite left in its session (torchrun workers)
        proc.signal_group(self.proc.pid, signal.SIGKILL)
        report, reason = None, self.killed_reason
        path = self.folder.join(REPORT_NAME)
        try:
            with open(path) as f:
                report = json.load(f)
        except (OSError, ValueError) as e:
            if reason is None:
                reason = "the suite wrote no report (exit %s): %s" % (self.proc.returncode, e)
        detail = {"event": "exit", "rc": self.proc.returncode, "report": report,
                  "reason": reason, "stdout_tail": _tail(self.out_path),
                  "stderr_tail": _tail(self.err_path)}  # type: AcceptEvent
        self.folder.remove()  # before the news: nothing left behind
        self.send(detail)
        return True

    def close(self) -> None:
        """The agent is going away: stop the suite's whole session and remove the folder."""
        self.killed_reason = self.killed_reason or "agent stopped"
        if self.pipe is not None:
            self.plugin.agent.remove_reader(self.pipe)
            self.pipe.close()
            self.pipe = None
        proc.stop_group(self.proc.pid, CLOSE_GRACE_S, self.proc)
        self.folder.remove()


def _option(args: List[str], name: str) -> Optional[str]:
    """The value of option ``name`` in ``args`` (``--name V`` or ``--name=V``), or None."""
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


class AcceptPlugin(object):
    def __init__(self, agent: "Agent") -> None:
        self.agent = agent
        self.run = None  # type: Optional[AcceptRun]
        self.counter = 0
        agent.handlers["accept_start"] = self.start
        agent.handlers["accept_stop"] = self.stop
        agent.tick_hooks.append(self.tick)
        agent.close_hooks.append(self.close)

    def start(self, msg: Dict[str, Any], req_id: Any) -> None:
        if self.run is not None:
            self.agent.reply_error("busy", "an acceptance run is already going on this node",
                                   req_id)
            return
        args = msg.get("args") or []
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            self.agent.reply_error("bad_argument", "args must be a list of strings", req_id)
            return
        owned = [a for a in args if a.split("=", 1)[0] in _OWNED]
        if owned:
            self.agent.reply_error("bad_argument", "the agent sets %s itself" % owned[0], req_id)
            return
        python = msg.get("python") or sys.executable
        timeout = msg.get("timeout", 3600)
        if not isinstance(python, str) or isinstance(timeout, bool) \
                or not isinstance(timeout, (int, float)) or timeout <= 0:
            self.agent.reply_error("bad_argument", "python must be a path, timeout > 0", req_id)
            return
        facts = None  # type: Any
        if _option(args, "--device") == "sim":
            read = getattr(self.agent.reader, "accept_facts", None)
            if read is None:
                self.agent.reply_error("bad_argument", "--device sim needs simulated GPUs "
                                       "(gpuctl demo)", req_id)
                return
            facts = read()
        self.counter += 1
        run_id = "%d-%d" % (os.getpid(), self.counter)
        argv = [python, "-m", "gpuctl.workloads.accept_suite"] + args
        try:
            folder = RunFolder()
        except OSError as e:
            self.agent.reply_error("spawn_failed", "no private folder for the run: %s" % (e,),
                                   req_id)
            return
        try:
            if facts is not None:  # a simulated run judges the simulated GPUs as they are now
                with open(folder.join(SIM_FACTS_NAME), "w") as f:
                    json.dump(facts, f)
                argv += ["--sim-facts", folder.join(SIM_FACTS_NAME)]
            # TMPDIR: what the suite makes there (DDP rank files) goes with the folder
            env = proc.bundle_env({"TMPDIR": folder.path})
            self.run = AcceptRun(self, run_id, argv, env, folder, time.monotonic() + timeout)
        except OSError as e:
            folder.remove()
            self.agent.reply_error("spawn_failed", "cannot start %s: %s" % (python, e), req_id)
            return
        started = {"type": "ok", "request": "accept_start", "id": req_id, "run": run_id,
                   "pid": self.run.proc.pid}  # type: AcceptStarted
        self.agent.send(started)

    def stop(self, msg: Dict[str, Any], req_id: Any) -> None:
        if self.run is not None:
            self.run.kill("stopped by request")
        self.agent.send({"type": "ok", "request": "accept_stop", "id": req_id})

    def tick(self, now: float) -> None:
        if self.run is not None and self.run.poll(now):
            self.run = None

    def close(self) -> None:
        if self.run is not None:
            self.run.close()
            self.run = None


def install(agent: "Agent") -> None:
    """Add ``accept_start`` / ``accept_stop`` to ``agent``; remove the folders of runs whose
    agent was killed."""
    sweep_orphan_folders()
    AcceptPlugin(agent)

