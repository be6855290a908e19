"""gpuctl: watch, stress and accept every GPU of a cluster from one terminal screen.

``gpuctl.remote``, ``gpuctl.Executor`` and ``gpuctl.JobFailed`` are the jobs API
(``gpuctl.jobs``), imported on first use so that the node side, which ships this file in its
bundle, never pulls in the login side.
"""

import sys
import types
from typing import Any

__version__ = "0.1.0"

_JOBS_API = ("remote", "Executor", "Job", "JobFailed")


def __getattr__(name: str) -> Any:
    if name in _JOBS_API:
        from gpuctl import jobs

        return getattr(jobs, name)
    raise AttributeError(f"module 'gpuctl' has no attribute {name!r}")


class _Package(types.ModuleType):
    """``gpuctl.remote`` is the jobs decorator. The connection layer's package has the same
    name (``gpuctl/remote/``, reached as ``from gpuctl.remote.pool import ...``); importing it
    must not replace the decorator, which Python's import system would do by setting the
    package as the attribute ``remote`` of ``gpuctl``."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "remote" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
