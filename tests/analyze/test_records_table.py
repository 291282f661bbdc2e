"""The records table (DESIGN.md section 2) built from decoded Produce/Fetch bodies.

Oracles: kafka-python's record encoders build the record sets (and its reader
says what they hold); a broker's offset assignment is simulated the way Kafka
does it (rewrite each batch's base offset) and read back with kafka-python; the
public deepflow captures carry real Produce requests with their responses.
"""

from __future__ import annotations

import base64
import collections
import json
import os
import struct

import pytest
from kafka import codec as kp_codec
from kafka.record import MemoryRecords, MemoryRecordsBuilder
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.util import calc_crc32c

from kwinspect.analyze.record_rows import (
    decode_internal,
    records_from_exchange,
    records_from_fetch,
    records_from_produce,
)
from kwinspect.model import CRC_MISMATCH, PARTIAL_BATCH, RECORD_COLUMNS, Exchange
from kwinspect.protocol.records import parse_record_set

CAPTURES = os.path.abspath(os.environ.get(
    "KWINSPECT_PUBLIC_CAPTURES",
    os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "captures-public")))


class _CramjamSnappy:
    @staticmethod
    def compress(b):
        import cramjam

        return bytes(cramjam.snappy.compress_raw(bytes(b)))

    @staticmethod
    def decompress(b):
        import cramjam

        return bytes(cramjam.snappy.decompress_raw(bytes(b)))


@pytest.fixture(autouse=True)
def _snappy(monkeypatch):
    monkeypatch.setattr(kp_codec, "snappy", _CramjamSnappy)


TS0 = 1_700_000_000_000


def batch(records, *, magic=2, codec=0, **producer) -> bytes:
    b = MemoryRecordsBuilder(magic, codec, 1 << 20, **producer)
    for i, (k, v, h) in enumerate(records):
        b.append(TS0 + i, k, v, h if magic == 2 else None)
    b.close()
    return bytes(b.buffer())


def broker_assign(data: bytes, base: int) -> bytes:
    """What a broker stores for a produced record set: each v2 batch's base
    offset rewritten to the next free offset (offsets deltas kept)."""
    out = bytearray(data)
    pos, nxt = 0, base
    while pos < len(out):
        (size,) = struct.unpack_from(">i", out, pos + 8)
        struct.pack_into(">q", out, pos, nxt)
        (last_delta,) = struct.unpack_from(">i", out, pos + 23)
        nxt += last_delta + 1
        pos += 12 + size
    return bytes(out)


def kp_records(data: bytes):
    out = []
    mr = MemoryRecords(data)
    while (b := mr.next_batch()) is not None:
        out += [(r.offset, r.key, r.value, list(r.headers) if b.magic == 2 else []) for r in b]
    return out


def produce_body(parts, version_name="name"):
    """parts: {(topic, partition): bytes}"""
    topics = collections.defaultdict(list)
    for (t, p), raw in parts.items():
        topics[t].append({"index": p, "records": parse_record_set(raw)})
    return {"transactional_id": None, "acks": -1, "timeout_ms": 1000,
            "topic_data": [{version_name: t, "partition_data": ps} for t, ps in topics.items()]}


def produce_response(bases, errors=None, version_name="name"):
    errors = errors or {}
    topics = collections.defaultdict(list)
    for (t, p), base in bases.items():
        topics[t].append({"index": p, "error_code": errors.get((t, p), 0), "base_offset": base,
                          "log_append_time_ms": -1, "log_start_offset": 0})
    return {"responses": [{version_name: t, "partition_responses": ps} for t, ps in topics.items()],
            "throttle_time_ms": 0}


RECS_A = [(b"k1", b"v1", [("trace", b"abc"), ("n", None)]), (None, b"\xff\xfe", []),
          (b"k3", None, [("dup", b"1"), ("dup", b"2")])]
RECS_B = [(f"key{i}".encode(), f"value-{i}".encode(), []) for i in range(5)]


def test_produce_offsets_come_from_the_response_and_match_what_the_broker_stores():
    p0 = batch(RECS_A, codec=1) + batch(RECS_B, codec=4) + batch(RECS_A[:1], codec=2)
    p1 = batch(RECS_B, codec=3)
    body = produce_body({("orders", 0): p0, ("orders", 1): p1})
    resp = produce_response({("orders", 0): 1000, ("orders", 1): 7})
    rows = records_from_produce(body, resp, correlation_id=42, stream="c->b")
    assert len(rows) == 3 + 5 + 1 + 5
    stored0 = kp_records(broker_assign(p0, 1000))
    stored1 = kp_records(broker_assign(p1, 7))
    got0 = [r for r in rows if r.partition == 0]
    assert [r.offset for r in got0] == [s[0] for s in stored0] == list(range(1000, 1009))
    assert [r.offset for r in rows if r.partition == 1] == [s[0] for s in stored1]
    # values, value for value (auto rendering), headers in order
    for row, (_off, key, value, headers) in zip(got0, stored0, strict=True):
        assert _raw(row.key, row.key_encoding) == key
        assert _raw(row.value, row.value_encoding) == value
        assert [(h["key"], _raw(h["value"], h["value_encoding"])) for h in row.headers] == headers
    r0 = got0[0]
    assert (r0.direction, r0.topic, r0.correlation_id, r0.stream) == ("produce", "orders", 42, "c->b")
    assert (r0.key, r0.key_encoding) == ("k1", "utf8")
    assert (got0[1].value, got0[1].value_encoding) == (base64.b64encode(b"\xff\xfe").decode(), "base64")
    assert (got0[1].key, got0[1].key_encoding) == (None, None)
    assert (got0[2].value, got0[2].value_encoding) == (None, None)
    # kafka-python leaves a batch uncompressed when compression does not pay off
    codecs = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
    mr, expected = MemoryRecords(p0), []
    while (b := mr.next_batch()) is not None:
        expected += [codecs[b.compression_type]] * (b.last_offset_delta + 1)
    assert [r.compression for r in got0] == expected
    assert "zstd" in expected
    assert r0.timestamp == TS0 / 1000 and r0.timestamp_type == "create_time"
    assert r0.magic == 2 and r0.crc_ok is True
    assert (r0.producer_id, r0.producer_epoch, r0.sequence) == (None, None, None)
    assert list(r0.row()) == list(RECORD_COLUMNS)


def _raw(text, enc):
    if enc is None:
        return None
    return text.encode() if enc == "utf8" else base64.b64decode(text)


def test_produce_offsets_null_without_response_or_on_error():
    body = produce_body({("t", 0): batch(RECS_B), ("t", 1): batch(RECS_B)})
    assert {r.offset for r in records_from_produce(body, None)} == {None}
    resp = produce_response({("t", 0): 10, ("t", 1): -1}, errors={("t", 0): 6})
    assert {r.offset for r in records_from_produce(body, resp)} == {None}


def test_produce_v13_topic_ids_and_mapping():
    body = produce_body({("AAAAAAAAAAAAAAAAAAAAAQ", 0): batch(RECS_B)}, "topic_id")
    resp = produce_response({("AAAAAAAAAAAAAAAAAAAAAQ", 0): 50}, version_name="topic_id")
    rows = records_from_produce(body, resp, topic_names={"AAAAAAAAAAAAAAAAAAAAAQ": "events"})
    assert {r.topic for r in rows} == {"events"}
    assert [r.offset for r in rows] == list(range(50, 55))


def test_idempotent_transactional_produce():
    raw = batch(RECS_B, codec=1, transactional=True, producer_id=555, producer_epoch=2,
                base_sequence=10)
    rows = records_from_produce(produce_body({("t", 0): raw}), produce_response({("t", 0): 0}))
    assert [r.sequence for r in rows] == [10, 11, 12, 13, 14]
    assert {(r.producer_id, r.producer_epoch, r.is_transactional) for r in rows} == {(555, 2, True)}


def test_legacy_produce_offsets_count_messages():
    raw = batch(RECS_B[:3], magic=1, codec=1) + batch(RECS_B[:2], magic=0)
    rows = records_from_produce(produce_body({("t", 0): raw}), produce_response({("t", 0): 300}))
    assert [r.offset for r in rows] == [300, 301, 302, 303, 304]
    assert [r.magic for r in rows] == [1, 1, 1, 0, 0]
    assert rows[3].timestamp is None and rows[0].timestamp == TS0 / 1000


def _control_batch(ctype: int, base_offset: int) -> bytes:
    bb = DefaultRecordBatchBuilder(2, 0, True, 555, 2, -1, 1 << 20)
    bb.append(0, TS0 + 99, struct.pack(">hh", 0, ctype), struct.pack(">hi", 0, 4), [])
    buf = bytearray(bb.build())
    struct.pack_into(">q", buf, 0, base_offset)
    struct.pack_into(">h", buf, 21, struct.unpack_from(">h", buf, 21)[0] | 0x20)
    struct.pack_into(">I", buf, 17, calc_crc32c(bytes(buf[21:])))
    return bytes(buf)


def fetch_body(parts, *, topic_field="topic"):
    topics = collections.defaultdict(list)
    for (t, p), raw in parts.items():
        topics[t].append({"partition_index": p, "error_code": 0, "high_watermark": 99,
                          "records": parse_record_set(raw)})
    return {"throttle_time_ms": 0, "error_code": 0, "session_id": 0,
            "responses": [{topic_field: t, "partitions": ps} for t, ps in topics.items()]}


def test_fetch_rows_transactions_and_control_markers():
    txn = broker_assign(batch(RECS_B, transactional=True, producer_id=555, producer_epoch=2,
                              base_sequence=0), 20)
    data = txn + _control_batch(1, 25) + broker_assign(batch(RECS_A, codec=4), 26)
    rows = records_from_fetch(fetch_body({("pay", 3): data}), correlation_id=9, stream="s")
    assert [r.offset for r in rows] == list(range(20, 29))
    assert [r.offset for r in rows] == [o for o, *_ in kp_records(data)]
    ctrl = rows[5]
    assert (ctrl.is_control, ctrl.control_type, ctrl.is_transactional) == (True, "COMMIT", True)
    assert [r.is_transactional for r in rows[:5]] == [True] * 5
    assert {r.direction for r in rows} == {"fetch"}
    assert rows[6].headers == [{"key": "trace", "value": "abc", "value_encoding": "utf8"},
                               {"key": "n", "value": None, "value_encoding": None}]


def test_fetch_v13_topic_ids_partial_tail_and_fetch_offset():
    full = broker_assign(batch(RECS_B, codec=1), 100)
    nxt = broker_assign(batch(RECS_B), 105)
    body = fetch_body({("AAAAAAAAAAAAAAAAAAAAAg", 0): full + nxt[:30]}, topic_field="topic_id")
    issues = []
    rows = records_from_fetch(body, topic_names={"AAAAAAAAAAAAAAAAAAAAAg": "logs"}, issues=issues)
    assert [r.offset for r in rows] == list(range(100, 105))
    assert {r.topic for r in rows} == {"logs"}
    assert [(i.kind, i.severity) for i in issues] == [(PARTIAL_BATCH, "info")]
    assert issues[0].path.startswith("responses[0].partitions[0].records")
    # a consumer that asked from offset 103 discards the batch's earlier records
    req = {"topics": [{"topic_id": "AAAAAAAAAAAAAAAAAAAAAg",
                       "partitions": [{"partition": 0, "fetch_offset": 103}]}]}
    rows = records_from_fetch(body, request_body=req)
    assert [r.offset for r in rows] == [103, 104]


def test_values_modes():
    body = fetch_body({("t", 0): batch([(b"\x00k", b"caf\xc3\xa9", [("h", b"\xff")])])})
    r = records_from_fetch(body, values="hex")[0]
    assert (r.key, r.key_encoding, r.value, r.value_encoding) == ("006b", "hex", "636166c3a9", "hex")
    assert r.headers == [{"key": "h", "value": "ff", "value_encoding": "hex"}]
    r = records_from_fetch(body, values="base64")[0]
    assert (r.value, r.value_encoding) == ("Y2Fmw6k=", "base64")
    r = records_from_fetch(body, values="utf8")[0]
    assert (r.value, r.value_encoding) == ("café", "utf8")
    assert r.headers[0]["value"] == "\\xff"
    r = records_from_fetch(body)[0]
    assert (r.key, r.key_encoding, r.value, r.value_encoding) == ("\x00k", "utf8", "café", "utf8")
    assert r.headers[0] == {"key": "h", "value": "/w==", "value_encoding": "base64"}


def test_crc_mismatch_rows_and_issue():
    data = bytearray(broker_assign(batch(RECS_B), 0))
    data[-3] ^= 0x20
    issues = []
    rows = records_from_fetch(fetch_body({("t", 0): bytes(data)}), issues=issues)
    assert len(rows) == 5 and {r.crc_ok for r in rows} == {False}
    assert [i.kind for i in issues] == [CRC_MISMATCH]


def test_garbage_bodies_give_no_rows():
    assert records_from_produce(None) == []
    assert records_from_fetch({"responses": [{"topic": "t", "partitions": [{"records": None}]}]}) == []
    assert records_from_fetch({"responses": "nope"}) == []
    assert records_from_fetch({"responses": [{"topic": "t", "partitions": [
        {"partition_index": 0, "records": b"\x00\x01garbage"}]}]}) == []


# --------------------------------------------------------------------------- internal topics


def _s(text: str) -> bytes:
    b = text.encode()
    return struct.pack(">h", len(b)) + b


def test_consumer_offsets_records_are_structures():
    # OffsetCommitKey (type 1) + OffsetCommitValue v3, as the group coordinator writes them
    key = struct.pack(">h", 1) + _s("grp") + _s("orders") + struct.pack(">i", 4)
    value = struct.pack(">hqi", 3, 12345, 7) + _s("meta") + struct.pack(">q", TS0)
    gkey = struct.pack(">h", 2) + _s("grp")
    sub = struct.pack(">h", 0) + struct.pack(">i", 1) + _s("orders") + struct.pack(">i", -1)
    member = (_s("m-1") + _s("client") + _s("/10.0.0.1") + struct.pack(">i", 30000)
              + struct.pack(">i", 10000) + struct.pack(">i", len(sub)) + sub
              + struct.pack(">i", 0))
    gvalue = (struct.pack(">h", 2) + _s("consumer") + struct.pack(">i", 5) + _s("range")
              + _s("m-1") + struct.pack(">q", TS0) + struct.pack(">i", 1) + member)
    raw = batch([(key, value, []), (gkey, gvalue, []), (key, None, [])])
    rows = records_from_fetch(fetch_body({("__consumer_offsets", 12): raw}))
    k0, v0 = json.loads(rows[0].key), json.loads(rows[0].value)
    assert rows[0].key_encoding == rows[0].value_encoding == "json"
    assert k0 == {"type": 1, "schema": "OffsetCommitKey",
                  "data": {"group": "grp", "topic": "orders", "partition": 4}}
    assert v0["version"] == 3 and v0["schema"] == "OffsetCommitValue"
    assert v0["data"]["offset"] == 12345 and v0["data"]["leader_epoch"] == 7
    assert v0["data"]["metadata"] == "meta" and v0["data"]["commit_timestamp"] == TS0
    g = json.loads(rows[1].value)["data"]
    assert (g["protocol_type"], g["generation"], g["protocol"], g["leader"]) == ("consumer", 5, "range", "m-1")
    (m,) = g["members"]
    assert m["member_id"] == "m-1" and m["session_timeout"] == 10000
    assert m["subscription"]["data"]["topics"] == ["orders"]
    assert (rows[2].value, rows[2].value_encoding) == (None, None)  # tombstone
    assert json.loads(rows[2].key)["data"]["partition"] == 4
    # structures on request
    rows = records_from_fetch(fetch_body({("__consumer_offsets", 12): raw}), internal="struct")
    assert rows[0].key_encoding == "struct" and rows[0].key["data"]["topic"] == "orders"


TXN_KEY = struct.pack(">h", 0) + _s("txn-1")


def test_transaction_state_key_and_fallback():
    k, _v = decode_internal("__transaction_state", TXN_KEY, None)
    assert k == {"type": 0, "schema": "TransactionLogKey", "data": {"transactional_id": "txn-1"}}
    # undecodable internal records fall back to byte rendering
    rows = records_from_fetch(fetch_body({("__transaction_state", 0): batch([(b"\x00", b"x", [])])}))
    assert (rows[0].key_encoding, rows[0].value) == ("utf8", "x")


def test_transaction_state_value_v0():
    value = (struct.pack(">hqhib", 0, 555, 2, 60000, 2) + struct.pack(">i", 1) + _s("orders")
             + struct.pack(">iii", 2, 0, 1) + struct.pack(">qq", TS0 + 5, TS0))
    _k, v = decode_internal("__transaction_state", TXN_KEY, value)
    assert v is not None and v["version"] == 0
    d = v["data"]
    assert (d["producer_id"], d["producer_epoch"], d["transaction_timeout_ms"],
            d["transaction_status"]) == (555, 2, 60000, 2)
    assert d["transaction_partitions"] == [{"topic": "orders", "partition_ids": [0, 1]}]
    assert d["transaction_last_update_timestamp_ms"] == TS0 + 5
    assert "previous_producer_id" not in d or d["previous_producer_id"] == -1


# --------------------------------------------------------------------------- real captures


def _tcp_streams(path: str):
    import dpkt

    flows = collections.OrderedDict()
    seen = set()
    with open(path, "rb") as f:
        for _ts, buf in dpkt.pcap.Reader(f):
            tcp = getattr(dpkt.ethernet.Ethernet(buf).data, "data", None)
            if not isinstance(tcp, dpkt.tcp.TCP) or not tcp.data or (tcp.sport, tcp.seq) in seen:
                continue
            seen.add((tcp.sport, tcp.seq))
            flows.setdefault((tcp.sport, tcp.dport), []).append(bytes(tcp.data))
    return [b"".join(v) for v in flows.values()]


@pytest.mark.parametrize("name,topic,offset,value", [
    ("deepflowio_deepflow__00-produce-v2.pcap", "topic2", 0, "Message without compression"),
    ("deepflowio_deepflow__00-produce-v9.pcap", "zqy-test", 35, "q" * 31),
])
def test_public_capture_produce_with_response(name, topic, offset, value):
    from kwinspect.protocol import decode_request, decode_response

    path = os.path.join(CAPTURES, name)
    if not os.path.exists(path):
        pytest.skip(f"{name} not available at {CAPTURES}")
    client, broker = _tcp_streams(path)
    req = decode_request(client[4:])
    resp = decode_response(broker[4:], 0, req.api_version)
    ex = Exchange(stream="s", client="c", broker="b", api_key=0, api_name="Produce",
                  api_version=req.api_version, correlation_id=req.correlation_id, client_id=None,
                  request_ts=None, response_ts=None, latency_ms=None, request_size=None,
                  response_size=None, status="paired", request=req, response=resp)
    (row,) = records_from_exchange(ex)
    assert (row.topic, row.partition, row.offset, row.value) == (topic, 0, offset, value)
    assert row.crc_ok is True and row.correlation_id == req.correlation_id


def test_control_records_on_the_real_capture_show_their_type_not_key_bytes(capsys):
    """The mock commits, aborts, then commits (the manifest's description): each fetched
    partition shows COMMIT, ABORT, COMMIT in offset order; --values hex still has the raw
    key, whose type field (int16 after the int16 version: 0 abort, 1 commit) agrees."""
    import json
    import struct
    from pathlib import Path

    from kwinspect.cli import main

    pcap = str(Path(__file__).resolve().parents[2] / "captures" / "confluent-mock-transactions.pcap")

    def control_rows(*extra: str) -> list[dict]:
        assert main(["records", pcap, "-q", "-F", "jsonl", "-f", "is_control", *extra]) == 0
        return [json.loads(line) for line in capsys.readouterr().out.splitlines()]

    rows = control_rows()
    by_part: dict[tuple, list[dict]] = {}
    for r in rows:
        by_part.setdefault((r["stream"], r["partition"]), []).append(r)
    assert by_part
    for part_rows in by_part.values():
        part_rows.sort(key=lambda r: r["offset"])
        assert [r["key"] for r in part_rows] == ["COMMIT", "ABORT", "COMMIT"]
        assert {r["key_encoding"] for r in part_rows} == {"control"}
        assert all(json.loads(r["value"])["version"] == 0 for r in part_rows)
    raw = control_rows("--values", "hex")
    names = {0: "ABORT", 1: "COMMIT"}
    assert sorted((r["stream"], r["offset"], names[struct.unpack(">hh", bytes.fromhex(r["key"]))[1]])
                  for r in raw) == sorted((r["stream"], r["offset"], r["key"]) for r in rows)
    # the terminal table, too
    assert main(["records", pcap, "-q", "-F", "table", "-f", "is_control"]) == 0
    table = capsys.readouterr().out
    assert "COMMIT" in table and "ABORT" in table and "\\x00" not in table
