"""``gpuctl accept --pairs --via slurm --nodes HOSTLIST``: all-reduce between pairs of nodes,
then bisection to the node or link that is slow or failing (``gpuctl.accept.pairs``). Each pair
is a two-node Slurm job of the suite's [DDP] all-reduce; the pairs of a round run at once."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuctl.accept.pairs import PairResult, RunPair, find_bad, slurm_pairs
from gpuctl.accept.results import drain_failed, exit_code, junit_xml
from gpuctl.accept.run import AcceptOptions
from gpuctl.cli.base import UserError
from gpuctl.config import Config
from gpuctl.workloads.accept_suite.schema import RESULT_FAILURE, RESULT_SUCCESS


def run_pairs(
    args: argparse.Namespace,
    config: Config,
    options: AcceptOptions,
    *,
    write_text: Callable[[Path, str], None],
) -> int:
    """The pass (``--junit``'s folder checked by the caller; ``write_text`` writes it)."""
    from gpuctl.cli.common import emit_json
    from gpuctl.reach.slurm import SlurmError, SlurmValueError, check_hostlist

    if args.local or args.prolog or args.via != "slurm":
        raise UserError(
            "--pairs runs each pair of nodes as a two-node Slurm job: use --via slurm --nodes "
            "HOSTLIST (without --local or --prolog)"
        )
    if not args.nodes:
        raise UserError("--pairs needs --nodes HOSTLIST: the nodes to test in pairs")
    try:
        names = check_hostlist(args.nodes, "--nodes")
    except SlurmValueError as e:
        raise UserError(str(e)) from None
    if len(names) < 2:
        raise UserError("--pairs needs two nodes or more in --nodes")
    out = sys.stderr if args.json else sys.stdout
    try:
        report = asyncio.run(find_bad(names, _printing(_slurm(args, config, options), out)))
    except SlurmError as e:
        raise UserError(str(e)) from None
    _conclude(report, out)
    path = Path(args.report_dir) / time.strftime("accept-pairs-%Y%m%d-%H%M%S.json")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=1))
        print(f"report: {path}", file=out)
    except OSError as e:
        print(f"gpuctl: accept: report not written to {path}: {e.strerror}", file=sys.stderr)
    if args.junit:
        write_text(Path(args.junit), junit_xml(report))
        print(f"junit: {args.junit}", file=out)
    if args.drain_failed and report["bad_nodes"]:
        report["drained"] = _drain(args, config, report, out)
    print(
        RESULT_SUCCESS
        if report["verdict"] == "PASS"
        else f"{RESULT_FAILURE}: " + json.dumps(report["failures"]),
        file=out,
        flush=True,
    )
    if args.json:
        emit_json(report)
    return exit_code(report)


def _slurm(args: argparse.Namespace, config: Config, options: AcceptOptions) -> RunPair:
    from gpuctl.accept.slurm import SlurmJobSpec, start_slurm_run
    from gpuctl.reach.slurm import slurm_target

    gpn = args.gpus_per_node or config.accept.gpus_per_node or (2 if options.device == "cpu" else 8)
    target = slurm_target(config, "accept", nodes=args.nodes.split(","), partition=args.partition)
    client = target.client()
    read_only = args.read_only if isinstance(getattr(args, "read_only", None), bool) else None

    async def start(opts: AcceptOptions, a: str, b: str) -> Any:
        spec = SlurmJobSpec(
            nnodes=2,
            gpus_per_node=gpn,
            nodelist=f"{a},{b}",
            partition=target.partition,
            time_limit_min=max(5, int(opts.timeout // 60) + 5),
            exclusive=opts.device == "cuda",
        )
        return await start_slurm_run(
            opts,
            spec,
            python=opts.python,
            job_dir=args.job_dir or config.accept.job_dir,
            client=client,
            report_dir=None,
            history=None,
            read_only=read_only,
        )

    return slurm_pairs(options, start)


def _printing(run_pair: RunPair, out: Any) -> RunPair:
    async def run(a: str, b: str, round_: int) -> PairResult:
        print(f"round {round_}: all-reduce {a}-{b} ...", file=out, flush=True)
        r = await run_pair(a, b, round_)
        print(f"round {round_}: {r.text()}", file=out, flush=True)
        return r

    return run


def _conclude(report: dict[str, Any], out: Any) -> None:
    for node, evidence in report["bad_nodes"].items():
        print(f"BAD NODE {node}: {evidence}", file=out)
    for link in report["bad_links"]:
        print(f"BAD LINK {'-'.join(link['nodes'])}: {link['evidence']}", file=out)
    if report["verdict"] == "PASS":
        best = report["best_busbw"]
        print(f"every pair good (best {best or 0:.3f} GB/s)", file=out)


def _drain(
    args: argparse.Namespace, config: Config, report: dict[str, Any], out: Any
) -> dict[str, str]:
    from gpuctl.reach.slurm import SlurmError, slurm_target

    read_only = args.read_only if isinstance(getattr(args, "read_only", None), bool) else None
    try:
        client = slurm_target(config, "accept", nodes=list(report["bad_nodes"])).client()
        drained = drain_failed(report, client, read_only=read_only)
    except SlurmError as e:
        print(f"gpuctl: --drain-failed: {e}", file=sys.stderr)
        return {}
    for node, reason in drained.items():
        print(f"drained {node} in Slurm: {reason}", file=out)
    return drained
