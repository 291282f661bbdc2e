"""Kafka record sets: legacy message sets (magic 0/1) and record batches (v2).

``parse_record_set(data, limits=None) -> RecordSet`` reads every batch header
eagerly (cheap: fixed-size fields plus one CRC per batch) and decodes records
only on demand (``RecordSet.iter_records()``, ``RecordBatch.records()``),
decompressing at that point under the caps of ``codecs.Limits``.

Wire layouts (all integers big-endian; every entry of a record set starts with
``offset int64, size int32`` and has its magic byte at entry offset 16):

- v2 record batch: base_offset int64, batch_length int32, partition_leader_epoch
  int32, magic int8 (=2), crc uint32 (CRC-32C over attributes..end),
  attributes int16, last_offset_delta int32, base_timestamp int64,
  max_timestamp int64, producer_id int64, producer_epoch int16,
  base_sequence int32, record_count int32, then records (possibly compressed).
  Attributes: bits 0-2 codec, bit 3 timestamp type (log append time), bit 4
  transactional, bit 5 control, bit 6 delete horizon set.
  Record: length varint, attributes int8, timestamp_delta varlong,
  offset_delta varint, key_length varint + key, value_length varint + value,
  header_count varint, headers (key_length varint + key, value_length varint
  + value).  Varints are zigzag; length -1 means null.
- legacy message (magic 0/1): offset int64, message_size int32, crc uint32
  (CRC-32 over magic..end), magic int8, attributes int8, [timestamp int64 for
  magic 1], key bytes (int32 length, -1 null), value bytes.  A compressed
  message ("wrapper") carries a whole inner message set in its value.  For
  magic 1 the inner offsets are relative: absolute = wrapper offset - last
  inner relative offset + inner relative offset (Kafka's
  AbstractLegacyRecordBatch; when that base is negative, as in requests of
  producers that leave the wrapper offset at 0, inner offsets are used as
  written); magic 0 inner offsets are used as written.
  With log-append time on a magic 1 wrapper, inner timestamps are the
  wrapper's.

Error policy: never raises on bad bytes; every length is checked against what
remains before slicing; problems become ``Issue``s with byte offsets relative
to the start of the record set (plus ``origin``).  A last entry cut short (a
fetch response cut at max bytes) is ``partial_tail_bytes`` with an info-level
``partial_batch`` issue, not an error.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Callable, Iterator
from typing import Any

from kwinspect.model import (
    CRC_MISMATCH,
    DECODE_ERROR,
    LIMIT_EXCEEDED,
    PARTIAL_BATCH,
    SEVERITY_INFO,
    SEVERITY_WARNING,
    Issue,
    plural,
)
from kwinspect.protocol.checksums import crc32, crc32c
from kwinspect.protocol.codecs import DEFAULT_LIMITS, Limits, codec_name, decompress

__all__ = [
    "CONTROL_TYPES", "Record", "RecordBatch", "RecordSet", "parse_record_set", "render_bytes",
    "TIMESTAMP_CREATE", "TIMESTAMP_LOG_APPEND",
]

TIMESTAMP_CREATE = "create_time"
TIMESTAMP_LOG_APPEND = "log_append_time"

# org.apache.kafka.common.record.ControlRecordType
CONTROL_TYPES = {
    0: "ABORT",
    1: "COMMIT",
    2: "LEADER_CHANGE",
    3: "SNAPSHOT_HEADER",
    4: "SNAPSHOT_FOOTER",
    5: "KRAFT_VERSION",
    6: "KRAFT_VOTERS",
}

_V2_HEADER = struct.Struct(">qiiBIhiqqqhii")  # 61 bytes
V2_HEADER_SIZE = _V2_HEADER.size
_ENTRY_HEAD = struct.Struct(">qi")  # offset, size: the log overhead
LOG_OVERHEAD = 12
_LEGACY_MIN = {0: 14, 1: 22}  # message_size minimum: crc+magic+attr[+ts]+keylen+vallen

INT31 = 0x7FFFFFFF


class _Bad(Exception):
    """Internal: a malformed structure inside one record; never escapes."""


def render_bytes(data: bytes | None, mode: str = "auto") -> tuple[str | None, str | None]:
    """Render a key/value/header value for output: ``(text, encoding)``.

    ``auto``: UTF-8 text when the bytes decode strictly, else base64.
    ``utf8``: UTF-8 with undecodable bytes backslash-escaped.  ``hex``,
    ``base64``: as named.  ``None`` stays ``(None, None)``.
    """
    if data is None:
        return None, None
    if type(data) is not bytes:
        data = bytes(data)
    if mode == "auto":  # the common case first
        try:
            return data.decode("utf-8"), "utf8"
        except UnicodeDecodeError:
            return base64.b64encode(data).decode("ascii"), "base64"
    if mode == "hex":
        return data.hex(), "hex"
    if mode == "base64":
        return base64.b64encode(data).decode("ascii"), "base64"
    if mode == "utf8":
        return data.decode("utf-8", "backslashreplace"), "utf8"
    try:
        return data.decode("utf-8"), "utf8"
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii"), "base64"


# --------------------------------------------------------------------------- varints


def _varint(data: bytes, pos: int, end: int, max_bytes: int = 5) -> tuple[int, int]:
    """Zigzag varint (max_bytes 5) / varlong (10) at ``pos``; bounded by ``end``."""
    if pos < end:  # fast path: one byte
        b = data[pos]
        if b < 0x80:
            return (b >> 1) ^ -(b & 1), pos + 1
    result = 0
    shift = 0
    for _ in range(max_bytes):
        if pos >= end:
            raise _Bad("truncated varint")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
    raise _Bad("varint too long")


def _uvarint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    result = 0
    shift = 0
    for _ in range(5):
        if pos >= end:
            raise _Bad("truncated unsigned varint")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
    raise _Bad("unsigned varint too long")


# --------------------------------------------------------------------------- records


class Record:
    """One decoded record.

    ``offset`` is the offset as written in the batch (for produce requests the
    broker assigns the real one; see ``analyze.record_rows``).  ``offset_delta`` is
    the v2 offset delta, or for legacy messages the position of the message
    within its top-level entry.  ``timestamp`` is in milliseconds.
    """

    __slots__ = (
        "offset", "offset_delta", "timestamp", "timestamp_type", "key", "value", "headers",
        "sequence", "attributes", "magic", "control_type", "control", "crc", "crc_ok",
    )

    def __init__(
        self,
        offset: int | None,
        offset_delta: int,
        timestamp: int | None,
        timestamp_type: str | None,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes | None]] | None = None,
        sequence: int | None = None,
        attributes: int = 0,
        magic: int = 2,
        control_type: str | None = None,
        control: dict[str, Any] | None = None,
        crc: int | None = None,
        crc_ok: bool | None = None,
    ) -> None:
        self.offset = offset
        self.offset_delta = offset_delta
        self.timestamp = timestamp
        self.timestamp_type = timestamp_type
        self.key = key
        self.value = value
        self.headers = headers if headers is not None else []
        self.sequence = sequence
        self.attributes = attributes
        self.magic = magic
        self.control_type = control_type
        self.control = control
        self.crc = crc
        self.crc_ok = crc_ok

    def __repr__(self) -> str:
        return (
            f"Record(offset={self.offset}, timestamp={self.timestamp}, key={self.key!r}, "
            f"value={self.value!r}, headers={self.headers!r}, control_type={self.control_type})"
        )

    def to_json(self, values: str = "auto") -> dict[str, Any]:
        key, key_enc = render_bytes(self.key, values)
        value, value_enc = render_bytes(self.value, values)
        out: dict[str, Any] = {
            "offset": self.offset,
            "offset_delta": self.offset_delta,
            "timestamp": self.timestamp,
            "timestamp_type": self.timestamp_type,
            "key": key,
            "key_encoding": key_enc,
            "value": value,
            "value_encoding": value_enc,
            "headers": [_header_json(k, v, values) for k, v in self.headers],
        }
        if self.sequence is not None:
            out["sequence"] = self.sequence
        if self.control_type is not None:
            out["control_type"] = self.control_type
            out["control"] = self.control
        if self.crc is not None:
            out["crc"] = self.crc
            out["crc_ok"] = self.crc_ok
        return out


def _header_json(key: str, value: bytes | None, values: str) -> dict[str, Any]:
    text, enc = render_bytes(value, values)
    return {"key": key, "value": text, "value_encoding": enc}


# --------------------------------------------------------------------------- batches


class RecordBatch:
    """One entry of a record set: a v2 batch, or one legacy message (which,
    when compressed, wraps an inner message set).  Header fields are parsed
    at construction; ``records()`` decodes (and decompresses) on demand.

    Fields not carried by a format are ``None`` (e.g. ``producer_id`` for
    legacy messages, ``record_count`` for compressed legacy wrappers until
    decoded).
    """

    __slots__ = (
        "position", "size", "base_offset", "length", "partition_leader_epoch", "magic", "crc",
        "crc_ok", "attributes", "codec", "compression", "timestamp_type", "is_transactional",
        "is_control", "has_delete_horizon", "last_offset_delta", "base_timestamp",
        "max_timestamp", "producer_id", "producer_epoch", "base_sequence", "record_count",
        "issues", "buffer", "body_start", "end", "limits", "origin", "sink", "reported",
        "legacy_key", "batch_index",
    )

    def __init__(self) -> None:
        self.position = 0  # byte offset of the entry within the record set
        self.size = 0  # bytes of the entry including the 12-byte log overhead
        self.base_offset = 0
        self.length = 0  # batch_length / message_size as on the wire
        self.partition_leader_epoch: int | None = None
        self.magic = 2
        self.crc = 0
        self.crc_ok: bool | None = None
        self.attributes = 0
        self.codec = 0
        self.compression = "none"
        self.timestamp_type: str | None = None
        self.is_transactional = False
        self.is_control = False
        self.has_delete_horizon = False
        self.last_offset_delta: int | None = None
        self.base_timestamp: int | None = None
        self.max_timestamp: int | None = None
        self.producer_id: int | None = None
        self.producer_epoch: int | None = None
        self.base_sequence: int | None = None
        self.record_count: int | None = None
        self.issues: list[Issue] = []
        self.buffer = b""
        self.body_start = 0
        self.end = 0
        self.limits = DEFAULT_LIMITS
        self.origin = 0
        self.sink: list[Issue] | None = None
        self.reported = False
        self.legacy_key: bytes | None = None
        self.batch_index = 0

    def __repr__(self) -> str:
        return (
            f"RecordBatch(magic={self.magic}, base_offset={self.base_offset}, "
            f"records={self.record_count}, compression={self.compression}, crc_ok={self.crc_ok})"
        )

    @property
    def next_offset_span(self) -> int | None:
        """How many offsets this entry occupies (v2: last_offset_delta + 1)."""
        if self.last_offset_delta is None:
            return None
        return self.last_offset_delta + 1

    # -- decoding ------------------------------------------------------------

    def records(self) -> list[Record]:
        """Decode every record of this entry (decompressing if needed)."""
        return list(self.iter_records())

    def iter_records(self) -> Iterator[Record]:
        # not a generator itself: one generator per batch instead of two (the
        # records table makes one per produce request); each reports its
        # issues when it ends
        return self._v2_records() if self.magic == 2 else self._legacy_records()

    def _report(self, issues: list[Issue]) -> None:
        if self.reported or not issues:
            return
        self.reported = True
        self.issues.extend(issues)
        if self.sink is not None:
            self.sink.extend(issues)

    def report(self, issues: list[Issue], kind: str, msg: str, pos: int | None = None,
               severity: str = "error", path: str | None = None) -> None:
        at = self.origin + (self.position if pos is None else pos)
        issues.append(Issue(kind, msg, at, path or f"batch[{self.batch_index}]", severity))

    def _payload(self, issues: list[Issue]) -> bytes | None:
        """The (decompressed) records area; None on failure (issue added)."""
        raw = self.buffer[self.body_start:self.end]
        if self.codec == 0:
            return raw
        out, problem = decompress(self.codec, raw, self.limits)
        if problem is not None:
            self.report(issues, problem.kind, problem.message, self.body_start,
                        severity=problem.severity)
            return None
        return out

    def records_area(self) -> tuple[bytes, int, int] | None:
        """(data, start, end): where the records of a v2 batch are, decompressed when the
        batch is; None when decompressing fails (iter_records reports why). For decoders
        that read the records themselves (analyze/_crows.c)."""
        if self.magic != 2:
            return None
        if self.codec == 0:
            return (self.buffer, self.body_start, self.end) if type(self.buffer) is bytes else None
        out = self._payload([])  # a failure is reported when iter_records decodes it again
        return (out, 0, len(out)) if type(out) is bytes else None

    def _v2_records(self) -> Iterator[Record]:
        # The hot loop of `kwinspect records`: one-byte varints (the usual case
        # for lengths under 64 and small deltas) are decoded inline, longer ones
        # by _varint; every check and message is the one _varint/_v2_bytes make.
        issues: list[Issue] = []
        try:
            compressed = self.codec != 0
            data = self._payload(issues) if compressed else self.buffer
            if data is None:
                return
            base = 0 if compressed else self.body_start
            end = len(data) if compressed else self.end
            count = self.record_count or 0
            if count < 0:
                self.report(issues, DECODE_ERROR, f"negative record count {count}", self.position + 57)
                return
            base_ts = self.base_timestamp
            log_append = self.timestamp_type == TIMESTAMP_LOG_APPEND
            max_ts = self.max_timestamp
            tstype = self.timestamp_type
            base_offset = self.base_offset
            base_seq = self.base_sequence
            has_seq = base_seq is not None and base_seq >= 0
            is_control = self.is_control
            pos = base
            found = 0
            max_records = self.limits.max_records_per_batch
            while found < count and pos < end:
                if found >= max_records:
                    self.report(issues, LIMIT_EXCEEDED,
                                f"more than {max_records} records in one batch; the rest skipped")
                    return
                start = pos
                try:
                    b = data[pos]  # pos < end <= len(data)
                    if b < 0x80:
                        length = (b >> 1) ^ -(b & 1)
                        pos += 1
                    elif pos + 1 < end and (b2 := data[pos + 1]) < 0x80:  # two bytes
                        u = (b & 0x7F) | (b2 << 7)
                        length = (u >> 1) ^ -(u & 1)
                        pos += 2
                    else:
                        length, pos = _varint(data, pos, end)
                    if length < 0 or length > end - pos:
                        raise _Bad(f"record length {length} exceeds the {end - pos} bytes left")
                    rend = pos + length
                    if length < 1:
                        raise _Bad("empty record")
                    attrs = data[pos]
                    pos += 1
                    if pos < rend and (b := data[pos]) < 0x80:
                        ts_delta = (b >> 1) ^ -(b & 1)
                        pos += 1
                    else:
                        ts_delta, pos = _varint(data, pos, rend, 10)
                    if pos < rend and (b := data[pos]) < 0x80:
                        off_delta = (b >> 1) ^ -(b & 1)
                        pos += 1
                    else:
                        off_delta, pos = _varint(data, pos, rend)
                    if pos < rend and (b := data[pos]) < 0x80:
                        n = (b >> 1) ^ -(b & 1)
                        pos += 1
                    else:
                        n, pos = _varint(data, pos, rend)
                    if n < 0:
                        if n != -1:
                            raise _Bad(f"key length {n}")
                        key = None
                    elif n > rend - pos:
                        raise _Bad(f"key length {n} exceeds the {rend - pos} bytes left")
                    else:
                        key = data[pos:pos + n]
                        pos += n
                    if pos < rend and (b := data[pos]) < 0x80:
                        n = (b >> 1) ^ -(b & 1)
                        pos += 1
                    elif pos + 1 < rend and (b2 := data[pos + 1]) < 0x80:  # b is data[pos]
                        u = (b & 0x7F) | (b2 << 7)
                        n = (u >> 1) ^ -(u & 1)
                        pos += 2
                    else:
                        n, pos = _varint(data, pos, rend)
                    if n < 0:
                        if n != -1:
                            raise _Bad(f"value length {n}")
                        value = None
                    elif n > rend - pos:
                        raise _Bad(f"value length {n} exceeds the {rend - pos} bytes left")
                    else:
                        value = data[pos:pos + n]
                        pos += n
                    if pos < rend and (b := data[pos]) < 0x80:
                        nheaders = (b >> 1) ^ -(b & 1)
                        pos += 1
                    else:
                        nheaders, pos = _varint(data, pos, rend)
                    if nheaders < 0 or nheaders > (rend - pos) // 2:
                        raise _Bad(f"header count {nheaders} does not fit in {rend - pos} bytes")
                    headers: list[tuple[str, bytes | None]] = []
                    for _ in range(nheaders):
                        hk, pos = _v2_bytes(data, pos, rend, "header key")
                        if hk is None:
                            raise _Bad("null header key")
                        hv, pos = _v2_bytes(data, pos, rend, "header value")
                        headers.append((hk.decode("utf-8", "replace"), hv))
                    if pos != rend:
                        self.report(issues, DECODE_ERROR,
                                    f"record {found}: {rend - pos} unread bytes inside the record",
                                    None if compressed else pos, SEVERITY_WARNING)
                    pos = rend
                except _Bad as exc:
                    where = f" (decompressed byte {start})" if compressed else ""
                    self.report(issues, DECODE_ERROR, f"record {found}: {exc}{where}",
                                None if compressed else start,
                                path=f"batch[{self.batch_index}].records[{found}]")
                    return
                rec = Record(
                    base_offset + off_delta,
                    off_delta,
                    max_ts if log_append else (None if base_ts is None else base_ts + ts_delta),
                    tstype,
                    key,
                    value,
                    headers,
                    (base_seq + off_delta) & INT31 if has_seq else None,
                    attrs,
                    2,
                )
                if is_control:
                    rec.control_type, rec.control = _decode_control(key, value)
                found += 1
                yield rec
            if found < count:
                self.report(issues, DECODE_ERROR,
                            f"batch declares {count} records but only {found} are present",
                            None if compressed else pos)
            elif pos < end:
                self.report(issues, DECODE_ERROR,
                            f"{plural(end - pos, 'byte')} after the last of {plural(count, 'record')}",
                            None if compressed else pos, SEVERITY_WARNING)
        finally:
            self._report(issues)

    def _legacy_records(self) -> Iterator[Record]:
        issues: list[Issue] = []
        try:
            if self.codec == 0:
                key = self.legacy_key
                value_raw = self.buffer[self.body_start:self.end]
                yield Record(
                    offset=self.base_offset, offset_delta=0, timestamp=self.base_timestamp,
                    timestamp_type=self.timestamp_type, key=key,
                    value=None if self.body_start < 0 else value_raw,
                    magic=self.magic, attributes=self.attributes, crc=self.crc, crc_ok=self.crc_ok,
                )
                return
            inner = self._payload(issues)
            if inner is None:
                return
            yield from _legacy_inner(self, inner, issues, depth=1)
        finally:
            self._report(issues)


def _v2_bytes(data: bytes, pos: int, end: int, what: str) -> tuple[bytes | None, int]:
    n, pos = _varint(data, pos, end)
    if n < 0:
        if n != -1:
            raise _Bad(f"{what} length {n}")
        return None, pos
    if n > end - pos:
        raise _Bad(f"{what} length {n} exceeds the {plural(end - pos, 'byte')} left")
    return data[pos:pos + n], pos + n  # data is bytes: the slice is a copy already


def _legacy_inner(wrapper: RecordBatch, inner: bytes, issues: list[Issue],
                  depth: int) -> Iterator[Record]:
    """Records of the message set inside a compressed legacy wrapper.

    Two passes so memory stays flat: the first walks only the entry framing
    to find the last inner offset (needed for magic 1 relative offsets), the
    second parses and yields one message at a time.
    """
    n = len(inner)
    where = f"inside the wrapper at offset {wrapper.base_offset}"
    pos = 0
    last_off = None
    stop = n
    while pos < n:
        if n - pos < LOG_OVERHEAD:
            wrapper.report(issues, DECODE_ERROR,
                           f"{plural(n - pos, 'stray byte')} at decompressed byte {pos} {where}")
            stop = pos
            break
        off, size = _ENTRY_HEAD.unpack_from(inner, pos)
        if size < 6 or size > n - pos - LOG_OVERHEAD:
            wrapper.report(issues, DECODE_ERROR,
                           f"inner message size {size} invalid at decompressed byte {pos} {where}")
            stop = pos
            break
        last_off = off
        pos += LOG_OVERHEAD + size
    if last_off is None:
        return
    # magic 1: inner offsets are relative to the wrapper, whose offset is the
    # absolute offset of the last inner message.  Like Kafka's
    # AbstractLegacyRecordBatch, a negative base (a producer that left the
    # wrapper offset at 0) means the inner offsets are used as written.
    abs_base = wrapper.base_offset - last_off
    log_append = wrapper.timestamp_type == TIMESTAMP_LOG_APPEND
    max_records = wrapper.limits.max_records_per_batch
    pos = 0
    i = 0
    while pos < stop:
        size = _ENTRY_HEAD.unpack_from(inner, pos)[1]
        msg = _parse_legacy_message(inner, pos, size)
        if isinstance(msg, str):
            wrapper.report(issues, DECODE_ERROR, f"{msg} at decompressed byte {pos} {where}")
            return
        pos += LOG_OVERHEAD + size
        off, _size, crc, magic, attrs, ts, key, value, crc_ok = msg
        codec = attrs & 0x07
        if codec:
            if depth >= wrapper.limits.max_legacy_depth:
                wrapper.report(issues, DECODE_ERROR,
                               f"legacy message nested deeper than {depth} compressed levels {where}")
                continue
            sub, problem = decompress(codec, value or b"", wrapper.limits)
            if problem is not None:
                wrapper.report(issues, problem.kind, f"nested: {problem.message}")
                continue
            yield from _legacy_inner(wrapper, sub, issues, depth + 1)
            continue
        if i >= max_records:
            wrapper.report(issues, LIMIT_EXCEEDED,
                           f"more than {max_records} messages {where}; the rest skipped")
            return
        if magic >= 1 and wrapper.magic >= 1 and abs_base >= 0:
            abs_off = abs_base + off
        else:
            abs_off = off
        if not crc_ok:
            wrapper.report(issues, CRC_MISMATCH,
                           f"inner message {i}: CRC-32 mismatch (stored {crc:#010x}) {where}")
        if log_append and magic >= 1:
            ts = wrapper.base_timestamp
        tstype = None if magic == 0 else (
            TIMESTAMP_LOG_APPEND if (attrs & 0x08 or log_append) else TIMESTAMP_CREATE)
        yield Record(offset=abs_off, offset_delta=i, timestamp=ts, timestamp_type=tstype,
                     key=key, value=value, magic=magic, attributes=attrs, crc=crc, crc_ok=crc_ok)
        i += 1


def _parse_legacy_message(data: bytes, pos: int, size: int):
    """Parse one legacy message whose entry starts at ``pos`` (size already
    checked to fit).  Returns a tuple or an error string."""
    end = pos + LOG_OVERHEAD + size
    off, _ = _ENTRY_HEAD.unpack_from(data, pos)
    p = pos + LOG_OVERHEAD
    (crc,) = struct.unpack_from(">I", data, p)
    magic = data[p + 4]
    attrs = data[p + 5]
    if magic > 1:
        return f"unexpected magic {magic} in a legacy message set"
    if size < _LEGACY_MIN[magic]:
        return f"message size {size} too small for magic {magic}"
    p += 6
    ts = None
    if magic == 1:
        (ts,) = struct.unpack_from(">q", data, p)
        p += 8
    key, p = _legacy_bytes(data, p, end)
    if isinstance(key, str):
        return "key: " + key
    value, p = _legacy_bytes(data, p, end)
    if isinstance(value, str):
        return "value: " + value
    crc_ok = crc32(memoryview(data)[pos + LOG_OVERHEAD + 4:end]) == crc
    return (off, size, crc, magic, attrs, ts, key, value, crc_ok)


def _legacy_bytes(data: bytes, p: int, end: int):
    if end - p < 4:
        return "truncated length", p
    (n,) = struct.unpack_from(">i", data, p)
    p += 4
    if n == -1:
        return None, p
    if n < 0 or n > end - p:
        return f"length {n} exceeds the {end - p} bytes left", p
    return bytes(data[p:p + n]), p + n


# --------------------------------------------------------------------------- control records

_TXN_MARKERS = (0, 1)


def _decode_control(key: bytes | None, value: bytes | None) -> tuple[str | None, dict[str, Any] | None]:
    """Control record key: version int16, type int16.  Transaction markers'
    value: version int16, coordinator_epoch int32.  KRaft control values are
    flexible-version messages whose first field is their version."""
    if key is None or len(key) < 4:
        return "UNKNOWN", {"error": "control record key shorter than 4 bytes"}
    kver, ctype = struct.unpack_from(">hh", key, 0)
    name = CONTROL_TYPES.get(ctype, f"UNKNOWN({ctype})")
    info: dict[str, Any] = {"key_version": kver, "type_id": ctype}
    if value is None:
        return name, info
    try:
        if ctype in _TXN_MARKERS:
            if len(value) >= 6:
                ver, epoch = struct.unpack_from(">hi", value, 0)
                info["version"] = ver
                info["coordinator_epoch"] = epoch
            else:
                info["error"] = "transaction marker value shorter than 6 bytes"
        elif ctype in _KRAFT_DECODERS:
            info.update(_KRAFT_DECODERS[ctype](_Flex(value)))
        else:
            info["value_hex"] = value.hex()
    except _Bad as exc:
        info["error"] = str(exc)
        info["value_hex"] = value.hex()
    return name, info


class _Flex:
    """Minimal reader for the flexible-version KRaft control messages."""

    def __init__(self, data: bytes) -> None:
        self.d = data
        self.p = 0

    def _take(self, n: int) -> bytes:
        if n < 0 or n > len(self.d) - self.p:
            raise _Bad(f"need {n} bytes, {len(self.d) - self.p} left")
        b = self.d[self.p:self.p + n]
        self.p += n
        return b

    def i16(self) -> int:
        return struct.unpack(">h", self._take(2))[0]

    def u16(self) -> int:
        return struct.unpack(">H", self._take(2))[0]

    def i32(self) -> int:
        return struct.unpack(">i", self._take(4))[0]

    def i64(self) -> int:
        return struct.unpack(">q", self._take(8))[0]

    def uvarint(self) -> int:
        v, self.p = _uvarint(self.d, self.p, len(self.d))
        return v

    def uuid(self) -> str:
        return base64.urlsafe_b64encode(self._take(16)).decode("ascii").rstrip("=")

    def string(self) -> str | None:
        n = self.uvarint() - 1
        return None if n < 0 else self._take(n).decode("utf-8", "replace")

    def array(self, item) -> list[Any] | None:
        n = self.uvarint() - 1
        if n < 0:
            return None
        if n > len(self.d) - self.p:
            raise _Bad(f"array of {n} items in {len(self.d) - self.p} bytes")
        out = []
        for _ in range(n):
            out.append(item(self))
        return out

    def tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self._take(self.uvarint())


def _leader_change(r: _Flex) -> dict[str, Any]:
    ver = r.i16()

    def voter(r: _Flex) -> dict[str, Any]:
        v: dict[str, Any] = {"voter_id": r.i32()}
        if ver >= 1:
            v["voter_directory_id"] = r.uuid()
        r.tags()
        return v

    out = {"version": ver, "leader_id": r.i32(), "voters": r.array(voter),
           "granting_voters": r.array(voter)}
    r.tags()
    return out


def _snapshot_header(r: _Flex) -> dict[str, Any]:
    out = {"version": r.i16(), "last_contained_log_timestamp": r.i64()}
    r.tags()
    return out


def _snapshot_footer(r: _Flex) -> dict[str, Any]:
    out = {"version": r.i16()}
    r.tags()
    return out


def _kraft_version(r: _Flex) -> dict[str, Any]:
    out = {"version": r.i16(), "kraft_version": r.i16()}
    r.tags()
    return out


def _voters(r: _Flex) -> dict[str, Any]:
    ver = r.i16()

    def endpoint(r: _Flex) -> dict[str, Any]:
        e = {"name": r.string(), "host": r.string(), "port": r.u16()}
        r.tags()
        return e

    def voter(r: _Flex) -> dict[str, Any]:
        v: dict[str, Any] = {"voter_id": r.i32(), "voter_directory_id": r.uuid(),
                             "endpoints": r.array(endpoint)}
        feat = {"min_supported_version": r.i16(), "max_supported_version": r.i16()}
        r.tags()
        v["kraft_version_feature"] = feat
        r.tags()
        return v

    out = {"version": ver, "voters": r.array(voter)}
    r.tags()
    return out


_KRAFT_DECODERS = {2: _leader_change, 3: _snapshot_header, 4: _snapshot_footer,
                   5: _kraft_version, 6: _voters}


# --------------------------------------------------------------------------- record sets


class RecordSet:
    """A decoded RECORDS field: batch headers plus lazy record decoding."""

    __slots__ = ("batches", "issues", "partial_tail_bytes", "size", "raw", "limits", "origin",
                 "allow_partial")

    def __init__(self) -> None:
        self.batches: list[RecordBatch] = []
        self.issues: list[Issue] = []
        self.partial_tail_bytes = 0
        self.size = 0
        self.raw: bytes | None = None  # the RECORDS field as read (the batches keep it anyway)
        self.limits = DEFAULT_LIMITS
        self.origin = 0
        self.allow_partial = True

    def __reduce_ex__(self, protocol):
        # Pickled (--jobs, Spark) as the field's bytes, read again on arrival
        # (~2 us a set) instead of every batch's slots (~25 us, 2.3x the bytes),
        # as long as nothing was decoded lazily: decoded records may have added
        # issues that a fresh read would not have.
        if self.raw is not None and not any(b.reported for b in self.batches):
            limits = None if self.limits is DEFAULT_LIMITS else self.limits
            return (_reparse, (self.raw, limits, self.origin, self.allow_partial))
        return super().__reduce_ex__(protocol)

    def __repr__(self) -> str:
        return (f"RecordSet(batches={len(self.batches)}, size={self.size}, "
                f"partial_tail_bytes={self.partial_tail_bytes}, issues={len(self.issues)})")

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[RecordBatch]:
        return iter(self.batches)

    @property
    def record_count(self) -> int:
        """Records in the set, from batch headers (no decompression for v2 and
        uncompressed legacy messages; a compressed legacy wrapper does not say
        how many messages it holds, so those are decoded to be counted)."""
        total = 0
        for b in self.batches:
            if b.record_count is not None:
                total += max(0, b.record_count)
            else:
                total += sum(1 for _ in b.iter_records())
        return total

    def iter_records(self) -> Iterator[Record]:
        for b in self.batches:
            yield from b.iter_records()

    def to_json(self, values: str = "auto", records: bool = True, lazy: bool = False) -> dict[str, Any]:
        """Plain, JSON-serialisable rendering (batches with their records). ``lazy``: each
        batch's records are a LazyJsonArray, decoded while json's encoder writes them."""
        out_batches = []
        for b in self.batches:
            d: dict[str, Any] = {
                "position": b.position,
                "base_offset": b.base_offset,
                "length": b.length,
                "partition_leader_epoch": b.partition_leader_epoch,
                "magic": b.magic,
                "crc": b.crc,
                "crc_ok": b.crc_ok,
                "attributes": b.attributes,
                "compression": b.compression,
                "timestamp_type": b.timestamp_type,
                "is_transactional": b.is_transactional,
                "is_control": b.is_control,
                "has_delete_horizon": b.has_delete_horizon,
                "last_offset_delta": b.last_offset_delta,
                "base_timestamp": b.base_timestamp,
                "max_timestamp": b.max_timestamp,
                "producer_id": b.producer_id,
                "producer_epoch": b.producer_epoch,
                "base_sequence": b.base_sequence,
                "record_count": b.record_count,
            }
            if records and lazy:
                d["records"] = LazyJsonArray(lambda b=b: (r.to_json(values) for r in b.iter_records()))
            elif records:
                d["records"] = [r.to_json(values) for r in b.iter_records()]
            out_batches.append(d)
        return {
            "size": self.size,
            "record_count": sum(max(0, b.record_count or 0) for b in self.batches),
            "partial_tail_bytes": self.partial_tail_bytes,
            "batches": out_batches,
            "issues": [i.as_dict() for i in self.issues],
        }


class LazyJsonArray(list):
    """A JSON array whose items are made while it is written: the pure-Python encoder of
    ``json.JSONEncoder.iterencode`` iterates it (the C one would not), so a Produce of
    millions of records is rendered one record at a time. Empty as a list otherwise."""

    def __init__(self, items: Callable[[], Iterator[Any]]) -> None:
        super().__init__()
        self._items = items

    def __iter__(self) -> Iterator[Any]:
        return iter(self._items())

    def __len__(self) -> int:
        return 1  # the encoder writes '[]' for an empty list without iterating it


def parse_record_set(
    data: bytes | bytearray | memoryview | None,
    limits: Limits | None = None,
    *,
    origin: int = 0,
    allow_partial: bool = True,
) -> RecordSet:
    """Parse the batch headers of a RECORDS field.

    ``origin`` is added to issue offsets (the field's position in its frame).
    ``allow_partial``: a cut-off last entry is normal in fetch responses (an
    info issue); pass False where it is not (produce requests) to make it an
    error.
    """
    rs = RecordSet()
    rs.limits = limits = limits or DEFAULT_LIMITS
    if data is None:
        return rs
    rs.origin = origin
    rs.allow_partial = allow_partial
    data = rs.raw = bytes(data)
    n = rs.size = len(data)
    pos = 0
    index = 0
    sink = rs.issues
    view = memoryview(data)  # CRC input without copies
    while pos < n:
        left = n - pos
        if left < LOG_OVERHEAD + 5:
            _partial(rs, pos, left, origin, allow_partial, "entry header")
            break
        base_offset, size = _ENTRY_HEAD.unpack_from(data, pos)
        magic = data[pos + 16]
        if size < 5:
            rs.issues.append(Issue(DECODE_ERROR, f"entry size {size} is too small; stopping",
                                   origin + pos, f"batch[{index}]"))
            break
        if magic > 2:
            if size <= left - LOG_OVERHEAD:
                rs.issues.append(Issue(DECODE_ERROR, f"unknown magic {magic}; entry skipped",
                                       origin + pos, f"batch[{index}]"))
                pos += LOG_OVERHEAD + size
                index += 1
                continue
            rs.issues.append(Issue(DECODE_ERROR, f"unknown magic {magic}; stopping",
                                   origin + pos, f"batch[{index}]"))
            break
        if size > left - LOG_OVERHEAD:
            _partial(rs, pos, left, origin, allow_partial,
                     f"batch of {LOG_OVERHEAD + size} bytes")
            break
        end = pos + LOG_OVERHEAD + size
        if magic == 2:
            if size >= V2_HEADER_SIZE - LOG_OVERHEAD:
                b = _v2_batch(data, view, pos, size, index, limits, origin, sink)
                problem = None
            else:
                problem = f"batch length {size} is smaller than the v2 header"
        else:
            b = RecordBatch()
            b.position = pos
            b.size = LOG_OVERHEAD + size
            b.base_offset = base_offset
            b.length = size
            b.magic = magic
            b.buffer = data
            b.end = end
            b.limits = limits
            b.origin = origin
            b.sink = sink
            b.batch_index = index
            problem = _fill_legacy(b, data, pos, size)
        if problem is not None:
            rs.issues.append(Issue(DECODE_ERROR, problem + "; entry skipped", origin + pos,
                                   f"batch[{index}]"))
        else:
            if not b.crc_ok:
                iss = Issue(CRC_MISMATCH,
                            f"{'CRC-32C' if magic == 2 else 'CRC-32'} mismatch in batch at base "
                            f"offset {base_offset} (stored {b.crc:#010x})",
                            origin + pos, f"batch[{index}]")
                b.issues.append(iss)
                rs.issues.append(iss)
            rs.batches.append(b)
        pos = end
        index += 1
    return rs


def _reparse(raw: bytes, limits: Limits | None, origin: int, allow_partial: bool) -> RecordSet:
    """Unpickling a RecordSet: its bytes read again (see ``RecordSet.__reduce_ex__``)."""
    return parse_record_set(raw, limits, origin=origin, allow_partial=allow_partial)


def _partial(rs: RecordSet, pos: int, left: int, origin: int, allow: bool, what: str) -> None:
    rs.partial_tail_bytes = left
    if allow:
        rs.issues.append(Issue(PARTIAL_BATCH,
                               f"last {left} bytes are a partial {what} (normal when a fetch is "
                               f"cut at its size limit)", origin + pos, None, SEVERITY_INFO))
    else:
        rs.issues.append(Issue(DECODE_ERROR, f"record set ends inside a {what} ({left} bytes)",
                               origin + pos, None))


# compression names by the 3 codec bits, so a batch header needs no call
_CODEC_BY_BITS = tuple(codec_name(i) for i in range(8))
_new_batch = object.__new__


def _v2_batch(data: bytes, view: memoryview, pos: int, size: int, index: int, limits: Limits,
              origin: int, sink: list[Issue]) -> RecordBatch:
    """A v2 RecordBatch from its header (``size`` already checked to hold it).

    Every ``exchanges`` run reads the header of every batch, so each slot is
    set exactly once here instead of defaulted by ``__init__`` and overwritten.
    """
    (base_offset, _, ple, _, crc, attrs, lod, base_ts, max_ts, pid, epoch, base_seq,
     count) = _V2_HEADER.unpack_from(data, pos)
    b = _new_batch(RecordBatch)
    b.position = pos
    b.size = end = LOG_OVERHEAD + size
    end += pos
    b.base_offset = base_offset
    b.length = size
    b.partition_leader_epoch = ple
    b.magic = 2
    b.crc = crc
    b.crc_ok = crc32c(view[pos + 21:end]) == crc
    b.attributes = attrs & 0xFFFF
    b.codec = codec = attrs & 0x07
    b.compression = _CODEC_BY_BITS[codec]
    b.timestamp_type = TIMESTAMP_LOG_APPEND if attrs & 0x08 else TIMESTAMP_CREATE
    b.is_transactional = bool(attrs & 0x10)
    b.is_control = bool(attrs & 0x20)
    b.has_delete_horizon = bool(attrs & 0x40)
    b.last_offset_delta = lod
    b.base_timestamp = base_ts
    b.max_timestamp = max_ts
    b.producer_id = pid
    b.producer_epoch = epoch
    b.base_sequence = base_seq
    b.record_count = count
    b.issues = []
    b.buffer = data
    b.body_start = pos + V2_HEADER_SIZE
    b.end = end
    b.limits = limits
    b.origin = origin
    b.sink = sink
    b.reported = False
    b.legacy_key = None
    b.batch_index = index
    return b


def _fill_legacy(b: RecordBatch, data: bytes, pos: int, size: int) -> str | None:
    msg = _parse_legacy_message(data, pos, size)
    if isinstance(msg, str):
        return msg
    _off, _size, crc, magic, attrs, ts, key, value, crc_ok = msg
    b.crc = crc
    b.crc_ok = crc_ok
    b.attributes = attrs
    b.codec = attrs & 0x07
    b.compression = codec_name(b.codec)
    if magic == 1:
        b.timestamp_type = TIMESTAMP_LOG_APPEND if attrs & 0x08 else TIMESTAMP_CREATE
        b.base_timestamp = b.max_timestamp = ts
    b.legacy_key = key
    # the value occupies the last len(value) bytes of the entry
    end = pos + LOG_OVERHEAD + size
    if value is None:
        b.body_start = -1 if b.codec == 0 else end
        b.end = end
    else:
        b.body_start = end - len(value)
    if b.codec == 0:
        b.record_count = 1
        b.last_offset_delta = 0
    return None
