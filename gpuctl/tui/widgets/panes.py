"""Panes 2 and 3: the job store's jobs, and acceptance (live run, verdict matrix, history)."""

from gpuctl.tui.widgets.accept_pane import AcceptPane
from gpuctl.tui.widgets.jobs_pane import JobsPane

__all__ = ["AcceptPane", "JobsPane"]
