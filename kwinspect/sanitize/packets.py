"""Link, IP and TCP headers of the packets a sanitized capture is written with.

``parse(linktype, data) -> Packet | None`` finds the IP and TCP headers of a
captured frame (the link types kwinspect reads: Ethernet with VLAN tags, Linux
cooked v1/v2, raw IPv4/IPv6, BSD loopback); ``build(packet, ...)`` writes it
again with other addresses, ports, sequence and acknowledgement numbers, SACK edges
and payload, every length and checksum (IPv4 header, TCP) computed anew.  Link
addresses (MACs) are replaced through the same kind of mapping as IP addresses.

IPv4 fragments and IPv6 extension headers before TCP are not parsed here
(``parse`` returns None): the caller drops such packets and counts them.
"""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Callable
from dataclasses import dataclass

ETHERNET, RAW, LINUX_SLL, LINUX_SLL2, IPV4, IPV6, NULL, LOOP = 1, 101, 113, 276, 228, 229, 0, 108
RAW_ALT = (12, 14)
ETH_IPV4, ETH_IPV6, VLAN_TAGS = 0x0800, 0x86DD, (0x8100, 0x88A8, 0x9100)
TCP_SACK = 5


@dataclass
class Packet:
    """One captured IPv4/IPv6 TCP segment, with where its parts start in `data`."""

    data: bytes
    ip_offset: int
    version: int  # 4 | 6
    ip_header_len: int
    tcp_offset: int
    tcp_header_len: int
    payload_end: int  # end of the TCP payload in `data` (IP length, or what was captured)
    src: str
    dst: str
    sport: int
    dport: int
    seq: int
    ack: int
    flags: int

    @property
    def payload(self) -> bytes:
        return self.data[self.tcp_offset + self.tcp_header_len:self.payload_end]


def ip_offset(linktype: int, data: bytes) -> int | None:
    """Where the IP header starts, None for a frame that carries no IP."""
    if linktype == ETHERNET:
        off = 12
        while len(data) >= off + 2:
            ethertype = int.from_bytes(data[off:off + 2], "big")
            if ethertype in VLAN_TAGS:
                off += 4
                continue
            return off + 2 if ethertype in (ETH_IPV4, ETH_IPV6) else None
        return None
    if linktype == LINUX_SLL:
        return 16 if len(data) >= 16 and int.from_bytes(data[14:16], "big") in (ETH_IPV4, ETH_IPV6) else None
    if linktype == LINUX_SLL2:
        return 20 if len(data) >= 20 and int.from_bytes(data[0:2], "big") in (ETH_IPV4, ETH_IPV6) else None
    if linktype in (RAW, IPV4, IPV6) or linktype in RAW_ALT:
        return 0
    if linktype in (NULL, LOOP):
        return 4
    return None


def parse(linktype: int, data: bytes) -> Packet | None:
    off = ip_offset(linktype, data)
    if off is None or len(data) < off + 20:
        return None
    version = data[off] >> 4
    if version == 4:
        ihl = (data[off] & 0x0F) * 4
        total = int.from_bytes(data[off + 2:off + 4], "big")
        frag = int.from_bytes(data[off + 6:off + 8], "big")
        if data[off + 9] != 6 or frag & 0x3FFF or ihl < 20 or total < ihl:
            return None  # not TCP, or a fragment
        src, dst = data[off + 12:off + 16], data[off + 16:off + 20]
        end = off + total
    elif version == 6:
        if len(data) < off + 40 or data[off + 6] != 6:
            return None  # not TCP straight after the fixed header
        ihl = 40
        end = off + 40 + int.from_bytes(data[off + 4:off + 6], "big")
        src, dst = data[off + 8:off + 24], data[off + 24:off + 40]
    else:
        return None
    t = off + ihl
    if len(data) < t + 20:
        return None
    sport, dport, seq, ack, hl_flags = struct.unpack_from(">HHIIH", data, t)
    thl = (hl_flags >> 12) * 4
    if thl < 20 or len(data) < t + thl:
        return None
    return Packet(data, off, version, ihl, t, thl, max(min(end, len(data)), t + thl),
                  str(ipaddress.ip_address(bytes(src))), str(ipaddress.ip_address(bytes(dst))),
                  sport, dport, seq, ack, hl_flags & 0x01FF)


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f">{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def _map_sack(options: bytes, map_edge: Callable[[int], int]) -> bytes:
    """TCP options with SACK block edges mapped; everything else byte for byte."""
    out = bytearray(options)
    i = 0
    while i < len(out):
        kind = out[i]
        if kind == 0:
            break
        if kind == 1:
            i += 1
            continue
        if i + 1 >= len(out) or out[i + 1] < 2:
            break
        length = out[i + 1]
        if kind == TCP_SACK:
            for j in range(i + 2, min(i + length, len(out)) - 7, 8):
                left, right = struct.unpack_from(">II", out, j)
                struct.pack_into(">II", out, j, map_edge(left), map_edge(right))
        i += length
    return bytes(out)


def build(p: Packet, linktype: int, *, src: str, dst: str, seq: int, ack: int, payload: bytes,
          map_sack: Callable[[int], int] | None, map_link: Callable[[bytes], bytes],
          clear_fin: bool = False, sport: int | None = None, dport: int | None = None) -> bytes:
    """The packet again with these addresses, ports, numbers and payload; lengths and checksums anew."""
    link = bytearray(p.data[:p.ip_offset])
    _rewrite_link(linktype, link, map_link)
    ip = bytearray(p.data[p.ip_offset:p.ip_offset + p.ip_header_len])
    tcp = bytearray(p.data[p.tcp_offset:p.tcp_offset + p.tcp_header_len])
    struct.pack_into(">II", tcp, 4, seq & 0xFFFFFFFF, ack & 0xFFFFFFFF)
    struct.pack_into(">HH", tcp, 0, p.sport if sport is None else sport, p.dport if dport is None else dport)
    if clear_fin:  # a payload split over several packets: only the last one ends the stream
        tcp[13] &= 0xFE
    if map_sack is not None and p.tcp_header_len > 20:
        tcp[20:] = _map_sack(bytes(tcp[20:]), map_sack)
    tcp[16:18] = b"\0\0"
    src_b, dst_b = ipaddress.ip_address(src).packed, ipaddress.ip_address(dst).packed
    segment_len = len(tcp) + len(payload)
    if p.version == 4:
        struct.pack_into(">H", ip, 2, p.ip_header_len + segment_len)
        ip[12:16], ip[16:20] = src_b, dst_b
        ip[10:12] = b"\0\0"
        struct.pack_into(">H", ip, 10, _checksum(bytes(ip)))
        pseudo = src_b + dst_b + struct.pack(">BBH", 0, 6, segment_len)
    else:
        struct.pack_into(">H", ip, 4, segment_len)
        ip[8:24], ip[24:40] = src_b, dst_b
        pseudo = src_b + dst_b + struct.pack(">IxxxB", segment_len, 6)
    struct.pack_into(">H", tcp, 16, _checksum(pseudo + bytes(tcp) + payload))
    return bytes(link) + bytes(ip) + bytes(tcp) + payload


def _rewrite_link(linktype: int, link: bytearray, map_link: Callable[[bytes], bytes]) -> None:
    """Ethernet: both MACs; Linux cooked: the sender's link address; others carry none."""
    if linktype == ETHERNET and len(link) >= 14:
        link[0:6], link[6:12] = map_link(bytes(link[0:6])), map_link(bytes(link[6:12]))
    elif linktype == LINUX_SLL and len(link) == 16:  # Linux cooked v1: address length at 4, address at 6
        n = min(link[5], 8)
        link[6:6 + n] = map_link(bytes(link[6:6 + n]))
    elif linktype == LINUX_SLL2 and len(link) == 20:  # v2: address length at 11, address at 12
        n = min(link[11], 8)
        link[12:12 + n] = map_link(bytes(link[12:12 + n]))


def move_leading_nops(packet: bytes, p: Packet) -> bytes:
    """The same packet with a leading pair of NOP options moved to the end of the options.

    The options mean the same and, the pair staying 16-bit aligned, the TCP checksum
    does not change; what changes is the bytes after the checksum (urgent pointer 0,
    then a NOP: ``00 00 01``), which with a checksum ending in 0x7f read as 127.0.0.1's
    address bytes.  Used only when a packet would hold an original address that way.
    """
    start = p.tcp_offset  # build() keeps the link and IP header lengths
    options = packet[start + 20:start + p.tcp_header_len]
    if options[:2] != b"\x01\x01":
        return packet
    return packet[:start + 20] + options[2:] + b"\x01\x01" + packet[start + p.tcp_header_len:]
