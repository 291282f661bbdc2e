"""Encoding Kafka requests and responses: the inverse of the schema-driven decoder.

``encode_request(msg) -> bytes`` and ``encode_response(msg) -> bytes`` turn a
decoded ``Message`` (header and body dicts as ``decode_request`` /
``decode_response`` give them) back into a frame without its 4-byte size
prefix.  For every frame that decoded cleanly, encoding the decoded Message
gives the original bytes back (tests hold every capture frame and the kio
encoders to that), so a tool can change a few values in a body and send the
rest through unchanged (``kwinspect sanitize``).

Writers are compiled from the same tables, with the same rules (protocol/layout.py),
as the reference readers, and cached per (api key, version, direction):

- tagged fields are written when their value differs from the default Kafka
  assumes for an absent one (Kafka's own serializers do the same), in tag
  order, with the unknown tags the decoder kept (``_unknown_tags``) merged in;
- a RECORDS field takes a ``RecordSet`` (its ``raw`` bytes), bytes, or None;
- a uuid is the string Kafka prints (URL-safe base64 without padding).

Encoding raises ``EncodeError`` for a value that does not fit its field (a
missing field, a string where an int belongs, an int out of range): unlike
decoding, its input comes from the program, not the wire.
"""

from __future__ import annotations

import base64
import struct
import threading
from collections.abc import Callable
from typing import Any

from kwinspect.model import Message
from kwinspect.protocol import primitives as p
from kwinspect.protocol.layout import (
    FIXED_ARRAY_CODES,
    STRUCTS,
    body_schema,
    default_value,
    field_reader,
    find_definition,
    in_range,
    request_header_version,
    response_header_version,
)
from kwinspect.protocol.primitives import DecodeStop

# write(value, out, shape): `shape` is what the original frame held where the value came
# from (see tag_shape), or None; it only decides which tagged fields are written.
Writer = Callable[[Any, bytearray, Any], None]

__all__ = ["EncodeError", "encode_request", "encode_response", "encode_body", "encode_struct",
           "write_uvarint", "write_varint", "uvarint_bytes"]


class EncodeError(ValueError):
    """A value does not fit the field it is encoded into; `path` says which field."""

    def __init__(self, message: str, path: list[str] | None = None):
        self.reason = message
        self.path = path or []
        super().__init__(message)

    def __str__(self) -> str:
        where = ".".join(reversed(self.path))
        return f"{where}: {self.reason}" if where else self.reason


# ---------------------------------------------------------------------------
# Primitives
# ---------------------------------------------------------------------------


def uvarint_bytes(n: int) -> bytes:
    if n < 0:
        raise EncodeError(f"unsigned varint of negative {n}")
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def write_uvarint(n: int, out: bytearray) -> None:
    out += uvarint_bytes(n)


def write_varint(n: int, out: bytearray) -> None:
    """Zig-zag signed varint (record fields), 32 or 64 bits."""
    write_uvarint((n << 1) ^ (n >> 63), out)


def _fixed_writer(code: str) -> Writer:
    packer = struct.Struct(">" + code)
    pack = packer.pack

    def write(value, out, shape=None):
        try:
            out += pack(value)
        except struct.error as exc:
            raise EncodeError(f"{value!r} does not fit {code}: {exc}") from None

    return write


def _write_bool(value, out, shape=None):
    out.append(1 if value else 0)


def uuid_bytes(value) -> bytes:
    if isinstance(value, (bytes, bytearray)) and len(value) == 16:
        return bytes(value)
    try:
        raw = base64.urlsafe_b64decode(str(value) + "=" * (-len(str(value)) % 4))
    except (ValueError, TypeError):
        raw = b""
    if len(raw) != 16:
        raise EncodeError(f"{value!r} is not a uuid (22 characters of URL-safe base64)")
    return raw


def _write_uuid(value, out, shape=None):
    out += uuid_bytes(value)


PRIMITIVE_WRITERS: dict[str, Writer] = {
    "bool": _write_bool, "int8": _fixed_writer("b"), "int16": _fixed_writer("h"),
    "uint16": _fixed_writer("H"), "int32": _fixed_writer("i"), "uint32": _fixed_writer("I"),
    "int64": _fixed_writer("q"), "float64": _fixed_writer("d"), "uuid": _write_uuid,
}
_I16 = struct.Struct(">h").pack
_I32 = struct.Struct(">i").pack


def _length_writer(compact: bool, nullable: bool, short: bool, what: str):
    """Writes a length (or null) in one of the four shapes strings, bytes and arrays use."""

    def write_len(n, out):
        if n is None:
            if not nullable:
                raise EncodeError(f"null in a non-nullable {what}")
            if compact:
                out.append(0)
            else:
                out += _I16(-1) if short else _I32(-1)
        elif compact:
            write_uvarint(n + 1, out)
        else:
            try:
                out += _I16(n) if short else _I32(n)
            except struct.error:
                raise EncodeError(f"{what} of {n} items is too long for its length field") from None

    return write_len


def _string_writer(compact: bool, nullable: bool) -> Writer:
    write_len = _length_writer(compact, nullable, True, "string")

    def write(value, out, shape=None):
        if value is None:
            write_len(None, out)
            return
        if not isinstance(value, str):
            raise EncodeError(f"{type(value).__name__} where a string belongs")
        raw = value.encode("utf-8")
        write_len(len(raw), out)
        out += raw

    return write


def _raw_bytes(value) -> bytes | None:
    if value is None or isinstance(value, (bytes, bytearray, memoryview)):
        return value
    raw = getattr(value, "raw", None)  # a RecordSet keeps the field's bytes
    if raw is None:
        raise EncodeError(f"{type(value).__name__} where bytes belong")
    return raw


def _bytes_writer(compact: bool, nullable: bool) -> Writer:
    write_len = _length_writer(compact, nullable, False, "bytes")

    def write(value, out, shape=None):
        raw = _raw_bytes(value)
        write_len(None if raw is None else len(raw), out)
        if raw is not None:
            out += raw

    return write


def _array_writer(elem: Writer, compact: bool, nullable: bool) -> Writer:
    write_len = _length_writer(compact, nullable, False, "array")

    def write(value, out, shape=None):
        if value is None:
            write_len(None, out)
            return
        write_len(len(value), out)
        shapes = shape if isinstance(shape, list) and len(shape) == len(value) else None
        for i, item in enumerate(value):
            try:
                elem(item, out, None if shapes is None else shapes[i])
            except EncodeError as exc:
                exc.path.append(f"[{i}]")
                raise

    return write


def field_writer(ftype, nullable, compact, children, version, flexible) -> Writer:
    """The writer of one field's value (the mirror of layout.field_reader)."""
    if ftype in PRIMITIVE_WRITERS:
        return PRIMITIVE_WRITERS[ftype]
    if ftype == "string":
        return _string_writer(compact, nullable)
    if ftype in ("bytes", "records"):
        return _bytes_writer(compact, nullable)
    if ftype == "struct":
        return compile_struct_writer(children, version, flexible, nullable=nullable)
    if ftype == "[]struct":
        return _array_writer(compile_struct_writer(children, version, flexible), compact, nullable)
    if ftype.startswith("[]"):
        inner = ftype[2:]
        if inner in FIXED_ARRAY_CODES:
            elem = _fixed_writer(FIXED_ARRAY_CODES[inner])
        else:
            elem = field_writer(inner, False, compact, None, version, flexible)
        return _array_writer(elem, compact, nullable)
    raise ValueError(f"unknown field type {ftype!r} in the schema tables")


_MISSING = object()


def compile_struct_writer(fields, version: int, flexible: bool, nullable: bool = False) -> Writer:
    """A writer for one struct (or a whole message body) at one version."""
    regular: list[tuple[str, Writer]] = []
    tagged: list[tuple[int, str, Writer, Any]] = []
    for name, ftype, versions, nullable_v, tag, tagged_v, flex_override, default, children in fields:
        if not in_range(versions or (0, 32767), version):
            continue
        compact = flexible and (flex_override is None or in_range(flex_override, version))
        is_nullable = in_range(nullable_v, version)
        writer = field_writer(ftype, is_nullable, compact, children, version, flexible)
        if flexible and tag is not None and in_range(tagged_v, version):
            tagged.append((tag, name, writer,
                           default_value(ftype, default, children, version, flexible, is_nullable)))
        else:
            regular.append((name, writer))
    regular_t = tuple(regular)
    tagged.sort(key=lambda t: t[0])
    tagged_t = tuple(tagged)

    def write(value, out, shape=None):
        if nullable:  # a nullable struct starts with an int8 presence marker
            if value is None:
                out.append(0xFF)
                return
            out.append(1)
        if not isinstance(value, dict):
            raise EncodeError(f"{type(value).__name__} where a struct belongs")
        if not isinstance(shape, dict):
            shape = None
        for name, wr in regular_t:
            item = value.get(name, _MISSING)
            if item is _MISSING:
                raise EncodeError("missing", [name])
            try:
                wr(item, out, None if shape is None else shape.get(name))
            except EncodeError as exc:
                exc.path.append(name)
                raise
        if flexible:
            _write_tagged_fields(value, tagged_t, out, shape)

    return write


def _write_tagged_fields(value: dict, tagged, out: bytearray, shape: dict | None) -> None:
    entries: dict[int, bytes] = dict(value.get("_unknown_tags") or {})
    present = shape.get(TAGS, ()) if shape is not None else ()
    for tag, name, wr, default in tagged:
        item = value.get(name, _MISSING)
        if item is _MISSING or (item == default and tag not in present):
            continue  # absent, as Kafka writes a tagged field at its default (some brokers write it anyway)
        buf = bytearray()
        try:
            wr(item, buf, None if shape is None else shape.get(name))
        except EncodeError as exc:
            exc.path.append(name)
            raise
        entries[tag] = bytes(buf)
    write_uvarint(len(entries), out)
    for tag in sorted(entries):
        raw = entries[tag]
        write_uvarint(tag, out)
        write_uvarint(len(raw), out)
        out += raw


# ---------------------------------------------------------------------------
# Which tagged fields the original frame held
# ---------------------------------------------------------------------------
# The decoder fills absent tagged fields with their defaults, so a decoded body
# does not say whether a field at its default was on the wire; Kafka never writes
# one, but some brokers do (tansu writes every tagged field of ApiVersions and
# Fetch responses).  A shape, read from the original frame, is a tree parallel
# to the body: for each struct a dict holding the tags present (under TAGS) and
# the shapes of its struct and struct-array fields; encoding with it writes
# those tags even at their defaults, so the frame comes back byte for byte.

TAGS = "_tags"


def _shape_reader(ftype, nullable, compact, children, version, flexible):
    if ftype == "struct":
        return compile_shape_reader(children, version, flexible, nullable=nullable)
    if ftype == "[]struct":
        elem = compile_shape_reader(children, version, flexible)
        read_len = p.read_array_length

        def read(buf, pos):
            n, pos = read_len(buf, pos, compact, nullable, 1)
            if n is None:
                return None, pos
            items = []
            for _ in range(n):
                item, pos = elem(buf, pos)
                items.append(item)
            return items, pos

        return read
    reader = field_reader("bytes" if ftype == "records" else ftype, nullable, compact, children, version, flexible)

    def skip(buf, pos):
        return None, reader(buf, pos)[1]

    return skip


def compile_shape_reader(fields, version: int, flexible: bool, nullable: bool = False):
    """A reader of one struct's shape (which tags it holds, recursively); raises DecodeStop."""
    regular, tagged = [], {}
    for name, ftype, versions, nullable_v, tag, tagged_v, flex_override, _default, children in fields:
        if not in_range(versions or (0, 32767), version):
            continue
        compact = flexible and (flex_override is None or in_range(flex_override, version))
        reader = _shape_reader(ftype, in_range(nullable_v, version), compact, children, version, flexible)
        nested = ftype in ("struct", "[]struct")
        if flexible and tag is not None and in_range(tagged_v, version):
            tagged[tag] = (name, reader, nested)
        else:
            regular.append((name, reader, nested))

    def read(buf, pos):
        if nullable:
            marker, pos = p.read_int8(buf, pos)
            if marker < 0:
                return None, pos
        shape: dict[str, Any] = {}
        for name, rd, nested in regular:
            sub, pos = rd(buf, pos)
            if nested:
                shape[name] = sub
        if flexible:
            present = set()
            count, pos = p.read_uvarint(buf, pos)
            for _ in range(count):
                tag, pos = p.read_uvarint(buf, pos)
                size, pos = p.read_uvarint(buf, pos)
                present.add(tag)
                entry = tagged.get(tag)
                if entry is not None and entry[2]:
                    try:
                        shape[entry[0]] = entry[1](memoryview(buf)[:pos + size], pos)[0]
                    except DecodeStop:
                        pass  # the decoder kept it as an unknown tag's bytes
                pos += size
            shape[TAGS] = frozenset(present)
        return shape, pos

    return read


def _frame_shape(frame, header_name: str, header_version: int, definition, version: int):
    """The body's shape read from `frame` (header + body), None if the frame does not read."""
    key = ("shape", header_name, header_version, id(definition), version)
    readers = _compiled.get(key)
    if readers is None:
        hdefs = STRUCTS[header_name]
        hdef, _ = find_definition(hdefs, header_version)
        readers = _compiled[key] = (
            compile_shape_reader(hdef[3], header_version, in_range(hdef[2], header_version)),
            compile_shape_reader(definition[3], version, in_range(definition[2], version)))
    try:
        _, pos = readers[0](frame, 0)
        return readers[1](frame, pos)[0]
    except DecodeStop:
        return None


# ---------------------------------------------------------------------------
# Compiled writers, cached per version
# ---------------------------------------------------------------------------

_compiled: dict[tuple, Writer] = {}
_lock = threading.Lock()


def _body_writer(api_key: int, version: int, is_request: bool) -> Writer:
    key = (api_key, version, is_request)
    writer = _compiled.get(key)
    if writer is None:
        definition, use_version = body_schema(api_key, version, is_request)
        if definition is None or use_version != version:
            side = "request" if is_request else "response"
            raise EncodeError(f"api key {api_key} v{version} {side} is not in the schema tables")
        with _lock:
            writer = _compiled[key] = compile_struct_writer(definition[3], version, in_range(definition[2], version))
    return writer


def _struct_writer(name: str, version: int) -> Writer:
    key = ("struct", name, version)
    writer = _compiled.get(key)
    if writer is None:
        defs = STRUCTS.get(name)
        if defs is None:
            raise EncodeError(f"no schema named {name}")
        definition, use_version = find_definition(defs, version)
        if use_version != version:
            raise EncodeError(f"{name} v{version} is not in the schema tables")
        with _lock:
            writer = _compiled[key] = compile_struct_writer(definition[3], version, in_range(definition[2], version))
    return writer


def encode_struct(name: str, version: int, value: dict) -> bytes:
    """Encode a named non-API structure (the inverse of decode_struct)."""
    out = bytearray()
    _struct_writer(name, version)(value, out, None)
    return bytes(out)


def encode_body(api_key: int, version: int, is_request: bool, body: dict, shape=None) -> bytes:
    out = bytearray()
    _body_writer(api_key, version, is_request)(body, out, shape)
    return bytes(out)


def encode_request(msg: Message, like: bytes | None = None) -> bytes:
    """A request frame (header + body, without the size prefix) from a decoded Message.

    `like`: the frame the Message was decoded from; tagged fields it held are
    written even at their defaults (see TAGS above).
    """
    if msg.api_key is None or msg.api_version is None or msg.body is None:
        raise EncodeError("the message has no decoded body to encode")
    out = bytearray()
    header = dict(msg.header)
    header.setdefault("request_api_key", msg.api_key)
    header.setdefault("request_api_version", msg.api_version)
    hv = request_header_version(msg.api_key, msg.api_version)
    _struct_writer("RequestHeader", hv)(header, out)
    shape = None
    if like is not None:
        definition, _ = body_schema(msg.api_key, msg.api_version, True)
        if definition is not None:
            shape = _frame_shape(like, "RequestHeader", hv, definition, msg.api_version)
    _body_writer(msg.api_key, msg.api_version, True)(msg.body, out, shape)
    return bytes(out)


def encode_response(msg: Message, like: bytes | None = None) -> bytes:
    """A response frame (header + body, without the size prefix) from a decoded Message.

    An ApiVersions rejection decoded in another layout than the version asked
    for (``decoded_version``) is encoded in that layout, as it came.  `like`: as
    for encode_request.
    """
    if msg.api_key is None or msg.api_version is None or msg.body is None:
        raise EncodeError("the message has no decoded body to encode")
    out = bytearray()
    hv = response_header_version(msg.api_key, msg.api_version)
    _struct_writer("ResponseHeader", hv)(msg.header, out)
    version = msg.decoded_version if msg.decoded_version is not None else msg.api_version
    shape = None
    if like is not None:
        definition, _ = body_schema(msg.api_key, version, False)
        if definition is not None:
            shape = _frame_shape(like, "ResponseHeader", hv, definition, version)
    _body_writer(msg.api_key, version, False)(msg.body, out, shape)
    return bytes(out)
