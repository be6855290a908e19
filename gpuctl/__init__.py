"""gpuctl: watch, stress and accept every GPU of a cluster from one terminal screen.

``gpuctl.remote``, ``gpuctl.Executor`` and ``gpuctl.JobFailed`` are the jobs API
(``gpuctl.jobs``), imported on first use so that the node side, which ships this file in its
bundle, never pulls in the login side.
"""

from typing import Any

try:  # written by setuptools-scm when gpuctl is built or installed (pyproject.toml)
    from gpuctl import _version

    __version__: str = _version.version
except ImportError:  # the node bundle, or a source tree never installed
    __version__ = "0+unknown"

_JOBS_API = ("remote", "Executor", "Job", "JobFailed")


def __getattr__(name: str) -> Any:
    if name in _JOBS_API:
        from gpuctl import jobs

        return getattr(jobs, name)
    raise AttributeError(f"module 'gpuctl' has no attribute {name!r}")
