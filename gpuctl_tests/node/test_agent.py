"""Protocol v2 as the real agent subprocess speaks it: requests, replies, bad input, exits."""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuctl.core.model import NodeInfo, Sample
from gpuctl.fleet.session import decode_line, statics
from gpuctl.node.agent import Agent
from gpuctl.node.protocol import (
    AGENT_VERSION,
    DEFAULT_LIVENESS_S,
    DEFAULT_MAX_DURATION,
    FROM_HELLO,
    MAX_DURATION_CEILING,
    MAX_LINE,
    PROTOCOL_VERSION,
    SAMPLE_FIELDS,
    STATIC_FIELDS,
)
from gpuctl_tests.helpers import AgentProcess, old_python

REQUESTS = ("ping", "set_interval", "snapshot", "shutdown", "simulate", "configure")
REPLY_TYPES = ("error", "pong", "ok", "bye")


def start(agents: list[AgentProcess], *args: str) -> AgentProcess:
    agent = AgentProcess.start(*args)
    agents.append(agent)
    return agent


def is_reply(msg: dict[str, Any]) -> bool:
    """A message sent because of a request (periodic samples and events are not)."""
    return msg["type"] in REPLY_TYPES or (msg["type"] == "sample" and "id" in msg)


def test_hello_then_samples(agents: list[AgentProcess]) -> None:
    agent = start(agents, "--simulate", "3:A100", "--interval", "0.1")
    hello = agent.read()
    assert hello["type"] == "hello"
    assert (hello["protocol"], hello["agent"]) == (PROTOCOL_VERSION, AGENT_VERSION)
    assert hello["pid"] == agent.proc.pid
    assert hello["python"] == ".".join(map(str, sys.version_info[:3]))
    assert (hello["interval"], hello["reader"], hello["reader_error"]) == (0.1, "simulated", None)
    assert hello["hostname"] and hello["driver"] and hello["cuda"]
    assert hello["liveness_timeout"] == DEFAULT_LIVENESS_S
    assert hello["max_duration"] == DEFAULT_MAX_DURATION
    assert set(REQUESTS) <= set(hello["features"])
    assert [g["index"] for g in hello["gpus"]] == [0, 1, 2]
    for g in hello["gpus"]:
        assert set(g) == set(STATIC_FIELDS)
        assert g["name"] == "NVIDIA A100-SXM4-80GB"
    samples = [agent.read_until(lambda m: m["type"] == "sample") for _ in range(3)]
    assert [s["seq"] for s in samples] == sorted({s["seq"] for s in samples})
    assert samples[0]["t"] <= samples[-1]["t"]
    for s in samples:
        assert [g["index"] for g in s["gpus"]] == [0, 1, 2]
        for g in s["gpus"]:  # what the hello holds and what is null stay off the wire
            assert set(g) <= set(SAMPLE_FIELDS) and {"util_gpu", "temp", "throttle"} <= set(g)
            assert not set(FROM_HELLO) & set(g) and None not in g.values()
        decoded = decode_line(json.dumps(s), statics(msgspec.convert(hello, NodeInfo)))
        assert isinstance(decoded, Sample)
        assert [(g.uuid, g.mem_total, g.power_limit) for g in decoded.gpus] == [
            (g["uuid"], g["mem_total"], g["power_limit"]) for g in hello["gpus"]
        ]


def test_a_python36_agent_sends_what_changes_and_the_login_side_fills_the_rest(
    agents: list[AgentProcess],
) -> None:
    agent = AgentProcess.start(
        "--simulate", "2:H100", "--interval", "0.1", python=old_python("3.6.15")
    )
    agents.append(agent)
    hello = agent.read()
    assert hello["python"].startswith("3.6.") and hello["protocol"] == 2
    agent.send({"type": "simulate", "action": "lose", "gpu": 1, "id": 1})
    assert agent.read_until(is_reply)["type"] == "ok"
    sample = agent.read_until(
        lambda m: m["type"] == "sample" and m["gpus"][1].get("state") == "lost"
    )
    assert sample["gpus"][1] == {"index": 1, "state": "lost"}
    assert all(None not in p.values() for p in sample["parents"])
    decoded = decode_line(json.dumps(sample), statics(msgspec.convert(hello, NodeInfo)))
    assert isinstance(decoded, Sample)
    ok, lost = decoded.gpus
    assert (ok.uuid, ok.mem_total, ok.power_limit, ok.state) == (
        hello["gpus"][0]["uuid"],
        hello["gpus"][0]["mem_total"],
        hello["gpus"][0]["power_limit"],
        "ok",
    )
    assert (lost.uuid, lost.mem_total, lost.util_gpu, lost.processes) == (
        hello["gpus"][1]["uuid"],
        None,
        None,
        (),
    )


@pytest.mark.parametrize("req_id", [7, "abc", 1.5, None, True])
def test_ping_pong_echoes_the_id(agents: list[AgentProcess], req_id: Any) -> None:
    agent = start(agents, "--simulate", "1", "--interval", "60")
    agent.read()
    agent.send({"type": "ping", "id": req_id})
    pong = agent.read_until(lambda m: m["type"] == "pong")
    assert pong["id"] == req_id and isinstance(pong["t"], float)


def test_set_interval_changes_the_cadence(agents: list[AgentProcess]) -> None:
    agent = start(agents, "--simulate", "1", "--interval", "60")
    agent.read()
    agent.read_until(lambda m: m["type"] == "sample")  # the first comes at once
    agent.send({"type": "set_interval", "seconds": 0.1, "id": "x"})
    ok = agent.read_until(is_reply)
    assert ok == {"type": "ok", "request": "set_interval", "id": "x"}
    # at 60 s nothing more would come within the deadline; at 0.1 s several do
    seqs = [agent.read_until(lambda m: m["type"] == "sample", timeout=5)["seq"] for _ in range(3)]
    assert seqs == sorted(seqs) and len(set(seqs)) == 3


@pytest.mark.parametrize("seconds", [0, 0.05, 3601, -1, "1", True, None, [1]])
def test_set_interval_refuses_bad_values(agents: list[AgentProcess], seconds: Any) -> None:
    agent = start(agents, "--simulate", "1", "--interval", "60")
    agent.read()
    agent.send({"type": "set_interval", "seconds": seconds, "id": 3})
    err = agent.read_until(is_reply)
    assert (err["type"], err["code"], err["id"]) == ("error", "bad_argument", 3)
    agent.send({"type": "set_interval", "id": 4})  # missing altogether
    assert agent.read_until(is_reply)["code"] == "bad_argument"


def test_snapshot_is_a_sample_with_the_id(agents: list[AgentProcess]) -> None:
    agent = start(agents, "--simulate", "2", "--interval", "60")
    agent.read()
    agent.send({"type": "snapshot", "id": 42})
    snap = agent.read_until(lambda m: m.get("id") == 42)
    assert snap["type"] == "sample" and len(snap["gpus"]) == 2


def test_unknown_request_is_named_in_the_error(agents: list[AgentProcess]) -> None:
    agent = start(agents, "--simulate", "1", "--interval", "60")
    agent.read()
    agent.send({"type": "frobnicate", "id": 9})
    err = agent.read_until(is_reply)
    assert (err["type"], err["code"], err["id"]) == ("error", "unknown_request", 9)
    assert "frobnicate" in err["message"]


def test_shutdown_says_bye_and_exits_0(agents: list[AgentProcess]) -> None:
    agent = start(agents, "--simulate", "1", "--interval", "60")
    agent.read()
    agent.send({"type": "shutdown", "id": 1})
    bye = agent.read_until(is_reply)
    assert bye["type"] == "bye"
    assert agent.proc.wait(10) == 0


def test_stdin_closing_exits_0(agents: list[AgentProcess]) -> None:
    agent = start(agents, "--simulate", "1", "--interval", "60")
    agent.read()
    assert agent.proc.stdin is not None
    agent.proc.stdin.close()
    assert agent.proc.wait(10) == 0


def test_overlong_line_is_refused_and_the_agent_carries_on(agents: list[AgentProcess]) -> None:
    agent = start(agents, "--simulate", "1", "--interval", "60")
    agent.read()
    done = threading.Event()

    def write() -> None:  # 3 MiB: more than the pipe holds, so write while the test reads
        agent.send(b'{"type":"ping","pad":"' + b"x" * (3 * MAX_LINE) + b'"}\n')
        agent.send({"type": "ping", "id": "after"})
        done.set()

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    err = agent.read_until(is_reply)
    assert (err["type"], err["code"]) == ("error", "line_too_long")
    pong = agent.read_until(is_reply)
    assert (pong["type"], pong["id"]) == ("pong", "after")  # one error, then business as usual
    writer.join(10)
    assert done.is_set()


@pytest.mark.parametrize(
    ("line", "code"),
    [
        (b"\xff\xfe\x00garbage\x80\n", "bad_json"),
        (b"not json at all\n", "bad_json"),
        (b"[1, 2, 3]\n", "bad_message"),
        (b'"ping"\n', "bad_message"),
        (b'{"id": 1}\n', "bad_message"),
        (b'{"type": 5}\n', "bad_message"),
        (b'{"type": ""}\n', "bad_message"),
        # These once stopped the agent: a NaN id made the reply unencodable, and deep nesting
        # raised RecursionError out of the JSON parser.
        (b'{"type": "ping", "id": NaN}\n', "bad_json"),
        (b'{"type": "ping", "id": 1e999}\n', "bad_json"),
        (b"[" * 100_000 + b"\n", "bad_json"),
    ],
    ids=lambda v: repr(v[:30]) if isinstance(v, bytes) else str(v),
)
def test_bad_lines_get_an_error_and_the_agent_carries_on(
    agents: list[AgentProcess], line: bytes, code: str
) -> None:
    agent = start(agents, "--simulate", "1", "--interval", "60")
    agent.read()
    agent.send(line)
    err = agent.read_until(is_reply)
    assert (err["type"], err["code"]) == ("error", code)
    agent.send({"type": "ping", "id": 2})
    pong = agent.read_until(is_reply)
    assert (pong["type"], pong["id"]) == ("pong", 2)


def test_a_huge_integer_id_does_not_stall_a_python36_agent(agents: list[AgentProcess]) -> None:
    """Python 3.6 parses a 1 MB integer in ~16 s: the agent refuses it unparsed instead."""
    agent = AgentProcess.start("--simulate", "1", "--interval", "60", python=old_python("3.6.15"))
    agents.append(agent)
    assert agent.read()["python"].startswith("3.6.")
    agent.send(b'{"type":"ping","id":' + b"7" * 1_000_000 + b"}\n")
    agent.send({"type": "ping", "id": "next"})
    err = agent.read_until(is_reply, timeout=3)
    assert (err["type"], err["code"]) == ("error", "bad_json")
    assert "characters" in err["message"]
    assert agent.read_until(is_reply, timeout=3)["id"] == "next"


def test_configure_sets_liveness_and_the_burn_cap_within_the_node_ceiling(
    agents: list[AgentProcess],
) -> None:
    agent = start(agents, "--simulate", "1", "--interval", "60", "--max-duration", "100")
    assert agent.read()["max_duration"] == 100
    for i, bad in enumerate(
        [
            {"liveness_timeout": -1},
            {"liveness_timeout": 0.5},
            {"liveness_timeout": "30"},
            {"max_duration": MAX_DURATION_CEILING + 1},
            {"max_duration": 0},
            {"max_duration": True},
            {"liveness_timeout": 5, "max_duration": 1e12},  # nothing changes, not half of it
        ]
    ):
        agent.send({"type": "configure", "id": i, **bad})
        err = agent.read_until(is_reply)
        assert (err["type"], err["code"], err["id"]) == ("error", "bad_argument", i), err
    agent.send({"type": "configure", "id": "ok", "liveness_timeout": 0, "max_duration": 7200})
    ok = agent.read_until(is_reply)
    assert ok == {
        "type": "ok",
        "request": "configure",
        "id": "ok",
        "liveness_timeout": 0.0,
        "max_duration": 7200.0,
    }
    agent.send({"type": "stress_status", "id": "st"})
    assert agent.read_until(lambda m: m.get("id") == "st")["max_duration"] == 7200.0


def test_a_message_json_cannot_carry_does_not_stop_the_agent() -> None:
    """A NaN relayed from a child once made ``send`` raise and the agent stop, silently."""
    import os

    r, w = os.pipe()
    with os.fdopen(r, "rb") as reader, os.fdopen(w, "wb") as out:
        agent = Agent(None, "none", out=out, in_fd=0)
        agent.send({"type": "event", "detail": {"tflops": float("nan"), "t": float("inf")}})
        agent.send({"type": "event", "id": 3, "detail": {"what": object()}})
        assert agent.running
        out.flush()
        first = json.loads(reader.readline())
        assert first == {"type": "event", "detail": {"tflops": None, "t": None}}
        second = json.loads(reader.readline())
        assert (second["type"], second["code"], second["id"]) == ("error", "internal", 3)
        assert "could not be encoded" in second["message"]


# -- junk, at volume -------------------------------------------------------------------------
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
keys = st.sampled_from(["id", "seconds", "gpus", "action", "load", "xid", "gpu"]) | st.text(
    max_size=6
)
# Kept small: hypothesis spends most of this test's time drawing nested values.
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=2),
    max_leaves=4,
)
junk_types = st.text(max_size=20).filter(lambda t: t not in REQUESTS)


def _request(parts: tuple[dict[str, Any], str, float | None]) -> dict[str, Any]:
    d, kind, seconds = parts
    d = dict(d, type=kind)
    if kind == "set_interval" and seconds is not None:
        d["seconds"] = seconds
    return d


def _dumps(value: Any) -> bytes:
    return json.dumps(value).encode()


# Strategies are built once: building them per draw is what makes hypothesis slow here.
_dicts = st.dictionaries(keys.filter(lambda k: k != "type"), json_values, max_size=3)
# One line of junk (bytes without a newline, never blank) or a known request: a dict that the
# test gives a unique id so that its reply can be counted. ``shutdown`` is never sent (it would
# end the test); set_interval comes with random seconds, valid or not.
junk_line = st.one_of(
    st.binary(min_size=1, max_size=200).map(lambda b: b"\x00" + b.replace(b"\n", b" ")),
    json_values.map(_dumps),
    _dicts.map(_dumps),
    st.tuples(_dicts, junk_types).map(lambda t: _dumps(dict(t[0], type=t[1]))),
    st.tuples(
        _dicts,
        st.sampled_from(["ping", "set_interval", "snapshot", "simulate"]),
        st.none() | st.floats(min_value=0.1, max_value=0.5),
    ).map(_request),
)


@pytest.mark.slow
def test_junk_at_volume_gets_one_reply_per_line(agents: list[AgentProcess]) -> None:
    """Thousands of hypothesis-made junk lines at one live agent: every line is answered, and
    the agent still samples at the end."""
    agent = start(agents, "--simulate", "2", "--interval", "0.2")
    agent.read()
    total = {"lines": 0, "requests": 0}

    @settings(
        max_examples=40,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.lists(junk_line, min_size=100, max_size=100))
    def feed(lines: list[bytes | dict[str, Any]]) -> None:
        expected = []
        payload = b""
        for line in lines:
            if isinstance(line, dict):
                total["requests"] += 1
                line = dict(line, id=f"req-{total['requests']}")
                expected.append(line["id"])
                line = json.dumps(line).encode()
            payload += line + b"\n"
        # Write from a thread: replies (snapshots are big) may fill the pipe while we write.
        writer = threading.Thread(target=agent.send, args=(payload,), daemon=True)
        writer.start()
        seen = [agent.read_until(is_reply, timeout=20).get("id") for _ in lines]
        writer.join(20)
        wanted = set(expected)
        assert sorted(i for i in seen if i in wanted) == sorted(expected)
        total["lines"] += len(lines)

    feed()
    assert total["lines"] >= 2000
    assert agent.proc.poll() is None
    # still sampling: periodic samples keep coming, with growing seq
    agent.send({"type": "set_interval", "seconds": 0.1, "id": "end"})
    agent.read_until(lambda m: m.get("id") == "end")
    seqs = [
        agent.read_until(lambda m: m["type"] == "sample" and "id" not in m)["seq"] for _ in range(3)
    ]
    assert seqs == sorted(seqs) and len(set(seqs)) == 3
    # and nothing was left unanswered: a final ping is the very next reply
    agent.send({"type": "ping", "id": "last"})
    assert agent.read_until(is_reply)["id"] == "last"


def test_an_addressed_agent_acts_on_and_hears_only_its_own_lines() -> None:
    """Many agents on one stdin (a shared srun step): under Python 3.6, ``--addressed`` (name
    from $SLURMD_NODENAME) answers ``@node02`` and ``@*`` lines, ignores the others, writes
    long messages as pieces, and lines for other nodes do not keep it alive."""
    import subprocess

    from gpuctl.node import protocol
    from gpuctl_tests.helpers import node_env, old_python

    py36 = old_python("3.6.15")
    argv = [py36, "-m", "gpuctl.node", "agent", "--simulate", "8", "--addressed"]
    argv += ["--interval", "60", "--liveness-timeout", "2"]
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=node_env({"SLURMD_NODENAME": "node02"}),
    )
    assert proc.stdin is not None and proc.stdout is not None
    stop = threading.Event()
    try:
        for target, req in (("node01", "a"), ("node02", "b"), ("*", "c"), ("node021", "d")):
            line = protocol.encode({"type": "ping", "id": req})
            proc.stdin.write(b"@" + target.encode() + b" " + line)
        proc.stdin.write(b'{"type":"ping","id":"bare"}\n')
        proc.stdin.flush()
        joiner = protocol.Joiner()
        msgs = []
        t0 = time.monotonic()

        def others() -> None:  # then only other nodes' lines: it must still give up after 2 s
            while not stop.wait(0.2):  # a sender's pace, not synchronisation
                try:
                    proc.stdin.write(b"@node01 " + protocol.encode({"type": "ping"}))
                    proc.stdin.flush()
                except OSError:
                    return

        sender = threading.Thread(target=others, daemon=True)
        sender.start()
        while time.monotonic() - t0 < 6:
            raw = proc.stdout.readline()
            if not raw:
                break
            assert len(raw) <= protocol.PIECE_BYTES + 2
            whole = joiner.feed(raw.rstrip(b"\n"))
            if whole:
                msgs.append(json.loads(whole))
                if msgs[-1].get("code") == "liveness":
                    break
        kinds = [m["type"] for m in msgs]
        assert kinds[:2] == ["hello", "sample"] and len(msgs[1]["gpus"]) == 8
        assert [m["id"] for m in msgs if m["type"] == "pong"] == ["b", "c"]
        assert msgs[-1]["code"] == "liveness", msgs[-1]
        assert 1.5 < time.monotonic() - t0 < 5
    finally:
        stop.set()
        proc.kill()
        proc.wait()
