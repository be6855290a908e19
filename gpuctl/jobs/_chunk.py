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
