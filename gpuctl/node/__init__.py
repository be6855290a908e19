"""What runs on a GPU node under its system Python (VENV1): standard library only, Python 3.6.

The agent (``agent``, its plugins ``stress`` and ``accept``), its GPU readers (``readers``), the
job supervisor (``supervisor``, and beside it its ``keeper``, ``cgroups``, ``rendezvous``,
``scontrol``, ``resources``, ``attempts`` and the VENV2 builder ``envbuild``), the one process
module every child is started and stopped with (``proc``), the job folder's contract
(``jobfiles``), the wire format (``protocol``) and the plugins' messages (``messages``). Nothing
here imports from the login side of gpuctl, textual or torch; ``gpuctl_tests/test_import_rules.py``
checks it.
"""
