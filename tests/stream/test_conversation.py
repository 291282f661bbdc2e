"""Pairing, latency and protocol state, fed frames encoded by kio (not by us)."""

from __future__ import annotations

import datetime as dt

from kio.schema.api_versions.v3 import request as av3_req
from kio.schema.api_versions.v3 import response as av3_resp
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v1 import request as md1_req
from kio.schema.metadata.v1 import response as md1_resp
from kio.schema.produce.v9 import request as p9_req
from kio.schema.produce.v9 import response as p9_resp
from kio.schema.sasl_authenticate.v2 import request as sa2_req
from kio.schema.sasl_handshake.v0 import request as sh0_req
from kio.schema.sasl_handshake.v0 import response as sh0_resp
from kio.static.primitive import i16, i32, i32Timedelta, i64

from kwinspect.model import Endpoint, ErrorRow, Exchange
from kwinspect.stream.conversation import Conversation
from tests.stream.kio_frames import request_frame, response_frame

CLIENT = Endpoint("127.0.0.1", 50000)
BROKER = Endpoint("127.0.0.1", 9092)


def conv(**kw) -> Conversation:
    return Conversation(CLIENT, BROKER, **kw)


def split(events):
    return [e for e in events if isinstance(e, Exchange)], [e for e in events if isinstance(e, ErrorRow)]


def metadata_request(topics=("orders",)):
    return md1_req.MetadataRequest(topics=tuple(md1_req.MetadataRequestTopic(name=t) for t in topics))


def metadata_response(error_code=0, topic="orders"):
    return md1_resp.MetadataResponse(
        brokers=(md1_resp.MetadataResponseBroker(node_id=i32(1), host="127.0.0.1", port=i32(9092), rack=None),),
        controller_id=i32(1),
        topics=(md1_resp.MetadataResponseTopic(error_code=ErrorCode(error_code), name=topic, is_internal=False,
                                               partitions=()),),
    )


def produce_request(acks: int):
    return p9_req.ProduceRequest(
        transactional_id=None, acks=i16(acks), timeout=i32Timedelta.parse(dt.timedelta(seconds=1)),
        topic_data=(p9_req.TopicProduceData(name="orders", partition_data=(
            p9_req.PartitionProduceData(index=i32(0), records=None),)),),
    )


def produce_response(error_code=0):
    return p9_resp.ProduceResponse(
        responses=(p9_resp.TopicProduceResponse(name="orders", partition_responses=(
            p9_resp.PartitionProduceResponse(index=i32(0), error_code=ErrorCode(error_code), base_offset=i64(41),
                                             log_append_time=None,
                                             log_start_offset=i64(0), record_errors=(), error_message=None),)),),
        throttle_time=i32Timedelta.parse(dt.timedelta(milliseconds=7)),
    )


def test_pairs_by_correlation_id_and_measures_latency_from_last_request_byte():
    c = conv()
    c.on_request(request_frame(metadata_request(), 5), 10.0, 10.001)
    c.on_response(response_frame(metadata_response(), 5), 10.021, 10.030)
    (ex,), errors = split(c.pop_events())
    assert errors == []
    assert ex.status == "paired"
    assert (ex.api_name, ex.api_version, ex.correlation_id, ex.client_id) == ("Metadata", 1, 5, "kwinspect-test")
    assert round(ex.latency_ms, 6) == 20.0  # 10.021 - 10.001
    assert ex.response_last_ts == 10.030
    assert ex.topics == ["orders"]
    assert ex.response.body["brokers"][0]["host"] == "127.0.0.1"
    assert c.shared.brokers == {1: ("127.0.0.1", 9092)}
    assert ex.broker_id is None or ex.broker_id == 1


def test_pipelined_requests_pair_in_order():
    c = conv()
    for cid in (1, 2, 3):
        c.on_request(request_frame(metadata_request(), cid), cid, cid)
    for cid in (1, 2, 3):
        c.on_response(response_frame(metadata_response(), cid), 10 + cid, 10 + cid)
    exchanges, errors = split(c.pop_events())
    assert [e.correlation_id for e in exchanges] == [1, 2, 3]
    assert all(e.status == "paired" for e in exchanges) and errors == []


def test_error_codes_are_reported_with_their_location():
    c = conv()
    c.on_request(request_frame(produce_request(acks=1), 9), 1.0, 1.0)
    c.on_response(response_frame(produce_response(error_code=6), 9), 1.5, 1.5)
    (ex,), errors = split(c.pop_events())
    assert ex.error_codes == [6] and ex.error_names == ["NOT_LEADER_OR_FOLLOWER"]
    assert ex.throttle_time_ms == 7
    (err,) = errors
    assert (err.kind, err.code, err.name, err.retriable) == ("kafka_error", 6, "NOT_LEADER_OR_FOLLOWER", True)
    assert (err.topic, err.partition, err.api_name, err.correlation_id) == ("orders", 0, "Produce", 9)
    assert err.path == "responses[0].partition_responses[0].error_code"


def test_acks_zero_expects_no_response_but_pairs_one_if_it_comes():
    c = conv()
    c.on_request(request_frame(produce_request(acks=0), 1), 1.0, 1.0)
    c.on_request(request_frame(metadata_request(), 2), 2.0, 2.0)
    c.on_response(response_frame(metadata_response(), 2), 3.0, 3.0)
    exchanges, errors = split(c.pop_events())
    assert [(e.api_name, e.status) for e in exchanges] == [("Produce", "no_response_expected"), ("Metadata", "paired")]
    assert errors == []

    c = conv()
    c.on_request(request_frame(produce_request(acks=0), 1), 1.0, 1.0)
    c.on_response(response_frame(produce_response(), 1), 1.2, 1.2)  # a broker that answers anyway
    (ex,), _ = split(c.pop_events())
    assert ex.status == "paired" and ex.api_name == "Produce"


def test_unanswered_requests_at_close_are_response_missing():
    c = conv()
    c.on_request(request_frame(metadata_request(), 1), 1.0, 1.0)
    c.close(5.0)
    (ex,), (err,) = split(c.pop_events())
    assert ex.status == "response_missing" and ex.response is None
    assert err.kind == "response_missing" and err.correlation_id == 1


def test_response_without_request_is_request_missing_with_its_header():
    c = conv()
    c.on_response(response_frame(metadata_response(), 77), 1.0, 1.0)
    (ex,), (err,) = split(c.pop_events())
    assert ex.status == "request_missing" and ex.correlation_id == 77
    assert ex.response.header == {"correlation_id": 77}
    assert ex.response.body is None and ex.response.raw_body
    assert any("not captured" in i.message for i in ex.response.issues)
    assert err.kind == "request_missing"


def test_orphan_response_decoded_when_the_connection_used_one_api():
    c = conv()
    c.on_request(request_frame(metadata_request(), 1), 1.0, 1.0)
    c.on_response(response_frame(metadata_response(), 1), 1.1, 1.1)
    c.on_response(response_frame(metadata_response(topic="late"), 2), 2.0, 2.0)
    exchanges, _ = split(c.pop_events())
    assert exchanges[1].status == "request_missing"
    assert exchanges[1].api_name == "Metadata"
    assert exchanges[1].response.body["topics"][0]["name"] == "late"


def test_duplicate_correlation_id_is_reported():
    c = conv()
    c.on_request(request_frame(metadata_request(), 4), 1.0, 1.0)
    c.on_request(request_frame(metadata_request(), 4), 2.0, 2.0)
    c.on_response(response_frame(metadata_response(), 4), 3.0, 3.0)
    exchanges, errors = split(c.pop_events())
    assert "duplicate_correlation_id" in [e.kind for e in errors]
    assert sorted(e.status for e in exchanges) == ["paired", "response_missing"]


def test_out_of_order_response_is_reported():
    c = conv()
    c.on_request(request_frame(metadata_request(), 1), 1.0, 1.0)
    c.on_request(request_frame(metadata_request(), 2), 1.1, 1.1)
    c.on_response(response_frame(metadata_response(), 2), 2.0, 2.0)
    _exchanges, errors = split(c.pop_events())
    assert "out_of_order_response" in [e.kind for e in errors]


def test_requests_outside_the_advertised_versions_are_flagged():
    c = conv()
    c.on_request(request_frame(av3_req.ApiVersionsRequest(client_software_name="apache-kafka-java",
                                                          client_software_version="3.9.0"), 1), 1.0, 1.0)
    resp = av3_resp.ApiVersionsResponse(
        error_code=ErrorCode(0),
        api_keys=(av3_resp.ApiVersion(api_key=i16(3), min_version=i16(0), max_version=i16(0)),),
        throttle_time=i32Timedelta.parse(dt.timedelta(0)),
        supported_features=(), finalized_features_epoch=i64(-1), finalized_features=(),
        zk_migration_ready=False,
    )
    c.on_response(response_frame(resp, 1), 1.1, 1.1)
    assert c.advertised == {3: (0, 0)}
    assert c.client_software == ("apache-kafka-java", "3.9.0")
    c.on_request(request_frame(metadata_request(), 2), 2.0, 2.0)  # Metadata v1 > advertised v0
    _ex, errors = split(c.pop_events())
    flagged = [e for e in errors if e.kind == "version_not_advertised"]
    assert len(flagged) == 1 and "Metadata v1" in flagged[0].message and flagged[0].correlation_id == 2


def test_sasl_plain_after_handshake_v0_is_decoded_and_redacted():
    token = b"\x00alice\x00s3cret-password"
    c = conv()
    c.on_request(request_frame(sh0_req.SaslHandshakeRequest(mechanism="PLAIN"), 1), 1.0, 1.0)
    c.on_response(response_frame(sh0_resp.SaslHandshakeResponse(error_code=ErrorCode(0), mechanisms=("PLAIN",)), 1),
                  1.1, 1.1)
    c.on_request(token, 2.0, 2.0)  # raw token, no Kafka header
    c.on_response(b"", 2.1, 2.1)  # PLAIN success: an empty token
    c.on_request(request_frame(metadata_request(), 2), 3.0, 3.0)
    c.on_response(response_frame(metadata_response(), 2), 3.1, 3.1)
    exchanges, errors = split(c.pop_events())
    assert [e.api_name for e in exchanges] == ["SaslHandshake", "SaslToken", "Metadata"]
    sasl = exchanges[1].request.body
    assert sasl["mechanism"] == "PLAIN" and sasl["username"] == "alice"
    assert sasl["password"] == "<redacted>"
    assert "s3cret" not in repr(exchanges) and errors == []


def test_sasl_plain_password_kept_with_no_redact():
    c = conv(redact=False)
    c.on_request(request_frame(sh0_req.SaslHandshakeRequest(mechanism="PLAIN"), 1), 1.0, 1.0)
    c.on_response(response_frame(sh0_resp.SaslHandshakeResponse(error_code=ErrorCode(0), mechanisms=("PLAIN",)), 1),
                  1.1, 1.1)
    c.on_request(b"\x00alice\x00pw", 2.0, 2.0)
    c.on_response(b"", 2.1, 2.1)
    exchanges, _ = split(c.pop_events())
    assert exchanges[1].request.body["password"] == "pw"


def test_sasl_authenticate_scram_proof_is_redacted():
    c = conv()
    c.sasl_mechanism = "SCRAM-SHA-256"
    final = b"c=biws,r=abcdef,p=dHpbWHBQ0bG9vc2VQcm9vZg=="
    c.on_request(request_frame(sa2_req.SaslAuthenticateRequest(auth_bytes=final), 3), 1.0, 1.0)
    c.close(2.0)
    exchanges, _ = split(c.pop_events())
    rendered = exchanges[0].request.body["auth_bytes"]
    assert "p=<redacted>" in rendered["message"] and "dHpb" not in repr(rendered)


def test_requests_sharing_a_segment_timestamp_pair_in_arrival_order():
    # Two requests in one TCP segment carry the same capture timestamp; the
    # broker answers in request order, so neither is out of order.
    c = conv()
    c.on_request(request_frame(produce_request(acks=1), 2), 5.0, 5.0)
    c.on_request(request_frame(metadata_request(), 3), 5.0, 5.0)
    c.on_response(response_frame(produce_response(), 2), 5.1, 5.1)
    c.on_response(response_frame(metadata_response(), 3), 5.2, 5.2)
    exchanges, errors = split(c.pop_events())
    assert [(e.api_name, e.correlation_id, e.status) for e in exchanges] == [
        ("Produce", 2, "paired"), ("Metadata", 3, "paired")]
    assert errors == []
