"""Real frames from third-party captures (../shared/captures-public) decode cleanly
and to the values their README says they hold.

The TCP payloads are extracted here with dpkt directly (not with kwinspect's
capture layer, which is tested on its own), reassembled per direction by
sequence number, split by the 4-byte size prefix, and responses are paired to
requests by correlation id per connection.
"""

from __future__ import annotations

import collections
import struct
from pathlib import Path

import dpkt
import pytest

from kwinspect.model import DECODE_ERROR
from kwinspect.protocol import decode_request, decode_response

CAPTURES = Path(__file__).resolve().parents[3] / "shared" / "captures-public"
SERVER_PORTS = {9092, 36333}

pytestmark = pytest.mark.skipif(not CAPTURES.is_dir(), reason=f"{CAPTURES} not present")


def tcp_directions(path: Path) -> dict[tuple, bytes]:
    """(src, sport, dst, dport) -> the direction's bytes, in sequence order, deduplicated."""
    with path.open("rb") as f:
        reader = dpkt.pcapng.Reader(f) if path.suffix == ".pcapng" else dpkt.pcap.Reader(f)
        segments: dict[tuple, dict[int, bytes]] = collections.defaultdict(dict)
        for _ts, buf in reader:
            ip = dpkt.ethernet.Ethernet(buf).data  # dpkt unwraps 802.1Q VLAN tags
            if not isinstance(ip, dpkt.ip.IP | dpkt.ip6.IP6) or not isinstance(ip.data, dpkt.tcp.TCP):
                continue
            tcp = ip.data
            if tcp.data:
                segments[(ip.src, tcp.sport, ip.dst, tcp.dport)].setdefault(tcp.seq, bytes(tcp.data))
    out = {}
    for key, by_seq in segments.items():
        data, next_seq = bytearray(), None
        for seq in sorted(by_seq):
            payload = by_seq[seq]
            if next_seq is not None and seq < next_seq:  # retransmission overlap
                payload = payload[next_seq - seq:]
            data += payload
            next_seq = max(next_seq or 0, seq + len(by_seq[seq]))
        out[key] = bytes(data)
    return out


def split_frames(data: bytes) -> tuple[list[bytes], int]:
    frames, pos = [], 0
    while pos + 4 <= len(data):
        (size,) = struct.unpack_from(">i", data, pos)
        if size < 0 or pos + 4 + size > len(data):
            break
        frames.append(data[pos + 4: pos + 4 + size])
        pos += 4 + size
    return frames, len(data) - pos


def exchanges(name: str):
    """[(request Message, response Message | None)] plus unpaired response frames."""
    directions = tcp_directions(CAPTURES / name)
    pairs, orphans = [], []
    for (src, sport, dst, dport), data in sorted(directions.items()):
        if dport not in SERVER_PORTS:
            continue
        requests, left = split_frames(data)
        assert left == 0, f"{left} request bytes left over on port {sport}"
        responses, rleft = split_frames(directions.get((dst, dport, src, sport), b""))
        assert rleft == 0
        by_corr = {}
        for frame in requests:
            msg = decode_request(frame)
            by_corr[msg.correlation_id] = [msg, None]
            pairs.append(by_corr[msg.correlation_id])
        for frame in responses:
            (corr,) = struct.unpack_from(">i", frame, 0)
            if corr not in by_corr:
                orphans.append(frame)
                continue
            req = by_corr[corr][0]
            by_corr[corr][1] = decode_response(frame, req.api_key, req.api_version)
    return [tuple(p) for p in pairs], orphans


ALL_CAPTURES = sorted(p.name for p in CAPTURES.glob("*.pcap*")) if CAPTURES.is_dir() else []

# (api key, version) of every request in each capture, in capture order per connection.
EXPECTED_REQUESTS = {
    "arkime_arkime__kafka.pcap": [(2, 0)],
    "deepflowio_deepflow__00-produce-v2.pcap": [(0, 2)],
    "deepflowio_deepflow__00-produce-v7-sw8.pcap": [(0, 7)],
    "deepflowio_deepflow__00-produce-v9.pcap": [(0, 9)],
    "deepflowio_deepflow__01-fetch-v12-ok.pcap": [(1, 12)],
    "deepflowio_deepflow__01-fetch-v12-perf.pcap": [(1, 12)],
    "deepflowio_deepflow__01-fetch-v12-unknown.pcap": [(1, 12)],
    "deepflowio_deepflow__11-join-group-v7.pcap": [(11, 7)],
    "deepflowio_deepflow__13-leave-group-v4.pcap": [(13, 4)],
    "deepflowio_deepflow__14-sync-group-v5.pcap": [(14, 5)],
    "deepflowio_deepflow__18-api-versions-v3.pcap": [(18, 3)],
    "deepflowio_deepflow__mixed-with-unsupported.pcap": [(1, 13), (8, 8), (12, 4)],
    "deepflowio_deepflow__produce-v9.2023-12-07-old.pcap": [(0, 9)],
}


@pytest.mark.parametrize("name", ALL_CAPTURES)
def test_capture_decodes_without_decode_errors(name):
    pairs, _orphans = exchanges(name)
    assert pairs
    for req, resp in pairs:
        for msg in (req, resp):
            if msg is None:
                continue
            errors = [i.as_dict() for i in msg.issues if i.kind == DECODE_ERROR or i.severity == "error"]
            assert errors == [], (msg.api_key, msg.api_version, errors)
            assert isinstance(msg.body, dict)
    if name in EXPECTED_REQUESTS:
        assert sorted((r.api_key, r.api_version) for r, _ in pairs) == sorted(EXPECTED_REQUESTS[name])


def _one(name):
    pairs, _ = exchanges(name)
    assert len(pairs) == 1
    return pairs[0]


def test_api_versions_v3_from_the_java_admin_client():
    req, resp = _one("deepflowio_deepflow__18-api-versions-v3.pcap")
    assert req.header["client_id"] == "adminclient-1"
    assert req.body == {"client_software_name": "apache-kafka-java", "client_software_version": "3.0.0"}
    assert resp.header == {"correlation_id": req.correlation_id}
    assert resp.body["error_code"] == 0
    ranges = {k["api_key"]: (k["min_version"], k["max_version"]) for k in resp.body["api_keys"]}
    # The broker answering a 3.0 client knows at least the APIs the client used in these captures.
    assert {0, 1, 3, 11, 14, 18} <= set(ranges)
    assert ranges[18][1] >= 3


def test_join_group_v7():
    req, resp = _one("deepflowio_deepflow__11-join-group-v7.pcap")
    assert req.body["group_id"] == "zzzz12"
    assert req.body["protocol_type"] == "consumer"
    assert [p["name"] for p in req.body["protocols"]] == ["range", "cooperative-sticky"]
    # ConsumerProtocolSubscription v1 inside the protocol metadata: the topic subscribed to.
    assert b"zqy-topic1" in req.body["protocols"][0]["metadata"]
    assert resp.body["member_id"].startswith("consumer-zzzz12-1-")


def test_sync_group_v5():
    req, resp = _one("deepflowio_deepflow__14-sync-group-v5.pcap")
    assert req.body["group_id"] == "zzzz12"
    assert req.body["protocol_type"] == "consumer" and req.body["protocol_name"] == "range"
    assert req.body["assignments"][0]["member_id"] == req.body["member_id"]
    assert resp.body["protocol_name"] == "range"
    assert b"zqy-topic1" in resp.body["assignment"]


def test_leave_group_v4():
    req, resp = _one("deepflowio_deepflow__13-leave-group-v4.pcap")
    assert req.body["group_id"] == "zzzz12"
    assert len(req.body["members"]) == 1
    assert resp.body["members"][0]["member_id"] == req.body["members"][0]["member_id"]


@pytest.mark.parametrize(("name", "version", "magic"), [
    ("deepflowio_deepflow__00-produce-v2.pcap", 2, 1),
    ("deepflowio_deepflow__00-produce-v7-sw8.pcap", 7, 2),
    ("deepflowio_deepflow__00-produce-v9.pcap", 9, 2),
])
def test_produce_requests_and_responses(name, version, magic):
    req, resp = _one(name)
    assert req.api_version == version
    partition = req.body["topic_data"][0]["partition_data"][0]
    records = partition["records"]
    assert len(records.batches) == 1
    assert records.batches[0].magic == magic
    topic = req.body["topic_data"][0]["name"]
    assert resp.body["responses"][0]["name"] == topic
    assert resp.body["responses"][0]["partition_responses"][0]["index"] == partition["index"]
    assert resp.body["responses"][0]["partition_responses"][0]["error_code"] == 0


def test_mixed_capture_fetch_offset_commit_heartbeat():
    pairs, _ = exchanges("deepflowio_deepflow__mixed-with-unsupported.pcap")
    by_api = {req.api_key: (req, resp) for req, resp in pairs}
    commit_req, commit_resp = by_api[8]
    assert commit_req.body["group_id"] == "frauddetectionservice"
    assert commit_req.body["topics"][0]["name"] == "orders"
    assert commit_resp.body["topics"][0]["partitions"][0]["error_code"] == 0
    hb_req, hb_resp = by_api[12]
    assert hb_req.body["member_id"] == commit_req.body["member_id"]
    assert hb_resp.body == {"throttle_time_ms": 0, "error_code": 0}
    fetch_req, fetch_resp = by_api[1]
    assert fetch_req.api_version == 13
    assert fetch_resp.body["session_id"] == fetch_req.body["session_id"]


def test_list_offsets_v0_on_a_vlan():
    (req, resp), = exchanges("arkime_arkime__kafka.pcap")[0]
    assert resp is None  # no response was captured
    assert req.body["replica_id"] == -1
    partition = req.body["topics"][0]["partitions"][0]
    assert partition == {"partition_index": 0, "timestamp": -1, "max_num_offsets": 1}


def test_ntop_librdkafka_and_java_clients():
    pairs, orphans = exchanges("ntop_nDPI__kafka.pcapng")
    requests = collections.Counter((r.header["client_id"], r.api_key, r.api_version) for r, _ in pairs)
    # librdkafka: ApiVersions v0, Metadata v2, Produce v3.
    assert requests[("rdkafka", 18, 0)] >= 1
    assert requests[("rdkafka", 3, 2)] >= 1
    assert requests[("rdkafka", 0, 3)] >= 1
    # Java console producer: ApiVersions v3, InitProducerId v4, Metadata v12, Produce v9.
    for api in ((18, 3), (22, 4), (3, 12), (0, 9)):
        assert requests[("console-producer", *api)] == 1, api
    java = {r.api_key: (r, s) for r, s in pairs if r.header["client_id"] == "console-producer"}
    assert java[18][0].body["client_software_name"] == "apache-kafka-java"
    assert java[22][1].body["error_code"] == 0
    topic = java[3][1].body["topics"][0]
    assert topic["name"] == "sampleTopic" and len(topic["topic_id"]) == 22
    for req, resp in pairs:
        if req.api_key == 0 and req.header["client_id"] == "rdkafka":
            assert req.body["topic_data"][0]["partition_data"][0]["records"].batches[0].magic == 2
            assert resp is not None and resp.body["responses"][0]["partition_responses"][0]["error_code"] == 0
    assert orphans  # responses whose requests were not captured
