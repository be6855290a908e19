"""The agent protocol, version 2: JSON lines between gpuctl and its node agent.

This docstring is the schema; DESIGN.md points here. Python 3.6 syntax, standard library only.

Transport
    One JSON object per line, UTF-8, on the agent's stdin (requests) and stdout (messages).
    Every object has a string ``type``. Lines longer than ``MAX_LINE`` bytes are discarded and
    answered with an ``error`` (code ``line_too_long``). Anything that is not a JSON object with a
    string ``type`` gets an ``error`` (code ``bad_json`` or ``bad_message``); the agent carries on.
    A request may carry ``id`` (any JSON scalar); replies to it carry the same ``id``. A number
    of more than ``MAX_NUMBER_CHARS`` characters, NaN or Infinity makes a line ``bad_json``.

One srun step for many nodes (``agent --addressed``)
    Slurm's ``srun --input=all`` gives every task of the step the same stdin, and ``--label``
    prefixes each output line with the task's number but cuts lines into pieces of 1024 bytes.
    So an addressed agent reads only request lines ``@NAME {json}`` where NAME is its node's
    Slurm name (``@* {json}``: every agent), ignores the others (they do not count as hearing
    from the login side either), and writes each message longer than ``PIECE_BYTES`` as pieces:
    ``+piece`` lines, then one ``=piece`` line (``pieces``; ``Joiner`` puts them together).

Agent -> gpuctl
    hello     sent once, first. ``protocol`` (int, this version), ``agent`` (agent version),
              ``hostname``, ``pid``, ``python`` ("3.6.15"), ``interval`` (s),
              ``reader`` ("nvml" | "nvidia-smi" | "simulated" | null),
              ``reader_error`` (why no reader works; with reader "nvidia-smi", why NVML is
              not used; else null),
              ``bindings`` (the pynvml the agent loaded: "bundled 13.615.71" when it is the
              one the bundle carries, "system 12.535.133" when the node's own is newer, null
              when it never looked, e.g. simulated GPUs),
              ``driver``, ``cuda``, ``nvml`` (version strings or null),
              ``features`` (list of request types this agent understands),
              ``read_only`` (bool: started with --read-only, it refuses stress_*/accept_*
              requests with an ``error`` of code ``read_only``),
              ``liveness_timeout`` (s: after that long without a line on stdin the agent stops
              every burner and suite it started and exits; 0: never),
              ``max_duration`` (s: the longest burn it starts),
              ``boot_time`` (unix time the node booted, /proc/stat's btime; or null),
              ``gpus``: list of static facts, one per GPU:
                  index, uuid, name, mem_total (bytes), power_limit (W), max_sm_clock (MHz),
                  max_mem_clock (MHz), pcie_gen, pcie_width, mig_mode (bool or null), serial
    sample    ``t`` (unix time), ``seq`` (int), ``gpus``: one dict per GPU:
                  index, uuid, state ("ok" | "lost"),
                  the readings of ``gpuctl/node/metrics.py`` (one row each: key, unit, bounds,
                  how it is read): util_gpu, util_mem (%), mem_used, mem_total (bytes), temp
                  (C), power, power_limit (W), sm_clock, mem_clock (MHz), fan (%), pstate
                  ("P0"), enc, dec (video encoder / decoder %), pcie_tx, pcie_rx (bytes/s),
                  throttle (list of names from THROTTLE_REASONS, active now),
                  ecc: {volatile_corrected, volatile_uncorrected, aggregate_corrected,
                        aggregate_uncorrected} | null,
                  retired_pages: {single_bit, double_bit, pending} | null,
                  remapped_rows: {correctable, uncorrectable, pending, failure} | null,
                  processes: [{pid, user, command, mem (bytes or null), uid, ppid,
                               sm (the process's SM %, NVML's per-process utilization),
                               cpu (host %CPU since the previous sample; null on the first),
                               rss (resident bytes), started (unix time)}],
                  mig: [{id, profile ("3g.40gb"), util (%), mem_used, mem_total (bytes)}]
                       | null: a GPU in MIG mode's GPU instances (the login side's reader of
                       a Prometheus fills it from DCGM exporter's series; agents send null)
              ``parents``: the ancestors of the GPU processes that are not GPU processes
              themselves (a launcher, a shell), up to pid 1: [{pid, ppid, uid, user, command,
              started}] (at most 64).
              ``host``: the node's host, {cpu (% of all CPUs busy since the previous sample),
              cpus, mem_total, mem_available (bytes), load ([1, 5, 15] minute averages),
              net_rx, net_tx (bytes/s since the previous sample, loopback left out)}, any null
              when unknown (cpu and the rates are null in the first sample), or null.
              A field the GPU cannot report is null; it never hides the others. ecc,
              retired_pages, remapped_rows and the readings marked ``slow`` in metrics.py
              (pcie_tx, pcie_rx: see its ``slow``) are read every ``SLOW_EVERY`` samples (or
              less often) and repeated in between. A reply to ``snapshot`` is a sample with the
              request's ``id``.
              The wire carries what changes (protocol 2, ``compact_gpus``): a GPU's dict, a
              process's and a parent's leave out every null field, ``state`` when "ok" and
              ``processes`` when empty (the login side's defaults: null, "ok", []); and
              ``FROM_HELLO`` (uuid, mem_total, power_limit) when equal to the hello's for the
              same index. The login side reads a GPU's ``uuid``, and an "ok" GPU's
              ``mem_total`` and ``power_limit``, that are absent or null as the hello's (so a
              power cap set after the hello is sent in every sample while it differs, and a reading that
              failed shows the hello's value); a lost GPU's readings stay null. ``throttle``
              [] (none active) is sent: null would mean unknown. Simulated GPUs: 680 bytes
              per GPU-sample in protocol 1, 526 in 2, and the record file 4% smaller
              (``benchmarks/record_size.py --shapes-only``); decoding costs the same.
    event     ``t``, ``kind`` ("xid" | "gpu_lost" | ...), ``gpu`` (index or null), ``detail``
              (dict: for xid ``{"xid": 79}``).
    error     ``code`` (short token), ``message`` (one line for a person), optional ``id``.
    pong      reply to ping, with ``id`` and the agent's ``t``.
    ok        generic acknowledgement: ``request`` (the type acknowledged) and ``id``.
    bye       last line before the agent exits after ``shutdown``.
    An ``error`` of code ``liveness`` is the agent's last line when it heard nothing for
    ``liveness_timeout`` seconds (nobody may be reading it: the link is presumed dead).

gpuctl -> agent
    ping                        -> pong
    set_interval  seconds       -> ok (0.1 <= seconds <= 3600, else error bad_argument)
    snapshot                    -> sample (with id), sampled now
    shutdown                    -> bye, then exit 0
    configure     liveness_timeout (0, or 1..MAX_LIVENESS_S s), max_duration (1 s ..
                  MAX_DURATION_CEILING: the cap of every later burn) -> ok {liveness_timeout,
                  max_duration} (error bad_argument, nothing changed, for a bad value). gpuctl
                  sends it first, from its config, and then pings every liveness_timeout / 3.
    signal        pid, signal ("TERM" | "INT" | "KILL"), started (optional: the process's
                  start time as a sample gave it) -> ok {pid, signal, message}, or error: bad_argument,
                  not_gpu_process (the pid is not among the latest sample's GPU processes),
                  no_process (it ended, or another process has its pid now), not_yours (it
                  belongs to another user than the agent's, root included), read_only.
    simulate      (simulated reader only) action: "load" (gpus, load 0..1) | "xid" (gpu, xid)
                  | "lose" (gpu) | "hold" (gpu, user: a job holds its memory and computes
                  nothing) | "stall" (seconds 0..60: the next sample waits, as a hung
                  driver call would) -> ok
    Plugins add requests and name them in the hello's ``features``; each documents its own:
    ``stress_start`` / ``stress_stop`` / ``stress_status`` and ``burn`` events in
    ``gpuctl/node/stress.py`` (with the burn's ``owner``: ``{user, host, session}`` of the gpuctl
    that started it, sent in ``stress_start``, reported in events and ``stress_status``, and
    ``stress_stop``'s ``owner_user``, which leaves other users' burners alone and lists them in
    its reply's ``kept``); ``accept_start`` / ``accept_stop`` and ``accept`` events in
    ``gpuctl/node/accept.py``.

Versioning
    ``PROTOCOL_VERSION`` changes whenever a message loses a field or a field changes meaning;
    adding a field or a request does not change it. gpuctl redeploys an agent whose hello carries
    a protocol version it does not read. Version 2 left out of a sample what the hello holds
    and what is null (above); gpuctl reads versions 1 and 2 (an agent bundle deployed by an
    older gpuctl, a recording made by one: there every field is in every sample).
"""

import json
import re
import time
from typing import (TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence,
                    Union, cast)

from . import metrics

if TYPE_CHECKING:
    from .messages import EventMessage, GpuStaticWire, Hello, HostWire, SampleMessage

PROTOCOL_VERSION = 2
AGENT_VERSION = "0.1.0"
MAX_LINE = 1 << 20  # 1 MiB: a request is small; anything bigger is junk or an attack.
SLOW_EVERY = 10  # slow fields (ECC, remapped rows) are read once per this many samples
# A JSON number longer than this is refused before Python parses it (``parse_json``): no
# counter, id or reading needs more, and Python 3.6 parses long integers in quadratic time.
MAX_NUMBER_CHARS = 100
# Agent options (``agent --liveness-timeout S --max-duration S``, or the ``configure`` request).
DEFAULT_LIVENESS_S = 30.0  # no line on stdin for this long: stop everything and exit
MAX_LIVENESS_S = 86400.0
DEFAULT_MAX_DURATION = 3600.0  # the longest burn, unless the login side's config says otherwise
MAX_DURATION_CEILING = 7 * 86400.0  # the node's own limit, whatever the login side asks
PIECE_BYTES = 1000  # an addressed agent's longest output line (srun --label cuts at 1024)

# NVML clocksThrottleReasons bits (nvml.h), decoded to the names the UI shows.
THROTTLE_REASONS = (
    (0x0000000000000001, "gpu_idle"),
    (0x0000000000000002, "applications_clocks"),
    (0x0000000000000004, "sw_power_cap"),
    (0x0000000000000008, "hw_slowdown"),
    (0x0000000000000010, "sync_boost"),
    (0x0000000000000020, "sw_thermal"),
    (0x0000000000000040, "hw_thermal"),
    (0x0000000000000080, "hw_power_brake"),
    (0x0000000000000100, "display_clocks"),
)

SAMPLE_FIELDS = metrics.SAMPLE_FIELDS  # identity, the registry's readings, structured fields
STATIC_FIELDS = (
    "index", "uuid", "name", "mem_total", "power_limit", "max_sm_clock", "max_mem_clock",
    "pcie_gen", "pcie_width", "mig_mode", "serial",
)

# A GPU's sample fields that its hello holds too: left out of a sample while they are the hello's.
FROM_HELLO = ("uuid", "mem_total", "power_limit")


def compact_gpus(gpus: List[Dict[str, Any]],
                 statics: Sequence[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """A sample's ``gpus`` as protocol 2 sends them (see the docstring: "The wire carries what
    changes"): new dicts, ``gpus`` left as it is. ``statics`` is the hello's ``gpus``. With the
    parents', it adds ~20 us of CPU to the 52 us that encoding an 8-GPU sample took under Python
    3.6, for a line 22% shorter (``benchmarks/agent_encode.py``)."""
    hello = {}  # type: Dict[Any, Mapping[str, Any]]
    for static in statics:
        hello[static.get("index")] = static
    out = []
    for g in gpus:
        c = {k: v for k, v in g.items() if v is not None}
        st = hello.get(c.get("index"))
        if st is not None:
            for key in FROM_HELLO:
                if key in c and c[key] == st.get(key):
                    del c[key]
        if c.get("state") == "ok":
            del c["state"]
        processes = c.get("processes")
        if processes == []:
            del c["processes"]
        elif isinstance(processes, list):
            c["processes"] = compact_records(processes)
        out.append(c)
    return out


def compact_records(records: List[Any]) -> List[Any]:
    """Process records (a sample's ``parents``) without their null fields."""
    return [{k: v for k, v in r.items() if v is not None} if isinstance(r, dict) else r
            for r in records]


# -- the agent's messages: one writer each (their definitions: ``messages``) ---------------------
def hello_message(*, hostname: str, pid: int, python: str, interval: float,
                  reader: Optional[str], reader_error: Optional[str], bindings: Optional[str],
                  versions: Mapping[str, Optional[str]], features: Sequence[str],
                  gpus: List[Dict[str, Any]], read_only: bool = False,
                  liveness_timeout: float = DEFAULT_LIVENESS_S,
                  max_duration: float = DEFAULT_MAX_DURATION,
                  boot_time: Optional[float] = None) -> "Hello":
    """The ``hello`` (see the docstring); ``versions`` is a reader's ``versions()``, ``gpus``
    its ``static()`` (records of ``STATIC_FIELDS``)."""
    return {
        "type": "hello",
        "protocol": PROTOCOL_VERSION,
        "agent": AGENT_VERSION,
        "hostname": hostname,
        "pid": pid,
        "python": python,
        "interval": interval,
        "reader": reader,
        "reader_error": reader_error,
        "bindings": bindings,
        "driver": versions.get("driver"),
        "cuda": versions.get("cuda"),
        "nvml": versions.get("nvml"),
        "features": sorted(features),
        "read_only": read_only,
        "liveness_timeout": liveness_timeout,
        "max_duration": max_duration,
        "boot_time": boot_time,
        "gpus": cast("List[GpuStaticWire]", gpus),
    }


def sample_message(seq: int, gpus: List[Dict[str, Any]], statics: Sequence[Mapping[str, Any]],
                   parents: Optional[List[Dict[str, Any]]] = None,
                   host: Optional[Mapping[str, Any]] = None, t: Optional[float] = None,
                   req_id: Any = None, gpus_only: bool = False) -> "SampleMessage":
    """A ``sample`` as protocol 2 sends it: ``gpus`` (a reader's records) compacted against
    the hello's ``statics`` (``compact_gpus``), ``parents`` without null fields, ``t`` now
    unless given, ``id`` when ``req_id`` is not None. ``gpus_only``: without ``parents`` and
    ``host`` (an agent without a reader)."""
    msg = {"type": "sample", "t": time.time() if t is None else t, "seq": seq,
           "gpus": compact_gpus(gpus, statics)}  # type: SampleMessage
    if not gpus_only:
        msg["parents"] = compact_records(parents or [])
        msg["host"] = cast("Optional[HostWire]", host)
    if req_id is not None:
        msg["id"] = req_id
    return msg


def event_message(kind: str, gpu: Optional[int], detail: Any,
                  t: Optional[float] = None) -> "EventMessage":
    """An ``event`` of ``kind`` ("xid", "gpu_lost", "burn", "accept") at ``t`` (now unless
    given)."""
    return {"type": "event", "t": time.time() if t is None else t, "kind": kind, "gpu": gpu,
            "detail": detail}


class ProtocolError(ValueError):
    """A line that is not a valid protocol message; ``code`` is the error token to reply with."""

    def __init__(self, code: str, message: str) -> None:
        ValueError.__init__(self, message)
        self.code = code
        self.message = message


def decode_throttle(mask: Optional[int]) -> Optional[List[str]]:
    """Return the names of the throttle reasons set in an NVML bitmask (None -> None)."""
    if mask is None:
        return None
    return [name for bit, name in THROTTLE_REASONS if mask & bit]


_SECONDS_PER_UNIT = (("w", 7 * 86400.0), ("d", 86400.0), ("h", 3600.0), ("m", 60.0),
                     ("s", 1.0))
_DURATION = re.compile(
    "".join(r"(?:(\d+(?:\.\d*)?|\.\d+)%s)?" % unit for unit, _ in _SECONDS_PER_UNIT))


def parse_seconds(text: str) -> Optional[float]:
    """Seconds from a plain number of seconds ("90", "2.5") or figures with units, largest
    first ("90s", "10m", "1.5h", "7d", "2w", "1h30m", "1d12h"): gpuctl's one duration grammar
    (stress, acceptance --burn, jobs purge --older-than, record and replay). None when the text
    is none of these or not a finite non-negative figure."""
    value = text.strip().lower()
    try:
        seconds = float(value)
    except ValueError:
        m = _DURATION.fullmatch(value)
        if not value or m is None:
            return None
        seconds = sum(float(figure) * scale
                      for figure, (_, scale) in zip(m.groups(), _SECONDS_PER_UNIT) if figure)
    if not 0 <= seconds < _INF:
        return None
    return seconds


def encode(msg: Mapping[str, Any]) -> bytes:
    """Return ``msg`` as one protocol line (bytes, newline-terminated).

    Raises ValueError for NaN or Infinity anywhere in it (see ``sanitize``), TypeError for a
    value JSON cannot carry.
    """
    return (_ENCODER.encode(msg) + "\n").encode("utf-8")


# One encoder for every line: json.dumps builds one per call when given options (3 us of the
# ~25 us an agent's 1-GPU sample line costs).
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def sanitize(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by None (what JSON can carry)."""
    if isinstance(value, float):
        return value if value == value and value not in (_INF, -_INF) else None
    if isinstance(value, dict):
        return {k: sanitize(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [sanitize(v) for v in value]
    return value


def decode(line: Union[bytes, str], lenient: bool = False) -> Dict[str, Any]:
    """Parse one line (bytes or str) into a message dict.

    ``lenient`` (the login side reading a node): a number that is NaN, infinite or too long
    becomes None, so that one broken field never hides the rest of a sample. Strict (the agent
    reading requests): such a line is refused. Raises ProtocolError (code bad_json, bad_message
    or line_too_long) for anything else.
    """
    if len(line) > MAX_LINE:
        raise ProtocolError("line_too_long", "line of %d bytes exceeds %d" % (len(line), MAX_LINE))
    try:
        # NaN/Infinity/1e999 would make the reply unencodable (allow_nan=False), a huge number
        # would stall Python 3.6 and deep nesting raises RecursionError: junk, not reasons to stop.
        msg = parse_json(line, nan_to_none=lenient, long_to_none=lenient)
    except UnicodeDecodeError:
        raise ProtocolError("bad_json", "line is not UTF-8")
    except ValueError as e:
        raise ProtocolError("bad_json", "not JSON: %s" % (str(e)[:120],))
    if not isinstance(msg, dict):
        raise ProtocolError("bad_message", "a message must be a JSON object")
    kind = msg.get("type")
    if not isinstance(kind, str) or not kind:
        raise ProtocolError("bad_message", "a message needs a string 'type'")
    return msg


# -- guarded JSON parsing ------------------------------------------------------------------------
_INF = float("inf")


def _number_guard(kind: Callable[[str], Any], long_to_none: bool = False) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        if len(text) > MAX_NUMBER_CHARS:
            if long_to_none:
                return None
            raise ValueError("a number of %d characters (at most %d)"
                             % (len(text), MAX_NUMBER_CHARS))
        return kind(text)

    return parse


def _finite_or_none(text: str) -> Optional[float]:
    value = float(text)
    return value if value == value and value not in (_INF, -_INF) else None


def _finite_or_fail(text: str) -> float:
    value = float(text)
    if value != value or value in (_INF, -_INF):
        raise ValueError("number %s is out of range" % text[:40])
    return value


def _constant_none(name: str) -> None:
    return None


def _constant_fail(name: str) -> None:
    raise ValueError("%s is not a JSON number" % name)


_PARSE_INT = _number_guard(int)
_FLOAT_OR_NONE = _number_guard(_finite_or_none)
_FLOAT_OR_FAIL = _number_guard(_finite_or_fail)
_INT_OR_NONE = _number_guard(int, long_to_none=True)
_ANY_FLOAT_OR_NONE = _number_guard(_finite_or_none, long_to_none=True)


# A number of more than MAX_NUMBER_CHARS characters has a run of at least 33 digits (a JSON
# number's digits are in at most three runs: integer, fraction, exponent). A text without such a
# run has no integer the guard would change, so its integers are parsed in C, without a Python
# call each (they are most of a sample's numbers); floats keep their guard (overflow, length).
_DIGITS = bytes(ord("0") if c in b"0123456789" else ord(" ") for c in range(256))
_LONG_RUN = b"0" * 33


def _short_integers(data: bytes) -> bool:
    """True when ``data`` has no run of 33 digits (so no integer the guards would change)."""
    return _LONG_RUN not in data.translate(_DIGITS)


def parse_json(text: Union[bytes, str], nan_to_none: bool = False,
               long_to_none: bool = False) -> Any:
    """Parse one JSON text that came from outside (the login side, a child process, a node)
    with the guards such text needs: a number of more than ``MAX_NUMBER_CHARS`` characters is
    refused before Python parses it (Python 3.6 parses a long integer in quadratic time: 16 s
    for a 1 MB one), or becomes None with ``long_to_none``; NaN, Infinity and floats that
    overflow become None when ``nan_to_none``, else are refused; nesting too deep for the
    parser is refused. Bytes are decoded as UTF-8, invalid bytes replaced when ``nan_to_none``
    (a child's output is read leniently). Raises ValueError (UnicodeDecodeError for bad UTF-8
    when strict)."""
    if isinstance(text, bytes):
        short = _short_integers(text)
        text = text.decode("utf-8", "replace" if nan_to_none else "strict")
    else:
        short = _short_integers(text.encode("utf-8", "replace"))
    return _parse_guarded(text, nan_to_none, long_to_none, guard_ints=not short)


def _parse_guarded(text: str, nan_to_none: bool, long_to_none: bool,
                   guard_ints: bool = True) -> Any:
    """``parse_json`` of a str; ``guard_ints=False`` parses integers without their guard (for a
    text ``_short_integers`` found none the guard would change)."""
    if long_to_none:
        parse_int, parse_float = _INT_OR_NONE, _ANY_FLOAT_OR_NONE
    else:
        parse_int = _PARSE_INT
        parse_float = _FLOAT_OR_NONE if nan_to_none else _FLOAT_OR_FAIL
    try:
        return json.loads(
            text, parse_int=parse_int if guard_ints else None, parse_float=parse_float,
            parse_constant=_constant_none if nan_to_none or long_to_none else _constant_fail)
    except RecursionError:
        raise ValueError("nested too deeply")


def error(code: str, message: str, req_id: Any = None) -> Dict[str, Any]:
    """Return an error message dict."""
    msg = {"type": "error", "code": code, "message": message}  # type: Dict[str, Any]
    if req_id is not None:
        msg["id"] = req_id
    return msg


def pieces(line: bytes, size: int = PIECE_BYTES) -> bytes:
    """``line`` (one encoded message, newline-terminated) as it goes out through a shared srun
    step: unchanged when it is at most ``size`` bytes, else ``+piece`` lines and a last
    ``=piece`` line, each at most ``size + 2`` bytes (see "One srun step" above)."""
    if len(line) <= size:
        return line
    body = line[:-1] if line.endswith(b"\n") else line
    chunks = [body[i:i + size] for i in range(0, len(body), size)]
    out = [b"+" + c + b"\n" for c in chunks[:-1]]
    out.append(b"=" + chunks[-1] + b"\n")
    return b"".join(out)


class Joiner(object):
    """Lines of one agent in, whole messages out: undoes ``pieces`` (bounded by MAX_LINE)."""

    def __init__(self) -> None:
        self._parts = []  # type: List[bytes]
        self._size = 0

    def feed(self, line: bytes) -> Optional[bytes]:
        """Take one line (without the label); return a whole line when it completes one (a
        message of more than MAX_LINE bytes is dropped: None)."""
        head = line[:1]
        if head == b"+":
            if self._size <= MAX_LINE:  # past it the message is junk: keep counting, drop it
                self._parts.append(line[1:].rstrip(b"\n"))
            self._size += len(line)
            return None
        if head == b"=":
            whole = b"".join(self._parts) + line[1:]
            too_long = self._size > MAX_LINE
            self._parts, self._size = [], 0
            return None if too_long else whole
        self._parts, self._size = [], 0
        return line
