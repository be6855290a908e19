"""[DDP]: torchrun over this node's devices (gloo on the CPU): all-reduce and DDP training."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from typing import TYPE_CHECKING, Any

from gpuctl.node.proc import spawn, stop_group

if TYPE_CHECKING:
    from gpuctl.workloads.accept.suite import Suite

DDP_GRACE_S = 10.0  # torchrun's SIGTERM -> SIGKILL


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the local rendezvous)."""
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
    finally:
        s.close()


def launch(suite: "Suite") -> "tuple[list[dict[str, Any]], str | None, int]":
    """Run the DDP ranks of this node under torchrun; returns (rank results, error or None)."""
    a = suite.args
    nproc = a.ddp_procs or (len(suite.gpus) if suite.cuda else 2)
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
        "gpuctl.workloads.accept.ddp",
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


def run_allreduce(suite: "Suite") -> "dict[str, Any]":
    """[DDP] all-reduce: every element right on every rank, and the bus bandwidth."""
    ranks, error, nproc = launch(suite)
    failures = []
    out = {
        "world_size": None,
        "nnodes": suite.args.ddp_nnodes,
        "local_procs": nproc,
        "backend": None,
        "numel": None,
        "bytes": None,
        "iters": None,
        "algbw_gbps": None,
        "busbw_gbps": None,
        "ranks": [],
    }
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
    out["failures"] = failures
    out["verdict"] = "FAIL" if failures else "PASS"
    out["summary"] = (failures[0] if failures else None) or (
        f"busbw {out['busbw_gbps'] or 0:.3f} GB/s over {out['world_size']} ranks"
    )
    return out


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
    out["failures"] = failures
    out["verdict"] = "FAIL" if failures else "PASS"
    out["summary"] = (failures[0] if failures else None) or (
        f"loss fell on {len(out['ranks'])} rank(s), parameters "
        + ("identical" if out["params_identical"] else "differ")
    )
    return out
