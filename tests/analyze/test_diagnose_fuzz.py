"""The Diagnoser never raises, whatever a (partially) decoded body holds.

Bodies are drawn from the field names the analyzers read, with values of any type
(partial decodes leave fields missing, None, or of the wrong shape).
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kwinspect.analyze.diagnose import Diagnoser
from kwinspect.model import ErrorRow, Exchange, Message

KEYS = ["error_code", "api_keys", "api_key", "min_version", "max_version", "topics", "name", "topic", "topic_id",
        "partitions", "partition_index", "partition", "leader_id", "leader_epoch", "responses",
        "partition_responses", "index", "topic_data", "partition_data", "records", "transactional_id",
        "v3_and_below_transactional_id", "transactions", "committed", "producer_id", "producer_epoch", "group_id",
        "member_id", "generation_id", "generation_id_or_member_epoch", "protocol_type", "protocols", "metadata",
        "members", "leader", "protocol_name", "assignments", "assignment", "committed_offset", "high_watermark",
        "fetch_offset", "session_id", "session_epoch", "max_wait_ms", "throttle_time_ms", "member_epoch",
        "heartbeat_interval_ms", "topic_partitions", "subscribed_topic_names"]

scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.integers(-2**40, 2**40),
                    st.text(max_size=5), st.binary(max_size=12))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.sampled_from(KEYS), inner, max_size=5)),
                      max_leaves=25)
ANCHORS = {"group_id": "g", "transactional_id": "t", "v3_and_below_transactional_id": "t", "error_code": 0,
           "protocol_type": "consumer"}


@st.composite
def bodies(draw):
    if draw(st.integers(0, 9)) == 0:
        return None
    body = draw(st.dictionaries(st.sampled_from(KEYS), values, max_size=8))
    # the fields the analyzers check first, usually well-formed, so the rest gets looked at
    for k, v in ANCHORS.items():
        if draw(st.integers(0, 3)):
            body.setdefault(k, v)
    return body


@st.composite
def exchanges(draw):
    api = draw(st.sampled_from([0, 1, 3, 8, 9, 11, 12, 13, 14, 17, 18, 22, 24, 25, 26, 28, 36, 68, None]))
    ver = draw(st.one_of(st.none(), st.integers(-1, 20)))
    ts = draw(st.floats(0, 100, allow_nan=False))
    status = draw(st.sampled_from(["paired", "response_missing", "request_missing", "no_response_expected"]))
    req = Message(True, api, ver, {}, draw(bodies())) if draw(st.booleans()) else None
    resp = Message(False, api, ver, {}, draw(bodies())) if draw(st.booleans()) else None
    return Exchange(
        stream=draw(st.sampled_from(["a->b", "c->b", "d->e"])), client="1.1.1.1:1", broker="2.2.2.2:9092",
        api_key=api, api_name=None if api is None else f"api{api}", api_version=ver,
        correlation_id=draw(st.one_of(st.none(), st.integers(0, 5))), client_id=draw(st.sampled_from([None, "c"])),
        request_ts=ts, response_ts=ts + 0.01, latency_ms=draw(st.one_of(st.none(), st.floats(0, 1e4))),
        request_size=10, response_size=10, status=status,
        error_codes=draw(st.lists(st.integers(-1, 100), max_size=3)),
        error_names=draw(st.lists(st.sampled_from(["UNKNOWN_MEMBER_ID", "X"]), max_size=2)),
        throttle_time_ms=draw(st.one_of(st.none(), st.integers(0, 5000))), request=req, response=resp)


errors = st.builds(ErrorRow, kind=st.sampled_from(["kafka_error", "tcp_gap"]), code=st.one_of(st.none(),
                   st.integers(-1, 100)), name=st.one_of(st.none(), st.text(max_size=4)),
                   api_name=st.sampled_from([None, "Fetch", "Produce"]), ts=st.floats(0, 100, allow_nan=False),
                   topic=st.one_of(st.none(), st.text(max_size=3)), partition=st.one_of(st.none(), st.integers()))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(exchanges(), errors), max_size=25))
def test_diagnoser_never_raises(events):
    d = Diagnoser(deliveries=True)  # as `kwinspect diagnose`: the records join too
    for ev in events:
        d.add(ev)
    for f in d.findings():
        assert f.severity in ("info", "warning", "error") and f.title
        f.as_dict()
    for row in d.deliveries.rows():
        assert row["offset"] is not None
    for g in d.group_timelines():
        g.as_dict()
