"""The node agent: reads GPUs and speaks protocol v1 (see ``protocol``) on stdin/stdout.

One thread, one ``selectors`` loop over stdin and whatever file descriptors plugins add (burner
output pipes): no locks, and the agent's CPU cost is one read per interval. The agent never dies
on bad input; it exits when stdin closes, on ``shutdown``, or when stdout is gone, and before
exiting it runs every plugin's close hook (which stops burners: the dead-man's switch).
"""

import os
import selectors
import socket
import sys
import time

from . import protocol
from .readers import open_reader

# Node-side modules that add requests to the agent: each has install(agent). Missing ones are
# skipped so that an agent can run from a bundle built before they existed.
PLUGINS = ("gpuctl.node.stress", "gpuctl.node.accept")

# Requests that change a node (load its GPUs, stop other sessions' work). An agent started with
# --read-only refuses them with error code "read_only", whatever the login side asks: defence in
# depth behind the CLI's and the TUI's own refusal. Plugins add their own names to
# ``agent.mutating``; these are known up front so that a plugin forgetting to does not matter.
MUTATING = ("stress_start", "stress_stop", "accept_start", "accept_stop")


class Agent(object):
    """The agent's state and loop. ``out`` is a binary file; ``in_fd`` a readable descriptor."""

    def __init__(self, reader, reader_error=None, interval=1.0, in_fd=0, out=None,
                 clock=time.monotonic, read_only=False):
        self.reader = reader
        self.read_only = bool(read_only)
        self.mutating = set(MUTATING)
        self.reader_error = reader_error
        self.interval = float(interval)
        self.in_fd = in_fd
        self.out = out if out is not None else sys.stdout.buffer
        self.clock = clock
        self.seq = 0
        self.running = True
        self.handlers = {
            "ping": self._ping,
            "set_interval": self._set_interval,
            "snapshot": self._snapshot,
            "shutdown": self._shutdown,
        }
        if reader is not None and hasattr(reader, "simulate"):
            self.handlers["simulate"] = self._simulate
        self.tick_hooks = []  # called once per loop turn with the current monotonic time
        self.close_hooks = []  # called once when the agent stops
        self.sample_hooks = []  # called with each sample's gpu list, may annotate it
        # poll, not epoll: epoll refuses regular files and /dev/null, which stdin may be.
        self._sel = getattr(selectors, "PollSelector", selectors.SelectSelector)()
        self._buf = bytearray()
        self._discarding = False
        self._static = reader.static() if reader is not None else []
        self._next_sample = self.clock()

    # -- output ------------------------------------------------------------------------------
    def send(self, msg):
        """Write one message; a vanished reader (BrokenPipe) stops the agent."""
        try:
            self.out.write(protocol.encode(msg))
            self.out.flush()
        except (BrokenPipeError, ValueError, OSError):
            self.running = False

    def reply_error(self, code, message, req_id=None):
        self.send(protocol.error(code, message, req_id))

    # -- plugin API ---------------------------------------------------------------------------
    def add_reader(self, fileobj, callback):
        """Call ``callback()`` whenever ``fileobj`` (fd or file) is readable."""
        self._sel.register(fileobj, selectors.EVENT_READ, callback)

    def remove_reader(self, fileobj):
        try:
            self._sel.unregister(fileobj)
        except (KeyError, ValueError):
            pass

    # -- messages -----------------------------------------------------------------------------
    def hello(self):
        versions = self.reader.versions() if self.reader is not None else {}
        return {
            "type": "hello",
            "protocol": protocol.PROTOCOL_VERSION,
            "agent": protocol.AGENT_VERSION,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "python": "%d.%d.%d" % sys.version_info[:3],
            "interval": self.interval,
            "reader": self.reader.name if self.reader is not None else None,
            "reader_error": self.reader_error,
            "driver": versions.get("driver"),
            "cuda": versions.get("cuda"),
            "nvml": versions.get("nvml"),
            "features": sorted(self.handlers),
            "read_only": self.read_only,
            "gpus": self._static,
        }

    def sample(self, req_id=None):
        gpus = []
        if self.reader is not None:
            slow = self.seq % protocol.SLOW_EVERY == 0
            try:
                gpus = self.reader.sample(slow=slow)
            except Exception as e:  # a reader bug must not kill the agent: say it, keep going
                self.reply_error("reader_failed", "%s: %s" % (type(e).__name__, e))
                return
        for hook in self.sample_hooks:
            hook(gpus)
        msg = {"type": "sample", "t": time.time(), "seq": self.seq, "gpus": gpus}
        if req_id is not None:
            msg["id"] = req_id
        self.seq += 1
        self.send(msg)
        if self.reader is not None:
            for event in self.reader.events():
                self.send(event)

    def handle_line(self, line):
        try:
            msg = protocol.decode(line)
        except protocol.ProtocolError as e:
            self.reply_error(e.code, e.message)
            return
        req_id = msg.get("id")
        if isinstance(req_id, (dict, list)):
            req_id = None
        handler = self.handlers.get(msg["type"])
        if handler is None:
            self.reply_error("unknown_request", "unknown request type %r" % (msg["type"][:80],),
                             req_id)
            return
        if self.read_only and msg["type"] in self.mutating:
            self.reply_error("read_only", "%s refused: this agent runs read-only (started with "
                             "--read-only; gpuctl passes it when read_only is set)"
                             % (msg["type"],), req_id)
            return
        try:
            handler(msg, req_id)
        except Exception as e:  # a handler bug is reported, never fatal
            self.reply_error("internal", "%s failed: %s: %s" % (msg["type"], type(e).__name__, e),
                             req_id)

    def _ping(self, msg, req_id):
        self.send({"type": "pong", "id": req_id, "t": time.time()})

    def _set_interval(self, msg, req_id):
        seconds = msg.get("seconds")
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) \
                or not 0.1 <= seconds <= 3600:
            self.reply_error("bad_argument", "set_interval needs seconds within 0.1..3600", req_id)
            return
        self.interval = float(seconds)
        self._next_sample = self.clock() + self.interval
        self.send({"type": "ok", "request": "set_interval", "id": req_id})

    def _snapshot(self, msg, req_id):
        self.sample(req_id)

    def _shutdown(self, msg, req_id):
        self.send({"type": "bye", "id": req_id})
        self.running = False

    def _simulate(self, msg, req_id):
        try:
            self.reader.simulate(msg.get("action"), msg)
        except (ValueError, TypeError) as e:
            self.reply_error("bad_argument", str(e), req_id)
            return
        self.send({"type": "ok", "request": "simulate", "id": req_id})

    # -- input --------------------------------------------------------------------------------
    def _on_stdin(self):
        try:
            data = os.read(self.in_fd, 1 << 16)
        except OSError:
            data = b""
        if not data:
            self.running = False
            return
        self._buf.extend(data)
        while True:
            nl = self._buf.find(b"\n")
            if nl < 0:
                if len(self._buf) > protocol.MAX_LINE:
                    if not self._discarding:
                        self.reply_error("line_too_long",
                                         "line exceeds %d bytes; discarded" % protocol.MAX_LINE)
                    self._discarding = True
                    del self._buf[:]
                return
            line = bytes(self._buf[:nl])
            del self._buf[:nl + 1]
            if self._discarding:  # the tail of an overlong line
                self._discarding = False
                continue
            if line.strip():
                self.handle_line(line)
            if not self.running:
                return

    # -- loop ---------------------------------------------------------------------------------
    def run(self):
        """Send hello, then sample every interval until stopped. Returns the exit code."""
        self.add_reader(self.in_fd, self._on_stdin)
        self.send(self.hello())
        if self.reader is None:
            self.reply_error("no_reader", self.reader_error or "no GPU reader available")
        try:
            while self.running:
                now = self.clock()
                if self.reader is not None and now >= self._next_sample:
                    self.sample()
                    # Keep the cadence: skip missed ticks rather than bursting to catch up.
                    self._next_sample += self.interval
                    if self._next_sample <= now:
                        self._next_sample = now + self.interval
                for hook in self.tick_hooks:
                    hook(now)
                timeout = max(0.0, self._next_sample - self.clock())
                if self.reader is None:
                    timeout = 1.0
                for key, _ in self._sel.select(min(timeout, 1.0)):
                    key.data()
                    if not self.running:
                        break
        finally:
            for hook in self.close_hooks:
                try:
                    hook()
                except Exception:
                    pass
            if self.reader is not None:
                self.reader.close()
        return 0


def install_plugins(agent, names=PLUGINS):
    """Import each plugin module and call its ``install(agent)``; missing modules are skipped."""
    import importlib

    for name in names:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        module.install(agent)


def main(argv):
    """``agent [--simulate SPEC] [--interval S] [--seed N] [--read-only]``; returns the exit
    code."""
    import argparse

    p = argparse.ArgumentParser(prog="gpuctl-node agent", description="gpuctl node agent")
    p.add_argument("--simulate", metavar="N[:MODEL]", help="simulated GPUs, e.g. 8 or 8:H100")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    p.add_argument("--seed", type=int, default=0, help="seed of the simulated GPUs")
    p.add_argument("--read-only", action="store_true",
                   help="refuse requests that change the node (stress, acceptance runs)")
    args = p.parse_args(argv)
    if not 0.1 <= args.interval <= 3600:
        p.error("--interval must be within 0.1..3600 seconds")
    try:
        reader, reason = open_reader(args.simulate, seed=args.seed)
    except ValueError as e:
        p.error(str(e))
    agent = Agent(reader, reason, interval=args.interval, read_only=args.read_only)
    install_plugins(agent)
    return agent.run()
