"""The terminal UI: ``GpuctlApp(fleet, ...)`` (``make_app`` is the same class: the constructor
is the factory); it reaches nodes only through the fleet and the job store it is given."""

from gpuctl.tui.app import GpuctlApp, make_app

__all__ = ["GpuctlApp", "make_app"]
