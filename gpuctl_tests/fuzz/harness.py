"""What every fuzz test of a parser of outside data asserts, and the two lanes' sizes.

A parser given anything answers in one of two ways: a clean result, or its own error (a
``ValueError`` such as ConfigError, ProtocolError, RecordingError) whose message is one line;
never another exception (a traceback for the user), never more than ``PEAK_BYTES`` of memory
for an input of a few KB. Runs are derandomized: a failure is the same on every machine, and
the example hypothesis shrank it to becomes a regression test in the module.

The unit lane runs ``UNIT_EXAMPLES`` per property (a few seconds for the whole suite); the full
lane, as a test marked ``slow``, ``FULL_EXAMPLES``.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

UNIT_EXAMPLES = 40
FULL_EXAMPLES = 800
PEAK_BYTES = 16 << 20  # 16 MiB for an input of a few KB: a blow-up, not noise
# Per example: far above what a parse of a few KB costs even on a loaded 2-core machine, so only
# a runaway (quadratic or worse) trips it; hypothesis reports it with the example.
DEADLINE_MS = 5000

LANES = [
    pytest.param(UNIT_EXAMPLES, id="unit"),
    pytest.param(FULL_EXAMPLES, id="full", marks=pytest.mark.slow),
]

T = TypeVar("T")


def run(examples: int, strategy: st.SearchStrategy[T], check: Callable[[T], None]) -> None:
    """``check`` every value ``strategy`` draws, ``examples`` of them, derandomized."""

    @settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=DEADLINE_MS,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(strategy)
    def prop(value: T) -> None:
        check(value)

    prop()


def bounded(
    fn: Callable[..., T], *args: Any, errors: tuple[type[BaseException], ...] = ()
) -> T | BaseException:
    """``fn(*args)``: its result, or the error of ``errors`` it raised (its message one line),
    its memory peak under ``PEAK_BYTES``. Any other exception fails the test."""
    tracemalloc.start()
    try:
        try:
            result: T | BaseException = fn(*args)
        except errors as e:
            message = str(e)
            assert message and "\n" not in message.strip(), f"not one line: {message!r}"
            assert "Traceback" not in message, message
            result = e
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < PEAK_BYTES, f"{fn.__name__}: {peak} bytes at the peak"
    return result


def junk_bytes(valid: list[bytes]) -> st.SearchStrategy[bytes]:
    """Anything, and what is close to the ``valid`` inputs: cut short, a byte changed, a run of
    bytes put in, two glued together."""
    base = st.sampled_from(valid)

    @st.composite
    def mutated(draw: st.DrawFn) -> bytes:
        data = bytearray(draw(base))
        for _ in range(draw(st.integers(1, 4))):
            how = draw(st.sampled_from(("cut", "flip", "insert", "glue", "dup")))
            at = draw(st.integers(0, max(0, len(data) - 1))) if data else 0
            if how == "cut":
                del data[at:]
            elif how == "flip" and data:
                data[at] = draw(st.integers(0, 255))
            elif how == "insert":
                data[at:at] = draw(st.sampled_from(INSERTS))
            elif how == "glue":
                data += draw(base)
            elif how == "dup" and data:
                data[at:at] = data[at : at + draw(st.integers(1, 64))]
        return bytes(data)

    return st.one_of(st.binary(max_size=512), mutated())


# What a hostile or broken writer puts in: numbers JSON cannot hold, deep nesting, control
# characters, bad UTF-8, huge integers, other types where a number or string belongs.
INSERTS = (
    b"NaN",
    b"Infinity",
    b"-1e999",
    b"9" * 400,
    b"[" * 300,
    b"{" * 300,
    b'"\x00\x1b[2J\n"',
    b"\xff\xfe\xc3",
    b'"\\ud800"',
    b"null",
    b"true",
    b'{"type": "sample"}',
    b'"' + b"x" * 2000 + b'"',
    b"\n",
    b"\r\n",
    b",",
    b":",
    b"-0",
    b"1.5e308",
    b"[]",
    b"{}",
)
