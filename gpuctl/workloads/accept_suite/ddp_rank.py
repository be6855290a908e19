"""One DDP rank of the acceptance suite: all-reduce check and timing, then DDP training smoke.

Run by torchrun
(``python -m torch.distributed.run ... -m gpuctl.workloads.accept_suite.ddp_rank --out D``)
or by any launcher that sets RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT (srun tasks are
mapped from SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID). Each rank writes ``D/rank-<rank>.json``;
the suite on that node reads its local ranks' files and judges.

Unlike the predecessor's check, the tensor is refilled before every collective (reducing the
same buffer again multiplies it by the world size each time) and every element is compared with
the exact expected sum: values are small integers, exact in float32.
"""

import argparse
import json
import os
import socket
import statistics
import sys
import time
from datetime import timedelta
from typing import Any

from .smoke import tiny_mlp, train_steps


def _env_rank() -> "tuple[int, int, int]":
    env = os.environ
    if "RANK" not in env and "SLURM_PROCID" in env:
        env["RANK"] = env["SLURM_PROCID"]
        env["WORLD_SIZE"] = env.get("SLURM_NTASKS", "1")
        env["LOCAL_RANK"] = env.get("SLURM_LOCALID", "0")
    return int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", "0"))


def _sync(torch: Any, device: Any) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def allreduce_check(
    torch: Any,
    dist: Any,
    device: Any,
    rank: int,
    world: int,
    numel: int,
    iters: int,
    break_rank: int,
) -> "dict[str, Any]":
    """Refill, all-reduce, compare every element; time all but the first collective."""
    pattern = (torch.arange(numel, device=device, dtype=torch.int64) % 7 + 1).to(torch.float32)
    total = world * (world + 1) // 2  # sum over ranks of (rank + 1)
    buf = torch.empty(numel, device=device, dtype=torch.float32)
    expected = torch.empty_like(buf)
    times: list[float] = []
    mismatches = 0
    first_bad: dict[str, Any] | None = None
    for i in range(iters):
        buf.copy_(pattern).mul_(rank + 1).add_(i)
        if rank == break_rank:
            buf[numel // 2] += 1.0  # test option: a rank that contributes a wrong value
        _sync(torch, device)
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(buf)
        _sync(torch, device)
        elapsed = time.perf_counter() - t0
        if i > 0:  # the first collective sets up connections: never timed
            times.append(elapsed)
        torch.mul(pattern, float(total), out=expected).add_(float(world * i))
        bad = buf != expected
        n_bad = int(bad.sum().item())
        if n_bad:
            mismatches += n_bad
            if first_bad is None:
                j = int(bad.nonzero()[0].item())
                first_bad = {
                    "iteration": i,
                    "index": j,
                    "got": float(buf[j].item()),
                    "expected": float(expected[j].item()),
                }
    nbytes = numel * 4
    median = statistics.median(times) if times else None
    algbw = nbytes / median / 1e9 if median else None
    busbw = algbw * 2 * (world - 1) / world if algbw is not None else None
    return {
        "ok": mismatches == 0,
        "numel": numel,
        "bytes": nbytes,
        "iters": iters,
        "timed_iters": len(times),
        "median_s": median,
        "algbw_gbps": algbw,
        "busbw_gbps": busbw,
        "mismatches": mismatches,
        "first_bad": first_bad,
    }


SWEEP_OPS = ("all_reduce", "all_gather")
SLOW_RANK_S = 0.05  # --slow-rank: the straggler's extra work a step
SWEEP_MIN_BYTES = 8
SWEEP_BUDGET_BYTES = 4 << 30  # bytes moved per size and op: fewer iterations for big sizes
SWEEP_MAX_ITERS = 20
SWEEP_WARMUP = 2


def bus_factor(op: str, world: int) -> float:
    """busbw / algbw (nccl-tests): 2(n-1)/n for all-reduce, (n-1)/n for all-gather."""
    if world <= 1:
        return 0.0
    return (2.0 if op == "all_reduce" else 1.0) * (world - 1) / world


def sweep(
    torch: Any, dist: Any, device: Any, rank: int, world: int, max_bytes: int, break_rank: int = -1
) -> "dict[str, list[dict[str, Any]]]":
    """All-reduce and all-gather over sizes 8 B, 16 B, ... ``max_bytes`` (float32), as
    nccl-tests prints them: one row per size with ``size`` (bytes; for all-gather the gathered
    total), ``count`` (elements per rank), ``type``, ``redop``, ``time_us`` (mean per operation
    on the slowest rank), ``algbw``/``busbw`` (GB/s) and ``wrong`` (elements off their exact
    value in a checked collective after the timed loop)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for op in SWEEP_OPS:
        rows = []
        size = SWEEP_MIN_BYTES
        while size <= max_bytes:
            per_rank = size // 4 if op == "all_reduce" else size // 4 // world
            if per_rank >= 1:
                rows.append(_sweep_row(torch, dist, device, rank, world, op, per_rank, break_rank))
            size *= 2
        out[op] = rows
    return out


def _sweep_row(
    torch: Any,
    dist: Any,
    device: Any,
    rank: int,
    world: int,
    op: str,
    count: int,
    break_rank: int = -1,
) -> "dict[str, Any]":
    src = torch.full((count,), float(rank + 1), device=device, dtype=torch.float32)
    if rank == break_rank:
        src[count // 2] += 1.0  # test option: a rank that contributes a wrong value
    if op == "all_reduce":
        nbytes = count * 4
        # Timed on zeros, which stay zeros (nothing between the collectives, as in nccl-tests);
        # checked afterwards on one reduction of rank + 1 from every rank.
        buf = torch.zeros(count, device=device, dtype=torch.float32)

        def once() -> None:
            dist.all_reduce(buf)

        def wrong() -> int:
            buf.copy_(src)
            dist.all_reduce(buf)
            return int((buf != float(world * (world + 1) // 2)).sum().item())

    else:
        nbytes = count * 4 * world
        gathered = torch.empty(count * world, device=device, dtype=torch.float32)
        want = (
            torch.arange(1, world + 1, device=device, dtype=torch.float32)
            .repeat_interleave(count)
            .reshape(-1)
        )

        parts = list(gathered.chunk(world))

        def once() -> None:
            if hasattr(dist, "all_gather_into_tensor"):
                dist.all_gather_into_tensor(gathered, src)
            else:  # torch < 2.0: the list form gathers into views of the same buffer
                dist.all_gather(parts, src)

        def wrong() -> int:
            return int((gathered != want).sum().item())

    iters = max(2, min(SWEEP_MAX_ITERS, SWEEP_BUDGET_BYTES // max(nbytes, 1)))
    for _ in range(SWEEP_WARMUP):  # connections, algorithm choice: never timed
        once()
    _sync(torch, device)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        once()
    _sync(torch, device)
    took = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64, device=device)
    dist.all_reduce(took, op=dist.ReduceOp.MAX)  # the slowest rank bounds the collective
    seconds = float(took.item())
    algbw = nbytes / seconds / 1e9 if seconds > 0 else None
    return {
        "size": nbytes,
        "count": count,
        "type": "float",
        "redop": "sum" if op == "all_reduce" else "none",
        "iters": iters,
        "time_us": round(seconds * 1e6, 3),
        "algbw": algbw,
        "busbw": algbw * bus_factor(op, world) if algbw is not None else None,
        "wrong": wrong(),
    }


def ddp_train(
    torch: Any,
    dist: Any,
    device: Any,
    rank: int,
    world: int,
    steps: int,
    loss_drop: float,
    slow_rank: int = -1,
) -> "dict[str, Any]":
    """Train a tiny MLP under DDP; the loss must fall and the parameters must agree at the end."""
    from torch.nn.parallel import DistributedDataParallel

    gen = torch.Generator().manual_seed(1234)  # same teacher on every rank
    teacher = torch.randn(32, 1, generator=gen)
    data_gen = torch.Generator().manual_seed(1000 + rank)  # a different shard per rank
    torch.manual_seed(rank)  # different init per rank: DDP must broadcast rank 0's
    model = tiny_mlp(torch, device)
    ddp = DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None
    )
    ballast = torch.randn(256, 256, device=device) if rank == slow_rank else None

    def forward(x: Any) -> Any:
        if ballast is not None:  # test option: a rank whose every step works 50 ms more
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < SLOW_RANK_S:
                torch.mm(ballast, ballast)
        return ddp(x)

    r = train_steps(torch, forward, ddp.parameters(), teacher, data_gen, device, steps)
    first, final, finite, drop = r["first"], r["final"], r["finite"], r["drop"]
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    max_diff = max(float((g - gathered[0]).abs().max().item()) for g in gathered)
    identical = all(torch.equal(g, gathered[0]) for g in gathered)
    ok = finite and drop is not None and drop >= loss_drop
    return {
        "ok": ok,
        "steps": steps,
        "first_loss": first,
        "final_loss": final,
        "drop": drop,
        "params_identical": identical,
        "params_max_diff": max_diff,
        "compute_ms": r["compute_ms"],
    }


def main(argv: "list[str] | None" = None) -> int:
    p = argparse.ArgumentParser(prog="gpuctl.workloads.accept_suite.ddp_rank")
    p.add_argument("--out", required=True, help="folder for rank-<rank>.json")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--numel", type=int, default=1 << 20)
    p.add_argument("--iters", type=int, default=6)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--loss-drop", type=float, default=0.5)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--break-rank", type=int, default=-1)
    p.add_argument("--slow-rank", type=int, default=-1)  # test option: a straggler
    p.add_argument("--sweep-max-bytes", type=int, default=0, help="0: no size sweep")
    args = p.parse_args(argv)

    import torch
    import torch.distributed as dist

    rank, world, local_rank = _env_rank()
    if args.device == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    result: dict[str, Any] = {
        "rank": rank,
        "world_size": world,
        "local_rank": local_rank,
        "host": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
        "backend": backend,
        "device": str(device),
        "error": None,
    }
    try:
        dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))
        result["allreduce"] = allreduce_check(
            torch, dist, device, rank, world, args.numel, args.iters, args.break_rank
        )
        if args.sweep_max_bytes:
            result["sweep"] = sweep(
                torch, dist, device, rank, world, args.sweep_max_bytes, args.break_rank
            )
        result["train"] = ddp_train(
            torch, dist, device, rank, world, args.steps, args.loss_drop, args.slow_rank
        )
        dist.barrier()
    except Exception as e:  # the suite reports it per rank; the traceback goes to stderr
        import traceback

        traceback.print_exc()
        result["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"rank-{int(rank)}.json")
    with open(f"{path}.tmp", "w") as f:
        json.dump(result, f)
    os.replace(f"{path}.tmp", path)
    return 0 if result["error"] is None else 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: gloo's threads can abort() while Python finalizes, which would
    # turn a rank that has already reported into a "crashed" rank.
    os._exit(code)
