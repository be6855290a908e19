"""The variables a job gets from its submitter, on top of its node's environment: this
process's that ``env_pass`` names (``fnmatch`` patterns), then ``job_env``, which wins
(``passed_env``); and the one line on stderr, once per process and set of names, naming this
process's variables that look like credentials or caches (``HIDDEN_HINTS``) and that the job
will not see (``tell_unseen``: names only, never values). The values go to the node in a 0600
file the supervisor removes once read (``jobfiles.JOB_ENV``), written by the executor.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import re
import sys
from collections.abc import Mapping, Sequence

from gpuctl import paths
from gpuctl.node import jobfiles

# Variables of the submitter's that look like credentials or caches: a job that does not get
# them (``Executor.passed_env``) is told so by name, once per process and set of names.
HIDDEN_HINTS = (
    "*_API_KEY",
    "*_KEY",
    "*_KEY_ID",
    "*_TOKEN",
    "*CREDENTIALS*",
    "*_SECRET*",
    "*PASSWORD*",
    "*_CACHE*",
    "HF_*",
    "HUGGING_FACE_*",
    "WANDB_*",
    "TRANSFORMERS_*",
    "TORCH_HOME",
)
_TOLD_UNSEEN: set[tuple[str, ...]] = set()


@functools.cache
def _patterns(patterns: tuple[str, ...]) -> re.Pattern[str]:
    """One regular expression for ``fnmatch`` patterns, case-sensitive (none: matches
    nothing): a map's every chunk reads the environment."""
    if not patterns:
        return re.compile(r"(?!)")
    return re.compile("|".join(fnmatch.translate(p) for p in patterns))


def passed_env(
    env_pass: Sequence[str], job_env: Mapping[str, str]
) -> tuple[dict[str, str], tuple[str, ...]]:
    """(the variables passed, the names to tell of): this process's variables that
    ``env_pass`` names, then ``job_env``, which wins; and the names of this process's variables
    that look like credentials or caches (``HIDDEN_HINTS``) the job will not see, when they were
    not told yet (else none)."""
    mine = os.environ
    wanted = _patterns(tuple(env_pass))
    passed = {k: v for k, v in mine.items() if wanted.match(k)}
    passed.update(job_env)
    unseen = sorted(
        k
        for k in mine
        if k not in passed
        and not jobfiles.is_base_env(k)
        and not paths.is_xdg_variable(k)
        and _patterns(HIDDEN_HINTS).match(k.upper())
    )
    if unseen and tuple(unseen) not in _TOLD_UNSEEN:
        return passed, tuple(unseen)
    return passed, ()


def tell_unseen(unseen: tuple[str, ...]) -> None:
    """Say, once per process and set of names, that the job will not see ``unseen``."""
    if not unseen or unseen in _TOLD_UNSEEN:
        return
    _TOLD_UNSEEN.add(unseen)
    print(
        f"gpuctl: the job will not see {', '.join(unseen)} (a job gets its node's "
        "environment, not this one's): pass what it needs with env_pass=[...] "
        "(gpuctl submit --env-pass NAME_OR_PATTERN) or job_env={...}",
        file=sys.stderr,
        flush=True,
    )
