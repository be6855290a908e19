"""Runs one chunk of a ``map`` in VENV2. Pickled by value: VENV2 has no gpuctl installed."""

from typing import Any


def run_chunk(fn: Any, items: Any) -> Any:
    """Apply ``fn`` to each argument tuple; per item ("ok", value) or ("err", exception, tb).

    One bad item is that item's error, never the chunk's: whatever it raises (``sys.exit`` and
    ``KeyboardInterrupt`` too), a result that cannot be pickled, an exception that cannot be.
    """
    import traceback

    import cloudpickle

    def error(exc: BaseException, tb: str) -> Any:
        try:
            cloudpickle.dumps(exc)
        except Exception:  # an exception that cannot travel travels as its text
            exc = RuntimeError(f"{type(exc).__name__}: {exc}")
        return ("err", exc, tb)

    out: list[Any] = []
    for args in items:
        try:
            value = fn(*args)
        except BaseException as e:
            out.append(error(e, traceback.format_exc()))
            continue
        try:
            cloudpickle.dumps(value)  # checked here, alone: else it would sink the whole chunk
        except Exception as e:
            wrapped = TypeError(f"the result cannot be pickled: {type(e).__name__}: {e}")
            out.append(error(wrapped, traceback.format_exc()))
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
