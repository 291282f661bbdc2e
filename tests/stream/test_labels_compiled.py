"""The compiled labels (stream/_clabels.c) give exactly what the Python walks give.

The Python walks of stream/labels.py are the reference: the guided ones for clean
Produce/Fetch bodies, the generic ones for the rest, and iter_record_sets. Here the C
functions are called directly and compared with them, on every request and response body
of every shipped and public capture (where the C must also never decline: real bodies
are the ordinary case) and on generated bodies with odd types (subclasses of int, str,
dict and list, keys that are not str, str keys of every width, deep nesting, objects of
other types), including the topic-id lookups each makes. The CLI outputs of both cores
are compared byte for byte on every capture by tests/test_core.py.
"""

from __future__ import annotations

import copy
import enum

import pytest
from helpers.cores import python_labels, require_compiled
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kwinspect.stream.conversation as conversation
from kwinspect.dissect import DissectConfig
from kwinspect.protocol.records import RecordSet, parse_record_set
from kwinspect.run.files import dissect_files
from kwinspect.stream import labels
from tests.stream.test_labels import BODIES, CAPTURES, PUBLIC, TID, LoggingNames, _ports
from tests.stream.test_labels_guided import (
    _fetch,
    _fetch_request,
    _produce,
    _produce_request,
    mutated,
)

C_EXCHANGE = labels.compiled_exchange  # (tests set the facade's to None)


@pytest.fixture(autouse=True)
def _compiled():
    require_compiled()


def python_results(api_key, body, request, clean, names):
    """What the Python walks say (and the lookups they make), or the exception they raise."""
    logged = LoggingNames(names)
    with python_labels():
        try:
            errors = None if request else labels.response_errors(api_key, body, clean, logged)
            topics = labels.message_topics(api_key, body, request, clean, logged)
            generic = labels.topics_of(body, logged)
            sets = list(labels.iter_record_sets(api_key, body, logged))
        except Exception as exc:  # noqa: BLE001 - the C must then decline
            return type(exc), logged.log
    return (errors, topics, generic, sets), logged.log


def compiled_results(api_key, body, request, names):
    """The C functions' answers (None: declined) and the lookups they make."""
    logged = LoggingNames(names)
    errors = None if request else labels.compiled_errors(body, logged)
    topics = labels.compiled_topics(body, logged)
    sets = labels.compiled_record_sets(api_key, body, logged) if api_key is not None else []
    return (errors, topics, sets), logged.log


def assert_same(api_key, body, request, clean, names, *, must_take=False):
    want, want_log = python_results(api_key, body, request, clean, names)
    (errors, topics, sets), log = compiled_results(api_key, body, request, names)
    if must_take:
        assert errors is not None or request
        assert topics is not None and sets is not None
    if isinstance(want, type):  # the Python walk raises: the C declined where it matters
        assert errors is None or topics is None or sets is None
        return
    w_errors, w_topics, w_generic, w_sets = want
    if errors is not None:
        assert errors == w_errors
    if topics is not None:
        assert topics == w_topics == w_generic
    if sets is not None and api_key in (0, 1):
        assert [(t, p, id(rs)) for t, p, rs in sets] == [(t, p, id(rs)) for t, p, rs in w_sets]
    # every lookup the C makes, the Python makes (run/parallel.py replays them)
    assert set(log) <= set(want_log)
    # and all at once, as Conversation.emit asks (the body as request, response or both)
    for pair in ((body, None), (None, body), (body, body)):
        got = C_EXCHANGE(api_key, *pair, names)
        if got is not None:
            assert got == python_exchange(api_key, *pair, names)
    # and through the public functions, whichever path they take
    logged = LoggingNames(names)
    if not request:
        assert labels.response_errors(api_key, body, clean, logged) == w_errors
    assert labels.message_topics(api_key, body, request, clean, logged) == w_topics


# -- every body of every capture ---------------------------------------------------------------


def python_exchange(api_key, req_body, resp_body, names):
    """What Conversation.emit takes from the Python walks one by one (the generic ones: a
    clean body's guided walk equals them)."""
    with python_labels():
        errors = labels.response_errors(api_key, resp_body, False, names) if resp_body else []
        topics = labels.message_topics(api_key, req_body, True, False, names) if req_body else []
        if not topics and resp_body:
            topics = labels.topics_of(resp_body, names)
        sets = [[s for s in labels.iter_record_sets(api_key, body, names) if s[2].issues]
                if api_key in (0, 1) and body else [] for body in (req_body, resp_body)]
    return (errors, topics, *sets)


@pytest.mark.parametrize("pcap", CAPTURES + PUBLIC, ids=lambda p: p.rsplit("/", 1)[-1])
def test_every_body_of_every_capture(pcap, monkeypatch):
    from rig.verify import keylog_of

    keys = None
    if keylog_of(pcap):
        from kwinspect.capture.keylog import KeyLog

        keys = KeyLog()
        keys.add_file(keylog_of(pcap))
    seen = []

    def run():
        for _ev in dissect_files([pcap], DissectConfig(kafka_ports=_ports(pcap), tls_keys=keys)):
            pass
        if "captures-public" not in pcap:
            assert seen
        seen.clear()

    response_errors, message_topics = conversation.response_errors, conversation.message_topics
    compiled_exchange = labels.compiled_exchange

    def checked_errors(api_key, body, clean, names=None):
        seen.append(api_key)
        assert_same(api_key, body, False, clean, dict(names or {}), must_take=type(body) is dict)
        return response_errors(api_key, body, clean, names)

    def checked_topics(api_key, body, request, clean, names=None):
        seen.append(api_key)
        assert_same(api_key, body, request, clean, dict(names or {}), must_take=type(body) is dict)
        return message_topics(api_key, body, request, clean, names)

    def checked_exchange(api_key, req_body, resp_body, names):
        seen.append(api_key)
        got = compiled_exchange(api_key, req_body, resp_body, names)
        assert got is not None  # real bodies are the ordinary case
        assert got == python_exchange(api_key, req_body, resp_body, dict(names))
        return got

    # emit asking the walks one by one ...
    monkeypatch.setattr(conversation, "response_errors", checked_errors)
    monkeypatch.setattr(conversation, "message_topics", checked_topics)
    monkeypatch.setattr(labels, "compiled_exchange", None)
    run()
    # ... and all at once
    monkeypatch.setattr(labels, "compiled_exchange", checked_exchange)
    run()


# -- generated bodies ----------------------------------------------------------------------------


class Code(enum.IntEnum):
    GONE = 6


class Text(str):
    pass


class Mapping(dict):
    pass


class Items(list):
    pass


WIDE_KEYS = st.sampled_from(["\u0167opic", "x\u20acerror_code", "\u20acpartition_index", "topic\U0001f600",
                             "\u00e9error_code", "responses\u00e9", "name", "topic_id"])
ODD_LEAVES = st.one_of(
    st.just(Code.GONE), st.just(Text("t1")), st.just(Text(TID)), st.floats(allow_nan=False),
    st.just(RecordSet()), st.tuples(st.integers(0, 2)), st.just(b"x"), st.integers(-2**70, 2**70),
)


def odd_bodies(keys):
    leaves = st.one_of(BODIES, ODD_LEAVES)
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=5),
            st.builds(Mapping, st.dictionaries(keys, inner, max_size=3)),
            st.builds(Items, st.lists(inner, max_size=3)),
        ),
        max_leaves=30,
    )


KEYS = st.one_of(st.sampled_from(["error_code", "top_error_code", "error_message", "name", "topic", "topic_id",
                                  "topics", "responses", "partitions", "partition_index", "index", "records",
                                  "topic_data", "partition_data", "group_id", 0, 7]), WIDE_KEYS)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.dictionaries(KEYS, odd_bodies(KEYS), max_size=6), api_key=st.sampled_from([0, 1, 3]),
       request=st.booleans(), clean=st.booleans(), known=st.booleans())
def test_generated_bodies_with_odd_types(body, api_key, request, clean, known):
    if clean and api_key in (0, 1):
        clean = False  # the guided walk trusts a clean body's types; these are not clean
    assert_same(api_key, body, request, clean, {TID: "named"} if known else {})


def _plain(value) -> bool:
    """Only the exact types decoded bodies hold (and str keys): the C must take it."""
    if type(value) is dict:
        return all(type(k) is str and _plain(v) for k, v in value.items())
    if type(value) is list:
        return all(_plain(v) for v in value)
    return type(value) in (int, bool, str, bytes, type(None), float) or type(value) is RecordSet


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.dictionaries(st.sampled_from(["error_code", "topics", "responses", "partitions", "name",
                                             "topic_id", "x"]), BODIES, max_size=5), known=st.booleans())
def test_plain_generated_bodies_are_taken_by_the_c(body, known):
    names = {TID: "named"} if known else {}
    if not _plain(body):
        body = {"x": 1}
    assert_same(3, body, False, False, names, must_take=True)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), api_key=st.sampled_from([0, 1]), request=st.booleans(), known=st.booleans())
def test_mutated_produce_and_fetch_bodies(data, api_key, request, known):
    shapes = {(0, False): lambda: _produce(True), (1, False): _fetch,
              (0, True): _produce_request, (1, True): _fetch_request}
    body = data.draw(mutated(shapes[api_key, request]()))
    # record sets where a Fetch response / Produce request may hold them, odd ones too
    topics = body.get("responses") or body.get("topic_data")
    for topic in topics[:2] if isinstance(topics, list) else ():
        parts = topic.get("partitions") or topic.get("partition_data") if isinstance(topic, dict) else None
        for part in parts[:2] if isinstance(parts, list) else ():
            if isinstance(part, dict):
                part["records"] = data.draw(st.sampled_from([RecordSet(), None, parse_record_set(b"\0" * 20)]))
    assert_same(api_key, body, request, True, {TID: "named"} if known else {})


# -- the edges, one by one ---------------------------------------------------------------------


def test_an_error_s_dict_is_the_python_one_with_its_context():
    body = copy.deepcopy(_produce(True))
    body["responses"][1]["partition_responses"][0].update(error_code=6, error_message="moved")
    body["error_code"] = 7
    names = {TID: "orders"}
    got = labels.compiled_errors(body, names)
    with python_labels():
        assert got == labels.response_errors(0, body, True, names)
    assert [(e["code"], e["topic"], e["partition"], e["path"], e["message"]) for e in got] == [
        (7, None, None, "error_code", None),
        (6, "orders", 0, "responses[1].partition_responses[0].error_code", "moved")]


def test_deep_nesting_goes_to_python():
    body: dict = {"error_code": 1}
    for _ in range(200):
        body = {"topics": [body]}
    assert labels.compiled_errors(body, {}) is None
    assert labels.compiled_topics(body, {}) is None
    with python_labels():
        want = labels.response_errors(3, body, False, {})
    assert labels.response_errors(3, body, False, {}) == want and len(want) == 1


def test_a_lookup_that_raises_is_raised_by_python():
    class Boom(dict):
        def __bool__(self) -> bool:  # `topic_names or {}` keeps it
            return True

        def get(self, tid, default=None):
            raise ValueError("no lookups")

    body = {"topics": [{"topic_id": TID}]}
    assert labels.compiled_topics(body, Boom()) is None
    with pytest.raises(ValueError):
        labels.topics_of(body, Boom())


def test_an_interrupt_in_a_lookup_is_not_swallowed():
    class Interrupt(dict):
        def get(self, tid, default=None):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        labels.compiled_topics({"topics": [{"topic_id": TID}]}, Interrupt())


def test_record_sets_name_topics_and_partitions_as_python():
    a, b = RecordSet(), RecordSet()
    body = {"topic_data": [{"name": "", "topic": "t", "partition_data": [{"index": None, "records": a}]},
                           {"topic_id": TID, "partition_data": [{"partition_index": 2, "records": b},
                                                                {"records": None}, 5]},
                           "x"]}
    names = LoggingNames({})
    assert labels.compiled_record_sets(0, body, names) == [("t", None, a), (TID, 2, b)]
    assert names.log == [(TID, None)]


def test_a_lookup_that_empties_the_body_does_not_break_the_walk():
    """A mapping's get is Python code that could change what is being walked: the C holds
    what it walks, and walks on over what is left (make fuzz-asan runs this module too)."""
    class Emptying(dict):
        def __init__(self, *nodes) -> None:
            super().__init__()
            self.nodes = nodes

        def __bool__(self) -> bool:
            return True

        def get(self, tid, default=None):
            for node in self.nodes:
                node.clear()
            return default

    topic = {"topic_id": TID, "partitions": [{"x": [1]}]}
    body = {"topics": [topic, {"name": "t"}], "error_code": 0}
    assert labels.compiled_topics(body, Emptying(body, topic, body["topics"])) == [TID]
    topic = {"topic_id": TID, "partition_data": [{"index": 0, "records": RecordSet()}]}
    sets = {"topic_data": [topic]}
    assert labels.compiled_record_sets(0, sets, Emptying(sets, sets["topic_data"], topic)) == []
