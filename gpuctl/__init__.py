"""gpuctl: watch, stress and accept every GPU of a cluster from one terminal screen.

``gpuctl.remote``, ``gpuctl.Executor`` and ``gpuctl.JobFailed`` are the jobs API
(``gpuctl.jobs``), imported on first use so that the node side, which ships this file in its
bundle, never pulls in the login side.
"""

from typing import Any

_JOBS_API = ("remote", "Executor", "Job", "JobFailed")


def _read_version() -> str:
    """The version setuptools-scm wrote when gpuctl was built or installed (pyproject.toml);
    read on first use, so that importing gpuctl (the node side does) imports nothing more."""
    try:
        from gpuctl._version import version
    except ImportError:  # the node bundle, or a source tree never installed
        return "0+unknown"
    return str(version)


def __getattr__(name: str) -> Any:
    if name == "__version__":
        return _read_version()
    if name in _JOBS_API:
        from gpuctl import jobs

        return getattr(jobs, name)
    raise AttributeError(f"module 'gpuctl' has no attribute {name!r}")
