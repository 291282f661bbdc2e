"""Rewriting the keys, values and header values of a record set, everything else kept.

``rewrite_record_set(raw, rewrite) -> RewrittenRecords`` walks a RECORDS field
(v2 batches and legacy v0/v1 message sets, mixed as protocol/records.py reads
them) and calls ``rewrite(kind, data)`` for every record key (``"key"``), value
(``"value"``) and header value (``"header"``); None (null) is passed too, so
the caller can count it, and what it returns replaces the data.  Then every
length is recomputed, a compressed batch is compressed again with the same
codec (protocol/codecs.compress), and the checksums are computed again:
CRC-32C for v2 batches, CRC-32 for legacy messages.  A checksum that was wrong
in the original is written wrong again (inverted), so the result reads as the
original did.

Kept as they were: offsets, offset deltas, timestamps and their deltas,
attributes, producer ids, epochs and sequences, header keys, record counts,
and control batches (transaction markers carry no user data).

What cannot be rewritten raises ``RewriteError`` (corrupt records, a failed
decompression, a codec this build cannot write): the caller must not copy such
a field through.  A cut-off last entry (a fetch response filled to its byte
limit) is dropped and its size reported in ``dropped_tail_bytes``; clients
ignore it anyway.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from kwinspect.protocol.checksums import crc32, crc32c
from kwinspect.protocol.codecs import DEFAULT_LIMITS, Limits, compress, decompress
from kwinspect.protocol.encode import write_varint
from kwinspect.protocol.primitives import DecodeStop, read_varint, read_varlong

__all__ = ["RewriteError", "RewrittenRecords", "Rewrite", "rewrite_record_set"]

# rewrite(kind, data) -> new data; kind is "key", "value" or "header"
Rewrite = Callable[[str, bytes | None], bytes | None]

_ENTRY_HEAD = struct.Struct(">qi")
LOG_OVERHEAD = 12
V2_HEADER_SIZE = 61
_V2_AFTER_CRC = 21  # CRC-32C covers attributes (entry byte 21) to the end
_LEGACY_MIN = {0: 14, 1: 22}
_CONTROL = 0x20


class RewriteError(ValueError):
    """A record set that cannot be rewritten (and so must not be copied through)."""


@dataclass
class RewrittenRecords:
    data: bytes
    batches: int = 0
    records: int = 0
    dropped_tail_bytes: int = 0


def rewrite_record_set(raw: bytes, rewrite: Rewrite, limits: Limits = DEFAULT_LIMITS) -> RewrittenRecords:
    out = bytearray()
    result = RewrittenRecords(b"")
    pos, n = 0, len(raw)
    while pos < n:
        if n - pos < LOG_OVERHEAD + 5:
            result.dropped_tail_bytes = n - pos
            break
        _offset, size = _ENTRY_HEAD.unpack_from(raw, pos)
        if size < 0 or pos + LOG_OVERHEAD + size > n:
            result.dropped_tail_bytes = n - pos
            break
        end = pos + LOG_OVERHEAD + size
        magic = raw[pos + 16]
        if magic == 2:
            out += _rewrite_v2(raw, pos, end, rewrite, limits, result)
        elif magic in (0, 1):
            out += _rewrite_legacy(raw, pos, end, rewrite, limits, result, 0)
        else:
            raise RewriteError(f"unknown magic {magic} at byte {pos}")
        result.batches += 1
        pos = end
    result.data = bytes(out)
    return result


# --------------------------------------------------------------------------- v2 batches


def _rewrite_v2(raw: bytes, pos: int, end: int, rewrite: Rewrite, limits: Limits,
                result: RewrittenRecords) -> bytes:
    if end - pos < V2_HEADER_SIZE:
        raise RewriteError(f"v2 batch of {end - pos} bytes at byte {pos} is shorter than its header")
    entry = raw[pos:end]
    (crc,) = struct.unpack_from(">I", entry, 17)
    crc_was_ok = crc32c(entry[_V2_AFTER_CRC:]) == crc
    (attributes,) = struct.unpack_from(">h", entry, 21)
    (count,) = struct.unpack_from(">i", entry, 57)
    if attributes & _CONTROL:
        result.records += max(count, 0)
        return entry  # markers and KRaft control records: no user data
    codec = attributes & 0x07
    payload = entry[V2_HEADER_SIZE:]
    if codec:
        plain, problem = decompress(codec, payload, limits)
        if problem is not None:
            raise RewriteError(f"batch at byte {pos}: {problem.message}")
    else:
        plain = payload
    records = _rewrite_v2_records(plain, count, rewrite)
    result.records += count
    body = compress(codec, records, like=payload) if codec else records
    head = bytearray(entry[:V2_HEADER_SIZE])
    struct.pack_into(">i", head, 8, V2_HEADER_SIZE - LOG_OVERHEAD + len(body))
    new = head + body
    new_crc = crc32c(bytes(new[_V2_AFTER_CRC:]))
    struct.pack_into(">I", new, 17, new_crc if crc_was_ok else new_crc ^ 0xFFFFFFFF)
    return bytes(new)


def _take(data: bytes, pos: int, n: int, end: int, what: str) -> tuple[bytes | None, int]:
    if n == -1:
        return None, pos
    if n < 0 or pos + n > end:
        raise RewriteError(f"{what} length {n} does not fit the record")
    return data[pos:pos + n], pos + n


def _put(data: bytes | None, out: bytearray) -> None:
    if data is None:
        write_varint(-1, out)
    else:
        write_varint(len(data), out)
        out += data


def _rewrite_v2_records(data: bytes, count: int, rewrite: Rewrite) -> bytes:
    out = bytearray()
    pos, n = 0, len(data)
    try:
        for i in range(count):
            length, pos = read_varint(data, pos)
            end = pos + length
            if length < 1 or end > n:
                raise RewriteError(f"record {i}: length {length} does not fit the batch")
            # attributes, timestamp delta, offset delta: kept byte for byte
            body_start = pos
            _ts, p = read_varlong(data, pos + 1)
            _od, p = read_varint(data, p)
            record = bytearray(data[body_start:p])
            klen, p = read_varint(data, p)
            key, p = _take(data, p, klen, end, "key")
            vlen, p = read_varint(data, p)
            value, p = _take(data, p, vlen, end, "value")
            _put(rewrite("key", key), record)
            _put(rewrite("value", value), record)
            headers, p = read_varint(data, p)
            if headers < 0:
                raise RewriteError(f"record {i}: {headers} headers")
            write_varint(headers, record)
            for _ in range(headers):
                hklen, p = read_varint(data, p)
                hkey, p = _take(data, p, hklen, end, "header key")
                if hkey is None:
                    raise RewriteError(f"record {i}: a null header key")
                _put(hkey, record)
                hvlen, p = read_varint(data, p)
                hvalue, p = _take(data, p, hvlen, end, "header value")
                _put(rewrite("header", hvalue), record)
            if p != end:
                raise RewriteError(f"record {i}: {end - p} bytes after its headers")
            write_varint(len(record), out)
            out += record
            pos = end
    except DecodeStop as stop:
        raise RewriteError(f"records: {stop.reason}") from None
    if pos != n:
        raise RewriteError(f"{n - pos} bytes after the batch's {count} records")
    return bytes(out)


# --------------------------------------------------------------------------- legacy messages


def _legacy_bytes(data: bytes, p: int, end: int, what: str) -> tuple[bytes | None, int]:
    if end - p < 4:
        raise RewriteError(f"legacy message: truncated {what} length")
    (n,) = struct.unpack_from(">i", data, p)
    return _take(data, p + 4, n, end, what)


def _legacy_put(data: bytes | None, out: bytearray) -> None:
    if data is None:
        out += struct.pack(">i", -1)
    else:
        out += struct.pack(">i", len(data)) + data


def _rewrite_legacy(raw: bytes, pos: int, end: int, rewrite: Rewrite, limits: Limits,
                    result: RewrittenRecords, depth: int) -> bytes:
    offset, size = _ENTRY_HEAD.unpack_from(raw, pos)
    p = pos + LOG_OVERHEAD
    magic, attributes = raw[p + 4], raw[p + 5]
    if size < _LEGACY_MIN[magic]:
        raise RewriteError(f"message size {size} too small for magic {magic}")
    (crc,) = struct.unpack_from(">I", raw, p)
    crc_was_ok = crc32(raw[p + 4:end]) == crc
    fixed_end = p + 6 + (8 if magic == 1 else 0)  # magic, attributes[, timestamp]
    key, q = _legacy_bytes(raw, fixed_end, end, "key")
    value, q = _legacy_bytes(raw, q, end, "value")
    if q != end:
        raise RewriteError(f"{end - q} bytes after a legacy message")
    codec = attributes & 0x07
    if codec:
        if depth >= limits.max_legacy_depth:
            raise RewriteError(f"legacy message nested deeper than {depth} compressed levels")
        inner, problem = decompress(codec, value or b"", limits)
        if problem is not None:
            raise RewriteError(f"legacy wrapper at offset {offset}: {problem.message}")
        rewritten = bytearray()
        ipos = 0
        while ipos < len(inner):
            if len(inner) - ipos < LOG_OVERHEAD + 6:
                raise RewriteError("stray bytes inside a legacy wrapper")
            isize = _ENTRY_HEAD.unpack_from(inner, ipos)[1]
            iend = ipos + LOG_OVERHEAD + isize
            if isize < 6 or iend > len(inner) or inner[ipos + 16] > 1:
                raise RewriteError("a bad message inside a legacy wrapper")
            rewritten += _rewrite_legacy(inner, ipos, iend, rewrite, limits, result, depth + 1)
            ipos = iend
        new_key = None if key is None else rewrite("key", key)  # wrappers' keys are null in practice
        new_value = compress(codec, bytes(rewritten), like=value or b"")
    else:
        new_key, new_value = rewrite("key", key), rewrite("value", value)
        result.records += 1
    body = bytearray(raw[p + 4:fixed_end])
    _legacy_put(new_key, body)
    _legacy_put(new_value, body)
    new_crc = crc32(bytes(body))
    message = struct.pack(">I", new_crc if crc_was_ok else new_crc ^ 0xFFFFFFFF) + body
    return _ENTRY_HEAD.pack(offset, len(message)) + message
