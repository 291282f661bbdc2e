"""The driver on real third-party captures: found without configuration, paired, decoded.

Expected values come from ../shared/captures-public/README.md and tshark's
reading of the same files, not from kwinspect.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kwinspect.dissect import DissectConfig
from kwinspect.model import ErrorRow, Exchange
from kwinspect.run.files import dissect_file

PUBLIC = Path(__file__).resolve().parents[1].parent / "shared" / "captures-public"
pytestmark = pytest.mark.skipif(not PUBLIC.is_dir(), reason=f"public captures not found at {PUBLIC}")


def run(name: str, **cfg):
    events = dissect_file(PUBLIC / name, DissectConfig(**cfg))
    return [e for e in events if isinstance(e, Exchange)], [e for e in events if isinstance(e, ErrorRow)]


@pytest.mark.parametrize("name, api, version, client_id", [
    ("deepflowio_deepflow__00-produce-v2.pcap", "Produce", 2, "console-producer"),
    ("deepflowio_deepflow__00-produce-v7-sw8.pcap", "Produce", 7, "kafka-python-producer-1"),
    ("deepflowio_deepflow__00-produce-v9.pcap", "Produce", 9, "console-producer"),
    ("deepflowio_deepflow__01-fetch-v12-ok.pcap", "Fetch", 12, None),
    ("deepflowio_deepflow__11-join-group-v7.pcap", "JoinGroup", 7, None),
    ("deepflowio_deepflow__13-leave-group-v4.pcap", "LeaveGroup", 4, None),
    ("deepflowio_deepflow__14-sync-group-v5.pcap", "SyncGroup", 5, None),
    ("deepflowio_deepflow__18-api-versions-v3.pcap", "ApiVersions", 3, "adminclient-1"),
])
def test_single_exchange_captures_are_found_on_any_port_and_paired(name, api, version, client_id):
    exchanges, errors = run(name)  # no --kafka-ports: port 36333 must be detected
    assert [(e.api_name, e.api_version, e.status) for e in exchanges] == [(api, version, "paired")]
    if client_id:
        assert exchanges[0].client_id == client_id
    assert not [e for e in errors if e.kind in ("decode_error", "not_kafka", "trailing_bytes")]
    assert exchanges[0].latency_ms is not None and exchanges[0].latency_ms >= 0


def test_join_group_error_matches_tshark():
    (ex,), _ = run("deepflowio_deepflow__11-join-group-v7.pcap")
    body = ex.response.body
    # tshark: Error: Unexpected Server Error (-1), Generation ID: -1, member id as below
    assert body["error_code"] == -1 and body["generation_id"] == -1
    assert body["member_id"] == "consumer-zzzz12-1-d8e04a09-9f69-4efe-8f78-617db03d8090"
    assert ex.error_names == ["UNKNOWN_SERVER_ERROR"]


def test_api_versions_v3_carries_the_java_client_software():
    (ex,), _ = run("deepflowio_deepflow__18-api-versions-v3.pcap")
    assert ex.request.body["client_software_name"] == "apache-kafka-java"
    assert ex.request.body["client_software_version"] == "3.0.0"


def test_mixed_capture_pairs_fetch_commit_and_heartbeat():
    exchanges, _ = run("deepflowio_deepflow__mixed-with-unsupported.pcap")
    assert sorted((e.api_name, e.api_version) for e in exchanges) == [
        ("Fetch", 13), ("Heartbeat", 4), ("OffsetCommit", 8)]
    assert all(e.status == "paired" for e in exchanges)


def test_vlan_tagged_list_offsets_without_response():
    exchanges, errors = run("arkime_arkime__kafka.pcap")
    (ex,) = exchanges
    assert (ex.api_name, ex.api_version, ex.status) == ("ListOffsets", 0, "response_missing")
    assert ex.topics == ["integration.test.topic1475007069352"]
    assert "response_missing" in [e.kind for e in errors]


def test_ntop_capture_librdkafka_and_java_producers():
    exchanges, errors = run("ntop_nDPI__kafka.pcapng")
    seen = {(e.api_name, e.api_version) for e in exchanges if e.api_name}
    # README: librdkafka (ApiVersions v0, Metadata v2, Produce v3) and a Java console
    # producer (ApiVersions v3, InitProducerId v4, Metadata v12, Produce v9)
    assert {("ApiVersions", 0), ("Metadata", 2), ("Produce", 3), ("ApiVersions", 3),
            ("InitProducerId", 4), ("Metadata", 12), ("Produce", 9)} <= seen
    # README: responses whose requests were not captured
    assert any(e.status == "request_missing" for e in exchanges)
    # librdkafka's padded ApiVersions v0 is a known quirk, not an anomaly
    assert not [e for e in errors if e.kind == "trailing_bytes"]
    produce9 = next(e for e in exchanges if (e.api_name, e.api_version) == ("Produce", 9))
    assert produce9.topics == ["sampleTopic"] and produce9.client_id == "console-producer"


def test_configured_port_only_without_detection_ignores_other_ports():
    exchanges, _ = run("deepflowio_deepflow__00-produce-v9.pcap", kafka_ports=frozenset({9092}), detect=False)
    if exchanges:  # this capture may use 9092; then it is still decoded
        assert exchanges[0].api_name == "Produce"
    exchanges, _ = run("deepflowio_deepflow__18-api-versions-v3.pcap", kafka_ports=frozenset({1}), detect=False)
    assert exchanges == []
