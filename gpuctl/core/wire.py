"""JSON from outside (a node's agent, a job's folder, a stored row) read into typed values, by
msgspec: the declared types are the schema, and msgspec checks a value against them in C.

``lenient(Struct, value)`` reads a decoded JSON object into a msgspec Struct (the messages of an
agent, ``gpuctl.core.model``), and ``parse(Schema, value)`` into a ``Schema`` TypedDict (the
replies, burn events and job files). Both first convert the value whole (``msgspec.convert``:
the fast path, for what is valid); where it refuses, they read it field by field, so that one
broken field never hides the others:

* a key the schema does not name is left out;
* a field whose value does not have its type is left out (TypedDict) or left at its default
  (Struct): a string where a number belongs, a bool where an int does, a float that is not
  finite, an integer wider than 64 bits (in a TypedDict an ``int`` is read as an int64 and a
  ``float`` as a finite one; a Struct states its bounds with ``msgspec.Meta``);
* a nested object is read the same way; a list of objects (records) keeps the elements that
  read (the first ``max_length`` where the type bounds it); a list of anything else is kept
  whole or not at all;
* the result is None when ``value`` is not an object or a required field is missing or bad.

``lenient_fields(Struct, fields)`` reads the same way from a JSON object's text split at its
fields (``json_fields``), each field's text decoded by msgspec straight into its type: the slow
path of a line whose typed decode refused a value, without decoding the whole line into Python
objects first (what ``lenient`` reads) and converting it again.

It never raises on what it reads. Lists and dicts are copied (the result shares none with the
input), except under a field declared ``Any``. A TypedDict declaring a type msgspec cannot
check is a programming error: TypeError, from the first ``parse`` of that schema.
"""

from __future__ import annotations

import math
import re
import sys
import types
import typing
from collections.abc import Mapping
from typing import (
    Annotated,
    Any,
    Literal,
    TypedDict,
    TypeVar,
    Union,
    cast,
    get_args,
    get_origin,
    get_type_hints,
)

import msgspec
from msgspec import Meta

T = TypeVar("T")
S = TypeVar("S", bound=msgspec.Struct)

# A JSON object as decoded (``json.loads``), before anything checked it: what a link or a file
# hands over, and what ``parse`` turns into a schema's TypedDict.
JsonObject = dict[str, Any]

# What a TypedDict's ``int`` and ``float`` mean for a value from outside: no counter is wider
# than 64 bits (10**400 would raise OverflowError in every float() above this layer), and NaN or
# an infinity is no reading.
Int64 = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]
Finite = Annotated[float, Meta(ge=-sys.float_info.max, le=sys.float_info.max)]


class _Miss:
    """The value does not have the declared type."""


_MISS = _Miss()


def parse(schema: type[T], value: object) -> T | None:
    """``value`` as a ``schema`` TypedDict (see the module docstring), or None when it is not a
    JSON object or lacks a required key. Never raises on ``value``."""
    if not isinstance(value, dict):
        return None
    return cast(T | None, _read(_bounded_typeddict(schema), value, None))


def parse_list(schema: type[T], value: object) -> list[T]:
    """The elements of ``value`` (a JSON list) that ``parse`` as ``schema``; [] for a non-list."""
    if not isinstance(value, list):
        return []
    return [item for item in (parse(schema, v) for v in value) if item is not None]


def lenient(
    schema: type[S], value: object, defaults: Mapping[str, object] | None = None
) -> S | None:
    """``value`` (decoded JSON) as the msgspec Struct ``schema`` (see the module docstring):
    the slow path for what a typed decoder refused as a whole. ``defaults`` (by wire name) stand
    in for missing or bad fields; a Struct with an ``index`` field in a list takes its position
    there when its own is missing or bad (a GPU's). Never raises on ``value``. A float that is
    not finite (the lenient JSON reader takes ``NaN`` and ``Infinity``) is null wherever it is,
    under a field declared ``Any`` too: what comes out is JSON again."""
    return cast(S | None, _read(schema, _finite(value), defaults))


def _finite(value: object, depth: int = 0) -> object:
    """``value`` with every NaN or infinite float as None (lists and dicts copied)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if depth > 64:  # deeper than any reader lets through; left as it is
        return value
    if isinstance(value, dict):
        return {k: _finite(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v, depth + 1) for v in value]
    return value


def _read(schema: object, value: object, defaults: Mapping[str, object] | None) -> object:
    try:
        return msgspec.convert(value, schema)
    except msgspec.ValidationError:
        pass
    if not isinstance(value, dict):
        return None
    kept: dict[str, object] = dict(defaults or {})
    plan = _plan(schema)
    for key, v in value.items():  # in the input's order: what is printed again reads the same
        field = plan.get(key)
        if field is not None:
            fitted = _lenient_value(field, v)
            if not isinstance(fitted, _Miss):
                kept[key] = fitted
    try:
        return msgspec.convert(kept, schema)
    except msgspec.ValidationError:
        return None  # a required field is missing or bad


# -- reading from JSON text, one field at a time --------------------------------------------------
_FIELDS = msgspec.json.Decoder(dict[str, msgspec.Raw])
_ITEMS = msgspec.json.Decoder(list[msgspec.Raw])
_ENCODE = msgspec.json.Encoder().encode  # a dict of texts (Raw) as one object's text again
# A field's reading from its text: the decoder of its declared type, the nested schema, whether
# it is a list and its max_length (``_plan``), and whether its elements take their position as
# ``index``. Made once per Struct: a typing form's hash is slow to take per field.
_JsonField = tuple[msgspec.json.Decoder[Any], object | None, bool, int | None, bool]
_JSON_PLANS: dict[object, tuple[msgspec.json.Decoder[Any], dict[str, _JsonField]]] = {}
# Where msgspec says a value was refused: ``$.gpus[7].temp``
_PATH = re.compile(r" - at `\$((?:\.\w+|\[\d+\])*)`$")
_STEP = re.compile(r"\.(\w+)|\[(\d+)\]")
Path = tuple[str | int, ...]


def _json_plan(schema: object) -> tuple[msgspec.json.Decoder[Any], dict[str, _JsonField]]:
    known = _JSON_PLANS.get(schema)
    if known is None:
        fields = {
            key: (
                msgspec.json.Decoder(declared),
                nested,
                many,
                most,
                isinstance(nested, type) and "index" in getattr(nested, "__struct_fields__", ()),
            )
            for key, (declared, nested, many, most) in _plan(schema).items()
        }
        known = _JSON_PLANS[schema] = (msgspec.json.Decoder(schema), fields)
    return known


def _refused(e: msgspec.ValidationError) -> None:
    """Raise ``e`` as a plain DecodeError where msgspec refused a number it could not hold (not
    a value of the wrong type): what the lenient JSON reader reads as None."""
    text = str(e)
    if text.endswith("out of range") or " out of range - at " in text:
        raise msgspec.DecodeError(text) from None


def refused_at(e: msgspec.ValidationError) -> Path | None:
    """Where in the text msgspec refused a value (``$.gpus[7].temp``: ("gpus", 7, "temp")), for
    ``lenient_fields``; None where it does not say. Raises ``e`` as a plain DecodeError where
    the value was a number out of range (``lenient_fields``)."""
    _refused(e)
    where = _PATH.search(str(e))
    if where is None:
        return None
    return tuple(key or int(at) for key, at in _STEP.findall(where.group(1)))


def json_fields(text: bytes | str) -> dict[str, msgspec.Raw]:
    """A JSON object's text split at its fields: each value's text, undecoded (a key twice: the
    last). Raises msgspec.ValidationError when it is not an object, msgspec.DecodeError when it
    is not JSON (NaN, a syntax error), UnicodeDecodeError for a key that is not UTF-8."""
    return _FIELDS.decode(text)


def lenient_fields(
    schema: type[S], fields: Mapping[str, msgspec.Raw], refused: Path | None = None
) -> S | None:
    """``lenient(schema, value)`` for the object whose fields' texts are ``fields``
    (``json_fields``), without decoding it into Python objects first: each field's text is
    decoded by msgspec into the field's type (in a sample of eight GPUs with one bad field,
    the seven valid GPUs whole), and one it refuses is read field by field the same way.
    ``refused`` (``refused_at`` of the error of the typed decode of the whole) says where to
    look first: the lists and objects on that path are read item by item and field by field
    at once, not tried whole again (it changes the time taken, never what comes out).

    What comes out is what ``lenient`` makes of ``msgspec.json.decode`` of the same text.
    Raises msgspec.DecodeError (or UnicodeDecodeError, RecursionError) where that decode would
    refuse a field it reads (a number out of range, a string that is not UTF-8): read such a
    text with a lenient JSON reader and ``lenient``."""
    return cast(S | None, _read_fields(schema, fields, None, refused))


def _read_json(
    schema: object, text: msgspec.Raw, defaults: Mapping[str, object] | None, path: Path | None
) -> object:
    if path is None:  # not known to be refused: tried whole first
        try:
            return _json_plan(schema)[0].decode(text)
        except msgspec.ValidationError as e:
            path = refused_at(e)
    try:
        fields = _FIELDS.decode(text)
    except msgspec.ValidationError:
        return None  # not an object
    return _read_fields(schema, fields, defaults, path)


def _read_fields(
    schema: object,
    fields: Mapping[str, msgspec.Raw],
    defaults: Mapping[str, object] | None,
    path: Path | None,
) -> object:
    whole, plan = _json_plan(schema)
    if path is not None and len(path) == 1 and path[0] in fields:
        # A value of this object's own refused (not one in a list or object under it): the
        # object without it, decoded whole again (one refused after another, the same way)
        rest = dict(fields)
        while path is not None and len(path) == 1 and path[0] in rest:
            field = plan.get(str(path[0]))
            if field is not None and (field[1] is not None or field[2]):
                break  # an object or a list (cut to its max_length) refused whole: read below
            del rest[str(path[0])]
            try:
                read = whole.decode(_ENCODE(rest))
            except msgspec.ValidationError as e:
                path = refused_at(e)
                continue
            if not defaults or all(key in rest for key in defaults):
                return read
            break
    kept: dict[str, object] = dict(defaults or {})
    on_path, below = (path[0], path[1:]) if path else (None, None)
    for key, text in fields.items():
        field = plan.get(key)
        if field is not None:
            fitted = _lenient_json(field, text, below if key == on_path else None)
            if not isinstance(fitted, _Miss):
                kept[key] = fitted
    try:
        return msgspec.convert(kept, schema)
    except msgspec.ValidationError:
        return None  # a required field is missing or bad


def _lenient_json(field: _JsonField, text: msgspec.Raw, path: Path | None) -> object:
    """``_lenient_value`` of a field's text; ``path``: where in it a value was refused (a list
    or an object on it is read item by item or field by field without a try of the whole)."""
    decoder, nested, many, most, positional = field
    if path is None or nested is None:
        try:
            return decoder.decode(text)
        except msgspec.ValidationError as e:
            path = refused_at(e)
    if many:
        try:
            items = _ITEMS.decode(text)
        except msgspec.ValidationError:
            return _MISS
        if nested is None:  # a list of values: whole (its first ``most``) or not at all
            if most is None or len(items) <= most:
                return _MISS  # refused whole above
            try:
                return decoder.decode(b"[" + b",".join(map(bytes, items[:most])) + b"]")
            except msgspec.ValidationError as e:
                _refused(e)
                return _MISS
        if most is not None and len(items) > most:
            items = items[:most]
        at = path[0] if path else None
        kept = []
        for position, item in enumerate(items):
            read = _read_json(
                nested,
                item,
                {"index": position} if positional else None,
                path[1:] if position == at and path is not None else None,
            )
            if read is not None:
                kept.append(read)
        return kept
    if nested is not None:
        try:
            fields = _FIELDS.decode(text)
        except msgspec.ValidationError:
            return _MISS
        read = _read_fields(nested, fields, None, path)
        return _MISS if read is None else read
    return _MISS


# A field's reading: its declared type, and for a (list of) nested object(s) the schema of one
# (a Struct class or a bounded TypedDict), whether it is a list, and the list's max_length.
_Field = tuple[object, object | None, bool, int | None]
_PLANS: dict[object, dict[str, _Field]] = {}


def _plan(schema: object) -> dict[str, _Field]:
    known = _PLANS.get(schema)
    if known is None:
        info = msgspec.inspect.type_info(schema)
        assert isinstance(info, msgspec.inspect.StructType | msgspec.inspect.TypedDictType)
        declared = (
            {f.encode_name: f.type for f in msgspec.structs.fields(info.cls)}
            if isinstance(info, msgspec.inspect.StructType)
            else get_type_hints(schema, include_extras=True)
        )
        known = {}
        for field in info.fields:
            kind = field.type
            options = kind.types if isinstance(kind, msgspec.inspect.UnionType) else (kind,)
            nested: object | None = None
            many = False
            most: int | None = None
            for option in options:
                if isinstance(option, msgspec.inspect.ListType | msgspec.inspect.VarTupleType):
                    many, most, option = True, option.max_length, option.item_type
                if isinstance(option, msgspec.inspect.StructType | msgspec.inspect.TypedDictType):
                    nested = option.cls
            known[field.encode_name] = (declared[field.encode_name], nested, many, most)
        _PLANS[schema] = known
    return known


def _lenient_value(field: _Field, v: object) -> object:
    declared, nested, many, most = field
    try:
        return msgspec.convert(v, declared)
    except msgspec.ValidationError:
        pass
    if many:
        if not isinstance(v, list):
            return _MISS
        items = v[:most] if most is not None else v
        if nested is None:  # a list of values: whole or not at all
            try:
                return msgspec.convert(items, declared)
            except msgspec.ValidationError:
                return _MISS
        positional = isinstance(nested, type) and "index" in getattr(
            nested, "__struct_fields__", ()
        )
        kept = []
        for position, item in enumerate(items):
            read = _read(nested, item, {"index": position} if positional else None)
            if read is not None:
                kept.append(read)
        return kept
    if nested is not None:
        read = _read(nested, v, None)
        return _MISS if read is None else read
    return _MISS


# -- a TypedDict as msgspec checks it --------------------------------------------------------------
_BOUNDED: dict[object, object] = {}
_UNIONS = (Union, types.UnionType)


def _bounded_typeddict(schema: object) -> object:
    """``schema`` (a TypedDict) with every ``int`` an ``Int64`` and every ``float`` a
    ``Finite``, nested TypedDicts too (made once per schema)."""
    known = _BOUNDED.get(schema)
    if known is None:
        if not (isinstance(schema, type) and typing.is_typeddict(schema)):
            raise TypeError(f"{schema!r} is not a TypedDict")
        required: frozenset[str] = getattr(schema, "__required_keys__", frozenset())
        fields = {key: _bounded(declared) for key, declared in get_type_hints(schema).items()}
        made: Any = TypedDict(schema.__name__, fields, total=False)  # type: ignore[misc]
        # which keys are required, as the schema says (typing.Required is Python 3.11+)
        made.__required_keys__ = frozenset(required)
        made.__optional_keys__ = frozenset(fields) - required
        try:
            msgspec.inspect.type_info(made)
        except TypeError as e:
            raise TypeError(f"gpuctl.core.wire cannot check {schema.__name__}: {e}") from None
        known = _BOUNDED[schema] = made
    return known


def _bounded(declared: object) -> object:
    if declared is int:
        return Int64
    if declared is float:
        return Finite
    if declared in (str, bool, type(None), None, Any):
        return declared
    if declared is object:
        return Any
    if isinstance(declared, type) and typing.is_typeddict(declared):
        return _bounded_typeddict(declared)
    origin = get_origin(declared)
    args = get_args(declared)
    if origin is Literal:
        return declared
    if origin in _UNIONS:
        return Union[tuple(_bounded(a) for a in args)]  # noqa: UP007 (built from a tuple)
    if origin is list:
        return list[_bounded(args[0]) if args else Any]  # type: ignore[misc]
    if origin in (dict, Mapping):
        if args and args[0] is not str:
            raise TypeError(f"JSON object keys are strings, not {args[0]!r}")
        return dict[str, _bounded(args[1]) if len(args) > 1 else Any]  # type: ignore[misc]
    raise TypeError(f"gpuctl.core.wire cannot check a field of type {declared!r}")
