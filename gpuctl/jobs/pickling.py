"""What a job's call pickles into, before anything is written: the user's own modules made to
pickle by value while a payload is written (``register_by_value``, ``pickling_by_value``), one
pass that measures, hashes and keeps a payload (``_measure``, ``_HashingWriter``), the payload
limit (``PayloadTooLarge``, naming the biggest parts), and a call refused because it cannot
travel (``Unpicklable``, naming the part that cannot; ``check_callable`` for an ``async def`` or
a generator function).

The executor writes what this measured into the job folder; the CLI's ``submit`` checks a
call with ``check_callable`` and ``check_picklable`` before it builds anything.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import pickle
import sys
import threading
import types
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import cloudpickle

from gpuctl.jobs import _chunk, _command, checkpoint, sources, usercode
from gpuctl.jobs.hosts import AtomicWriter
from gpuctl.jobs.report import _fmt_bytes

# the modules a job's runner code comes from travel by value: VENV2 has no gpuctl
cloudpickle.register_pickle_by_value(_chunk)
cloudpickle.register_pickle_by_value(checkpoint)
cloudpickle.register_pickle_by_value(_command)


_BY_VALUE_LOCK = threading.Lock()


_BY_VALUE_USERS: dict[str, int] = {}  # module name -> submits that registered it and pickle now


def register_by_value(obj: object, ships: Callable[[str], bool] | None = None) -> list[str]:
    """Make cloudpickle copy the user's own modules into the payload: the one that defines
    ``obj`` and every other module loaded from the user's files (a sibling ``helpers.py`` or
    package next to ``train.py``), which VENV2 could not import by name. Only what the function
    reaches is pickled; installed packages still travel by name.

    ``ships(name)``: True for a module that ships as a file with the job (``usercode``): it
    pickles by reference, so that in VENV2 ``mathx.square is sys.modules["mathx"].square`` and
    the standard pickle (a Pool's, a DataLoader's workers) pickles it as plain Python does.
    Returns the names registered by this call (none registered before), for
    ``unregister_by_value``."""
    names = [getattr(obj, "__module__", None), *list(sys.modules)]
    installed = usercode.installed_top_levels()
    done: list[str] = []
    with _BY_VALUE_LOCK:
        before = cloudpickle.list_registry_pickle_by_value()
        for name in names:
            if not isinstance(name, str) or not usercode.is_user_module(name) or name in done:
                continue
            if name != names[0] and name.split(".")[0] in installed:
                continue  # an editable install of a package: VENV2 is expected to have it
            if ships is not None and ships(name):
                continue
            if name in before and name not in _BY_VALUE_USERS:
                continue  # registered by the user: theirs to keep
            with contextlib.suppress(ValueError):
                cloudpickle.register_pickle_by_value(sys.modules[name])
                _BY_VALUE_USERS[name] = _BY_VALUE_USERS.get(name, 0) + 1
                done.append(name)
    return done


def unregister_by_value(names: Iterable[str]) -> None:
    """Undo ``register_by_value``: a module no other submit in progress registered goes back
    to cloudpickle's default (by reference), so the process is left as it was (a later
    cloudpickle user here, submitit's executor say, pickles it by name again)."""
    with _BY_VALUE_LOCK:
        for name in names:
            left = _BY_VALUE_USERS.get(name, 0) - 1
            if left > 0:
                _BY_VALUE_USERS[name] = left
                continue
            _BY_VALUE_USERS.pop(name, None)
            with contextlib.suppress(ValueError):
                cloudpickle.unregister_pickle_by_value(types.ModuleType(name))


@contextlib.contextmanager
def pickling_by_value(obj: object, ships: Callable[[str], bool] | None = None) -> Iterator[None]:
    """``register_by_value`` while the block writes the payload, undone after it."""
    names = register_by_value(obj, ships)
    try:
        yield
    finally:
        unregister_by_value(names)


class _HashingWriter:
    """A file wrapper that hashes and counts what cloudpickle writes through it. ``f`` None:
    nothing is kept (a pickle measured before anything is written); ``limit``: past that many
    bytes the write raises ``_OverLimit`` (the pickling stops there); ``hashing`` False: only
    counted."""

    def __init__(
        self,
        f: AtomicWriter | None,
        *,
        limit: int | None = None,
        hashing: bool = True,
        keep: int = 0,
    ) -> None:
        self.f = f
        self.h = hashlib.sha256() if hashing else None
        self.size = 0
        self.limit = limit
        self.keep = keep  # the bytes are kept while they come to at most this many
        self.kept: bytearray | None = bytearray() if keep > 0 else None

    PIECE = 8 << 20  # a large buffer is hashed piece by piece, each sent while the next hashes

    def write(self, data: bytes | bytearray | memoryview) -> int:
        mv = memoryview(data).cast("B")
        n = len(mv)
        self.size += n
        if self.limit is not None and self.size > self.limit:
            raise _OverLimit
        if self.kept is not None:
            if self.size > self.keep:
                self.kept = None  # too big to hold: the caller pickles again into the file
            else:
                self.kept += mv
        for i in range(0, n, self.PIECE):
            piece = mv[i : i + self.PIECE]
            if self.h is not None:
                self.h.update(piece)
            if self.f is not None:
                self.f.write(piece)
        return n

    def hexdigest(self) -> str:
        return self.h.hexdigest() if self.h is not None else ""


class _OverLimit(Exception):
    """A measured pickle passed its limit (``_HashingWriter``): it stopped there."""


DEFAULT_MAX_PAYLOAD = 1 << 30  # bytes of one pickled payload (a map's shared part, a chunk)


SHARED_ABOVE = 1 << 20  # a map's function that pickles to more goes into one file for all chunks


class PayloadTooLarge(ValueError):
    """A payload over the Executor's ``max_payload``, refused before anything was written:
    its ``size`` and the ``limit`` (bytes), ``parts`` (what is big in it: (what, bytes),
    biggest first)."""

    def __init__(self, what: str, size: int, limit: int, parts: Sequence[tuple[str, int]]) -> None:
        self.size, self.limit, self.parts = size, limit, list(parts)
        big = "; ".join(f"{name}: {_fmt_bytes(n)}" for name, n in self.parts[:3])
        super().__init__(
            f"{what} pickles to {_fmt_bytes(size)}, over the payload limit of "
            f"{_fmt_bytes(limit)} (max_payload)"
            + (f"; the biggest parts: {big}" if big else "")
            + ". Nothing was written. Pass big data by path (save it where the node can read "
            "it and load it inside the function), or raise the limit: "
            'Executor(..., max_payload="4G") or max_payload = "4G" in the config\'s [jobs]'
        )


class Unpicklable(pickle.PicklingError, TypeError):
    """A call that cannot be pickled, refused before anything was written: the message names
    the part that cannot (``global `LOCK` that `score` uses``, ``argument 0``), what it is, and
    what to do instead. A ``PicklingError`` and a ``TypeError``, as cloudpickle raises."""


def _what_it_is(value: object) -> tuple[str, str]:
    """(what ``value`` is, what to pass instead) for a value that does not pickle."""
    import io
    import socket

    t = type(value)
    if (t.__module__ == "_thread" and t.__name__ in ("lock", "RLock")) or isinstance(
        value, threading.Condition | threading.Semaphore | threading.Event
    ):
        return (
            f"a lock ({t.__module__}.{t.__qualname__})",
            "create it inside the function (a lock here locks nothing on the node)",
        )
    if isinstance(value, io.IOBase):
        name, mode = getattr(value, "name", "?"), getattr(value, "mode", "?")
        return (
            f"an open file ({name!r}, mode {mode!r})",
            "pass its path and open it inside the function",
        )
    if isinstance(value, socket.socket):
        return "a socket", "pass its address and connect inside the function"
    if isinstance(value, types.GeneratorType | types.AsyncGeneratorType | types.CoroutineType):
        return (
            f"a {t.__name__} (it cannot be copied halfway through)",
            "pass a list of what it yields, or the function that makes it",
        )
    kind = t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
    return f"a {kind}", "create it inside the function, or pass what it is made from"


def _unpicklable(what: str, error: Exception, parts: Mapping[str, Any]) -> Unpicklable:
    """The error for ``what`` that cannot be pickled (``error``): the first of its ``parts``
    (name: value, as ``_parts`` names them) that cannot be pickled alone, named."""
    for name, value in parts.items():
        try:
            _measure(value, None)
        except Exception as e:
            it, instead = _what_it_is(value)
            return Unpicklable(
                f"{what} cannot be pickled: {name} is {it}, which cannot travel to the node "
                f"({type(e).__name__}: {e}); {instead}"
            )
    return Unpicklable(f"{what} cannot be pickled: {type(error).__name__}: {error}")


def check_callable(fn: object) -> None:
    """TypeError with one line for a function whose call makes something to run later (an
    ``async def``, a generator function): the job would only return that, unrun."""
    import inspect

    name = getattr(fn, "__name__", None) or getattr(getattr(fn, "func", None), "__name__", "f")
    if inspect.iscoroutinefunction(fn):
        raise TypeError(
            f"`{name}` is an async def function: calling it on the node only makes a coroutine, "
            f"which nothing would run; submit a plain function: `lambda: asyncio.run({name}())`"
        )
    if inspect.isasyncgenfunction(fn):
        raise TypeError(
            f"`{name}` is an async generator function: calling it on the node only makes an "
            "async generator, which nothing would run; submit a plain function that runs it: "
            f"`lambda: asyncio.run(collect({name}()))` with `async def collect(g): return "
            "[x async for x in g]`"
        )
    if inspect.isgeneratorfunction(fn):
        raise TypeError(
            f"`{name}` is a generator function: calling it on the node only makes a generator, "
            "which cannot travel back; submit a plain function: "
            f"`lambda: list({name}())`"
        )


def check_picklable(
    what: str, fn: Callable[..., Any], args: Sequence[Any] = (), kwargs: Mapping[str, Any] = {}
) -> None:
    """``Unpicklable`` naming the culprit when the call ``fn(*args, **kwargs)`` cannot be
    pickled as a submit pickles it (``what``: how the message names the call)."""
    with pickling_by_value(fn):
        _pickles(what, (fn, tuple(args), dict(kwargs)), lambda: _parts(fn, args, kwargs))


def _pickles(what: str, obj: object, parts: Callable[[], Mapping[str, Any]]) -> None:
    """``Unpicklable`` naming the culprit among ``parts()`` when ``obj`` cannot be pickled."""
    try:
        _measure(obj, None)
    except (TypeError, pickle.PicklingError) as e:
        raise _unpicklable(what, e, parts()) from e


KEEP_BELOW = 64 << 20  # a payload that pickles to at most this is written from its measure


@dataclasses.dataclass
class _Pickled:
    """A payload pickled once by ``sources.PayloadPickler``: its size, sha256 (or ""), the
    files whose code went by value, the modules unpickling imports, and its bytes when kept."""

    size: int
    digest: str
    filenames: set[str]
    modules: set[str]
    data: bytes | None


def _measure(
    obj: object, limit: int | None, *, hashing: bool = False, keep: bool = False
) -> _Pickled:
    """``obj`` pickled as a payload is, in one pass: measured, hashed when ``hashing``, its
    files and modules noted, and its bytes kept when ``keep`` and at most ``KEEP_BELOW`` (a
    submit measured, scanned and wrote its payload in three passes). Past ``limit`` bytes it
    stops (the size is then what it counted: over the limit, maybe not all; nothing else
    noted). The pickler hands large bytes and buffers over as they are, so measuring them
    copies nothing (a torch tensor is copied once, by its own reducer)."""
    w = _HashingWriter(None, limit=limit, hashing=hashing, keep=KEEP_BELOW if keep else 0)
    try:
        pickler = sources.dump(obj, w)
    except _OverLimit:
        return _Pickled(w.size, "", set(), set(), None)
    data = bytes(w.kept) if w.kept is not None else None
    return _Pickled(w.size, w.hexdigest(), pickler.filenames, pickler.modules, data)


def _parts(fn: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """What a call is made of, by name: the arguments, and what the function closes over
    (its closure's variables, the globals its code names, a bound method's object, a
    partial's arguments)."""
    found: dict[str, Any] = {}
    for i, a in enumerate(args):
        found[f"argument {i}"] = a
    for k, v in kwargs.items():
        found[f"argument {k}="] = v
    seen: set[int] = set()

    def walk(f: Any, depth: int) -> None:
        if depth > 3 or id(f) in seen:
            return
        seen.add(id(f))
        if isinstance(f, functools.partial):
            walk(f.func, depth + 1)
            for i, a in enumerate(f.args):
                found[f"argument {i} of the partial"] = a
            for k, v in (f.keywords or {}).items():
                found[f"argument {k}= of the partial"] = v
            return
        owner = getattr(f, "__self__", None)
        if owner is not None and not isinstance(owner, types.ModuleType):
            found[f"the object of method {getattr(f, '__name__', '?')}"] = owner
        code = getattr(f, "__code__", None)
        if code is None:
            return
        label = getattr(f, "__qualname__", "?")
        for name, cell in zip(
            code.co_freevars, getattr(f, "__closure__", None) or (), strict=False
        ):
            with contextlib.suppress(ValueError):  # an empty cell
                value = cell.cell_contents
                if callable(value) and hasattr(value, "__code__"):
                    walk(value, depth + 1)
                else:
                    found[f"variable `{name}` that {label} closes over"] = value
        glob = getattr(f, "__globals__", {})
        for name in code.co_names:
            if name in glob:
                value = glob[name]
                if isinstance(value, types.ModuleType | type):
                    continue
                if callable(value) and hasattr(value, "__code__"):
                    walk(value, depth + 1)
                else:
                    found[f"global `{name}` that {label} uses"] = value

    walk(fn, 0)
    return found


def _item_parts(chunk: Sequence[tuple[Any, ...]], first: int) -> dict[str, Any]:
    """The arguments of a map's chunk, by name ("item 7", "item 7 argument 1")."""
    return {
        f"item {first + j}" + (f" argument {i}" if len(args) > 1 else ""): a
        for j, args in enumerate(chunk)
        for i, a in enumerate(args)
    }


def _biggest(parts: Mapping[str, Any], limit: int) -> list[tuple[str, int]]:
    """``parts`` (name: value) by pickled size, biggest first, each as "name (type)"; those
    under 1 % of ``limit`` are left out."""
    sized = []
    for name, value in parts.items():
        try:
            n = _measure(value, limit).size
        except Exception:
            continue  # a part that does not pickle alone (it may inside the whole)
        if n >= limit // 100:
            t = type(value)
            kind = (
                t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
            )
            sized.append((f"{name} ({kind})", n))
    return sorted(sized, key=lambda p: -p[1])
