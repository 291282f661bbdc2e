"""Dissector.feed_packet parses the common packet (Ethernet, IPv4 without options or
fragments, TCP, nothing cut) itself instead of calling PacketParser.parse: for any packet,
mangled headers included, the events, counts and parser books must be those of
parse + feed_segment."""

from __future__ import annotations

import glob
import os

import pytest
from helpers.pcapgen import LINKTYPES, build_frames, conversation, mangle
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kwinspect.capture.readers import RawPacket, open_capture
from kwinspect.dissect import DissectConfig, Dissector
from kwinspect.model import Endpoint

C = Endpoint("10.0.0.1", 40000)
S = Endpoint("10.0.0.2", 9092)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class ParsingDissector(Dissector):
    """feed_packet as it was: every packet through PacketParser.parse."""

    def feed_packet(self, raw) -> None:
        self.stats.packets += 1
        parser = self.parser
        pstats = parser.stats
        tcp_before = pstats.tcp
        seg = parser.parse(raw)
        self.report_parser_issues(raw.ts)
        if seg is not None:
            n = pstats.tcp - tcp_before
            self.feed_segment(seg, n if n > 1 else 1)


def _run(cls, packets, ports=frozenset({9092})):
    d = cls(DissectConfig(kafka_ports=ports))
    events = []
    for raw in packets:
        d.feed_packet(raw)
        events += [e.row() for e in d.drain()]
    d.finish()
    events += [e.row() for e in d.drain()]
    p = d.parser
    return (events, d.packet_counts(), d.packet_accounting_error(), p.stats,
            [(i.kind, i.message) for i in p.issues], d.tcp.stats)


def _request(cid: int, pad: int) -> bytes:
    payload = (18).to_bytes(2, "big") + (0).to_bytes(2, "big") + cid.to_bytes(4, "big") + b"\x00\x01c" + b"x" * pad
    return len(payload).to_bytes(4, "big") + payload


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 4), pad=st.integers(0, 3000), mss=st.sampled_from([100, 1460]),
       linktype=st.sampled_from(["ethernet", "ethernet", "sll", "raw"]),
       drop=st.sampled_from([0.0, 0.2]), truncate=st.sampled_from([0.0, 0.3]),
       flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 80), st.integers(0, 255)), max_size=8),
       seed=st.integers(0, 100))
def test_inlined_parse_is_parse(n, pad, mss, linktype, drop, truncate, flips, seed):
    msgs = []
    for cid in range(n):
        msgs += [("c", _request(cid, pad)), ("s", cid.to_bytes(4, "big") + b"\x00" * 12)]
    segs = mangle(conversation(C, S, msgs, mss=mss), drop=drop, truncate=truncate, seed=seed)
    frames = build_frames(segs, LINKTYPES[linktype])
    packets = [RawPacket(f.ts, LINKTYPES[linktype], f.data, f.wire_len, k + 1) for k, f in enumerate(frames)]
    for k, off, byte in flips:  # mangled headers (and payloads): never the fast path's to accept
        if packets:
            i = k % len(packets)
            raw = packets[i]
            data = bytearray(raw.data)
            if off < len(data):
                data[off] = byte
            packets[i] = raw._replace(data=bytes(data[: max(0, len(data) - k % 7)] if k % 5 == 0 else data))
    assert _run(Dissector, packets) == _run(ParsingDissector, packets)


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "captures", "*.pcap")))[:8])
def test_inlined_parse_is_parse_on_shipped_captures(path):
    with open_capture(path) as src:
        packets = list(src)
    ports = frozenset({9092, 19092, 29092, 39092})
    assert _run(Dissector, packets, ports) == _run(ParsingDissector, packets, ports)
