"""Make a large synthetic capture for the TUI benchmark from a real shipped capture.

Every packet of the source capture (real frames from real brokers and clients)
is written ``--repeat`` times; each copy moves the client side to its own IP
address (10.a.b.c) and shifts timestamps by the source's span, so every copy
is a fresh set of connections, in time order.  Checksums are recomputed.

    .venv/bin/python bench/make_big_capture.py captures/confluent-mock-produce-consume.pcap \\
        --exchanges 1000000 -o /tmp/big.pcap

Do not commit the output; it is hundreds of MB.
"""

from __future__ import annotations

import argparse
import socket
import struct
import sys

import dpkt


def _ip_checksum(header: bytes) -> int:
    total = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def load(path: str) -> tuple[int, list[tuple[float, bytes]]]:
    with open(path, "rb") as f:
        reader = dpkt.pcap.Reader(f)
        return reader.datalink(), [(ts, bytes(buf)) for ts, buf in reader]


def count_exchanges(path: str) -> int:
    from kwinspect.model import Exchange
    from kwinspect.run.files import dissect_file

    return sum(isinstance(e, Exchange) for e in dissect_file(path))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source")
    ap.add_argument("-o", "--output", required=True)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--repeat", type=int)
    g.add_argument("--exchanges", type=int, help="repeat until about this many exchanges")
    ap.add_argument("--broker-net", default="127.0.0.1", help="addresses kept as they are (the brokers)")
    args = ap.parse_args(argv)

    linktype, packets = load(args.source)
    if linktype != dpkt.pcap.DLT_EN10MB:
        print(f"only Ethernet captures are supported (linktype {linktype})", file=sys.stderr)
        return 2
    per_copy = count_exchanges(args.source)
    repeat = args.repeat or max(1, -(-args.exchanges // max(per_copy, 1)))
    t0, t1 = packets[0][0], packets[-1][0]
    span = (t1 - t0) + 0.001
    # broker ports: the server side of the handshake (SYN+ACK senders)
    brokers: set[tuple[bytes, int]] = set()
    parsed = []
    for ts, buf in packets:
        eth = dpkt.ethernet.Ethernet(buf)
        ip = eth.data
        if not isinstance(ip, dpkt.ip.IP) or not isinstance(ip.data, dpkt.tcp.TCP):
            continue
        tcp = ip.data
        if tcp.flags & dpkt.tcp.TH_SYN and tcp.flags & dpkt.tcp.TH_ACK:
            brokers.add((ip.src, tcp.sport))
        parsed.append((ts, buf))
    # Pre-parse once; each copy only patches the client address and the IPv4 header
    # checksum (TCP checksums are left as captured: loopback captures carry offloaded,
    # unchecked checksums anyway, and kwinspect does not verify them).
    templates = []
    for ts, buf in parsed:
        eth = dpkt.ethernet.Ethernet(buf)
        ip, tcp = eth.data, eth.data.data
        client_is_src = (ip.src, tcp.sport) not in brokers
        ihl = (buf[14] & 0x0F) * 4
        templates.append((ts, bytearray(buf), 26 if client_is_src else 30, ihl))
    written = 0
    with open(args.output, "wb") as out:
        out.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 262144, linktype))
        for k in range(repeat):
            # last octet 1..254, so no two copies share an address (a shared 4-tuple with the
            # same sequence numbers reads as retransmissions of the earlier copy)
            n = (k // 254) * 256 + k % 254 + 1
            client_ip = socket.inet_aton(f"10.{(n >> 16) & 255}.{(n >> 8) & 255}.{n & 255}")
            shift = k * span
            chunks = []
            for ts, buf, off, ihl in templates:
                buf[off:off + 4] = client_ip
                buf[24:26] = b"\0\0"
                buf[24:26] = _ip_checksum(bytes(buf[14:14 + ihl])).to_bytes(2, "big")
                t = ts + shift
                sec = int(t)
                chunks.append(struct.pack("<IIII", sec, int(round((t - sec) * 1e6)) % 1_000_000, len(buf), len(buf)))
                chunks.append(bytes(buf))
                written += 1
            out.write(b"".join(chunks))
    print(f"{args.output}: {written:,} packets, about {repeat * per_copy:,} exchanges "
          f"({repeat} copies of {per_copy})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
