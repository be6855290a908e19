"""What runs on a GPU node under its system Python (VENV1): standard library only, Python 3.6.

The agent (``agent``), its GPU readers (``readers``) and the job supervisor. Nothing here imports
from the login side of gpuctl, textual or torch; ``gpuctl_tests/test_import_rules.py`` checks it.
"""
