"""The node's process module (``gpuctl.node.proc``) under the node's real Python 3.6: the
parent-death signal, stopping a group, a subreaper's descendants, the JSON-line reader, and the
rule that nothing else calls ``prctl``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from gpuctl.node import proc, protocol
from gpuctl_tests.helpers import REPO, node_env, old_python, wait_until


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return text[text.rindex(")") + 2] not in "ZX"


def run36(script: str, *args: str) -> subprocess.Popen[str]:
    """``script`` under the real Python 3.6, gpuctl importable; stdout is a pipe of lines."""
    return subprocess.Popen(
        [old_python("3.6.15"), "-c", script, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=node_env(),
    )


def test_prctl_lives_in_the_process_module_only() -> None:
    """DESIGN's rule: one home for the parent-death signal (and the subreaper)."""
    offenders = []
    for path in sorted((REPO / "gpuctl").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel == "gpuctl/node/proc.py":
            continue
        text = path.read_text()
        for word in ("prctl", "PR_SET_PDEATHSIG", "PR_SET_CHILD_SUBREAPER"):
            if word in text:
                offenders.append(f"{rel}: {word}")
    assert offenders == [], "use gpuctl.node.proc instead"
    # and the check can fail: the module itself does hold them
    assert "PR_SET_PDEATHSIG" in (REPO / "gpuctl" / "node" / "proc.py").read_text()


def test_proc_pid_stat_is_parsed_in_the_process_module_only() -> None:
    """One reader of /proc/PID/stat and /proc/stat's boot time (``proc.read_stat``,
    ``proc.boot_time``): the idioms of a parse of its own (the fields after the command name's
    last ``)``, the ``btime`` line) appear nowhere else in the package."""
    idioms = ('rindex(")")', 'rindex(b")")', 'rfind(")")', 'rfind(b")")', '"btime', 'b"btime')
    offenders = []
    for path in sorted((REPO / "gpuctl").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel == "gpuctl/node/proc.py":
            continue
        text = path.read_text()
        offenders += [f"{rel}: {idiom}" for idiom in idioms if idiom in text]
    assert offenders == [], "read /proc/PID/stat with gpuctl.node.proc.read_stat"
    proc_text = (REPO / "gpuctl" / "node" / "proc.py").read_text()
    assert 'rindex(b")")' in proc_text and 'b"btime' in proc_text  # the rule sees the real ones


SPAWNER = r"""
import sys, time
from gpuctl.node import proc
child = proc.spawn(["sleep", "300"])
print(child.pid, flush=True)
time.sleep(300)
"""


def test_a_spawned_child_dies_with_its_parent_even_when_the_parent_is_sigkilled() -> None:
    parent = run36(SPAWNER)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert alive(child)
    assert os.getpgid(child) == child  # a session (so a group) of its own
    parent.kill()
    parent.wait(10)
    wait_until(lambda: not alive(child), 10, "the child to die with its parent")


RACE = r"""
import os, signal, sys, time
from gpuctl.node import proc
# The parent is gone before the child's preexec runs: the death signal would never come, so
# the child must kill itself. The parent here is an intermediate that exits at once.
r, w = os.pipe()
mid = os.fork()
if mid == 0:
    pre = proc.die_with_parent()  # records the intermediate as the parent
    os.close(r)
    pid = os.fork()
    if pid == 0:
        os.close(w)
        time.sleep(0.5)  # the intermediate is gone by now
        pre()  # what the forked child of Popen runs before exec
        with open(sys.argv[1], "w") as f:
            f.write("survived")  # an orphan that outlives its parent
        time.sleep(300)
        os._exit(0)
    os.write(w, str(pid).encode())
    os._exit(0)
os.close(w)
child = int(os.read(r, 64))
os.waitpid(mid, 0)
print(child, flush=True)
"""


def test_the_child_of_a_parent_that_died_before_prctl_kills_itself(tmp_path: Path) -> None:
    marker = tmp_path / "survived"
    p = run36(RACE, str(marker))
    out, err = p.communicate(timeout=30)
    child = int(out.strip() or 0)
    assert child, err
    wait_until(lambda: not alive(child), 10, "the orphaned child to kill itself")
    assert not marker.exists()


STOPPER = r"""
import json, signal, subprocess, sys, time
from gpuctl.node import proc
# A group whose leader traps TERM and has a child that ignores it too.
child = proc.spawn(["sh", "-c", "trap '' TERM; sleep 300 & echo started; wait"],
                   stdout=subprocess.PIPE)
child.stdout.readline()
t0 = time.monotonic()
gone = proc.stop_group(child.pid, grace=0.5, proc=child, kill_wait=5)
print(json.dumps({"gone": gone, "seconds": time.monotonic() - t0,
                  "alive": proc.group_alive(child.pid), "rc": child.returncode}), flush=True)
"""


def test_stop_group_escalates_to_kill_and_says_the_group_is_gone() -> None:
    p = run36(STOPPER)
    out, err = p.communicate(timeout=30)
    result = json.loads(out.strip().splitlines()[-1])
    assert result["gone"] is True and result["alive"] is False, err
    assert result["rc"] == -signal.SIGKILL
    assert 0.5 <= result["seconds"] < 3


SUBREAPER = r"""
import json, os, sys, time
from gpuctl.node import proc
assert proc.become_subreaper()
# A double fork with setsid: the grandchild leaves our session and its parent exits.
pid = os.fork()
if pid == 0:
    os.setsid()
    if os.fork() == 0:
        if os.fork() == 0:
            time.sleep(300)  # a great-grandchild
            os._exit(0)
        time.sleep(300)
        os._exit(0)
    os._exit(0)
os.waitpid(pid, 0)
deadline = time.time() + 10
while len(proc.descendants()) < 2 and time.time() < deadline:
    time.sleep(0.02)
before = proc.descendants()
print(json.dumps(before), flush=True)
killed = proc.kill_descendants(grace=0.5)
print(json.dumps({"killed": killed, "after": proc.descendants()}), flush=True)
"""


def test_a_subreaper_kills_every_descendant_a_double_fork_left() -> None:
    p = run36(SUBREAPER)
    out, err = p.communicate(timeout=60)
    lines = out.strip().splitlines()
    before = json.loads(lines[0])
    result = json.loads(lines[1])
    assert len(before) == 2, err  # reparented to us, not to init
    assert sorted(result["killed"]) == sorted(before) and result["after"] == []
    assert not any(alive(pid) for pid in before)


def test_bundle_env_puts_the_running_package_first() -> None:
    env = proc.bundle_env({"X": "1"}, base={"PYTHONPATH": "/elsewhere", "PATH": "/bin"})
    assert env["PYTHONPATH"] == os.pathsep.join([str(REPO), "/elsewhere"])
    assert env["PYTHONUNBUFFERED"] == "1" and env["X"] == "1" and env["PATH"] == "/bin"
    assert proc.code_root() == str(REPO)


# -- reading children ----------------------------------------------------------------------------
def test_line_buffer_bounds_memory_and_drops_overlong_lines_whole() -> None:
    dropped: list[int] = []
    buf = proc.LineBuffer(max_line=10, on_overlong=lambda: dropped.append(1))
    assert buf.feed(b"short\npar") == [b"short"]
    assert buf.feed(b"tial\n") == [b"partial"]
    # an overlong line arriving in pieces: dropped when the bound is passed, its tail skipped
    assert buf.feed(b"x" * 8) == []
    assert buf.feed(b"x" * 8) == [] and len(dropped) == 1
    assert len(buf._buf) == 0  # nothing of it kept
    assert buf.feed(b"xxx\nok\n") == [b"ok"]
    # an overlong line complete in one chunk
    assert buf.feed(b"y" * 11 + b"\nfine\n") == [b"fine"] and len(dropped) == 2
    assert buf.feed(b"last") == [] and buf.finish() == [b"last"] and buf.finish() == []
    assert buf.overlong == 2


def test_json_lines_survive_what_a_child_may_write() -> None:
    text: list[str] = []
    reader = proc.JsonLines(on_text=text.append)
    euro = "€".encode()
    chunks = [
        b'{"type":"progress","tflops":NaN,"errors":Infinity,"x":-Infinity,"big":1e999}\n',
        b"not json at all\n",
        b"[1, 2]\n",
        b'{"type":"info","n":' + b"9" * 5000 + b"}\n",  # a huge number: refused, not parsed
        b'{"type":"info","message":"' + euro[:2],  # UTF-8 split across chunks
        euro[2:] + b'"}\n',
        b'{"type":"deep","x":' + b"[" * 100_000 + b"]" * 100_000 + b"}\n",
        b"\xff\xfe broken\n",
        b'{"type":"last"}',
    ]
    got: list[dict[str, Any]] = []
    for chunk in chunks:
        got.extend(reader.feed(chunk))
    got.extend(reader.finish())
    assert got[0] == {
        "type": "progress",
        "tflops": None,
        "errors": None,
        "x": None,
        "big": None,
    }
    assert got[1] == {"type": "info", "message": "€"}
    assert got[2] == {"type": "last"}
    assert len(got) == 3
    assert text[0] == "not json at all" and text[1] == "[1, 2]"
    assert text[2].startswith('{"type":"info","n":999') and len(text) == 5


HUGE = r"""
import sys, time
from gpuctl.node import proc, protocol
line = b'{"type":"ping","id":' + b"7" * 1000000 + b'}\n'
t0 = time.monotonic()
reader = proc.JsonLines()
assert reader.feed(line) == []
try:
    protocol.decode(line[:-1])
except protocol.ProtocolError as e:
    assert e.code == "bad_json", e.code
else:
    raise AssertionError("decoded")
print(time.monotonic() - t0)
"""


def test_a_huge_integer_is_refused_at_once_under_python36() -> None:
    """Python 3.6 parses a 1 MB integer in ~16 s; the guard refuses it before parsing."""
    p = run36(HUGE)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert float(out) < 1.0


def test_protocol_decode_refuses_non_finite_numbers_and_huge_ones() -> None:
    for line in (
        b'{"type":"ping","id":NaN}',
        b'{"type":"ping","x":1e999}',
        b'{"type":"ping","id":' + b"1" * (protocol.MAX_NUMBER_CHARS + 1) + b"}",
        b'{"type":"ping","x":0.' + b"1" * (protocol.MAX_NUMBER_CHARS + 1) + b"}",
    ):
        with pytest.raises(protocol.ProtocolError) as info:
            protocol.decode(line)
        assert info.value.code == "bad_json"
    ok = protocol.decode(b'{"type":"ping","id":' + b"1" * protocol.MAX_NUMBER_CHARS + b"}")
    assert ok["id"] == int("1" * protocol.MAX_NUMBER_CHARS)


def test_sanitize_turns_non_finite_floats_into_null() -> None:
    msg = {"a": float("nan"), "b": [1.5, float("inf"), {"c": -float("inf")}], "d": "x"}
    assert protocol.sanitize(msg) == {"a": None, "b": [1.5, None, {"c": None}], "d": "x"}
    assert json.loads(protocol.encode(protocol.sanitize(msg))) == protocol.sanitize(msg)


def test_the_whole_node_side_imports_under_python36() -> None:
    """Annotations are evaluated when a 3.6 module is imported: ``list[int]`` or ``X | None``
    would pass a syntax check and still break the node. Import every node module for real."""
    names = sorted(
        ".".join(p.relative_to(REPO).with_suffix("").parts)
        for p in (REPO / "gpuctl" / "node").rglob("*.py")
        if p.name != "__main__.py"
    )
    script = "import importlib, sys\nfor n in sys.argv[1:]: importlib.import_module(n)\n"
    p = run36(script, *names)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert len(names) >= 12


def test_the_login_side_reads_a_broken_number_as_unknown() -> None:
    """A node's NaN, infinity or 400-digit number is None for gpuctl (lenient), never a reason
    to drop the whole sample; the agent reading requests refuses them (strict)."""
    line = '{"type":"sample","a":NaN,"b":1e999,"c":%s,"d":-Infinity,"e":7}' % ("9" * 400)
    msg = protocol.decode(line, lenient=True)
    assert msg == {"type": "sample", "a": None, "b": None, "c": None, "d": None, "e": 7}
    with pytest.raises(protocol.ProtocolError):
        protocol.decode(line)


EDGE_NUMBERS = [
    "1" * 99,
    "-" + "1" * 99,
    "1" * 100,
    "-" + "1" * 100,
    "0." + "1" * 98,
    "0." + "1" * 99,
    "1" * 32 + "." + "1" * 32 + "e" + "1" * 32,  # 100 characters in three short runs
    "1" * 33 + "." + "1" * 33 + "e" + "1" * 33,
    "1e308",
    "1.7976931348623157e308",
    "1e309",
    "-1e999",
    "1E+400",
    "1e-400",
    "1e99",
    "-0.0",
    "NaN",
    "Infinity",
    "-Infinity",
    "12592370048",
    "1795496491.9738526",
]


@pytest.mark.parametrize("nan_to_none,long_to_none", [(False, False), (True, False), (True, True)])
def test_parse_json_without_per_number_guards_reads_what_the_guards_read(
    nan_to_none: bool, long_to_none: bool
) -> None:
    """The fast path (integers parsed in C) is taken only where it changes nothing: for
    every edge number, in every mode, the answer (or the refusal) is the guarded parser's."""

    def outcome(parse: Any, text: str) -> object:
        try:
            return ("ok", parse(text))
        except ValueError as e:
            return ("refused", type(e).__name__)

    for number in EDGE_NUMBERS:
        for text in (f'{{"x":{number}}}', f'[1,"GPU-41e592",{number},{{"y":[{number}]}}]'):
            guarded = outcome(lambda t: protocol._parse_guarded(t, nan_to_none, long_to_none), text)
            for given in (text, text.encode()):
                got = outcome(lambda t: protocol.parse_json(t, nan_to_none, long_to_none), given)
                assert repr(got) == repr(guarded), (number, given)


def test_a_sample_lines_integers_are_parsed_without_their_guard() -> None:
    """What the login side reads every second from every node takes the fast path."""
    from gpuctl.node.readers.sim import SimReader

    reader = SimReader.from_spec("8:H100", seed=3)
    line = protocol.encode({"type": "sample", "t": 1.5, "seq": 1, "gpus": reader.sample()})
    assert protocol._short_integers(line)
    assert not protocol._short_integers(line.replace(b'"seq":1', b'"seq":' + b"7" * 33))


def test_a_session_s_resident_memory_is_the_sum_of_its_processes() -> None:
    """The supervisor's memory limit reads it (``session_rss``): a process of a new session and
    the child it started, the child holding 64 MiB it has written to."""
    child = "import sys, time; b = bytearray(64 << 20); print('held', flush=True); time.sleep(60)"
    script = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}])"
    leader = proc.spawn([old_python("3.6.15"), "-c", script], stdout=subprocess.PIPE)
    try:
        assert leader.stdout is not None and leader.stdout.readline() == b"held\n"
        st = proc.read_stat(leader.pid)
        assert st is not None and st.session == os.getsid(leader.pid) == leader.pid
        kids = wait_until(lambda: proc.descendants(leader.pid))
        each = [proc.read_stat(pid) for pid in [leader.pid, *kids]]
        assert all(s is not None and s.session == leader.pid for s in each)
        total = proc.session_rss(leader.pid)
        assert total >= 64 << 20 and total == sum(s.rss for s in each if s is not None)
        assert proc.session_rss(os.getsid(0)) > 0 and proc.session_rss(2**22 + 7) == 0
    finally:
        proc.stop_group(leader.pid, grace=1.0)
        leader.wait(10)


def _fake_process(
    root: Path, pid: int, argv: list[str], comm: bytes, state: str, pgrp: int
) -> None:
    """``root/PID`` as /proc shows a process: cmdline, and stat with start time 50 s after boot."""
    folder = root / str(pid)
    folder.mkdir()
    (folder / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    # fields 3.. of proc(5): state ppid pgrp session tty tpgid flags 4 faults utime stime
    # cutime cstime priority nice threads itrealvalue starttime(22) vsize rss(24)
    rest = f"{state} 1 {pgrp} {pgrp} 0 -1 0 0 0 0 0 7 3 0 0 20 0 1 0 {50 * proc.CLOCK_TICKS} 0 9"
    (folder / "stat").write_bytes(b"%d (%s) %s\n" % (pid, comm, rest.encode()))
    (folder / "environ").write_bytes(b"PATH=/usr/bin\0")


def test_other_sessions_burners_are_read_through_the_one_stat_reader(tmp_path: Path) -> None:
    """``stress.scan_burners`` reads /proc/PID/stat and the boot time through ``proc``: a burner
    that leads its group is found with its age, a child of it, a zombie and the user's other
    processes are not, and a process whose name is not UTF-8 (``prctl(PR_SET_NAME)`` takes any
    bytes) does not make the scan fail (its own text-mode parse raised UnicodeDecodeError)."""
    from gpuctl.node import stress

    (tmp_path / "stat").write_bytes(b"cpu  1 2 3 4\nbtime 1000\nprocesses 9\n")
    burn = ["python3", "-m", "gpuctl.workloads.burn", "--gpu", "0", "--duration", "60"]
    _fake_process(tmp_path, 100, burn, b"python3 (x) y", "S", pgrp=100)
    _fake_process(tmp_path, 101, burn, b"python3", "S", pgrp=100)  # not its group's leader
    _fake_process(tmp_path, 102, burn, b"python3", "Z", pgrp=102)  # a zombie
    _fake_process(tmp_path, 103, ["bash"], b"\xff\xfe", "S", pgrp=103)
    before = time.time()
    (found,) = stress.scan_burners(str(tmp_path))
    assert (found["pid"], found["engine"], found["gpu"], found["duration"]) == (
        100,
        "torch",
        "0",
        60.0,
    )
    assert found["owner"] is None and found["device"] == "cuda"
    assert before - 1050 - 1 <= found["age"] <= time.time() - 1050 + 1
    stats = [proc.read_stat(pid, str(tmp_path)) for pid in (100, 101)]
    assert [s.pgrp if s else None for s in stats] == [100, 100]
