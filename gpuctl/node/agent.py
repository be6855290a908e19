"""The node agent: reads GPUs and speaks protocol v2 (see ``protocol``) on stdin/stdout.

One thread, one ``selectors`` loop over stdin and whatever file descriptors plugins add (burner
output pipes): no locks, and the agent's CPU cost is one read per interval. The agent never dies
on bad input; it exits when stdin closes, on ``shutdown``, on SIGTERM/SIGHUP, when stdout is
gone, or when it has heard nothing on stdin for ``liveness_timeout`` seconds (the login side
pings; a frozen or partitioned login is not reported by the kernel, so silence is the only
sign). Before exiting it runs every plugin's close hook, which stops burners and suites: the
dead-man's switch.

Started with ``addressed`` (one srun step carrying the agents of many nodes, all reading the
same stdin; see ``protocol``), it acts on and hears only the lines addressed to its node, and
writes long messages as pieces.

Its output never blocks the loop: on a pipe or a socket, stdout is made non-blocking and what
the reader has not taken yet waits in a bounded queue (messages past ``OUT_LIMIT`` are dropped
whole), so a reader that stopped reading cannot stop the liveness check.
"""

import os
import select
import selectors
import signal
import socket
import stat
import sys
import time
import zlib
from typing import IO, TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence, Set

from . import protocol
from .proc import LineBuffer, boot_time
from .readers import Reader, bindings, host, open_reader

if TYPE_CHECKING:
    from .messages import Hello, SignalReply

# Requests that change a node (load its GPUs, stop other sessions' work). An agent started with
# --read-only refuses them with error code "read_only", whatever the login side asks: defence in
# depth behind the CLI's and the TUI's own refusal. Plugins add their own names to
# ``agent.mutating``; these are known up front so that a plugin forgetting to does not matter.
MUTATING = ("stress_start", "stress_stop", "accept_start", "accept_stop", "signal")

OUT_LIMIT = 8 << 20  # bytes queued for a reader that does not read; past it messages are dropped
DRAIN_S = 2.0  # at exit, how long the last messages (burns ended, bye) may wait for the reader
MAX_WAIT_S = 1.0  # the loop wakes at least this often (liveness, plugin deadlines)
PENDING_WAIT_S = 0.05  # ... and this often while output waits for a slow reader

Handler = Callable[[Dict[str, Any], Any], None]


class _Output(object):
    """The agent's stdout (see the module docstring). ``write`` returns False once the reader is
    gone for good (a broken pipe)."""

    def __init__(self, out: IO[bytes], split: bool = False) -> None:
        self.out = out
        self.split = split  # long messages as protocol.pieces (an addressed agent)
        self.fd = None  # type: Optional[int]
        self.pending = bytearray()
        self.dropped = 0

    def attach(self) -> None:
        """Switch a pipe or socket to non-blocking writes (a terminal, a file or an in-memory
        buffer keeps plain writes: they do not stall, and a terminal must stay as it was)."""
        try:
            fd = self.out.fileno()
            mode = os.fstat(fd).st_mode
        except (AttributeError, OSError, ValueError):
            return
        if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
            self.out.flush()
            os.set_blocking(fd, False)
            self.fd = fd

    def detach(self) -> None:
        """Back to blocking: whoever shares the descriptor after us expects it."""
        if self.fd is not None:
            try:
                os.set_blocking(self.fd, True)
            except OSError:
                pass
            self.fd = None

    def write(self, data: bytes) -> bool:
        if self.split:
            data = protocol.pieces(data)
        if self.fd is None:
            try:
                self.out.write(data)
                self.out.flush()
            except (OSError, ValueError):  # ValueError: the file was closed
                return False
            return True
        if len(self.pending) + len(data) > OUT_LIMIT:
            self.dropped += 1
            return True
        self.pending.extend(data)
        return self.flush()

    def flush(self) -> bool:
        while self.pending and self.fd is not None:
            try:
                n = os.write(self.fd, self.pending)
            except BlockingIOError:
                return True
            except InterruptedError:
                continue
            except OSError:
                return False
            del self.pending[:n]
        return True

    def drain(self, seconds: float) -> None:
        """Give queued messages up to ``seconds`` to reach a reader that is still there."""
        deadline = time.monotonic() + seconds
        while self.pending and self.fd is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            try:
                select.select([], [self.fd], [], left)
            except (OSError, ValueError):
                return
            if not self.flush():
                return


class Agent(object):
    """The agent's state and loop. ``out`` is a binary file; ``in_fd`` a readable descriptor.

    ``liveness_timeout`` (s, 0: off) and ``max_duration`` (s, the cap of every burn; at most
    ``protocol.MAX_DURATION_CEILING``) can be changed by the ``configure`` request.
    """

    def __init__(self, reader: Optional[Reader], reader_error: Optional[str] = None,
                 interval: float = 1.0, in_fd: int = 0, out: Optional[IO[bytes]] = None,
                 clock: Callable[[], float] = time.monotonic, read_only: bool = False,
                 liveness_timeout: float = protocol.DEFAULT_LIVENESS_S,
                 max_duration: float = protocol.DEFAULT_MAX_DURATION,
                 addressed: Optional[str] = None, on_host: bool = True) -> None:
        self.reader = reader
        # False: a node simulated inside another program (the demo's nodes, in a thread of
        # gpuctl), which is no machine: it neither lists nor stops the burners of the machine
        # it runs on (another session's real burn is not sim-01's)
        self.on_host = bool(on_host)
        # "@NAME " of this node's requests when many agents share one stdin (an srun step)
        self.address = None if addressed is None else b"@" + addressed.encode() + b" "
        self.read_only = bool(read_only)
        self.mutating = set(MUTATING)
        self.reader_error = reader_error
        self.interval = float(interval)
        self.in_fd = in_fd
        self.out = out if out is not None else sys.stdout.buffer
        self._output = _Output(self.out, split=addressed is not None)
        self.clock = clock
        self.liveness_timeout = float(liveness_timeout)
        self.max_duration = min(float(max_duration), protocol.MAX_DURATION_CEILING)
        self.stop_reason = None  # type: Optional[str]
        self.seq = 0
        self.running = True
        self.handlers = {
            "ping": self._ping,
            "set_interval": self._set_interval,
            "snapshot": self._snapshot,
            "shutdown": self._shutdown,
            "configure": self._configure,
            "signal": self._signal,
        }  # type: Dict[str, Handler]
        self._gpu_pids = set()  # type: Set[int]  # the GPU processes of the latest sample
        if reader is not None and hasattr(reader, "simulate"):
            self.handlers["simulate"] = self._simulate
        # called once per loop turn with the current monotonic time
        self.tick_hooks = []  # type: List[Callable[[float], None]]
        self.close_hooks = []  # type: List[Callable[[], None]]  # once, when the agent stops
        # called with each sample's gpu list, may annotate it
        self.sample_hooks = []  # type: List[Callable[[List[Dict[str, Any]]], None]]
        # poll, not epoll: epoll refuses regular files and /dev/null, which stdin may be.
        self._sel = getattr(selectors, "PollSelector", selectors.SelectSelector)()
        self._lines = LineBuffer(protocol.MAX_LINE, self._overlong)
        self._static = reader.static() if reader is not None else []
        self._next_sample = self.clock()
        self._heard = self.clock()  # the last time stdin brought anything

    # -- output ------------------------------------------------------------------------------
    def send(self, msg: Mapping[str, Any]) -> None:
        """Write one message. Only a reader that is gone (a broken pipe) stops the agent: a
        message JSON cannot carry (NaN relayed from a child) is sent with nulls instead, or
        replaced by an ``internal`` error."""
        try:
            data = protocol.encode(msg)
        except ValueError:  # NaN or Infinity somewhere in it
            try:
                data = protocol.encode(protocol.sanitize(msg))
            except (ValueError, TypeError, RecursionError) as e:
                data = self._unencodable(msg, e)
        except (TypeError, RecursionError) as e:
            data = self._unencodable(msg, e)
        if not self._output.write(data):
            self.stop("stdout closed")

    @staticmethod
    def _unencodable(msg: Mapping[str, Any], e: BaseException) -> bytes:
        kind = msg.get("type")
        return protocol.encode(protocol.error(
            "internal", "a %s message could not be encoded: %s: %s"
            % (kind if isinstance(kind, str) else "?", type(e).__name__, str(e)[:200]),
            msg.get("id") if isinstance(msg.get("id"), (str, int, float)) else None))

    def reply_error(self, code: str, message: str, req_id: Any = None) -> None:
        self.send(protocol.error(code, message, req_id))

    # -- plugin API ---------------------------------------------------------------------------
    def add_reader(self, fileobj: Any, callback: Callable[[], None]) -> None:
        """Call ``callback()`` whenever ``fileobj`` (fd or file) is readable."""
        self._sel.register(fileobj, selectors.EVENT_READ, callback)

    def remove_reader(self, fileobj: Any) -> None:
        try:
            self._sel.unregister(fileobj)
        except (KeyError, ValueError):
            pass

    # -- messages -----------------------------------------------------------------------------
    def hello(self) -> "Hello":
        reader = self.reader
        return protocol.hello_message(
            hostname=socket.gethostname(), pid=os.getpid(),
            python="%d.%d.%d" % sys.version_info[:3], interval=self.interval,
            reader=reader.name if reader is not None else None, reader_error=self.reader_error,
            bindings=bindings.described(),
            versions=reader.versions() if reader is not None else {},
            features=list(self.handlers), read_only=self.read_only,
            liveness_timeout=self.liveness_timeout, max_duration=self.max_duration,
            boot_time=boot_time(), gpus=self._static)

    def sample(self, req_id: Any = None) -> None:
        gpus = []  # type: List[Dict[str, Any]]
        reader = self.reader
        if reader is not None:
            slow = self.seq % protocol.SLOW_EVERY == 0
            try:
                gpus = reader.sample(slow=slow)
            except Exception as e:  # a reader bug must not kill the agent: say it, keep going
                self.reply_error("reader_failed", "%s: %s" % (type(e).__name__, e))
                return
        for hook in self.sample_hooks:
            hook(gpus)
        parents = []  # type: List[Dict[str, Any]]
        host = None  # type: Optional[Dict[str, Any]]
        if reader is not None:
            self._gpu_pids = set(
                p["pid"] for g in gpus for p in (g.get("processes") or ())
                if isinstance(p, dict) and isinstance(p.get("pid"), int))
            parents = reader.parents()
            try:
                host = reader.host()
            except Exception:  # the host's figures must never cost the GPUs' sample
                host = None
        # What the hello holds and what is null stay off the wire (protocol 2).
        msg = protocol.sample_message(self.seq, gpus, self._static, parents, host,
                                      req_id=req_id, gpus_only=reader is None)
        self.seq += 1
        self.send(msg)
        if reader is not None:
            for event in reader.events():
                self.send(event)

    def handle_line(self, line: bytes) -> None:
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

    def _ping(self, msg: Dict[str, Any], req_id: Any) -> None:
        self.send({"type": "pong", "id": req_id, "t": time.time()})

    def _set_interval(self, msg: Dict[str, Any], req_id: Any) -> None:
        seconds = msg.get("seconds")
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) \
                or not 0.1 <= seconds <= 3600:
            self.reply_error("bad_argument", "set_interval needs seconds within 0.1..3600", req_id)
            return
        self.interval = float(seconds)
        self._next_sample = self.clock() + self.interval
        self.send({"type": "ok", "request": "set_interval", "id": req_id})

    def _configure(self, msg: Dict[str, Any], req_id: Any) -> None:
        liveness = msg.get("liveness_timeout", self.liveness_timeout)
        cap = msg.get("max_duration", self.max_duration)
        problem = check_liveness(liveness) or check_max_duration(cap)
        if problem:
            self.reply_error("bad_argument", problem, req_id)
            return
        self.liveness_timeout = float(liveness)
        self.max_duration = float(cap)
        self._heard = self.clock()
        self.send({"type": "ok", "request": "configure", "id": req_id,
                   "liveness_timeout": self.liveness_timeout, "max_duration": self.max_duration})

    def _snapshot(self, msg: Dict[str, Any], req_id: Any) -> None:
        self.sample(req_id)

    def _signal(self, msg: Dict[str, Any], req_id: Any) -> None:
        if self.reader is None:
            self.reply_error("no_reader", "no GPU reader: no GPU processes to signal", req_id)
            return
        pid, name = msg.get("pid"), msg.get("signal")  # type: Any, Any
        code, message = self.reader.signal(pid, name, self._gpu_pids, msg.get("started"))
        if code is not None:
            self.reply_error(code, message, req_id)
            return
        reply = {"type": "ok", "request": "signal", "id": req_id, "pid": pid,
                 "signal": name, "message": message}  # type: SignalReply
        self.send(reply)

    def _shutdown(self, msg: Dict[str, Any], req_id: Any) -> None:
        self.send({"type": "bye", "id": req_id})
        self.stop("shutdown")

    def _simulate(self, msg: Dict[str, Any], req_id: Any) -> None:
        simulate = getattr(self.reader, "simulate")
        try:
            simulate(msg.get("action"), msg)
        except (ValueError, TypeError) as e:
            self.reply_error("bad_argument", str(e), req_id)
            return
        self.send({"type": "ok", "request": "simulate", "id": req_id})

    def stop(self, reason: str) -> None:
        """End the loop (the close hooks then stop everything the plugins started)."""
        if self.stop_reason is None:
            self.stop_reason = reason
        self.running = False

    # -- input --------------------------------------------------------------------------------
    def _overlong(self) -> None:
        self.reply_error("line_too_long", "line exceeds %d bytes; discarded" % protocol.MAX_LINE)

    def _on_stdin(self) -> None:
        try:
            data = os.read(self.in_fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.stop("stdin closed")
            return
        if self.address is None:
            self._heard = self.clock()
        for line in self._lines.feed(data):
            if self.address is not None:
                if line.startswith(self.address):
                    line = line[len(self.address):]
                elif line.startswith(b"@* "):
                    line = line[3:]
                else:
                    continue  # another node's request: not ours, and not a sign of life
                self._heard = self.clock()
            if line.strip():
                self.handle_line(line)
            if not self.running:
                return

    def _check_liveness(self) -> None:
        if self.liveness_timeout <= 0:
            return
        silent = self.clock() - self._heard
        if silent > self.liveness_timeout:
            self.reply_error("liveness", "heard nothing for %.0f s (liveness_timeout %g s): "
                             "stopping every burner and suite, exiting"
                             % (silent, self.liveness_timeout))
            self.stop("liveness")

    # -- loop ---------------------------------------------------------------------------------
    def run(self) -> int:
        """Send hello, then sample every interval until stopped. Returns the exit code."""
        self._output.attach()
        self.add_reader(self.in_fd, self._on_stdin)
        self._heard = self.clock()
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
                if not self._output.flush():
                    self.stop("stdout closed")
                    break
                timeout = max(0.0, self._next_sample - self.clock())
                if self.reader is None:
                    timeout = MAX_WAIT_S
                timeout = min(timeout, PENDING_WAIT_S if self._output.pending else MAX_WAIT_S)
                for key, _ in self._sel.select(timeout):
                    key.data()
                    if not self.running:
                        break
                # After reading stdin: a sample that stalled (a hung driver call) must not
                # count the pings that waited meanwhile as silence.
                if self.running:
                    self._check_liveness()
        finally:
            for close in self.close_hooks:
                try:
                    close()
                except Exception:
                    pass
            if self.reader is not None:
                self.reader.close()
            self._output.drain(DRAIN_S)
            self._output.detach()
        return 0


def check_liveness(value: Any) -> Optional[str]:
    """Why ``value`` is not a liveness timeout (0: off, else 1..MAX_LIVENESS_S s), or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not (value == 0 or 1 <= value <= protocol.MAX_LIVENESS_S):
        return "liveness_timeout must be 0 (off) or within 1..%g seconds" % (
            protocol.MAX_LIVENESS_S,)
    return None


def check_max_duration(value: Any) -> Optional[str]:
    """Why ``value`` is not a burn cap (1 s .. MAX_DURATION_CEILING), or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not 1 <= value <= protocol.MAX_DURATION_CEILING:
        return "max_duration must be within 1..%g seconds (this node's ceiling)" % (
            protocol.MAX_DURATION_CEILING,)
    return None


def install_plugins(agent: Agent) -> None:
    """Add the stress and acceptance requests to ``agent`` (their modules are in every
    bundle: one build ships the agent and its plugins together)."""
    from . import accept, stress

    stress.install(agent)
    accept.install(agent)


def main(argv: List[str]) -> int:
    """``agent [--simulate SPEC] [--interval S] [--seed N] [--read-only] [--liveness-timeout S]
    [--max-duration S]``; returns the exit code."""
    import argparse

    p = argparse.ArgumentParser(prog="gpuctl-node agent", description="gpuctl node agent")
    p.add_argument("--simulate", metavar="N[:MODEL]", help="simulated GPUs, e.g. 8 or 8:H100")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    p.add_argument("--seed", type=int, default=0, help="seed of the simulated GPUs")
    p.add_argument("--read-only", action="store_true",
                   help="refuse requests that change the node (stress, acceptance runs)")
    p.add_argument("--liveness-timeout", type=float, default=protocol.DEFAULT_LIVENESS_S,
                   metavar="S", help="stop every burner and suite and exit after S seconds "
                   "without a line on stdin (gpuctl pings); 0: never (default %(default)g)")
    p.add_argument("--addressed", nargs="?", const="", metavar="NAME",
                   help="stdin is shared with other nodes' agents (one srun step): act only on "
                   "lines '@NAME {...}' (NAME: this node's, default $SLURMD_NODENAME)")
    p.add_argument("--max-duration", type=float, default=protocol.DEFAULT_MAX_DURATION,
                   metavar="S", help="the longest burn this agent starts (default %(default)g; "
                   "gpuctl sets it from [stress] max_duration)")
    args = p.parse_args(argv)
    if not 0.1 <= args.interval <= 3600:
        p.error("--interval must be within 0.1..3600 seconds")
    for problem in (check_liveness(args.liveness_timeout), check_max_duration(args.max_duration)):
        if problem:
            p.error("--" + problem.replace("_", "-"))
    addressed = args.addressed
    if addressed == "":
        addressed = os.environ.get("SLURMD_NODENAME", "")
        if not addressed:
            p.error("--addressed without NAME needs $SLURMD_NODENAME (an srun task has it)")
    seed = args.seed
    if addressed is not None and args.simulate:
        seed += zlib.crc32(addressed.encode()) % 100000  # one step, one command: nodes differ
    try:
        reader, reason = open_reader(args.simulate, seed=seed)
    except ValueError as e:
        p.error(str(e))
    agent = Agent(reader, reason, interval=args.interval, read_only=args.read_only,
                  liveness_timeout=args.liveness_timeout, max_duration=args.max_duration,
                  addressed=addressed)
    install_plugins(agent)

    def on_signal(signum: int, frame: Any) -> None:
        agent.stop(signal.Signals(signum).name)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    return agent.run()

