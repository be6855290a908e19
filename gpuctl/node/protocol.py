"""The agent protocol, version 1: JSON lines between gpuctl and its node agent.

This docstring is the schema; DESIGN.md points here. Python 3.6 syntax, standard library only.

Transport
    One JSON object per line, UTF-8, on the agent's stdin (requests) and stdout (messages).
    Every object has a string ``type``. Lines longer than ``MAX_LINE`` bytes are discarded and
    answered with an ``error`` (code ``line_too_long``). Anything that is not a JSON object with a
    string ``type`` gets an ``error`` (code ``bad_json`` or ``bad_message``); the agent carries on.
    A request may carry ``id`` (any JSON scalar); replies to it carry the same ``id``.

Agent -> gpuctl
    hello     sent once, first. ``protocol`` (int, this version), ``agent`` (agent version),
              ``hostname``, ``pid``, ``python`` ("3.6.15"), ``interval`` (s),
              ``reader`` ("nvml" | "nvidia-smi" | "simulated" | null),
              ``reader_error`` (why no reader works, or null),
              ``driver``, ``cuda``, ``nvml`` (version strings or null),
              ``features`` (list of request types this agent understands),
              ``read_only`` (bool: mutating requests such as stress_start are refused with
              error code ``read_only``),
              ``read_only`` (bool: started with --read-only, it refuses stress_*/accept_*
              requests with an ``error`` of code ``read_only``),
              ``gpus``: list of static facts, one per GPU:
                  index, uuid, name, mem_total (bytes), power_limit (W), max_sm_clock (MHz),
                  max_mem_clock (MHz), pcie_gen, pcie_width, mig_mode (bool or null), serial
    sample    ``t`` (unix time), ``seq`` (int), ``gpus``: one dict per GPU:
                  index, uuid, state ("ok" | "lost"),
                  util_gpu, util_mem (%), mem_used, mem_total (bytes), temp (C),
                  power, power_limit (W), sm_clock, mem_clock (MHz), fan (%), pstate ("P0"),
                  throttle (list of names from THROTTLE_REASONS, active now),
                  ecc: {volatile_corrected, volatile_uncorrected, aggregate_corrected,
                        aggregate_uncorrected} | null,
                  retired_pages: {single_bit, double_bit, pending} | null,
                  remapped_rows: {correctable, uncorrectable, pending, failure} | null,
                  processes: [{pid, user, command, mem (bytes or null)}]
              A field the GPU cannot report is null; it never hides the others. ecc,
              retired_pages and remapped_rows are read every ``SLOW_EVERY`` samples and repeated
              in between. A reply to ``snapshot`` is a sample with the request's ``id``.
    event     ``t``, ``kind`` ("xid" | "gpu_lost" | ...), ``gpu`` (index or null), ``detail``
              (dict: for xid ``{"xid": 79}``).
    error     ``code`` (short token), ``message`` (one line for a person), optional ``id``.
    pong      reply to ping, with ``id`` and the agent's ``t``.
    ok        generic acknowledgement: ``request`` (the type acknowledged) and ``id``.
    bye       last line before the agent exits after ``shutdown``.

gpuctl -> agent
    ping                        -> pong
    set_interval  seconds       -> ok (0.1 <= seconds <= 3600, else error bad_argument)
    snapshot                    -> sample (with id), sampled now
    shutdown                    -> bye, then exit 0
    simulate      (simulated reader only) action: "load" (gpus, load 0..1) | "xid" (gpu, xid)
                  | "lose" (gpu) | "stall" (seconds 0..60: the next sample waits, as a hung
                  driver call would) -> ok
    Plugins add requests and name them in the hello's ``features``; each documents its own:
    ``stress_start`` / ``stress_stop`` / ``stress_status`` and ``burn`` events in
    ``gpuctl/node/stress.py``; ``accept_start`` / ``accept_stop`` and ``accept`` events in
    ``gpuctl/node/accept.py``.

Versioning
    ``PROTOCOL_VERSION`` changes whenever a message loses a field or a field changes meaning;
    adding a field or a request does not change it. gpuctl redeploys an agent whose hello carries
    another protocol version.
"""

import json

PROTOCOL_VERSION = 1
AGENT_VERSION = "0.1.0"
MAX_LINE = 1 << 20  # 1 MiB: a request is small; anything bigger is junk or an attack.
SLOW_EVERY = 10  # slow fields (ECC, remapped rows) are read once per this many samples

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

SAMPLE_FIELDS = (
    "index", "uuid", "state", "util_gpu", "util_mem", "mem_used", "mem_total", "temp", "power",
    "power_limit", "sm_clock", "mem_clock", "fan", "pstate", "throttle", "ecc", "retired_pages",
    "remapped_rows", "processes",
)
STATIC_FIELDS = (
    "index", "uuid", "name", "mem_total", "power_limit", "max_sm_clock", "max_mem_clock",
    "pcie_gen", "pcie_width", "mig_mode", "serial",
)


class ProtocolError(ValueError):
    """A line that is not a valid protocol message; ``code`` is the error token to reply with."""

    def __init__(self, code, message):
        ValueError.__init__(self, message)
        self.code = code
        self.message = message


def decode_throttle(mask):
    """Return the names of the throttle reasons set in an NVML bitmask (None -> None)."""
    if mask is None:
        return None
    return [name for bit, name in THROTTLE_REASONS if mask & bit]


def encode(msg):
    """Return ``msg`` as one protocol line (bytes, newline-terminated)."""
    return (json.dumps(msg, separators=(",", ":"), allow_nan=False) + "\n").encode("utf-8")


def decode(line):
    """Parse one line (bytes or str) into a message dict.

    Raises ProtocolError (code bad_json, bad_message or line_too_long) for anything else.
    """
    if len(line) > MAX_LINE:
        raise ProtocolError("line_too_long", "line of %d bytes exceeds %d" % (len(line), MAX_LINE))
    if isinstance(line, bytes):
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("bad_json", "line is not UTF-8")
    try:
        # NaN/Infinity/1e999 would make the reply unencodable (allow_nan=False) and deep nesting
        # raises RecursionError: both are junk, not reasons to stop.
        msg = json.loads(line, parse_float=_finite_float, parse_constant=_no_constant)
    except (ValueError, RecursionError) as e:
        raise ProtocolError("bad_json", "not JSON: %s" % (str(e)[:120],))
    if not isinstance(msg, dict):
        raise ProtocolError("bad_message", "a message must be a JSON object")
    kind = msg.get("type")
    if not isinstance(kind, str) or not kind:
        raise ProtocolError("bad_message", "a message needs a string 'type'")
    return msg


def _finite_float(text):
    value = float(text)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError("number %s is out of range" % text[:40])
    return value


def _no_constant(name):
    raise ValueError("%s is not a JSON number" % name)


def error(code, message, req_id=None):
    """Return an error message dict."""
    msg = {"type": "error", "code": code, "message": message}
    if req_id is not None:
        msg["id"] = req_id
    return msg
