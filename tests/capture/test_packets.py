"""Packet parsing: every link type, VLAN tags, IPv4/IPv6, fragments, counters, tshark oracle."""

from __future__ import annotations

import struct

import pytest
from helpers import pcapgen
from helpers.pcapgen import ACK, PSH, build_frames, conversation, frame_for, ip_packet
from hypothesis import given, settings
from hypothesis import strategies as st

from kwinspect import model
from kwinspect.capture.packets import PacketParser, TcpSegment
from kwinspect.capture.readers import RawPacket, open_capture

V4 = (("192.168.1.10", 51000), ("192.168.1.20", 9092))
V6 = (("2001:db8::1", 51000), ("2001:db8::2", 9092))


def _raw(data: bytes, lt: int, index: int = 1, ts: float = 1.0, wire: int | None = None):
    return RawPacket(ts, lt, data, len(data) if wire is None else wire, index)


def _parse_all(frames, lt, parser=None):
    parser = parser or PacketParser()
    out = []
    for k, fr in enumerate(frames):
        seg = parser.parse(RawPacket(fr.ts, lt, fr.data, fr.wire_len, k + 1))
        if seg is not None:
            out.append(seg)
    return out, parser


def _same(a: TcpSegment, b: TcpSegment) -> bool:
    return (a.src, a.dst, a.seq, a.ack, a.flags, a.payload, a.missing) == (
        b.src, b.dst, b.seq, b.ack, b.flags, b.payload, b.missing)


_LT_CASES = [(name, lt, addrs) for name, lt in sorted(pcapgen.LINKTYPES.items())
             for addrs in (V4, V6)
             if not (name == "ipv4" and addrs is V6 or name == "ipv6" and addrs is V4)]


@pytest.mark.parametrize(("name", "lt", "addrs"), _LT_CASES,
                         ids=[f"{n}-v{4 if a is V4 else 6}" for n, _, a in _LT_CASES])
def test_every_link_type_roundtrips(name, lt, addrs):
    segs = conversation(*addrs, [("c", b"a" * 3000), ("s", b"b" * 10)], mss=1400,
                        isn_client=0xFFFFFF00)
    got, parser = _parse_all(build_frames(segs, lt), lt)
    assert len(got) == len(segs)
    assert all(_same(a, b) for a, b in zip(got, segs, strict=True))
    assert parser.stats.tcp == len(segs) and parser.stats.check()
    assert got[0].src == model.Endpoint(*addrs[0])


@pytest.mark.parametrize("order", ["<", ">"])
def test_bsd_null_either_host_byte_order(order):
    segs = conversation(*V6, [("c", b"q")])
    got, _ = _parse_all(build_frames(segs, pcapgen.LINKTYPE_NULL, null_order=order),
                        pcapgen.LINKTYPE_NULL)
    assert len(got) == len(segs)


@pytest.mark.parametrize("tags", [(), (100,), (100, 200), (1, 2, 3)])
def test_vlan_and_qinq(tags):
    segs = conversation(*V4, [("c", b"tagged")])
    got, _ = _parse_all(build_frames(segs, 1, vlan=tags), 1)
    assert [s.payload for s in got] == [s.payload for s in segs]


def test_ipv6_extension_header():
    seg = conversation(*V6, [("c", b"ext")], handshake=False, close=None, acks=False)[0]
    ip = ip_packet(seg, ipv6_ext=True)[0]
    out = PacketParser().parse(_raw(frame_for(ip, 1), 1))
    assert out is not None and out.payload == b"ext"


@pytest.mark.parametrize("perm", ["in_order", "reversed", "shuffled_dup"])
def test_ipv4_fragments_reassembled(perm):
    seg = conversation(*V4, [("c", bytes(range(256)) * 20)], mss=10000, handshake=False,
                       close=None, acks=False)[0]
    frames = build_frames([seg], 1, fragment_size=1480)
    assert len(frames) == 4
    if perm == "reversed":
        frames = frames[::-1]
    elif perm == "shuffled_dup":
        frames = [frames[2], frames[0], frames[2], frames[3], frames[1]]
    got, parser = _parse_all(frames, 1)
    assert len(got) == 1 and _same(got[0], seg)
    st_ = parser.stats
    assert st_.tcp == len(frames) and st_.fragments_pending == 0 and st_.check()
    assert st_.datagrams_reassembled == 1


def test_incomplete_fragments_time_out_and_are_counted():
    seg = conversation(*V4, [("c", b"z" * 4000)], mss=10000, handshake=False, close=None,
                       acks=False)[0]
    frames = build_frames([seg], 1, fragment_size=1480)[:-1]  # last fragment lost
    parser = PacketParser(frag_timeout=5.0)
    _parse_all(frames, 1, parser)
    assert parser.stats.fragments_pending == 2 and parser.stats.check()
    # a later packet (packet time, not wall clock) expires it
    other = conversation(*V4, [("c", b"later")], handshake=False, close=None, acks=False,
                         ts0=seg.ts + 100)[0]
    later = build_frames([other], 1, fragment_size=8)
    _parse_all(later, 1, parser)
    assert parser.stats.unparseable == 2
    assert any(i.kind == "ip_fragment_incomplete" for i in parser.issues)
    parser.finish()
    assert parser.stats.fragments_pending == 0 and parser.stats.check()


def test_fragment_buffers_are_bounded():
    parser = PacketParser(max_frag_datagrams=10, max_frag_bytes=50_000)
    seg = conversation(*V4, [("c", b"y" * 3000)], mss=10000, handshake=False, close=None,
                       acks=False)[0]
    for k in range(100):
        fr = build_frames([seg], 1, fragment_size=1480)[0]
        data = bytearray(fr.data)
        data[14 + 4:14 + 6] = struct.pack("!H", k)  # distinct IP ids
        parser.parse(_raw(bytes(data), 1, k + 1))
        assert len(parser._frags) <= 10 and parser._frag_bytes <= 50_000
    assert parser.stats.check()
    parser.finish()
    assert parser.stats.unparseable == 100 and parser.stats.check()


def test_non_tcp_and_garbage_are_counted():
    parser = PacketParser()
    udp = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 28, 0, 0, 64, 17, 0, b"\1\2\3\4", b"\5\6\7\10")
    arp = b"\xff" * 12 + b"\x08\x06" + b"\0" * 28
    cases = [
        (frame_for(udp + b"\0" * 8, 1), 1, "other"),
        (arp, 1, "other"),
        (b"\x01\x02", 1, "unparseable"),
        (b"\0" * 12 + b"\x08\x00" + b"\x45", 1, "unparseable"),  # IPv4 header cut
        (b"garbage", 147, "unparseable"),  # unknown link type
        (frame_for(udp, 1)[:14] + b"\x43" + b"\0" * 30, 1, "unparseable"),  # IHL 12
        (b"\0" * 12 + b"\x12\x34" + b"\0" * 40, 1, "other"),  # unknown ethertype
    ]
    for k, (data, lt, _) in enumerate(cases):
        assert parser.parse(_raw(data, lt, k + 1)) is None
    st_ = parser.stats
    assert st_.other == 3 and st_.unparseable == 4 and st_.check()
    assert any(i.kind == "unknown_linktype" for i in parser.issues)


def test_snaplen_cut_sets_missing():
    seg = conversation(*V4, [("c", b"m" * 1000)], handshake=False, close=None, acks=False)[0]
    cut = seg._replace(payload=seg.payload[:100], missing=900)
    fr = build_frames([cut], 1)[0]
    assert fr.wire_len - len(fr.data) == 900
    out = PacketParser().parse(RawPacket(fr.ts, 1, fr.data, fr.wire_len, 1))
    assert out is not None and out.payload == seg.payload[:100] and out.missing == 900


def test_ethernet_padding_is_not_payload():
    seg = conversation(*V4, [("c", b"")], handshake=True, close=None)[0]
    fr = build_frames([seg], 1)[0]
    out = PacketParser().parse(_raw(fr.data + b"\0" * 6, 1))  # padded to 60 bytes
    assert out is not None and out.payload == b""


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([0, 1, 12, 101, 108, 113, 228, 229, 276, 999]), st.binary(max_size=200))
def test_fuzz_never_raises_and_counts_every_packet(lt, data):
    parser = PacketParser()
    parser.parse(_raw(data, lt))
    # a valid IPv4/TCP header followed by the fuzz as options and payload
    seg = TcpSegment(1.0, model.Endpoint("1.2.3.4", 1), model.Endpoint("5.6.7.8", 2), 1, 2,
                     ACK | PSH, data, 1)
    ip = ip_packet(seg)[0]
    for cut in (len(ip), 30, 45):
        parser.parse(_raw(frame_for(ip, 1)[: 14 + cut], 1))
    parser.finish()
    assert parser.stats.packets == 4 and parser.stats.check()


def test_public_captures_match_tshark(tshark_frames):
    """Ports, raw sequence/ack numbers, flags and payload length per frame, as tshark sees them."""
    keys = ("tcp.srcport", "tcp.dstport", "tcp.seq_raw", "tcp.ack_raw", "tcp.flags", "tcp.len")
    for path, frames in tshark_frames.items():
        rows = [tuple(int(f[k], 0) for k in keys) for f in frames]
        parser = PacketParser()
        with open_capture(path) as src:
            segs = [parser.parse(r) for r in src]
        assert all(s is not None for s in segs), path
        # tshark prints the ack number even when the ACK flag is clear, and so do we
        got = [(s.src.port, s.dst.port, s.seq, s.ack, s.flags, len(s.payload)) for s in segs]
        assert got == rows, path
        assert parser.stats.tcp == len(rows) and parser.stats.check()


def test_vlan_capture_endpoints(public_captures):
    path = next(p for p in public_captures if "arkime" in p.name)  # 802.1Q, VLAN 300
    parser = PacketParser()
    with open_capture(path) as src:
        segs = [parser.parse(r) for r in src]
    assert {s.src for s in segs} == {model.Endpoint("10.10.10.10", 65056),
                                     model.Endpoint("10.176.192.13", 9092)}


def test_ipv6_fragments_reassembled():
    seg = conversation(*V6, [("c", bytes(range(200)) * 10)], mss=10000, handshake=False,
                       close=None, acks=False)[0]
    whole = ip_packet(seg)[0]
    tcp = whole[40:]
    src, dst = whole[8:24], whole[24:40]
    frames = []
    for off in range(0, len(tcp), 800):
        piece = tcp[off:off + 800]
        more = 1 if off + 800 < len(tcp) else 0
        fh = struct.pack("!BBHI", 6, 0, off | more, 0xBEEF)
        ip = struct.pack("!IHBB16s16s", 0x60000000, 8 + len(piece), 44, 64, src, dst) + fh + piece
        frames.append(frame_for(ip, 1))
    parser = PacketParser()
    out = [parser.parse(_raw(f, 1, k + 1)) for k, f in enumerate(frames[::-1])]
    got = [s for s in out if s is not None]
    assert len(got) == 1 and _same(got[0], seg)
    assert parser.stats.tcp == len(frames) and parser.stats.check()


def test_ipv4_total_length_zero_from_tso_uses_frame_length():
    seg = conversation(*V4, [("c", b"t" * 3000)], mss=5000, handshake=False, close=None,
                       acks=False)[0]
    fr = bytearray(build_frames([seg], 1)[0].data)
    fr[14 + 2:14 + 4] = b"\0\0"  # what a capture of a TSO super-segment can show
    out = PacketParser().parse(_raw(bytes(fr), 1))
    assert out is not None and out.payload == seg.payload


def test_fast_path_equals_general_path(public_captures):
    """parse() has an Ethernet/IPv4/TCP fast path; it must agree with the general path."""
    segs = conversation(*V4, MSGS_FAST, mss=700)
    frames = [RawPacket(f.ts, 1, f.data, f.wire_len, k + 1)
              for k, f in enumerate(build_frames(segs, 1))]
    for path in public_captures:
        with open_capture(path) as src:
            frames += list(src)
    fast, slow = PacketParser(), PacketParser()
    for raw in frames:
        slow.stats.packets += 1
        assert fast.parse(raw) == slow._parse(raw)
    assert (fast.stats.tcp, fast.stats.other, fast.stats.unparseable) == (
        slow.stats.tcp, slow.stats.other, slow.stats.unparseable)


MSGS_FAST = [("c", b"q" * 5000), ("s", b"r" * 100)]


def test_endpoints_are_the_parsers_own_after_its_cache_is_cleared_or_replaced():
    """The compiled parse remembers the last endpoints it found (capture/_cparse.h); an
    endpoint it hands out is always the object in the parser's dict at that moment, also
    after the parser clears the dict (as it does past 100,000 endpoints) or gets a new one."""
    seg = conversation(*V4, [("c", b"x")], handshake=False, close=None, acks=False)[0]
    fr = build_frames([seg], 1)[0]
    parser = PacketParser()

    def parsed():
        out = parser.parse(RawPacket(fr.ts, 1, fr.data, fr.wire_len, 1))
        assert out is not None
        assert out.src is next(ep for ep in parser.endpoints.values() if ep == out.src)
        assert out.dst is next(ep for ep in parser.endpoints.values() if ep == out.dst)
        return out

    first = parsed()
    again = parsed()  # the compiled path, from the dict or its memo
    assert again.src is first.src
    parser.endpoints.clear()
    cleared = parsed()
    assert cleared.src is not first.src and cleared.src == first.src
    parser.endpoints = {k: model.Endpoint(v.ip, v.port) for k, v in parser.endpoints.items()}
    replaced = parsed()
    assert replaced.src is not cleared.src and replaced.src == cleared.src
