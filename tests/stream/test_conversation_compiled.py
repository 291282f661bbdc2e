"""The compiled conversation (stream/_cconv.c) gives exactly what the Python methods give.

Frames encoded by kio and record batches by kafka-python (encoders we did not write) go
through a real Dissector as TCP segments, once with the compiled walk and once without it
(the Python methods alone, the reference): the rows and every piece of conversation state
must be equal after every segment. The unusual cases the C leaves to Python (SASL,
secrets, out-of-order, orphans, duplicates, acks=0, the pending-bytes budget, versions not
advertised, max in flight, decode issues, error codes, frame hooks) each get a test that
shows the user's rows and that Python took the frame.
"""

from __future__ import annotations

import datetime as dt
import random
from functools import cache

import pytest
from helpers.cores import require_compiled
from helpers.pcapgen import conversation as tcp_conversation
from helpers.pcapgen import mangle
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder
from kio.schema.api_versions.v3 import request as av3_req
from kio.schema.api_versions.v3 import response as av3_resp
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12 import request as f_req
from kio.schema.fetch.v12 import response as f_resp
from kio.schema.metadata.v1 import request as md1_req
from kio.schema.metadata.v1 import response as md1_resp
from kio.schema.produce.v9 import request as p9_req
from kio.schema.produce.v9 import response as p9_resp
from kio.schema.sasl_authenticate.v2 import request as sa2_req
from kio.schema.sasl_authenticate.v2 import response as sa2_resp
from kio.schema.sasl_handshake.v0 import request as sh0_req
from kio.schema.sasl_handshake.v0 import response as sh0_resp
from kio.static.primitive import i8, i16, i32, i32Timedelta, i64, i64Timedelta

from kwinspect.dissect import DissectConfig, Dissector
from kwinspect.model import Endpoint, Exchange
from kwinspect.stream import conversation
from kwinspect.stream.conversation import Conversation
from tests.stream.kio_frames import request_frame, response_frame

CLIENT = Endpoint("10.0.0.1", 40000)
BROKER = Endpoint("10.0.0.2", 9092)
NO_THROTTLE = i32Timedelta.parse(dt.timedelta(0))


@pytest.fixture(autouse=True)
def _compiled():
    require_compiled()


# -- frames -----------------------------------------------------------------------------------


def _batch(n: int) -> bytes:
    b = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 20)
    for i in range(n):
        b.append(i, timestamp=1_700_000_000_000 + i, key=b"k%d" % i, value=b"v" * (i + 1), headers=[])
    return bytes(b.build())


def produce_request(acks: int = 1, records: bytes | None = None, topic: str = "orders"):
    return p9_req.ProduceRequest(
        transactional_id=None, acks=i16(acks), timeout=i32Timedelta.parse(dt.timedelta(seconds=1)),
        topic_data=(p9_req.TopicProduceData(name=topic, partition_data=(
            p9_req.PartitionProduceData(index=i32(0), records=records),)),))


def produce_response(error_code: int = 0, throttle_ms: int = 7):
    return p9_resp.ProduceResponse(
        responses=(p9_resp.TopicProduceResponse(name="orders", partition_responses=(
            p9_resp.PartitionProduceResponse(index=i32(0), error_code=ErrorCode(error_code), base_offset=i64(41),
                                             log_append_time=None, log_start_offset=i64(0), record_errors=(),
                                             error_message=None),)),),
        throttle_time=i32Timedelta.parse(dt.timedelta(milliseconds=throttle_ms)))


def fetch_request(max_wait_ms: int = 500):
    return f_req.FetchRequest(
        cluster_id=None, replica_id=i32(-1), max_wait=i32Timedelta.parse(dt.timedelta(milliseconds=max_wait_ms)),
        min_bytes=i32(1), max_bytes=i32(1 << 20), isolation_level=i8(0), session_id=i32(7), session_epoch=i32(3),
        topics=(f_req.FetchTopic(topic="orders", partitions=(f_req.FetchPartition(
            partition=i32(0), current_leader_epoch=i32(-1), fetch_offset=i64(0), last_fetched_epoch=i32(-1),
            log_start_offset=i64(-1), partition_max_bytes=i32(1 << 20)),)),),
        forgotten_topics_data=(), rack_id="")


def fetch_response(records: bytes | None = None, error_code: int = 0):
    return f_resp.FetchResponse(
        throttle_time=NO_THROTTLE, error_code=ErrorCode(0), session_id=i32(7),
        responses=(f_resp.FetchableTopicResponse(topic="orders", partitions=(
            f_resp.PartitionData(partition_index=i32(0), error_code=ErrorCode(error_code), high_watermark=i64(5),
                                 last_stable_offset=i64(5), log_start_offset=i64(0),
                                 diverging_epoch=f_resp.EpochEndOffset(epoch=i32(-1), end_offset=i64(-1)),
                                 current_leader=f_resp.LeaderIdAndEpoch(leader_id=i32(-1), leader_epoch=i32(-1)),
                                 snapshot_id=f_resp.SnapshotId(end_offset=i64(-1), epoch=i32(-1)),
                                 aborted_transactions=(), preferred_read_replica=i32(-1), records=records),)),))


def metadata_request(topics=("orders",)):
    return md1_req.MetadataRequest(topics=tuple(md1_req.MetadataRequestTopic(name=t) for t in topics))


def metadata_response():
    return md1_resp.MetadataResponse(
        brokers=(md1_resp.MetadataResponseBroker(node_id=i32(1), host="10.0.0.2", port=i32(9092), rack=None),),
        controller_id=i32(1),
        topics=(md1_resp.MetadataResponseTopic(error_code=ErrorCode(0), name="orders", is_internal=False,
                                               partitions=()),))


def api_versions_response(produce=(0, 9)):
    keys = ((0, *produce), (1, 0, 12), (3, 0, 12), (17, 0, 1), (18, 0, 3), (36, 0, 2))
    return av3_resp.ApiVersionsResponse(
        error_code=ErrorCode(0),
        api_keys=tuple(av3_resp.ApiVersion(api_key=i16(k), min_version=i16(lo), max_version=i16(hi))
                       for k, lo, hi in keys),
        throttle_time=NO_THROTTLE, supported_features=(), finalized_features_epoch=i64(-1), finalized_features=(),
        zk_migration_ready=False)


API_VERSIONS_REQUEST = av3_req.ApiVersionsRequest(client_software_name="kio", client_software_version="1.0")


@cache
def request_of(kind: str, cid: int) -> bytes:
    entity = {
        "produce": lambda: produce_request(records=_batch(3)),
        "produce_none": lambda: produce_request(records=None),
        "produce_acks0": lambda: produce_request(acks=0, records=_batch(1)),
        "fetch": fetch_request,
        "fetch_short": lambda: fetch_request(max_wait_ms=1),
        "metadata": metadata_request,
        "api_versions": lambda: API_VERSIONS_REQUEST,
        "sasl_handshake": lambda: sh0_req.SaslHandshakeRequest(mechanism="PLAIN"),
        "sasl_authenticate": lambda: sa2_req.SaslAuthenticateRequest(auth_bytes=b"\x00alice\x00s3cret"),
    }[kind]()
    return request_frame(entity, cid)


@cache
def response_of(kind: str, cid: int) -> bytes:
    entity = {
        "produce": produce_response,
        "produce_error": lambda: produce_response(error_code=6),
        "fetch": lambda: fetch_response(records=_batch(2)),
        "fetch_empty": fetch_response,
        "fetch_error": lambda: fetch_response(error_code=1),
        "metadata": metadata_response,
        "api_versions": api_versions_response,
        "api_versions_narrow": lambda: api_versions_response(produce=(3, 8)),
        "sasl_handshake": lambda: sh0_resp.SaslHandshakeResponse(error_code=ErrorCode(0), mechanisms=("PLAIN",)),
        "sasl_authenticate": lambda: sa2_resp.SaslAuthenticateResponse(
            error_code=ErrorCode(0), error_message=None, auth_bytes=b"",
            session_lifetime=i64Timedelta.parse(dt.timedelta(0))),
    }[kind]()
    return response_frame(entity, cid)


def framed(frame: bytes) -> bytes:
    return len(frame).to_bytes(4, "big") + frame


# -- running a capture through a Dissector, with or without the compiled walk -------------------


def conv_state(conv: Conversation) -> tuple:
    """Everything on_request / on_response / emit write."""
    shared = conv.shared
    pending = [(cid, _msg(p.message), p.ts_first, p.ts_last, p.no_response_expected, p.pkt_first, p.pkt_last,
                p.frame, p.counted) for cid, p in conv._pending.items()]
    return (pending, conv.requests, conv.responses, conv.frame_packets, conv.last_correlation_id,
            sorted(conv._api_versions_seen), conv.advertised, conv.client_software, conv.sasl_mechanism,
            conv._sasl_raw, list(conv._sasl_pending), dict(conv._issue_counts), len(conv._events),
            shared.exchange_counter, shared.pending_bytes, dict(shared.brokers), dict(shared.topic_names),
            dict(shared._broker_ids), shared._brokers_seen)


def _msg(m) -> tuple | None:
    if m is None:
        return None
    return (type(m).__name__, m.is_request, m.api_key, m.api_version, m.header, repr(m.body),
            [repr(i) for i in m.issues], m.raw_body, m.size, m.decoded_version)


def _event(ev) -> tuple:
    if type(ev) is Exchange:
        return ("exchange", {**ev.row(), "broker_id": ev.broker_id}, ev.response_last_ts, ev.order, ev.index, _msg(ev.request), _msg(ev.response))
    return ("error", ev.row())


def run(messages: list[tuple[str, bytes]], *, compiled: bool, config: DissectConfig | None = None,
        mss: int = 1460, dt_: float = 0.001, on_frame=None, shared_pending: int = 0,
        mangled: dict | None = None) -> tuple[list, list, dict]:
    """Rows after each segment, the conversations' state after each segment, and how many
    frames the Python methods took (``mangled``: pcapgen.mangle's perturbations)."""
    segs = tcp_conversation(CLIENT, BROKER, messages, mss=mss, dt=dt_)
    if mangled:
        segs = mangle(segs, **mangled)
    calls = {"on_request": 0, "on_response": 0}
    saved = conversation.compiled_frames
    real_req, real_resp = Conversation.on_request, Conversation.on_response

    def on_request(self, *a):
        calls["on_request"] += 1
        return real_req(self, *a)

    def on_response(self, *a):
        calls["on_response"] += 1
        return real_resp(self, *a)

    Conversation.on_request, Conversation.on_response = on_request, on_response
    conversation.compiled_frames = saved if compiled else None
    try:
        d = Dissector(config or DissectConfig(kafka_ports=frozenset({9092})), on_frame=on_frame)
        d.shared.pending_bytes = shared_pending
        rows, states = [], []
        for seg in segs:
            d.feed_segment(seg)
            rows.append([_event(e) for e in d.drain()])
            states.append([(info.stream, conv_state(info.conversation)) for info in d.connections.values()
                           if isinstance(info.conversation, Conversation)])
        d.finish()
        rows.append([_event(e) for e in d.drain()])
    finally:
        conversation.compiled_frames = saved
        Conversation.on_request, Conversation.on_response = real_req, real_resp
    return rows, states, calls


def both(messages, **kw) -> tuple[list, dict, dict]:
    """The rows (equal in both runs, and so the state after every segment) and each run's
    count of frames Python took."""
    c_rows, c_states, c_calls = run(messages, compiled=True, **kw)
    p_rows, p_states, p_calls = run(messages, compiled=False, **kw)
    assert c_rows == p_rows
    assert c_states == p_states
    return [r for batch in c_rows for r in batch], c_calls, p_calls


def kinds(rows) -> list[str]:
    return [r[1]["kind"] for r in rows if r[0] == "error"]


def exchanges(rows) -> list[dict]:
    return [r[1] for r in rows if r[0] == "exchange"]


def handshake(cid: int = 0, narrow: bool = False) -> list[tuple[str, bytes]]:
    return [("c", framed(request_of("api_versions", cid))),
            ("s", framed(response_of("api_versions_narrow" if narrow else "api_versions", cid)))]


# -- the ordinary case is taken in C ----------------------------------------------------------


def test_ordinary_frames_never_reach_the_python_methods():
    """Produce with records, Fetch with records and empty (long polls), pipelined, several
    frames per segment: after ApiVersions (which Python takes), C takes every frame, and
    the rows are the Python methods' rows."""
    msgs = handshake()
    for cid in range(1, 21):
        msgs.append(("c", framed(request_of("produce", cid)) + framed(request_of("fetch", cid + 100))))
        msgs.append(("s", framed(response_of("produce", cid)) + framed(response_of("fetch_empty" if cid % 2
                                                                                   else "fetch", cid + 100))))
    rows, c_calls, p_calls = both(msgs, dt_=0.3)  # 0.3 s answers to 500 ms waits: long polls
    got = exchanges(rows)
    assert [(e["api_name"], e["status"]) for e in got] == [("ApiVersions", "paired")] + [
        ("Produce", "paired"), ("Fetch", "paired")] * 20
    assert [e["long_poll"] for e in got if e["api_name"] == "Fetch"] == [True, False] * 10
    assert {tuple(e["topics"]) for e in got[1:]} == {("orders",)}
    assert {e["throttle_time_ms"] for e in got if e["api_name"] == "Produce"} == {7}
    assert kinds(rows) == []
    assert p_calls == {"on_request": 41, "on_response": 41}
    assert c_calls == {"on_request": 1, "on_response": 1}  # ApiVersions only


# -- what C leaves to Python -----------------------------------------------------------------


def test_sasl_handshake_and_raw_tokens_are_python_s_and_redacted():
    msgs = handshake() + [
        ("c", framed(request_of("sasl_handshake", 1))), ("s", framed(response_of("sasl_handshake", 1))),
        ("c", framed(b"\x00alice\x00s3cret-password")), ("s", framed(b"")),
        ("c", framed(request_of("produce", 2))), ("s", framed(response_of("produce", 2)))]
    rows, c_calls, _ = both(msgs)
    assert [e["api_name"] for e in exchanges(rows)] == ["ApiVersions", "SaslHandshake", "SaslToken", "Produce"]
    assert "s3cret" not in repr(rows)
    # all but the Produce's response: the first request after the tokens is Python's too
    # (it ends the raw-token state)
    assert c_calls == {"on_request": 4, "on_response": 3}


@pytest.mark.parametrize("redact", [True, False])
def test_secret_apis_are_python_s(redact):
    msgs = handshake() + [("c", framed(request_of("sasl_authenticate", 1))),
                          ("s", framed(response_of("sasl_authenticate", 1)))]
    rows, c_calls, _ = both(msgs, config=DissectConfig(kafka_ports=frozenset({9092}), redact=redact))
    assert ("s3cret" in repr(rows)) is not redact
    assert c_calls == {"on_request": 2, "on_response": 2}


def test_out_of_order_responses():
    msgs = handshake() + [("c", framed(request_of("produce", 1)) + framed(request_of("produce", 2))),
                          ("s", framed(response_of("produce", 2))), ("s", framed(response_of("produce", 1)))]
    rows, c_calls, _ = both(msgs)
    # 1 skipped: unanswered; its late answer: an orphan
    assert kinds(rows) == ["out_of_order_response", "response_missing", "request_missing"]
    assert c_calls["on_response"] == 3


def test_orphan_responses():
    msgs = handshake() + [("s", framed(response_of("produce", 9))), ("c", framed(request_of("produce", 1))),
                          ("s", framed(response_of("produce", 1)))]
    rows, c_calls, _ = both(msgs)
    assert kinds(rows) == ["request_missing"]
    assert [e["status"] for e in exchanges(rows)] == ["paired", "request_missing", "paired"]
    assert c_calls == {"on_request": 1, "on_response": 2}


def test_duplicate_correlation_ids():
    msgs = handshake() + [("c", framed(request_of("produce", 1))), ("c", framed(request_of("fetch", 1))),
                          ("s", framed(response_of("fetch", 1)))]
    rows, c_calls, _ = both(msgs)
    assert kinds(rows) == ["duplicate_correlation_id", "response_missing"]
    assert c_calls["on_request"] == 2  # the ApiVersions and the duplicate; the first Produce in C


def test_acks_zero_produce():
    msgs = handshake() + [("c", framed(request_of("produce_acks0", 1))), ("c", framed(request_of("produce", 2))),
                          ("s", framed(response_of("produce", 2)))]
    rows, c_calls, _ = both(msgs)
    assert [(e["api_name"], e["status"]) for e in exchanges(rows)] == [
        ("ApiVersions", "paired"), ("Produce", "no_response_expected"), ("Produce", "paired")]
    assert kinds(rows) == []
    assert c_calls["on_request"] == 2


def test_requests_past_the_pending_bytes_budget_wait_as_frames():
    """A request that does not fit PENDING_DECODED_BYTES is kept as its frame (Python's),
    and its response too is Python's; the rows are the same."""
    big = [f"topic-{i:06d}" for i in range(3000)]
    frame = request_frame(metadata_request(big), 1)
    msgs = handshake() + [("c", framed(frame)), ("c", framed(request_of("produce", 2))),
                          ("s", framed(response_of("metadata", 1))), ("s", framed(response_of("produce", 2)))]
    limit = conversation.PENDING_DECODED_BYTES
    rows, c_calls, _ = both(msgs, shared_pending=limit - len(frame) - 10)
    got = exchanges(rows)
    assert [(e["api_name"], e["status"]) for e in got] == [
        ("ApiVersions", "paired"), ("Metadata", "paired"), ("Produce", "paired")]
    # the Metadata request fits, the Produce does not: both of its frames are Python's
    assert c_calls == {"on_request": 2, "on_response": 3}


def test_versions_the_broker_did_not_advertise():
    msgs = handshake(narrow=True) + [("c", framed(request_of("produce", 1))), ("s", framed(response_of("produce", 1))),
                                     ("c", framed(request_of("fetch", 2))), ("s", framed(response_of("fetch", 2)))]
    rows, c_calls, _ = both(msgs)
    assert kinds(rows) == ["version_not_advertised"]
    assert c_calls == {"on_request": 2, "on_response": 1}  # the Fetch is C's, both ways


def test_max_in_flight():
    msgs = handshake() + [("c", framed(request_of("produce", cid))) for cid in (1, 2, 3)] + [
        ("s", framed(response_of("produce", 3)))]
    rows, c_calls, _ = both(msgs, config=DissectConfig(kafka_ports=frozenset({9092}), max_in_flight=2))
    assert kinds(rows)[:1] == ["response_missing"]
    assert c_calls["on_request"] == 2


def test_decode_issues_and_error_codes():
    cut = request_of("produce", 2)[:-5]
    msgs = handshake() + [("c", framed(request_of("produce", 1))), ("s", framed(response_of("produce_error", 1))),
                          ("c", framed(cut)), ("s", framed(response_of("produce", 2))),
                          ("c", framed(request_of("fetch", 3))), ("s", framed(response_of("fetch_error", 3))),
                          ("c", framed(request_of("fetch", 4))), ("s", framed(response_of("fetch", 4)[:-3]))]
    rows, c_calls, _ = both(msgs)
    assert kinds(rows) == ["kafka_error", "decode_error", "kafka_error", "decode_error"]
    assert c_calls == {"on_request": 2, "on_response": 5}


def test_learning_apis_are_python_s_and_frame_hooks_see_every_frame():
    msgs = handshake() + [("c", framed(request_of("metadata", 1))), ("s", framed(response_of("metadata", 1))),
                          ("c", framed(request_of("produce", 2))), ("s", framed(response_of("produce", 2)))]
    rows, c_calls, _ = both(msgs)
    assert [e["broker_id"] for e in exchanges(rows)] == [None, 1, 1]  # learnt from the Metadata answer
    assert c_calls == {"on_request": 1, "on_response": 2}
    # a frame hook (the TUI's frame tap) sees every frame, and costs the ordinary ones
    # (the Produce) not their compiled path: the same rows, the same Python calls
    seen = []
    hooked_rows, c_calls, _ = both(msgs, on_frame=lambda stream, direction, frame: seen.append((direction, frame)))
    assert hooked_rows == rows
    assert c_calls == {"on_request": 1, "on_response": 2}
    sent = [("request" if side == "c" else "response", frame[4:]) for side, frame in msgs]
    assert seen == sent * 2  # (both runs)


# -- everything mixed: hypothesis ---------------------------------------------------------------

REQUESTS = ["produce", "produce_none", "produce_acks0", "fetch", "fetch_short", "metadata", "api_versions",
            "sasl_handshake", "sasl_authenticate"]
RESPONSES = {"produce": ["produce", "produce_error"], "produce_none": ["produce"], "produce_acks0": ["produce"],
             "fetch": ["fetch", "fetch_empty", "fetch_error"], "fetch_short": ["fetch_empty"],
             "metadata": ["metadata"], "api_versions": ["api_versions", "api_versions_narrow"],
             "sasl_handshake": ["sasl_handshake"], "sasl_authenticate": ["sasl_authenticate"]}


def _script(seed: int, n: int, glue: float, disorder: float, garbage: float) -> list[tuple[str, bytes]]:
    """A conversation of `n` requests, mostly answered in order; some answered out of order,
    twice, never or with the wrong id, some frames cut or flipped or made up, several frames
    per send."""
    rng = random.Random(seed)
    frames: list[tuple[str, bytes]] = []
    waiting: list[tuple[int, str]] = []
    for k in range(n):
        cid = rng.choice((k, k, k, rng.randrange(4)))
        kind = rng.choice(REQUESTS)
        frames.append(("c", request_of(kind, cid)))
        waiting.append((cid, kind))
        while waiting and rng.random() < 0.6:
            i = rng.randrange(len(waiting)) if rng.random() < disorder else 0
            wcid, wkind = waiting.pop(i)
            if rng.random() < disorder / 2:
                wcid = rng.randrange(8)
            frames.append(("s", response_of(rng.choice(RESPONSES[wkind]), wcid)))
        if rng.random() < garbage:
            who, f = rng.choice(frames)
            f = bytearray(f)
            for _ in range(rng.randrange(1, 4) if f else 0):
                f[rng.randrange(len(f))] = rng.randrange(256)
            if rng.random() < 0.3:
                f = f[: rng.randrange(len(f) + 1)]
            frames.append((who, bytes(f)))
        if rng.random() < garbage / 3:
            frames.append((rng.choice("cs"), bytes(rng.randrange(256) for _ in range(rng.randrange(12)))))
        if rng.random() < garbage / 3:  # a raw SASL token where a request is expected
            frames.append(("c", b"\x00bob\x00pw"))
    for wcid, wkind in waiting:
        if rng.random() < 0.7:
            frames.append(("s", response_of(RESPONSES[wkind][0], wcid)))
    msgs: list[tuple[str, bytes]] = []
    for who, f in frames:
        if msgs and msgs[-1][0] == who and rng.random() < glue:
            msgs[-1] = (who, msgs[-1][1] + framed(f))
        else:
            msgs.append((who, framed(f)))
    return msgs


scripts = st.builds(_script, seed=st.integers(0, 2**32), n=st.integers(1, 30), glue=st.sampled_from([0.0, 0.5, 0.9]),
                    disorder=st.sampled_from([0.0, 0.1, 0.4]), garbage=st.sampled_from([0.0, 0.1, 0.3]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(msgs=scripts, redact=st.booleans(), max_in_flight=st.sampled_from([10_000, 3]),
       budget=st.sampled_from([None, 2000, 300]), mss=st.sampled_from([1460, 64]), slow=st.booleans(),
       mangled=st.one_of(st.none(), st.fixed_dictionaries({
           "drop": st.sampled_from([0.0, 0.05]), "duplicate": st.sampled_from([0.0, 0.1]),
           "reorder": st.sampled_from([0.0, 0.2]), "seed": st.integers(0, 1000)})))
def test_both_paths_are_identical_on_mixed_conversations(msgs, redact, max_in_flight, budget, mss, slow, mangled):
    """The same rows and the same conversation and shared state after every segment, whichever
    frames C takes and Python takes on the way (lost, repeated and reordered segments too:
    gaps and resyncs put splitter issues between the frames)."""
    config = DissectConfig(kafka_ports=frozenset({9092}), redact=redact, max_in_flight=max_in_flight)
    shared_pending = 0 if budget is None else conversation.PENDING_DECODED_BYTES - budget
    both(msgs, config=config, mss=mss, dt_=0.3 if slow else 0.001, shared_pending=shared_pending, mangled=mangled)


def test_the_walk_refuses_bad_arguments_and_declines_odd_objects():
    from types import SimpleNamespace

    from kwinspect.stream.framing import Frame

    walk = conversation.compiled_frames
    conv = Conversation(CLIENT, BROKER)
    frame = Frame(request_of("produce", 1), 0, 1.0, 1.0, 1, 1)
    validator = SimpleNamespace(last_correlation_id=None)
    with pytest.raises(TypeError):
        walk(conv, [frame], 0, True)
    with pytest.raises(TypeError):
        walk(conv, (frame,), 0, True, validator)
    with pytest.raises(TypeError):
        walk(conv, [frame], "0", True, validator)

    class Subclass(Conversation):
        pass

    odd = Subclass(CLIENT, BROKER)
    assert walk(odd, [frame], 0, True, validator) == 0 and odd.requests == 0  # a subclass: Python's
    tuple_frame = tuple(frame)
    assert walk(conv, [tuple_frame], 0, True, validator) == 0  # not a Frame
    assert walk(conv, [frame._replace(data=bytearray(frame.data))], 0, True, validator) == 0  # not bytes
    assert walk(conv, [frame._replace(ts_last=1)], 0, False, validator) == 0  # a response to nothing
    assert conv.requests == conv.responses == 0 and validator.last_correlation_id is None
    # taken, with a sink that is not a list: the caller's pop_events does the rest
    assert walk(conv, [frame], 0, True, validator, ()) == 1
    assert conv.requests == 1 and validator.last_correlation_id == 1 and conv.frame_packets == (1, 1)


# -- the broker id of an exchange while `brokers` changes between exchanges ---------------------

_BROKER_OPS = st.lists(st.one_of(
    st.tuples(st.just("set"), st.integers(0, 2), st.sampled_from([("10.0.0.2", 9092), ("10.0.0.3", 9092),
                                                                    ("10.0.0.2", 9093)])),
    st.tuples(st.just("del"), st.integers(0, 2)),
    st.tuples(st.just("replace_equal"), st.just(None)),  # a new dict equal to the old one
    st.tuples(st.just("replace"), st.dictionaries(st.integers(0, 2), st.sampled_from(
        [("10.0.0.2", 9092), ("10.0.0.3", 9092)]), max_size=3)),
    st.tuples(st.just("list_value"), st.integers(0, 2)),  # a mutable value (then changed in place)
    st.tuples(st.just("none"), st.just(None)),
), min_size=12, max_size=12)


def _run_with_brokers(ops, compiled: bool) -> list:
    msgs = handshake()
    for cid in range(1, 13):
        msgs += [("c", framed(request_of("produce", cid))), ("s", framed(response_of("produce", cid)))]
    saved = conversation.compiled_frames
    conversation.compiled_frames = saved if compiled else None
    try:
        d = Dissector(DissectConfig(kafka_ports=frozenset({9092})))
        ids, step, mutable = [], 0, None
        for seg in tcp_conversation(CLIENT, BROKER, msgs, mss=1460, dt=0.001):
            d.feed_segment(seg)
            for ev in d.drain():
                if type(ev) is Exchange and ev.api_name == "Produce":
                    ids.append(ev.broker_id)
                    op, arg = ops[step][0], ops[step][1:]
                    step += 1
                    brokers = d.shared.brokers
                    if mutable is not None:  # the list value of the last step, changed in place
                        mutable[1] = 9093 if mutable[1] == 9092 else 9092
                        mutable = None
                    if op == "set":
                        brokers[arg[0]] = arg[1]
                    elif op == "del":
                        brokers.pop(arg[0], None)
                    elif op == "replace_equal":
                        d.shared.brokers = dict(brokers)
                    elif op == "replace":
                        d.shared.brokers = dict(arg[0])
                    elif op == "list_value":
                        mutable = brokers[arg[0]] = ["10.0.0.2", 9092]
        d.finish()
    finally:
        conversation.compiled_frames = saved
    return ids


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_BROKER_OPS)
def test_broker_ids_follow_brokers_changed_between_exchanges(ops):
    """The C reuses its last "brokers equals the cache's copy" answer while neither dict has
    changed (and their values cannot change in place): the broker ids must be the Python
    path's however `brokers` is mutated, replaced or holds a mutable value in between."""
    got = _run_with_brokers(ops, compiled=True)
    assert got == _run_with_brokers(ops, compiled=False)
    assert len(got) == 12
