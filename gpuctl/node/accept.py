"""Agent plugin: run the acceptance suite on this node and relay its progress (protocol v1).

Requests
    accept_start  ``python`` (VENV2 interpreter; default this one), ``args`` (list of suite
                  options such as ``--quick``, ``--device cpu``), ``timeout`` (s, default 3600)
                  -> ok {request, id, run, pid} | error busy / bad_argument / spawn_failed
    accept_stop   -> ok (the running suite, if any, is terminated; its exit event follows)

Events (``{"type": "event", "kind": "accept", "gpu": null, "t", "detail": {...}}``)
    ``detail.run`` names the run; ``detail.event`` is what the suite wrote on its progress
    descriptor (``start``, ``section`` with ``state`` start/end and ``verdict``, ``line``,
    ``result``) and finally ``exit``: ``rc``, ``report`` (the JSON report as an object, or null),
    ``reason`` (why there is no report, or null), ``stdout_tail`` and ``stderr_tail``.

The suite runs as ``python -m gpuctl.workloads.accept`` with this bundle on PYTHONPATH, in its
own session, with a parent-death signal: when the agent stops (stdin closed, link lost) the
close hook kills it and everything it started. Its report is written to a private temporary
folder, relayed in the ``exit`` event, then removed. Standard library only, Python 3.6 syntax.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from . import protocol

# The folder that holds the ``gpuctl`` package (a checkout, site-packages or the .pyz itself).
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_OWNED = ("--report-dir", "--report-name", "--events", "--events-fd")
TAIL_LINES = 20


def _die_with_parent():
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _tail(path, lines=TAIL_LINES):
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 16384))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    return text.splitlines()[-lines:]


class AcceptRun(object):
    """One running suite: its process, progress pipe and private folder."""

    def __init__(self, plugin, run_id, argv, env, folder, deadline):
        self.plugin = plugin
        self.run_id = run_id
        self.folder = folder
        self.deadline = deadline
        self.report_path = None
        self.buf = b""
        self.killed_reason = None
        read_fd, write_fd = os.pipe()
        self.out_path = os.path.join(folder, "stdout.txt")
        self.err_path = os.path.join(folder, "stderr.txt")
        argv = argv + ["--events-fd", str(write_fd), "--report-dir", folder,
                       "--report-name", "report.json"]
        try:
            with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
                self.proc = subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env,
                    pass_fds=(write_fd,), start_new_session=True, preexec_fn=_die_with_parent,
                    close_fds=True)
        except OSError:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        self.pipe = os.fdopen(read_fd, "rb", buffering=0)
        plugin.agent.add_reader(self.pipe, self.on_readable)

    def send(self, detail):
        detail["run"] = self.run_id
        self.plugin.agent.send({"type": "event", "kind": "accept", "gpu": None,
                                "t": time.time(), "detail": detail})

    def on_readable(self):
        try:
            data = self.pipe.read(65536)
        except OSError:
            data = b""
        if not data:
            self.plugin.agent.remove_reader(self.pipe)
            self.pipe.close()
            self.pipe = None
            return
        self.buf += data
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            if len(line) > protocol.MAX_LINE // 2:
                continue
            try:
                detail = json.loads(line.decode("utf-8", "replace"))
            except ValueError:
                continue
            if not isinstance(detail, dict):
                continue
            if detail.get("event") == "result":
                self.report_path = detail.get("report")
            self.send(detail)

    def kill(self, reason):
        if self.proc.poll() is None:
            self.killed_reason = reason
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except OSError:
                pass

    def force_kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass

    def poll(self, now):
        """True once the suite has exited and its exit event has been sent."""
        if self.proc.poll() is None:
            if now > self.deadline:
                self.kill("timed out")
            return False
        if self.pipe is not None:  # drain what the suite wrote before it exited
            self.on_readable()
            if self.pipe is not None:
                return False
        self.force_kill()  # whatever the suite left in its session (torchrun workers)
        report, reason = None, self.killed_reason
        path = self.report_path or os.path.join(self.folder, "report.json")
        try:
            with open(path) as f:
                report = json.load(f)
        except (OSError, ValueError) as e:
            if reason is None:
                reason = "the suite wrote no report (exit %s): %s" % (self.proc.returncode, e)
        detail = {"event": "exit", "rc": self.proc.returncode, "report": report,
                  "reason": reason, "stdout_tail": _tail(self.out_path),
                  "stderr_tail": _tail(self.err_path)}
        shutil.rmtree(self.folder, ignore_errors=True)  # before the news: nothing left behind
        self.send(detail)
        return True


class AcceptPlugin(object):
    def __init__(self, agent):
        self.agent = agent
        self.run = None
        self.counter = 0
        agent.handlers["accept_start"] = self.start
        agent.handlers["accept_stop"] = self.stop
        agent.tick_hooks.append(self.tick)
        agent.close_hooks.append(self.close)

    def start(self, msg, req_id):
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
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, env.get("PYTHONPATH")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        self.counter += 1
        run_id = "%d-%d" % (os.getpid(), self.counter)
        folder = tempfile.mkdtemp(prefix="gpuctl-accept-")  # mode 0700
        argv = [python, "-m", "gpuctl.workloads.accept"] + args
        try:
            self.run = AcceptRun(self, run_id, argv, env, folder, time.monotonic() + timeout)
        except OSError as e:
            shutil.rmtree(folder, ignore_errors=True)
            self.agent.reply_error("spawn_failed", "cannot start %s: %s" % (python, e), req_id)
            return
        self.agent.send({"type": "ok", "request": "accept_start", "id": req_id, "run": run_id,
                         "pid": self.run.proc.pid})

    def stop(self, msg, req_id):
        if self.run is not None:
            self.run.kill("stopped by request")
        self.agent.send({"type": "ok", "request": "accept_stop", "id": req_id})

    def tick(self, now):
        if self.run is not None and self.run.poll(now):
            self.run = None

    def close(self):
        if self.run is not None:
            self.run.kill("agent stopped")
            self.run.force_kill()
            if self.run.pipe is not None:
                self.agent.remove_reader(self.run.pipe)
            try:
                self.run.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
            shutil.rmtree(self.run.folder, ignore_errors=True)
            self.run = None


def install(agent):
    """Add ``accept_start`` / ``accept_stop`` to ``agent``."""
    AcceptPlugin(agent)
