"""Runs one chunk of a ``map`` in VENV2. Pickled by value: VENV2 has no gpuctl installed."""

from typing import Any

# The chunk's failed items, in its job folder (GPUCTL_JOB_DIR): what `gpuctl jobs` says of a
# chunk that ran to its end with some items failed, without loading its result.
FAILED_ITEMS = "items_failed.json"
NAMED_AT_MOST = 20  # failed items named in the file; the count is of all


def run_chunk(fn: Any, items: Any) -> Any:
    """Apply ``fn`` to each argument tuple; per item ("ok", value) or ("err", exception, tb).

    One bad item is that item's error, never the chunk's: whatever it raises (``sys.exit`` and
    ``KeyboardInterrupt`` too), a result that cannot be pickled, an exception that cannot be.
    """
    import json
    import os
    import sys

    import cloudpickle

    # the job folder's contract, as the worker imported it (the debug executor: gpuctl's)
    jobfiles: Any = sys.modules.get("gpuctl_runner.jobfiles")
    if jobfiles is None:
        from gpuctl.node import jobfiles

    # what FAILED_ITEMS says: rewritten at each failure (small: the first items' arguments)
    failed: dict[str, Any] = {"items": len(items), "count": 0, "failed": []}
    folder = os.environ.get("GPUCTL_JOB_DIR")

    def error(exc: BaseException, tb: str, args: Any) -> Any:
        line = f"{type(exc).__name__}: {exc}"
        try:
            cloudpickle.dumps(exc)
        except Exception:  # an exception that cannot travel travels as its text
            exc = RuntimeError(line)
        failed["count"] += 1
        failed.setdefault("first", line[:300])
        if len(failed["failed"]) < NAMED_AT_MOST:
            failed["failed"].append(repr(args[0] if len(args) == 1 else args)[:60])
        try:
            if folder:
                with open(os.path.join(folder, FAILED_ITEMS), "w") as f:
                    json.dump(failed, f)
        except OSError:  # the result says it all the same
            pass
        return ("err", exc, tb)

    out: list[Any] = []
    for args in items:
        try:
            value = fn(*args)
        except BaseException as e:
            out.append(error(e, jobfiles.format_exception(e), args))
            continue
        try:
            cloudpickle.dumps(value)  # checked here, alone: else it would sink the whole chunk
        except Exception as e:
            wrapped = TypeError(f"the result cannot be pickled: {type(e).__name__}: {e}")
            out.append(error(wrapped, jobfiles.format_exception(e), args))
            continue
        out.append(("ok", value))
    return out


def load_shared(path: str) -> Any:
    """The shared part of a map (its function, with what it closes over), unpickled from the
    one file all its chunks' payloads name: called while VENV2 loads a chunk's payload."""
    import json
    import linecache

    import cloudpickle

    try:  # the source text of its code, for tracebacks (as the worker does for a payload's)
        with open(path + ".sources.json") as f:
            for name, text in json.load(f).items():
                linecache.cache[name] = (len(text), None, text.splitlines(True), name)
    except (OSError, ValueError, AttributeError):
        pass
    with open(path, "rb") as f:
        return cloudpickle.load(f)


class SharedPart:
    """What a chunk's payload holds in place of a map's function when that was written once
    for all chunks (``path`` on the node): unpickled, it is the function (``load_shared``)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> Any:
        return load_shared, (self.path,)
