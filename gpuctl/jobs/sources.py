"""The payload's one pickler: tracebacks that name the user's files, and the modules it loads.

cloudpickle (3.1.3 on) writes every code object it ships by value with the file name
``<dynamic-code>`` (to make pickles of notebook cells deterministic), so a job's traceback read
``File "<dynamic-code>", line 34, in deeper`` with no source line. ``PayloadPickler`` keeps each
code object's own file name, and notes the files; ``read_sources`` reads their text (capped),
which goes into the job folder (``jobfiles.SOURCES``) for the worker to put into ``linecache``:
a traceback on a node that lacks the file still shows ``train.py``, line 34, and its line.

The same pass notes the module of every class, function and module the pickle refers to
(``modules``): what unpickling will import in VENV2, checked before anything is sent
(``provision.payload_modules``). One pickler for both: a submit measured, scanned and wrote its
payload in three pickling passes; it is now measured and scanned in one, and written from that
pass's bytes when they are small (``executor.KEEP_BELOW``).
"""

from __future__ import annotations

import os
import types
from collections import ChainMap
from typing import Any, Protocol

import cloudpickle
from cloudpickle import cloudpickle as _cp

DYNAMIC = "<dynamic-code>"
MAX_FILE = 1 << 20  # a larger file's lines are not shipped (the traceback still names it)
MAX_TOTAL = 8 << 20


class Writable(Protocol):
    def write(self, data: bytes | bytearray | memoryview, /) -> int: ...


class PayloadPickler(cloudpickle.Pickler):  # type: ignore[misc]  # cloudpickle has no types
    """cloudpickle's pickler, with code objects that keep their file name (``filenames``: the
    files whose code was pickled by value), noting the modules unpickling imports (``modules``:
    what its GLOBAL and STACK_GLOBAL opcodes name, and cloudpickle's ``subimport``)."""

    def __init__(self, file: Writable, protocol: int | None = None, **kwargs: Any) -> None:
        self.filenames: set[str] = set()
        self.modules: set[str] = set()
        # the C pickler reads dispatch_table when it is made: set it first
        self.dispatch_table = ChainMap(
            {types.CodeType: self._reduce_code}, cloudpickle.Pickler.dispatch_table
        )
        super().__init__(file, protocol=protocol, **kwargs)

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, types.ModuleType):
            self.modules.add(obj.__name__)
        elif isinstance(obj, type | types.FunctionType | types.BuiltinFunctionType):
            module = getattr(obj, "__module__", None)
            if isinstance(module, str):
                self.modules.add(module)
        return super().reducer_override(obj)

    def _reduce_code(self, code: types.CodeType) -> Any:
        rebuild, args = _cp._code_reduce(code)
        name = code.co_filename
        if name and not name.startswith("<"):
            self.filenames.add(name)
        return rebuild, tuple(name if isinstance(a, str) and a == DYNAMIC else a for a in args)


def dump(obj: object, file: Writable) -> PayloadPickler:
    """Pickle ``obj`` into ``file`` as cloudpickle would (protocol 5); returns the pickler (its
    ``filenames`` and ``modules``)."""
    pickler = PayloadPickler(file, protocol=5)
    pickler.dump(obj)
    return pickler


def read_sources(filenames: set[str]) -> dict[str, str]:
    """The text of ``filenames`` that exist here and fit the caps (smallest first)."""
    out: dict[str, str] = {}
    total = 0
    sized = []
    for name in filenames:
        try:
            sized.append((os.path.getsize(name), name))
        except OSError:
            continue
    for size, name in sorted(sized):
        if size > MAX_FILE or total + size > MAX_TOTAL:
            continue
        try:
            with open(name, encoding="utf-8") as f:
                out[name] = f.read()
        except (OSError, UnicodeDecodeError):
            continue
        total += size
    return out
