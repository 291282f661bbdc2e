"""Protocol detection: the rules the Dissector runs (kwinspect/stream/detect.py).

Oracles we did not write: the public captures (which side is the broker is
known from their README: ports 9092 and 36333), TLS ClientHellos produced by
Python's own ssl module, and requests/responses encoded by kafka-python. The
verdicts are checked both on the pure functions and through the Dissector, on
what a user sees: which endpoint is the broker, exchanges decoded, and the
tls_stream / not_kafka error rows with their messages.
"""

from __future__ import annotations

import socket
import ssl
from pathlib import Path

import pytest
from helpers.pcapgen import conversation
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from kwinspect.dissect import DissectConfig, Dissector
from kwinspect.model import Endpoint, ErrorRow, Exchange
from kwinspect.run.files import FileRun, dissect_files
from kwinspect.stream.detect import (
    DETECT_BUFFER,
    ENDED_MESSAGE,
    KAFKA,
    NO_REQUEST_MESSAGE,
    NOT_KAFKA,
    TLS,
    TLS_MESSAGE,
    UNCLEAR_BROKER_MESSAGE,
    UNDECIDED,
    Verdict,
    decide,
    decide_at_end,
    is_tls_start,
    request_at_start,
)
from kwinspect.stream.framing import DEFAULT_MAX_FRAME_SIZE

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



C = Endpoint("10.0.0.1", 51000)  # the client, when a test says so
S = Endpoint("10.0.0.2", 36333)  # the broker, on a port nobody configured
OTHER_PROTOCOLS = [
    b"GET /metrics HTTP/1.1\r\nHost: broker:9092\r\n\r\n",
    b"HTTP/1.1 400 Bad Request\r\n\r\n",
    b"SSH-2.0-OpenSSH_9.6\r\n",
    b"*1\r\n$4\r\nPING\r\n",
    # PostgreSQL StartupMessage: length, protocol 3.0, "user\0..." pairs
    (lambda body: (len(body) + 4).to_bytes(4, "big") + body)(b"\x00\x03\x00\x00user\x00postgres\x00database\x00db\x00\x00"),
    bytes(64),
]
OTHER_IDS = ["http-req", "http-resp", "ssh", "redis", "postgres", "zeros"]


def verdict(first_c: bytes, first_s: bytes, *, syn: bool = False, ports=(), detect: bool = True, known=(),
            held: int | None = None, sides=(C, S), max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> Verdict:
    """decide() as the Dissector asks it: `first_c` is what C sent, `first_s` what S sent.

    With `syn` C sent the SYN (the driver then knows C as client and S as broker);
    without it the driver knows the broker only when exactly one side is on a port of `ports`."""
    first = {C: first_c, S: first_s}
    if syn:
        client, broker = C, S
    else:
        on_port = [ep for ep in sides if ep.port in ports]
        client, broker = (None, None)
        if len(on_port) == 1:
            broker = on_port[0]
            client = sides[1] if broker == sides[0] else sides[0]
    return decide(sides, (first[sides[0]], first[sides[1]]), client=client, broker=broker, syn_seen=syn,
                  kafka_ports=frozenset(ports), detect=detect, known_brokers=set(known),
                  held_bytes=len(first_c) + len(first_s) if held is None else held, max_frame_size=max_frame_size)


# ---------------------------------------------------------------------------
# decide: the rules, in order
# ---------------------------------------------------------------------------


def test_tls_client_hello_from_the_ssl_module():
    hello = client_hello()
    assert is_tls_start(hello) and is_tls_start(hello[:3]) and not is_tls_start(hello[:2])
    for kw in ({}, {"syn": True}, {"ports": {36333}, "syn": True}, {"known": {S}}):
        assert verdict(hello, b"", **kw) == Verdict(TLS, message=TLS_MESSAGE), kw
        assert verdict(b"", hello, **kw) == Verdict(TLS, message=TLS_MESSAGE), kw
    assert verdict(hello[:3], b"", syn=True).kind == TLS
    assert verdict(hello[:2], b"", syn=True).kind == UNDECIDED
    assert verdict(hello, b"", detect=False).kind == TLS


def test_a_configured_broker_port_decides_before_the_bytes():
    http = OTHER_PROTOCOLS[0]
    assert verdict(http, b"", syn=True, ports={36333}) == Verdict(KAFKA, C, S)
    assert verdict(b"", b"", ports={36333}) == Verdict(KAFKA, C, S)
    assert verdict(http, b"", ports={36333}, sides=(S, C)) == Verdict(KAFKA, C, S)
    # the SYN names the broker: its port must be the configured one
    assert verdict(http, b"", syn=True, ports={51000}).kind == NOT_KAFKA
    # both ports configured and no SYN: the port does not tell, the bytes must
    assert verdict(produce_request(1), b"", ports={36333, 51000}).kind == UNDECIDED


def test_without_detection_other_ports_are_not_kafka_without_an_error_row():
    req = produce_request(3)
    assert verdict(req, produce_response(3), syn=True, detect=False) == Verdict(NOT_KAFKA)
    assert verdict(req, b"", ports={36333}, syn=True, detect=False) == Verdict(KAFKA, C, S)
    assert verdict(req, b"", detect=False, known={S}) == Verdict(NOT_KAFKA)


def test_a_broker_proven_on_another_connection_is_the_broker():
    assert verdict(b"", b"", known={S}) == Verdict(KAFKA, C, S)
    assert verdict(b"", b"", known={S}, sides=(S, C)) == Verdict(KAFKA, C, S)
    # it outranks the SYN and the bytes
    assert verdict(produce_request(1), b"", syn=True, known={C}) == Verdict(KAFKA, S, C)
    # both proven brokers (broker to broker): the bytes decide
    assert verdict(b"", b"", known={C, S}).kind == UNDECIDED
    assert verdict(produce_request(4), b"", syn=True, known={C, S}) == Verdict(KAFKA, C, S)


def test_with_the_syn_one_request_from_its_sender_proves_kafka():
    req = produce_request(5) + metadata_request(6)
    header_end = 4 + 10 + len("producer-1")
    assert verdict(req, b"", syn=True) == Verdict(KAFKA, C, S)
    assert verdict(req[:header_end], b"", syn=True) == Verdict(KAFKA, C, S)
    for cut in range(13):
        assert verdict(req[:cut], b"", syn=True) == Verdict(UNDECIDED), cut
    # from 14 bytes on, a cut client id is no request: the client should have sent one
    for cut in range(14, header_end):
        assert verdict(req[:cut], b"", syn=True) == Verdict(NOT_KAFKA, message=NO_REQUEST_MESSAGE), cut
    # a request from the side that accepted the connection proves nothing
    assert verdict(b"", req, syn=True) == Verdict(UNDECIDED)


@pytest.mark.parametrize("data", OTHER_PROTOCOLS, ids=OTHER_IDS)
def test_other_protocols_are_not_kafka(data):
    assert verdict(data, b"", syn=True) == Verdict(NOT_KAFKA, message=NO_REQUEST_MESSAGE)
    assert verdict(data, data, syn=True) == Verdict(NOT_KAFKA, message=NO_REQUEST_MESSAGE)
    # without the SYN nothing is said until the buffer is full
    assert verdict(data, data) == Verdict(UNDECIDED)
    assert verdict(data, data, held=DETECT_BUFFER) == Verdict(UNDECIDED)
    assert verdict(data, data, held=DETECT_BUFFER + 1) == Verdict(NOT_KAFKA, message=NO_REQUEST_MESSAGE)
    assert decide_at_end((data, data), DEFAULT_MAX_FRAME_SIZE) == Verdict(NOT_KAFKA, message=ENDED_MESSAGE)


def test_without_the_syn_the_other_side_must_answer_the_correlation_id():
    req, resp = produce_request(70000), produce_response(70000)
    for sides in ((C, S), (S, C)):
        assert verdict(req, resp, sides=sides) == Verdict(KAFKA, C, S)
        assert verdict(req, resp[:8], sides=sides) == Verdict(KAFKA, C, S)
        # no answer yet: wait, however many requests came
        assert verdict(req * 50, resp[:7], sides=sides) == Verdict(UNDECIDED)
        # (a cut answer is not read as a shorter correlation id)
        assert verdict(produce_request(5), b"\x00\x00\x00\x10\x00\x00\x05", sides=sides) == Verdict(UNDECIDED)
        assert verdict(produce_request(0), b"\x00\x00\x00", sides=sides) == Verdict(UNDECIDED)
        # an answer to another request: not this connection's client
        assert verdict(req, produce_response(70001), sides=sides) == Verdict(UNDECIDED)
    assert verdict(req, b"", held=DETECT_BUFFER + 1) == Verdict(NOT_KAFKA, message=NO_REQUEST_MESSAGE)


def test_small_correlation_ids_make_responses_look_like_requests():
    """A Produce v2 response with cid 2 reads as 'Produce v2, cid 1, client id orders'."""
    req, resp = produce_request(2), produce_response(2, version=2)
    assert request_at_start(resp, DEFAULT_MAX_FRAME_SIZE) == 1  # the trap
    for sides in ((C, S), (S, C)):
        assert verdict(req, resp, sides=sides) == Verdict(KAFKA, C, S)


def test_request_at_start_checks_size_and_header():
    req = produce_request(9)
    assert request_at_start(req, DEFAULT_MAX_FRAME_SIZE) == 9
    assert request_at_start(req[:13], DEFAULT_MAX_FRAME_SIZE) is None
    assert request_at_start(req, len(req) - 5) is None  # the size prefix is over the frame limit
    assert request_at_start(b"\x00\x00\x00\x00" + req[4:], DEFAULT_MAX_FRAME_SIZE) is None
    assert request_at_start(req[:4] + b"\x7f\x7f" + req[6:], DEFAULT_MAX_FRAME_SIZE) is None  # no such api key
    assert verdict(req, b"", syn=True, max_frame_size=len(req) - 5).kind == NOT_KAFKA


def test_connections_ending_undecided():
    req = produce_request(9)
    unclear = Verdict(NOT_KAFKA, message=UNCLEAR_BROKER_MESSAGE)
    assert decide_at_end((req, b""), DEFAULT_MAX_FRAME_SIZE) == unclear
    assert decide_at_end((b"", req), DEFAULT_MAX_FRAME_SIZE) == unclear
    assert decide_at_end((req[:13], b""), DEFAULT_MAX_FRAME_SIZE) == Verdict(NOT_KAFKA, message=ENDED_MESSAGE)
    assert decide_at_end((b"", b""), DEFAULT_MAX_FRAME_SIZE) == Verdict(NOT_KAFKA, message=ENDED_MESSAGE)


@settings(max_examples=300, deadline=None)
@given(a=st.binary(max_size=80), b=st.binary(max_size=80), syn=st.booleans(), detect=st.booleans(),
       ports=st.sets(st.sampled_from([51000, 36333, 9092]), max_size=2),
       known=st.sets(st.sampled_from([C, S]), max_size=2), swap=st.booleans(), held=st.integers(0, 2 * DETECT_BUFFER))
def test_property_never_raises_and_kafka_names_both_sides(a, b, syn, detect, ports, known, swap, held):
    v = verdict(a, b, syn=syn, ports=ports, detect=detect, known=known, held=held, sides=(S, C) if swap else (C, S))
    assert v.kind in (KAFKA, TLS, NOT_KAFKA, UNDECIDED)
    if v.kind == KAFKA:
        assert {v.client, v.broker} == {C, S} and v.message is None
    else:
        assert v.client is None and v.broker is None
    assert (v.message is None) == (v.kind in (KAFKA, UNDECIDED) or (v.kind == NOT_KAFKA and not detect))
    assert decide_at_end((a, b), DEFAULT_MAX_FRAME_SIZE).kind == NOT_KAFKA


@settings(max_examples=100, deadline=None)
@given(cid=st.integers(0, 2**31 - 1), extra=st.binary(max_size=100))
def test_property_a_request_stays_a_request_with_more_bytes(cid, extra):
    req = produce_request(cid)
    assert verdict(req, b"", syn=True) == verdict(req + extra, b"", syn=True) == Verdict(KAFKA, C, S)
    assert request_at_start(req + extra, DEFAULT_MAX_FRAME_SIZE) == cid


# ---------------------------------------------------------------------------
# Through the Dissector: the rows a user sees
# ---------------------------------------------------------------------------


def dissect(*conns, **config) -> tuple[list[Exchange], list[ErrorRow], Dissector]:
    d = Dissector(DissectConfig(**config))
    events = []
    for segs in conns:
        for seg in segs:
            d.feed_segment(seg)
            events += d.drain()
    d.finish()
    events += d.drain()
    return ([e for e in events if isinstance(e, Exchange)], [e for e in events if isinstance(e, ErrorRow)], d)


def test_dissector_detects_kafka_on_any_port_with_or_without_the_syn():
    msgs = [("c", produce_request(7)), ("s", produce_response(7))]
    for handshake in (True, False):
        exchanges, errors, d = dissect(conversation(C, S, msgs, handshake=handshake))
        assert [(e.client, e.broker, e.correlation_id) for e in exchanges] == [(str(C), str(S), 7)], handshake
        assert not [e for e in errors if e.kind in ("not_kafka", "tls_stream")]  # (the records are zeros)
        (info,) = d.connections.values()
        assert (info.kind, info.client, info.broker) == ("kafka", C, S)


def test_dissector_reports_tls_and_other_protocols_with_their_messages():
    tls = conversation(C, S, [("c", client_hello()), ("s", b"\x16\x03\x03\x00\x10" + bytes(16))])
    http = conversation(Endpoint("10.0.0.3", 40000), Endpoint("10.0.0.4", 8080),
                        [("c", OTHER_PROTOCOLS[0]), ("s", OTHER_PROTOCOLS[1])])
    ended = conversation(Endpoint("10.0.0.5", 40001), Endpoint("10.0.0.6", 8081), [("c", b"hi")])
    unclear = conversation(Endpoint("10.0.0.7", 40002), Endpoint("10.0.0.8", 8082), [("c", produce_request(1))],
                           handshake=False)
    exchanges, errors, _ = dissect(tls, http, ended, unclear)
    assert not exchanges
    assert [(e.kind, e.message) for e in errors] == [
        ("tls_stream", TLS_MESSAGE + " (no key log given: --tls-keylog FILE decrypts it)"),
        ("not_kafka", NO_REQUEST_MESSAGE),
        ("not_kafka", ENDED_MESSAGE),
        ("not_kafka", UNCLEAR_BROKER_MESSAGE),
    ]
    _, errors, d = dissect(http, detect=False)
    assert not errors and [i.kind for i in d.connections.values()] == ["not_kafka"]


def test_dissector_remembers_brokers_across_connections():
    """The second connection has no SYN and no answer: only the first one proves which side is the broker."""
    first = conversation(C, S, [("c", produce_request(1)), ("s", produce_response(1))])
    c2 = Endpoint("10.0.0.9", 52000)
    second = conversation(c2, S, [("s", produce_response(3))], handshake=False, ts0=1_700_000_001.0)
    exchanges, errors, d = dissect(first, second)
    infos = sorted(d.connections.values(), key=lambda i: i.first_ts)
    assert [(i.kind, i.client, i.broker) for i in infos] == [("kafka", C, S), ("kafka", c2, S)]
    assert [e.kind for e in errors] == ["response_missing"] or not [e for e in errors if e.kind == "not_kafka"]
    alone_exchanges, alone_errors, _ = dissect(second)
    assert [e.kind for e in alone_errors] == ["not_kafka"]


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


def capture_verdicts(path: Path, use_syn: bool, kafka_ports=()):
    """(ports, verdict) of every connection of a capture, as decide() answers on all its first bytes."""
    out = []
    for ports, first, init in capture_connections(path):
        sides = (Endpoint("a", ports[0]), Endpoint("b", ports[1]))
        syn = use_syn and init is not None
        client = sides[init] if syn else None
        broker = sides[1 - init] if syn else None
        on_port = [ep for ep in sides if ep.port in kafka_ports]
        if not syn and len(on_port) == 1:
            broker = on_port[0]
            client = sides[1] if broker == sides[0] else sides[0]
        v = decide(sides, (first[0][:64], first[1][:64]), client=client, broker=broker, syn_seen=syn,
                   kafka_ports=frozenset(kafka_ports), detect=True, known_brokers=set(),
                   held_bytes=len(first[0]) + len(first[1]), max_frame_size=DEFAULT_MAX_FRAME_SIZE)
        out.append((ports, v))
    return out


# No handshake and the broker's answer not captured: detection cannot tell the broker.
UNDECIDABLE = "deepflowio_deepflow__produce-v9.2023-12-07-old.pcap"


@pytest.mark.skipif(not CAPTURES.is_dir(), reason=f"public captures not found at {CAPTURES}")
@pytest.mark.parametrize("path", public_captures(), ids=lambda p: p.name)
@pytest.mark.parametrize("use_syn", [True, False])
def test_public_captures_detection_never_names_the_wrong_broker(path, use_syn):
    """Per connection, on its own (no broker proven elsewhere): Kafka with the right broker, or wait."""
    verdicts = capture_verdicts(path, use_syn)
    assert verdicts
    for ports, v in verdicts:
        assert v.kind in (KAFKA, UNDECIDED), (ports, v)
        if v.kind == KAFKA:
            assert v.broker.port in BROKER_PORTS and v.client.port not in BROKER_PORTS, (ports, v)
    if use_syn and path.name != UNDECIDABLE:
        assert KAFKA in [v.kind for _p, v in verdicts]
    # with the default --kafka-ports 9092, a broker on 9092 is one whatever the bytes
    for ports, v in capture_verdicts(path, use_syn, {9092}):
        if 9092 in ports:
            assert v.kind == KAFKA and v.broker.port == 9092, (ports, v)


@pytest.mark.skipif(not CAPTURES.is_dir(), reason=f"public captures not found at {CAPTURES}")
@pytest.mark.parametrize("path", public_captures(), ids=lambda p: p.name)
def test_public_captures_through_the_dissector_without_configuration(path):
    """What a user sees with no --kafka-ports at all: every connection Kafka with the right broker,
    except where neither a handshake nor an answer is in the capture, which is said."""
    run = FileRun()
    events = list(dissect_files([path], DissectConfig(kafka_ports=frozenset()), run))
    infos = list(run.dissector.connections.values())
    assert infos
    not_kafka = [e.message for e in events if isinstance(e, ErrorRow) and e.kind in ("not_kafka", "tls_stream")]
    if path.name == UNDECIDABLE:
        assert [i.kind for i in infos] == ["not_kafka"]
        assert not_kafka == [UNCLEAR_BROKER_MESSAGE]
        return
    assert not not_kafka
    for info in infos:
        assert info.kind == "kafka" and info.broker.port in BROKER_PORTS, info


@pytest.mark.skipif(not CAPTURES.is_dir(), reason=f"public captures not found at {CAPTURES}")
def test_vlan_tagged_capture_and_port_36333_are_covered():
    names = {p.name for p in public_captures()}
    assert "arkime_arkime__kafka.pcap" in names and UNDECIDABLE in names
    assert KAFKA in [v.kind for _p, v in capture_verdicts(CAPTURES / "arkime_arkime__kafka.pcap", True)]
    ports_36333 = [c for p in public_captures() for c in capture_connections(p) if 36333 in c[0]]
    assert len(ports_36333) >= 5
