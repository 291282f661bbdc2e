"""The fast record decoding gives exactly what the pre-issue-11 one gave.

``helpers.ref_records`` / ``helpers.ref_records_table`` are the modules as they
were before the performance work (commit 9f62659).  Everything observable is
compared: batch headers, every record field, every issue (eager and lazy, with
offsets and paths), record-table rows, on

- kafka-python-built batches of every magic/codec, control and transactional
  batches, crafted legacy wrappers, mutated and truncated variants of them
  (hypothesis), random bytes;
- every RECORDS field of the shipped and public captures, whole, truncated,
  with other limits and origins;
- the rows of every Produce/Fetch exchange of those captures.
"""

from __future__ import annotations

import glob
import gzip
import os
import struct

import pytest
from helpers import ref_records, ref_records_table
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka import codec as kp_codec
from kafka.record import MemoryRecordsBuilder
from protocol.test_records import (
    COMBOS,
    _control_batch,
    _CramjamSnappy,
    _legacy_msg,
    _XXHash,
    build,
    mutated,
)

from kwinspect.analyze import record_rows as table
from kwinspect.model import Exchange
from kwinspect.protocol import records
from kwinspect.protocol.codecs import Limits
from kwinspect.run.files import FileRun, dissect_files

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CAPTURES = sorted(glob.glob(os.path.join(ROOT, "captures", "*.pcap")))
PUBLIC = sorted(glob.glob(os.path.join(ROOT, "..", "shared", "captures-public", "**", "*.pcap*"),
                          recursive=True))


@pytest.fixture(autouse=True)
def _kafka_python_backends(monkeypatch):
    monkeypatch.setattr(kp_codec, "snappy", _CramjamSnappy)
    monkeypatch.setattr(kp_codec, "xxhash", _XXHash)


_BATCH_FIELDS = (
    "position", "size", "base_offset", "length", "partition_leader_epoch", "magic", "crc",
    "crc_ok", "attributes", "codec", "compression", "timestamp_type", "is_transactional",
    "is_control", "has_delete_horizon", "last_offset_delta", "base_timestamp", "max_timestamp",
    "producer_id", "producer_epoch", "base_sequence", "record_count", "next_offset_span",
)


def _issues(lst) -> list:
    return [i.as_dict() for i in lst]


def _view(rs, *, records_too: bool = True) -> dict:
    """Everything a caller can see of a parsed record set, records decoded twice
    (the second pass must not report issues again)."""
    out: dict = {
        "size": rs.size, "partial": rs.partial_tail_bytes, "len": len(rs),
        "eager_issues": _issues(rs.issues),
    }
    batches = []
    for b in rs.batches:
        d = {f: getattr(b, f) for f in _BATCH_FIELDS}
        d["eager_issues"] = _issues(b.issues)
        if records_too:
            for rnd in range(2):
                d[f"records{rnd}"] = [
                    (r.offset, r.offset_delta, r.timestamp, r.timestamp_type, r.key, r.value,
                     r.headers, r.sequence, r.attributes, r.magic, r.control_type, r.control,
                     r.crc, r.crc_ok)
                    for r in b.iter_records()
                ]
            d["issues"] = _issues(b.issues)
        batches.append(d)
    out["batches"] = batches
    if records_too:
        out["record_count"] = rs.record_count
        out["issues"] = _issues(rs.issues)
        out["json_auto"] = rs.to_json("auto")
        out["json_hex"] = rs.to_json("hex")
    return out


def _same(data: bytes, limits: Limits | None = None, **kw) -> None:
    # separate parses: record decoding reports issues into the set it came from
    new = _view(records.parse_record_set(data, limits, **kw))
    ref = _view(ref_records.parse_record_set(data, limits, **kw))
    assert new == ref
    # counting alone (no records decoded first) agrees too
    assert (records.parse_record_set(data, limits, **kw).record_count
            == ref_records.parse_record_set(data, limits, **kw).record_count)


# --------------------------------------------------------------------------- built batches


def _built() -> list[bytes]:
    out = [build(m, c, n=n) for m, c in COMBOS for n in (1, 7)]
    out += [build(2, c, n=5, producer_id=77, producer_epoch=3, base_sequence=2**31 - 3,
                  transactional=True) for c in (0, 1)]
    out += [_control_batch(0, 5), _control_batch(1, 3), _control_batch(2, 0, value=b"\x00\x00\x01"),
            _control_batch(42, 0)]
    inner = b"".join(_legacy_msg(i, 1, 0, f"v{i}".encode(), ts=1000 + i) for i in range(3))
    out.append(_legacy_msg(41, 1, 1 | 0x08, gzip.compress(inner), ts=99))  # log-append wrapper
    out.append(_legacy_msg(0, 1, 1, gzip.compress(inner), ts=99))  # wrapper offset left at 0
    out.append(build(2, 0, n=3) + build(0, 1, n=2) + build(1, 3, n=2))
    big = b"x" * 200  # two-byte varint lengths
    bb = MemoryRecordsBuilder(2, 0, 1 << 20)
    for i in range(4):
        bb.append(1_700_000_000_000 + i * 100_000, big[: 60 + 40 * i], big * (i + 1),
                  [("h" * 70, big)] if i % 2 else [])
    bb.close()
    out.append(bytes(bb.buffer()))
    return out


def test_built_batches_identical():
    for data in _built():
        _same(data)
        _same(data, origin=1234)
        _same(data, allow_partial=False)
        _same(data, Limits(max_records_per_batch=2, max_decompressed_bytes=1 << 20, min_cap=64,
                           max_ratio=2, max_legacy_depth=1))


def test_built_batches_truncated_and_flipped_everywhere():
    for data in _built()[::3]:
        for cut in range(0, len(data), max(1, len(data) // 40)):
            _same(data[:cut])
            _same(data[:cut], allow_partial=False)
        for pos in range(0, len(data), max(1, len(data) // 40)):
            flipped = bytearray(data)
            flipped[pos] ^= 0x80
            _same(bytes(flipped))


def test_varint_edges_in_records():
    """Hand-made record bodies around the one/two-byte varint boundaries and
    hostile lengths: same records, same messages."""
    def zz(n: int) -> bytes:
        u = (n << 1) ^ (n >> 63)
        out = bytearray()
        while True:
            if u < 0x80:
                out.append(u)
                return bytes(out)
            out.append((u & 0x7F) | 0x80)
            u >>= 7

    bodies = []
    for klen in (-2, -1, 0, 63, 64, 8191, 8192):
        for vlen in (-1, 0, 1, 63, 64, 200, 8192):
            key = b"" if klen < 0 else b"k" * klen
            val = b"" if vlen < 0 else b"\xff" * vlen
            body = b"\x00" + zz(-5) + zz(3) + zz(klen) + key + zz(vlen) + val + zz(0)
            bodies.append(zz(len(body)) + body)
    bodies += [b"\x00", zz(5) + b"\x00\x80\x80", zz(200) + b"\x00" * 10, zz(-3) + b"\x00" * 3,
               zz(3) + b"\x00" + zz(1) + b"\x80", b"\xff\xff\xff\xff\xff\xff"]
    for body in bodies:
        for count in (1, 2):
            head = struct.pack(">iBIhiqqqhii", 0, 2, 0, 0, 0, 1000, 2000, -1, -1, -1, count)
            batch = head + body
            data = struct.pack(">qi", 10, len(batch)) + batch
            _same(data)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(mutated())
def test_fuzz_mutated_batches_identical(data):
    _same(data, Limits(max_decompressed_bytes=4 << 20))


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=400))
def test_fuzz_random_bytes_identical(data):
    _same(data)


def test_render_bytes_identical():
    samples = [None, b"", b"abc", "välue".encode(), b"\xff\xfe", bytearray(b"xy"), memoryview(b"\x80q")]
    for mode in ("auto", "utf8", "hex", "base64", "other"):
        for s in samples:
            assert records.render_bytes(s, mode) == ref_records.render_bytes(s, mode)


def test_v2_batch_sets_every_slot():
    (b,) = records.parse_record_set(build(2, 0, n=2)).batches
    for name in records.RecordBatch.__slots__:
        getattr(b, name)  # AttributeError if the one-pass constructor forgot one


# --------------------------------------------------------------------------- captures


def _exchanges(path: str):
    run = FileRun()
    evs = [ev for ev in dissect_files([path], None, run=run) if isinstance(ev, Exchange)]
    return evs, run


def _record_sets(obj, out: list) -> list:
    if isinstance(obj, records.RecordSet):
        out.append(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _record_sets(v, out)
    elif isinstance(obj, list | tuple):
        for v in obj:
            _record_sets(v, out)
    return out


@pytest.mark.parametrize("path", CAPTURES + PUBLIC, ids=os.path.basename)
def test_capture_record_sets_and_rows_identical(path):
    evs, run = _exchanges(path)
    names = run.dissector.shared.topic_names if run.dissector else None
    n_sets = 0
    for ev in evs:
        for msg in (ev.request, ev.response):
            if msg is None:
                continue
            for rs in _record_sets(msg.body, []):
                n_sets += 1
                raw = rs.raw
                assert _view(rs, records_too=False) == _view(ref_records.parse_record_set(raw),
                                                             records_too=False)
                _same(raw)
                if len(raw) > 20:
                    _same(raw[: len(raw) * 2 // 3])
                    _same(raw[:-1], allow_partial=False, origin=77)
        for values in ("auto", "hex"):
            for internal in ("json", "struct"):
                new_issues: list = []
                ref_issues: list = []
                new = [r.row() for r in table.records_from_exchange(
                    ev, values=values, topic_names=names, internal=internal, issues=new_issues)]
                ref = [r.row() for r in ref_records_table.records_from_exchange(
                    ev, values=values, topic_names=names, internal=internal, issues=ref_issues)]
                assert new == ref
                assert _issues(new_issues) == _issues(ref_issues)
    if path.endswith(("codecs.pcap", "produce-consume.pcap")):
        assert n_sets > 0


def test_rows_with_missing_or_odd_body_parts_identical():
    """Bodies that are not what a decoder makes (hand-built, partial): skipped
    the same way."""
    rs = records.parse_record_set(build(2, 0, n=3))
    # several batches in one partition: offsets run on across them
    multi = records.parse_record_set(build(2, 0, n=3) + build(1, 1, n=2) + build(0, 0, n=2)
                                     + build(2, 1, n=4))
    produce = {"topic_data": [
        "junk", {"name": "t", "partition_data": ["x", {"index": 0, "records": multi},
                                                 {"index": 1, "records": None},
                                                 {"index": 2, "records": rs.raw}]},
        {"topic_id": "AAAAAAAAAAAAAAAAAAAAAA", "partition_data": [{"index": 3, "records": rs}]},
        {"name": "u", "partition_data": "nope"},
    ]}
    responses = [None, {}, {"responses": "x"}, {"responses": [
        {"name": "t", "partition_responses": [{"index": 0, "base_offset": 100},
                                              {"index": 2, "base_offset": 7, "error_code": 1},
                                              "junk"]},
        {"topic_id": "AAAAAAAAAAAAAAAAAAAAAA", "partition_responses": [{"index": 3, "base_offset": 5}]},
        {"name": "t", "partition_responses": []},
    ]}]
    for resp in responses:
        for values in ("auto", "base64"):
            new_issues: list = []
            ref_issues: list = []
            new = list(table.iter_records_from_produce(produce, resp, values=values,
                                                       topic_names={"AAAAAAAAAAAAAAAAAAAAAA": "named"},
                                                       issues=new_issues))
            ref = list(ref_records_table.iter_records_from_produce(
                produce, resp, values=values, topic_names={"AAAAAAAAAAAAAAAAAAAAAA": "named"},
                issues=ref_issues))
            assert [r.row() for r in new] == [r.row() for r in ref]
            assert _issues(new_issues) == _issues(ref_issues)
    fetch = {"responses": [{"topic": "t", "partitions": [
        {"partition_index": 0, "records": rs}, "junk", {"partition_index": 1}]}, 5]}
    for req in (None, {"topics": [{"topic": "t", "partitions": [{"partition": 0, "fetch_offset": 1}]}]}):
        new = [r.row() for r in table.iter_records_from_fetch(fetch, request_body=req)]
        ref = [r.row() for r in ref_records_table.iter_records_from_fetch(fetch, request_body=req)]
        assert new == ref
    assert list(table.iter_records_from_produce(None)) == []
    assert list(table.iter_records_from_fetch("x")) == []


def test_rows_are_built_positionally_and_by_name_alike(monkeypatch):
    """RecordRow is built with positional arguments while its fields are in the
    expected order; the by-name fallback (for a reordered model) gives the same rows."""
    import dataclasses

    from kwinspect.model import RecordRow

    fields = dataclasses.fields(RecordRow)
    # the positional prefix, then fields with defaults filled in later (the schema ids)
    assert tuple(f.name for f in fields)[:len(table._ROW_FIELDS)] == table._ROW_FIELDS
    assert all(f.default is None for f in fields[len(table._ROW_FIELDS):])
    assert table._new_row is RecordRow
    rs = records.parse_record_set(build(2, 1, n=5, producer_id=3, producer_epoch=1, base_sequence=9)
                                  + build(1, 0, n=2))
    body = {"responses": [{"topic": "t", "partitions": [{"partition_index": 4, "records": rs}]}]}
    fast = [r.row() for r in table.iter_records_from_fetch(body, correlation_id=8, stream="s")]
    monkeypatch.setattr(table, "_new_row", table._row_by_name)
    named = [r.row() for r in table.iter_records_from_fetch(body, correlation_id=8, stream="s")]
    assert fast == named and len(fast) == 7


# --------------------------------------------------------------------------- pickling


def _pickled(rs):
    import pickle

    return pickle.loads(pickle.dumps(rs, protocol=pickle.HIGHEST_PROTOCOL))


def test_pickled_record_set_is_the_same_set():
    """A RecordSet crosses processes (--jobs, Spark) as its bytes, read again on
    arrival: everything observable stays the same, limits, origin and
    allow_partial included."""
    limits = Limits(max_records_per_batch=2, min_cap=64, max_ratio=2)
    for data in _built():
        for kw in ({}, {"origin": 99, "allow_partial": False}):
            for cut in (len(data), len(data) - 3):
                for lim in (None, limits):
                    rs = records.parse_record_set(data[:cut], lim, **kw)
                    back = _pickled(rs)
                    assert back.limits == rs.limits
                    assert back.raw == rs.raw
                    assert _view(back) == _view(records.parse_record_set(data[:cut], lim, **kw))


def test_pickled_after_lazy_issues_keeps_them():
    """Once decoding records added issues, a fresh read would lose them: such a
    set is pickled slot by slot as before."""
    data = bytearray(build(2, 1, n=4))
    data[-5] ^= 0xFF  # damage the gzip stream: decompression fails when records are read
    rs = records.parse_record_set(bytes(data))
    eager = _issues(rs.issues)
    list(rs.iter_records())
    assert len(rs.issues) > len(eager)
    back = _pickled(rs)
    assert _issues(back.issues) == _issues(rs.issues)
    assert [_issues(b.issues) for b in back.batches] == [_issues(b.issues) for b in rs.batches]
    assert back.batches[0].sink is back.issues  # still one list, as in the original
    assert list(back.iter_records()) == [] and _issues(back.issues) == _issues(rs.issues)


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(mutated())
def test_fuzz_pickled_sets_identical(data):
    rs = records.parse_record_set(data, Limits(max_decompressed_bytes=4 << 20))
    assert _view(_pickled(rs)) == _view(records.parse_record_set(data, Limits(max_decompressed_bytes=4 << 20)))
