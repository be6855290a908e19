"""``gpuctl accept``: the acceptance suite on nodes, with live progress, a report and history.

    gpuctl accept --local [--device cpu] [--quick] [--report-dir D]
    gpuctl accept [--nodes HOSTLIST] [--via ssh|slurm] [--quick] [--report-dir D]
    gpuctl accept history [NODE]

Config ``[accept]`` keys: ``python`` (VENV2 on the nodes), ``partition``, ``slurm_conf``,
``job_dir`` (a folder the Slurm nodes share), ``gpus_per_node``; options win over them.
``--via slurm`` submits to the cluster ``gpuctl.reach.slurm.slurm_target`` picks: ``[accept]
slurm_conf``, else the configured Slurm clusters' one ``slurm_conf`` (the cluster holding
``--nodes`` when they are configured nodes), else ``$SLURM_CONF``.

The last stdout line is ``[RESULT] SUCCESS``, ``[RESULT] WARNING: [...]`` or ``[RESULT] FAILURE:
[...]``; the exit code says the outcome (``gpuctl.accept.results``: 0 pass, 1 a node failed, 3 a
node gave no report, 4 passed with warnings; 2 for a usage mistake). ``--json`` puts the cluster
report alone on stdout, ``--junit FILE`` writes JUnit XML, ``--drain-failed`` drains the failed
nodes in Slurm. ``--via ssh`` (the default with configured nodes) runs the single-node
suite through each node's agent; ``--via slurm`` submits one batch job so DDP spans the nodes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuctl import paths
from gpuctl.accept.expect import from_config
from gpuctl.accept.history import DEFAULT_THRESHOLD, Degradation, HistoryStore, sparkline
from gpuctl.accept.results import (
    EXIT_CODES,
    drain_failed,
    exit_code,
    failed_nodes,
    junit_xml,
    outcome,
)
from gpuctl.accept.run import AcceptOptions, AcceptRun, Progress, start_fleet_run, start_local_run
from gpuctl.cli.common import emit_json, load_user_config
from gpuctl.cli.main import mutating as _mutating
from gpuctl.config import Config, NodeConfig
from gpuctl.workloads.accept_suite.render import summary_table, table
from gpuctl.workloads.accept_suite.schema import MARKERS, RESULT_FAILURE, RESULT_SUCCESS, SECTIONS

RESULT_WARNING = "[RESULT] WARNING"
PROLOG_TIMEOUT_S = 30.0  # --prolog's default --timeout: a prolog holds the job's start
PROLOG_GRACE_S = 10.0  # past it, the process ends whatever the nodes do

if TYPE_CHECKING:
    from gpuctl.cli.base import Subcommands
    from gpuctl.fleet.fleet import Fleet


def register(sub: Subcommands) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "accept",
        help="prove nodes healthy: acceptance suite, report, exit code, history",
        description="Run the acceptance suite on nodes; '[RESULT] ...' is the last line.",
    )
    where = p.add_argument_group("where")
    where.add_argument("--local", action="store_true", help="this machine")
    where.add_argument("--nodes", metavar="HOSTLIST", help="configured nodes, e.g. gpu[01-04]")
    where.add_argument(
        "--via", choices=("ssh", "slurm"), help="through each node's agent (ssh) or one Slurm job"
    )
    what = p.add_argument_group("what")
    what.add_argument("--quick", action="store_true", help="seconds per section, not minutes")
    what.add_argument(
        "--pairs",
        action="store_true",
        help="find the slow or failing node or link among many: all-reduce between pairs of "
        "--nodes (two-node Slurm jobs, --via slurm), then bisection",
    )
    what.add_argument(
        "--prolog",
        action="store_true",
        help="seconds and no load, for a Slurm prolog or HealthCheckProgram: the GPUs NVML "
        "sees, their build and health (ECC, row remaps, kernel-log XIDs, throttling); always "
        f"ends within --timeout ({PROLOG_TIMEOUT_S:g} s) with its exit code; not kept in history",
    )
    what.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cuda (default), or cpu: the same suite on the CPU with gloo",
    )
    what.add_argument(
        "--report-dir", metavar="D", help="write the JSON reports here (default: state dir)"
    )
    what.add_argument("--expect-gpus", type=int, metavar="N", help="fewer GPUs per node fail")
    what.add_argument("--allow-no-gpu", action="store_true", help="no GPU is a SKIP")
    what.add_argument(
        "--floor",
        type=float,
        help="one minimum fraction of peak TFLOP/s for every GPU and dtype (default: per model "
        "and dtype, [accept.floors] in the config over the shipped table)",
    )
    what.add_argument(
        "--dtypes", metavar="LIST", help="GEMM dtypes to check, e.g. bf16,fp16 (fp32,tf32,bf16)"
    )
    what.add_argument("--python", help="VENV2 interpreter (torch) on the nodes")
    what.add_argument(
        "--skip", action="append", default=[], choices=SECTIONS, help="leave a section out"
    )
    what.add_argument("--timeout", type=float, help="seconds per run (3600)")
    what.add_argument(
        "--burn", metavar="DURATION", help="[BURN]: all GPUs at once, traced, e.g. 10m (0: skip)"
    )
    what.add_argument(
        "--expect-model", metavar="TEXT", help="[SHAPE]: every GPU's name contains it, e.g. H100"
    )
    what.add_argument("--expect-nvlinks", type=int, metavar="N", help="[SHAPE]: NVLinks per GPU")
    what.add_argument("--memtest-mb", type=int, metavar="MIB", help="[MEMTEST]: MiB to test")
    what.add_argument(
        "--link-errors",
        type=int,
        metavar="N",
        help="[HEALTH]: NVLink CRC/replay errors or PCIe replays a GPU may add during the run "
        "(100; an NVLink recovery always fails)",
    )
    what.add_argument(
        "--busbw-floor",
        metavar="GBPS",
        help="[DDP] all-reduce busbw floor: 360, or per GPUs-per-node x nodes: 8x1=360,8x2=180",
    )
    slurm = p.add_argument_group("slurm")
    slurm.add_argument("--partition", help="Slurm partition")
    slurm.add_argument("--nnodes", type=int, help="nodes to allocate (default: --nodes, else 1)")
    slurm.add_argument(
        "--gpus-per-node", type=int, help="GPUs (DDP ranks) per node (default 8; 2 with cpu)"
    )
    slurm.add_argument("--job-dir", help="shared folder for job files (default: state dir)")
    deploy = p.add_argument_group("deployments (not run by gpuctl's tests: see the README)")
    deploy.add_argument(
        "--container",
        metavar="IMAGE",
        help="run the suite inside IMAGE: through Slurm with Pyxis/enroot (implies --via slurm), "
        "or the image of --emit k8s",
    )
    deploy.add_argument(
        "--emit",
        choices=("k8s",),
        help="print Kubernetes Jobs (YAML) that run the suite, one per --nodes, and exit",
    )
    deploy.add_argument(
        "--k8s-pvc",
        default="gpuctl-accept-reports",
        metavar="NAME",
        help="--emit k8s: the PersistentVolumeClaim the reports go to",
    )
    out = p.add_argument_group("results")
    out.add_argument(
        "--json", action="store_true", help="the report as JSON on stdout (the rest: stderr)"
    )
    out.add_argument("--junit", metavar="FILE", help="JUnit XML: one test case per node x check")
    out.add_argument(
        "--drain-failed",
        action="store_true",
        help="drain the nodes that failed in Slurm, the reason naming the failure",
    )
    hist = p.add_argument_group("history")
    hist.add_argument(
        "--threshold",
        type=float,
        help="a drop beyond this fraction of a node's healthy median is a degradation "
        f"({DEFAULT_THRESHOLD})",
    )
    # a degradation always fails now; the option stays so that existing scripts still run
    hist.add_argument("--fail-on-degradation", action="store_true", help=argparse.SUPPRESS)
    hist.add_argument("--no-history", action="store_true", help="do not record this run")
    p.add_argument("--test-break-rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--test-slow-compute", type=int, help=argparse.SUPPRESS)
    p.set_defaults(func=run)
    hsub = p.add_subparsers(dest="accept_command", metavar="{history}")
    h = hsub.add_parser("history", help="earlier runs and the trend of each figure")
    h.add_argument("node", nargs="?", help="one node (default: every node, latest run)")
    h.add_argument("--limit", type=int, default=20, help="runs shown per node")
    h.add_argument("--json", action="store_true", help="JSON for scripts")
    h.set_defaults(func=run_history)


def _user_error(message: str) -> Exception:
    from gpuctl.cli.base import UserError

    return UserError(message)


def _options(args: argparse.Namespace, config: Config) -> AcceptOptions:
    """The run's options: what is typed, else the config's ``[accept]`` table, else defaults."""
    if args.floor is not None and not 0 < args.floor <= 1:
        raise _user_error("--floor must be within (0, 1], e.g. 0.6")
    if args.timeout is not None and args.timeout <= 0:
        raise _user_error("--timeout must be positive")
    if args.expect_gpus is not None and args.expect_gpus < 0:
        raise _user_error("--expect-gpus must be 0 or more")
    if args.threshold is not None and not 0 < args.threshold < 1:
        raise _user_error("--threshold must be within (0, 1), e.g. 0.1")
    if args.test_slow_compute is not None and args.test_slow_compute < 1:
        raise _user_error("--test-slow-compute must be >= 1")
    if args.expect_nvlinks is not None and args.expect_nvlinks < 0:
        raise _user_error("--expect-nvlinks must be 0 or more")
    if args.memtest_mb is not None and args.memtest_mb < 1:
        raise _user_error("--memtest-mb must be at least 1")
    if args.link_errors is not None and args.link_errors < 0:
        raise _user_error("--link-errors must be 0 or more")
    if args.prolog and args.burn:
        raise _user_error("--burn loads the GPUs: leave it out of --prolog")
    if args.prolog and args.device == "cpu":
        raise _user_error("--prolog checks the GPUs through NVML: leave out --device cpu")
    conf = config.accept
    dtypes = conf.dtypes
    if args.dtypes is not None:
        from gpuctl.workloads.accept_suite.peaks import DTYPE_COLUMN

        dtypes = tuple(d.strip() for d in args.dtypes.split(",") if d.strip())
        bad = [d for d in dtypes if d not in DTYPE_COLUMN]
        if bad or not dtypes:
            raise _user_error(
                f"--dtypes: unknown {','.join(bad) or 'empty list'} (known: "
                f"{','.join(DTYPE_COLUMN)})"
            )
    python = args.python or conf.python
    burn = _burn_args(args.burn)
    return AcceptOptions(
        quick=args.quick,
        device=args.device,
        expect_gpus=args.expect_gpus,
        allow_no_gpu=args.allow_no_gpu or conf.allow_no_gpu,
        floor=args.floor if args.floor is not None else conf.floor,
        floors=conf.floors or None,
        dtypes=dtypes,
        python=python,
        # --timeout (or [accept] timeout) excludes the burn stage, which adds its own length
        timeout=(args.timeout or (PROLOG_TIMEOUT_S if args.prolog else conf.timeout))
        + (float(burn[1]) if burn else 0.0),
        prolog=args.prolog,
        threshold=args.threshold if args.threshold is not None else conf.threshold,
        expect_model=args.expect_model or conf.expect_model,
        expect_nvlinks=args.expect_nvlinks
        if args.expect_nvlinks is not None
        else conf.expect_nvlinks,
        expect_mig=conf.expect_mig,
        memtest_mb=args.memtest_mb if args.memtest_mb is not None else conf.memtest_mb,
        test_break_rank=args.test_break_rank,
        test_slow_compute=args.test_slow_compute,
        extra_args=tuple(a for s in args.skip for a in ("--skip", s))
        + burn
        + _floor_args(args.busbw_floor)
        + (("--link-errors", str(args.link_errors)) if args.link_errors is not None else ()),
    )


def _burn_args(text: str | None) -> tuple[str, ...]:
    """``("--burn", seconds)`` for the suite, () without a burn; a bad duration is one line."""
    from gpuctl.workloads.accept_suite.sections.burn import parse_duration

    if text is None:
        return ()
    try:
        seconds = parse_duration(text)
    except ValueError as e:
        raise _user_error(str(e)) from None
    return ("--burn", f"{seconds:g}") if seconds else ()


def _floor_args(text: str | None) -> tuple[str, ...]:
    """``("--busbw-floor", text)`` once the suite's parser accepts it; a bad one is one line."""
    from gpuctl.workloads.accept_suite.sections.ddp import parse_floors

    if text is None:
        return ()
    try:
        parse_floors(text)
    except ValueError as e:
        raise _user_error(str(e)) from None
    return ("--busbw-floor", text)


def _hostlist(text: str) -> list[str]:
    from gpuctl.reach.slurm import SlurmValueError, check_hostlist

    try:
        return check_hostlist(text, "--nodes")
    except SlurmValueError as e:
        raise _user_error(str(e)) from None


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) and v else None


def _decided(args: argparse.Namespace) -> bool | None:
    """The read-only decision ``gpuctl.cli.main`` made before the command ran (None: none)."""
    value = getattr(args, "read_only", None)
    return value if isinstance(value, bool) else None


@_mutating("the acceptance suite")
def run(args: argparse.Namespace) -> int:
    config = load_user_config(args)  # read-only mode was refused before (gpuctl.service)
    if args.local and (args.nodes or args.via):
        raise _user_error("--local runs on this machine: leave out --nodes and --via")
    options = _options(args, config)
    if args.emit:
        return _emit(args, config, options)
    if args.container:
        if args.local or args.via == "ssh":
            raise _user_error("--container runs the suite through Slurm (Pyxis): use --via slurm")
        args.via = "slurm"
    if args.pairs:
        from gpuctl.cli.accept_pairs import run_pairs

        if args.report_dir is None:
            args.report_dir = str(paths.state_dir() / paths.REPORTS)
        if args.junit:
            _check_writable(args.junit)
        return run_pairs(args, config, options, write_text=_write_text)
    history = None if args.no_history or args.prolog else HistoryStore()
    if args.prolog:
        _hard_deadline(options.timeout + PROLOG_GRACE_S)
    if args.report_dir is None:
        args.report_dir = str(paths.state_dir() / paths.REPORTS)
    else:  # a folder the user named: one that cannot hold the report is a mistake, said now
        _check_folder("--report-dir", args.report_dir)
    if args.junit:
        _check_writable(args.junit)
    printer = Printer()
    # --json: stdout is the report alone; the progress and the summary go to stderr
    with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
        report = asyncio.run(_drive(args, config, options, history, printer))
        printer.conclude(report)
        if args.junit:
            _write_text(Path(args.junit), junit_xml(report))
            print(f"junit: {args.junit}")
        if args.drain_failed:
            report["drained"] = _drain(args, config, report)
    if args.json:
        emit_json(report)
    return exit_code(report)


def _hard_deadline(seconds: float) -> None:
    """``--prolog`` never hangs, whatever a node or its driver does: ``seconds`` from now the
    process ends as ERROR (a node that could not be checked), saying so in one line."""

    def end() -> None:
        why = f"no verdict within {seconds:g} s (--prolog's deadline)"
        with contextlib.suppress(Exception):
            sys.stderr.write(f"gpuctl: accept: {why}: the node could not be checked\n")
            sys.stdout.write(f"{RESULT_FAILURE}: {json.dumps([why])}\n")
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(EXIT_CODES["ERROR"])

    timer = threading.Timer(seconds, end)
    timer.daemon = True
    timer.start()


def _emit(args: argparse.Namespace, config: Config, options: AcceptOptions) -> int:
    """``--emit k8s``: the manifest on stdout; nothing runs."""
    from gpuctl.accept.k8s import ManifestError, job_manifests

    if not args.container:
        raise _user_error("--emit k8s needs --container IMAGE (an image with torch and CUDA)")
    nodes = _hostlist(args.nodes) if args.nodes else []
    gpn = args.gpus_per_node or _gpus_per_node(config) or (2 if options.device == "cpu" else 8)
    try:
        text = job_manifests(
            options.suite_args(),
            args.container,
            nodes=nodes,
            gpus=gpn,
            pvc=args.k8s_pvc,
            timeout_s=options.timeout,
            cuda=options.device == "cuda",
        )
    except ManifestError as e:
        raise _user_error(str(e)) from None
    sys.stdout.write(text)
    return 0


def _gpus_per_node(config: Config) -> int | None:
    return config.accept.gpus_per_node  # a whole number: the config checked it


def _check_writable(name: str) -> None:
    """``--junit FILE``: its folder made when missing, as ``--report-dir`` is (the umask's
    mode); one that cannot be, or a FILE that is a folder, is one line now, not a traceback
    after the run."""
    path = Path(name).expanduser().absolute()
    if path.is_dir():
        raise _user_error(f"--junit {name}: a folder, not a file (name the XML file in it)")
    _check_folder("--junit", name, path.parent)


def _check_folder(option: str, name: str, folder: Path | None = None) -> None:
    """``folder`` (default: ``name`` itself) made when missing and writable, or one line."""
    folder = Path(name).expanduser() if folder is None else folder
    what = f"{option} {name}" if str(folder) == name else f"{option} {name}: {folder}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise _user_error(f"{what} is not a folder") from None
    except OSError as e:
        raise _user_error(f"{what}: cannot make it: {e.strerror or e}") from None
    if not os.access(folder, os.W_OK):
        raise _user_error(f"{what}: cannot write into it")


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _drain(args: argparse.Namespace, config: Config, report: dict[str, Any]) -> dict[str, str]:
    """``--drain-failed``: drain the failed nodes in Slurm; node -> reason (printed)."""
    from gpuctl.reach.slurm import SlurmError, slurm_target

    failed = list(failed_nodes(report))
    if not failed:
        return {}
    try:
        client = slurm_target(config, "accept", nodes=failed).client()
        drained = drain_failed(report, client, read_only=_decided(args))
    except SlurmError as e:
        print(f"gpuctl: --drain-failed: {e}", file=sys.stderr)
        return {}
    for node, reason in drained.items():
        print(f"drained {node} in Slurm: {reason}")
    return drained


async def _drive(
    args: argparse.Namespace,
    config: Config,
    options: AcceptOptions,
    history: HistoryStore | None,
    printer: Printer,
) -> dict[str, Any]:
    if args.local or (config.empty and not args.nodes and args.via is None):
        name = os.environ.get("SLURMD_NODENAME") or socket.gethostname()  # Slurm's name in a prolog
        expected, _ = from_config(config, [name])  # [accept] expect_gpus
        accept_run, fleet = await start_local_run(
            replace(options, expected=expected),
            report_dir=args.report_dir,
            history=history,
            node=name,
            read_only=_decided(args),
        )
        return await _follow(accept_run, printer, fleet)
    if args.via == "slurm":
        return await _drive_slurm(args, config, options, history, printer)
    nodes = _select_nodes(config, args.nodes)
    from gpuctl.fleet.build import link_for
    from gpuctl.fleet.fleet import Fleet
    from gpuctl.fleet.ssh import BundleStore

    store = BundleStore()
    links = {n.name: link_for(n, store=store, seed=i) for i, n in enumerate(nodes)}
    fleet = Fleet(links)
    await fleet.start()
    python_for = {n.name: options.python or n.workload_python for n in nodes}
    expected, gres_from = from_config(config, [n.name for n in nodes])
    accept_run = start_fleet_run(
        fleet,
        [n.name for n in nodes],
        replace(options, expected=expected, gres_from=gres_from),
        report_dir=args.report_dir,
        history=history,
        python_for=python_for,
        via="ssh",
        read_only=_decided(args),
    )
    return await _follow(accept_run, printer, fleet)


def _select_nodes(config: Config, hostlist: str | None) -> list[NodeConfig]:
    known = {n.name: n for n in config.nodes()}
    if not known:
        raise _user_error(
            "no nodes configured: run 'gpuctl accept --local', or 'gpuctl config init' to "
            "write a config with the nodes"
        )
    if not hostlist:
        return list(known.values())
    wanted = _hostlist(hostlist)
    missing = [n for n in wanted if n not in known]
    if missing:
        raise _user_error(
            f"{missing[0]} is not in the config ({config.path or 'none'}); "
            f"configured: {', '.join(list(known)[:8])}"
        )
    return [known[n] for n in wanted]


async def _drive_slurm(
    args: argparse.Namespace,
    config: Config,
    options: AcceptOptions,
    history: HistoryStore | None,
    printer: Printer,
) -> dict[str, Any]:
    from gpuctl.accept.slurm import SlurmJobSpec, start_slurm_run
    from gpuctl.reach.slurm import SlurmError, slurm_target

    nodelist = None
    names: list[str] = []
    nnodes = args.nnodes or 1
    if args.nodes:
        names = _hostlist(args.nodes)
        nodelist, nnodes = ",".join(names), len(names)
    gpn = args.gpus_per_node or _gpus_per_node(config) or (2 if options.device == "cpu" else 8)
    if nnodes < 1 or gpn < 1:
        raise _user_error("--nnodes and --gpus-per-node must be at least 1")
    try:
        target = slurm_target(config, "accept", nodes=names, partition=args.partition)
        spec = SlurmJobSpec(
            nnodes=nnodes,
            gpus_per_node=gpn,
            nodelist=nodelist,
            partition=target.partition,
            time_limit_min=max(5, int(options.timeout // 60) + 5),
            exclusive=options.device == "cuda",
            container=args.container,
        )
        accept_run = await start_slurm_run(
            options,
            spec,
            python=options.python or ("python3" if args.container else None),
            job_dir=args.job_dir or config.accept.job_dir,
            client=target.client(),
            report_dir=args.report_dir,
            history=history,
            read_only=_decided(args),
        )
    except SlurmError as e:
        raise _user_error(str(e)) from None
    print(f"submitted Slurm job {accept_run.job_id}: {nnodes} node(s) x {gpn}", flush=True)
    try:
        return await _follow(accept_run, printer, None)
    except SlurmError as e:
        raise _user_error(str(e)) from None


async def _follow(accept_run: AcceptRun, printer: Printer, fleet: Fleet | None) -> dict[str, Any]:
    printer.run = accept_run
    accept_run.subscribe(printer.on_progress)
    try:
        return await accept_run.wait()
    except asyncio.CancelledError:  # Ctrl-C: stop the suites, then let the interrupt through
        await accept_run.cancel()
        raise
    finally:
        if fleet is not None:
            await fleet.stop()


class Printer:
    """Progress lines while the run goes, then the summary and the result line."""

    def __init__(self) -> None:
        self.run: AcceptRun | None = None

    def on_progress(self, p: Progress) -> None:
        multi = self.run is not None and len(self.run.nodes) > 1
        prefix = f"{p.node}: " if multi else ""
        if p.kind == "line":
            print(prefix + p.text, flush=True)
        elif p.kind == "error":
            print(f"{p.node}: ERROR: {p.text}", flush=True)
        elif p.kind == "silent":
            print(f"{p.node}: {p.text}", file=sys.stderr, flush=True)
        elif p.kind == "done" and multi:
            print(f"{p.node}: finished, {p.verdict}", flush=True)

    def conclude(self, report: dict[str, Any]) -> None:
        assert self.run is not None
        nodes = report["nodes"]
        if len(nodes) == 1:
            only = next(iter(nodes.values()))
            if only["report"] is not None:
                print("\n".join(summary_table(only["report"])))
        rows: list[tuple[str, ...]] = [
            (
                "NODE",
                *(MARKERS[s] if s != "ddp_train" else "DDP-TRAIN" for s in SECTIONS),
                "VERDICT",
            )
        ]
        for name, node in nodes.items():
            rows.append((name, *(node["sections"][s] for s in SECTIONS), node["verdict"]))
        print("\n" + "\n".join(table(rows)))
        for path in self.run.report_paths:
            print(f"report: {path}")
        for d in report["degradations"]:
            print(f"[HISTORY] DEGRADED {Degradation.from_dict(d).describe()}")
        for w in report.get("warnings") or []:
            print(f"[WARN] {w}")
        failures = list(report["failures"])  # a degradation is one of them
        result = outcome(report)
        if result == "PASS":
            print(RESULT_SUCCESS, flush=True)
        elif result == "WARN":
            print(f"{RESULT_WARNING}: {json.dumps(report['warnings'])}", flush=True)
        else:
            print(f"{RESULT_FAILURE}: {json.dumps(failures)}", flush=True)


def run_history(args: argparse.Namespace) -> int:
    store = HistoryStore()
    if args.limit < 1:
        raise _user_error("--limit must be at least 1")
    nodes = [args.node] if args.node else store.nodes()
    if args.node and args.node not in store.nodes():
        raise _user_error(f"no acceptance runs recorded for {args.node} (in {store.path})")
    if not nodes and not args.json:
        print(f"no acceptance runs recorded yet ({store.path})")
        return 0
    if args.json:
        out = {
            n: {
                "runs": [
                    {
                        "id": r.id,
                        "t": r.t,
                        "device": r.device,
                        "quick": r.quick,
                        "verdict": r.verdict,
                        "via": r.via,
                        "degradations": list(r.degradations),
                    }
                    for r in store.runs(n, args.limit)
                ],
                "trend": {k: store.series(n, k, args.limit) for k in store.keys(n)},
            }
            for n in nodes
        }
        emit_json({"nodes": out})
        return 0
    if not args.node:
        rows: list[tuple[str, ...]] = [
            ("NODE", "LAST RUN", "DEVICE", "VERDICT", "DEGRADED", "RUNS")
        ]
        for n in nodes:
            runs = store.runs(n, 1000)
            last = runs[0]
            rows.append(
                (
                    n,
                    _when(last.t),
                    last.device + (" quick" if last.quick else ""),
                    last.verdict,
                    ", ".join(d["key"] for d in last.degradations) or "-",
                    str(len(runs)),
                )
            )
        print("\n".join(table(rows)))
        return 0
    node = args.node
    runs = store.runs(node, args.limit)
    rows = [("WHEN", "DEVICE", "VIA", "VERDICT", "DEGRADED")]
    for r in runs:
        rows.append(
            (
                _when(r.t),
                r.device + (" quick" if r.quick else ""),
                r.via or "-",
                r.verdict,
                ", ".join(d["key"] for d in r.degradations) or "-",
            )
        )
    print("\n".join(table(rows)))
    trend: list[tuple[str, ...]] = [("FIGURE", "TREND", "LAST", "BEST", "UNIT")]
    for key in store.keys(node):
        series = store.series(node, key, args.limit, device=runs[0].device if runs else None)
        if not series:
            continue
        values = [v for _, v, _ in series]
        trend.append(
            (key, sparkline(values), f"{values[-1]:.4g}", f"{max(values):.4g}", series[-1][2])
        )
    print("\n" + "\n".join(table(trend)))
    return 0


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
