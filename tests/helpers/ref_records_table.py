"""REFERENCE for tests: kwinspect/analyze/record_rows.py before the performance work of
issue 11 (commit 9f62659), reading record sets with ``helpers.ref_records``.

The records table: one ``model.RecordRow`` per Kafka record seen on the wire.

Inputs are decoded bodies (plain dicts with snake_case field names, RECORDS
fields already ``protocol.records.RecordSet``):

- ``records_from_produce(request_body, response_body, ...)``: records a
  producer sent.  The broker assigns offsets: the paired response's
  ``base_offset`` for the partition is the offset of the first record, and the
  following records take consecutive offsets (a v2 batch occupies
  ``last_offset_delta + 1`` offsets, a legacy message one).  Without a
  response (acks=0, response missing), with an error code, or with
  ``base_offset`` -1, ``offset`` is null.
- ``records_from_fetch(response_body, ...)``: records a broker returned.  Fetch
  v13+ names topics by id: pass ``topic_names`` ({topic_id: name}).  With the
  request body, records below the partition's ``fetch_offset`` are left out,
  as a consumer discards them (the broker returns whole batches).
- ``records_from_exchange(exchange, ...)``: either of the above for a paired
  ``model.Exchange`` (api key 0 or 1).
- ``iter_records_from_produce`` / ``iter_records_from_fetch``: the same rows
  as generators, for callers that stream them to an exporter.

Keys, values and header values are rendered per ``values``
(``auto|utf8|hex|base64``, see ``protocol.records.render_bytes``).  Records of
``__consumer_offsets`` and ``__transaction_state`` are decoded with the
internal-topic schemas: key and value become structures, rendered as JSON text
with encoding ``json`` (the default, fits every export format) or left as
dicts with encoding ``struct`` (``internal="struct"``).  Control records say
what they are in ``control_type``; in ``auto`` mode their key is that name
(encoding ``control``) and their value the decoded marker as JSON text.

``producer_id``/``producer_epoch``/``sequence`` are null when the batch carries
none (legacy formats, or Kafka's -1 "no producer").  ``timestamp`` is float
seconds; ``crc_ok`` is the batch's (and, inside a legacy wrapper, the inner
message's) checksum verdict.

Problems met while decoding records (CRC, decompression, truncation) are
appended to ``issues`` when a list is given, with a topic/partition path.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from helpers.ref_records import RecordSet, parse_record_set, render_bytes

from kwinspect.model import Issue, RecordRow

__all__ = [
    "INTERNAL_TOPICS", "records_from_produce", "records_from_fetch", "records_from_exchange",
    "iter_records_from_produce", "iter_records_from_fetch", "decode_internal",
]

PRODUCE, FETCH = "produce", "fetch"
INTERNAL_TOPICS = ("__consumer_offsets", "__transaction_state")


# --------------------------------------------------------------------------- produce


def records_from_produce(request_body, response_body=None, **kw: Any) -> list[RecordRow]:
    """All rows of one Produce exchange (see ``iter_records_from_produce``)."""
    return list(iter_records_from_produce(request_body, response_body, **kw))


def records_from_fetch(response_body, **kw: Any) -> list[RecordRow]:
    """All rows of one Fetch response (see ``iter_records_from_fetch``)."""
    return list(iter_records_from_fetch(response_body, **kw))


def iter_records_from_produce(
    request_body: Mapping[str, Any] | None,
    response_body: Mapping[str, Any] | None = None,
    *,
    correlation_id: int | None = None,
    stream: str | None = None,
    values: str = "auto",
    topic_names: Mapping[str, str] | None = None,
    internal: str = "json",
    issues: list[Issue] | None = None,
) -> Iterator[RecordRow]:
    """Rows of a Produce request, one at a time (memory stays flat)."""
    if not isinstance(request_body, Mapping):
        return
    bases = _produce_base_offsets(response_body, topic_names)
    for t_i, topic_data in enumerate(_list(request_body.get("topic_data"))):
        topic = _topic_name(topic_data, "name", topic_names)
        for p_i, part in enumerate(_list(topic_data.get("partition_data"))):
            partition = part.get("index")
            rs = _record_set(part.get("records"))
            if rs is None:
                continue
            base = bases.get((topic, partition))
            if base is None:
                base = bases.get((_topic_id(topic_data), partition))
            cursor = 0
            for batch in rs.batches:
                for rec in batch.iter_records():
                    if batch.magic == 2:
                        offset = None if base is None else base + cursor + rec.offset_delta
                    else:
                        offset = None if base is None else base + cursor
                        cursor += 1
                    yield _row(PRODUCE, topic, partition, offset, batch, rec,
                               correlation_id, stream, values, internal)
                if batch.magic == 2:
                    cursor += max(0, (batch.last_offset_delta or 0) + 1)
            _collect(rs, issues, f"topic_data[{t_i}].partition_data[{p_i}].records")


def _produce_base_offsets(response_body, topic_names) -> dict[tuple[Any, Any], int]:
    out: dict[tuple[Any, Any], int] = {}
    if not isinstance(response_body, Mapping):
        return out
    for topic in _list(response_body.get("responses")):
        names = {_topic_name(topic, "name", topic_names), _topic_id(topic)} - {None}
        for part in _list(topic.get("partition_responses")):
            base = part.get("base_offset")
            if part.get("error_code", 0) != 0 or not isinstance(base, int) or base < 0:
                continue
            for name in names:
                out[(name, part.get("index"))] = base
    return out


# --------------------------------------------------------------------------- fetch


def iter_records_from_fetch(
    response_body: Mapping[str, Any] | None,
    *,
    correlation_id: int | None = None,
    stream: str | None = None,
    values: str = "auto",
    topic_names: Mapping[str, str] | None = None,
    request_body: Mapping[str, Any] | None = None,
    internal: str = "json",
    issues: list[Issue] | None = None,
) -> Iterator[RecordRow]:
    """Rows of a Fetch response, one at a time (memory stays flat)."""
    if not isinstance(response_body, Mapping):
        return
    fetch_offsets = _fetch_offsets(request_body, topic_names)
    for t_i, topic_resp in enumerate(_list(response_body.get("responses"))):
        topic = _topic_name(topic_resp, "topic", topic_names)
        for p_i, part in enumerate(_list(topic_resp.get("partitions"))):
            partition = part.get("partition_index")
            rs = _record_set(part.get("records"))
            if rs is None:
                continue
            start = fetch_offsets.get((topic, partition))
            if start is None:
                start = fetch_offsets.get((_topic_id(topic_resp), partition))
            for batch in rs.batches:
                for rec in batch.iter_records():
                    if start is not None and rec.offset is not None and rec.offset < start:
                        continue
                    yield _row(FETCH, topic, partition, rec.offset, batch, rec,
                               correlation_id, stream, values, internal)
            _collect(rs, issues, f"responses[{t_i}].partitions[{p_i}].records")


def _fetch_offsets(request_body, topic_names) -> dict[tuple[Any, Any], int]:
    out: dict[tuple[Any, Any], int] = {}
    if not isinstance(request_body, Mapping):
        return out
    for topic in _list(request_body.get("topics")):
        names = {_topic_name(topic, "topic", topic_names), _topic_id(topic)} - {None}
        for part in _list(topic.get("partitions")):
            off = part.get("fetch_offset")
            if isinstance(off, int):
                for name in names:
                    out[(name, part.get("partition"))] = off
    return out


def records_from_exchange(
    exchange: Any,
    *,
    values: str = "auto",
    topic_names: Mapping[str, str] | None = None,
    internal: str = "json",
    issues: list[Issue] | None = None,
) -> list[RecordRow]:
    """Rows of a ``model.Exchange`` (Produce: request + response; Fetch: response)."""
    req = getattr(exchange, "request", None)
    resp = getattr(exchange, "response", None)
    common = dict(correlation_id=getattr(exchange, "correlation_id", None),
                  stream=getattr(exchange, "stream", None), values=values,
                  topic_names=topic_names, internal=internal, issues=issues)
    if exchange.api_key == 0 and req is not None:
        rows = records_from_produce(req.body, resp.body if resp is not None else None, **common)
    elif exchange.api_key == 1 and resp is not None:
        rows = records_from_fetch(resp.body, request_body=req.body if req is not None else None,
                                  **common)
    else:
        return []
    for row in rows:  # added with the Wireshark cross-references: the exchange's, on every row
        row.frame = getattr(exchange, "frame", None)
        row.response_frame = getattr(exchange, "response_frame", None)
        row.tcp_stream = getattr(exchange, "tcp_stream", None)
    return rows


# --------------------------------------------------------------------------- rows


def _row(direction, topic, partition, offset, batch, rec, correlation_id, stream, values,
         internal) -> RecordRow:
    key = value = key_enc = value_enc = None
    if topic in INTERNAL_TOPICS and not batch.is_control:
        k, v = decode_internal(topic, rec.key, rec.value)
        if k is not None:
            key, key_enc = _structure(k, internal)
        if v is not None:
            value, value_enc = _structure(v, internal)
        if k is None:
            key, key_enc = render_bytes(rec.key, values)
        if v is None:
            value, value_enc = render_bytes(rec.value, values)
    elif batch.is_control and values == "auto" and rec.control_type is not None:
        # control records in auto mode: the type as key, the decoded marker as JSON value
        key, key_enc = rec.control_type, "control"
        if rec.value is not None:
            marker = {k: v for k, v in (rec.control or {}).items() if k not in ("key_version", "type_id")}
            value, value_enc = json.dumps(marker, separators=(",", ":"), default=str), "json"
    else:
        key, key_enc = render_bytes(rec.key, values)
        value, value_enc = render_bytes(rec.value, values)
    headers = []
    for hk, hv in rec.headers:
        text, enc = render_bytes(hv, values)
        headers.append({"key": hk, "value": text, "value_encoding": enc})
    crc_ok = batch.crc_ok
    if rec.crc_ok is False:
        crc_ok = False
    pid = batch.producer_id
    epoch = batch.producer_epoch
    return RecordRow(
        direction=direction,
        topic=topic,
        partition=partition,
        offset=offset,
        timestamp=None if rec.timestamp is None else rec.timestamp / 1000.0,
        timestamp_type=rec.timestamp_type,
        key=key,
        key_encoding=key_enc,
        value=value,
        value_encoding=value_enc,
        headers=headers,
        compression=batch.compression,
        magic=rec.magic if batch.magic < 2 else batch.magic,
        crc_ok=crc_ok,
        producer_id=None if pid is None or pid < 0 else pid,
        producer_epoch=None if pid is None or pid < 0 or epoch is None or epoch < 0 else epoch,
        sequence=rec.sequence,
        is_transactional=batch.is_transactional,
        is_control=batch.is_control,
        control_type=rec.control_type,
        correlation_id=correlation_id,
        stream=stream,
    )


def _structure(obj: dict[str, Any], internal: str) -> tuple[Any, str]:
    if internal == "struct":
        return obj, "struct"
    return json.dumps(obj, ensure_ascii=False, sort_keys=False, separators=(",", ":")), "json"


def _record_set(value: Any) -> RecordSet | None:
    if isinstance(value, RecordSet):
        return value
    raw = getattr(value, "raw", None)  # a RecordSet of the fast module: re-read its bytes
    if raw is not None:
        return parse_record_set(raw)
    if isinstance(value, bytes | bytearray | memoryview):  # a decoder that kept raw bytes
        return parse_record_set(bytes(value))
    return None


def _collect(rs: RecordSet, issues: list[Issue] | None, path: str) -> None:
    if issues is None:
        return
    for i in rs.issues:
        issues.append(Issue(i.kind, i.message, i.offset,
                            f"{path}.{i.path}" if i.path else path, i.severity))


def _list(v: Any) -> Iterable[Any]:
    if isinstance(v, list | tuple):
        return [x for x in v if isinstance(x, Mapping)]
    return []


def _topic_id(d: Mapping[str, Any]) -> str | None:
    tid = d.get("topic_id")
    return tid if isinstance(tid, str) else None


def _topic_name(d: Mapping[str, Any], field: str, topic_names: Mapping[str, str] | None) -> str | None:
    name = d.get(field)
    if isinstance(name, str):
        return name
    tid = _topic_id(d)
    if tid is not None:
        if topic_names and tid in topic_names:
            return topic_names[tid]
        return tid
    return None


# --------------------------------------------------------------------------- internal topics


def _jsonable(v: Any) -> Any:
    if isinstance(v, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(v)).decode("ascii")
    if isinstance(v, Mapping):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_jsonable(x) for x in v]
    return v


_KEY_SCHEMAS_TXN = {0: ("TransactionLogKey", "TransactionLogValue")}


def _coordinator_schemas() -> dict[int, tuple[str, str]]:
    try:
        from kwinspect.protocol.schema.structs import COORDINATOR_RECORDS
    except ImportError:  # pragma: no cover
        return {0: ("LegacyOffsetCommitKey", "LegacyOffsetCommitValue"),
                1: ("OffsetCommitKey", "OffsetCommitValue"),
                2: ("GroupMetadataKey", "GroupMetadataValue")}
    keys = {t: n for kind, t, n in COORDINATOR_RECORDS if kind == "key" and not n.startswith("Transaction")}
    vals = {t: n for kind, t, n in COORDINATOR_RECORDS if kind == "value" and not n.startswith("Transaction")}
    return {t: (keys[t], vals.get(t, "")) for t in keys}


_CO_SCHEMAS: dict[int, tuple[str, str]] | None = None


def decode_internal(topic: str, key: bytes | None, value: bytes | None
                    ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """Decode a ``__consumer_offsets`` / ``__transaction_state`` record.

    The key is an int16 record type then the key struct (version 0); the value
    is an int16 version then the value struct at that version; a null value is
    a tombstone.  Returns ``(key, value)`` structures, ``None`` for what could
    not be decoded:
    ``{"type": 1, "schema": "OffsetCommitKey", "data": {...}}`` and
    ``{"version": 3, "schema": "OffsetCommitValue", "data": {...}}``.
    GroupMetadataValue members' subscription/assignment bytes are decoded
    with the consumer protocol schemas when the protocol type is "consumer".
    """
    global _CO_SCHEMAS
    from kwinspect.protocol.decode import decode_struct

    if key is None or len(key) < 2:
        return None, None
    rtype = int.from_bytes(key[:2], "big", signed=True)
    if topic == "__transaction_state":
        schemas = _KEY_SCHEMAS_TXN
    else:
        if _CO_SCHEMAS is None:
            _CO_SCHEMAS = _coordinator_schemas()
        schemas = _CO_SCHEMAS
    names = schemas.get(rtype)
    if names is None:
        return None, None
    key_name, value_name = names
    kdata, kissues = decode_struct(key_name, 0, bytes(key[2:]))
    if kdata is None or any(i.severity == "error" for i in kissues):
        return None, None
    kout = {"type": rtype, "schema": key_name, "data": _jsonable(kdata)}
    if value is None or not value_name or len(value) < 2:
        return kout, None
    version = int.from_bytes(value[:2], "big", signed=True)
    vdata, vissues = decode_struct(value_name, version, bytes(value[2:]))
    if vdata is None or any(i.severity == "error" for i in vissues):
        return kout, None
    if value_name == "GroupMetadataValue":
        _decode_members(vdata, decode_struct)
    return kout, {"version": version, "schema": value_name, "data": _jsonable(vdata)}


def _decode_members(vdata: dict[str, Any], decode_struct) -> None:
    if vdata.get("protocol_type") != "consumer":
        return
    for m in vdata.get("members") or []:
        for field, name in (("subscription", "ConsumerProtocolSubscription"),
                            ("assignment", "ConsumerProtocolAssignment")):
            raw = m.get(field)
            if isinstance(raw, bytes | bytearray) and len(raw) >= 2:
                ver = int.from_bytes(raw[:2], "big", signed=True)
                d, iss = decode_struct(name, ver, bytes(raw[2:]))
                if d is not None and not any(i.severity == "error" for i in iss):
                    m[field] = {"version": ver, "schema": name, "data": d}
