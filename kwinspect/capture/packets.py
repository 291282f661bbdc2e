"""Link layer -> IP (v4 with defragmentation, v6) -> TCP, at fixed offsets.

`PacketParser.parse(raw)` returns a `TcpSegment` or None and counts every
packet in exactly one of: `tcp`, `other` (parsed fine, just not TCP: ARP, UDP,
ICMP, ...), `unparseable` (unknown link type, malformed or cut headers), or
`fragments_pending` (IP fragments waiting for the rest of their datagram; they
move to `tcp` or `unparseable` when the datagram completes or times out, and
`finish()` settles them).  So at any time:

    stats.packets == stats.tcp + stats.other + stats.unparseable + stats.fragments_pending

Implementation choice (measured on a 200k-packet Ethernet capture, see
bench/ and docs/architecture.md): struct.unpack_from at fixed offsets over the
packet bytes runs about 10x faster than building dpkt.ethernet.Ethernet objects
per packet (dpkt decodes every layer eagerly into Python objects), so dpkt is
used here only for its constants.  The parser does no IO and keeps no clock: IP
fragment timeouts are measured in packet timestamps.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from kwinspect import model
from kwinspect.capture import fastpath

if TYPE_CHECKING:  # packets.py and tcp.py stay importable without the file readers
    from .readers import RawPacket

__all__ = ["PacketParser", "ParserStats", "TcpSegment", "FIN", "SYN", "RST", "PSH", "ACK", "URG"]

FIN, SYN, RST, PSH, ACK, URG, ECE, CWR = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80

# Issue kinds reported by this module (besides model.TRUNCATED_PACKET)
MALFORMED_PACKET = "malformed_packet"
UNKNOWN_LINKTYPE = "unknown_linktype"
IP_FRAGMENT_INCOMPLETE = "ip_fragment_incomplete"

# LINKTYPE_* values (https://www.tcpdump.org/linktypes.html)
LINKTYPE_NULL = 0
LINKTYPE_ETHERNET = 1
LINKTYPE_RAW = 101
LINKTYPE_RAW_ALT = (12, 14)  # DLT_RAW on some BSDs, as written by old libpcap
LINKTYPE_LOOP = 108
LINKTYPE_LINUX_SLL = 113
LINKTYPE_IPV4 = 228
LINKTYPE_IPV6 = 229
LINKTYPE_LINUX_SLL2 = 276

_ETH_IPV4, _ETH_IPV6 = 0x0800, 0x86DD
_ETH_VLAN = (0x8100, 0x88A8, 0x9100, 0x9200)
# BSD loopback address families for IPv6 differ per OS (NetBSD/OpenBSD 24,
# FreeBSD 28, Darwin 30; Linux 10 shows up in some DLT_NULL files)
_AF_INET6 = (24, 28, 30, 10)
_IPV6_EXT = (0, 43, 60)  # hop-by-hop, routing, destination options
_IPV6_FRAG, _IPV6_AH, _IPV6_NONE = 44, 51, 59


IP4_HEADER = struct.Struct("!BBHHHBBH4s4s").unpack_from
TCP_HEADER = struct.Struct("!HHIIBB").unpack_from
_new = tuple.__new__


class TcpSegment(NamedTuple):
    """One TCP segment (after IP reassembly).

    `payload` is what was captured; `missing` counts payload bytes the IP
    header says were sent but the capture did not keep (snaplen cut), so the
    segment covers seq .. seq + len(payload) + missing in sequence space.
    `index` is the frame number (RawPacket.index) of the packet that carried
    it (the last fragment for a reassembled datagram).
    """

    ts: float
    src: model.Endpoint
    dst: model.Endpoint
    seq: int
    ack: int
    flags: int
    payload: bytes
    index: int
    missing: int = 0


@dataclass(slots=True)
class ParserStats:
    packets: int = 0
    tcp: int = 0
    other: int = 0
    unparseable: int = 0
    fragments_pending: int = 0
    truncated: int = 0  # packets whose TCP payload the snaplen cut (still counted as tcp)
    ip_fragments: int = 0  # fragment packets seen (any outcome)
    datagrams_reassembled: int = 0
    other_by_kind: dict[str, int] = field(default_factory=dict)  # "arp", "udp", "ethertype 0x..."
    unparseable_by_reason: dict[str, int] = field(default_factory=dict)

    def check(self) -> bool:
        return self.packets == self.tcp + self.other + self.unparseable + self.fragments_pending


class _Datagram:
    __slots__ = ("pieces", "total", "first_ts", "header_info", "nbytes", "count", "broken")

    def __init__(self, ts: float) -> None:
        self.pieces: dict[int, bytes] = {}
        self.total = -1  # payload length, known once the last fragment arrives
        self.first_ts = ts
        self.header_info: tuple[bytes, bytes, bool] | None = None
        self.nbytes = 0
        self.count = 0
        self.broken = False


class PacketParser:
    """Parses RawPackets down to TCP; IO-free and clock-free.

    frag_timeout: seconds (of packet time) an incomplete IP datagram is kept.
    max_frag_datagrams / max_frag_bytes: bounds on the reassembly buffers;
    when exceeded the oldest incomplete datagram is given up (counted and reported).
    max_issues: issues kept in `issues` (counters keep counting beyond it).
    """

    # (slots: the compiled packet loop reads them at every packet; the rest in the dict)
    __slots__ = ("stats", "endpoints", "__dict__")

    def __init__(self, *, frag_timeout: float = 30.0, max_frag_datagrams: int = 1024,
                 max_frag_bytes: int = 16 << 20, max_issues: int = 1000) -> None:
        self.stats = ParserStats()
        self.issues: list[model.Issue] = []
        self.issues_dropped = 0
        self.frag_timeout = frag_timeout
        self.max_frag_datagrams = max_frag_datagrams
        self.max_frag_bytes = max_frag_bytes
        self.max_issues = max_issues
        self._frags: dict[tuple, _Datagram] = {}
        self._frag_bytes = 0
        self.endpoints: dict[tuple[bytes, int], model.Endpoint] = {}
        self._unknown_lt: set[int] = set()
        self._u16 = struct.Struct("!H").unpack_from
        self._tcp_hdr = struct.Struct("!HHIIBB").unpack_from
        # the compiled fast path, as the facade has it when the parser is made (None: Python)
        self._c_segment = fastpath.tcp_segment

    # ------------------------------------------------------------------
    def _issue(self, kind: str, message: str, severity: str = model.SEVERITY_WARNING) -> None:
        if len(self.issues) < self.max_issues:
            self.issues.append(model.Issue(kind, message, severity=severity))
        else:
            self.issues_dropped += 1

    def _bad(self, reason: str, raw: RawPacket, detail: str = "", kind: str = MALFORMED_PACKET) -> None:
        st = self.stats
        st.unparseable += 1
        st.unparseable_by_reason[reason] = st.unparseable_by_reason.get(reason, 0) + 1
        self._issue(kind, f"frame {raw.index}: {reason}{': ' + detail if detail else ''}")

    def _other(self, kind: str) -> None:
        st = self.stats
        st.other += 1
        st.other_by_kind[kind] = st.other_by_kind.get(kind, 0) + 1

    def endpoint(self, ip: bytes, port: int) -> model.Endpoint:
        key = (ip, port)
        ep = self.endpoints.get(key)
        if ep is None:
            if len(self.endpoints) > 100_000:
                self.endpoints.clear()
            if len(ip) == 4:
                s = socket.inet_ntop(socket.AF_INET, ip)
            else:
                s = socket.inet_ntop(socket.AF_INET6, ip)
            ep = self.endpoints[key] = model.Endpoint(s, port)
        return ep

    # ------------------------------------------------------------------
    def parse(self, raw: RawPacket) -> TcpSegment | None:
        """Parse one packet; None when it is not (yet) a TCP segment. Never raises."""
        st = self.stats
        st.packets += 1
        c_segment = self._c_segment
        if c_segment is not None:  # the compiled core's fast path (capture/_cpackets.c)
            seg = c_segment(raw, self.endpoints, TcpSegment)
            if seg is not None:
                st.tcp += 1
                return seg
        data = raw.data
        # Fast path for the bulk of real traffic: Ethernet, IPv4 without options or
        # fragmentation, TCP, nothing cut by the snaplen.  Anything else (or anything
        # odd) takes the general path below, which re-checks everything.
        if raw.linktype == 1 and data[12:14] == b"\x08\x00" and len(data) >= 54:
            vihl, _tos, total, _id, frag, _ttl, proto, _sum, src, dst = IP4_HEADER(data, 14)
            if vihl == 0x45 and proto == 6 and not frag & 0x3FFF and 40 <= total <= len(data) - 14:
                sport, dport, seq, ack, doff, flags = TCP_HEADER(data, 34)
                hl = (doff >> 4) * 4
                if 20 <= hl <= total - 20:
                    st.tcp += 1
                    cache = self.endpoints
                    a = cache.get((src, sport)) or self.endpoint(src, sport)
                    b = cache.get((dst, dport)) or self.endpoint(dst, dport)
                    return _new(TcpSegment, (raw.ts, a, b, seq, ack, flags,
                                             data[34 + hl:14 + total], raw.index, 0))
        try:
            return self._parse(raw)
        except (struct.error, IndexError, ValueError) as e:  # defensive: a cut header
            self._bad("truncated or malformed header", raw, str(e), kind=model.TRUNCATED_PACKET)
            return None

    def _parse(self, raw: RawPacket) -> TcpSegment | None:
        data = raw.data
        lt = raw.linktype
        n = len(data)
        if lt == LINKTYPE_ETHERNET:
            if n < 14:
                self._bad("Ethernet header cut", raw, kind=model.TRUNCATED_PACKET)
                return None
            etype = (data[12] << 8) | data[13]
            off = 14
            while etype in _ETH_VLAN:  # 802.1Q / QinQ tags
                if n < off + 4:
                    self._bad("VLAN tag cut", raw, kind=model.TRUNCATED_PACKET)
                    return None
                etype = (data[off + 2] << 8) | data[off + 3]
                off += 4
        elif lt == LINKTYPE_LINUX_SLL2:
            if n < 20:
                self._bad("SLL2 header cut", raw, kind=model.TRUNCATED_PACKET)
                return None
            etype = (data[0] << 8) | data[1]
            off = 20
        elif lt == LINKTYPE_LINUX_SLL:
            if n < 16:
                self._bad("SLL header cut", raw, kind=model.TRUNCATED_PACKET)
                return None
            etype = (data[14] << 8) | data[15]
            off = 16
        elif lt == LINKTYPE_RAW or lt in LINKTYPE_RAW_ALT or lt == LINKTYPE_IPV4 or lt == LINKTYPE_IPV6:
            if not n:
                self._bad("empty packet", raw, kind=model.TRUNCATED_PACKET)
                return None
            v = data[0] >> 4
            etype = _ETH_IPV4 if v == 4 else _ETH_IPV6 if v == 6 else -1
            off = 0
        elif lt == LINKTYPE_NULL or lt == LINKTYPE_LOOP:
            if n < 4:
                self._bad("loopback header cut", raw, kind=model.TRUNCATED_PACKET)
                return None
            if lt == LINKTYPE_LOOP:
                fam = struct.unpack_from("!I", data)[0]
            else:  # host byte order of the machine that captured it
                fam = struct.unpack_from("<I", data)[0]
                if fam & 0xFFFF0000:
                    fam = struct.unpack_from(">I", data)[0]
            etype = _ETH_IPV4 if fam == 2 else _ETH_IPV6 if fam in _AF_INET6 else -1
            off = 4
        else:
            self.stats.unparseable += 1
            key = f"linktype {lt}"
            self.stats.unparseable_by_reason[key] = self.stats.unparseable_by_reason.get(key, 0) + 1
            if lt not in self._unknown_lt:
                self._unknown_lt.add(lt)
                self._issue(UNKNOWN_LINKTYPE, f"frame {raw.index}: link type {lt} is not "
                            "supported; its packets are counted as unparseable")
            return None

        if etype == _ETH_IPV4:
            return self._ipv4(raw, data, off)
        if etype == _ETH_IPV6:
            return self._ipv6(raw, data, off)
        if etype == 0x0806:
            self._other("arp")
        elif etype == -1:
            self._other("not ip")
        else:
            self._other(f"ethertype 0x{etype:04x}")
        return None

    # ------------------------------------------------------------------
    def _ipv4(self, raw: RawPacket, data: bytes, off: int) -> TcpSegment | None:
        n = len(data)
        if n < off + 20:
            self._bad("IPv4 header cut", raw, kind=model.TRUNCATED_PACKET)
            return None
        vihl, _tos, total, ident, frag, _ttl, proto, _sum, src, dst = IP4_HEADER(data, off)
        ihl = (vihl & 0x0F) * 4
        if vihl >> 4 != 4 or ihl < 20:
            self._bad("bad IPv4 header", raw, f"version/ihl byte 0x{vihl:02x}")
            return None
        if total == 0 and raw.wire_len > off:  # TSO captures can leave total length 0
            total = raw.wire_len - off
        if total < ihl:
            self._bad("bad IPv4 total length", raw, f"{total} < header {ihl}")
            return None
        if n < off + ihl:
            self._bad("IPv4 options cut", raw, kind=model.TRUNCATED_PACKET)
            return None
        end = off + total
        if frag & 0x3FFF:  # MF set or offset != 0
            self.stats.ip_fragments += 1
            if proto != 6:
                self._other("ip fragment (not tcp)")
                return None
            return self._fragment(raw, (src, dst, ident, 4), src, dst,
                                  (frag & 0x1FFF) * 8, bool(frag & 0x2000),
                                  data[off + ihl:end], end > n)
        if proto != 6:
            self._other("udp" if proto == 17 else "icmp" if proto == 1 else f"ip proto {proto}")
            return None
        return self._tcp(raw, data, off + ihl, end, src, dst)

    def _ipv6(self, raw: RawPacket, data: bytes, off: int) -> TcpSegment | None:
        n = len(data)
        if n < off + 40:
            self._bad("IPv6 header cut", raw, kind=model.TRUNCATED_PACKET)
            return None
        if data[off] >> 4 != 6:
            self._bad("bad IPv6 header", raw, f"version {data[off] >> 4}")
            return None
        plen = (data[off + 4] << 8) | data[off + 5]
        nh = data[off + 6]
        src = data[off + 8:off + 24]
        dst = data[off + 24:off + 40]
        if plen == 0:  # jumbogram or TSO: trust the frame
            plen = max(raw.wire_len, n) - off - 40
        end = off + 40 + plen
        p = off + 40
        while nh in _IPV6_EXT or nh == _IPV6_AH or nh == _IPV6_FRAG:
            if n < p + 8:
                self._bad("IPv6 extension header cut", raw, kind=model.TRUNCATED_PACKET)
                return None
            if nh == _IPV6_FRAG:
                self.stats.ip_fragments += 1
                nxt = data[p]
                fo = (data[p + 2] << 8) | data[p + 3]
                ident = struct.unpack_from("!I", data, p + 4)[0]
                if nxt != 6:
                    self._other("ipv6 fragment (not tcp)")
                    return None
                return self._fragment(raw, (src, dst, ident, 6), src, dst, fo & 0xFFF8,
                                      bool(fo & 1), data[p + 8:end], end > n)
            hlen = (data[p + 1] + 2) * 4 if nh == _IPV6_AH else (data[p + 1] + 1) * 8
            nh = data[p]
            p += hlen
        if nh != 6:
            self._other("udp" if nh == 17 else "icmpv6" if nh == 58 else f"ip proto {nh}")
            return None
        return self._tcp(raw, data, p, end, src, dst)

    # ------------------------------------------------------------------
    def _tcp(self, raw: RawPacket, data: bytes, p: int, end: int, src: bytes,
             dst: bytes) -> TcpSegment | None:
        """TCP header at data[p:], IP payload ends at `end` (may be beyond the capture)."""
        n = len(data)
        if n < p + 20 or end < p + 20:
            if end < p + 20:
                self._bad("TCP header longer than the IP payload", raw)
            else:
                self._bad("TCP header cut", raw, kind=model.TRUNCATED_PACKET)
            return None
        sport, dport, seq, ack, doff, flags = self._tcp_hdr(data, p)
        hl = (doff >> 4) * 4
        if hl < 20 or p + hl > end:
            self._bad("bad TCP data offset", raw, f"header length {hl}")
            return None
        if n < p + hl:
            self._bad("TCP options cut", raw, kind=model.TRUNCATED_PACKET)
            return None
        missing = 0
        if end > n:  # the snaplen cut the payload
            missing = end - n
            end = n
            self.stats.truncated += 1
        self.stats.tcp += 1
        cache = self.endpoints
        a = cache.get((src, sport)) or self.endpoint(src, sport)
        b = cache.get((dst, dport)) or self.endpoint(dst, dport)
        # tuple.__new__ skips the namedtuple's Python-level __new__ (about 1 us per packet)
        return _new(TcpSegment, (raw.ts, a, b, seq, ack, flags, data[p + hl:end], raw.index,
                                 missing))

    # ------------------------------------------------------------------
    def _fragment(self, raw: RawPacket, key: tuple, src: bytes, dst: bytes, foff: int,
                  more: bool, piece: bytes, cut: bool) -> TcpSegment | None:
        st = self.stats
        self._expire(raw.ts)
        dg = self._frags.get(key)
        if dg is None:
            if len(self._frags) >= self.max_frag_datagrams:
                self._give_up(next(iter(self._frags)), "too many incomplete IP datagrams")
            dg = self._frags[key] = _Datagram(raw.ts)
        dg.count += 1
        st.fragments_pending += 1
        if cut:
            dg.broken = True  # the snaplen cut a fragment: the datagram cannot be rebuilt
        if not more:
            dg.total = foff + len(piece)
        if foff not in dg.pieces:
            dg.pieces[foff] = piece
            dg.nbytes += len(piece)
            self._frag_bytes += len(piece)
        if foff == 0:
            dg.header_info = (src, dst, True)
        while self._frag_bytes > self.max_frag_bytes and self._frags:
            self._give_up(next(iter(self._frags)), "IP reassembly buffer full")
        if key not in self._frags or dg.total < 0 or dg.header_info is None:
            return None
        # complete?  walk the pieces in offset order
        pos = 0
        parts = []
        for o in sorted(dg.pieces):
            p = dg.pieces[o]
            if o > pos:
                return None  # a hole
            if o + len(p) > pos:
                parts.append(p[pos - o:])
                pos = o + len(p)
        if pos < dg.total:
            return None
        del self._frags[key]
        self._frag_bytes -= dg.nbytes
        st.fragments_pending -= dg.count
        if dg.broken:
            st.unparseable += dg.count
            reason = "fragmented datagram cut by the snaplen"
            st.unparseable_by_reason[reason] = st.unparseable_by_reason.get(reason, 0) + dg.count
            self._issue(model.TRUNCATED_PACKET, f"frame {raw.index}: {reason}")
            return None
        payload = b"".join(parts)[: dg.total]
        st.datagrams_reassembled += 1
        st.tcp += dg.count - 1  # _tcp counts the last one
        seg = self._tcp(raw, payload, 0, len(payload), src, dst)
        if seg is None:  # _tcp counted one unparseable; the others go with it
            st.tcp -= dg.count - 1
            st.unparseable += dg.count - 1
        return seg

    def _give_up(self, key: tuple, why: str) -> None:
        dg = self._frags.pop(key)
        self._frag_bytes -= dg.nbytes
        st = self.stats
        st.fragments_pending -= dg.count
        st.unparseable += dg.count
        st.unparseable_by_reason[why] = st.unparseable_by_reason.get(why, 0) + dg.count
        self._issue(IP_FRAGMENT_INCOMPLETE, f"{why}: {model.plural(dg.count, 'fragment')}, {model.plural(dg.nbytes, 'byte')} "
                    "of an IP datagram were never completed")

    def _expire(self, now: float) -> None:
        frags = self._frags
        while frags:
            key = next(iter(frags))
            if frags[key].first_ts + self.frag_timeout >= now:
                break
            self._give_up(key, "IP reassembly timeout")

    def finish(self) -> None:
        """End of input: incomplete datagrams become unparseable (reported)."""
        for key in list(self._frags):
            self._give_up(key, "capture ended before the IP datagram was complete")
