"""JSON from outside (a node's agent, a job's folder, a stored row) read into typed values.

``parse(Schema, value)`` makes a ``Schema`` TypedDict of a decoded JSON object, checking every
field against the type the schema declares: a key the schema does not name is left out, and so
is a field whose value does not have its type (a string where a number belongs, an integer wider
than 64 bits, a float that is not finite, a list with one element of the wrong type). A list of
TypedDicts (records) keeps the elements that read and drops the others. It never raises on what
it reads: junk gives fewer fields, or None when the value is not an object or a required key is
missing or wrong. Lists and dicts are copied (the result shares none with the input), except
under a field declared ``Any``.

Declared types it checks: ``str``, ``int``, ``float`` (an int is a float too; a bool is
neither), ``bool``, ``None``, ``X | Y``, ``Literal[...]``, ``list[X]``, ``dict[str, X]`` and
``Mapping[str, X]``, nested TypedDicts, and ``Any`` / ``object`` (kept as they are: a field whose
reader checks it itself). A schema declaring anything else is a programming error: TypeError,
from the first ``parse`` of that schema.
"""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, Union, cast, get_args, get_origin, get_type_hints

import msgspec

T = TypeVar("T")

# A JSON object as decoded (``json.loads``), before anything checked it: what a link or a file
# hands over, and what ``parse`` turns into a schema's TypedDict.
JsonObject = dict[str, Any]

# No counter a node reports is wider than 64 bits: a bigger integer is junk (and 10**400 would
# raise OverflowError in every float() above this layer).
INT_LIMIT = 1 << 64


class _Miss:
    """The value does not have the declared type."""


_MISS = _Miss()


def parse(schema: type[T], value: object) -> T | None:
    """``value`` as a ``schema`` TypedDict (see the module docstring), or None when it is not a
    JSON object or lacks a required key. Never raises on ``value``."""
    if not isinstance(value, dict):
        return None
    fields, required = _schema_of(schema)
    out: dict[str, object] = {}
    for key, v in value.items():  # in the input's order: what is printed again reads the same
        if key in fields:
            checked = _fit(fields[key], v)
            if not isinstance(checked, _Miss):
                out[key] = checked
    if not required <= out.keys():
        return None
    return cast(T, out)  # every field checked against the schema above


def parse_list(schema: type[T], value: object) -> list[T]:
    """The elements of ``value`` (a JSON list) that ``parse`` as ``schema``; [] for a non-list."""
    if not isinstance(value, list):
        return []
    return [item for item in (parse(schema, v) for v in value) if item is not None]


_SCHEMAS: dict[object, tuple[dict[str, object], frozenset[str]]] = {}


def _schema_of(schema: object) -> tuple[dict[str, object], frozenset[str]]:
    """A schema's fields and required keys, read (and checked) once."""
    known = _SCHEMAS.get(schema)
    if known is None:
        if not (isinstance(schema, type) and typing.is_typeddict(schema)):
            raise TypeError(f"{schema!r} is not a TypedDict")
        fields = get_type_hints(schema)
        for declared in fields.values():
            _supported(declared)
        known = _SCHEMAS[schema] = (fields, frozenset(getattr(schema, "__required_keys__", ())))
    return known


_PLAIN = (str, int, float, bool, type(None))
_UNIONS = (Union, types.UnionType)
_LISTS = (list,)
_DICTS = (dict, Mapping)


def _supported(declared: object) -> None:
    if declared in _PLAIN or declared is Any or declared is object or declared is None:
        return
    if isinstance(declared, type) and typing.is_typeddict(declared):
        return
    origin = get_origin(declared)
    if origin is Literal:
        return
    if origin in _UNIONS or origin in _LISTS or origin in _DICTS:
        args = get_args(declared)
        if origin in _DICTS and args and args[0] is not str:
            raise TypeError(f"JSON object keys are strings, not {args[0]!r}")
        for arg in args[1:] if origin in _DICTS else args:
            _supported(arg)
        return
    raise TypeError(f"gpuctl.core.wire cannot check a field of type {declared!r}")


def _fit(declared: object, v: object) -> object:
    """``v`` (copied) when it has the ``declared`` type, else ``_MISS``."""
    if declared is Any or declared is object:
        return v
    if declared is None or declared is type(None):
        return v if v is None else _MISS
    if declared is bool:
        return v if isinstance(v, bool) else _MISS
    if declared is int:
        return v if _is_int(v) else _MISS
    if declared is float:
        if isinstance(v, float):
            return v if math.isfinite(v) else _MISS
        return v if _is_int(v) else _MISS
    if declared is str:
        return v if isinstance(v, str) else _MISS
    if isinstance(declared, type) and typing.is_typeddict(declared):
        nested = parse(declared, v)
        return _MISS if nested is None else nested
    origin = get_origin(declared)
    args = get_args(declared)
    if origin in _UNIONS:
        for arg in args:
            fitted = _fit(arg, v)
            if not isinstance(fitted, _Miss):
                return fitted
        return _MISS
    if origin is Literal:
        # True == 1, so compare types too: a Literal[1] field is not a bool
        return v if any(v == a and type(v) is type(a) for a in args) else _MISS
    if origin in _LISTS:
        if not isinstance(v, list):
            return _MISS
        item = args[0] if args else Any
        records = isinstance(item, type) and typing.is_typeddict(item)
        items = []
        for x in v:
            fitted = _fit(item, x)
            if isinstance(fitted, _Miss):
                if records:
                    continue  # a list of records keeps the ones that read
                return _MISS
            items.append(fitted)
        return items
    if origin in _DICTS:
        if not isinstance(v, dict):
            return _MISS
        of = args[1] if len(args) > 1 else Any
        values = {}
        for k, x in v.items():
            fitted = _fit(of, x)
            if not isinstance(k, str) or isinstance(fitted, _Miss):
                return _MISS
            values[k] = fitted
        return values
    return _MISS  # _supported refused every other type when the schema was first read


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and -INT_LIMIT < v < INT_LIMIT


# -- msgspec Structs, leniently -------------------------------------------------------------------
S = TypeVar("S", bound=msgspec.Struct)


def lenient(
    schema: type[S], value: object, defaults: Mapping[str, object] | None = None
) -> S | None:
    """``value`` (decoded JSON) as the msgspec Struct ``schema``, keeping what reads: the slow
    path for what a typed decoder refused as a whole. A field whose value does not have its
    type (bounds included) is left at its default; a nested Struct is read the same way; a
    list of Structs keeps the elements that read, the first ``max_length`` when the type bounds
    it (a Struct with an ``index`` field in a list takes its position there when its own is
    missing or bad: a GPU's); a list of anything else is kept whole or not at all (after
    ``max_length``). ``defaults`` (by wire name) stand in for missing or bad fields. None when
    ``value`` is not an object or a required field is missing. Never raises on ``value``."""
    try:
        return msgspec.convert(value, schema)
    except msgspec.ValidationError:
        pass
    if not isinstance(value, dict):
        return None
    kept: dict[str, object] = dict(defaults or {})
    for name, declared, plan in _plan(schema):
        if name in value:
            fitted = _lenient_value(declared, plan, value[name])
            if fitted is not _MISS:
                kept[name] = fitted
    try:
        return msgspec.convert(kept, schema)
    except msgspec.ValidationError:
        return None  # a required field is missing


_Plan = tuple[str, type[msgspec.Struct] | None, int | None]
_PLANS: dict[type[msgspec.Struct], list[tuple[str, object, _Plan]]] = {}


def _plan(schema: type[msgspec.Struct]) -> list[tuple[str, object, _Plan]]:
    """Each field of ``schema``: its wire name, declared type, and how to read it leniently:
    ("one", Struct, None) for an (optional) nested Struct, ("many", Struct or None, max_length)
    for a list or tuple (of Structs or not), ("plain", None, None) for the rest."""
    known = _PLANS.get(schema)
    if known is None:
        info = msgspec.inspect.type_info(schema)
        assert isinstance(info, msgspec.inspect.StructType)
        known = []
        for field, declared in zip(info.fields, msgspec.structs.fields(schema), strict=True):
            kind = field.type
            options = kind.types if isinstance(kind, msgspec.inspect.UnionType) else (kind,)
            plan: _Plan = ("plain", None, None)
            for option in options:
                if isinstance(option, msgspec.inspect.StructType):
                    plan = ("one", option.cls, None)
                elif isinstance(option, msgspec.inspect.VarTupleType | msgspec.inspect.ListType):
                    item = option.item_type
                    record = item.cls if isinstance(item, msgspec.inspect.StructType) else None
                    plan = ("many", record, option.max_length)
            known.append((field.encode_name, declared.type, plan))
        _PLANS[schema] = known
    return known


def _lenient_value(declared: object, plan: _Plan, v: object) -> object:
    try:
        return msgspec.convert(v, declared)
    except msgspec.ValidationError:
        pass
    kind, record, most = plan
    if kind == "one" and record is not None:
        nested = lenient(record, v)
        return _MISS if nested is None else nested
    if kind == "many" and isinstance(v, list):
        items = v[:most] if most is not None else v
        if record is None:
            try:
                return msgspec.convert(items, declared)
            except msgspec.ValidationError:
                return _MISS
        positional = "index" in record.__struct_fields__
        kept = []
        for position, item in enumerate(items):
            read = lenient(record, item, {"index": position} if positional else None)
            if read is not None:
                kept.append(read)
        return tuple(kept)
    return _MISS
