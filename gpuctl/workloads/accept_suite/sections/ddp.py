"""[DDP]: torchrun over this node's devices (gloo on the CPU): all-reduce and DDP training."""

import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
from typing import TYPE_CHECKING, Any

from gpuctl.node.proc import spawn, stop_group

if TYPE_CHECKING:
    from gpuctl.workloads.accept_suite.suite import Suite

DDP_GRACE_S = 10.0  # torchrun's SIGTERM -> SIGKILL
# The size sweep's largest size (bytes; nccl-tests goes to 1 GiB), by device and --quick.
SWEEP_MAX = {("cuda", False): 1 << 30, ("cuda", True): 64 << 20, ("cpu", False): 1 << 20}
SWEEP_MAX[("cpu", True)] = 64 << 10


def parse_floors(text: str) -> "dict[str, float]":
    """``--busbw-floor``: ``"360"`` (every topology) or ``"8x1=360,8x2=180"`` (GPUs per node x
    nodes = GB/s) -> ``{"*": 360.0}`` / ``{"8x1": 360.0, "8x2": 180.0}``. Raises ValueError."""
    floors: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, _, value = part.rpartition("=")
        key = key.strip().lower() or "*"
        if key != "*" and not re.fullmatch(r"\d+x\d+", key):
            raise ValueError(f"--busbw-floor {part!r}: a topology is GPUSxNODES, e.g. 8x2=180")
        try:
            floors[key] = float(value)
        except ValueError:
            raise ValueError(f"--busbw-floor {part!r}: expected GB/s, e.g. 8x1=360") from None
        if not floors[key] > 0:
            raise ValueError(f"--busbw-floor {part!r}: GB/s must be positive")
    return floors


def topology(local_procs: int, nnodes: int) -> str:
    """The key of a DDP run's shape: GPUs (ranks) per node x nodes, e.g. ``8x2``."""
    return f"{int(local_procs)}x{int(nnodes)}"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the local rendezvous)."""
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
    finally:
        s.close()


def local_procs(suite: "Suite") -> int:
    """DDP processes on this node: ``--ddp-procs``, else one per GPU (2 on the CPU)."""
    return int(suite.args.ddp_procs or (len(suite.gpus) if suite.cuda else 2))


def launch(suite: "Suite") -> "tuple[list[dict[str, Any]], str | None, int]":
    """Run the DDP ranks of this node under torchrun; returns (rank results, error or None)."""
    a = suite.args
    nproc = local_procs(suite)
    if nproc < 1:
        return [], "no DDP process to start", nproc
    if a.quick:
        numel = (16 << 20) if suite.cuda else (1 << 20)
        iters, steps = 6, 60
    else:
        numel = (64 << 20) if suite.cuda else (4 << 20)
        iters, steps = 21, 200
    timeout = a.ddp_timeout or (180.0 if a.quick else 600.0)
    endpoint = a.rdzv_endpoint or f"127.0.0.1:{int(free_port())}"
    outdir = tempfile.mkdtemp(prefix="gpuctl-ddp-")
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(a.ddp_nnodes),
        "--nproc-per-node",
        str(nproc),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        endpoint,
        "--rdzv-id",
        a.rdzv_id or f"gpuctl-accept-{int(os.getpid())}",
        "--max-restarts",
        "0",
        "-m",
        "gpuctl.workloads.accept_suite.ddp_rank",
        "--out",
        outdir,
        "--device",
        a.device,
        "--numel",
        str(numel),
        "--iters",
        str(iters),
        "--steps",
        str(steps),
        "--loss-drop",
        str(a.loss_drop),
        "--timeout",
        str(timeout),
        "--break-rank",
        str(a.test_break_rank),
        "--slow-rank",
        str(a.test_slow_rank),
        "--sweep-max-bytes",
        str(_sweep_max(suite)),
    ]
    suite.out.line(
        f"torchrun: {a.ddp_nnodes} node(s) x {nproc} process(es), c10d rendezvous at {endpoint}",
        section="ddp_allreduce",
    )
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    # its own session; SIGTERM when the suite dies, so torchrun never outlives it
    proc = spawn(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        death_signal=signal.SIGTERM,
    )
    error = None
    try:
        output, _ = proc.communicate(timeout=timeout + 30)
    except subprocess.TimeoutExpired:
        stop_group(proc.pid, DDP_GRACE_S, proc)
        output, _ = proc.communicate()
        error = f"DDP did not finish within {timeout + 30:g} s (hung collective?)"
    finally:
        if proc.poll() is None:
            stop_group(proc.pid, DDP_GRACE_S, proc)
            proc.wait()
    tail = output.decode(errors="replace").strip().splitlines()[-8:]
    ranks = []
    for fname in sorted(os.listdir(outdir)):
        if fname.startswith("rank-") and fname.endswith(".json"):
            with open(os.path.join(outdir, fname)) as f:
                ranks.append(json.load(f))
            os.unlink(os.path.join(outdir, fname))
    shutil.rmtree(outdir, ignore_errors=True)
    if error is None and len(ranks) < nproc:
        error = (
            f"{len(ranks)} of {nproc} local ranks reported "
            f"(torchrun exit {proc.returncode}): {' | '.join(tail[-3:])}"
        )
    if error is None and proc.returncode != 0 and not any(r.get("error") for r in ranks):
        error = f"torchrun exited {proc.returncode}: {' | '.join(tail[-3:])}"
    ranks.sort(key=lambda r: r["rank"])
    suite.ddp_result = (ranks, error, nproc)
    return ranks, error, nproc


def _sweep_max(suite: "Suite") -> int:
    a = suite.args
    if a.sweep_max is not None:
        return int(a.sweep_max)
    return SWEEP_MAX[("cuda" if suite.cuda else "cpu", bool(a.quick))]


def _sweep(ranks: "list[dict[str, Any]]") -> "dict[str, list[dict[str, Any]]] | None":
    """Rank 0's sweep rows (times are already the slowest rank's), with every local rank's
    wrong elements added up."""
    sweeps = [r["sweep"] for r in ranks if r.get("sweep")]
    if not sweeps:
        return None
    out: dict[str, list[dict[str, Any]]] = {}
    for op, rows in sweeps[0].items():
        merged = []
        for k, row in enumerate(rows):
            row = dict(row)
            row["wrong"] = sum(
                int(sw[op][k]["wrong"]) for sw in sweeps if op in sw and k < len(sw[op])
            )
            merged.append(row)
        out[op] = merged
    return out


def _judge_sweep(suite: "Suite", out: "dict[str, Any]") -> "list[str]":
    """Wrong elements at any size fail; so does an all-reduce busbw at the largest size below
    this topology's floor (``--busbw-floor``)."""
    failures = []
    for op, rows in (out["sweep"] or {}).items():
        for r in rows:
            if r["wrong"]:
                failures.append(f"{op} at {r['size']} B: {r['wrong']} wrong elements")
    rows = (out["sweep"] or {}).get("all_reduce") or []
    floors = suite.args.busbw_floor or {}
    floor = floors.get(out["topology"], floors.get("*"))
    out["busbw_floor_gbps"] = floor
    if rows and rows[-1]["busbw"] is not None:
        out["sweep_busbw_gbps"] = rows[-1]["busbw"]
        if floor is not None and rows[-1]["busbw"] < floor:
            failures.append(
                f"all-reduce busbw {rows[-1]['busbw']:.2f} GB/s at {rows[-1]['size']} B over "
                f"{out['topology']} (GPUs per node x nodes) is below its floor {floor:g} GB/s"
            )
    return failures


def run_allreduce(suite: "Suite") -> "dict[str, Any]":
    """[DDP] all-reduce: every element right on every rank, and the bus bandwidth; SKIP with
    one rank in all (nothing crosses a link: its "bandwidth" is a local copy's)."""
    if local_procs(suite) == 1 and suite.args.ddp_nnodes == 1:
        return _single_rank(suite)
    ranks, error, nproc = launch(suite)
    failures = []
    out = _allreduce_record(nproc, suite.args.ddp_nnodes, sweep=_sweep(ranks))
    if error:
        failures.append(f"ddp: {error}")
    for r in ranks:
        ar = r.get("allreduce") or {}
        out["world_size"] = r["world_size"]
        out["backend"] = r["backend"]
        row = {
            "rank": r["rank"],
            "host": r["host"],
            "ok": bool(ar.get("ok")),
            "mismatches": ar.get("mismatches"),
            "first_bad": ar.get("first_bad"),
            "algbw_gbps": ar.get("algbw_gbps"),
            "busbw_gbps": ar.get("busbw_gbps"),
            "error": r.get("error"),
        }
        out["ranks"].append(row)
        if r.get("error") and not ar:
            failures.append(f"ddp rank {r['rank']}: {r['error']}")
        elif not row["ok"]:
            bad = ar.get("first_bad") or {}
            failures.append(
                f"all-reduce rank {r['rank']}: {ar.get('mismatches')} wrong elements "
                f"(first: iteration {bad.get('iteration')} index {bad.get('index')} "
                f"got {bad.get('got')}, expected {bad.get('expected')})"
            )
    good = [r["allreduce"] for r in ranks if r.get("allreduce")]
    if good:
        out.update(numel=good[0]["numel"], bytes=good[0]["bytes"], iters=good[0]["iters"])
        # The slowest rank bounds the collective: report the lowest bandwidth seen.
        algbws = [g["algbw_gbps"] for g in good if g["algbw_gbps"]]
        if algbws:
            out["algbw_gbps"] = min(algbws)
            w = out["world_size"]
            out["busbw_gbps"] = out["algbw_gbps"] * 2 * (w - 1) / w
    for r in out["ranks"]:
        suite.out.line(
            f"rank {r['rank']} on {r['host']}: "
            + (
                f"all {out['numel']} elements right"
                if r["ok"]
                else f"WRONG ({r['mismatches']} mismatches) {r['error'] or ''}"
            )
        )
    if out["algbw_gbps"] is not None:
        suite.out.line(
            f"all-reduce {out['bytes']} bytes x {out['world_size']} ranks: "
            f"algbw {out['algbw_gbps']:.3f} GB/s, busbw {out['busbw_gbps']:.3f} GB/s"
        )
    if out["sweep"]:
        from gpuctl.workloads.accept_suite.render import sweep_table

        for line in sweep_table(out):
            suite.out.line(line)
        failures.extend(_judge_sweep(suite, out))
    out["failures"] = failures
    out["verdict"] = "FAIL" if failures else "PASS"
    out["summary"] = (failures[0] if failures else None) or (
        f"busbw {out['busbw_gbps'] or 0:.3f} GB/s over {out['world_size']} ranks"
        + (
            f"; sweep to {out['sweep']['all_reduce'][-1]['size']} B: all-reduce busbw "
            f"{out['sweep_busbw_gbps']:.3f} GB/s ({out['topology']})"
            if out["sweep"] and out["sweep"].get("all_reduce") and out["sweep_busbw_gbps"]
            else ""
        )
    )
    return out


STRAGGLER_RATIO = 3.0  # a rank this many times slower than the ranks' median ...
STRAGGLER_MS = 20.0  # ... and this many ms a step slower is a straggler: every step waits for it


def stragglers(ranks: "list[dict[str, Any]]") -> "list[str]":
    """The ranks whose own work a step (the forward pass) is far slower than the others': in
    DDP every rank waits for the slowest at each step, so one slow GPU slows the whole job."""
    out = []
    for x in ranks:
        ms = x.get("compute_ms")
        others = [y["compute_ms"] for y in ranks if y is not x and y.get("compute_ms") is not None]
        if ms is None or not others:
            continue
        median = statistics.median(others)  # of the other ranks: a straggler is not its own bar
        if ms > STRAGGLER_RATIO * median and ms - median > STRAGGLER_MS:
            out.append(
                f"rank {x['rank']} on {x.get('host')} is a straggler: {ms:.1f} ms of its own work "
                f"a step against {min(others):.1f}-{max(others):.1f} ms on the other ranks "
                "(median; every step waits for it)"
            )
    return out


def _allreduce_record(nproc: int, nnodes: int, **values: Any) -> "dict[str, Any]":
    """The ddp_allreduce section's fields, unknown (None) unless ``values`` give them."""
    out = {
        "world_size": None,
        "nnodes": nnodes,
        "local_procs": nproc,
        "backend": None,
        "numel": None,
        "bytes": None,
        "iters": None,
        "algbw_gbps": None,
        "busbw_gbps": None,
        "ranks": [],
        "topology": topology(nproc, nnodes),
        "sweep": None,
        "sweep_busbw_gbps": None,
        "busbw_floor_gbps": None,
    }  # type: dict[str, Any]
    out.update(values)
    return out


def _single_rank(suite: "Suite") -> "dict[str, Any]":
    """The ddp_allreduce section of a one-rank run: SKIP, no torchrun (ddp_train still runs)."""
    return _allreduce_record(
        1,
        1,
        world_size=1,
        verdict="SKIP",
        summary="1 rank: no all-reduce between ranks to check or time",
        failures=[],
    )


def run_train(suite: "Suite") -> "dict[str, Any]":
    """[DDP] training: the loss falls on every rank and the parameters agree."""
    ranks, error, _nproc = suite.ddp_result or launch(suite)
    failures = []
    out = {
        "world_size": None,
        "steps": None,
        "ranks": [],
        "params_identical": None,
        "loss_drop": suite.args.loss_drop,
    }
    if error:
        failures.append(f"ddp train: {error}")
    for r in ranks:
        tr = r.get("train")
        out["world_size"] = r["world_size"]
        if not tr:
            failures.append(f"ddp train rank {r['rank']}: {r.get('error') or 'no result'}")
            continue
        out["steps"] = tr["steps"]
        fell = tr["drop"] is not None and tr["drop"] >= suite.args.loss_drop
        out["ranks"].append(
            {
                "rank": r["rank"],
                "first_loss": tr["first_loss"],
                "final_loss": tr["final_loss"],
                "drop": tr["drop"],
                "ok": fell,
                "params_identical": tr["params_identical"],
                "params_max_diff": tr["params_max_diff"],
                "host": r.get("host"),
                "compute_ms": tr.get("compute_ms"),
            }
        )
        suite.out.line(
            f"rank {r['rank']} loss {tr['first_loss']:.4g} -> {tr['final_loss']:.4g} "
            f"(-{100 * (tr['drop'] or 0):.0f}%), parameters "
            + (
                "identical across ranks"
                if tr["params_identical"]
                else f"DIFFER across ranks (max {tr['params_max_diff']:.3g})"
            )
        )
        if not fell:
            failures.append(
                f"ddp train rank {r['rank']}: loss fell {100 * (tr['drop'] or 0):.0f}%, "
                f"needs {100 * suite.args.loss_drop:.0f}%"
            )
        if not tr["params_identical"]:
            failures.append(
                f"ddp train rank {r['rank']}: parameters differ across ranks "
                f"(max {tr['params_max_diff']:.3g})"
            )
    if out["ranks"]:
        out["params_identical"] = all(x["params_identical"] for x in out["ranks"])
        out["stragglers"] = stragglers(out["ranks"])
        timing = ", ".join(
            f"{x['rank']} {x['compute_ms']:.2f}"
            for x in out["ranks"]
            if x["compute_ms"] is not None
        )
        if timing:
            suite.out.line(f"rank: forward ms a step (median): {timing}")
        failures += [f"ddp train: {s}" for s in out["stragglers"]]
    out["failures"] = failures
    out["verdict"] = "FAIL" if failures else "PASS"
    out["summary"] = (failures[0] if failures else None) or (
        f"loss fell on {len(out['ranks'])} rank(s), parameters "
        + ("identical" if out["params_identical"] else "differ")
    )
    return out
