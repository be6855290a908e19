"""The training smoke shared by [TRAIN] and the DDP training check: a tiny MLP learns a fixed
random teacher, and its loss must fall. One loop, so the single-GPU and the DDP verdicts judge
the same thing."""

import statistics
import time
from collections.abc import Callable, Iterable
from typing import Any


def tiny_mlp(torch: Any, device: Any) -> Any:
    """The smoke's model: 32 -> 64 -> 1 with a tanh."""
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1)).to(
        device
    )


def train_steps(
    torch: Any,
    forward: "Callable[[Any], Any]",
    params: "Iterable[Any]",
    teacher: Any,
    data_gen: Any,
    device: Any,
    steps: int,
) -> "dict[str, Any]":
    """Run ``steps`` Adam steps of ``forward`` on batches drawn from ``data_gen``.

    Returns ``{"first", "final", "finite", "drop", "compute_ms"}``: the first batch's loss, the
    mean of the last five, whether every loss was finite, the fraction the loss fell (None if the
    first loss was not positive), and the median milliseconds of a step's forward pass (this
    process's own work: under DDP the waiting for other ranks is in the backward pass).
    """
    opt = torch.optim.Adam(params, lr=1e-2)
    losses: list[float] = []
    compute: list[float] = []  # seconds of each step's forward pass: this rank's own work
    for _ in range(steps):
        x = torch.randn(64, 32, generator=data_gen)
        y = torch.tanh(x @ teacher)
        x, y = x.to(device), y.to(device)
        opt.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        loss = torch.nn.functional.mse_loss(forward(x), y)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        compute.append(time.perf_counter() - t0)
        loss.backward()  # under DDP: the gradients' all-reduce, where ranks wait for each other
        opt.step()
        losses.append(float(loss.item()))
    first = losses[0]
    tail = losses[-5:]
    final = sum(tail) / len(tail)
    return {
        "first": first,
        "final": final,
        "finite": all(v == v and abs(v) != float("inf") for v in losses),
        "drop": 1.0 - final / first if first > 0 else None,
        "compute_ms": 1000.0 * statistics.median(compute) if compute else None,
    }
