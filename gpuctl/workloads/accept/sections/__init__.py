"""The suite's sections, one module each; ``RUNNERS`` maps a section name (``schema.SECTIONS``)
to the function that runs it on a ``Suite`` and returns its result dict."""

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import compute, ddp, env, health, membw, memtest, pcie, train

if TYPE_CHECKING:
    from gpuctl.workloads.accept.suite import Suite

RUNNERS: "dict[str, Callable[[Suite], dict[str, Any]]]" = {
    "env": env.run,
    "compute": compute.run,
    "membw": membw.run,
    "memtest": memtest.run,
    "pcie": pcie.run,
    "train": train.run,
    "ddp_allreduce": ddp.run_allreduce,
    "ddp_train": ddp.run_train,
    "health": health.run,
}
