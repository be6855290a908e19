"""The agent's plugin messages (stress and acceptance) and its answer to ``signal``: one
definition for their writers and their readers, as ``protocol`` is for the hello and the sample and ``jobfiles`` for
``outcome.json``.

The writers are the agent's plugins, ``stress`` and ``accept`` (what they send is typed as these
classes: mypy checks every key and the type of its value); the login side decodes them through
the same classes (``gpuctl.core.wire.parse``, which keeps a field only when it has the type
declared here: a key written that no class here names would be dropped on the way in, which
``gpuctl_tests/node/test_stress_plugin.py`` and ``gpuctl_tests/accept/test_agent_plugin.py``
check on real agents). Python 3.6 has no TypedDict: there the classes are not made (the node side
only needs them for mypy, under ``TYPE_CHECKING``), on 3.8 and later they are. Standard library
only.

Stress (``stress``'s docstring has the requests):
    ``StressReply``   the answer to ``stress_start`` and to ``stress_stop``
    ``StressStatus``  the answer to ``stress_status``: ``GpuBurn`` per GPU, ``BurnerInfo`` per
                      burner of another session
    ``BurnState``     a ``burn`` event's detail (kept as the GPU's ``burn`` annotation)
    ``OwnerWire``     who started a burn
The agent's own ``signal`` (a GPU process signalled from the screen):
    ``SignalReply``   the answer to ``signal``
Acceptance (``accept``'s docstring has the requests):
    ``AcceptStarted`` the answer to ``accept_start``
    ``AcceptEvent``   an ``accept`` event's detail: what the suite wrote on its progress
                      descriptor, relayed, and the agent's own ``exit``
"""

import sys
from typing import Any, List, Optional

if sys.version_info >= (3, 8):
    from typing import TypedDict  # novermin

    class OwnerWire(TypedDict):
        """Who started a burn, as the protocol carries it (``gpuctl.service.Owner`` reads it)."""

        user: str
        host: str
        session: str

    class BurnState(TypedDict, total=False):
        """A burn on one GPU: the agent's ``burn`` event detail, kept as the GPU's ``burn``
        annotation, which the TUI and the CLI read.

        ``state``: "starting" | "running" | "stopping" | "done" | "failed"; ``ends_at`` unix
        time; ``verdict``: "OK" | "FAULTY" | "DIED" | None; ``reason`` why it ended; ``owner``
        the gpuctl session that started it (None: a burner no gpuctl marked); the rest is what
        the burner reports (``PROGRESS``: rates in TFLOP/s, ``elapsed`` in s, ``temp`` in C,
        ``message`` a start-up line).
        """

        state: str
        engine: Optional[str]
        ends_at: Optional[float]
        dtype: Optional[str]
        verdict: Optional[str]
        reason: Optional[str]
        pid: Optional[int]
        owner: Optional[OwnerWire]
        tflops: Optional[float]
        tflops_mean: Optional[float]
        errors: Optional[int]
        iterations: Optional[float]
        elapsed: Optional[float]
        size: Optional[int]
        duty: Optional[float]
        temp: Optional[float]
        name: Optional[str]
        message: Optional[str]

    class BurnerInfo(TypedDict, total=False):
        """A burner process an agent found on its node (``stress_status``'s ``others``,
        ``stress_stop``'s ``kept``): its pid, engine, ``gpu`` as its command line names it (an
        index or a UUID), ``gpu_index``, ``device`` ("cuda" | "cpu"), ``duration`` and ``age``
        (s), and ``owner`` (None: no gpuctl marked it)."""

        pid: int
        engine: Optional[str]
        gpu: Optional[str]
        gpu_index: Optional[int]
        device: Optional[str]
        duration: Optional[float]
        age: Optional[float]
        owner: Optional[OwnerWire]

    class StressReply(TypedDict, total=False):
        """An agent's answer to ``stress_start`` (``started``, ``busy``: GPU indices;
        ``engine``; ``ends_at``; ``duration`` s) or to ``stress_stop`` (``stopping``: GPUs of
        its own burns; ``others``: pids of other sessions' burners it signalled; ``kept``: the
        burners it left alone). ``id`` is the request's."""

        type: str
        request: str
        id: Any
        started: List[int]
        busy: List[int]
        engine: Optional[str]
        ends_at: Optional[float]
        duration: float
        stopping: List[int]
        others: List[int]
        kept: List[BurnerInfo]

    class GpuBurn(BurnState, total=False):
        """A burn of ``stress_status``'s ``burns``: the GPU's index and its burn."""

        gpu: int

    class StressStatus(TypedDict, total=False):
        """An agent's answer to ``stress_status`` (``type`` "stress"): its burns (by GPU), the
        burners of other sessions it found (``others``), its cap on a burn's duration (s),
        whether its GPUs are simulated, and the gpu_burn binary on its PATH."""

        type: str
        id: Any
        burns: List[GpuBurn]
        others: List[BurnerInfo]
        max_duration: float
        simulated: bool
        gpu_burn: Optional[str]

    class SignalReply(TypedDict, total=False):
        """An agent's answer to ``signal`` (the agent's own request, not a plugin's): the pid,
        the signal sent and what it did, in words."""

        type: str
        request: str
        id: Any
        pid: int
        signal: str
        message: str

    class AcceptStarted(TypedDict, total=False):
        """An agent's answer to ``accept_start``: the run's name and the suite's pid."""

        type: str
        request: str
        id: Any
        run: str
        pid: int

    class AcceptEvent(TypedDict, total=False):
        """An ``accept`` event's detail: ``run`` names the run; ``event`` is what happened.

        ``start`` (``node``, ``device``, ``quick``, ``pid``: the suite's); ``section``
        (``section``, ``state`` "start" | "end", at the end ``verdict``, ``summary``,
        ``seconds``); ``line`` (``section``, ``text``: a line of the suite's output);
        ``result`` (``verdict``, ``failures``, ``report``: the report's path on the node); and
        last the agent's ``exit`` (``rc``, ``report``: the report as an object or None,
        ``reason`` why there is none, ``stdout_tail`` and ``stderr_tail``). ``t`` is the
        suite's clock.
        """

        run: str
        event: str
        t: float
        node: str
        device: str
        quick: bool
        pid: int
        section: Optional[str]
        state: str
        verdict: str
        summary: Optional[str]
        seconds: float
        text: str
        failures: List[str]
        report: Any  # the path (``result``), the report (``exit``)
        rc: Optional[int]
        reason: Optional[str]
        stdout_tail: List[str]
        stderr_tail: List[str]


# A burner's progress figures the agent passes on in a burn's detail (``BurnState``'s last keys).
PROGRESS = ("tflops", "tflops_mean", "errors", "iterations", "elapsed", "size", "duty", "temp",
            "name", "message")
