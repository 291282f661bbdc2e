"""Readers for Kafka's primitive types: ``(buf, pos) -> (value, new_pos)``.

They raise ``DecodeStop`` on bad bytes (short buffer, hostile length, bad
UTF-8); the schema-driven decoder turns that into an Issue with the field path,
so nothing escapes the decoder.  Every length is checked against what remains
before anything is sliced or allocated.
"""

from __future__ import annotations

import base64
import struct

from kwinspect.model import plural

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_F64 = struct.Struct(">d")


class DecodeStop(Exception):  # noqa: N818 - a control-flow signal, not an error type users see
    """Decoding cannot continue at `offset`; `path` is filled in while unwinding."""

    __slots__ = ("offset", "reason", "path", "partial", "has_partial")

    def __init__(self, offset: int, reason: str):
        super().__init__(reason)
        self.offset = offset
        self.reason = reason
        self.path: list[str] = []  # innermost first
        self.partial = None
        self.has_partial = False


def _fixed(st: struct.Struct, name: str):
    size = st.size
    unpack = st.unpack_from

    def read(buf, pos):
        if pos + size > len(buf):
            raise DecodeStop(pos, f"{name} needs {plural(size, 'byte')}, {max(len(buf) - pos, 0)} left")
        return unpack(buf, pos)[0], pos + size

    read.__name__ = f"read_{name}"
    return read


read_int8 = _fixed(_I8, "int8")
read_int16 = _fixed(_I16, "int16")
read_uint16 = _fixed(_U16, "uint16")
read_int32 = _fixed(_I32, "int32")
read_uint32 = _fixed(_U32, "uint32")
read_int64 = _fixed(_I64, "int64")
read_float64 = _fixed(_F64, "float64")


def read_bool(buf, pos):
    if pos >= len(buf):
        raise DecodeStop(pos, "bool needs 1 byte, 0 left")
    return buf[pos] != 0, pos + 1


def read_uvarint(buf, pos, max_bytes: int = 5):
    """Unsigned LEB128 varint (compact lengths, tags): at most 5 bytes for 32 bits."""
    result = 0
    shift = 0
    end = len(buf)
    start = pos
    while True:
        if pos >= end:
            raise DecodeStop(start, "varint runs past the end of the data")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if pos - start >= max_bytes:
            raise DecodeStop(start, f"varint longer than {max_bytes} bytes")


def read_varint(buf, pos):
    """Zig-zag signed varint (record fields), 32 bits."""
    raw, pos = read_uvarint(buf, pos, 5)
    return (raw >> 1) ^ -(raw & 1), pos


def read_varlong(buf, pos):
    """Zig-zag signed varint, 64 bits."""
    raw, pos = read_uvarint(buf, pos, 10)
    return (raw >> 1) ^ -(raw & 1), pos


def read_uuid(buf, pos):
    """16 bytes, rendered as Kafka prints a Uuid: URL-safe base64 without padding."""
    if pos + 16 > len(buf):
        raise DecodeStop(pos, f"uuid needs 16 bytes, {max(len(buf) - pos, 0)} left")
    return uuid_to_str(bytes(buf[pos : pos + 16])), pos + 16


def uuid_to_str(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _take(buf, pos, n, what, start):
    """The n bytes at pos; a bad length is reported at `start`, the length prefix."""
    if n < 0:
        raise DecodeStop(start, f"negative {what} length {n}")
    end = pos + n
    if end > len(buf):
        raise DecodeStop(start, f"{what} length {n} exceeds the {plural(len(buf) - pos, 'byte')} left")
    return bytes(buf[pos:end]), end


def _utf8(raw: bytes, pos: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DecodeStop(pos, f"string is not valid UTF-8 ({exc.reason})") from None


# Strings and bytes come in four shapes: int16/int32 length (classic) or
# uvarint length+1 (compact), each nullable (-1 / 0 means null) or not.


def read_string(buf, pos, nullable=False):
    n, p = read_int16(buf, pos)
    if n == -1 and nullable:
        return None, p
    raw, p = _take(buf, p, n, "string", pos)
    return _utf8(raw, pos), p


def read_compact_string(buf, pos, nullable=False):
    n, p = read_uvarint(buf, pos)
    if n == 0:
        if nullable:
            return None, p
        raise DecodeStop(pos, "null in a non-nullable compact string")
    raw, p = _take(buf, p, n - 1, "string", pos)
    return _utf8(raw, pos), p


def read_bytes(buf, pos, nullable=False):
    n, p = read_int32(buf, pos)
    if n == -1 and nullable:
        return None, p
    return _take(buf, p, n, "bytes", pos)


def read_compact_bytes(buf, pos, nullable=False):
    n, p = read_uvarint(buf, pos)
    if n == 0:
        if nullable:
            return None, p
        raise DecodeStop(pos, "null in non-nullable compact bytes")
    return _take(buf, p, n - 1, "bytes", pos)


def read_array_length(buf, pos, compact: bool, nullable: bool, min_element_size: int):
    """Element count of an array, or None for a null array.

    The count is checked against the bytes left (each element takes at least
    `min_element_size` bytes) so a hostile 2^31 count never drives a loop or
    an allocation.
    """
    if compact:
        n, p = read_uvarint(buf, pos)
        if n == 0:
            if nullable:
                return None, p
            raise DecodeStop(pos, "null in a non-nullable compact array")
        n -= 1
    else:
        n, p = read_int32(buf, pos)
        if n == -1 and nullable:
            return None, p
        if n < 0:
            raise DecodeStop(pos, f"negative array length {n}")
    if n * max(min_element_size, 1) > len(buf) - p:
        raise DecodeStop(pos, f"array of {n} elements cannot fit in the {len(buf) - p} bytes left")
    return n, p


FIXED_SIZES = {
    "bool": 1, "int8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4,
    "int64": 8, "float64": 8, "uuid": 16,
}

PRIMITIVE_READERS = {
    "bool": read_bool, "int8": read_int8, "int16": read_int16, "uint16": read_uint16,
    "int32": read_int32, "uint32": read_uint32, "int64": read_int64,
    "float64": read_float64, "uuid": read_uuid,
}
