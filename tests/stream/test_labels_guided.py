"""findings.response_errors (the error walk guided by the schema, for clean Produce/Fetch
responses) against the generic reference walk (tests/stream/labels_reference.py).

It trusts what a clean decode guarantees: a schema field holds a value of the schema's
type.  Everything else (unknown keys, struct fields holding anything, missing keys, odd
arrays) must come out exactly as the reference's, order and topic-id lookups included.
"""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kwinspect.stream.conversation as conversation
from kwinspect.dissect import DissectConfig
from kwinspect.protocol.records import RecordSet
from kwinspect.run.files import dissect_files
from kwinspect.stream import labels as findings
from tests.stream import labels_reference as reference
from tests.stream.test_labels import BODIES, CAPTURES, PUBLIC, TID, LoggingNames, _ports


def assert_guided_same(api_key, body, clean, names: dict, request: bool | None = None) -> None:
    ref_names, new_names = LoggingNames(names), LoggingNames(names)
    if request is None:
        want = list(reference.iter_errors(body, ref_names))
        got = findings.response_errors(api_key, body, clean, new_names)
        assert got == want
        assert set(new_names.log) <= set(ref_names.log)
        ref_names.log.clear()
        new_names.log.clear()
        request = False
    try:
        want_topics = reference.topics_of(body, ref_names)
    except TypeError:  # a non-str key over a list: decoded bodies have none
        with pytest.raises(TypeError):
            findings.message_topics(api_key, body, request, clean, new_names)
        return
    assert findings.message_topics(api_key, body, request, clean, new_names) == want_topics
    assert set(new_names.log) <= set(ref_names.log)


@pytest.mark.parametrize("pcap", CAPTURES + PUBLIC, ids=lambda p: p.rsplit("/", 1)[-1])
def test_every_produce_and_fetch_response_of_the_shipped_captures(pcap, monkeypatch):
    seen = []
    response_errors = conversation.response_errors

    def checked(api_key, body, clean, names=None):
        seen.append(api_key)
        assert_guided_same(api_key, body, clean, dict(names or {}))
        return response_errors(api_key, body, clean, names)

    def checked_topics(api_key, body, request, clean, names=None):
        seen.append(api_key)
        assert_guided_same(api_key, body, clean, dict(names or {}), request)
        return message_topics(api_key, body, request, clean, names)

    message_topics = conversation.message_topics
    monkeypatch.setattr(conversation, "response_errors", checked)
    monkeypatch.setattr(findings, "compiled_exchange", None)  # emit asks the walks one by one
    monkeypatch.setattr(conversation, "message_topics", checked_topics)
    for _ev in dissect_files([pcap], DissectConfig(kafka_ports=_ports(pcap))):
        pass


def _produce(version_fields: bool):
    part = {"index": 3, "error_code": 0, "base_offset": 0, "log_append_time_ms": -1, "log_start_offset": 0,
            "record_errors": [{"batch_index": 0, "batch_index_error_message": None}],
            "error_message": None}
    if version_fields:
        part["current_leader"] = {"leader_id": -1, "leader_epoch": -1}
    body = {"responses": [{"name": "t1", "partition_responses": [part, dict(part, index=4)]},
                          {"topic_id": TID, "partition_responses": [dict(part, index=0)]}],
            "throttle_time_ms": 0}
    if version_fields:
        body["node_endpoints"] = [{"node_id": 1, "host": "h", "port": 9092, "rack": None}]
    return body


def _fetch():
    part = {"partition_index": 0, "error_code": 0, "high_watermark": 5, "last_stable_offset": 5,
            "log_start_offset": 0, "diverging_epoch": {"epoch": -1, "end_offset": -1},
            "current_leader": {"leader_id": 1, "leader_epoch": 2}, "snapshot_id": {"end_offset": -1, "epoch": -1},
            "aborted_transactions": [{"producer_id": 1, "first_offset": 0}], "preferred_read_replica": -1,
            "records": RecordSet()}
    return {"throttle_time_ms": 0, "error_code": 0, "session_id": 7,
            "responses": [{"topic": "t2", "partitions": [part, dict(part, partition_index=1)]},
                          {"topic_id": TID, "partitions": [dict(part)]}],
            "node_endpoints": []}


INTS = st.one_of(st.just(0), st.integers(-3, 120), st.booleans())


# Keys the Produce/Fetch schemas give scalar types: a clean decode never puts a dict or
# a list there, and the guided walk does not look (generated values must not either).
SCALAR_NAMES = frozenset({"name", "topic", "topic_id", "index", "partition_index", "partition", "records",
                          "error_message"})


def _trusted(value) -> bool:
    if isinstance(value, dict):
        return all(_trusted(v) and not (k in SCALAR_NAMES and isinstance(v, (dict, list)))
                   for k, v in value.items())
    if isinstance(value, list):
        return all(_trusted(v) for v in value)
    return True


ODD = BODIES.filter(_trusted)


@st.composite
def mutated(draw, body):
    """``body`` with some int fields changed (error codes above all), and some keys
    added, removed or given odd values."""
    def visit(node):
        if isinstance(node, dict):
            for key in list(node):
                value = node[key]
                if isinstance(value, (dict, list)):
                    choice = draw(st.integers(0, 9))
                    if choice == 0:
                        node[key] = draw(ODD)
                    elif choice == 1:
                        del node[key]
                    elif choice == 2:
                        node[key] = None
                    else:
                        visit(value)
                elif type(value) is int and draw(st.integers(0, 1 if str(key).endswith("error_code") else 3)) == 0:
                    node[key] = draw(INTS)
                elif isinstance(key, str) and key.endswith("message") and draw(st.booleans()):
                    node[key] = draw(st.sampled_from([None, "boom"]))
            if len(node) > 1 and draw(st.integers(0, 3)) == 0:  # schema keys in another order
                order = draw(st.permutations(list(node)))
                items = [(k, node.pop(k)) for k in order]
                node.update(items)
            if draw(st.integers(0, 6)) == 0:
                node[draw(st.sampled_from(["x", "error_code", "topics_x", "_unknown", 0]))] = draw(ODD)
        elif isinstance(node, list):
            for item in list(node):
                visit(item)
            if node and draw(st.integers(0, 5)) == 0:
                node.append(draw(st.one_of(ODD, st.just(copy.deepcopy(node[0])))))
        return node
    return visit(copy.deepcopy(body))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), api_key=st.sampled_from([0, 1]), flexible=st.booleans(), known=st.booleans())
def test_mutated_clean_bodies_walk_as_the_reference(data, api_key, flexible, known):
    body = data.draw(mutated(_produce(flexible) if api_key == 0 else _fetch()))
    assert_guided_same(api_key, body, True, {TID: "named"} if known else {})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), api_key=st.sampled_from([0, 1]), known=st.booleans())
def test_mutated_clean_requests_name_the_reference_topics(data, api_key, known):
    body = data.draw(mutated(_produce_request() if api_key == 0 else _fetch_request()))
    assert_guided_same(api_key, body, True, {TID: "named"} if known else {}, request=True)


def _produce_request():
    return {"transactional_id": None, "acks": 1, "timeout_ms": 30000, "topic_data": [
        {"name": "t1", "partition_data": [{"index": 3, "records": RecordSet()}, {"index": 4, "records": None}]},
        {"topic_id": TID, "partition_data": [{"index": 0, "records": RecordSet()}]},
        {"name": "t0", "partition_data": []}]}


def _fetch_request():
    part = {"partition": 0, "current_leader_epoch": -1, "fetch_offset": 5, "last_fetched_epoch": -1,
            "log_start_offset": -1, "partition_max_bytes": 1048576}
    return {"replica_id": -1, "max_wait_ms": 500, "min_bytes": 1, "max_bytes": 52428800, "isolation_level": 0,
            "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": "t2", "partitions": [part]}, {"topic_id": TID, "partitions": [dict(part)]},
                       {"topic_id": "AAAAAAAAAAAAAAAAAAAAAA", "partitions": []}],
            "forgotten_topics_data": [{"topic": "t3", "partitions": [0, 1]}], "rack_id": ""}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.dictionaries(st.sampled_from(["responses", "throttle_time_ms", "error_code", "x"]), BODIES,
                            max_size=4), api_key=st.sampled_from([0, 1, 3, None]), clean=st.booleans())
def test_bodies_that_are_not_clean_or_not_produce_fetch_walk_generically(body, api_key, clean):
    if clean and api_key in (0, 1):
        return  # the guided walk trusts a clean body's scalar fields; generated ones are not clean
    assert_guided_same(api_key, body, clean, {})


def test_an_error_in_a_clean_produce_response_is_found_with_its_labels():
    body = _produce(True)
    body["responses"][1]["partition_responses"][0].update(error_code=6, error_message="moved")
    names = LoggingNames({TID: "orders"})
    (err,) = findings.response_errors(0, body, True, names)
    assert (err["topic"], err["partition"], err["path"], err["message"]) == (
        "orders", 0, "responses[1].partition_responses[0].error_code", "moved")


def test_a_nodes_own_error_comes_before_its_childrens_whatever_the_key_order():
    body = _fetch()
    body["responses"][0]["partitions"][1]["error_code"] = 6
    body = {"responses": body.pop("responses"), **body, "error_code": 5}  # error_code after responses
    assert_guided_same(1, body, True, {})
    assert [e["code"] for e in findings.response_errors(1, body, True, {})] == [5, 6]
