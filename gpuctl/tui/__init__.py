"""The terminal UI: ``make_app(fleet, ...)``; it reaches nodes only through the fleet."""

from gpuctl.tui.app import GpuctlApp, make_app

__all__ = ["GpuctlApp", "make_app"]
