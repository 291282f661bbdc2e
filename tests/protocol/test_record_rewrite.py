"""Record sets with replaced keys, values and header values, everything else kept.

Oracle: kafka-python's builders.  The same records built with the replaced
data give the bytes the rewrite must give (uncompressed), or the records and
checksums kafka-python's reader must find (compressed: the compressor's own
bytes may differ).
"""

from __future__ import annotations

import struct

import pytest
from kafka.record import MemoryRecordsBuilder

from kwinspect.protocol import decode_request, decode_response
from kwinspect.protocol.record_rewrite import RewriteError, rewrite_record_set
from kwinspect.protocol.records import RecordSet, parse_record_set
from tests.protocol.test_encode import CAPTURES, _capture_frames
from tests.protocol.test_records import (  # noqa: F401 - _kafka_python_backends is an autouse fixture
    CODECS,
    COMBOS,
    _kafka_python_backends,
    _sample,
    oracle_records,
)


def replaced(data: bytes | None) -> bytes | None:
    """The test's own replacement: a different length, different bytes."""
    return None if data is None else b"R:" + data[::-1]


def build(magic: int, codec: int, change=lambda d: d, n: int = 7, offset: int = 40) -> bytes:
    b = MemoryRecordsBuilder(magic, codec, 1 << 20, offset=offset)
    for i in range(n):
        key, value, headers = _sample(i)
        headers = [(k, change(v)) for k, v in headers]
        assert b.append(1_700_000_000_000 + 17 * i, change(key), change(value),
                        headers if magic == 2 else None) is not None
    b.close()
    return bytes(b.buffer())


def rewrite_all(raw: bytes):
    seen = []

    def rewrite(kind, data):
        seen.append(kind)
        return replaced(data)

    return rewrite_record_set(raw, rewrite), seen


@pytest.mark.parametrize("magic,codec", COMBOS, ids=[f"magic{m}-{CODECS[c]}" for m, c in COMBOS])
def test_rewritten_records_are_what_kafka_python_builds_from_the_replaced_data(magic, codec):
    original = build(magic, codec)
    want = build(magic, codec, replaced)
    got, seen = rewrite_all(original)
    assert got.dropped_tail_bytes == 0
    headers = sum(len(_sample(i)[2]) for i in range(7)) if magic == 2 else 0
    assert sorted(seen) == sorted(["key"] * 7 + ["value"] * 7 + ["header"] * headers)
    if codec == 0:
        assert got.data == want
    theirs, mine = oracle_records(want), oracle_records(got.data)
    assert [(valid, recs) for _b, valid, recs in mine] == [(valid, recs) for _b, valid, recs in theirs]
    assert all(valid for _b, valid, _r in mine)
    # what kwinspect reads: same offsets, timestamps, codec, crc verdicts
    a, b = parse_record_set(want), parse_record_set(got.data)
    assert [(x.base_offset, x.compression, x.crc_ok, x.record_count) for x in a.batches] == \
           [(x.base_offset, x.compression, x.crc_ok, x.record_count) for x in b.batches]
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in a.iter_records()] == \
           [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in b.iter_records()]
    # no original value survives, also inside the compressed batches
    plain = b"".join(r.value or b"" for r in b.iter_records())
    assert b"key-0" not in got.data and b"key-0" not in plain


def test_a_wrong_checksum_stays_wrong():
    original = bytearray(build(2, 0))
    original[20] ^= 0x01  # inside the v2 CRC-32C
    got, _ = rewrite_all(bytes(original))
    assert [b.crc_ok for b in parse_record_set(got.data).batches] == [False]
    legacy = bytearray(build(1, 0, n=1))
    legacy[13] ^= 0x01  # inside the legacy CRC-32
    got, _ = rewrite_all(bytes(legacy))
    assert [b.crc_ok for b in parse_record_set(got.data).batches] == [False]


def test_a_cut_off_last_batch_is_dropped_and_counted():
    whole = build(2, 0)
    got, _ = rewrite_all(whole + build(2, 1)[:40])
    assert got.dropped_tail_bytes == 40
    assert got.data == rewrite_all(whole)[0].data


def test_control_batches_are_kept_as_they_are():
    from tests.protocol.test_records import _control_batch

    marker = _control_batch(1, 5)
    got, seen = rewrite_all(marker)
    assert (got.data, seen) == (marker, [])


@pytest.mark.parametrize("damage", ["record length", "decompression"])
def test_what_cannot_be_read_is_refused(damage):
    raw = bytearray(build(2, 0 if damage == "record length" else 1))
    if damage == "record length":
        raw[61] = 0x7E  # the first record's length varint: 63, more than the batch holds
    else:
        raw[61:70] = b"\0" * 9  # the gzip header
    struct.pack_into(">I", raw, 17, 0)
    with pytest.raises(RewriteError):
        rewrite_all(bytes(raw))


def _record_sets(value):
    if isinstance(value, RecordSet):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _record_sets(v)
    elif isinstance(value, list):
        for v in value:
            yield from _record_sets(v)


def test_every_capture_record_set_survives_an_identity_rewrite():
    """Real batches (librdkafka, kafka-python, kafkajs, tansu; every codec the captures hold)."""
    codecs, sets = set(), 0
    for path in CAPTURES:
        pending = {}
        for stream, direction, frame in _capture_frames(path):
            if direction == "request":
                msg = decode_request(frame)
                pending[(stream, msg.correlation_id)] = (msg.api_key, msg.api_version)
            elif len(frame) >= 4 and (kv := pending.pop((stream, struct.unpack_from(">i", frame)[0]), None)):
                msg = decode_response(frame, *kv)
            else:
                continue
            for rs in _record_sets(msg.body):
                if rs.issues or not rs.raw:
                    continue
                got = rewrite_record_set(rs.raw, lambda _kind, data: data)
                again = parse_record_set(got.data)
                assert len(got.data) + got.dropped_tail_bytes == len(rs.raw) or any(b.codec for b in rs.batches)
                if not any(b.codec for b in rs.batches):
                    assert got.data == rs.raw[:len(rs.raw) - got.dropped_tail_bytes]
                assert [(b.base_offset, b.compression, b.crc_ok, b.record_count) for b in again.batches] == \
                       [(b.base_offset, b.compression, b.crc_ok, b.record_count) for b in rs.batches]
                assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in again.iter_records()] == \
                       [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in rs.iter_records()]
                codecs.update(b.compression for b in rs.batches)
                sets += 1
    assert sets > 80 and {"none", "gzip", "snappy", "lz4", "zstd"} <= codecs, (sets, codecs)
