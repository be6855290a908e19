"""Functions of every shape run through the real supervisor (Python 3.6) and worker (VENV2).

The predecessor failed on exactly these ("complexity threshold"): free variables, helpers and
globals of the module, multi-line strings at column 0, many subprocess calls, big functions.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpuctl.jobs import Executor, JobFailed, remote

SCALE = 7  # a module global the remote functions read
TABLE = {"a": 1, "b": 2}


def helper_square(x: int) -> int:
    return x * x


def recursive_fib(n: int) -> int:
    return n if n < 2 else recursive_fib(n - 1) + recursive_fib(n - 2)


class Point:
    """A class defined in the test module: travels by value."""

    def __init__(self, x: float, y: float) -> None:
        self.x, self.y = x, y

    def norm2(self) -> float:
        return self.x * self.x + self.y * self.y


SCRIPT = """
import sys
total = 0
for i in range(10):
    total += i
print("total", total, "from", sys.version_info[0])
"""


def uses_globals_and_helpers(n: int) -> dict[str, Any]:
    return {
        "squares": [helper_square(i) * SCALE for i in range(n)],
        "fib": recursive_fib(12),
        "table": sorted(TABLE.items()),
        "python": sys.version.split()[0],
    }


def with_column0_script() -> str:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def many_subprocesses(n: int) -> list[str]:
    results = []
    for i in range(n):
        code = f"""
import os
print({i} * 2, os.getpid() != {os.getpid()})
"""
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        results.append(r.stdout.strip())
    return results


def nested_and_generators(n: int) -> tuple[int, list[int]]:
    def outer(k: int) -> Callable[[int], int]:
        def inner(v: int) -> int:
            return v + k

        return inner

    def gen(m: int) -> Any:
        for i in range(m):
            yield outer(i)(i)

    return sum(gen(n)), list(gen(n))


def make_point(x: float, y: float) -> Point:
    return Point(x * 2, y * 2)


def test_globals_helpers_recursion(make_executor: Any) -> None:
    ex = make_executor()
    out = ex.submit(uses_globals_and_helpers, 5).result(60)
    assert out["squares"] == [0, 7, 28, 63, 112]
    assert out["fib"] == 144
    assert out["table"] == [("a", 1), ("b", 2)]
    assert out["python"].split(".")[:2] == [str(x) for x in sys.version_info[:2]]


def test_closures_lambdas_nested_generators_classes(make_executor: Any) -> None:
    ex = make_executor()
    offset = 1000
    factor = [3]

    def closure(x: int) -> int:
        return x * factor[0] + offset

    jobs = {
        "closure": ex.submit(closure, 2),
        "lambda": ex.submit(lambda a, b=5: a - b, 10, b=3),
        "nested": ex.submit(nested_and_generators, 4),
        "class": ex.submit(make_point, 1.5, 2.0),
        "class_arg": ex.submit(lambda p: p.norm2(), Point(3, 4)),
    }
    assert jobs["closure"].result(60) == 1006
    assert jobs["lambda"].result(60) == 7
    assert jobs["nested"].result(60) == (12, [0, 2, 4, 6])
    p = jobs["class"].result(60)
    assert (p.x, p.y, p.norm2()) == (3.0, 4.0, 25.0)
    assert jobs["class_arg"].result(60) == 25


def test_column0_string_and_dozens_of_subprocesses(make_executor: Any) -> None:
    ex = make_executor()
    a = ex.submit(with_column0_script)
    b = ex.submit(many_subprocesses, 24)
    assert a.result(60) == "total 45 from 3"
    assert b.result(120) == [f"{i * 2} True" for i in range(24)]
    assert a.state == "done" and b.report() is None


def test_hundreds_of_lines_in_a_user_module(make_executor: Any, tmp_path: Path) -> None:
    """A 400-line function in a user module that is not importable on the node: by value."""
    body = ["def big(seed):", "    acc = [seed]"]
    for i in range(400):
        body.append(f"    acc.append((acc[-1] * 31 + {i}) % 1000003)")
    body += ["    return acc[-1], len(acc)", ""]
    mod_path = tmp_path / "user_big_module.py"
    mod_path.write_text("\n".join(body))
    spec = importlib.util.spec_from_file_location("user_big_module", mod_path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["user_big_module"] = mod
    try:
        spec.loader.exec_module(mod)
        expected = mod.big(5)
        assert make_executor().submit(mod.big, 5).result(60) == expected
    finally:
        del sys.modules["user_big_module"]


def test_stdout_stderr_and_status_phases(make_executor: Any) -> None:
    def chatty() -> int:
        print("to stdout", flush=True)
        print("to stderr", file=sys.stderr, flush=True)
        return 1

    job = make_executor().submit(chatty)
    assert job.result(60) == 1
    assert "to stdout" in job.stdout()
    assert "to stderr" in job.stderr()
    phases = [line for line in Path(job.jobdir, "status.jsonl").read_text().splitlines()]
    assert [__import__("json").loads(p)["phase"] for p in phases] == [
        "start",
        "env_ok",
        "loading",
        "running",
        "saving",
        "done",
    ]
    assert oct(os.stat(job.jobdir).st_mode & 0o777) == "0o700"
    meta = __import__("json").loads(Path(job.jobdir, "meta.json").read_text())
    assert meta["python_version"] == sys.version.split()[0]
    assert meta["name"].endswith("chatty")
    assert len(meta["payload_sha256"]) == 64


def test_map_in_order_and_remote_decorator(
    make_executor: Any, venv1: str, venv2: str, job_root: str
) -> None:
    ex = make_executor()
    assert list(ex.map(helper_square, range(50))) == [i * i for i in range(50)]
    assert list(ex.map(lambda a, b: a + b, [1, 2], [10, 20], chunksize=1)) == [11, 22]
    with pytest.raises(ZeroDivisionError):
        list(ex.map(lambda x: 1 // x, [1, 0, 2]))

    @remote(target="local", supervisor_python=venv1, python=venv2, job_root=job_root, store=False)
    def double(x: int) -> int:
        return 2 * x

    assert double(21) == 42
    assert double.submit(5).result(60) == 10  # type: ignore[attr-defined]
    assert double.local(3) == 6  # type: ignore[attr-defined]

    # a @remote function that calls another: the inner one travels as its plain function and
    # runs inside the outer job's process (no executor, no lock travels)
    @remote(target="local", supervisor_python=venv1, python=venv2, job_root=job_root, store=False)
    def quadruple(x: int) -> tuple[int, int]:
        import os

        return double(double(x)), os.getpid()

    value, pid = quadruple(5)
    assert value == 20 and pid != os.getpid()


def test_one_bad_item_of_a_map_fails_alone(make_executor: Any) -> None:
    def picky(x: int) -> Any:
        import sys
        import threading

        if x == 1:
            return threading.Lock()  # cannot be pickled: this item's error
        if x == 2:
            sys.exit(3)  # not the chunk's end
        if x == 3:
            raise KeyboardInterrupt("item 3")
        return x * 10

    (job,) = make_executor().map_jobs(picky, range(6), chunksize=6)  # all in one chunk
    out = job.result(60)
    assert [o[0] for o in out] == ["ok", "err", "err", "err", "ok", "ok"]
    assert [o[1] for o in out if o[0] == "ok"] == [0, 40, 50]
    assert isinstance(out[1][1], TypeError) and "cannot be pickled" in str(out[1][1])
    assert isinstance(out[2][1], SystemExit) and out[2][1].code == 3
    assert isinstance(out[3][1], KeyboardInterrupt) and "picky" in out[3][2]
    results = make_executor().map(picky, [0, 3])
    assert next(results) == 0
    with pytest.raises(JobFailed) as info:  # not a KeyboardInterrupt of this process
        next(results)
    assert isinstance(info.value.__cause__, KeyboardInterrupt)
    assert "a map item raised KeyboardInterrupt: item 3" in str(info.value)


@pytest.mark.slow
def test_200mb_argument_and_200mb_result(make_executor: Any) -> None:
    big = os.urandom(200 * 1024 * 1024)

    def roundtrip(data: bytes) -> bytes:
        import hashlib

        h = hashlib.sha256(data).digest()
        return h + data[::-1][: len(data) - 32] + h  # ~200 MB back

    job = make_executor().submit(roundtrip, big)
    out = job.result(300)
    import hashlib

    h = hashlib.sha256(big).digest()
    assert len(out) == len(big) + 32
    assert out[:32] == h and out[-32:] == h
    assert out[32:64] == big[::-1][:32]


def test_default_local_executor_uses_this_python(job_root: str) -> None:
    """No VENV options at all: this very interpreter as VENV2, python3 as VENV1."""
    ex = Executor("local", job_root=job_root, store=False)
    assert ex.submit(helper_square, 9).result(60) == 81
