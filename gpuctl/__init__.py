"""gpuctl: watch, stress and accept every GPU of a cluster from one terminal screen."""

__version__ = "0.1.0"
