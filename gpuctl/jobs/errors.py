"""What a job's failure raises on the submitter's side: ``JobFailed`` (a system failure; its
message is the report), ``JobCancelled`` (also a ``concurrent.futures.CancelledError``) and
``RemoteTraceback`` (the node's traceback, attached to a user exception raised again here).
Below the job handle, the folder reader and the provisioner, which all raise them.
"""

from __future__ import annotations

import concurrent.futures

from gpuctl.jobs.report import FailureReport


class JobFailed(Exception):
    """A system failure of a job (not an exception of the function); ``str`` is the report."""

    def __init__(self, report: FailureReport) -> None:
        super().__init__(report.text())
        self.report = report

    @property
    def kind(self) -> str:
        return self.report.kind


class JobCancelled(JobFailed, concurrent.futures.CancelledError):
    """What ``result()`` and ``exception()`` of a cancelled job raise: the
    ``concurrent.futures.CancelledError`` of any cancelled Future, and a ``JobFailed`` of kind
    "cancelled" whose report says how it was stopped (also ``job.report()``)."""


class RemoteTraceback(Exception):
    """Attached as ``__cause__`` of a re-raised user exception: the traceback on the node."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return f'\n"""\n{self.tb}"""'
