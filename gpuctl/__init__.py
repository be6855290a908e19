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


class _Gpuctl(types.ModuleType):
    """``gpuctl.remote`` stays the jobs API's decorator once the connection layer's package
    ``gpuctl/remote/`` is imported: the import system then sets the attribute ``remote`` of
    this package to that sub-package, which would hide the decorator. The sub-package is still
    reached by ``from gpuctl.remote.slurm import ...`` (through ``sys.modules``)."""

    @property
    def remote(self) -> Any:
        return __getattr__("remote")

    @remote.setter
    def remote(self, value: Any) -> None:
        pass  # the import system's ``gpuctl.remote = <package gpuctl.remote>``


sys.modules[__name__].__class__ = _Gpuctl
