"""Bounded fuzzing of every parser, end to end (the long run is `make fuzz`, bench/fuzz.py).

Each test draws seeds with hypothesis and runs the harness's generator for one
target: real frames, record sets, streams, segments and capture files from
captures/ and ../shared/captures-public, mutated (bit flips, inserts and
deletes, corrupted length fields and varints, truncation, splices from other
APIs, TCP segment drop/dup/reorder via pcapgen.mangle), through the code under
test.  ``harness.check`` fails on an escaping exception, the decoder's
``internal_error`` issue, or broken accounting.  Raw hypothesis bytes go
through the same entry points too.
"""

from __future__ import annotations

import io
import random
import struct

import pytest
from fuzz import harness
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kwinspect.capture.packets import PacketParser
from kwinspect.capture.readers import CaptureFormatError, open_capture
from kwinspect.protocol import decode_request, decode_response
from kwinspect.protocol.decode import INTERNAL_ERROR
from kwinspect.protocol.records import parse_record_set


def fuzz(n: int) -> settings:
    return settings(max_examples=n, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

EXAMPLES = {"decode": 400, "records": 150, "framing": 50, "tcp": 50, "pcap": 150, "dissect": 25, "core": 40}


@pytest.fixture(scope="module")
def corpus():
    c = harness.load_corpus()
    assert c.requests and c.responses and c.record_sets and c.streams and c.segments and c.files
    return c


def _run(target: str, corpus, seed: int) -> None:
    case = harness.GENERATORS[target](random.Random(seed), corpus)
    try:
        harness.check(case)
    except harness.FuzzFailure as exc:
        path = harness.save_regression(case, str(exc))
        pytest.fail(f"{target}: {exc}\nreproducer saved: {path}")


@pytest.mark.parametrize("target", harness.TARGETS)
def test_target(target, corpus):
    @fuzz(EXAMPLES[target])
    @given(seed=st.integers(0, 2**63 - 1))
    def run(seed):
        _run(target, corpus, seed)

    run()


def test_corpus_covers_many_apis(corpus):
    keys = {struct.unpack(">h", f[:2])[0] for f in corpus.requests if len(f) >= 2}
    assert len(keys) >= 10, sorted(keys)
    assert any(k == 0 for k in keys) and any(k == 1 for k in keys)


@fuzz(300)
@given(data=st.binary(max_size=300))
def test_decode_request_raw_bytes(data):
    msg = decode_request(data)
    assert not [i for i in msg.issues if i.kind == INTERNAL_ERROR]


@fuzz(300)
@given(key_version=st.sampled_from(harness.api_versions()), data=st.binary(max_size=300))
def test_decode_response_raw_bytes_every_api_version(key_version, data):
    msg = decode_response(data, *key_version)
    assert not [i for i in msg.issues if i.kind == INTERNAL_ERROR]
    harness._exercise(msg.body)


@fuzz(200)
@given(head=st.sampled_from([b"\x00" * 8 + b"\x00\x00\x00\x30", b""]), data=st.binary(max_size=400))
def test_record_set_raw_bytes(head, data):
    rs = parse_record_set(head + data)
    rs.to_json("auto", records=True)


@fuzz(150)
@given(magic=st.sampled_from([b"\xd4\xc3\xb2\xa1", b"\xa1\xb2\xc3\xd4", b"\x4d\x3c\xb2\xa1",
                              b"\x0a\x0d\x0d\x0a", b"\x1f\x8b"]),
       data=st.binary(max_size=600))
def test_capture_readers_raw_bytes(magic, data):
    try:
        src = open_capture(io.BytesIO(magic + data))
    except CaptureFormatError:
        return
    parser = PacketParser()
    with src:
        for raw in src:
            parser.parse(raw)
    parser.finish()
    assert parser.stats.check()
