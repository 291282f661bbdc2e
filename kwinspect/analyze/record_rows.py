"""The records table: one ``model.RecordRow`` per Kafka record seen on the wire.

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
- ``records_from_exchange(exchange, ...)``: an iterator of either of the above for a paired
  ``model.Exchange`` (api key 0 or 1).
- ``iter_records_from_produce`` / ``iter_records_from_fetch``: the same rows
  as generators, for callers that stream them to an exporter.

Keys, values and header values are rendered per ``values``
(``auto|utf8|hex|base64``, see ``protocol.records.render_bytes``).  Records of
``__consumer_offsets`` and ``__transaction_state`` are decoded with the
internal-topic schemas: key and value become structures, rendered as JSON text
with encoding ``json`` (the default, fits every export format) or left as
dicts with encoding ``struct`` (``internal="struct"``).  Control records say
what they are in ``control_type`` (COMMIT, ABORT, LEADER_CHANGE, ...); in
``auto`` mode their key is that name (encoding ``control``) and their value the
decoded marker (transaction markers: version, coordinator_epoch; KRaft control
records: their fields) as JSON text (encoding ``json``), not the raw bytes,
which ``--values hex|base64|utf8`` still show.

``producer_id``/``producer_epoch``/``sequence`` are null when the batch carries
none (legacy formats, or Kafka's -1 "no producer").  ``timestamp`` is float
seconds; ``crc_ok`` is the batch's (and, inside a legacy wrapper, the inner
message's) checksum verdict.

Problems met while decoding records (CRC, decompression, truncation) are
appended to ``issues`` when a list is given, with a topic/partition path.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from kwinspect.core import load
from kwinspect.model import Exchange, Issue, RecordRow
from kwinspect.protocol.records import (
    TIMESTAMP_LOG_APPEND,
    RecordSet,
    parse_record_set,
    render_bytes,
)
from kwinspect.protocol.schema.api_keys import ApiKey

__all__ = [
    "INTERNAL_TOPICS", "records_from_produce", "records_from_fetch", "records_from_exchange",
    "iter_records_from_produce", "iter_records_from_fetch", "decode_internal",
]

PRODUCE_KEY = int(ApiKey.PRODUCE)
FETCH_KEY = int(ApiKey.FETCH)
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
    frame: int | None = None,
    response_frame: int | None = None,
    tcp_stream: int | None = None,
) -> Iterator[RecordRow]:
    """Rows of a Produce request, one at a time (memory stays flat). ``frame``,
    ``response_frame``, ``tcp_stream``: the exchange's, copied to every row."""
    return _produce_rows(request_body, response_body, correlation_id, stream, values, topic_names,
                         internal, issues, (frame, response_frame, tcp_stream))


_SEQ = (list, tuple)
_NO_XREF = (None, None, None)  # frame, response_frame, tcp_stream


def _produce_rows(request_body, response_body, correlation_id, stream, values, topic_names,
                  internal, issues, xref=_NO_XREF, new_only=False) -> Iterator[RecordRow]:
    # One call per produce request on the hot path: the body walk is inlined
    # (decoded bodies are dicts and lists; anything else is skipped as before).
    if type(request_body) is not dict and not isinstance(request_body, Mapping):
        return
    topics = request_body.get("topic_data")
    if not isinstance(topics, _SEQ):
        return
    bases = _produce_base_offsets(response_body, topic_names)
    t_i = -1
    for topic_data in topics:
        if type(topic_data) is not dict and not isinstance(topic_data, Mapping):
            continue
        t_i += 1
        topic = topic_data.get("name")
        if not isinstance(topic, str):
            topic = _topic_name(topic_data, "name", topic_names)
        parts = topic_data.get("partition_data")
        if not isinstance(parts, _SEQ):
            continue
        p_i = -1
        for part in parts:
            if type(part) is not dict and not isinstance(part, Mapping):
                continue
            p_i += 1
            partition = part.get("index")
            rs = part.get("records")
            if type(rs) is not RecordSet:
                rs = _record_set(rs)
                if rs is None:
                    continue
            known = len(rs.issues) if new_only else 0
            base = None
            if bases:
                base = bases.get((topic, partition))
                if base is None:
                    base = bases.get((_topic_id(topic_data), partition))
            cursor = 0
            for batch in rs.batches:
                if batch.magic == 2:
                    fast = _compiled_rows(PRODUCE, topic, partition, batch, correlation_id, stream, values,
                                          xref, None if base is None else base + cursor, None)
                    if fast is not None:
                        yield from fast
                    else:
                        for rec, row in _batch_rows(PRODUCE, topic, partition, batch, correlation_id,
                                                    stream, values, internal, xref):
                            if base is not None:
                                row.offset = base + cursor + rec.offset_delta
                            yield row
                    cursor += max(0, (batch.last_offset_delta or 0) + 1)
                else:
                    for _rec, row in _batch_rows(PRODUCE, topic, partition, batch, correlation_id,
                                                 stream, values, internal, xref):
                        if base is not None:
                            row.offset = base + cursor
                        cursor += 1
                        yield row
            if issues is not None and len(rs.issues) > known:  # (the path text only when needed)
                _collect(rs, issues, f"topic_data[{t_i}].partition_data[{p_i}].records", known)


def _produce_base_offsets(response_body, topic_names) -> dict[tuple[Any, Any], int]:
    out: dict[tuple[Any, Any], int] = {}
    if type(response_body) is not dict and not isinstance(response_body, Mapping):
        return out
    topics = response_body.get("responses")
    if not isinstance(topics, _SEQ):
        return out
    for topic in topics:
        if type(topic) is not dict and not isinstance(topic, Mapping):
            continue
        parts = topic.get("partition_responses")
        if not isinstance(parts, _SEQ) or not parts:
            continue
        name = topic.get("name")
        if not isinstance(name, str):
            name = _topic_name(topic, "name", topic_names)
        tid = topic.get("topic_id")
        if not isinstance(tid, str):
            tid = None
        for part in parts:
            if type(part) is not dict and not isinstance(part, Mapping):
                continue
            base = part.get("base_offset")
            if part.get("error_code", 0) != 0 or not isinstance(base, int) or base < 0:
                continue
            index = part.get("index")
            if name is not None:
                out[(name, index)] = base
            if tid is not None:
                out[(tid, index)] = base
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
    frame: int | None = None,
    response_frame: int | None = None,
    tcp_stream: int | None = None,
    new_issues_only: bool = False,
) -> Iterator[RecordRow]:
    """Rows of a Fetch response, one at a time (memory stays flat); ``frame``,
    ``response_frame``, ``tcp_stream`` as for produce; ``new_issues_only`` as for
    records_from_exchange."""
    xref = (frame, response_frame, tcp_stream)
    if not _is_mapping(response_body):
        return
    fetch_offsets = _fetch_offsets(request_body, topic_names)
    t_i = -1
    for topic_resp in _seq(response_body.get("responses")):
        if not _is_mapping(topic_resp):
            continue
        t_i += 1
        topic = _topic_name(topic_resp, "topic", topic_names)
        p_i = -1
        for part in _seq(topic_resp.get("partitions")):
            if not _is_mapping(part):
                continue
            p_i += 1
            partition = part.get("partition_index")
            rs = _record_set(part.get("records"))
            if rs is None:
                continue
            known = len(rs.issues) if new_issues_only else 0
            start = fetch_offsets.get((topic, partition))
            if start is None:
                start = fetch_offsets.get((_topic_id(topic_resp), partition))
            for batch in rs.batches:
                fast = _compiled_rows(FETCH, topic, partition, batch, correlation_id, stream, values, xref,
                                      batch.base_offset, start) if batch.magic == 2 else None
                if fast is not None:
                    yield from fast
                    continue
                for rec, row in _batch_rows(FETCH, topic, partition, batch, correlation_id,
                                            stream, values, internal, xref):
                    if start is not None and rec.offset is not None and rec.offset < start:
                        continue
                    row.offset = rec.offset
                    yield row
            if issues is not None and len(rs.issues) > known:  # (the path text only when needed)
                _collect(rs, issues, f"responses[{t_i}].partitions[{p_i}].records", known)


def _fetch_offsets(request_body, topic_names) -> dict[tuple[Any, Any], int]:
    out: dict[tuple[Any, Any], int] = {}
    if not _is_mapping(request_body):
        return out
    for topic in _seq(request_body.get("topics")):
        if not _is_mapping(topic):
            continue
        names = {_topic_name(topic, "topic", topic_names), _topic_id(topic)} - {None}
        for part in _seq(topic.get("partitions")):
            if not _is_mapping(part):
                continue
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
    new_issues_only: bool = False,
) -> Iterator[RecordRow]:
    """Rows of a ``model.Exchange`` (Produce: request + response; Fetch: response).

    An iterator, so a huge Produce request is never held as rows all at once;
    records are decoded as it is consumed, and ``issues`` (when given) is
    complete once it is exhausted.  Wrap it in ``list()`` to keep the rows.
    ``new_issues_only``: leave out the batch-level issues the record sets had before
    their records were decoded (the exchange's error rows already carry those).
    """
    if type(exchange) is Exchange:  # the dissector's own: no getattr per field
        req, resp, correlation_id, stream = (exchange.request, exchange.response, exchange.correlation_id,
                                             exchange.stream)
        xref = (exchange.frame, exchange.response_frame, exchange.tcp_stream)
    else:
        req = getattr(exchange, "request", None)
        resp = getattr(exchange, "response", None)
        correlation_id = getattr(exchange, "correlation_id", None)
        stream = getattr(exchange, "stream", None)
        xref = (getattr(exchange, "frame", None), getattr(exchange, "response_frame", None),
                getattr(exchange, "tcp_stream", None))
    if exchange.api_key == PRODUCE_KEY and req is not None:
        return _produce_rows(req.body, resp.body if resp is not None else None, correlation_id,
                             stream, values, topic_names, internal, issues, xref, new_issues_only)
    if exchange.api_key == FETCH_KEY and resp is not None:
        return iter_records_from_fetch(resp.body, request_body=req.body if req is not None else None,
                                       correlation_id=correlation_id, stream=stream, values=values,
                                       topic_names=topic_names, internal=internal, issues=issues,
                                       frame=xref[0], response_frame=xref[1], tcp_stream=xref[2],
                                       new_issues_only=new_issues_only)
    return iter(())


# --------------------------------------------------------------------------- rows


# The compiled twin of _batch_rows for the usual v2 batch (analyze/_crows.c), or None
_crows = load("kwinspect.analyze._crows")
_ROW_SLOTS = tuple(f.name for f in dataclasses.fields(RecordRow))
# where the C puts each record's own values (model.RecordRow's field order)
_C_SLOTS = {"offset": 3, "timestamp": 4, "key": 6, "key_encoding": 7, "value": 8, "value_encoding": 9,
            "headers": 10, "sequence": 16}
# the order _compiled_rows writes a batch's template in (a tuple display, not a dict and a
# generator per batch: those were a tenth of `records` on captures of one-record batches)
_TEMPLATE_ORDER = ("direction", "topic", "partition", "offset", "timestamp", "timestamp_type", "key",
                   "key_encoding", "value", "value_encoding", "headers", "compression", "magic", "crc_ok",
                   "producer_id", "producer_epoch", "sequence", "is_transactional", "is_control",
                   "control_type", "correlation_id", "stream", "frame", "response_frame", "tcp_stream",
                   "key_schema_id", "value_schema_id", "value_format")
if _crows is not None and (any(_ROW_SLOTS[i] != name for name, i in _C_SLOTS.items())
                           or _ROW_SLOTS != _TEMPLATE_ORDER):
    _crows = None  # RecordRow was reordered: the Python path until the C and the template are told


def _producer_of(batch) -> tuple[int | None, int | None]:
    """The batch's producer id and epoch as rows show them (None for "no producer")."""
    pid, epoch = batch.producer_id, batch.producer_epoch
    if pid is None or pid < 0:
        return None, None
    return pid, None if epoch is not None and epoch < 0 else epoch


def _compiled_rows(direction, topic, partition, batch, correlation_id, stream, values, xref, first,
                   skip_below) -> list[RecordRow] | None:
    """The rows of a v2 batch made in C, each row's offset ``first`` + its offset delta (None
    when ``first`` is), leaving out those below ``skip_below``; None when the C does not
    take the batch (control batches, internal topics, a mode other than ``auto``, anything
    the decoder would report: then _batch_rows decodes it)."""
    if (_crows is None or values != "auto" or batch.is_control or topic in INTERNAL_TOPICS
            or (first is not None and type(first) is not int)):
        return None
    area = batch.records_area()
    if area is None:
        return None
    data, pos, end = area
    pid, epoch = _producer_of(batch)
    frame, response_frame, tcp_stream = xref
    # in _TEMPLATE_ORDER; None where the C puts each record's own value, and the schema columns
    template = (direction, topic, partition, None, None, batch.timestamp_type, None, None, None, None, None,
                batch.compression, batch.magic, batch.crc_ok, pid, epoch, None, batch.is_transactional, False,
                None, correlation_id, stream, frame, response_frame, tcp_stream, None, None, None)
    base_seq = batch.base_sequence
    return _crows.v2_rows(
        data, pos, end, batch.record_count or 0, batch.limits.max_records_per_batch, RecordRow, _ROW_SLOTS,
        template, (batch.timestamp_type == TIMESTAMP_LOG_APPEND, batch.max_timestamp, batch.base_timestamp),
        base_seq if base_seq is not None and base_seq >= 0 else None, (first, skip_below))


def _batch_rows(direction, topic, partition, batch, correlation_id, stream, values,
                internal, xref=_NO_XREF) -> Iterator[tuple[Any, RecordRow]]:
    """``(record, row)`` for every record of ``batch``, ``row.offset`` left None
    for the caller (produce: from the response's base offset; fetch: as written).

    What is the same for every record of a batch is worked out once; keys and
    values of ordinary topics in ``auto`` mode are rendered inline (what
    ``render_bytes`` does, without a call per field).
    """
    compression = batch.compression
    is_transactional = batch.is_transactional
    is_control = batch.is_control
    batch_magic = batch.magic
    batch_crc_ok = batch.crc_ok
    pid, epoch = _producer_of(batch)
    special = topic in INTERNAL_TOPICS and not is_control
    inline = values == "auto" and not special and not is_control
    control = values == "auto" and is_control
    frame, response_frame, tcp_stream = xref
    for rec in batch.iter_records():
        key = rec.key
        value = rec.value
        if inline:
            if key is None:
                key_text = key_enc = None
            elif type(key) is bytes:
                try:
                    key_text, key_enc = key.decode("utf-8"), "utf8"
                except UnicodeDecodeError:
                    key_text, key_enc = base64.b64encode(key).decode("ascii"), "base64"
            else:
                key_text, key_enc = render_bytes(key, values)
            if value is None:
                value_text = value_enc = None
            elif type(value) is bytes:
                try:
                    value_text, value_enc = value.decode("utf-8"), "utf8"
                except UnicodeDecodeError:
                    value_text, value_enc = base64.b64encode(value).decode("ascii"), "base64"
            else:
                value_text, value_enc = render_bytes(value, values)
        elif control:
            key_text, key_enc, value_text, value_enc = _control_kv(rec, values)
        elif special:
            key_text, key_enc, value_text, value_enc = _internal_kv(topic, key, value, values,
                                                                    internal)
        else:
            key_text, key_enc = render_bytes(key, values)
            value_text, value_enc = render_bytes(value, values)
        headers = []
        for hk, hv in rec.headers:
            text, enc = render_bytes(hv, values)
            headers.append({"key": hk, "value": text, "value_encoding": enc})
        ts = rec.timestamp
        yield rec, _new_row(  # positional, in _ROW_FIELDS order
            direction,
            topic,
            partition,
            None,  # offset
            None if ts is None else ts / 1000.0,
            rec.timestamp_type,
            key_text,
            key_enc,
            value_text,
            value_enc,
            headers,
            compression,
            rec.magic if batch_magic < 2 else batch_magic,
            False if rec.crc_ok is False else batch_crc_ok,
            pid,
            epoch,
            rec.sequence,
            is_transactional,
            is_control,
            rec.control_type,
            correlation_id,
            stream,
            frame,
            response_frame,
            tcp_stream,
        )


def _control_kv(rec: Any, values: str) -> tuple[Any, Any, Any, Any]:
    """A control record's key as its type name and its value as the decoded marker (JSON text)."""
    if rec.control_type is None:
        key_text, key_enc = render_bytes(rec.key, values)
        value_text, value_enc = render_bytes(rec.value, values)
        return key_text, key_enc, value_text, value_enc
    fields = {k: v for k, v in (rec.control or {}).items() if k not in ("key_version", "type_id")}
    if rec.value is None:
        return rec.control_type, "control", None, None
    return rec.control_type, "control", json.dumps(fields, separators=(",", ":"), default=str), "json"


# RecordRow's fields in the order _batch_rows passes them.  Positional
# arguments cost a third of keywords for its 22 fields (~1.5 us a row); should
# model.RecordRow ever be reordered or grow, rows are built by name instead.
_ROW_FIELDS = (
    "direction", "topic", "partition", "offset", "timestamp", "timestamp_type", "key",
    "key_encoding", "value", "value_encoding", "headers", "compression", "magic", "crc_ok",
    "producer_id", "producer_epoch", "sequence", "is_transactional", "is_control", "control_type",
    "correlation_id", "stream", "frame", "response_frame", "tcp_stream",
)


def _row_by_name(*args: Any) -> RecordRow:
    return RecordRow(**dict(zip(_ROW_FIELDS, args, strict=True)))


# (fields after these, such as the schema ids, have defaults and are filled in later)
_new_row = (RecordRow if tuple(f.name for f in dataclasses.fields(RecordRow))[:len(_ROW_FIELDS)]
            == _ROW_FIELDS else _row_by_name)


def _internal_kv(topic, key, value, values, internal) -> tuple[Any, Any, Any, Any]:
    """Key and value of a ``__consumer_offsets``/``__transaction_state`` record:
    structures where they decode, else rendered bytes."""
    key_text = value_text = key_enc = value_enc = None
    k, v = decode_internal(topic, key, value)
    if k is not None:
        key_text, key_enc = _structure(k, internal)
    if v is not None:
        value_text, value_enc = _structure(v, internal)
    if k is None:
        key_text, key_enc = render_bytes(key, values)
    if v is None:
        value_text, value_enc = render_bytes(value, values)
    return key_text, key_enc, value_text, value_enc


def _structure(obj: dict[str, Any], internal: str) -> tuple[Any, str]:
    if internal == "struct":
        return obj, "struct"
    return json.dumps(obj, ensure_ascii=False, sort_keys=False, separators=(",", ":")), "json"


def _record_set(value: Any) -> RecordSet | None:
    if isinstance(value, RecordSet):
        return value
    if isinstance(value, bytes | bytearray | memoryview):  # a decoder that kept raw bytes
        return parse_record_set(bytes(value))
    return None


def _collect(rs: RecordSet, issues: list[Issue] | None, path: str, skip: int = 0) -> None:
    if issues is None:
        return
    for i in rs.issues[skip:]:
        issues.append(Issue(i.kind, i.message, i.offset,
                            f"{path}.{i.path}" if i.path else path, i.severity))


def _seq(v: Any) -> Iterable[Any]:
    """A list/tuple field as is (callers skip items that are not mappings), else nothing."""
    return v if isinstance(v, list | tuple) else ()


def _is_mapping(v: Any) -> bool:
    return type(v) is dict or isinstance(v, Mapping)  # decoded bodies are dicts: skip the ABC check


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
