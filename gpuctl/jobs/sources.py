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
pass's bytes when they are small (``pickling.KEEP_BELOW``).
"""

from __future__ import annotations

import linecache
import os
import sys
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
        # "<...>" names no file; linecache's text of one (IPython's "<ipython-input-1-...>",
        # the 3.13 REPL's "<python-input-0>") is shipped as a notebook cell's is
        if name and (not name.startswith("<") or name in linecache.cache):
            self.filenames.add(name)
        return rebuild, tuple(name if isinstance(a, str) and a == DYNAMIC else a for a in args)


def dump(obj: object, file: Writable) -> PayloadPickler:
    """Pickle ``obj`` into ``file`` as cloudpickle would (protocol 5); returns the pickler (its
    ``filenames`` and ``modules``)."""
    pickler = PayloadPickler(file, protocol=5)
    pickler.dump(obj)
    return pickler


def read_sources(filenames: set[str]) -> dict[str, str]:
    """The text of ``filenames`` that fit the caps (smallest first): read from the file where
    it exists here, else ``linecache``'s lines of it (a notebook cell's, which ipykernel names
    ``/tmp/ipykernel_PID/HASH.py``, the IPython shell ``<ipython-input-N-HASH>``, and keeps
    there, never on disk)."""
    out: dict[str, str] = {}
    total = 0
    sized: list[tuple[int, str, str | None]] = []
    for name in filenames:
        try:
            sized.append((os.path.getsize(name), name, None))
        except OSError:
            cached = _cached_text(name)
            if cached is not None:
                sized.append((len(cached.encode("utf-8", "replace")), name, cached))
    for size, name, cached in sorted(sized, key=lambda t: (t[0], t[1])):
        if size > MAX_FILE or total + size > MAX_TOTAL:
            continue
        if cached is not None:
            out[name] = cached
        else:
            try:
                with open(name, encoding="utf-8") as f:
                    out[name] = f.read()
            except (OSError, UnicodeDecodeError):
                continue
        total += size
    return out


def _cached_text(name: str) -> str | None:
    """The text ``linecache`` holds for ``name`` that no file gave (IPython's cells, which it
    keeps in ``linecache.cache`` and, in recent versions, ``linecache._ipython_cache``)."""
    for cache in (linecache.cache, getattr(linecache, "_ipython_cache", None)):
        entry = cache.get(name) if isinstance(cache, dict) else None
        if isinstance(entry, tuple) and len(entry) >= 3 and isinstance(entry[2], list):
            lines = entry[2]
            if all(isinstance(line, str) for line in lines[:10000]) and len(lines) <= 10000:
                return "".join(lines)
    return None


def cell_names(filenames: set[str]) -> dict[str, str]:
    """``{file name: "In[N]"}`` of the notebook cells among ``filenames``, as IPython prints
    them (``Cell In[3], line 4``): from the map of file names to execution counts the running
    IPython's compiler keeps (``IPython.core.compilerop``). Empty outside IPython."""
    ipython = sys.modules.get("IPython")
    try:
        shell = ipython.get_ipython() if ipython is not None else None
        known = getattr(getattr(shell, "compile", None), "_filename_map", None)
    except Exception:
        return {}
    if not isinstance(known, dict):
        return {}
    return {
        name: f"In[{known[name]}]"
        for name in filenames
        if isinstance(known.get(name), int) and not os.path.exists(name)
    }
