"""The compiled scan (``_cdecode.c`` scan_message, behind ``compiled.exchange_scanner``):
a frame it takes is one the decoders decode cleanly, its DeferredMessage decodes to the
reference's body, and what it noted (topics, record-set volumes, throttle, acks) is what
the label walks of stream/labels.py find in that body, with no error code and no record
set with issues there.

Held on every (api key, version, direction) of the tables with random bodies (tagged
fields, nulls, odd encodings, non-UTF-8 strings, record batches) and their mutations, on
every frame of the shipped and public captures, and through a Dissector: every row and
every body of a capture the same with ``defer_bodies`` on and off, no body decoded while
the rows are made, and the Produce exchanges really scanned.
"""

from __future__ import annotations

import pickle
import random

import pytest

from kwinspect.dissect import DissectConfig
from kwinspect.model import Exchange, Message
from kwinspect.protocol import compiled
from kwinspect.protocol import decode as D
from kwinspect.protocol.decode import DeferredMessage
from kwinspect.protocol.records import RecordSet
from kwinspect.protocol.schema.index import APIS
from kwinspect.run.files import dissect_file
from kwinspect.stream import labels
from tests.helpers.cores import python_labels, require_compiled
from tests.protocol.test_decode_fast import (
    CASES,
    SHIPPED,
    Encoder,
    _captures,
    body_bytes,
    canon,
    capture_frames,
    header_bytes,
    mutations,
)

PRODUCE, FETCH = 0, 1


@pytest.fixture(autouse=True)
def _compiled():
    require_compiled()


def scan(is_request: bool, key: int, version: int, frame: bytes):
    if is_request:  # a request's scanner is the one of its own header, as the conversation picks it
        if len(frame) < 4:
            return None
        key, version = int.from_bytes(frame[:2], "big", signed=True), int.from_bytes(frame[2:4], "big", signed=True)
        if key not in APIS:
            return None
    fn = compiled.exchange_scanner(is_request, key, version)
    if fn is None:
        return None
    return fn(frame) if is_request else fn(frame, key, version)


def record_sets(node) -> list:
    """Every RecordSet in a decoded body, wherever it sits."""
    if isinstance(node, RecordSet):
        return [node]
    if isinstance(node, dict):
        return [rs for v in node.values() for rs in record_sets(v)]
    if isinstance(node, list):
        return [rs for v in node for rs in record_sets(v)]
    return []


def check_scan(is_request: bool, key: int, version: int, frame: bytes) -> bool:
    """True when the scan took the frame; then everything it says must be the reference's."""
    msg = scan(is_request, key, version, frame)
    if msg is None:
        return False
    assert type(msg) is DeferredMessage
    key, version = msg.api_key, msg.api_version
    ref = D.decode_request_reference(frame) if is_request else D.decode_response_reference(frame, key, version)
    assert not ref.issues, (key, version, is_request, frame.hex())
    assert (msg.is_request, msg.api_key, msg.api_version, msg.size, msg.decoded_version, msg.raw_body,
            msg.issues) == (ref.is_request, ref.api_key, ref.api_version, ref.size, ref.decoded_version,
                            ref.raw_body, [])
    assert canon(msg.header) == canon(ref.header)
    body = ref.body
    topics, volumes, throttle, acks = msg.facts
    assert type(topics) is tuple and type(volumes) is tuple
    with python_labels():  # the reference walks
        assert list(topics) == labels.topics_of(body, {})
        assert list(labels.iter_errors(body, {})) == []
        if (key == PRODUCE and is_request) or (key == FETCH and not is_request):
            assert list(volumes) == [(t, rs.record_count, rs.size)
                                     for t, _p, rs in labels.iter_record_sets(key, body, {})]
            assert labels.record_volumes(key, msg, {}) is volumes
    assert all(not rs.issues for rs in record_sets(body))
    assert throttle == (body.get("throttle_time_ms") if isinstance(body.get("throttle_time_ms"), int) else None)
    assert acks == (body.get("acks") if isinstance(body.get("acks"), int) else None)
    # the body, decoded when first read, is the reference's, and kept (one object)
    first = msg.body
    assert canon(first) == canon(body)
    assert msg.body is first
    # pickled (--jobs) as a plain Message with its body
    back = pickle.loads(pickle.dumps(msg))
    assert type(back) is Message and canon(back.body) == canon(body)
    return True


@pytest.mark.parametrize("key", sorted(APIS))
def test_every_version_of_the_tables_with_random_bodies(key):
    rnd = random.Random(1000 + key)
    for case_key, version, is_request in CASES:
        if case_key != key:
            continue
        for i in range(8):
            enc = Encoder(rnd, tagged=0.0 if i < 4 else 0.5, unusual=0.0 if i < 4 else 0.3)
            frame = header_bytes(is_request, key, version, enc) + body_bytes(is_request, key, version, enc)
            check_scan(is_request, key, version, frame)
            for variant in mutations(frame, rnd, 3):
                check_scan(is_request, key, version, variant)


def test_the_scan_takes_clean_produce_exchanges():
    """Random clean Produce requests with a record batch and error-free responses: taken."""
    rnd = random.Random(7)
    taken = tried = 0
    for key, version, is_request in CASES:
        if key != PRODUCE:
            continue
        for _ in range(20):
            frame = header_bytes(is_request, key, version, Encoder(rnd)) + body_bytes(is_request, key, version,
                                                                                       Encoder(rnd))
            ref = D.decode_request_reference(frame) if is_request else D.decode_response_reference(frame, key, version)
            with python_labels():
                plain = (not ref.issues and not list(labels.iter_errors(ref.body, {}))
                         and all(not rs.issues for rs in record_sets(ref.body))
                         and "'name': ''" not in repr(ref.body)  # (an empty topic name: decoded)
                         and "topic_id" not in repr(ref.body))
            if plain:
                tried += 1
                taken += check_scan(is_request, key, version, frame)
    assert tried > 50
    assert taken == tried


@pytest.mark.parametrize(("path", "ports"), _captures())
def test_capture_frames(path, ports, monkeypatch):
    from tests.helpers.cores import python_core

    with python_core():  # (the Python conversation hands every frame to decode_request/decode_response)
        requests, responses = capture_frames(path, ports, monkeypatch)
    rnd = random.Random(path.name)
    for i, frame in enumerate(requests):
        if len(frame) < 4:
            continue
        key, version = int.from_bytes(frame[:2], "big", signed=True), int.from_bytes(frame[2:4], "big", signed=True)
        took = check_scan(True, key, version, frame)
        if key == PRODUCE and not took:  # only what the scan cannot vouch for is left to decoding
            ref = D.decode_request_reference(frame)
            sets = record_sets(ref.body)
            assert (ref.issues or any(rs.issues for rs in sets) or "topic_id" in repr(ref.body)
                    or any(b.magic != 2 for rs in sets for b in rs.batches))  # (legacy message sets)
        if i < 100:
            for variant in mutations(frame, rnd, 2):
                if len(variant) >= 4:
                    check_scan(True, key, version, variant)
    for i, (frame, key, version) in enumerate(responses):
        if key not in APIS or not isinstance(version, int):
            continue
        check_scan(False, key, version, frame)
        if i < 100:
            for variant in mutations(frame, rnd, 2):
                check_scan(False, key, version, variant)


def _run(path, ports, defer: bool, calls: list | None = None, monkeypatch=None):
    cfg = DissectConfig(kafka_ports=frozenset(ports), defer_bodies=defer) if ports else \
        DissectConfig(defer_bodies=defer)
    if calls is None:
        return dissect_file(path, cfg)
    real_request, real_response = D.decode_request, D.decode_response
    with monkeypatch.context() as m:  # every decode a DeferredMessage's body would make
        m.setattr(D, "decode_request", lambda *a: calls.append(a) or real_request(*a))
        m.setattr(D, "decode_response", lambda *a: calls.append(a) or real_response(*a))
        return dissect_file(path, cfg)


@pytest.mark.parametrize(("path", "ports"), [p for p in _captures() if "tls" not in p.id])
def test_a_dissector_with_bodies_deferred_gives_the_same_rows_and_bodies(path, ports, monkeypatch):
    calls: list = []
    deferred = _run(path, ports, True, calls, monkeypatch)
    # no body of an exchange scanned whole was decoded while the rows were made (a request whose
    # response the scan left, an error code say, is decoded by Python's emit, as before)
    decoded = {c[0] for c in calls}
    for ev in deferred:
        if type(ev) is Exchange and type(ev.request) is DeferredMessage and type(ev.response) is DeferredMessage:
            assert ev.request.frame not in decoded and ev.response.frame not in decoded
    plain = _run(path, ports, False)
    assert [type(e) for e in deferred] == [type(e) for e in plain]
    scanned = 0
    for a, b in zip(deferred, plain, strict=True):
        assert a.row() == b.row()
        if type(a) is not Exchange:
            continue
        for ma, mb in ((a.request, b.request), (a.response, b.response)):
            assert (ma is None) == (mb is None)
            if ma is None:
                continue
            scanned += type(ma) is DeferredMessage
            assert type(mb) is not DeferredMessage
            assert canon(ma.header) == canon(mb.header)
            assert canon(ma.body) == canon(mb.body)
            assert [i.as_dict() for i in ma.issues] == [i.as_dict() for i in mb.issues]
    produce = sum(1 for e in plain if type(e) is Exchange and e.api_key == PRODUCE and e.status == "paired"
                  and not e.error_codes)
    if produce and path.parent == SHIPPED and "legacy" not in path.name:  # (public ones: legacy message sets)
        assert scanned > 0
