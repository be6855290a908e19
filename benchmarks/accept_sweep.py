"""The [DDP] size sweep's figures against a bare collective loop, on the same ranks.

    python3 benchmarks/accept_sweep.py [--device cpu|cuda] [--nproc 2] [--largest 1M] [--rounds 3]

Starts itself under torchrun (gloo on the CPU, NCCL on GPUs). For each size of the sweep, rank 0
prints the suite's row (``workloads.accept_suite.ddp_rank.sweep``: warm-up, timed loop, slowest
rank, then a checked collective) next to a bare ``dist.all_reduce`` / ``all_gather_into_tensor``
loop timed with the host clock around a synchronize, alternated ``--rounds`` times, best of each
kept; and the ratio suite/bare time (target: within 10 % where the time is above 100 us).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def bare(torch, dist, device, op: str, count: int, world: int, iters: int) -> float:  # type: ignore[no-untyped-def]
    src = torch.zeros(count, device=device)
    out = torch.empty(count * world, device=device)
    for _ in range(2):
        dist.all_reduce(src) if op == "all_reduce" else dist.all_gather_into_tensor(out, src)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(src) if op == "all_reduce" else dist.all_gather_into_tensor(out, src)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    took = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64, device=device)
    dist.all_reduce(took, op=dist.ReduceOp.MAX)
    return float(took.item()) * 1e6


def rank_main(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from gpuctl.workloads.accept_suite.ddp_rank import _sweep_row

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local) if args.device == "cuda" else torch.device("cpu")
    if args.device == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    if rank == 0:
        print(f"{world} ranks, {args.device}; times in us (best of {args.rounds})")
        print(f"{'op':<11}{'size':>10}{'suite':>12}{'bare':>12}{'ratio':>8}")
    size = 8
    while size <= args.largest:
        for op in ("all_reduce", "all_gather"):
            count = size // 4 if op == "all_reduce" else size // 4 // world
            if count < 1:
                continue
            suite_t, bare_t = [], []
            for _ in range(args.rounds):
                row = _sweep_row(torch, dist, device, rank, world, op, count)
                suite_t.append(row["time_us"])
                bare_t.append(bare(torch, dist, device, op, count, world, row["iters"]))
            if rank == 0:
                s, b = min(suite_t), min(bare_t)
                print(f"{op:<11}{size:>10}{s:>12.1f}{b:>12.1f}{s / b:>8.2f}")
        size *= 4
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--largest", default="1M")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    from gpuctl.workloads.burn import parse_bytes

    args.largest = parse_bytes(args.largest)
    if args.rank:
        rank_main(args)
        return
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.nproc)]
    argv += ["--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", __file__, "--rank"]
    argv += ["--device", args.device, "--largest", str(args.largest), "--rounds", str(args.rounds)]
    sys.exit(subprocess.call(argv, env=env))


if __name__ == "__main__":
    main()
