"""The compiled decoder's own CRC-32C (protocol/_crc32c.h) against independent oracles:
the standard check value and the crc32c wheel, at every alignment and length; and a batch
whose CRC is wrong is still refused by the compiled decoder (the reference reports it)."""

from __future__ import annotations

import struct

import crc32c as crc32c_wheel
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kwinspect import core
from kwinspect.protocol import decode as D

_c = core.load("kwinspect.protocol._cdecode")
pytestmark = pytest.mark.skipif(_c is None or _c.crc32c(b"") is None,
                                reason="compiled decoder without the C CRC-32C (not built, or not x86-64 SSE4.2)")


def test_check_value():
    # RFC 3720 B.4: the CRC-32C of the ASCII digits 1-9
    assert _c.crc32c(b"123456789") == 0xE3069283
    assert _c.crc32c(b"") == 0
    assert _c.crc32c(b"\x00" * 32) == 0x8A9136AA  # RFC 3720 B.4: 32 bytes of zeros


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=4096), start=st.integers(0, 15))
def test_equal_to_the_wheel_at_every_alignment(data, start):
    buf = bytes(start) + data
    view = memoryview(buf)[start:]  # unaligned starts exercise the byte-wise head
    assert _c.crc32c(view) == crc32c_wheel.crc32c(data)


def _produce_v3_with_batch(corrupt: bool) -> bytes:
    body = bytes(range(40))  # attributes .. records: any bytes, the CRC covers them
    crc = crc32c_wheel.crc32c(body) ^ (1 if corrupt else 0)
    batch = struct.pack(">qiiBI", 0, 9 + len(body), 0, 2, crc) + body
    return (struct.pack(">hhih", 0, 3, 7, 1) + b"c" + struct.pack(">hhii", -1, 1, 1000, 1)
            + struct.pack(">h", 1) + b"t" + struct.pack(">iii", 1, 0, len(batch)) + batch)


def test_a_wrong_crc_is_reported_as_the_reference_reports_it():
    ok = D.decode_request(_produce_v3_with_batch(False))
    bad = D.decode_request(_produce_v3_with_batch(True))
    ref = D.decode_request_reference(_produce_v3_with_batch(True))
    rs_ok = ok.body["topic_data"][0]["partition_data"][0]["records"]
    rs_bad = bad.body["topic_data"][0]["partition_data"][0]["records"]
    assert all(b.crc_ok for b in rs_ok.batches)
    assert [b.crc_ok for b in rs_bad.batches] == [False]
    assert [i.message for i in rs_bad.issues] == [i.message for i in
                                                 ref.body["topic_data"][0]["partition_data"][0]["records"].issues]
    assert rs_bad.issues  # the mismatch is named
