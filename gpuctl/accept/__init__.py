"""Acceptance from the login node: run the suite on nodes, gather verdicts, keep history.

- ``gpuctl.accept.run``: ``AcceptOptions``, ``AcceptRun`` (live ``status`` per node and section,
  ``subscribe``, ``await wait()``, ``cancel()``), ``start_fleet_run`` (through each node's agent)
  and ``start_local_run`` (this machine).
- ``gpuctl.accept.slurm``: ``start_slurm_run`` (one batch job, DDP across the nodes).
- ``gpuctl.accept.history``: ``HistoryStore`` (SQLite in the user state dir), degradations,
  ``series`` for trend sparklines.

Nothing here imports torch or textual; the suite itself is ``gpuctl.workloads.accept_suite``.
"""
