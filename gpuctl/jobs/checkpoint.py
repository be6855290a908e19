"""Checkpoint and requeue: the contract a long function implements to survive its time limit.

A function object with a ``checkpoint`` method (subclass ``Checkpointable``, or any callable
with that method: submitit's contract) is called as usual; when its time-limit warning comes
(Slurm's ``--signal=B:USR1@N``, or gpuctl's supervisor ``warning`` seconds before
``time_limit`` outside Slurm), ``checkpoint(*args, **kwargs)`` is called in VENV2 with the
job's arguments and returns what to run next, ``Resubmit(function, *args, **kwargs)`` (or None
to go on without a checkpoint). gpuctl pickles it as the job's new payload and starts the next
attempt: under Slurm ``scontrol requeue`` (the same job id, pending again), elsewhere at once in
the same supervisor with a fresh time limit; at most ``max_requeues`` times. Each attempt is a
line of the job folder's ``attempts.jsonl`` (``Job.attempts()``).

This module is pickled by value (VENV2 has no gpuctl installed): standard library only.
"""

from typing import Any


class Resubmit:
    """What to run in the next attempt: ``function(*args, **kwargs)``."""

    def __init__(self, function: Any, *args: Any, **kwargs: Any) -> None:
        self.function = function
        self.args = args
        self.kwargs = kwargs

    def __repr__(self) -> str:
        name = getattr(self.function, "__name__", type(self.function).__name__)
        return f"Resubmit({name}, {len(self.args)} args, {sorted(self.kwargs)})"


class Checkpointable:
    """Subclass it and implement ``__call__``; keep progress in attributes (``self.step``,
    a path to the weights you saved). The default ``checkpoint`` resubmits the object as it is
    now with the same arguments: override it to save state to disk first, or to change the
    arguments."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def checkpoint(self, *args: Any, **kwargs: Any) -> Resubmit | None:
        return Resubmit(self, *args, **kwargs)
