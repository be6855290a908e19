"""``gpuctl stress``: burn GPUs without the TUI.

    gpuctl stress start NODES|--all [--gpus 0,1] [--duration S] [--dtype D] [--engine E]
                                    [--force] [--json]
    gpuctl stress stop NODES|--all [--gpus 0,1] [--any-owner]
    gpuctl stress status [NODES] [--json]
    gpuctl stress run [--device cpu|cuda] [--duration S] [--dtype D] [--json]

``start`` and ``stop`` act on the nodes named, or on every configured node with ``--all``:
neither guesses. ``start`` stays attached until the burns end (duration, Ctrl-C): a burn lives
as long as the agent that started it (the dead-man's switch), and the agent as long as this
command. It refuses GPUs whose latest sample shows processes of another user unless ``--force``.
``stop`` also reaches burns other gpuctl sessions started (the agent finds them in /proc), but
only those of this user unless ``--any-owner``, and says which it left alone and whose they
are. ``status`` shows every burn with its owner. ``run`` burns this machine's GPUs (or its CPU)
directly and prints a JSON summary with ``--json``.
Exit codes: 0 every burn OK, 1 a burn FAULTY, DIED or unreachable, 2 a usage mistake.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gpuctl import service
from gpuctl.cli.base import ExitCode
from gpuctl.cli.common import (
    add_demo_option,
    build_fleet,
    emit_json,
    load_user_config,
    positive_seconds,
)
from gpuctl.core import wire
from gpuctl.core.deadline import wait_for
from gpuctl.core.model import BurnState, NodeEvent, NodeSnapshot, NodeState, burn_from_wire
from gpuctl.core.wire import JsonObject
from gpuctl.fleet import control
from gpuctl.fleet.fleet import Fleet
from gpuctl.fleet.session import LinkError, refusal
from gpuctl.node.messages import BurnerInfo, StressReply, StressStatus

if TYPE_CHECKING:
    from gpuctl.cli.base import Subcommands


DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp64")
ENGINES = ("auto", "torch", "gpu-burn")
OTHERS_SHOWN = 20  # GPUs of other users' processes listed when --force is missing


class BurnRow(BurnState):
    """A burn of ``stress start``'s table and ``--json`` output: the GPU and its burn."""

    node: str
    gpu: int


class BurnerRow(BurnerInfo):
    """A burner of ``stress status``'s table and ``--json`` output: the node and the burner."""

    node: str


def register(sub: Subcommands) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "stress",
        help="burn GPUs: start/stop/status over the fleet, or run on this machine",
        description="Burn GPUs with checked GEMMs (torch) or gpu-burn.",
    )
    ssub = p.add_subparsers(dest="stress_command", metavar="{start,stop,status,run}")
    p.set_defaults(func=lambda args: _usage(p))

    def fleet_args(q: argparse.ArgumentParser, default: str) -> None:
        q.add_argument("nodes", nargs="?", metavar="NODES", help=f"hostlist ({default})")
        q.add_argument("--gpus", metavar="LIST", help="GPU indices, e.g. 0,1 (default: all)")
        add_demo_option(q)
        q.add_argument(
            "--timeout", type=positive_seconds, default=20.0, help="seconds to reach nodes"
        )

    def scope(q: argparse.ArgumentParser) -> None:
        q.add_argument("--all", action="store_true", help="every configured node (no NODES)")

    start = ssub.add_parser("start", help="start burns and follow them until they end")
    fleet_args(start, "or --all")
    scope(start)
    start.add_argument("--duration", type=float, help="seconds (default: config, else 3600)")
    start.add_argument(
        "--dtype", choices=DTYPES, help="the burn's dtype (default: [stress] dtype, else bf16)"
    )
    start.add_argument(
        "--engine",
        choices=ENGINES,
        default="auto",
        help="auto (default): gpu-burn where the node has it, else torch",
    )
    start.add_argument(
        "--force", action="store_true", help="burn GPUs that run other users' processes too"
    )
    start.add_argument("--read-only", action="store_true", help="refuse (as the config can)")
    start.add_argument("--json", action="store_true", help="JSON summary on stdout")
    start.set_defaults(func=run_start)
    stop = ssub.add_parser("stop", help="stop your burns, also those of your other sessions")
    fleet_args(stop, "or --all")
    scope(stop)
    stop.add_argument(
        "--any-owner", action="store_true", help="also stop burns other users started"
    )
    stop.add_argument("--read-only", action="store_true", help="refuse (as the config can)")
    stop.set_defaults(func=run_stop)
    status = ssub.add_parser("status", help="burns running on the nodes, with their owners")
    fleet_args(status, "default: all")
    status.add_argument("--json", action="store_true", help="JSON for scripts")
    status.set_defaults(func=run_status)
    here = ssub.add_parser("run", help="burn this machine's GPUs (or CPU) and report")
    here.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="burn the GPUs (default) or the CPU",
    )
    here.add_argument("--duration", type=float, default=30.0, help="seconds (default 30)")
    here.add_argument(
        "--dtype", choices=DTYPES, help="default: bf16 where supported, fp32 on the CPU"
    )
    here.add_argument("--gpus", metavar="LIST", help="GPU indices (default: all)")
    here.add_argument("--size", type=int, help="matrix size (default: cpu 2048, cuda 8192)")
    here.add_argument("--python", help="interpreter with torch (default: this one)")
    here.add_argument("--json", action="store_true", help="JSON summary on stdout")
    here.set_defaults(func=run_here)


def _usage(p: argparse.ArgumentParser) -> int:
    p.error("say what to do: start, stop, status or run")


def _user_error(message: str) -> Exception:
    from gpuctl.cli.base import UserError

    return UserError(message)


def _gpu_list(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        gpus = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise _user_error(f"--gpus {text!r}: expected indices like 0,1,3") from None
    if not gpus or any(g < 0 for g in gpus):
        raise _user_error(f"--gpus {text!r}: expected indices like 0,1,3")
    return gpus


def _select_nodes(fleet: Fleet, pattern: str | None) -> list[str]:
    if not pattern:
        return fleet.names
    try:
        import hostlist

        wanted = hostlist.expand_hostlist(pattern)
    except Exception:
        raise _user_error(f"bad node list {pattern!r}: expected e.g. gpu[01-04],gpu07") from None
    unknown = [n for n in wanted if n not in fleet.nodes]
    if unknown:
        raise _user_error(
            f"not configured: {', '.join(unknown[:5])} (known: {', '.join(fleet.names[:8])})"
        )
    return list(wanted)


def _check_scope(args: argparse.Namespace) -> None:
    """``start`` and ``stop`` act on the nodes named or, with ``--all``, on every one."""
    command = f"stress {args.stress_command}"
    if args.nodes and args.all:
        raise _user_error(f"{command}: name nodes or say --all, not both")
    if not args.nodes and not args.all:
        raise _user_error(
            f"{command}: name the nodes (e.g. gpu[01-04]) or say --all for every node"
        )


def _stress_options(args: argparse.Namespace) -> Mapping[str, Any]:
    if getattr(args, "demo", False):
        return {}
    return load_user_config(args).stress.given_values()


async def _connect(fleet: Fleet, names: list[str], timeout: float) -> list[str]:
    """Start the fleet; return the nodes that came up, printing one line per one that did not."""
    await fleet.start()
    await fleet.wait_settled(timeout)
    live = []
    for name in names:
        snap = fleet.snapshot(name)
        if snap.state is NodeState.LIVE:
            live.append(name)
        else:
            print(
                f"gpuctl: {name} did not answer: {snap.reason or snap.state.value}", file=sys.stderr
            )
    return live


async def _first_samples(fleet: Fleet, names: list[str], timeout: float) -> list[str]:
    """Wait (up to ``timeout``) until each of ``names`` has sent a sample; return those that
    have not."""
    deadline = time.monotonic() + timeout
    changed = asyncio.Event()
    fleet.subscribe(lambda _s: changed.set())

    def missing() -> list[str]:
        return [n for n in names if fleet.snapshot(n).last_sample_t is None]

    while missing() and time.monotonic() < deadline:
        changed.clear()
        with contextlib.suppress(TimeoutError):
            await wait_for(changed.wait(), max(0.0, deadline - time.monotonic()))
    return missing()


# -- start ------------------------------------------------------------------------------------
def run_start(args: argparse.Namespace) -> int:
    gpus = _gpu_list(args.gpus)
    _check_scope(args)
    options = _stress_options(args)
    fleet = build_fleet(args)
    names = _select_nodes(fleet, args.nodes)
    control.configure(fleet, options)
    return asyncio.run(_start(fleet, names, gpus, args))


async def _start(
    fleet: Fleet, names: list[str], gpus: list[int] | None, a: argparse.Namespace
) -> int:
    failed = 0
    started: list[tuple[str, int]] = []
    last_line: dict[tuple[str, int], float] = {}

    def on_event(node: str, event: NodeEvent) -> None:
        if event.kind != "burn" or event.gpu is None or a.json:
            return
        d = burn_from_wire(event.detail)
        key = (node, event.gpu)
        now = time.monotonic()
        final = d.get("state") in ("done", "failed")
        if final or now - last_line.get(key, 0.0) >= 5.0:
            last_line[key] = now
            print(_burn_line(node, event.gpu, d), flush=True)

    fleet.on_event(on_event)
    ended = asyncio.Event()

    def check(_s: NodeSnapshot | None) -> None:
        if started and not any(k in started for k in control.burning(fleet)):
            ended.set()

    fleet.subscribe(check)
    interrupted = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, interrupted.set)
    read_only = bool(getattr(a, "read_only", False))
    try:
        live = await _connect(fleet, names, a.timeout)
        failed += len(names) - len(live)
        if not a.force:
            refused = await _others_processes(fleet, live, gpus, a.timeout)
            if refused:
                return ExitCode.USAGE
        replies = await asyncio.gather(
            *(
                control.set_stress(
                    fleet,
                    n,
                    gpus,
                    True,
                    duration=a.duration,
                    dtype=a.dtype,
                    engine=a.engine,
                    read_only=read_only,
                )
                for n in live
            ),
            return_exceptions=True,
        )
        for node, reply in zip(live, replies, strict=True):
            if isinstance(reply, LinkError):
                print(f"gpuctl: {reply.message}", file=sys.stderr)
                failed += 1
                continue
            if isinstance(reply, BaseException):
                raise reply
            started.extend((node, g) for g in reply.get("started", []))
            for g in reply.get("busy", []):
                print(f"gpuctl: {node} GPU {g} is already burning", file=sys.stderr)
        if started:
            if not a.json:
                print(
                    f"burning {len(started)} GPUs on {len({n for n, _ in started})} nodes; "
                    "Ctrl-C stops",
                    flush=True,
                )
            check(None)
            waiter = asyncio.ensure_future(ended.wait())
            stopper = asyncio.ensure_future(interrupted.wait())
            await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if not ended.is_set():
                await asyncio.gather(
                    *(
                        control.set_stress(fleet, n, None, False, read_only=read_only)
                        for n in {n for n, _ in started}
                    ),
                    return_exceptions=True,
                )
                with contextlib.suppress(TimeoutError):
                    await wait_for(ended.wait(), 30)
            waiter.cancel()
            stopper.cancel()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        await fleet.stop()
    results: list[BurnRow] = []
    for node, gpu in started:
        burn = control.burn_of(fleet.snapshot(node), gpu) or {}
        results.append({"node": node, "gpu": gpu, **burn})
        stopped_by_user = interrupted.is_set() and burn.get("verdict") is None
        if burn.get("verdict") != "OK" and not stopped_by_user:
            failed += 1
    if a.json:
        emit_json({"burns": results})
    elif results:
        print(_table(results))
    return ExitCode.FAILED if failed or not started else ExitCode.OK


async def _others_processes(
    fleet: Fleet, live: list[str], gpus: list[int] | None, timeout: float
) -> bool:
    """Print one line per GPU (of ``gpus`` on ``live`` nodes) whose latest sample shows other
    users' processes, or that sent no sample to tell; True when there is one (nothing starts
    then: ``--force`` burns them anyway)."""
    silent = await _first_samples(fleet, live, timeout)
    lines = [
        f"{n} sent no sample within {timeout:g} s: whose processes run there is unknown"
        for n in silent
    ]
    for name in live:
        if name not in silent:
            lines += [o.line() for o in service.others_on(fleet.snapshot(name), gpus)]
    for line in lines[:OTHERS_SHOWN]:
        print(f"gpuctl: {line}: --force burns it anyway", file=sys.stderr)
    if len(lines) > OTHERS_SHOWN:
        print(
            f"gpuctl: ... and {len(lines) - OTHERS_SHOWN} more GPUs: --force burns them anyway",
            file=sys.stderr,
        )
    return bool(lines)


def _burn_line(node: str, gpu: int, d: BurnState) -> str:
    parts = [f"{node} gpu{gpu}", str(d.get("state"))]
    tflops, ends_at = d.get("tflops"), d.get("ends_at")
    if tflops is not None:
        parts.append(f"{tflops:.1f} TFLOP/s")
    parts.append(f"errors {d.get('errors', 0)}")
    if d.get("state") in ("starting", "running") and ends_at:
        parts.append(f"{max(0, int(ends_at - time.time()))} s left")
    if d.get("verdict"):
        parts.append(str(d["verdict"]))
    if d.get("reason"):
        parts.append(f"({d['reason']})")
    if d.get("message") and d.get("state") == "starting":
        parts.append(str(d["message"]))
    return "  ".join(parts)


def _table(rows: list[BurnRow]) -> str:
    header = ("NODE", "GPU", "ENGINE", "VERDICT", "TFLOP/s", "ERRORS", "REASON")
    lines = [header]
    for r in rows:
        mean = r.get("tflops_mean")
        lines.append(
            (
                str(r["node"]),
                str(r["gpu"]),
                str(r.get("engine") or "-"),
                str(r.get("verdict") or "-"),
                f"{mean:.2f}" if isinstance(mean, int | float) else "-",
                str(r.get("errors", "-")),
                str(r.get("reason") or ""),
            )
        )
    widths = [max(len(x[i]) for x in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(x, widths, strict=True)).rstrip() for x in lines
    )


# -- stop / status ----------------------------------------------------------------------------
def run_stop(args: argparse.Namespace) -> int:
    gpus = _gpu_list(args.gpus)
    _check_scope(args)
    fleet = build_fleet(args)
    names = _select_nodes(fleet, args.nodes)
    replies, failed = asyncio.run(_stop_all(fleet, names, gpus, args))
    for node, reply in replies.items():
        pids = reply.get("others", []) + reply.get("stopping", [])
        what = (
            f"stopping {len(pids)} burners (pids {', '.join(map(str, pids))})"
            if pids
            else ("no burners of yours" if not args.any_owner else "no burners")
        )
        print(f"{node}: {what}")
        kept = reply.get("kept", [])
        if kept:
            print(f"{node}: left alone (not yours; --any-owner stops them): {_kept(kept)}")
    return ExitCode.FAILED if failed else ExitCode.OK


def _kept(burners: list[BurnerInfo]) -> str:
    parts = []
    for b in burners:
        where = "CPU" if b.get("device") == "cpu" else f"GPU {_gpu_text(b)}"
        parts.append(f"pid {b.get('pid')} on {where} of {service.owner_text(b.get('owner'))}")
    return "; ".join(parts)


def _gpu_text(b: BurnerInfo) -> str:
    gpu = b.get("gpu_index")
    return str(gpu if gpu is not None else b.get("gpu") or "?")


async def _stop_all(
    fleet: Fleet, names: list[str], gpus: list[int] | None, a: argparse.Namespace
) -> tuple[dict[str, StressReply], int]:
    read_only = bool(getattr(a, "read_only", False))
    try:
        live = await _connect(fleet, names, a.timeout)
        failed = len(names) - len(live)
        answers = await asyncio.gather(
            *(
                control.stop_burners(
                    fleet, n, gpus, any_owner=a.any_owner, read_only=read_only, timeout=a.timeout
                )
                for n in live
            ),
            return_exceptions=True,
        )
        replies: dict[str, StressReply] = {}
        for node, ans in zip(live, answers, strict=True):
            if isinstance(ans, LinkError):
                print(f"gpuctl: {ans.message}", file=sys.stderr)
                failed += 1
            elif isinstance(ans, BaseException):
                raise ans
            else:
                replies[node] = ans
        return replies, failed
    finally:
        await fleet.stop()


def run_status(args: argparse.Namespace) -> int:
    gpus = _gpu_list(args.gpus)
    fleet = build_fleet(args)
    names = _select_nodes(fleet, args.nodes)
    replies, failed = asyncio.run(_ask_all(fleet, names, {"type": "stress_status"}, args.timeout))
    rows: list[BurnerRow] = []
    for node, reply in replies.items():
        status = wire.parse(StressStatus, reply) or {}
        for b in status.get("others", []):
            gpu = b.get("gpu_index")
            if gpus is not None and gpu not in gpus:
                continue
            rows.append({"node": node, **b})
    if args.json:
        emit_json({"burns": rows})
    elif not rows:
        print("no burns running")
    else:
        header = ("NODE", "GPU", "ENGINE", "PID", "OWNER", "RUNNING", "LEFT")
        lines = [header]
        for r in rows:
            left = "-"
            duration, age = r.get("duration"), r.get("age")
            if duration is not None and age is not None:
                left = f"{max(0, int(duration - age))} s"
            owner = service.Owner.from_wire(r.get("owner"))
            lines.append(
                (
                    r["node"],
                    "cpu" if r.get("device") == "cpu" else _gpu_text(r),
                    str(r.get("engine")),
                    str(r.get("pid")),
                    str(owner) if owner is not None else "?",
                    f"{int(age)} s" if age is not None else "-",
                    left,
                )
            )
        widths = [max(len(x[i]) for x in lines) for i in range(len(header))]
        print(
            "\n".join(
                "  ".join(c.ljust(w) for c, w in zip(x, widths, strict=True)).rstrip()
                for x in lines
            )
        )
    return ExitCode.FAILED if failed else ExitCode.OK


async def _ask_all(
    fleet: Fleet, names: list[str], msg: JsonObject, timeout: float
) -> tuple[dict[str, JsonObject], int]:
    try:
        live = await _connect(fleet, names, timeout)
        failed = len(names) - len(live)
        answers = await asyncio.gather(
            *(fleet.request(n, dict(msg), timeout) for n in live), return_exceptions=True
        )
        replies: dict[str, JsonObject] = {}
        for node, ans in zip(live, answers, strict=True):
            if isinstance(ans, BaseException):
                print(f"gpuctl: {node}: {getattr(ans, 'message', ans)}", file=sys.stderr)
                failed += 1
            elif (error := refusal(ans)) is not None:
                print(f"gpuctl: {node}: {error.get('message')}", file=sys.stderr)
                failed += 1
            else:
                replies[node] = ans
        return replies, failed
    finally:
        await fleet.stop()


# -- run on this machine ----------------------------------------------------------------------
def _local_gpus() -> list[int]:
    from gpuctl.node.readers import open_reader

    reader, _reason = open_reader(None)
    if reader is None:
        return []
    try:
        return [int(g["index"]) for g in reader.static()]
    finally:
        reader.close()


def run_here(args: argparse.Namespace) -> int:
    if args.duration <= 0:
        raise _user_error("--duration must be positive")
    if args.size is not None and args.size < 32:
        raise _user_error("--size must be at least 32")
    python = args.python or sys.executable
    base = [python, "-m", "gpuctl.workloads.burn", "--device", args.device]
    base += ["--duration", f"{args.duration:g}"]
    if args.dtype:
        base += ["--dtype", args.dtype]
    if args.size:
        base += ["--size", str(args.size)]
    if args.device == "cpu":
        argvs = {"cpu": base}
    else:
        gpus = _gpu_list(args.gpus) or _local_gpus()
        if not gpus:
            raise _user_error("no GPU found on this machine; to test the burner: --device cpu")
        argvs = {f"gpu{g}": [*base, "--gpu", str(g)] for g in gpus}
    from gpuctl.node.proc import bundle_env, die_with_parent
    from gpuctl.node.stress import BURN_OWNER_ENV

    # marked as the agent marks its burners: `stress status` elsewhere shows whose they are
    env = bundle_env({BURN_OWNER_ENV: json.dumps(service.me().to_wire(), sort_keys=True)})

    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for label, argv in argvs.items():
            try:
                procs[label] = subprocess.Popen(
                    argv,
                    stdout=subprocess.PIPE,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    preexec_fn=die_with_parent(),  # no burner outlives this command
                )
            except OSError as e:
                raise _user_error(f"cannot start {python}: {e.strerror or e}") from None
        summaries = _follow(procs, quiet=args.json)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
            p.wait()
    devices = []
    for label in argvs:
        s = summaries.get(label) or {
            "verdict": "DIED",
            "reason": f"burner exited with code {procs[label].returncode} and no summary",
        }
        devices.append(
            {
                "device": label,
                "name": s.get("name"),
                "tflops_mean": s.get("tflops_mean"),
                "gflops_mean": s.get("gflops_mean"),
                "iterations": s.get("iterations"),
                "errors": s.get("errors"),
                "duty": s.get("duty"),
                "verdict": s.get("verdict"),
                "reason": s.get("reason"),
                "size": s.get("size"),
                "dtype": s.get("dtype"),
                "elapsed": s.get("elapsed"),
            }
        )
    ok = all(d["verdict"] == "OK" for d in devices)
    if args.json:
        out = {
            "devices": devices,
            "verdict": "OK" if ok else "FAIL",
            "host": socket.gethostname(),
            "duration": args.duration,
        }
        emit_json(out)
    else:
        for d in devices:
            print(
                f"{d['device']}: {d['verdict']}  {d['gflops_mean'] or 0:.1f} GFLOP/s  "
                f"errors {d['errors']}  duty {d['duty'] or 0:.3f}  "
                f"{d['size']}x{d['size']} {d['dtype']}"
                + (f"  ({d['reason']})" if d["reason"] else "")
            )
    return ExitCode.OK if ok else ExitCode.FAILED


def _follow(procs: Mapping[str, subprocess.Popen[bytes]], quiet: bool) -> dict[str, dict[str, Any]]:
    """Read every burner's JSON lines until all exit; print progress unless ``quiet``."""
    from gpuctl.node.proc import JsonLines

    sel = selectors.DefaultSelector()
    readers: dict[str, JsonLines] = {}
    for label, p in procs.items():
        assert p.stdout is not None
        sel.register(p.stdout, selectors.EVENT_READ, label)
        readers[label] = JsonLines()
    summaries: dict[str, dict[str, Any]] = {}
    open_count = len(procs)
    while open_count:
        try:
            events = sel.select(1.0)
        except KeyboardInterrupt:
            continue  # Ctrl-C reached the burners too: they stop and send their summaries
        for key, _ in events:
            label = key.data
            data = os.read(key.fileobj.fileno(), 1 << 16)  # type: ignore[union-attr]
            if not data:
                sel.unregister(key.fileobj)
                open_count -= 1
                continue
            for msg in readers[label].feed(data):
                if msg.get("type") == "summary":
                    summaries[label] = msg
                elif msg.get("type") == "progress" and not quiet:
                    print(
                        f"{label}: {msg.get('gflops_mean', 0):.1f} GFLOP/s mean, "
                        f"{msg.get('iterations')} GEMMs, errors {msg.get('errors')}, "
                        f"{msg.get('elapsed', 0):.0f} s",
                        flush=True,
                    )
    return summaries
