"""The simulated cluster of ``gpuctl demo`` and ``gpuctl status --demo``: nothing to configure."""

from __future__ import annotations

# A mixed cluster, as a real one grows: model per node, cycled.
DEMO_MODELS = ("H100", "H100", "A100", "H200", "L40S", "A100")


def demo_nodes(nodes: int = 6, gpus: int = 8) -> list[tuple[str, str]]:
    """Return ``(name, simulate spec)`` for each demo node, e.g. ``("sim-01", "8:H100")``."""
    if nodes < 1 or gpus < 1:
        raise ValueError("a demo needs at least one node of at least one GPU")
    width = max(2, len(str(nodes)))
    return [
        (f"sim-{i + 1:0{width}d}", f"{gpus}:{DEMO_MODELS[i % len(DEMO_MODELS)]}")
        for i in range(nodes)
    ]
