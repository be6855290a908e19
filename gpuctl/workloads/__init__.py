"""Workloads that run on a node in VENV2 (torch): the GPU burner, gpu-burn's wrapper, tests.

They are started by the node agent or the supervisor as child processes, never imported by
them, and they reach a node inside the node bundle (``python -m gpuctl.workloads.burn`` with the
bundle on ``PYTHONPATH`` works through zipimport). Nothing here imports the login side.
"""
