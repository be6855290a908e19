"""The configuration as gpuctl reads it: ``Config`` with its clusters (``ClusterConfig``), their
nodes (``NodeConfig``), a cluster's store (``PrometheusConfig``), the typed feature tables
(``Section``: ``FleetSettings``, ``TuiSettings``, ``StressSettings``, ``AcceptSettings``,
``JobsSettings``), and ``ConfigError``, the one line of a mistake."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuctl.config.keys import (
    DEFAULT_BUNDLE_DIR,
    PROM_FORGET_AFTER_S,
    PROM_MAX_ANSWER,
    PROM_MAX_HOSTS,
    PROM_MAX_SERIES,
    SECTIONS,
    option_name,
)


class ConfigError(Exception):
    """A mistake in the config file; ``str()`` is one line: ``path:line: what is wrong``."""

    def __init__(self, path: str | None, line: int | None, message: str) -> None:
        where = path or "<config>"
        if line is not None:
            where += f":{line}"
        super().__init__(f"{where}: {message}")
        self.path = path
        self.line = line
        self.message = message


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """Everything needed to reach one node and run its agent (hostlists already expanded)."""

    name: str
    cluster: str
    via: str = "ssh"
    python: str = "python3"
    workload_python: str | None = None
    simulate: str | None = None  # a --simulate spec ("8", "8:H100") or None for real GPUs
    interval: float = 1.0
    # ssh: like ``ssh -o`` options, each wins over the ssh config when set; None means "as the
    # ssh config says" (gpuctl.reach.options; its fallbacks when neither says anything:
    # ConnectTimeout 15, ServerAliveInterval 5, host keys strict)
    ssh_config: str | None = None
    known_hosts: str | None = None  # UserKnownHostsFile
    host_key_policy: str | None = None  # StrictHostKeyChecking: strict (yes) | accept-new
    user: str | None = None
    port: int | None = None
    identity: str | None = None
    jump: str | None = None  # ProxyJump
    connect_timeout: float | None = None  # ConnectTimeout
    keepalive_interval: float | None = None  # ServerAliveInterval
    keepalive_count_max: int | None = None  # ServerAliveCountMax
    setup: tuple[str, ...] = ()  # shell lines run before the agent (``module load python``)
    bundle_dir: str = DEFAULT_BUNDLE_DIR  # on the node; ``~`` is the node's $HOME
    # slurm
    partition: str | None = None
    jobid: int | None = None
    slurm_conf: str | None = None
    srun_step: str = "shared"  # via srun: one step for all nodes of a job, or one per node
    slurm: bool = False  # annotate GPUs with the Slurm job holding them
    expect_gpus: int | None = None  # acceptance: GPUs this node must show (gpuctl.accept.expect)

    def describe(self) -> str:
        """A short human line: how this node is reached."""
        extra = []
        if self.via == "ssh":
            if self.user:
                extra.append(f"user={self.user}")
            if self.port:
                extra.append(f"port={self.port}")
            if self.jump:
                extra.append(f"jump={self.jump}")
        if self.via == "srun" and self.jobid is not None:
            extra.append(f"job={self.jobid}")
        if self.simulate:
            extra.append(f"simulate={self.simulate}")
        extra.append(f"python={self.python}")
        return " ".join([self.via, *extra])


# -- typed settings: one class per feature table, its fields the table's keys -------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class Section:
    """The checked keys of one feature table, typed: each field is a key of ``SECTIONS[name]``
    with that key's default (a test holds the two equal), and ``given`` names the keys the
    files set. Consumers read the fields; what passes a table on as options where the
    receiver has defaults of its own (``[stress]`` to ``stress_start``, ``[accept]`` to the
    TUI's runs) takes ``given_values()``, so an unset key leaves the receiver's default."""

    name = ""  # the table's name, ``[fleet]``
    given: frozenset[str] = frozenset()

    def given_values(self) -> dict[str, Any]:
        """The keys the config files set, with their checked values."""
        return {k: getattr(self, k) for k in SECTIONS[self.name] if k in self.given}


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetSettings(Section):
    """``[fleet]``: how the login side keeps its agents (``gpuctl.fleet.fleet.Fleet``)."""

    name = "fleet"
    concurrency: int = 32
    connect_timeout: float = 20.0
    stale_after: float = 3.0
    backoff_base: float = 1.0
    backoff_max: float = 8.0
    liveness_timeout: float = 30.0
    idle_after: float = 1800.0
    idle_below: float = 5.0


@dataclass(frozen=True, slots=True, kw_only=True)
class TuiSettings(Section):
    """``[tui]``: the screen's theme, remapped keys (binding id -> key), whether ``s`` asks
    before it burns one GPU (``confirm_burn``), and where a temperature (°C) and a GPU's memory
    (% used) turn warm and hot on the screen (``mem_critical`` None: memory is never red),
    and whether it draws only ASCII (``ascii`` None: as the locale allows: ``tui.glyphs``)."""

    name = "tui"
    theme: str | None = None
    keys: Mapping[str, str] = field(default_factory=dict)
    confirm_burn: bool = True
    temp_warn: float = 75.0
    temp_critical: float = 85.0
    mem_warn: float = 80.0
    mem_critical: float | None = None
    ascii: bool | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class StressSettings(Section):
    """``[stress]``: the defaults of a burn (``stress_start`` fields)."""

    name = "stress"
    duration: float | None = None
    max_duration: float = 3600.0
    engine: str = "auto"
    dtype: str | None = None
    mem_fraction: float = 0.9
    gpu_burn: str | None = None
    gpu_burn_source: str | None = None
    workload_python: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class AcceptSettings(Section):
    """``[accept]``: the acceptance suite's expectations and where it runs."""

    name = "accept"
    python: str | None = None
    expect_gpus: int | None = None
    allow_no_gpu: bool = False
    floor: float | None = None
    floors: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    dtypes: tuple[str, ...] | None = None
    timeout: float = 3600.0
    threshold: float = 0.1
    expect_model: str | None = None
    expect_nvlinks: int | None = None
    expect_mig: str = "off"
    memtest_mb: int | None = None
    gpus_per_node: int | None = None
    partition: str | None = None
    slurm_conf: str | None = None
    job_dir: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class JobsSettings(Section):
    """``[jobs]``: the job runner's folders, environments and limits."""

    name = "jobs"
    dir: str | None = None
    partition: str | None = None
    slurm_conf: str | None = None
    env_root: str | None = None
    setup: tuple[str, ...] = ()
    max_payload: int | str | None = None
    cancel_on_interrupt: bool = False


@dataclass(frozen=True, slots=True)
class PrometheusConfig:
    """A cluster's ``prometheus*`` keys (see ``PROMETHEUS_KEYS``), checked: where the store is
    and how to ask it (``gpuctl.fleet.prom`` reads it as is). ``url``
    (http(s)://host:port[/prefix]), ``match`` (label matchers every query carries:
    ``cluster="a"``, braces optional), a bearer token file, or a user with a password file
    (basic auth), a CA bundle for TLS, and how old a host's newest sample may be before it
    leaves the fleet (``forget_after``)."""

    url: str
    match: str = ""
    token_file: str | None = None
    user: str | None = None
    password_file: str | None = None
    ca: str | None = None
    forget_after: float = PROM_FORGET_AFTER_S  # s without a sample: the host leaves (0: never)
    max_answer: int = PROM_MAX_ANSWER  # bytes of one answer read at most
    max_series: int = PROM_MAX_SERIES  # series of one answer at most
    max_hosts: int = PROM_MAX_HOSTS  # hosts held at most
    allow_plain_http_credentials: bool = False  # a secret over http:// to a non-loopback host
    timeout: float = 30.0  # per query: a busy store answers 16,384 GPUs' series in seconds
    options: bool = False  # given as ``--prometheus`` and its options: lines name those

    def name(self, key: str) -> str:
        """How a line names the setting ``key`` (``prometheus_ca``): as it was given, the
        config's key or the command line's option (``--prometheus-ca``)."""
        return option_name(key) if self.options else key

    def matchers(self) -> str:
        """``match`` without its braces: the matchers to put inside a query's selector."""
        m = self.match.strip()
        if m.startswith("{") and m.endswith("}"):
            m = m[1:-1].strip()
        return m


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """One ``[clusters.NAME]`` table, nodes expanded, overrides applied per node."""

    name: str
    via: str
    nodes: tuple[NodeConfig, ...]
    partition: str | None = None
    slurm_conf: str | None = None
    discover: bool = False  # via srun without ``nodes``: the node list comes from sinfo
    template: NodeConfig | None = None  # settings for discovered nodes
    prometheus: PrometheusConfig | None = None  # the nodes come from this store, not agents


@dataclass(frozen=True, slots=True)
class Config:
    """The whole configuration. Empty (no clusters) means "watch this machine".

    ``path`` is the most specific file read (the user's, else the site's); ``sources`` every
    file read, site files first. The feature tables are typed settings (``Section``): every
    key with its checked value or its default, and which keys the files set.
    """

    path: str | None = None
    clusters: Mapping[str, ClusterConfig] = field(default_factory=dict)
    read_only: bool = False
    audit_log: str | None = None  # a shared audit log (gpuctl.audit); None: the state folder's
    fleet: FleetSettings = FleetSettings()
    tui: TuiSettings = TuiSettings()
    stress: StressSettings = StressSettings()
    accept: AcceptSettings = AcceptSettings()
    jobs: JobsSettings = JobsSettings()
    sources: tuple[str, ...] = ()

    def nodes(self) -> list[NodeConfig]:
        """Every configured node, cluster by cluster, in hostlist order."""
        return [n for c in self.clusters.values() for n in c.nodes]

    @property
    def empty(self) -> bool:
        """True when no cluster is configured: gpuctl then watches this machine."""
        return not self.clusters
