"""How the schema tables lay out a message in one version: the rules both decoders share.

The generated tables in ``schema/`` describe every field of every version.  This
module holds what decode.py (the reference decoder and the public decode API) and
fastdecode.py (the generated fast path) both need to read them the same way:
finding the definition that supplies a version, the header versions, which fields
a version has and how they are encoded, the fewest bytes a struct can take (which
bounds array counts), the values of absent tagged fields, the per-message element
limit, the per-thread notes, and the reader closures ``(buf, pos) -> (value, pos)``
compiled from a field list.  Those readers are the reference decoder itself; the
fast path also falls back to them for tagged fields.

Readers never raise on bad bytes except ``DecodeStop``; each enclosing struct or
array attaches what it had decoded so far and its own path element while the
signal unwinds, and decode.py turns it into an Issue with the byte offset and
field path.
"""

from __future__ import annotations

import importlib
import struct
import threading
from collections.abc import Callable
from typing import Any

from kwinspect.model import DECODE_ERROR, LIMIT_EXCEEDED, SEVERITY_WARNING, Issue, plural
from kwinspect.protocol import primitives as p
from kwinspect.protocol.primitives import DecodeStop
from kwinspect.protocol.schema.api_keys import ApiKey
from kwinspect.protocol.schema.index import MODULES
from kwinspect.protocol.schema.structs import STRUCTS

Reader = Callable[[Any, int], tuple[Any, int]]

API_VERSIONS_KEY = int(ApiKey.API_VERSIONS)
CONTROLLED_SHUTDOWN_KEY = int(ApiKey.CONTROLLED_SHUTDOWN)
UNSUPPORTED_VERSION_CODE = 35

# Non-fatal findings made deep inside readers (e.g. a tagged field whose size
# disagrees with its content) are collected in ``thread_state.notes`` (a list, or
# None when nobody listens) for the current decode call; ``thread_state.elements_left``
# is the element budget of the message being decoded (see MAX_ELEMENTS_PER_MESSAGE).
thread_state = threading.local()

# Decoded objects cost ~45x the bytes of a crafted message of tiny array elements (an
# OffsetFetch of 8M topics: 48 MB on the wire, 2.2 GB decoded), so what a message may
# build is bounded, not only what its lengths claim: past this many array elements in
# one message decoding stops with a limit_exceeded issue (the rest stays undecoded,
# the message keeps its size). The fast decoder counts the same and leaves such a
# message to the reference.
MAX_ELEMENTS_PER_MESSAGE = 1_000_000


class ElementLimit(DecodeStop):
    """The message holds more array elements than MAX_ELEMENTS_PER_MESSAGE."""

    kind = LIMIT_EXCEEDED


def _spend(n: int, pos: int) -> None:
    left = getattr(thread_state, "elements_left", MAX_ELEMENTS_PER_MESSAGE) - n
    if left < 0:
        raise ElementLimit(pos, f"more than {MAX_ELEMENTS_PER_MESSAGE:,} array elements in one message: "
                                "decoding stopped here (a limit against crafted input; the rest is not decoded)")
    thread_state.elements_left = left


def _note(issue: Issue) -> None:
    notes = getattr(thread_state, "notes", None)
    if notes is not None:
        notes.append(issue)


def in_range(rng, version: int) -> bool:
    """A table's version range (lo, hi), or None for "never", holds `version`."""
    return rng is not None and rng[0] <= version <= rng[1]


# ---------------------------------------------------------------------------
# Finding the definition that supplies a version
# ---------------------------------------------------------------------------

_modules: dict[int, Any] = {}


def api_module(api_key: int):
    """The schema module of an api key (imported on first use), None for an unknown key."""
    mod = _modules.get(api_key)
    if mod is None and api_key in MODULES:
        mod = importlib.import_module(f"kwinspect.protocol.schema.{MODULES[api_key]}")
        _modules[api_key] = mod
    return mod


def find_definition(defs, version: int):
    """The definition that supplies `version`, else the nearest one (and its nearest version)."""
    best = None
    for d in defs:
        for lo, hi in d[1]:
            if lo <= version <= hi:
                return d, version
            near = lo if version < lo else hi
            if best is None or abs(near - version) < abs(best[1] - version):
                best = (d, near)
    return best if best else (None, None)


def body_schema(api_key: int, version: int, is_request: bool):
    """(definition, version to decode with) or (None, None) for an unknown api key."""
    mod = api_module(api_key)
    if mod is None:
        return None, None
    return find_definition(mod.REQUEST if is_request else mod.RESPONSE, version)


def is_flexible(api_key: int, version: int, is_request: bool = True) -> bool:
    definition, _ = body_schema(api_key, version, is_request)
    return definition is not None and in_range(definition[2], version)


def request_header_version(api_key: int, api_version: int) -> int:
    if api_key == CONTROLLED_SHUTDOWN_KEY and api_version == 0:
        return 0  # the one request that predates client ids
    return 2 if is_flexible(api_key, api_version, True) else 1


def response_header_version(api_key: int, api_version: int) -> int:
    if api_key == API_VERSIONS_KEY:
        return 0  # so a client can read it whatever version it asked for
    return 1 if is_flexible(api_key, api_version, False) else 0


# ---------------------------------------------------------------------------
# Sizes and defaults
# ---------------------------------------------------------------------------

# Arrays of fixed-size numbers (replica lists, partition ids...) are read with one
# struct.unpack_from: the array length has already been checked to fit n elements.
FIXED_ARRAY_CODES = {"int8": "b", "int16": "h", "uint16": "H", "int32": "i", "uint32": "I",
                     "int64": "q", "float64": "d"}


def min_size(fields, version: int, flexible: bool) -> int:
    """Fewest bytes one struct can take in this version (bounds array counts)."""
    size = 1 if flexible else 0
    for _name, ftype, versions, nullable_v, _tag, tagged, flex_override, _d, children in fields:
        if not in_range(versions or (0, 32767), version) or (flexible and in_range(tagged, version)):
            continue
        compact = flexible and (flex_override is None or in_range(flex_override, version))
        if ftype in p.FIXED_SIZES:
            size += p.FIXED_SIZES[ftype]
        elif ftype == "string":
            size += 1 if compact else 2
        elif ftype == "struct":  # a null nullable struct is just its int8 marker
            size += 1 if in_range(nullable_v, version) else min_size(children, version, flexible)
        else:  # bytes, records, arrays
            size += 1 if compact else 4
    return size


def default_value(ftype: str, default, children, version: int, flexible: bool, nullable: bool = False):
    """The value Kafka assumes for a tagged field that is absent."""
    if default is not None:
        return default
    if nullable:
        # The tables write both "default": "null" and "no default" as None.  Every
        # nullable tagged field upstream either declares "null" (FetchRequest
        # ClusterId) or is a nullable struct, whose default is null too.
        return None
    if ftype in ("int8", "int16", "uint16", "int32", "uint32", "int64"):
        return 0
    if ftype == "float64":
        return 0.0
    if ftype == "bool":
        return False
    if ftype == "string":
        return ""
    if ftype == "uuid":
        return p.uuid_to_str(bytes(16))
    if ftype == "struct":
        return struct_defaults(children, version, flexible)
    if ftype.startswith("[]"):
        return []
    return None  # bytes, records


def struct_defaults(fields, version: int, flexible: bool) -> dict:
    out = {}
    for name, ftype, versions, nullable_v, _tag, _tv, _fo, default, children in fields:
        if in_range(versions or (0, 32767), version):
            out[name] = default_value(ftype, default, children, version, flexible, in_range(nullable_v, version))
    return out


def copy_default(value):
    """A fresh copy of a default (each absent tagged field gets its own dicts and lists)."""
    if isinstance(value, dict):
        return {k: copy_default(v) for k, v in value.items()}
    if isinstance(value, list):
        return []
    return value


# ---------------------------------------------------------------------------
# Record sets are decoded by protocol/records.py (lazily); fall back to bytes
# when that module is not available.
# ---------------------------------------------------------------------------


def records_parser():
    try:
        from kwinspect.protocol.records import parse_record_set
    except ImportError:  # pragma: no cover - only while records.py is absent
        return lambda data: data
    return parse_record_set


# ---------------------------------------------------------------------------
# Compiling field lists into readers
# ---------------------------------------------------------------------------


def _string_reader(compact: bool, nullable: bool) -> Reader:
    read = p.read_compact_string if compact else p.read_string
    if nullable:
        return lambda buf, pos: read(buf, pos, True)
    return read


def _bytes_reader(compact: bool, nullable: bool) -> Reader:
    read = p.read_compact_bytes if compact else p.read_bytes
    if nullable:
        return lambda buf, pos: read(buf, pos, True)
    return read


def _records_reader(compact: bool, nullable: bool) -> Reader:
    read_raw = _bytes_reader(compact, nullable)
    parse = records_parser()

    def read(buf, pos):
        raw, pos = read_raw(buf, pos)
        return (None if raw is None else parse(raw)), pos

    return read


def _array_reader(elem: Reader, compact: bool, nullable: bool, min_size: int) -> Reader:
    read_len = p.read_array_length

    def read(buf, pos):
        n, pos = read_len(buf, pos, compact, nullable, min_size)
        if n is None:
            return None, pos
        _spend(n, pos)
        items = []
        append = items.append
        i = 0
        try:
            for i in range(n):  # noqa: B007 - i is read in the handler
                value, pos = elem(buf, pos)
                append(value)
        except DecodeStop as stop:
            if stop.has_partial:
                append(stop.partial)
            stop.path.append(f"[{i}]")
            stop.partial = items
            stop.has_partial = True
            raise
        return items, pos

    return read


def _fixed_array_reader(code: str, size: int, compact: bool, nullable: bool) -> Reader:
    read_len = p.read_array_length
    unpack_from = struct.unpack_from

    def read(buf, pos):
        n, pos = read_len(buf, pos, compact, nullable, size)
        if n is None:
            return None, pos
        _spend(n, pos)
        return list(unpack_from(f">{n}{code}", buf, pos)), pos + n * size

    return read


def field_reader(ftype, nullable, compact, children, version, flexible) -> Reader:
    """The reader of one field's value (also what the fast path reads tagged fields with)."""
    if ftype in p.PRIMITIVE_READERS:
        return p.PRIMITIVE_READERS[ftype]
    if ftype == "string":
        return _string_reader(compact, nullable)
    if ftype == "bytes":
        return _bytes_reader(compact, nullable)
    if ftype == "records":
        return _records_reader(compact, nullable)
    if ftype == "struct":
        return compile_struct(children, version, flexible, nullable=nullable)
    if ftype == "[]struct":
        elem = compile_struct(children, version, flexible)
        return _array_reader(elem, compact, nullable, min_size(children, version, flexible))
    if ftype.startswith("[]"):
        inner = ftype[2:]
        if inner in FIXED_ARRAY_CODES:
            return _fixed_array_reader(FIXED_ARRAY_CODES[inner], p.FIXED_SIZES[inner], compact, nullable)
        elem = field_reader(inner, False, compact, None, version, flexible)
        size = p.FIXED_SIZES.get(inner, 1 if compact else 2)
        return _array_reader(elem, compact, nullable, size)
    raise ValueError(f"unknown field type {ftype!r} in the schema tables")


def compile_struct(fields, version: int, flexible: bool, nullable: bool = False) -> Reader:
    """A reader for one struct (or a whole message body) at one version."""
    regular: list[tuple[str, Reader]] = []
    tagged: dict[int, tuple[str, Reader]] = {}
    tag_defaults: list[tuple[str, Any]] = []
    for name, ftype, versions, nullable_v, tag, tagged_v, flex_override, default, children in fields:
        if not in_range(versions or (0, 32767), version):
            continue
        compact = flexible and (flex_override is None or in_range(flex_override, version))
        reader = field_reader(ftype, in_range(nullable_v, version), compact, children, version, flexible)
        if flexible and tag is not None and in_range(tagged_v, version):
            tagged[tag] = (name, reader)
            tag_defaults.append((name, default_value(ftype, default, children, version, flexible,
                                                     in_range(nullable_v, version))))
        else:
            regular.append((name, reader))
    regular_t = tuple(regular)
    read_i8 = p.read_int8

    def read(buf, pos):
        if nullable:  # a nullable struct starts with an int8 presence marker
            marker, pos = read_i8(buf, pos)
            if marker < 0:
                return None, pos
        d: dict[str, Any] = {}
        name = None
        try:
            for name, rd in regular_t:
                d[name], pos = rd(buf, pos)
            if flexible:
                name = "_tagged_fields"
                pos = _read_tagged_fields(buf, pos, d, tagged)
                for tname, tdefault in tag_defaults:
                    if tname not in d:
                        d[tname] = copy_default(tdefault)
        except DecodeStop as stop:
            if stop.has_partial:
                d[name] = stop.partial
            stop.path.append(name)
            stop.partial = d
            stop.has_partial = True
            raise
        return d, pos

    return read


def _read_tagged_fields(buf, pos, d, tagged) -> int:
    start = pos
    count, pos = p.read_uvarint(buf, pos)
    if count > len(buf) - pos:
        raise DecodeStop(start, f"{plural(count, 'tagged field')} cannot fit in the {plural(len(buf) - pos, 'byte')} left")
    unknown = None
    for _ in range(count):
        tag_pos = pos
        tag, pos = p.read_uvarint(buf, pos)
        size, pos = p.read_uvarint(buf, pos)
        end = pos + size
        if end > len(buf):
            raise DecodeStop(tag_pos, f"tagged field {tag} of {size} bytes exceeds the {len(buf) - pos} bytes left")
        entry = tagged.get(tag)
        if entry is not None:
            name, rd = entry
            try:
                value, used = rd(memoryview(buf)[:end], pos)
            except DecodeStop as stop:
                used, value = -1, None
                _note(Issue(DECODE_ERROR, f"tagged field {name} (tag {tag}): {stop.reason}",
                            offset=stop.offset, path=name, severity=SEVERITY_WARNING))
            if used == end:
                d[name] = value
                pos = end
                continue
            if used != -1:
                _note(Issue(DECODE_ERROR, f"tagged field {name} (tag {tag}) declared {size} bytes "
                            f"but its value took {used - pos}", offset=tag_pos, path=name,
                            severity=SEVERITY_WARNING))
        if unknown is None:
            unknown = d.setdefault("_unknown_tags", {})
        unknown[tag] = bytes(buf[pos:end])
        pos = end
    return pos


__all__ = [
    "API_VERSIONS_KEY", "CONTROLLED_SHUTDOWN_KEY", "UNSUPPORTED_VERSION_CODE", "STRUCTS",
    "MAX_ELEMENTS_PER_MESSAGE", "ElementLimit", "thread_state", "in_range", "api_module", "find_definition",
    "body_schema", "is_flexible", "request_header_version", "response_header_version", "FIXED_ARRAY_CODES",
    "min_size", "default_value", "struct_defaults", "copy_default", "records_parser", "field_reader",
    "compile_struct", "Reader",
]
