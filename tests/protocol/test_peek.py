"""Request-header peek and request plausibility.

Oracles we did not write: request headers written by kio's
``entity_writer(RequestHeader)`` for every api key and version kio knows, and
whole requests encoded by kafka-python.
"""

from __future__ import annotations

import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer import FetchRequest, HeartbeatRequest
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest
from kio.schema.index import api_key_map, schema_name_map
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.serial import entity_writer
from kio.static.primitive import i16, i32

from kwinspect.protocol.apis import API_NAMES, version_range
from kwinspect.protocol.peek import (
    NEW_API_KEY_LIMIT,
    RequestHeaderPeek,
    peek_request_header,
    plausible_request,
)


def kio_header(api_key: int, version: int, cid: int, client_id: str | None, v2: bool) -> bytes:
    cls = RequestHeaderV2 if v2 else RequestHeaderV1
    buf = io.BytesIO()
    entity_writer(cls)(buf, cls(request_api_key=i16(api_key), request_api_version=i16(version), correlation_id=i32(cid), client_id=client_id))
    return buf.getvalue()


def kio_request_versions() -> list[tuple[int, int]]:
    out = []
    for key, name in api_key_map.items():
        for version in schema_name_map.get(name, {}):
            out.append((key, int(version)))
    return sorted(out)


@pytest.mark.parametrize("v2", [False, True])
@pytest.mark.parametrize("client_id", [None, "", "rdkafka", "consumer-zyx-1", "prödücer €"])
def test_peek_reads_headers_written_by_kio(client_id, v2):
    raw = kio_header(3, 12, 123456, client_id, v2) + b"\x00body"
    peek = peek_request_header(raw)
    n = 0 if client_id is None else len(client_id.encode())
    assert peek == RequestHeaderPeek(3, 12, 123456, client_id, 10 + n)
    # header v2 appends tagged fields after the classic client id
    assert raw[peek.header_size_v1 :] == (b"\x00" if v2 else b"") + b"\x00body"
    assert peek_request_header(b"junk" + raw, offset=4) == peek


def test_every_request_version_kio_knows_is_plausible():
    """kio's tables are newer than ours for a few APIs (share groups, KIP-932 ...).

    Those versions are plausible on a connection known to carry Kafka; on an
    unknown connection exactly the versions beyond our tables are rejected.
    """
    versions = kio_request_versions()
    assert len(versions) > 300
    for key, version in versions:
        raw = kio_header(key, version, 7, "kwinspect", v2=True)
        assert plausible_request(raw, known_kafka=True), (key, api_key_map[key], version)
        rng = version_range(key)
        in_our_tables = rng is not None and rng[0] <= version <= rng[1]
        assert plausible_request(raw) == in_our_tables, (key, api_key_map[key], version)


def test_kafka_python_requests_peek_and_are_plausible():
    reqs = [
        MetadataRequest[0](topics=[]),
        MetadataRequest[12](topics=None, allow_auto_topic_creation=True),
        ApiVersionsRequest[3](client_software_name="kafka-python", client_software_version="3.0"),
        HeartbeatRequest[4](group_id="g", generation_id=3, member_id="m", group_instance_id=None),
        FetchRequest[4](replica_id=-1, max_wait_ms=500, min_bytes=1, max_bytes=1024, isolation_level=0, topics=[]),
    ]
    for cid, req in enumerate(reqs, start=40):
        req.with_header(correlation_id=cid, client_id="kp-client")
        payload = bytes(req.encode(header=True))
        peek = peek_request_header(payload)
        assert peek is not None
        assert (peek.api_key, peek.api_version, peek.correlation_id, peek.client_id) == (req.API_KEY, req.API_VERSION, cid, "kp-client")
        assert plausible_request(payload)


def test_header_prefix_is_enough_and_short_input_is_none():
    raw = kio_header(0, 9, 1, "producer-1", v2=True)
    assert plausible_request(raw[: 10 + len("producer-1")])
    for cut in range(10 + len("producer-1")):
        assert peek_request_header(raw[:cut]) is None
        assert not plausible_request(raw[:cut])


@pytest.mark.parametrize(
    "raw, why",
    [
        (kio_header(3, 99, 1, "c", False), "version above the known range"),
        (kio_header(3, -1, 1, "c", False), "negative version"),
        (kio_header(-1, 0, 1, "c", False), "negative api key"),
        (kio_header(3, 1, -5, "c", False), "negative correlation id"),
        (kio_header(3, 1, 1, "bad\x00id", False), "control character in client id"),
        (b"\x00\x03\x00\x01\x00\x00\x00\x01\x00\x02\xff\xfe", "client id not UTF-8"),
        (b"\x00\x03\x00\x01\x00\x00\x00\x01\xff\xfe", "client id length below -1"),
        (b"\x00\x03\x00\x01\x00\x00\x00\x01\x00\x09abc", "client id runs past the end"),
        (b"GET / HTTP/1.1\r\nHost: x\r\n", "HTTP"),
    ],
)
def test_implausible_requests(raw, why):
    assert not plausible_request(raw), why
    assert not plausible_request(raw, known_kafka=True) or "version" in why


def test_new_api_keys_are_plausible_only_on_known_kafka_connections():
    new_key = max(API_NAMES) + 1
    raw = kio_header(new_key, 0, 9, "client", True)
    assert peek_request_header(raw) is not None
    assert not plausible_request(raw)
    assert plausible_request(raw, known_kafka=True)
    assert not plausible_request(kio_header(NEW_API_KEY_LIMIT + 1, 0, 9, "client", True), known_kafka=True)
    lo, hi = version_range(0)
    assert not plausible_request(kio_header(0, hi + 1, 9, "c", True))
    assert plausible_request(kio_header(0, hi + 1, 9, "c", True), known_kafka=True)


@settings(max_examples=300, deadline=None)
@given(raw=st.binary(max_size=64), offset=st.integers(-3, 70), known=st.booleans())
def test_property_never_raises(raw, offset, known):
    peek = peek_request_header(raw, offset)
    if peek is not None:
        assert peek.header_size_v1 <= len(raw) - offset
    assert plausible_request(raw, known_kafka=known) in (True, False)
    assert plausible_request(memoryview(raw)) == plausible_request(bytearray(raw))


@settings(max_examples=200, deadline=None)
@given(
    key=st.sampled_from(sorted(API_NAMES)),
    data=st.data(),
    cid=st.integers(0, 2**31 - 1),
    client_id=st.one_of(st.none(), st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp", "Cf", "Co", "Cn", "Zs")), max_size=40)),
)
def test_property_kio_headers_round_trip(key, data, cid, client_id):
    lo, hi = version_range(key)
    version = data.draw(st.integers(lo, hi))
    raw = kio_header(key, version, cid, client_id, v2=data.draw(st.booleans()))
    peek = peek_request_header(raw)
    assert peek is not None and (peek.api_key, peek.api_version, peek.correlation_id, peek.client_id) == (key, version, cid, client_id)
    assert plausible_request(raw)
