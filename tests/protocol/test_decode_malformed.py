"""Bad bytes never raise: the decoder returns a partial decode plus an Issue
carrying the byte offset and the field path where decoding stopped.

Frames are built by hand with struct.pack (so offsets are known independently
of the decoder) or encoded by kio (an independent encoder), then cut,
corrupted, or replaced with random bytes.
"""

from __future__ import annotations

import io
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as ResponseHeaderV1
from kio.serial import entity_writer

from kwinspect.model import (
    DECODE_ERROR,
    SEVERITY_ERROR,
    TRAILING_BYTES,
    UNKNOWN_API_KEY,
    UNSUPPORTED_VERSION,
    Message,
)
from kwinspect.protocol import decode_request, decode_response
from kwinspect.protocol.schema.index import APIS

# ---------------------------------------------------------------------------
# Hand-built wire pieces (grammar from the protocol guide)
# ---------------------------------------------------------------------------


def i8(v):
    return struct.pack(">b", v)


def i16(v):
    return struct.pack(">h", v)


def i32(v):
    return struct.pack(">i", v)


def i64(v):
    return struct.pack(">q", v)


def string(s):
    raw = s.encode()
    return i16(len(raw)) + raw


def uvarint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def compact_string(s):
    raw = s.encode()
    return uvarint(len(raw) + 1) + raw


def req_header(api_key, version, corr=1, client="c", tagged=False):
    head = i16(api_key) + i16(version) + i32(corr) + string(client)
    return head + (b"\x00" if tagged else b"")


def assert_never_raises(msg: Message) -> None:
    assert isinstance(msg, Message)
    assert not any(i.kind == "internal_error" for i in msg.issues), [i.as_dict() for i in msg.issues]


def decode_error(msg: Message):
    errors = [i for i in msg.issues if i.kind == DECODE_ERROR]
    assert errors, f"expected a decode_error, got {[i.as_dict() for i in msg.issues]}"
    return errors[0]


# ---------------------------------------------------------------------------
# Real frames (kio-encoded) truncated at every byte
# ---------------------------------------------------------------------------


def _kio_frame(module: str, cls_name: str, direction: str, **fields) -> tuple[bytes, int, int]:
    import importlib

    cls = getattr(importlib.import_module(module), cls_name)
    entity = cls(**fields)
    buf = io.BytesIO()
    if direction == "request":
        hcls = RequestHeaderV2 if cls.__flexible__ else RequestHeaderV1
        entity_writer(hcls)(buf, hcls(request_api_key=cls.__api_key__, request_api_version=cls.__version__,
                                      correlation_id=42, client_id="trunc"))
    else:
        hcls = ResponseHeaderV1 if cls.__flexible__ and cls.__api_key__ != 18 else ResponseHeaderV0
        entity_writer(hcls)(buf, hcls(correlation_id=42))
    entity_writer(cls)(buf, entity)
    return buf.getvalue(), int(cls.__api_key__), int(cls.__version__)


def _real_frames():
    import kio.schema.api_versions.v3.request as avq
    import kio.schema.api_versions.v3.response as avr
    import kio.schema.fetch.v12.response as fr
    import kio.schema.metadata.v12.response as mr
    import kio.schema.produce.v9.request as pr
    from kio.schema.errors import ErrorCode
    from kio.static.primitive import i16 as k16
    from kio.static.primitive import i32 as k32
    from kio.static.primitive import i32Timedelta
    from kio.static.primitive import i64 as k64

    batch = bytes.fromhex(  # a v2 record batch header with no records is enough here
        "0000000000000000" "00000031" "00000000" "02" "00000000" "0000" "00000000"
        "0000018bcfe56800" "0000018bcfe56800" "ffffffffffffffff" "ffff" "ffffffff" "00000000"
    )
    frames = {
        "produce-v9-request": _kio_frame(
            "kio.schema.produce.v9.request", "ProduceRequest", "request",
            transactional_id="tx", acks=k16(-1), timeout=i32Timedelta.parse(__import__("datetime").timedelta(seconds=30)),
            topic_data=(pr.TopicProduceData(name="topic", partition_data=(
                pr.PartitionProduceData(index=k32(0), records=batch),)),)),
        "metadata-v12-response": _kio_frame(
            "kio.schema.metadata.v12.response", "MetadataResponse", "response",
            throttle_time=i32Timedelta.parse(__import__("datetime").timedelta(0)),
            brokers=(mr.MetadataResponseBroker(node_id=k32(1), host="broker-1", port=k32(9092), rack=None),),
            cluster_id="cluster", controller_id=k32(1),
            topics=(mr.MetadataResponseTopic(error_code=ErrorCode.none, name="t", topic_id=None,
                                             is_internal=False, partitions=(
                mr.MetadataResponsePartition(error_code=ErrorCode.none, partition_index=k32(0),
                                             leader_id=k32(1), leader_epoch=k32(5), replica_nodes=(k32(1),),
                                             isr_nodes=(k32(1),), offline_replicas=()),),
                topic_authorized_operations=k32(-2147483648)),)),
        "fetch-v12-response": _kio_frame(
            "kio.schema.fetch.v12.response", "FetchResponse", "response",
            throttle_time=i32Timedelta.parse(__import__("datetime").timedelta(0)),
            error_code=ErrorCode.none, session_id=k32(0),
            responses=(fr.FetchableTopicResponse(topic="t", partitions=(
                fr.PartitionData(partition_index=k32(0), error_code=ErrorCode.none, high_watermark=k64(10),
                                 last_stable_offset=k64(10), log_start_offset=k64(0),
                                 aborted_transactions=(), preferred_read_replica=k32(-1),
                                 records=batch),)),)),
        "api_versions-v3-request": _kio_frame(
            "kio.schema.api_versions.v3.request", "ApiVersionsRequest", "request",
            client_software_name="apache-kafka-java", client_software_version="3.0.0"),
        "api_versions-v3-response": _kio_frame(
            "kio.schema.api_versions.v3.response", "ApiVersionsResponse", "response",
            error_code=ErrorCode.none, api_keys=(avr.ApiVersion(api_key=k16(0), min_version=k16(0),
                                                                max_version=k16(9)),),
            throttle_time=i32Timedelta.parse(__import__("datetime").timedelta(0))),
    }
    assert avq  # imported for the module path only
    # Old (non-flexible) layouts, hand-built.
    frames["metadata-v0-request"] = (req_header(3, 0) + i32(2) + string("a") + string("bb"), 3, 0)
    frames["produce-v3-request"] = (
        req_header(0, 3) + i16(-1) + i16(1) + i32(1000) + i32(1) + string("t") + i32(1) + i32(0)
        + i32(len(batch)) + batch, 0, 3)
    return frames


REAL_FRAMES = _real_frames()


@pytest.mark.parametrize("name", sorted(REAL_FRAMES))
def test_real_frame_decodes_cleanly(name):
    frame, api_key, version = REAL_FRAMES[name]
    msg = decode_request(frame) if "request" in name else decode_response(frame, api_key, version)
    assert msg.issues == [], [i.as_dict() for i in msg.issues]


@pytest.mark.parametrize("name", sorted(REAL_FRAMES))
def test_truncated_at_every_byte(name):
    frame, api_key, version = REAL_FRAMES[name]
    is_request = "request" in name
    header_len = None
    for cut in range(len(frame)):
        part = frame[:cut]
        msg = decode_request(part) if is_request else decode_response(part, api_key, version)
        assert_never_raises(msg)
        err = decode_error(msg)
        assert err.severity == SEVERITY_ERROR
        assert isinstance(err.offset, int) and 0 <= err.offset <= cut, (cut, err.as_dict())
        assert err.path, (cut, err.as_dict())
        if err.path.startswith("header"):
            assert msg.body in (None, {}), cut
        else:
            # Header complete: it is kept, and the body holds what was decoded so far.
            header_len = header_len or cut
            corr = struct.unpack_from(">i", frame, 4 if is_request else 0)[0]
            assert msg.header.get("correlation_id") == corr, cut
            assert isinstance(msg.body, dict), cut
    assert header_len is not None  # some cut got past the header


def test_truncation_keeps_partial_body_and_names_the_field():
    frame, _, _ = REAL_FRAMES["metadata-v0-request"]
    # header 11 bytes, count 4, "a" = 3 bytes, then "bb": cut inside its length
    msg = decode_request(frame[:11 + 4 + 3 + 1])
    err = decode_error(msg)
    assert err.path == "topics[1].name"
    assert err.offset == 18
    # The complete first topic is kept; the second is the partial struct it reached.
    assert msg.body["topics"][0] == {"name": "a"}
    assert msg.body["topics"][1:] in ([], [{}])


# ---------------------------------------------------------------------------
# Corrupted lengths
# ---------------------------------------------------------------------------

META0 = req_header(3, 0)  # 11 bytes
PRODUCE3 = req_header(0, 3) + i16(-1) + i16(1) + i32(1000)  # transactional_id null


@pytest.mark.parametrize(("frame", "offset", "path"), [
    pytest.param(META0 + i32(2**31 - 1) + string("a"), 11, "topics", id="array-count-2^31-1"),
    pytest.param(META0 + i32(-2**31), 11, "topics", id="array-count-min-int"),
    pytest.param(META0 + i32(-5) + string("a"), 11, "topics", id="negative-array-count"),
    pytest.param(META0 + i32(-1), 11, "topics", id="null-in-non-nullable-array"),
    pytest.param(META0 + i32(1) + i16(0x7FFF) + b"abc", 15, "topics[0]", id="huge-string-length"),
    pytest.param(META0 + i32(1) + i16(-2) + b"abc", 15, "topics[0]", id="negative-string-length"),
    pytest.param(META0 + i32(1) + i16(2) + b"\xff\xfe", 15, "topics[0]", id="invalid-utf8"),
    pytest.param(PRODUCE3 + i32(1) + string("t") + i32(1) + i32(0) + i32(2**31 - 1) + b"x" * 20,
                 34, "topic_data[0].partition_data[0].records", id="huge-records-length"),
    pytest.param(PRODUCE3 + i32(1) + string("t") + i32(1) + i32(0) + i32(-7),
                 34, "topic_data[0].partition_data[0].records", id="negative-records-length"),
    pytest.param(req_header(36, 0) + i32(2**31 - 1) + b"pw", 11, "auth_bytes", id="huge-bytes-length"),
    # Flexible (compact) forms: Metadata v12 request, header v2 is 12 bytes.
    pytest.param(req_header(3, 12, tagged=True) + b"\xff\xff\xff\xff\x0f" + b"\x00" * 8,
                 12, "topics", id="compact-array-count-2^32"),
    pytest.param(req_header(3, 12, tagged=True) + b"\xff\xff\xff\xff\xff\xff\x01",
                 12, "topics", id="varint-longer-than-5-bytes"),
    pytest.param(req_header(3, 12, tagged=True) + b"\x02" + b"\x00" * 16 + b"\xff\xff\x03abc",
                 29, "topics[0].name", id="compact-string-huge"),
    pytest.param(req_header(3, 12, tagged=True) + b"\x01\x00\x00" + b"\x05" + b"\x00",
                 15, "_tagged_fields", id="tagged-field-count-too-big"),
    pytest.param(req_header(3, 12, tagged=True) + b"\x01\x00\x00" + b"\x01\x07\x7f" + b"ab",
                 16, "_tagged_fields", id="tagged-field-size-past-end"),
])
def test_corrupted_lengths(frame, offset, path):
    msg = decode_request(frame)
    assert_never_raises(msg)
    err = decode_error(msg)
    assert err.offset == offset, err.as_dict()
    assert err.path == path or err.path.startswith(path + "."), err.as_dict()
    assert msg.header["correlation_id"] == 1


# ---------------------------------------------------------------------------
# Random bytes
# ---------------------------------------------------------------------------

FUZZ = settings(max_examples=150, deadline=None, database=None)


@FUZZ
@given(st.binary(max_size=200))
def test_random_bytes_as_request(data):
    msg = decode_request(data)
    assert_never_raises(msg)
    for issue in msg.issues:
        if issue.kind == DECODE_ERROR:
            assert isinstance(issue.offset, int) and 0 <= issue.offset <= len(data)
            assert issue.path


@FUZZ
@given(st.sampled_from(sorted(APIS)), st.integers(0, 20), st.binary(max_size=200))
def test_random_body_after_a_valid_header(api_key, version, body):
    """Random bodies behind real headers reach deep into the schema readers."""
    flexible_header = req_header(api_key, version, tagged=True)
    for frame in (req_header(api_key, version) + body, flexible_header + body):
        msg = decode_request(frame)
        assert_never_raises(msg)
        for issue in msg.issues:
            if issue.kind == DECODE_ERROR:
                assert isinstance(issue.offset, int) and 0 <= issue.offset <= len(frame)
                assert issue.path


@FUZZ
@given(st.integers(-3, 100), st.integers(-1, 20), st.binary(max_size=200))
def test_random_bytes_as_response(api_key, version, data):
    msg = decode_response(data, api_key, version)
    assert_never_raises(msg)
    for issue in msg.issues:
        if issue.kind == DECODE_ERROR:
            assert isinstance(issue.offset, int) and 0 <= issue.offset <= len(data)
            assert issue.path


# ---------------------------------------------------------------------------
# Unknown api keys, unsupported versions, trailing bytes
# ---------------------------------------------------------------------------


def test_unknown_api_key_request_keeps_header_and_raw_body():
    body = b"\x01\x02\x03opaque"
    # Any key above our tables is newer than KIP-482, hence flexible: header v2.
    frame = req_header(999, 4, corr=77, client="cli", tagged=True) + body
    msg = decode_request(frame)
    assert_never_raises(msg)
    assert msg.header == {"request_api_key": 999, "request_api_version": 4,
                          "correlation_id": 77, "client_id": "cli"}
    assert msg.body is None
    assert msg.raw_body == body
    assert [i.kind for i in msg.issues] == [UNKNOWN_API_KEY]


def test_unknown_api_key_response_keeps_raw_body():
    # Header v1 (correlation id + tag count), like every API newer than flexible versions.
    frame = i32(77) + b"\x00" + b"\x00\x05hello"
    msg = decode_response(frame, 999, 0)
    assert_never_raises(msg)
    assert msg.header == {"correlation_id": 77}
    assert msg.body is None
    assert msg.raw_body == b"\x00\x05hello"
    assert [i.kind for i in msg.issues] == [UNKNOWN_API_KEY]


def test_version_above_known_max_is_decoded_best_effort():
    top = APIS[3][2]  # Metadata's highest known version
    future = top + 50
    # Metadata v(top) body: topics [ {topic_id uuid, name compact string, tags} ],
    # allow_auto_topic_creation, include_topic_authorized_operations, tags.
    body = b"\x02" + b"\x00" * 16 + compact_string("orders") + b"\x00" + b"\x01" + b"\x00" + b"\x00"
    msg = decode_request(req_header(3, future, corr=5, tagged=True) + body)
    assert_never_raises(msg)
    assert msg.api_version == future
    assert msg.decoded_version == top
    kinds = [i.kind for i in msg.issues]
    assert UNSUPPORTED_VERSION in kinds and DECODE_ERROR not in kinds
    assert msg.body["topics"][0]["name"] == "orders"
    assert msg.body["allow_auto_topic_creation"] is True


def test_response_version_above_known_max():
    top = APIS[12][2]  # Heartbeat
    frame = i32(9) + b"\x00" + i32(0) + i16(27) + b"\x00"  # header v1, throttle, error 27, tags
    msg = decode_response(frame, 12, top + 1)
    assert msg.decoded_version == top
    assert UNSUPPORTED_VERSION in [i.kind for i in msg.issues]
    assert msg.body == {"throttle_time_ms": 0, "error_code": 27}


@pytest.mark.parametrize("extra", [b"\x00", b"\xde\xad\xbe\xef"])
def test_trailing_bytes_are_reported(extra):
    frame = META0 + i32(1) + string("a")
    msg = decode_request(frame + extra)
    assert msg.body == {"topics": [{"name": "a"}]}
    trailing = [i for i in msg.issues if i.kind == TRAILING_BYTES]
    assert len(trailing) == 1 and trailing[0].offset == len(frame)
    resp = decode_response(i32(3) + i32(0) + i16(0) + extra, 12, 1)  # Heartbeat v1 response
    assert [i.kind for i in resp.issues] == [TRAILING_BYTES]
    assert resp.issues[0].offset == 10


# ---------------------------------------------------------------------------
# Header rules
# ---------------------------------------------------------------------------


def test_api_versions_v0_layout_error_answer_to_a_v3_request():
    # The broker does not know v3: error 35 in the v0 body layout, header v0.
    frame = i32(11) + i16(35) + i32(1) + i16(18) + i16(0) + i16(2)
    msg = decode_response(frame, 18, 3)
    assert_never_raises(msg)
    assert msg.header == {"correlation_id": 11}
    assert msg.body == {"error_code": 35, "api_keys": [{"api_key": 18, "min_version": 0, "max_version": 2}]}
    assert msg.api_version == 3
    assert msg.decoded_version == 0
    assert [i.kind for i in msg.issues] == [UNSUPPORTED_VERSION]
    assert msg.ok  # informational, not an error


def test_api_versions_response_header_is_always_v0():
    # A flexible (v3) body right after a v0 header (no tag byte after the correlation id).
    body = (i16(0) + uvarint(2) + i16(3) + i16(0) + i16(12) + b"\x00"  # api_keys [Metadata 0-12]
            + i32(0) + b"\x00")  # throttle, no tags
    msg = decode_response(i32(21) + body, 18, 3)
    assert msg.issues == []
    assert msg.header == {"correlation_id": 21}
    assert msg.body["api_keys"] == [{"api_key": 3, "min_version": 0, "max_version": 12}]
    assert msg.body["throttle_time_ms"] == 0


def test_flexible_response_header_has_tagged_fields():
    # Heartbeat v4 response: header v1 (correlation id + tag byte).
    msg = decode_response(i32(8) + b"\x00" + i32(100) + i16(0) + b"\x00", 12, 4)
    assert msg.issues == []
    assert msg.header == {"correlation_id": 8}
    assert msg.body == {"throttle_time_ms": 100, "error_code": 0}


def test_controlled_shutdown_v0_request_header_has_no_client_id():
    frame = i16(7) + i16(0) + i32(3) + i32(1001)  # header v0, then broker_id
    msg = decode_request(frame)
    assert msg.issues == []
    assert msg.header["correlation_id"] == 3
    assert msg.header.get("client_id") is None
    assert msg.body == {"broker_id": 1001}


def test_controlled_shutdown_v1_request_has_client_id():
    msg = decode_request(req_header(7, 1, corr=4, client="ctl") + i32(1002))
    assert msg.issues == []
    assert msg.header["client_id"] == "ctl"
    assert msg.body == {"broker_id": 1002}


def test_null_client_id():
    frame = i16(3) + i16(0) + i32(1) + i16(-1) + i32(0)
    msg = decode_request(frame)
    assert msg.issues == []
    assert msg.header["client_id"] is None
    assert msg.body == {"topics": []}


def test_unknown_tagged_fields_are_kept():
    # Metadata v12 request with a known tag absent and an unknown tag 9 of 3 bytes.
    frame = req_header(3, 12, tagged=True) + b"\x01\x00\x00" + b"\x01" + uvarint(9) + uvarint(3) + b"xyz"
    msg = decode_request(frame)
    assert msg.issues == []
    assert msg.body["_unknown_tags"] == {9: b"xyz"}
    assert msg.body["topics"] == []


def test_nullable_arrays_and_strings():
    # Metadata v1 request: topics is nullable (-1 = all topics).
    msg = decode_request(req_header(3, 1) + i32(-1))
    assert msg.issues == [] and msg.body == {"topics": None}
    # Metadata v12: compact null array (0) and empty array (1).
    for raw, want in ((b"\x00", None), (b"\x01", [])):
        msg = decode_request(req_header(3, 12, tagged=True) + raw + b"\x00\x00\x00")
        assert msg.issues == [] and msg.body["topics"] == want


def test_short_frames_never_raise():
    for n in range(12):
        frame = (req_header(3, 0) + i32(0))[:n]
        assert_never_raises(decode_request(frame))
        assert_never_raises(decode_response(frame, 3, 0))
        assert_never_raises(decode_response(memoryview(frame), 18, 3))


def test_tag_only_fields_are_absent_before_their_tagged_versions():
    # TransactionLogValue v0 (not flexible): PreviousProducerId & co. declare only
    # "taggedVersions": "1+", so v0 holds just the regular fields, in order.
    from kwinspect.protocol import decode_struct

    value = (i64(555) + i16(2) + i32(60000) + i8(2) + i32(1) + string("orders") + i32(2) + i32(0) + i32(1)
             + i64(1_700_000_000_005) + i64(1_700_000_000_000))
    body, issues = decode_struct("TransactionLogValue", 0, value)
    assert issues == []
    assert body == {"producer_id": 555, "producer_epoch": 2, "transaction_timeout_ms": 60000,
                    "transaction_status": 2,
                    "transaction_partitions": [{"topic": "orders", "partition_ids": [0, 1]}],
                    "transaction_last_update_timestamp_ms": 1_700_000_000_005,
                    "transaction_start_timestamp_ms": 1_700_000_000_000}
    # v1 is flexible: with no tags written, the tagged fields take their defaults.
    v1 = (i64(555) + i16(2) + i32(60000) + i8(2) + uvarint(2) + compact_string("orders") + uvarint(2)
          + i32(7) + b"\x00" + i64(5) + i64(6) + b"\x00")
    body, issues = decode_struct("TransactionLogValue", 1, v1)
    assert issues == []
    assert body["previous_producer_id"] == -1 and body["next_producer_epoch"] == -1
    assert body["client_transaction_version"] == 0
    assert body["transaction_partitions"] == [{"topic": "orders", "partition_ids": [7]}]


def test_garbage_versions_do_not_grow_the_reader_cache():
    """Random version numbers (non-Kafka bytes, resync guesses) reuse the nearest
    version's compiled readers instead of compiling and caching one per number."""
    from kwinspect.protocol import decode as decode_module
    from kwinspect.protocol import decode_struct

    def garbage(version: int) -> None:
        msg = decode_request(req_header(1, version, tagged=True) + b"\x00" * 40)
        assert msg.decoded_version == APIS[1][2]
        decode_response(i32(1) + b"\x00" * 20, 3, version)
        decode_struct("TransactionLogValue", version, b"")

    # the first garbage version compiles the nearest versions' readers (unless a test
    # before this one did): measured after it, so the count holds in any order, alone too
    garbage(200)
    before = len(decode_module._compiled)
    for version in range(201, 1200):
        garbage(version)
    assert len(decode_module._compiled) == before


# ---------------------------------------------------------------------------
# Primitives used outside the schema tables (record fields, tags)
# ---------------------------------------------------------------------------

# Zig-zag pairs from the protobuf encoding spec: (signed value, unsigned encoding).
ZIGZAG = [(0, 0), (-1, 1), (1, 2), (-2, 3), (2147483647, 4294967294), (-2147483648, 4294967295)]


@pytest.mark.parametrize(("value", "zigzag"), ZIGZAG)
def test_varint_and_varlong_zigzag(value, zigzag):
    from kwinspect.protocol import primitives as p

    raw = b"pad" + uvarint(zigzag) + b"tail"
    assert p.read_varint(raw, 3) == (value, 3 + len(uvarint(zigzag)))
    assert p.read_varlong(raw, 3) == (value, 3 + len(uvarint(zigzag)))
    big = -(2**63)
    assert p.read_varlong(uvarint(2**64 - 1), 0) == (big, 10)


def test_varint_length_limits_and_truncation():
    from kwinspect.protocol import primitives as p
    from kwinspect.protocol.primitives import DecodeStop

    with pytest.raises(DecodeStop) as stop:
        p.read_varint(b"\x80\x80\x80\x80\x80\x01", 0)  # 6 bytes for a 32-bit varint
    assert stop.value.offset == 0
    with pytest.raises(DecodeStop):
        p.read_varlong(b"\x80" * 10 + b"\x01", 0)  # 11 bytes for a 64-bit varint
    with pytest.raises(DecodeStop) as stop:
        p.read_uvarint(b"xx\x80\x80", 2)  # runs past the end
    assert stop.value.offset == 2


def test_fixed_width_primitives():
    from kwinspect.protocol import primitives as p

    raw = (struct.pack(">bhHiIqd", -128, -32768, 65535, -(2**31), 2**32 - 1, -(2**63), -0.5)
           + b"\x02" + bytes(range(16)))
    pos = 0
    got = []
    for reader in (p.read_int8, p.read_int16, p.read_uint16, p.read_int32, p.read_uint32,
                   p.read_int64, p.read_float64, p.read_bool, p.read_uuid):
        value, pos = reader(raw, pos)
        got.append(value)
    assert got[:7] == [-128, -32768, 65535, -(2**31), 2**32 - 1, -(2**63), -0.5]
    assert got[7] is True  # any non-zero byte is true
    assert got[8] == "AAECAwQFBgcICQoLDA0ODw"  # URL-safe base64 of 00..0f, no padding
    assert pos == len(raw)


@pytest.mark.parametrize("size", [4, 9])
def test_known_tag_with_a_wrong_size_is_kept_raw_with_a_warning(size):
    # ApiVersions v3 response; tag 1 is FinalizedFeaturesEpoch (int64, 8 bytes).
    payload = bytes(range(size))
    frame = (i32(5) + i16(0) + uvarint(1) + i32(0)
             + uvarint(1) + uvarint(1) + uvarint(size) + payload)
    msg = decode_response(frame, 18, 3)
    assert_never_raises(msg)
    assert msg.body["_unknown_tags"] == {1: payload}
    assert msg.body["finalized_features_epoch"] == -1  # the declared default
    assert [(i.kind, i.severity, i.path) for i in msg.issues] == [(DECODE_ERROR, "warning", "finalized_features_epoch")]
    assert not [i for i in msg.issues if i.severity == SEVERITY_ERROR]
