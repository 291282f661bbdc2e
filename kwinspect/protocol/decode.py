"""Schema-driven decoding of Kafka requests and responses.

The generated tables in ``schema/`` describe every field of every version.  For
each (api key, version, direction) they are compiled once into a tree of small
reader closures ``(buf, pos) -> (value, pos)`` and cached, so the hot path does
no schema lookups.  Decoding never raises on bad bytes: a reader raises
``DecodeStop``; each enclosing struct or array attaches what it had decoded so
far and its own path element while the signal unwinds, and the entry point
turns it into an Issue with the byte offset and field path.
"""

from __future__ import annotations

import importlib
import struct
import threading
from collections.abc import Callable
from typing import Any

from kwinspect.model import (
    DECODE_ERROR,
    LIMIT_EXCEEDED,
    SEVERITY_ERROR,
    SEVERITY_INFO,
    SEVERITY_WARNING,
    TRAILING_BYTES,
    UNKNOWN_API_KEY,
    UNSUPPORTED_VERSION,
    Issue,
    Message,
    plural,
)
from kwinspect.protocol import primitives as p
from kwinspect.protocol.primitives import DecodeStop
from kwinspect.protocol.schema.api_keys import ApiKey
from kwinspect.protocol.schema.index import APIS, MODULES
from kwinspect.protocol.schema.structs import STRUCTS

Reader = Callable[[Any, int], tuple[Any, int]]

API_VERSIONS_KEY = int(ApiKey.API_VERSIONS)
_MAX_API_KEY = max(APIS)
CONTROLLED_SHUTDOWN_KEY = int(ApiKey.CONTROLLED_SHUTDOWN)
UNSUPPORTED_VERSION_CODE = 35
INTERNAL_ERROR = "internal_error"  # a bug in kwinspect, never bad input

# Non-fatal findings made deep inside readers (e.g. a tagged field whose size
# disagrees with its content) are collected here for the current decode call.
_local = threading.local()

# Decoded objects cost ~45x the bytes of a crafted message of tiny array elements (an
# OffsetFetch of 8M topics: 48 MB on the wire, 2.2 GB decoded), so what a message may
# build is bounded, not only what its lengths claim: past this many array elements in
# one message decoding stops with a limit_exceeded issue (the rest stays undecoded,
# the message keeps its size). The fast decoder counts the same and leaves such a
# message to this one.
MAX_ELEMENTS_PER_MESSAGE = 1_000_000


class ElementLimit(DecodeStop):
    """The message holds more array elements than MAX_ELEMENTS_PER_MESSAGE."""

    kind = LIMIT_EXCEEDED


def _spend(n: int, pos: int) -> None:
    left = getattr(_local, "elements_left", MAX_ELEMENTS_PER_MESSAGE) - n
    if left < 0:
        raise ElementLimit(pos, f"more than {MAX_ELEMENTS_PER_MESSAGE:,} array elements in one message: "
                                "decoding stopped here (a limit against crafted input; the rest is not decoded)")
    _local.elements_left = left


def _note(issue: Issue) -> None:
    notes = getattr(_local, "notes", None)
    if notes is not None:
        notes.append(issue)


def _in(rng, version: int) -> bool:
    return rng is not None and rng[0] <= version <= rng[1]


# ---------------------------------------------------------------------------
# Record sets are decoded by protocol/records.py (lazily); fall back to bytes
# when that module is not available.
# ---------------------------------------------------------------------------


def _records_parser():
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
    parse = _records_parser()

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


# Arrays of fixed-size numbers (replica lists, partition ids...) are read with one
# struct.unpack_from: read_array_length has already checked that n elements fit.
_FIXED_ARRAY_CODES = {"int8": "b", "int16": "h", "uint16": "H", "int32": "i", "uint32": "I",
                      "int64": "q", "float64": "d"}


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


def _min_size(fields, version: int, flexible: bool) -> int:
    """Fewest bytes one struct can take in this version (bounds array counts)."""
    size = 1 if flexible else 0
    for _name, ftype, versions, nullable_v, _tag, tagged, flex_override, _d, children in fields:
        if not _in(versions or (0, 32767), version) or (flexible and _in(tagged, version)):
            continue
        compact = flexible and (flex_override is None or _in(flex_override, version))
        if ftype in p.FIXED_SIZES:
            size += p.FIXED_SIZES[ftype]
        elif ftype == "string":
            size += 1 if compact else 2
        elif ftype == "struct":  # a null nullable struct is just its int8 marker
            size += 1 if _in(nullable_v, version) else _min_size(children, version, flexible)
        else:  # bytes, records, arrays
            size += 1 if compact else 4
    return size


def _field_reader(ftype, nullable, compact, children, version, flexible) -> Reader:
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
        return _array_reader(elem, compact, nullable, _min_size(children, version, flexible))
    if ftype.startswith("[]"):
        inner = ftype[2:]
        if inner in _FIXED_ARRAY_CODES:
            return _fixed_array_reader(_FIXED_ARRAY_CODES[inner], p.FIXED_SIZES[inner], compact, nullable)
        elem = _field_reader(inner, False, compact, None, version, flexible)
        min_size = p.FIXED_SIZES.get(inner, 1 if compact else 2)
        return _array_reader(elem, compact, nullable, min_size)
    raise ValueError(f"unknown field type {ftype!r} in the schema tables")


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
        if _in(versions or (0, 32767), version):
            out[name] = default_value(ftype, default, children, version, flexible, _in(nullable_v, version))
    return out


def compile_struct(fields, version: int, flexible: bool, nullable: bool = False) -> Reader:
    """A reader for one struct (or a whole message body) at one version."""
    regular: list[tuple[str, Reader]] = []
    tagged: dict[int, tuple[str, Reader]] = {}
    tag_defaults: list[tuple[str, Any]] = []
    for name, ftype, versions, nullable_v, tag, tagged_v, flex_override, default, children in fields:
        if not _in(versions or (0, 32767), version):
            continue
        compact = flexible and (flex_override is None or _in(flex_override, version))
        reader = _field_reader(ftype, _in(nullable_v, version), compact, children, version, flexible)
        if flexible and tag is not None and _in(tagged_v, version):
            tagged[tag] = (name, reader)
            tag_defaults.append((name, default_value(ftype, default, children, version, flexible,
                                                     _in(nullable_v, version))))
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
                        d[tname] = _copy_default(tdefault)
        except DecodeStop as stop:
            if stop.has_partial:
                d[name] = stop.partial
            stop.path.append(name)
            stop.partial = d
            stop.has_partial = True
            raise
        return d, pos

    return read


def _copy_default(value):
    if isinstance(value, dict):
        return {k: _copy_default(v) for k, v in value.items()}
    if isinstance(value, list):
        return []
    return value


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


# ---------------------------------------------------------------------------
# Schema lookup
# ---------------------------------------------------------------------------

_modules: dict[int, Any] = {}
_compiled: dict[tuple, Reader] = {}
_lock = threading.Lock()


def _api_module(api_key: int):
    mod = _modules.get(api_key)
    if mod is None and api_key in MODULES:
        mod = importlib.import_module(f"kwinspect.protocol.schema.{MODULES[api_key]}")
        _modules[api_key] = mod
    return mod


def _find_definition(defs, version: int):
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
    mod = _api_module(api_key)
    if mod is None:
        return None, None
    return _find_definition(mod.REQUEST if is_request else mod.RESPONSE, version)


def is_flexible(api_key: int, version: int, is_request: bool = True) -> bool:
    definition, _ = body_schema(api_key, version, is_request)
    return definition is not None and _in(definition[2], version)


def _body_reader(api_key: int, version: int, is_request: bool):
    """(compiled reader, version it decodes) for a body; (None, None) for unknown keys."""
    key = (api_key, version, is_request)
    cached = _compiled.get(key)
    if cached is None:
        definition, use_version = body_schema(api_key, version, is_request)
        if definition is None:
            return None, None
        # Compile once per version actually decoded with, and remember only real
        # versions: garbage input carries arbitrary version numbers, which must
        # neither recompile readers nor grow the cache without bound.
        real = (api_key, use_version, is_request)
        cached = _compiled.get(real)
        if cached is None:
            with _lock:
                reader = compile_struct(definition[3], use_version, _in(definition[2], use_version))
                cached = _compiled[real] = (reader, use_version)
    return cached


def _struct_reader(name: str, version: int):
    key = ("struct", name, version)
    cached = _compiled.get(key)
    if cached is None:
        defs = STRUCTS.get(name)
        if defs is None:
            return None, None
        definition, use_version = _find_definition(defs, version)
        real = ("struct", name, use_version)  # see _body_reader: real versions only
        cached = _compiled.get(real)
        if cached is None:
            reader = compile_struct(definition[3], use_version, _in(definition[2], use_version))
            cached = _compiled[real] = (reader, use_version)
    return cached


def request_header_version(api_key: int, api_version: int) -> int:
    if api_key == CONTROLLED_SHUTDOWN_KEY and api_version == 0:
        return 0  # the one request that predates client ids
    return 2 if is_flexible(api_key, api_version, True) else 1


def response_header_version(api_key: int, api_version: int) -> int:
    if api_key == API_VERSIONS_KEY:
        return 0  # so a client can read it whatever version it asked for
    return 1 if is_flexible(api_key, api_version, False) else 0


# ---------------------------------------------------------------------------
# Fast path: generated straight-line decoders (fastdecode.py) for clean frames.
# They are cached like the readers, for real versions only; False marks a
# version whose decoder could not be generated (the reference is used).
# ---------------------------------------------------------------------------

_fast_requests: dict[bytes, Any] = {}  # frame[:4] (api key + version bytes) -> decoder
_fast_responses: dict[tuple[int, int], Any] = {}
_fast_structs: dict[tuple[str, int], Any] = {}
_REQUEST_KEY = struct.Struct(">hh")


def _generate(build, *args):
    from kwinspect.protocol import decode as ref  # this module: the table helpers
    from kwinspect.protocol import fastdecode

    try:
        return getattr(fastdecode, build)(ref, *args)
    except Exception:  # noqa: BLE001 - a table the generator cannot express: reference only
        return False


def _or_false(make, *args):
    """A generated decoder, or False where none can be made (the reference then decides)."""
    try:
        return make(*args)
    except Exception:  # noqa: BLE001 - e.g. a version that is not an int: the reference reports it
        return False


def _new_fast_request_decoder(frame: bytes):
    if len(frame) < 4:
        return False
    api_key, api_version = _REQUEST_KEY.unpack_from(frame, 0)
    if api_key not in APIS:
        return False
    definition, use_version = body_schema(api_key, api_version, True)
    if definition is None or use_version != api_version:
        return False  # not cached: garbage versions must not grow the cache
    fast = _generate("build", True, api_key, api_version, request_header_version(api_key, api_version),
                     definition)
    _fast_requests[bytes(frame[:4])] = fast
    return fast


def _new_fast_response_decoder(api_key: int, api_version: int):
    if api_key not in APIS:
        return False
    definition, use_version = body_schema(api_key, api_version, False)
    if definition is None or use_version != api_version:
        return False
    fast = _generate("build", False, api_key, api_version, response_header_version(api_key, api_version),
                     definition)
    _fast_responses[(api_key, api_version)] = fast
    return fast


def _new_fast_struct_decoder(name: str, version: int):
    defs = STRUCTS.get(name)
    if defs is None:
        return False
    definition, use_version = _find_definition(defs, version)
    if use_version != version:
        return False
    fast = _generate("build_struct", definition[3], version, _in(definition[2], version))
    _fast_structs[(name, version)] = fast
    return fast


def clear_caches() -> None:
    """Forget every compiled reader and generated decoder (benchmarks of the first decode)."""
    _compiled.clear()
    _fast_requests.clear()
    _fast_responses.clear()
    _fast_structs.clear()


# ---------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------


def _stop_issue(stop: DecodeStop, prefix: str) -> Issue:
    parts = [x for x in reversed(stop.path) if x is not None]
    path = ""
    for part in parts:
        path += part if part.startswith("[") or not path else "." + part
    if prefix and path:
        path = f"{prefix}.{path}"
    elif prefix:
        path = prefix
    return Issue(getattr(stop, "kind", DECODE_ERROR), stop.reason, offset=stop.offset, path=path or None)


def _run(reader: Reader, buf, pos: int, prefix: str, issues: list[Issue]):
    """Run a reader; on DecodeStop return the partial value and record the issue."""
    _local.elements_left = MAX_ELEMENTS_PER_MESSAGE  # every top-level read has its own budget (ElementLimit)
    try:
        return reader(buf, pos)
    except DecodeStop as stop:
        issues.append(_stop_issue(stop, prefix))
        return (stop.partial if stop.has_partial else None), None
    finally:  # readers called outside a _run (the fast decoder's tagged fields) start full too
        _local.elements_left = MAX_ELEMENTS_PER_MESSAGE


def decode_struct(name: str, version: int, data: bytes) -> tuple[dict | None, list[Issue]]:
    """Decode a named non-API structure (ConsumerProtocolSubscription, internal-topic records...)."""
    if type(data) is bytes:
        fast = _fast_structs.get((name, version))
        if fast is None:
            fast = _or_false(_new_fast_struct_decoder, name, version)
        if fast:
            try:
                value = fast(data)
            except Exception:  # noqa: BLE001 - anything unusual: the reference decides
                value = None
            if value is not None:
                return value, []
    return decode_struct_reference(name, version, data)


def decode_struct_reference(name: str, version: int, data: bytes) -> tuple[dict | None, list[Issue]]:
    """decode_struct with the reference (closure) decoder only."""
    issues: list[Issue] = []
    reader, use_version = _struct_reader(name, version)
    if reader is None:
        return None, [Issue(DECODE_ERROR, f"no schema named {name}")]
    _local.notes = issues
    try:
        value, end = _run(reader, data, 0, "", issues)
    except Exception as exc:  # noqa: BLE001 - last line of defence, reported as a bug
        return None, [Issue(INTERNAL_ERROR, f"decoder bug: {exc!r}")]
    finally:
        _local.notes = None
    if use_version != version:
        issues.append(Issue(UNSUPPORTED_VERSION, f"{name} v{version} unknown; decoded as v{use_version}",
                            severity=SEVERITY_WARNING))
    if end is not None and end < len(data):
        issues.append(Issue(TRAILING_BYTES, f"{plural(len(data) - end, 'byte')} after {name}",
                            offset=end, severity=SEVERITY_WARNING))
    return value, issues


def decode_request(frame: bytes) -> Message:
    """Decode one request (header + body, without the 4-byte size prefix)."""
    if type(frame) is bytes:
        fast = _fast_requests.get(frame[:4])  # keyed by the raw api key + version
        if fast is None:
            fast = _or_false(_new_fast_request_decoder, frame)
        if fast:
            try:
                msg = fast(frame)
            except Exception:  # noqa: BLE001 - anything unusual: the reference decides
                msg = None
            if msg is not None:
                return msg
    return decode_request_reference(frame)


def decode_request_reference(frame: bytes) -> Message:
    """decode_request with the reference (closure) decoder only; gives the exact issues."""
    issues: list[Issue] = []
    _local.notes = issues
    try:
        return _decode_request(frame, issues)
    except Exception as exc:  # noqa: BLE001 - last line of defence, reported as a bug
        issues.append(Issue(INTERNAL_ERROR, f"decoder bug: {exc!r}"))
        return Message(True, None, None, {}, None, issues, raw_body=bytes(frame), size=len(frame))
    finally:
        _local.notes = None


def _decode_request(frame, issues) -> Message:
    size = len(frame)
    if size < 4:
        issues.append(Issue(DECODE_ERROR, f"request of {size} bytes is too short for a header",
                            offset=0, path="header"))
        return Message(True, None, None, {}, None, issues, raw_body=bytes(frame), size=size)
    api_key = p.read_int16(frame, 0)[0]
    api_version = p.read_int16(frame, 2)[0]
    known = api_key in APIS
    if known:
        hv = request_header_version(api_key, api_version)
    else:
        # Every API added since flexible versions exist (KIP-482, Kafka 2.4) is
        # flexible from v0, so a key newer than our tables has header v2.
        hv = 2 if api_key > _MAX_API_KEY else 1
    header_reader, _ = _struct_reader("RequestHeader", hv)
    header, pos = _run(header_reader, frame, 0, "header", issues)
    header = header or {}
    if pos is None:
        return Message(True, api_key, api_version, header, None, issues, size=size)
    if not known:
        issues.append(Issue(UNKNOWN_API_KEY, f"api key {api_key} is not in the schema tables; body kept as bytes",
                            offset=0, path="header.request_api_key", severity=SEVERITY_WARNING))
        return Message(True, api_key, api_version, header, None, issues, raw_body=bytes(frame[pos:]), size=size)
    return _decode_body(frame, pos, api_key, api_version, True, header, issues)


def decode_response(frame: bytes, api_key: int, api_version: int) -> Message:
    """Decode one response, given the api key and version of its request."""
    if type(frame) is bytes:
        fast = _fast_responses.get((api_key, api_version))
        if fast is None:
            fast = _or_false(_new_fast_response_decoder, api_key, api_version)
        if fast:
            try:
                msg = fast(frame, api_key, api_version)
            except Exception:  # noqa: BLE001 - anything unusual: the reference decides
                msg = None
            if msg is not None:
                return msg
    return decode_response_reference(frame, api_key, api_version)


def decode_response_reference(frame: bytes, api_key: int, api_version: int) -> Message:
    """decode_response with the reference (closure) decoder only; gives the exact issues."""
    issues: list[Issue] = []
    _local.notes = issues
    try:
        return _decode_response(frame, api_key, api_version, issues)
    except Exception as exc:  # noqa: BLE001 - last line of defence, reported as a bug
        issues.append(Issue(INTERNAL_ERROR, f"decoder bug: {exc!r}"))
        return Message(False, api_key, api_version, {}, None, issues, raw_body=bytes(frame), size=len(frame))
    finally:
        _local.notes = None


def decode_response_header(frame: bytes, flexible: bool = False) -> tuple[dict, int | None, list[Issue]]:
    """Just the response header (v1 when `flexible`), for responses whose request is unknown."""
    issues: list[Issue] = []
    reader, _ = _struct_reader("ResponseHeader", 1 if flexible else 0)
    header, pos = _run(reader, frame, 0, "header", issues)
    return header or {}, pos, issues


def _decode_response(frame, api_key, api_version, issues) -> Message:
    known = api_key in APIS
    # A key newer than our tables is flexible (see _decode_request): header v1.
    hv = response_header_version(api_key, api_version) if known else (1 if api_key > _MAX_API_KEY else 0)
    header_reader, _ = _struct_reader("ResponseHeader", hv)
    header, pos = _run(header_reader, frame, 0, "header", issues)
    header = header or {}
    if pos is None:
        return Message(False, api_key, api_version, header, None, issues, size=len(frame))
    if not known:
        issues.append(Issue(UNKNOWN_API_KEY, f"api key {api_key} is not in the schema tables; body kept as bytes",
                            offset=0, severity=SEVERITY_WARNING))
        return Message(False, api_key, api_version, header, None, issues, raw_body=bytes(frame[pos:]), size=len(frame))
    if (api_key == API_VERSIONS_KEY and api_version > 0 and len(frame) >= pos + 2
            and p.read_int16(frame, pos)[0] == UNSUPPORTED_VERSION_CODE):
        return _decode_api_versions_rejection(frame, pos, api_version, header, issues)
    return _decode_body(frame, pos, api_key, api_version, False, header, issues)


def _decode_api_versions_rejection(frame, pos, api_version, header, issues) -> Message:
    """UNSUPPORTED_VERSION to ApiVersions: brokers answer in the v0 layout so any client can read it.

    Some brokers (librdkafka's mock cluster among them) answer in another layout;
    then the layout of the version asked for is tried, and if neither fits, the
    v0 reading (which always yields the error code) is kept with a warning.
    """
    layouts = (0, api_version)
    attempts = []
    for version in layouts:
        trial_issues: list[Issue] = []
        msg = _decode_body(frame, pos, API_VERSIONS_KEY, version, False, header, trial_issues)
        if not trial_issues:
            issues.append(Issue(UNSUPPORTED_VERSION,
                                f"broker rejected ApiVersions v{api_version} and answered in the v{version} layout",
                                offset=pos, severity=SEVERITY_INFO))
            msg.issues = issues
            msg.api_version, msg.decoded_version = api_version, version
            return msg
        attempts.append((msg, trial_issues))
    msg, trial_issues = attempts[0]
    issues.append(Issue(UNSUPPORTED_VERSION,
                        f"broker rejected ApiVersions v{api_version} (error 35) with a body that fits neither "
                        f"the v0 layout brokers use nor v{api_version}: {trial_issues[0].message}",
                        offset=trial_issues[0].offset, path=trial_issues[0].path, severity=SEVERITY_WARNING))
    msg.issues = issues
    msg.api_version, msg.decoded_version = api_version, 0
    return msg


def _decode_body(frame, pos, api_key, api_version, is_request, header, issues) -> Message:
    reader, use_version = _body_reader(api_key, api_version, is_request)
    if use_version != api_version:
        lo, hi = APIS[api_key][1], APIS[api_key][2]
        issues.append(Issue(UNSUPPORTED_VERSION,
                            f"{APIS[api_key][0]} v{api_version} is outside the known range v{lo}-v{hi}; "
                            f"decoded best-effort as v{use_version}",
                            offset=2 if is_request else None, path="header", severity=SEVERITY_WARNING))
    body, end = _run(reader, frame, pos, "", issues)
    if end is not None and end < len(frame):
        if is_request and api_key == API_VERSIONS_KEY and api_version == 0 and frame[end:] == b"\0\0\0\0":
            issues.append(Issue(TRAILING_BYTES, "4 zero bytes after an ApiVersions v0 request "
                                "(librdkafka pads it so old brokers accept it)", offset=end, severity=SEVERITY_INFO))
        else:
            side = "request" if is_request else "response"
            issues.append(Issue(TRAILING_BYTES, f"{plural(len(frame) - end, 'byte')} after the "
                                f"{APIS[api_key][0]} v{api_version} {side} body",
                                offset=end, severity=SEVERITY_WARNING))
    msg = Message(is_request, api_key, api_version, header, body if body is not None else {}, issues,
                  size=len(frame), decoded_version=use_version)
    return msg


__all__ = [
    "decode_request", "decode_response", "decode_response_header", "decode_struct",
    "request_header_version", "response_header_version", "is_flexible", "body_schema",
    "SEVERITY_ERROR",
]
