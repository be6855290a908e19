"""One way to wait, read from the source: a test waits for a condition through the helpers
(``helpers.wait_until``, ``wait_until_async``, ``until`` on a screen, ``wait_fleet``), never
in a loop of its own that sleeps against a clock (``fleet/test_prom.py`` kept its own
``until``, and ten other modules a deadline loop each)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# Loops that sleep against a clock and are not a test waiting for a condition, with why.
ALLOWED = {
    "helpers.py": "the wait helpers themselves",
    "harness/__init__.py": "wait_gone returns what is left alive; the caller decides",
    "harness/prometheus.py": "a part starting: fails naming its log",
    "harness/slurm.py": "a part starting: HarnessError naming its daemons' logs",
    "harness/sshd.py": "a part starting: HarnessError naming its log",
    "fleet/test_eventloop.py": "runs inside the app as its background task, which exits it",
    "jobs/test_map_cap.py": "the job's own wait for the test's gate, on the node",
    "node/test_liveness.py": "pings sent over a span of time, not a wait for a condition",
    "workloads/gpuburn_standin.py": "the stand-in burner's own pace",
}
SLEEPS = ("sleep(", "pause(")
CLOCKS = ("monotonic()", "loop.time()", "time.time()", "deadline")


def own_wait_loops(source: str) -> list[int]:
    """Lines of loops that sleep (or pause a screen) and read a clock or a deadline."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.While | ast.For)
        and any(s in (text := ast.unparse(node)) for s in SLEEPS)
        and any(c in text for c in CLOCKS)
    ]


def test_the_rule_finds_a_deadline_loop() -> None:
    loop = (
        "async def until(pred):\n"
        "    deadline = time.monotonic() + 20\n"
        "    while not pred():\n"
        "        assert time.monotonic() < deadline\n"
        "        await asyncio.sleep(0.05)\n"
    )
    assert own_wait_loops(loop) == [3]
    assert own_wait_loops("while not pred():\n    x += 1\n") == []


def test_tests_wait_through_the_helpers() -> None:
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        name = path.relative_to(TESTS).as_posix()
        if name not in ALLOWED:
            found += [f"{name}:{line}" for line in own_wait_loops(path.read_text())]
    assert not found, f"wait through gpuctl_tests/helpers.py, not a loop of its own: {found}"
    for name in ALLOWED:
        assert own_wait_loops((TESTS / name).read_text()), f"{name} no longer needs its place"
