"""Runs one chunk of a ``map`` in VENV2. Pickled by value: VENV2 has no gpuctl installed."""

from typing import Any


def run_chunk(fn: Any, items: Any) -> Any:
    """Apply ``fn`` to each argument tuple; per item ("ok", value) or ("err", exception, tb)."""
    import traceback

    out: list[Any] = []
    for args in items:
        try:
            out.append(("ok", fn(*args)))
        except Exception as e:
            out.append(("err", e, traceback.format_exc()))
    return out
