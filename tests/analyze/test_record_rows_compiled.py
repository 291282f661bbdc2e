"""The records table's rows of a v2 batch made in C (analyze/_crows.c) are the rows the
Python decoder makes, and the C leaves every batch the decoder would report on to it.

Batches come from kafka-python's encoder (an oracle we did not write), with keys,
values and headers that are text, binary and null, every timestamp type, producer ids
and sequences, gzip and no compression; then the same batches mutated (bytes flipped,
cut, a record count that lies). Expected rows are the Python path's (the reference the
CLI equality tests also hold the C to, tests/test_core.py).
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.util import calc_crc32c

from kwinspect.analyze import record_rows
from kwinspect.protocol.records import parse_record_set
from tests.helpers.cores import require_compiled

FETCH, PRODUCE = 1, 0
XREF = (11, 12, 3)


@pytest.fixture(autouse=True)
def _compiled():
    require_compiled()


def _batch_bytes(rng: random.Random, n: int, codec: int, log_append: bool, producer: bool) -> bytes:
    b = DefaultRecordBatchBuilder(2, codec, 1 if producer and rng.random() < 0.5 else 0,
                                  4242 if producer else -1, 3 if producer else -1,
                                  rng.choice((0, 5, 2**31 - 3)) if producer else -1, 1 << 22)
    for i in range(n):
        kind = rng.randrange(4)
        key = None if kind == 0 else f"k{i}".encode() if kind == 1 else bytes(rng.randrange(256) for _ in range(5))
        value = (None if rng.random() < 0.1 else
                 "välue ✓ {i}".encode() * rng.randrange(1, 4) if rng.random() < 0.6 else
                 bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40))))
        headers = [(f"h{j}", None if rng.random() < 0.2 else bytes(rng.randrange(256) for _ in range(3)))
                   for j in range(rng.randrange(3))]
        ts = 1_700_000_000_000 + rng.randrange(-10**6, 10**6)
        assert b.append(i * rng.choice((1, 2)), ts, key, value, headers) is not None
    out = bytearray(b.build())
    if log_append:  # the timestamp-type bit of the attributes, and the CRC over them again
        out[22] |= 0x08
        out[17:21] = calc_crc32c(bytes(out[21:])).to_bytes(4, "big")
    if rng.random() < 0.5:  # a base offset other than 0
        out[0:8] = rng.randrange(2**40).to_bytes(8, "big")
    return bytes(out)


def _python_rows(direction, batch, first, skip):
    """What the records table makes with the Python decoder (record_rows' own loops)."""
    rows = []
    for rec, row in record_rows._batch_rows(direction, "orders", 4, batch, 99, "a->b", "auto", "json", XREF):
        if direction == FETCH:
            if skip is not None and rec.offset < skip:
                continue
            row.offset = rec.offset
        elif first is not None:
            row.offset = first + rec.offset_delta
        rows.append(row)
    return rows


def _compare(data: bytes, direction: int, first, skip, must_take: bool) -> None:
    c_set = parse_record_set(data)
    py_set = parse_record_set(data)
    for c_batch, py_batch in zip(c_set.batches, py_set.batches, strict=True):
        if direction == FETCH:
            first = c_batch.base_offset
        fast = record_rows._compiled_rows(direction, "orders", 4, c_batch, 99, "a->b", "auto", XREF, first, skip)
        before = len(py_batch.issues)
        expected = _python_rows(direction, py_batch, first, skip)
        if fast is None:
            assert not must_take, "the C declined a clean batch"
            continue
        assert len(py_batch.issues) == before, "the C took a batch the decoder reports on"
        assert fast == expected


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32), n=st.integers(0, 30), codec=st.sampled_from([0, 1]),
       log_append=st.booleans(), producer=st.booleans(), direction=st.sampled_from([FETCH, PRODUCE]),
       skip=st.sampled_from([None, 0, 3, 10**6]))
def test_rows_equal_the_python_decoders(seed, n, codec, log_append, producer, direction, skip):
    rng = random.Random(seed)
    data = _batch_bytes(rng, n, codec, log_append, producer)
    first = rng.choice((None, 0, 1000, 2**62)) if direction == PRODUCE else None
    _compare(data, direction, first, skip if direction == FETCH else None, must_take=True)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32), n=st.integers(1, 12), flips=st.integers(1, 6), cut=st.integers(0, 40),
       direction=st.sampled_from([FETCH, PRODUCE]))
def test_mutated_batches_are_the_decoders_or_declined(seed, n, flips, cut, direction):
    """Bytes flipped after the batch header (the CRC is not checked before records are
    read), the end cut: either the same rows as Python or left to Python."""
    rng = random.Random(seed)
    data = bytearray(_batch_bytes(rng, n, 0, False, True))
    for _ in range(flips):
        i = rng.randrange(61, len(data)) if len(data) > 61 else rng.randrange(len(data))
        data[i] = rng.randrange(256)
    if cut and len(data) > 61 + cut:
        # a shorter batch_length, so the parser still hands the records area over
        data = data[:-cut]
        data[8:12] = (int.from_bytes(data[8:12], "big") - cut).to_bytes(4, "big")
    _compare(bytes(data), direction, 500 if direction == PRODUCE else None, None, must_take=False)


def test_a_lying_record_count_is_left_to_python():
    rng = random.Random(5)
    data = bytearray(_batch_bytes(rng, 4, 0, False, False))
    data[57:61] = (5).to_bytes(4, "big")  # one more than the batch holds
    batch = parse_record_set(bytes(data)).batches[0]
    assert record_rows._compiled_rows(FETCH, "orders", 4, batch, 99, "a->b", "auto", XREF, 0, None) is None
    assert record_rows._compiled_rows(FETCH, "orders", 4, parse_record_set(bytes(data[:57]) + (4).to_bytes(4, "big")
                                      + bytes(data[61:])).batches[0], 99, "a->b", "auto", XREF, 0, None) is not None


def test_a_batch_past_the_record_limit_is_left_to_python():
    """More records than Limits.max_records_per_batch: the decoder keeps the first ones
    and reports the rest skipped; the C makes no rows of it."""
    from kwinspect.protocol.codecs import Limits

    data = _batch_bytes(random.Random(9), 5, 0, False, False)
    batch = parse_record_set(data, Limits(max_records_per_batch=3)).batches[0]
    assert record_rows._compiled_rows(FETCH, "orders", 4, batch, 99, "a->b", "auto", XREF, 0, None) is None
    assert len(_python_rows(FETCH, batch, 0, None)) == 3
    assert [i.kind for i in batch.issues] == ["limit_exceeded"]
    batch = parse_record_set(data, Limits(max_records_per_batch=5)).batches[0]
    assert len(record_rows._compiled_rows(FETCH, "orders", 4, batch, 99, "a->b", "auto", XREF, 0, None)) == 5
