"""Record sets: legacy message sets (magic 0/1) and v2 record batches.

Oracles we did not write:
- kafka-python 3.0.12's encoders (MemoryRecordsBuilder, DefaultRecordBatchBuilder,
  LegacyRecordBatchBuilder) build the inputs, and its readers (MemoryRecords,
  DefaultRecordBatch, LegacyRecordBatch) say what they contain, CRCs included;
- kafka-python's own CRC-32C / CRC-32 helpers for crafted (control, corrupted) batches;
- real captures from other projects (../shared/captures-public): a Produce v2
  request with a magic 1 message set (deepflow), librdkafka and Java producers'
  v2 batches (nDPI), a Java record header `sw8` (deepflow).
"""

from __future__ import annotations

import base64
import collections
import gzip
import json
import os
import struct
import tracemalloc
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka import codec as kp_codec
from kafka.record import MemoryRecords, MemoryRecordsBuilder
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.util import calc_crc32c

from kwinspect.model import (
    CRC_MISMATCH,
    DECODE_ERROR,
    DECOMPRESSION_FAILED,
    LIMIT_EXCEEDED,
    PARTIAL_BATCH,
    SEVERITY_ERROR,
    SEVERITY_INFO,
)
from kwinspect.protocol.codecs import Limits, xxh32
from kwinspect.protocol.records import (
    TIMESTAMP_CREATE,
    TIMESTAMP_LOG_APPEND,
    parse_record_set,
    render_bytes,
)

CAPTURES = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "captures-public")
CAPTURES = os.path.abspath(os.environ.get("KWINSPECT_PUBLIC_CAPTURES", CAPTURES))


# --------------------------------------------------------------------------- oracle setup


class _CramjamSnappy:
    """kafka-python's snappy backend is python-snappy, not installed here; give
    it cramjam's raw snappy so its own xerial framing code builds the frames."""

    @staticmethod
    def compress(b):
        import cramjam

        return bytes(cramjam.snappy.compress_raw(bytes(b)))

    @staticmethod
    def decompress(b):
        import cramjam

        return bytes(cramjam.snappy.decompress_raw(bytes(b)))


class _XXHash:
    """kafka-python's old-Kafka lz4 encoder needs xxhash; our xxh32 is checked
    against published vectors and lz4's own frame headers in test_codecs."""

    class _H:
        def __init__(self, data):
            self.v = xxh32(bytes(data))

        def digest(self):
            return struct.pack(">I", self.v)

    xxh32 = _H


@pytest.fixture(autouse=True)
def _kafka_python_backends(monkeypatch):
    monkeypatch.setattr(kp_codec, "snappy", _CramjamSnappy)
    monkeypatch.setattr(kp_codec, "xxhash", _XXHash)


CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}


def _sample(i: int):
    key = None if i % 4 == 2 else f"key-{i}".encode()
    if i % 5 == 3:
        value = None
    elif i % 3 == 1:
        value = bytes(range(i % 7, 250))  # binary
    else:
        value = f"välue {i} ".encode() * (1 + i % 4)
    headers = [("h1", f"x{i}".encode()), ("empty", b""), ("null", None)] if i % 2 == 0 else []
    return key, value, headers


def build(magic: int, codec: int, n: int = 7, offset: int = 0, ts0: int = 1_700_000_000_000,
          **producer) -> bytes:
    b = MemoryRecordsBuilder(magic, codec, 1 << 20, offset=offset, **producer)
    for i in range(n):
        key, value, headers = _sample(i)
        assert b.append(ts0 + 17 * i, key, value, headers if magic == 2 else None) is not None
    b.close()
    return bytes(b.buffer())


def oracle_records(data: bytes):
    """What kafka-python's reader finds: per batch (header, records)."""
    out = []
    mr = MemoryRecords(data)
    while True:
        batch = mr.next_batch()
        if batch is None:
            break
        valid = batch.validate_crc()  # before iterating: legacy batches decompress in place
        recs = []
        for r in batch:
            headers = [(k, v) for k, v in r.headers] if batch.magic == 2 else []
            recs.append((r.offset, r.timestamp, r.timestamp_type, r.key, r.value, headers))
        out.append((batch, valid, recs))
    return out


def mine(rs):
    ts_type = {TIMESTAMP_CREATE: 0, TIMESTAMP_LOG_APPEND: 1, None: None}
    return [
        (r.offset, r.timestamp, ts_type[r.timestamp_type], r.key, r.value, r.headers)
        for r in rs.iter_records()
    ]


COMBOS = [(m, c) for m in (0, 1, 2) for c in CODECS if not (m < 2 and c == 4)]


@pytest.mark.parametrize("magic,codec", COMBOS, ids=[f"magic{m}-{CODECS[c]}" for m, c in COMBOS])
def test_matches_kafka_python_value_for_value(magic, codec):
    data = build(magic, codec, n=9, offset=40)
    rs = parse_record_set(data)
    assert rs.issues == []
    assert rs.partial_tail_bytes == 0
    theirs = oracle_records(data)
    assert mine(rs) == [r for _, _, recs in theirs for r in recs]
    assert rs.record_count == 9
    assert len(rs.batches) == len(theirs)
    for b, (tb, valid, _recs) in zip(rs.batches, theirs, strict=True):
        assert b.magic == magic
        assert b.crc == (tb.crc if magic == 2 else tb._crc)
        assert b.crc_ok is True and valid
        assert b.compression == CODECS[codec if magic == 2 or len(theirs) == 1 else 0]
        assert b.base_offset == tb.base_offset
        if magic == 2:
            assert b.length + 12 == tb.size_in_bytes
            assert b.last_offset_delta == tb.last_offset_delta
            assert b.base_timestamp == tb.first_timestamp
            assert b.max_timestamp == tb.max_timestamp
            assert b.record_count == tb.records_count
            assert (b.producer_id, b.producer_epoch, b.base_sequence) == (-1, -1, -1)
            assert b.is_transactional is False and b.is_control is False


def test_mixed_formats_in_one_record_set():
    parts = [build(0, 1, 3), build(1, 0, 2, offset=3), build(1, 3, 4, offset=5), build(2, 4, 5, offset=9),
             build(2, 2, 2, offset=14)]
    data = b"".join(parts)
    rs = parse_record_set(data)
    assert rs.issues == []
    assert [b.magic for b in rs.batches] == [0, 1, 1, 1, 2, 2]
    assert mine(rs) == [r for _, _, recs in oracle_records(data) for r in recs]
    assert rs.record_count == 16


def test_transactional_idempotent_batch_and_sequences():
    base_seq = 2**31 - 3  # wraps: Kafka restarts sequences at 0 after Integer.MAX_VALUE
    data = build(2, 1, n=6, transactional=True, producer_id=987654321, producer_epoch=7,
                 base_sequence=base_seq)
    rs = parse_record_set(data)
    (b,) = rs.batches
    ((tb, _, _),) = oracle_records(data)
    assert b.is_transactional is True and tb.is_transactional
    assert (b.producer_id, b.producer_epoch, b.base_sequence) == (987654321, 7, base_seq)
    seqs = [r.sequence for r in b.records()]
    assert seqs == [tb._increment_sequence(base_seq, d) for d in range(6)]
    assert seqs[-1] == tb.last_sequence
    assert 0 in seqs


def _control_batch(ctype: int, epoch: int, *, version: int = 0, value: bytes | None = None) -> bytes:
    """A broker-written control batch: kafka-python can only build data batches,
    so build one and set the control attribute, then redo the CRC-32C with
    kafka-python's helper."""
    bb = DefaultRecordBatchBuilder(2, 0, True, 4242, 3, 10, 1 << 20)
    v = struct.pack(">hi", 0, epoch) if value is None else value
    bb.append(0, 1_700_000_000_500, struct.pack(">hh", version, ctype), v, [])
    buf = bytearray(bb.build())
    attrs = struct.unpack_from(">h", buf, 21)[0] | 0x20
    struct.pack_into(">h", buf, 21, attrs)
    struct.pack_into(">I", buf, 17, calc_crc32c(bytes(buf[21:])))
    return bytes(buf)


@pytest.mark.parametrize("ctype,name", [(0, "ABORT"), (1, "COMMIT")])
def test_transaction_markers(ctype, name):
    data = _control_batch(ctype, 55)
    tb = DefaultRecordBatch(bytearray(data))
    assert tb.is_control_batch and tb.validate_crc()
    (theirs,) = list(tb)
    assert theirs.type == ctype
    rs = parse_record_set(data)
    assert rs.issues == []
    (b,) = rs.batches
    assert b.is_control and b.is_transactional and b.crc_ok
    (rec,) = b.records()
    assert rec.control_type == name
    assert rec.control["coordinator_epoch"] == 55
    assert rec.control["type_id"] == theirs.type
    assert rec.control["key_version"] == theirs.version


def _kio(entity_type, value) -> bytes:
    """Serialise a KRaft control message with kio (an independent implementation)."""
    import io

    from kio.serial import entity_writer

    buf = io.BytesIO()
    entity_writer(entity_type)(buf, value)
    return buf.getvalue()


def _uuid_text(u) -> str:
    return base64.urlsafe_b64encode(u.bytes).decode().rstrip("=")


def test_kraft_control_records_decoded():
    import uuid

    from kio.schema.leader_change_message.v0 import data as lc0
    from kio.schema.leader_change_message.v1 import data as lc1
    from kio.schema.snapshot_footer_record.v0.data import SnapshotFooterRecord
    from kio.schema.snapshot_header_record.v0.data import SnapshotHeaderRecord
    from kio.schema.voters_record.v0 import data as vr
    from kio.static.primitive import i16, i32, i64, u16

    d1, d2 = uuid.UUID(int=7), uuid.uuid4()
    cases = [
        (2, _kio(lc0.LeaderChangeMessage, lc0.LeaderChangeMessage(
            version=i16(0), leader_id=i32(3),
            voters=(lc0.Voter(voter_id=i32(1)), lc0.Voter(voter_id=i32(3))),
            granting_voters=(lc0.Voter(voter_id=i32(3)),))),
         "LEADER_CHANGE", {"version": 0, "leader_id": 3, "voters": [{"voter_id": 1}, {"voter_id": 3}],
                           "granting_voters": [{"voter_id": 3}]}),
        (2, _kio(lc1.LeaderChangeMessage, lc1.LeaderChangeMessage(
            version=i16(1), leader_id=i32(2),
            voters=(lc1.Voter(voter_id=i32(2), voter_directory_id=d1),),
            granting_voters=())),
         "LEADER_CHANGE", {"version": 1, "leader_id": 2, "granting_voters": [],
                           "voters": [{"voter_id": 2, "voter_directory_id": _uuid_text(d1)}]}),
        (3, _kio(SnapshotHeaderRecord, SnapshotHeaderRecord(
            version=i16(0), last_contained_log_timestamp=i64(1_700_000_000_123))),
         "SNAPSHOT_HEADER", {"version": 0, "last_contained_log_timestamp": 1_700_000_000_123}),
        (4, _kio(SnapshotFooterRecord, SnapshotFooterRecord(version=i16(0))),
         "SNAPSHOT_FOOTER", {"version": 0}),
        (5, struct.pack(">hh", 0, 1) + b"\x00", "KRAFT_VERSION", {"version": 0, "kraft_version": 1}),
        (6, _kio(vr.VotersRecord, vr.VotersRecord(version=i16(0), voters=(vr.Voter(
            voter_id=i32(1), voter_directory_id=d2,
            endpoints=(vr.Endpoint(name="CONTROLLER", host="10.0.0.1", port=u16(9093)),),
            k_raft_version_feature=vr.KRaftVersionFeature(
                min_supported_version=i16(0), max_supported_version=i16(1))),))),
         "KRAFT_VOTERS", {"version": 0, "voters": [{
             "voter_id": 1, "voter_directory_id": _uuid_text(d2),
             "endpoints": [{"name": "CONTROLLER", "host": "10.0.0.1", "port": 9093}],
             "kraft_version_feature": {"min_supported_version": 0, "max_supported_version": 1}}]}),
    ]
    for ctype, value, name, fields in cases:
        (rec,) = parse_record_set(_control_batch(ctype, 0, value=value)).batches[0].records()
        assert rec.control_type == name
        got = {k: v for k, v in rec.control.items() if k not in ("key_version", "type_id")}
        assert got == fields, name
    (rec,) = parse_record_set(_control_batch(42, 0)).batches[0].records()
    assert rec.control_type == "UNKNOWN(42)"
    # a damaged control value is reported inside the record, not raised
    (rec,) = parse_record_set(_control_batch(2, 0, value=b"\x00\x00\x01")).batches[0].records()
    assert rec.control_type == "LEADER_CHANGE" and "error" in rec.control


def test_log_append_time_uses_max_timestamp():
    data = bytearray(build(2, 0, n=3))
    attrs = struct.unpack_from(">h", data, 21)[0] | 0x08
    struct.pack_into(">h", data, 21, attrs)
    struct.pack_into(">q", data, 35, 1_800_000_000_000)  # max_timestamp, as a broker sets it
    struct.pack_into(">I", data, 17, calc_crc32c(bytes(data[21:])))
    tb = DefaultRecordBatch(bytearray(data))
    rs = parse_record_set(bytes(data))
    assert [r.timestamp for r in rs.iter_records()] == [r.timestamp for r in tb]
    assert {r.timestamp for r in rs.iter_records()} == {1_800_000_000_000}
    assert rs.batches[0].timestamp_type == TIMESTAMP_LOG_APPEND


def test_delete_horizon_bit():
    data = bytearray(build(2, 0, n=2))
    struct.pack_into(">h", data, 21, struct.unpack_from(">h", data, 21)[0] | 0x40)
    struct.pack_into(">I", data, 17, calc_crc32c(bytes(data[21:])))
    (b,) = parse_record_set(bytes(data)).batches
    assert b.has_delete_horizon and b.crc_ok


# --------------------------------------------------------------------------- legacy specifics


def _legacy_msg(offset: int, magic: int, attrs: int, value: bytes, key: bytes | None = None,
                ts: int = 0) -> bytes:
    body = struct.pack(">bb", magic, attrs) + (struct.pack(">q", ts) if magic == 1 else b"")
    body += struct.pack(">i", -1) if key is None else struct.pack(">i", len(key)) + key
    body += struct.pack(">i", len(value)) + value
    msg = struct.pack(">I", zlib.crc32(body)) + body
    return struct.pack(">qi", offset, len(msg)) + msg


def test_magic1_wrapper_relative_offsets_as_brokers_write_them():
    # Java/broker style: inner relative offsets 0..n-1, wrapper offset = absolute last offset.
    inner = build(1, 0, n=4)  # kafka-python writes offsets 0..3 uncompressed
    wrapper = _legacy_msg(1003, 1, 1, gzip.compress(inner), ts=1_700_000_000_999)
    rs = parse_record_set(wrapper)
    assert rs.issues == []
    assert [r.offset for r in rs.iter_records()] == [1000, 1001, 1002, 1003]
    theirs = [r for _, _, recs in oracle_records(wrapper) for r in recs]
    assert [r.offset for r in rs.iter_records()] == [t[0] for t in theirs]
    assert rs.batches[0].record_count is None  # unknown without decompression
    assert rs.record_count == 4


def test_magic1_log_append_wrapper_overrides_inner_timestamps():
    inner = build(1, 0, n=3)
    wrapper = _legacy_msg(2, 1, 1 | 0x08, gzip.compress(inner), ts=1_234)
    theirs = [r for _, _, recs in oracle_records(wrapper) for r in recs]
    recs = list(parse_record_set(wrapper).iter_records())
    assert [r.timestamp for r in recs] == [t[1] for t in theirs] == [1_234] * 3
    assert {r.timestamp_type for r in recs} == {TIMESTAMP_LOG_APPEND}


def test_legacy_nesting_depth_limit():
    level1 = build(1, 1, n=2)  # a compressed wrapper (depth 1)
    level2 = _legacy_msg(1, 1, 1, gzip.compress(level1))  # wrapper in a wrapper
    rs = parse_record_set(level2)
    assert [r.value for r in rs.iter_records()] == [_sample(0)[1], _sample(1)[1]]
    level3 = _legacy_msg(1, 1, 1, gzip.compress(level2))
    rs = parse_record_set(level3)
    assert list(rs.iter_records()) == []
    assert any(i.kind == DECODE_ERROR and "nested" in i.message for i in rs.issues)
    rs = parse_record_set(level2, Limits(max_legacy_depth=1))
    assert list(rs.iter_records()) == [] and rs.issues


def test_old_kafka_lz4_magic0_broken_header_checksum():
    data = build(0, 3, n=5)  # kafka-python writes the pre-0.10 broken HC for magic 0
    payload = parse_record_set(data).batches[0]
    raw = data[payload.position + 12 + 4 + 2 + 4 + 4:]  # crc magic attr keylen(-1) vallen
    assert raw[:4] == b"\x04\x22\x4d\x18"
    assert raw[6] != (xxh32(raw[4:6]) >> 8) & 0xFF  # really the broken checksum
    rs = parse_record_set(data)
    assert rs.issues == []
    assert mine(rs) == [r for _, _, recs in oracle_records(data) for r in recs]


# --------------------------------------------------------------------------- damage


def test_crc_mismatch_reported_per_batch_and_decoding_continues():
    good = build(2, 0, n=3)
    bad = bytearray(build(2, 0, n=3, offset=3))
    bad[-5] ^= 0xFF  # inside the last header value
    legacy_bad = bytearray(build(1, 0, n=1, offset=6))
    legacy_bad[-1] ^= 0x01
    data = good + bytes(bad) + bytes(legacy_bad)
    rs = parse_record_set(data)
    assert [b.crc_ok for b in rs.batches] == [True, False, False]
    crc_issues = [i for i in rs.issues if i.kind == CRC_MISMATCH]
    assert [i.offset for i in crc_issues] == [len(good), len(good) + len(bad)]
    assert not DefaultRecordBatch(bytearray(bad)).validate_crc()  # the oracle agrees
    assert len(list(rs.iter_records())) == 7


def test_partial_tail_is_info_not_error():
    a = build(2, 1, n=4)
    b = build(2, 0, n=4, offset=4)
    for cut in (1, 11, 12, 20, 61, len(b) - 1):
        rs = parse_record_set(a + b[:cut])
        assert len(rs.batches) == 1 and rs.record_count == 4
        assert rs.partial_tail_bytes == cut
        assert [(i.kind, i.severity, i.offset) for i in rs.issues] == [
            (PARTIAL_BATCH, SEVERITY_INFO, len(a))]
        assert len(list(rs.iter_records())) == 4
        strict = parse_record_set(a + b[:cut], allow_partial=False)
        assert strict.issues[0].severity == SEVERITY_ERROR


def test_counting_is_lazy_no_decompression():
    data = bytearray(build(2, 1, n=5))
    data[70:90] = b"\xff" * 20  # wreck the gzip stream, then make the CRC right again
    struct.pack_into(">I", data, 17, calc_crc32c(bytes(data[21:])))
    rs = parse_record_set(bytes(data))
    assert rs.issues == []  # headers only: nothing decompressed yet
    assert rs.record_count == 5
    assert rs.batches[0].compression == "gzip"
    assert list(rs.iter_records()) == []
    assert [i.kind for i in rs.issues] == [DECOMPRESSION_FAILED]
    list(rs.iter_records())
    assert len(rs.issues) == 1  # reported once


def test_record_count_lies():
    data = bytearray(build(2, 0, n=3))
    struct.pack_into(">i", data, 57, 2**31 - 1)
    rs = parse_record_set(bytes(data))
    assert len(list(rs.iter_records())) == 3
    assert any("declares" in i.message for i in rs.issues)
    struct.pack_into(">i", data, 57, 1)
    rs = parse_record_set(bytes(data))
    assert len(list(rs.iter_records())) == 1
    assert any("after the last" in i.message for i in rs.issues)


def test_hostile_lengths():
    base = build(2, 0, n=2)
    for pos, fmt, val in [(8, ">i", 2**31 - 1), (8, ">i", -1), (8, ">i", 3), (61, ">b", 0x7F)]:
        data = bytearray(base)
        struct.pack_into(fmt, data, pos, val)
        rs = parse_record_set(bytes(data))
        list(rs.iter_records())
        rs.to_json()
        assert rs.issues


@pytest.mark.parametrize("limits", [Limits(), Limits(max_decompressed_bytes=8 << 20)],
                         ids=["default-64MiB", "8MiB"])
def test_decompression_bomb_in_a_batch_is_capped(limits):
    bb = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 20)
    bb.append(0, 1, b"k", b"v", [])
    head = bytearray(bb.build()[:61])
    zc = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = bytes(1 << 20)
    bomb = b"".join([zc.compress(chunk) for _ in range(256)] + [zc.flush()])  # 256 MiB of zeros
    struct.pack_into(">h", head, 21, 1)  # gzip
    struct.pack_into(">i", head, 8, 49 + len(bomb))
    data = bytearray(head + bomb)
    struct.pack_into(">I", data, 17, calc_crc32c(bytes(data[21:])))
    tracemalloc.start()
    try:
        rs = parse_record_set(bytes(data), limits)
        assert rs.record_count == 1
        assert list(rs.iter_records()) == []
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [i.kind for i in rs.issues] == [LIMIT_EXCEEDED]
    cap = limits.output_cap(len(bomb))
    assert cap <= limits.max_decompressed_bytes
    assert peak < cap + (2 << 20) + 3 * len(data)


# --------------------------------------------------------------------------- real captures


def _capture(name: str) -> str:
    path = os.path.join(CAPTURES, name)
    if not os.path.exists(path):
        pytest.skip(f"public capture {name} not available at {CAPTURES}")
    return path


def _tcp_streams(path: str) -> dict[tuple[int, int], bytes]:
    import dpkt

    flows: dict[tuple[int, int], list[bytes]] = collections.OrderedDict()
    seen = set()
    with open(path, "rb") as f:
        reader = dpkt.pcapng.Reader(f) if path.endswith("ng") else dpkt.pcap.Reader(f)
        for _ts, buf in reader:
            ip = dpkt.ethernet.Ethernet(buf).data
            tcp = getattr(ip, "data", None)
            if not isinstance(tcp, dpkt.tcp.TCP) or not tcp.data:
                continue
            if (tcp.sport, tcp.dport, tcp.seq) in seen:
                continue
            seen.add((tcp.sport, tcp.dport, tcp.seq))
            flows.setdefault((tcp.sport, tcp.dport), []).append(bytes(tcp.data))
    return {k: b"".join(v) for k, v in flows.items()}


def _frames(data: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos + 4 <= len(data):
        (n,) = struct.unpack_from(">i", data, pos)
        if n < 0 or pos + 4 + n > len(data):
            break
        out.append(data[pos + 4:pos + 4 + n])
        pos += 4 + n
    return out


class _Rd:
    def __init__(self, d: bytes) -> None:
        self.d, self.p = d, 0

    def u(self, fmt: str) -> int:
        v = struct.unpack_from(">" + fmt, self.d, self.p)[0]
        self.p += struct.calcsize(">" + fmt)
        return v

    def uvarint(self) -> int:
        r = sh = 0
        while True:
            b = self.d[self.p]
            self.p += 1
            r |= (b & 0x7F) << sh
            sh += 7
            if not b & 0x80:
                return r

    def blob(self, flex: bool, wide: bool = True) -> bytes | None:
        n = self.uvarint() - 1 if flex else self.u("i" if wide else "h")
        if n < 0:
            return None
        v = self.d[self.p:self.p + n]
        self.p += n
        return v

    def count(self, flex: bool) -> int:
        return self.uvarint() - 1 if flex else self.u("i")

    def tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self.p += self.uvarint()


def produce_record_sets(frame: bytes):
    """A hand-written reader for Produce requests v2-v12 (independent of kwinspect's decoder)."""
    r = _Rd(frame)
    _api, ver, _corr = r.u("h"), r.u("h"), r.u("i")
    flex = ver >= 9
    r.blob(False, wide=False)  # client_id
    if flex:
        r.tags()
    if ver >= 3:
        r.blob(flex, wide=False)  # transactional_id
    r.u("h")
    r.u("i")
    out = []
    for _ in range(r.count(flex)):
        topic = r.blob(flex, wide=False).decode()
        for _ in range(r.count(flex)):
            part = r.u("i")
            out.append((ver, topic, part, r.blob(flex)))
            if flex:
                r.tags()
        if flex:
            r.tags()
    return out


def capture_produce_sets(name: str):
    out = []
    for (_sport, dport), data in _tcp_streams(_capture(name)).items():
        if dport not in (9092, 36333):
            continue
        for frame in _frames(data):
            api, ver = struct.unpack_from(">hh", frame)
            if api == 0 and 2 <= ver <= 12:
                out.extend(produce_record_sets(frame))
    return out


def test_public_capture_produce_v2_magic1_message_set():
    ((ver, topic, part, raw),) = capture_produce_sets("deepflowio_deepflow__00-produce-v2.pcap")
    assert (ver, topic, part) == (2, "topic2", 0)
    rs = parse_record_set(raw)
    assert rs.issues == []
    (b,) = rs.batches
    assert (b.magic, b.compression, b.crc_ok) == (1, "none", True)
    theirs = [r for _, _, recs in oracle_records(raw) for r in recs]
    assert mine(rs) == theirs
    assert theirs[0][4] == b"Message without compression"


def test_public_capture_librdkafka_and_java_v2_batches():
    sets = capture_produce_sets("ntop_nDPI__kafka.pcapng")
    assert {v for v, *_ in sets} >= {3, 9}
    values = []
    for _ver, _topic, _part, raw in sets:
        rs = parse_record_set(raw)
        assert rs.issues == [] and all(b.crc_ok for b in rs.batches)
        assert all(b.magic == 2 for b in rs.batches)
        assert mine(rs) == [r for _, _, recs in oracle_records(raw) for r in recs]
        values += [r.value for r in rs.iter_records()]
    assert b"Hello world!" in values
    assert any(v.startswith(b'{"timestamp":"1681878307"') for v in values)


def test_public_capture_record_header_sw8():
    ((ver, topic, _p, raw),) = capture_produce_sets("deepflowio_deepflow__00-produce-v7-sw8.pcap")
    assert (ver, topic) == (7, "quickstart-events")
    (rec,) = list(parse_record_set(raw).iter_records())
    assert (rec.key, rec.value) == (b"MyKey", b"Hello Kafka")
    assert [k for k, _ in rec.headers] == ["sw8"]
    assert rec.headers[0][1].startswith(b"1-")


# --------------------------------------------------------------------------- rendering


def test_render_bytes_modes():
    assert render_bytes(None) == (None, None)
    assert render_bytes(b"caf\xc3\xa9") == ("café", "utf8")
    assert render_bytes(b"\xff\x00") == ("/wA=", "base64")
    assert render_bytes(b"\xff\x00", "hex") == ("ff00", "hex")
    assert render_bytes(b"ab", "base64") == ("YWI=", "base64")
    assert render_bytes(b"a\xff", "utf8") == ("a\\xff", "utf8")


def test_to_json_is_serialisable_and_complete():
    data = build(2, 4, n=4) + build(1, 1, n=2, offset=4)
    d = parse_record_set(data).to_json()
    json.dumps(d)
    assert d["record_count"] == 4  # legacy compressed wrappers are not counted without decoding
    assert [len(b["records"]) for b in d["batches"]] == [4, 2]
    rec0 = d["batches"][0]["records"][0]
    assert rec0["key"] == "key-0" and rec0["key_encoding"] == "utf8"
    assert rec0["headers"][2] == {"key": "null", "value": None, "value_encoding": None}


# --------------------------------------------------------------------------- fuzz


def _seeds() -> list[bytes]:
    out = [build(m, c, n=4) for m, c in COMBOS]
    out.append(_control_batch(1, 3))
    out.append(build(2, 0, n=3) + build(0, 1, n=2))
    return out


SEEDS: list[bytes] = []


def _exercise(data: bytes) -> None:
    rs = parse_record_set(data, Limits(max_decompressed_bytes=4 << 20))
    _ = rs.record_count
    for b in rs.batches:
        for r in b.iter_records():
            assert r.key is None or isinstance(r.key, bytes)
    json.dumps(rs.to_json())
    for i in rs.issues:
        assert i.offset is None or 0 <= i.offset <= len(data)


@st.composite
def mutated(draw):
    if not SEEDS:
        SEEDS.extend(_seeds())
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "truncate", "int32", "bytes", "fixcrc"]))
        if not data:
            break
        pos = draw(st.integers(0, len(data) - 1))
        if op == "flip":
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "truncate":
            del data[pos:]
        elif op == "int32" and pos + 4 <= len(data):
            val = draw(st.sampled_from([2**31 - 1, -1, -(2**31), 0, 1, 2**30, 61, 49]))
            struct.pack_into(">i", data, pos, val)
        elif op == "bytes":
            data[pos:pos + 8] = draw(st.binary(min_size=0, max_size=8))
        elif op == "fixcrc" and len(data) > 21 and data[16:17] == b"\x02":
            struct.pack_into(">I", data, 17, calc_crc32c(bytes(data[21:])))
    return bytes(data)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_fuzz_mutated_real_batches_never_raise(data):
    _exercise(data)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_fuzz_random_bytes_never_raise(data):
    _exercise(data)


def test_record_count_2_31_memory_bounded():
    data = bytearray(build(2, 0, n=2))
    struct.pack_into(">i", data, 57, 2**31 - 1)
    struct.pack_into(">i", data, 23, 2**31 - 1)
    struct.pack_into(">I", data, 17, calc_crc32c(bytes(data[21:])))
    tracemalloc.start()
    try:
        rs = parse_record_set(bytes(data))
        assert rs.record_count == 2**31 - 1  # what the header claims, without decoding
        assert len(list(rs.iter_records())) == 2
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_max_records_per_batch():
    for data in (build(2, 1, n=10), build(1, 1, n=10)):
        rs = parse_record_set(data, Limits(max_records_per_batch=4))
        assert len(list(rs.iter_records())) == 4
        assert [i.kind for i in rs.issues] == [LIMIT_EXCEEDED]


def test_many_tiny_legacy_messages_in_a_wrapper_stream_lazily():
    # 20 000 empty messages inside one gzip wrapper (broker style: wrapper offset
    # = absolute offset of the last one): records come out one by one.
    inner = b"".join(_legacy_msg(i, 1, 0, b"") for i in range(20000))
    wrapper = _legacy_msg(19999 + 500, 1, 1, gzip.compress(inner))
    rs = parse_record_set(wrapper)
    it = rs.iter_records()
    first = next(it)
    assert first.offset == 500 and first.value == b""
    assert sum(1 for _ in it) == 19999
    assert rs.issues == []
