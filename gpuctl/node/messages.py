"""The agent's messages: one definition for their writers and their readers, as ``jobfiles`` is
for ``outcome.json``.

The agent's own messages, ``Hello`` (with ``GpuStaticWire`` per GPU), ``SampleMessage`` (with
``HostWire``; a GPU's readings are the metric registry's, ``metrics.SAMPLE_FIELDS``) and
``EventMessage``, are written by one function each in ``protocol`` (``hello_message``,
``sample_message``, ``event_message``), which every writer calls (the agent, the readers' events,
the plugins' events, the login side's fixed replay links). The login side's definition of the
same messages is ``gpuctl.core.model`` (msgspec Structs, which decode in C):
``gpuctl_tests/core/test_messages.py`` holds the two equal, field names and types.

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
from typing import Any, Dict, List, Optional

if sys.version_info >= (3, 8):
    from typing import TypedDict  # novermin

    class GpuStaticWire(TypedDict):
        """A GPU's facts in the hello's ``gpus`` (``protocol.STATIC_FIELDS``; ``core.model
        .GpuStatic``): memory in bytes, power limit in W, clocks in MHz."""

        index: int
        uuid: Optional[str]
        name: Optional[str]
        mem_total: Optional[int]
        power_limit: Optional[float]
        max_sm_clock: Optional[int]
        max_mem_clock: Optional[int]
        pcie_gen: Optional[int]
        pcie_width: Optional[int]
        mig_mode: Optional[bool]
        serial: Optional[str]

    class Hello(TypedDict):
        """The agent's first line (``protocol``'s docstring says each field; ``core.model
        .NodeInfo`` reads it)."""

        type: str
        protocol: int
        agent: str
        hostname: str
        pid: int
        python: str
        interval: float
        reader: Optional[str]
        reader_error: Optional[str]
        bindings: Optional[str]
        driver: Optional[str]
        cuda: Optional[str]
        nvml: Optional[str]
        features: List[str]
        read_only: bool
        liveness_timeout: float
        max_duration: float
        boot_time: Optional[float]
        gpus: List[GpuStaticWire]

    class HostWire(TypedDict):
        """A sample's ``host`` (``readers.host.HostStats``; ``core.model.HostSample``)."""

        cpu: Optional[float]
        cpus: Optional[int]
        mem_total: Optional[int]
        mem_available: Optional[int]
        load: Optional[List[float]]
        net_rx: Optional[float]
        net_tx: Optional[float]

    class ProcessWire(TypedDict, total=False):
        """A GPU process, or in a sample's ``parents`` an ancestor of one (``core.model
        .GpuProcess``); null fields are left out on the wire."""

        pid: int
        user: Optional[str]
        command: Optional[str]
        mem: Optional[int]
        uid: Optional[int]
        ppid: Optional[int]
        sm: Optional[float]
        cpu: Optional[float]
        rss: Optional[int]
        started: Optional[float]
        slurm_job: Optional[str]  # the Slurm job of its cgroup (``readers.procs``)

    class SampleMessage(TypedDict, total=False):
        """A ``sample`` (``core.model.Sample``): ``gpus`` one dict per GPU, whose keys are
        the metric registry's (``metrics.SAMPLE_FIELDS``, held to ``GpuSample`` by
        ``test_metrics.py``), compacted (``protocol.compact_gpus``); ``id`` a snapshot's."""

        type: str
        t: float
        seq: int
        gpus: List[Dict[str, Any]]
        parents: List[ProcessWire]
        host: Optional[HostWire]
        id: Any

    class EventMessage(TypedDict):
        """An ``event`` (``core.model.NodeEvent``): ``kind`` "xid" | "gpu_lost" | "burn" |
        "accept", ``gpu`` its index or None, ``detail`` the kind's data."""

        type: str
        t: float
        kind: str
        gpu: Optional[int]
        detail: Dict[str, Any]

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
