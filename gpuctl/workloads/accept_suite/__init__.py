"""The acceptance suite (VENV2, torch): ``python -m gpuctl.workloads.accept_suite --help``.

Importing this package does not import torch; ``suite.main`` does.
"""
