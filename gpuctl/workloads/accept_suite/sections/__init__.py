"""The suite's sections, one module each; ``RUNNERS`` maps a section name (``schema.SECTIONS``)
to the function that runs it on a ``Suite`` and returns its result dict."""

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import burn, compute, ddp, env, health, membw, memtest, p2p, pcie, shape, train

if TYPE_CHECKING:
    from gpuctl.workloads.accept_suite.suite import Suite

RUNNERS: "dict[str, Callable[[Suite], dict[str, Any]]]" = {
    "env": env.run,
    "shape": shape.run,
    "compute": compute.run,
    "membw": membw.run,
    "memtest": memtest.run,
    "pcie": pcie.run,
    "p2p": p2p.run,
    "train": train.run,
    "burn": burn.run,
    "ddp_allreduce": ddp.run_allreduce,
    "ddp_train": ddp.run_train,
    "health": health.run,
}
