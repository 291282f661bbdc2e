"""Protocol detection and broker-side decision.

Oracles we did not write: the public captures (which side is the broker is
known from their README: ports 9092 and 36333), TLS ClientHellos produced by
Python's own ssl module, and requests/responses encoded by kafka-python.
"""

from __future__ import annotations

import random
import socket
import ssl
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from kwinspect.stream.detect import (
    KAFKA_REQUEST,
    KAFKA_RESPONSE,
    KIND_KAFKA,
    KIND_NOT_KAFKA,
    KIND_TLS,
    KIND_UNDECIDED,
    NOT_KAFKA,
    TLS,
    UNKNOWN,
    classify_direction,
    decide_connection,
    is_tls_start,
    request_correlation_ids,
)

CAPTURES = Path(__file__).resolve().parents[3] / "shared" / "captures-public"
BROKER_PORTS = {9092, 36333}  # per the captures' README

_T = ProduceRequest.TopicProduceData
_P = _T.PartitionProduceData
_RT = ProduceResponse.TopicProduceResponse
_RP = _RT.PartitionProduceResponse


def produce_request(cid: int, version: int = 7, records: bytes = b"\x00" * 40) -> bytes:
    req = ProduceRequest[version](
        transactional_id=None, acks=1, timeout_ms=1000, topic_data=[_T(name="orders", partition_data=[_P(index=0, records=records)])]
    )
    req.with_header(correlation_id=cid, client_id="producer-1")
    return bytes(req.encode(framed=True, header=True))


def produce_response(cid: int, version: int = 7) -> bytes:
    resp = ProduceResponse[version](
        responses=[_RT(name="orders", partition_responses=[_RP(index=0, error_code=0, base_offset=42, log_append_time_ms=-1, log_start_offset=0)])],
        throttle_time_ms=0,
    )
    resp.with_header(correlation_id=cid)
    return bytes(resp.encode(framed=True, header=True))


def metadata_request(cid: int) -> bytes:
    req = MetadataRequest[12](topics=None, allow_auto_topic_creation=False)
    req.with_header(correlation_id=cid, client_id="admin")
    return bytes(req.encode(framed=True, header=True))


def client_hello() -> bytes:
    """A real TLS ClientHello, written by the ssl module into memory."""
    ctx = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_side=False, server_hostname="broker.example")
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return outgoing.read()


# ---------------------------------------------------------------------------
# classify_direction
# ---------------------------------------------------------------------------


def test_requests_are_recognised_and_need_only_the_header():
    frame = produce_request(5) + metadata_request(6)
    assert classify_direction(frame) == KAFKA_REQUEST
    header_end = 4 + 10 + len("producer-1")
    assert classify_direction(frame[:header_end]) == KAFKA_REQUEST
    for cut in range(1, header_end):
        assert classify_direction(frame[:cut]) in (UNKNOWN, KAFKA_RESPONSE)
        assert classify_direction(frame[:cut], final=True) in (NOT_KAFKA, KAFKA_RESPONSE)


def test_responses_are_recognised_by_the_correlation_ids_they_answer():
    resp = produce_response(70000) + produce_response(70001)
    assert classify_direction(resp, correlation_ids={70000}) == KAFKA_RESPONSE
    assert classify_direction(resp, correlation_ids={1, 2}) == NOT_KAFKA
    # without the requests: response-shaped frames chain
    assert classify_direction(resp) == KAFKA_RESPONSE


def test_tls_client_hello_from_the_ssl_module():
    hello = client_hello()
    assert is_tls_start(hello)
    assert classify_direction(hello) == TLS
    assert classify_direction(hello[:3]) == TLS
    assert classify_direction(hello[:2]) == UNKNOWN
    assert classify_direction(hello[:2], final=True) == NOT_KAFKA


@pytest.mark.parametrize(
    "data",
    [
        b"GET /metrics HTTP/1.1\r\nHost: broker:9092\r\n\r\n",
        b"HTTP/1.1 400 Bad Request\r\n\r\n",
        b"SSH-2.0-OpenSSH_9.6\r\n",
        b"*1\r\n$4\r\nPING\r\n",
        # PostgreSQL StartupMessage: length, protocol 3.0, "user\0..." pairs
        (lambda body: (len(body) + 4).to_bytes(4, "big") + body)(b"\x00\x03\x00\x00user\x00postgres\x00database\x00db\x00\x00"),
        bytes(64),
    ],
    ids=["http-req", "http-resp", "ssh", "redis", "postgres", "zeros"],
)
def test_other_protocols_are_not_kafka(data):
    assert classify_direction(data, final=True) == NOT_KAFKA
    assert classify_direction(data, final=True, mid_stream=True) == NOT_KAFKA


def test_mid_stream_start_finds_requests_after_the_cut():
    stream = b"".join(produce_request(cid, records=random.Random(cid).randbytes(300)) for cid in range(10, 20))
    for cut in (1, 17, 100, 250):
        assert classify_direction(stream[cut:], mid_stream=True) == KAFKA_REQUEST
        assert classify_direction(stream[cut:]) != KAFKA_REQUEST


# ---------------------------------------------------------------------------
# decide_connection
# ---------------------------------------------------------------------------


def test_broker_is_the_side_receiving_requests_on_any_port():
    req, resp = produce_request(3), produce_response(3)
    v = decide_connection((51000, 36333), (req, resp))
    assert (v.kind, v.broker_side, v.directions) == (KIND_KAFKA, 1, (KAFKA_REQUEST, KAFKA_RESPONSE))
    v = decide_connection((36333, 51000), (resp, req))
    assert (v.kind, v.broker_side) == (KIND_KAFKA, 0)
    # requests only (the response was not captured)
    assert decide_connection((51000, 36333), (req, b"")).broker_side == 1


def test_small_correlation_ids_make_responses_look_like_requests():
    """Produce response with cid 2 reads as 'Produce v2, cid 1, client id orders'."""
    req, resp = produce_request(2), produce_response(2, version=2)
    assert classify_direction(resp) == KAFKA_REQUEST  # the trap
    assert classify_direction(resp, correlation_ids={2}) == KAFKA_RESPONSE
    for order in ((0, 1), (1, 0)):
        data = [req, resp] if order == (0, 1) else [resp, req]
        v = decide_connection((40000, 40001), data)
        assert v.kind == KIND_KAFKA
        assert v.broker_side == order[1], v
        assert v.directions[order[1]] == KAFKA_RESPONSE


def test_configured_ports_win_and_not_kafka_is_said():
    req = produce_request(9)
    v = decide_connection((9092, 51000), (b"", req), kafka_ports={9092})
    assert (v.kind, v.broker_side) == (KIND_KAFKA, 0)
    v = decide_connection((9092, 51000), (b"HTTP/1.1 200 OK\r\n\r\n", b"GET / HTTP/1.1\r\n\r\n"), kafka_ports={9092})
    assert (v.kind, v.broker_side) == (KIND_NOT_KAFKA, 0)
    v = decide_connection((8080, 51000), (b"HTTP/1.1 200 OK\r\n\r\n", b"GET / HTTP/1.1\r\n\r\n"), (), initiator=1)
    assert (v.kind, v.broker_side, v.issue_kind) == (KIND_NOT_KAFKA, 0, "not_kafka")


def test_tls_connections_are_reported_with_the_server_side():
    hello = client_hello()
    v = decide_connection((51000, 9093), (hello, b""))
    assert (v.kind, v.broker_side, v.issue_kind) == (KIND_TLS, 1, "tls_stream")
    v = decide_connection((9093, 51000), (b"", hello), kafka_ports={9093})
    assert (v.kind, v.broker_side) == (KIND_TLS, 0)


def test_undecided_until_enough_bytes():
    req = produce_request(4)
    v = decide_connection((51000, 40000), (req[:3], b""))
    assert v.kind == KIND_UNDECIDED and not v.decided
    assert decide_connection((51000, 40000), (req[:30], b"")).broker_side == 1
    assert decide_connection((51000, 40000), (b"", b""), final=True).kind == KIND_UNDECIDED


def test_mid_stream_connection():
    rng = random.Random(3)
    reqs = b"".join(produce_request(c, records=rng.randbytes(200)) for c in range(100, 110))
    resps = b"".join(produce_response(c) for c in range(100, 110))
    v = decide_connection((51000, 19092), (reqs[77:], resps[33:]), mid_stream=True)
    assert (v.kind, v.broker_side) == (KIND_KAFKA, 1)


def test_request_correlation_ids_reads_leading_requests():
    data = produce_request(7) + metadata_request(8) + b"\x00\x00"
    assert request_correlation_ids(data) == [7, 8]
    assert request_correlation_ids(b"GET / HTTP/1.1\r\n") == []


@settings(max_examples=200, deadline=None)
@given(a=st.binary(max_size=200), b=st.binary(max_size=200), final=st.booleans(), mid=st.booleans(),
       ports=st.tuples(st.integers(1, 65535), st.integers(1, 65535)), configured=st.sets(st.integers(1, 65535), max_size=3),
       initiator=st.sampled_from([None, 0, 1]))
def test_property_never_raises(a, b, final, mid, ports, configured, initiator):
    v = decide_connection(ports, (a, b), configured, initiator=initiator, final=final, mid_stream=mid)
    assert v.kind in (KIND_KAFKA, KIND_TLS, KIND_NOT_KAFKA, KIND_UNDECIDED)
    assert v.broker_side in (None, 0, 1)
    assert classify_direction(a, final=final, mid_stream=mid) in (TLS, KAFKA_REQUEST, KAFKA_RESPONSE, UNKNOWN, NOT_KAFKA)


@settings(max_examples=100, deadline=None)
@given(cid=st.integers(0, 2**31 - 1), extra=st.binary(max_size=100))
def test_property_a_request_stays_a_request_with_more_bytes(cid, extra):
    req = produce_request(cid)
    assert classify_direction(req) == KAFKA_REQUEST
    assert classify_direction(req + extra) == KAFKA_REQUEST


# ---------------------------------------------------------------------------
# Public captures: no configuration, port 36333 detected, VLAN-tagged one too
# ---------------------------------------------------------------------------


def capture_connections(path: Path):
    """[(ports, first_bytes, initiator)] per TCP connection, extracted with dpkt."""
    import dpkt

    with path.open("rb") as fh:
        try:
            reader = dpkt.pcap.Reader(fh)
        except ValueError:
            fh.seek(0)
            reader = dpkt.pcapng.Reader(fh)
        dirs: dict[tuple, list] = {}
        syn_from: dict[frozenset, tuple] = {}
        for _ts, buf in reader:
            ip = dpkt.ethernet.Ethernet(buf).data  # dpkt unwraps 802.1Q
            if not isinstance(ip, dpkt.ip.IP | dpkt.ip6.IP6) or not isinstance(ip.data, dpkt.tcp.TCP):
                continue
            tcp = ip.data
            fam = socket.AF_INET if isinstance(ip, dpkt.ip.IP) else socket.AF_INET6
            src, dst = (socket.inet_ntop(fam, ip.src), tcp.sport), (socket.inet_ntop(fam, ip.dst), tcp.dport)
            if tcp.flags & dpkt.tcp.TH_SYN and not tcp.flags & dpkt.tcp.TH_ACK:
                syn_from[frozenset((src, dst))] = src
            if tcp.data:
                dirs.setdefault((src, dst), []).append((tcp.seq, bytes(tcp.data)))
    conns: dict[frozenset, dict] = {}
    for (src, dst), segs in dirs.items():
        conns.setdefault(frozenset((src, dst)), {})[src] = segs
    out = []
    for key, sides in conns.items():
        eps = sorted(key | set(sides))
        if len(eps) != 2:
            continue
        first = []
        for ep in eps:
            segs = sides.get(ep, [])
            data, nxt = bytearray(), None
            for seq, payload in sorted(segs):
                if nxt is None or seq == nxt:
                    data += payload
                    nxt = seq + len(payload)
                elif seq > nxt:
                    break  # a gap: the leading bytes are enough
            first.append(bytes(data))
        init = eps.index(syn_from[key]) if key in syn_from else None
        out.append(((eps[0][1], eps[1][1]), first, init))
    return out


def public_captures():
    if not CAPTURES.is_dir():
        return []
    return sorted(p for p in CAPTURES.iterdir() if p.suffix in (".pcap", ".pcapng"))


@pytest.mark.skipif(not CAPTURES.is_dir(), reason=f"public captures not found at {CAPTURES}")
@pytest.mark.parametrize("path", public_captures(), ids=lambda p: p.name)
@pytest.mark.parametrize("use_syn", [True, False])
def test_public_captures_detected_without_configuration(path, use_syn):
    conns = capture_connections(path)
    assert conns
    for ports, first, init in conns:
        v = decide_connection(ports, first, (), initiator=init if use_syn else None, final=True)
        assert v.kind == KIND_KAFKA, (ports, v)
        assert ports[v.broker_side] in BROKER_PORTS, (ports, v)
        assert v.directions[1 - v.broker_side] == KAFKA_REQUEST
        assert v.directions[v.broker_side] in (KAFKA_RESPONSE, UNKNOWN)
        # and the same with the default --kafka-ports 9092
        v9092 = decide_connection(ports, first, {9092}, final=True)
        assert v9092.kind == KIND_KAFKA and ports[v9092.broker_side] in BROKER_PORTS


@pytest.mark.skipif(not CAPTURES.is_dir(), reason=f"public captures not found at {CAPTURES}")
def test_vlan_tagged_capture_and_port_36333_are_covered():
    names = {p.name for p in public_captures()}
    assert "arkime_arkime__kafka.pcap" in names
    conns = capture_connections(CAPTURES / "arkime_arkime__kafka.pcap")
    assert [c[0] for c in conns] and decide_connection(conns[0][0], conns[0][1], ()).kind == KIND_KAFKA
    ports_36333 = [c for p in public_captures() for c in capture_connections(p) if 36333 in c[0]]
    assert len(ports_36333) >= 5
