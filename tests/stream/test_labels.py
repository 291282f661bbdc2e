"""stream/labels.py against the generic walk it replaced (tests/stream/labels_reference.py).

The production walk works out topic/partition/group only where an error code sits;
its results must equal the reference's for every body (real ones from the shipped
captures, and generated odd ones), and every topic-id lookup it makes must be one the
reference makes too (run/parallel.py replays the lookups of an exchange to tell
whether its labels would differ in one process; fewer lookups are fine, other ones not).
"""

from __future__ import annotations

import glob
import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kwinspect.stream.conversation as conversation
from kwinspect.dissect import DEFAULT_KAFKA_PORTS, DissectConfig
from kwinspect.run.files import dissect_files
from kwinspect.stream import labels as findings
from tests.stream import labels_reference as reference

ROOT = Path(__file__).resolve().parents[2]
CAPTURES = sorted(glob.glob(str(ROOT / "captures" / "*.pcap")))
PUBLIC = sorted(glob.glob(str(ROOT.parent / "shared" / "captures-public" / "*.pcap")))


class LoggingNames(dict):
    """topic id -> name that records every lookup, like run/parallel.py's _TrackingNames."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.log: list = []

    def __bool__(self) -> bool:
        return True

    def get(self, tid, default=None):
        value = dict.get(self, tid)
        self.log.append((tid, value))
        return default if value is None else value


def assert_same(body, names: dict) -> None:
    ref_names, new_names = LoggingNames(names), LoggingNames(names)
    want = list(reference.iter_errors(body, ref_names))
    got = list(findings.iter_errors(body, new_names))
    assert got == want
    assert set(new_names.log) <= set(ref_names.log)
    ref_names.log.clear()
    new_names.log.clear()
    try:
        want_topics = reference.topics_of(body, ref_names)
    except TypeError:  # a non-str key over a list: decoded bodies have none (only _unknown_tags: bytes)
        with pytest.raises(TypeError):
            findings.topics_of(body, new_names)
        return
    assert findings.topics_of(body, new_names) == want_topics
    assert set(new_names.log) <= set(ref_names.log)


def _ports(pcap: str) -> frozenset[int]:
    manifest = pcap[: -len(".pcap")] + ".manifest.json"
    if os.path.exists(manifest):
        with open(manifest) as fh:
            return frozenset(json.load(fh).get("kafka_ports") or ()) | DEFAULT_KAFKA_PORTS
    return DEFAULT_KAFKA_PORTS


@pytest.mark.parametrize("pcap", CAPTURES + PUBLIC, ids=os.path.basename)
def test_every_body_of_the_shipped_captures_walks_as_the_reference(pcap, monkeypatch):
    seen = []
    response_errors, message_topics = conversation.response_errors, conversation.message_topics
    topics_of = conversation.topics_of

    def checked_errors(api_key, body, clean, names=None):
        seen.append(body)
        assert_same(body, dict(names or {}))
        return response_errors(api_key, body, clean, names)

    def checked_topics(api_key, body, request, clean, names=None):
        assert_same(body, dict(names or {}))
        return message_topics(api_key, body, request, clean, names)

    monkeypatch.setattr(conversation, "response_errors", checked_errors)
    monkeypatch.setattr(findings, "compiled_exchange", None)  # emit asks the walks one by one
    monkeypatch.setattr(conversation, "message_topics", checked_topics)
    monkeypatch.setattr(conversation, "topics_of", lambda body, names=None: (
        assert_same(body, dict(names or {})), topics_of(body, names))[1])
    from rig.verify import keylog_of

    keys = None
    if keylog_of(pcap):  # TLS captures ship their key log
        from kwinspect.capture.keylog import KeyLog

        keys = KeyLog()
        keys.add_file(keylog_of(pcap))
    for _ev in dissect_files([pcap], DissectConfig(kafka_ports=_ports(pcap), tls_keys=keys)):
        pass
    if "captures-public" not in pcap:
        assert seen  # every shipped capture has responses


TID = "x" * 22
KEYS = st.sampled_from([
    "error_code", "top_error_code", "error_message", "top_error_message", "name", "topic", "topic_name",
    "topic_id", "topics", "responses", "partitions", "partition_index", "partition", "index",
    "partition_id", "group_id", "group", "records", "x", "errors", "topic_errors", "partition_responses",
    0, 7,
])
LEAVES = st.one_of(
    st.integers(-3, 3), st.booleans(), st.none(), st.sampled_from(["t1", "t2", "", TID, "AAAAAAAAAAAAAAAAAAAAAA"]),
    st.binary(max_size=3),
)
BODIES = st.recursive(
    LEAVES,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(KEYS, inner, max_size=6)),
    max_leaves=40,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.dictionaries(KEYS, BODIES, max_size=6), known=st.booleans())
def test_generated_bodies_walk_as_the_reference(body, known):
    assert_same(body, {TID: "named"} if known else {})


def test_an_error_under_a_topic_id_is_labelled_and_looked_up_once():
    body = {"responses": [{"topic_id": TID, "partitions": [
        {"partition_index": 3, "error_code": 6, "error_message": "gone"},
        {"partition_index": 4, "error_code": 0},
    ]}]}
    names = LoggingNames({TID: "orders"})
    (err,) = findings.iter_errors(body, names)
    assert (err["topic"], err["partition"], err["path"], err["message"]) == (
        "orders", 3, "responses[0].partitions[0].error_code", "gone")
    assert names.log == [(TID, "orders")]
    names.log.clear()
    assert list(findings.iter_errors({"responses": [{"topic_id": TID, "partitions": [{"error_code": 0}]}]},
                                     names)) == []
    assert names.log == []  # nothing to label: no lookup
