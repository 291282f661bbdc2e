"""Write synthetic pcap / pcapng captures from TCP segments, and mangle segment lists.

Shared test helper.  Typical use:

    from helpers.pcapgen import conversation, mangle, write_pcap, write_pcapng

    segs = conversation(("10.0.0.1", 40000), ("10.0.0.2", 9092),
                        [("c", b"request bytes"), ("s", b"response bytes")], mss=1000)
    write_pcap(tmp_path / "x.pcap", segs, linktype=LINKTYPE_ETHERNET, vlan=(100,))
    lossy = mangle(segs, drop=0.1, duplicate=0.1, reorder=0.2, seed=7)

Segments are `kwinspect.capture.packets.TcpSegment` values, the same type the
packet parser produces, so the segments of a real capture can be mangled and
written back out.  Frames are built byte by byte here (not with dpkt) so the
parser under test is checked against an independent encoder; the container
files are written with dpkt's writers where dpkt supports the variant (native
little-endian pcap and pcapng, microsecond or nanosecond pcap) and with struct
otherwise (big-endian files, snaplen-truncated records).
"""

from __future__ import annotations

import gzip
import io
import os
import random
import socket
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import IO

import dpkt

from kwinspect.capture.packets import ACK, FIN, PSH, RST, SYN, TcpSegment
from kwinspect.model import Endpoint

__all__ = [
    "LINKTYPES",
    "Frame",
    "build_frames",
    "conversation",
    "frame_for",
    "ip_packet",
    "mangle",
    "stream_bytes",
    "write_pcap",
    "write_pcapng",
    "ACK", "FIN", "PSH", "RST", "SYN",
]

LINKTYPE_NULL = 0
LINKTYPE_ETHERNET = 1
LINKTYPE_RAW = 101
LINKTYPE_LOOP = 108
LINKTYPE_LINUX_SLL = 113
LINKTYPE_IPV4 = 228
LINKTYPE_IPV6 = 229
LINKTYPE_LINUX_SLL2 = 276
#: every link type the capture layer must read, by name
LINKTYPES = {
    "ethernet": LINKTYPE_ETHERNET,
    "sll": LINKTYPE_LINUX_SLL,
    "sll2": LINKTYPE_LINUX_SLL2,
    "null": LINKTYPE_NULL,
    "loop": LINKTYPE_LOOP,
    "raw": LINKTYPE_RAW,
    "ipv4": LINKTYPE_IPV4,
    "ipv6": LINKTYPE_IPV6,
}


@dataclass
class Frame:
    """One packet as written to a file: captured bytes, the length on the wire, interface."""

    ts: float
    data: bytes
    wire_len: int
    iface: int = 0


def _ep(x: Endpoint | tuple[str, int]) -> Endpoint:
    return x if isinstance(x, Endpoint) else Endpoint(x[0], x[1])


# ---------------------------------------------------------------------------
# segments
# ---------------------------------------------------------------------------

def conversation(client: Endpoint | tuple[str, int], server: Endpoint | tuple[str, int],
                 messages: Sequence[tuple[str, bytes]], *, mss: int = 1460,
                 isn_client: int = 1000, isn_server: int = 500_000, ts0: float = 1_700_000_000.0,
                 dt: float = 0.001, handshake: bool = True, close: str | None = "fin",
                 acks: bool = True) -> list[TcpSegment]:
    """A well-formed TCP connection carrying `messages` in order.

    messages: ("c", bytes) sent by the client, ("s", bytes) by the server; each
    is cut into `mss`-sized segments.  close: "fin" (both sides), "rst", or None.
    Sequence numbers wrap at 2**32 naturally (pick an ISN near 2**32 to test it).
    With handshake=False the capture "starts" mid-connection (no SYN).
    """
    c, s = _ep(client), _ep(server)
    out: list[TcpSegment] = []
    seq = {c: isn_client & 0xFFFFFFFF, s: isn_server & 0xFFFFFFFF}
    t = ts0

    def emit(src: Endpoint, flags: int, payload: bytes = b"") -> None:
        nonlocal t
        dst = s if src == c else c
        out.append(TcpSegment(t, src, dst, seq[src], seq[dst] if flags & ACK else 0, flags,
                              payload, len(out) + 1))
        seq[src] = (seq[src] + len(payload) + (1 if flags & (SYN | FIN) else 0)) & 0xFFFFFFFF
        t += dt

    if handshake:
        emit(c, SYN)
        emit(s, SYN | ACK)
        emit(c, ACK)
    for who, data in messages:
        src = c if who == "c" else s
        for i in range(0, len(data), mss):
            emit(src, ACK | PSH, data[i:i + mss])
        if acks:
            emit(s if src == c else c, ACK)
    if close == "fin":
        emit(c, FIN | ACK)
        emit(s, FIN | ACK)
        emit(c, ACK)
    elif close == "rst":
        emit(c, RST | ACK)
    return out


def stream_bytes(messages: Sequence[tuple[str, bytes]], who: str) -> bytes:
    """The ground-truth byte stream one side of `conversation(...)` sent."""
    return b"".join(d for w, d in messages if w == who)


def mangle(segments: Sequence[TcpSegment], *, drop: float = 0.0, duplicate: float = 0.0,
           reorder: float = 0.0, truncate: float = 0.0, resegment: float = 0.0,
           conflict: float = 0.0, reorder_window: int = 4, keep_control: bool = True,
           seed: int = 0) -> list[TcpSegment]:
    """Perturb a segment list the way real captures go wrong.  Deterministic per `seed`.

    Each probability applies per segment (control segments - SYN/FIN/RST and
    empty ACKs - are only reordered/duplicated, never dropped, when keep_control):
      drop:      the segment is missing from the capture
      duplicate: it is captured twice (the copy lands up to reorder_window later)
      reorder:   it moves behind up to reorder_window later segments of its direction
                 (never past a segment of the other direction, which could acknowledge it)
      truncate:  its payload is cut (snaplen): `missing` says how many bytes were cut
      resegment: a retransmission covering it and half of the next segment is added
      conflict:  a retransmitted copy with different bytes is added (first copy must win)
    Returned segments keep their original timestamps and `index` values, so
    a segment's index tells which original it came from.
    """
    rnd = random.Random(seed)
    out: list[TcpSegment] = []
    segs = list(segments)
    for i, sg in enumerate(segs):
        control = not sg.payload
        if drop and rnd.random() < drop and not (keep_control and control):
            continue
        if truncate and sg.payload and rnd.random() < truncate:
            keep = rnd.randrange(0, len(sg.payload))
            sg = sg._replace(payload=sg.payload[:keep],
                             missing=sg.missing + len(sg.payload) - keep)
        out.append(sg)
        if duplicate and rnd.random() < duplicate:
            out.append(sg)  # the reorder pass below may move either copy
        if resegment and sg.payload and rnd.random() < resegment:
            nxt = next((n for n in segs[i + 1:] if n.src == sg.src and n.payload), None)
            extra = b""
            if nxt is not None and (nxt.seq - sg.seq) & 0xFFFFFFFF == len(sg.payload):
                extra = nxt.payload[: max(1, len(nxt.payload) // 2)]
            half = len(sg.payload) // 2
            out.append(sg._replace(seq=(sg.seq + half) & 0xFFFFFFFF,
                                   payload=sg.payload[half:] + extra, missing=0))
        if conflict and sg.payload and rnd.random() < conflict:
            bad = bytes(b ^ 0xFF for b in sg.payload)
            out.append(sg._replace(payload=bad, missing=0))
    if reorder:
        # Reordering happens per direction (a network path reorders, a capture point
        # does not show an ACK before the data it acknowledges): a segment moves
        # behind up to reorder_window later segments of the same run of its direction.
        for i in range(len(out) - 1, -1, -1):
            if rnd.random() < reorder:
                src = out[i].src
                later = []
                for j in range(i + 1, min(len(out), i + 1 + reorder_window)):
                    if out[j].src != src:
                        break
                    later.append(j)
                if later:
                    j = later[rnd.randrange(len(later))]
                    out.insert(j, out.pop(i))
    return out


# ---------------------------------------------------------------------------
# frames
# ---------------------------------------------------------------------------

def _ip_bytes(ip: str) -> tuple[int, bytes]:
    if ":" in ip:
        return 6, socket.inet_pton(socket.AF_INET6, ip)
    return 4, socket.inet_pton(socket.AF_INET, ip)


def tcp_header(seg: TcpSegment) -> bytes:
    # data offset 5 words plus a 12-byte option block (NOP NOP timestamp), like Linux sends
    opts = b"\x01\x01\x08\x0a" + struct.pack("!II", 12345, 67890)
    doff = (20 + len(opts)) // 4
    return struct.pack("!HHIIBBHHH", seg.src.port, seg.dst.port, seg.seq & 0xFFFFFFFF,
                       seg.ack & 0xFFFFFFFF, doff << 4, seg.flags & 0xFF, 65535, 0, 0) + opts


def ip_packet(seg: TcpSegment, *, ident: int = 0, fragment_size: int | None = None,
              ipv6_ext: bool = False) -> list[bytes]:
    """IP datagram(s) carrying the segment (full payload, plus `missing` filler bytes that
    a snaplen cut will remove).  IPv4 with fragment_size is split into fragments of that
    many payload bytes (a multiple of 8).  ipv6_ext puts a hop-by-hop header first."""
    v, src = _ip_bytes(seg.src.ip)
    _, dst = _ip_bytes(seg.dst.ip)
    tcp = tcp_header(seg) + seg.payload + b"\xee" * seg.missing
    if v == 4:
        if not fragment_size or len(tcp) <= fragment_size:
            return [struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), ident, 0x4000, 64, 6, 0,
                                src, dst) + tcp]
        assert fragment_size % 8 == 0
        out = []
        for off in range(0, len(tcp), fragment_size):
            piece = tcp[off:off + fragment_size]
            more = 0x2000 if off + fragment_size < len(tcp) else 0
            out.append(struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(piece), ident,
                                   more | (off // 8), 64, 6, 0, src, dst) + piece)
        return out
    nh = 6
    ext = b""
    if ipv6_ext:
        ext = bytes([6, 0]) + b"\x01\x04\x00\x00\x00\x00"  # hop-by-hop, PadN
        nh = 0
    return [struct.pack("!IHBB16s16s", 0x60000000, len(ext) + len(tcp), nh, 64, src, dst)
            + ext + tcp]


def frame_for(ip: bytes, linktype: int, *, vlan: Sequence[int] = (), null_order: str = "<",
              outgoing: bool = False) -> bytes:
    """Wrap one IP datagram in the given link layer (802.1Q tags for Ethernet via `vlan`)."""
    v = ip[0] >> 4
    etype = 0x0800 if v == 4 else 0x86DD
    if linktype == LINKTYPE_ETHERNET:
        hdr = b"\x02\x00\x00\x00\x00\x02" + b"\x02\x00\x00\x00\x00\x01"
        tpids = [0x88A8] * (len(vlan) - 1) + [0x8100] if vlan else []
        for tpid, vid in zip(tpids, vlan, strict=True):
            hdr += struct.pack("!HH", tpid, vid & 0x0FFF)
        return hdr + struct.pack("!H", etype) + ip
    if linktype == LINKTYPE_LINUX_SLL:
        return struct.pack("!HHH8sH", 4 if outgoing else 0, 772, 6, b"\0" * 8, etype) + ip
    if linktype == LINKTYPE_LINUX_SLL2:
        return struct.pack("!HHIHBB8s", etype, 0, 1, 772, 4 if outgoing else 0, 6,
                           b"\0" * 8) + ip
    if linktype == LINKTYPE_NULL:
        fam = 2 if v == 4 else 30
        return struct.pack(null_order + "I", fam) + ip
    if linktype == LINKTYPE_LOOP:
        return struct.pack("!I", 2 if v == 4 else 24) + ip
    if linktype in (LINKTYPE_RAW, LINKTYPE_IPV4, LINKTYPE_IPV6):
        return ip
    raise ValueError(f"unsupported link type {linktype}")


def build_frames(segments: Iterable[TcpSegment], linktype: int = LINKTYPE_ETHERNET, *,
                 vlan: Sequence[int] = (), fragment_size: int | None = None,
                 null_order: str = "<", iface: int = 0) -> list[Frame]:
    """Frames for the segments.  A segment's `missing` bytes are on the wire but not in
    the frame (the record is written snaplen-truncated)."""
    frames = []
    for k, seg in enumerate(segments):
        ips = ip_packet(seg, ident=k & 0xFFFF, fragment_size=fragment_size)
        for j, ip in enumerate(ips):
            fr = frame_for(ip, linktype, vlan=vlan, null_order=null_order)
            cut = min(seg.missing, len(fr)) if j == len(ips) - 1 else 0
            frames.append(Frame(seg.ts, fr[: len(fr) - cut], len(fr), iface))
    return frames


# ---------------------------------------------------------------------------
# files
# ---------------------------------------------------------------------------

def _open_out(dest: str | os.PathLike[str] | IO[bytes], gz: bool) -> tuple[IO[bytes], list]:
    closers: list = []
    if isinstance(dest, str | os.PathLike):
        f: IO[bytes] = open(dest, "wb")  # noqa: SIM115
        closers.append(f)
    else:
        f = dest
    if gz:
        g = gzip.GzipFile(fileobj=f, mode="wb")
        closers.insert(0, g)
        f = g  # type: ignore[assignment]
    return f, closers


def write_pcap(dest: str | os.PathLike[str] | IO[bytes], frames: Iterable[Frame] | Iterable[TcpSegment],
               linktype: int = LINKTYPE_ETHERNET, *, byteorder: str = "<", nano: bool = False,
               snaplen: int = 262144, gz: bool = False, **frame_kw) -> None:
    """Write a classic pcap.  `frames` may be Frames or TcpSegments (then built with
    build_frames(linktype, **frame_kw)).  byteorder "<" or ">"; nano for ns timestamps."""
    frames = _as_frames(frames, linktype, frame_kw)
    f, closers = _open_out(dest, gz)
    try:
        use_dpkt = byteorder == "<" and all(fr.wire_len == len(fr.data) for fr in frames)
        if use_dpkt:
            w = dpkt.pcap.Writer(f, snaplen=snaplen, linktype=linktype, nano=nano)
            for fr in frames:
                w.writepkt_time(fr.data, fr.ts)
        else:
            magic = 0xA1B23C4D if nano else 0xA1B2C3D4
            f.write(struct.pack(byteorder + "IHHiIII", magic, 2, 4, 0, 0, snaplen, linktype))
            mult = 10**9 if nano else 10**6
            for fr in frames:
                sec = int(fr.ts)
                frac = round((fr.ts - sec) * mult)
                if frac >= mult:
                    sec, frac = sec + 1, frac - mult
                f.write(struct.pack(byteorder + "IIII", sec, frac, len(fr.data), fr.wire_len))
                f.write(fr.data)
    finally:
        for c in closers:
            c.close()


def write_pcapng(dest: str | os.PathLike[str] | IO[bytes], frames: Iterable[Frame] | Iterable[TcpSegment],
                 interfaces: Sequence[tuple[int, ...]] = ((LINKTYPE_ETHERNET, 6),), *,
                 byteorder: str = "<", gz: bool = False, secrets: Sequence[tuple[int, bytes]] = (),
                 **frame_kw) -> None:
    """Write a pcapng with one IDB per (linktype, tsresol[, tsoffset]) in `interfaces`;
    `secrets`: (secrets type, data) written as Decryption Secrets Blocks after the IDBs,
    as `editcap --inject-secrets` does (0x544c534b: a TLS key log);
    tsresol is the if_tsresol option byte (6 = microseconds, 9 = nanoseconds, 0x80|n =
    2**-n); tsoffset (seconds) is written as if_tsoffset and subtracted from the stored
    timestamps.  A Frame's `iface` selects its interface."""
    frames = _as_frames(frames, interfaces[0][0], frame_kw)
    f, closers = _open_out(dest, gz)
    try:
        le = byteorder == "<"
        P = dpkt.pcapng
        SHB = P.SectionHeaderBlockLE if le else P.SectionHeaderBlock
        IDB = P.InterfaceDescriptionBlockLE if le else P.InterfaceDescriptionBlock
        OPT = P.PcapngOptionLE if le else P.PcapngOption
        EPB = P.EnhancedPacketBlockLE if le else P.EnhancedPacketBlock
        idbs = []
        for itf in interfaces:
            opts = [OPT(code=P.PCAPNG_OPT_IF_TSRESOL, data=bytes([itf[1]]))]
            if len(itf) > 2:
                opts.append(OPT(code=P.PCAPNG_OPT_IF_TSOFFSET,
                                data=struct.pack(byteorder + "q", itf[2])))
            opts.append(OPT(code=P.PCAPNG_OPT_ENDOFOPT))
            idbs.append(IDB(linktype=itf[0], snaplen=262144, opts=opts))
        divs = [(2 ** (i[1] & 0x7F)) if i[1] & 0x80 else 10 ** i[1] for i in interfaces]
        offs = [i[2] if len(i) > 2 else 0 for i in interfaces]
        native = le == (struct.pack("=I", 1) == struct.pack("<I", 1))
        writer = P.Writer(f, shb=SHB(), idb=idbs) if native else None
        if writer is None:
            f.write(bytes(SHB()))
            for idb in idbs:
                f.write(bytes(idb))
        for stype, data in secrets:
            pad = (-len(data)) % 4
            blen = 20 + len(data) + pad
            f.write(struct.pack(byteorder + "IIII", 0x0000000A, blen, stype, len(data)) + data + b"\0" * pad
                    + struct.pack(byteorder + "I", blen))
        for fr in frames:
            t = round((fr.ts - offs[fr.iface]) * divs[fr.iface])
            if fr.wire_len == len(fr.data):
                epb = EPB(iface_id=fr.iface, ts_high=t >> 32, ts_low=t & 0xFFFFFFFF,
                          pkt_data=fr.data)
                if writer is not None:
                    writer.writepkt(epb)
                else:
                    f.write(bytes(epb))
            else:  # dpkt's EPB always writes orig_len == caplen: pack it ourselves
                pad = (-len(fr.data)) % 4
                blen = 32 + len(fr.data) + pad
                f.write(struct.pack(byteorder + "IIIIIII", P.PCAPNG_BT_EPB, blen, fr.iface,
                                    t >> 32, t & 0xFFFFFFFF, len(fr.data), fr.wire_len)
                        + fr.data + b"\0" * pad + struct.pack(byteorder + "I", blen))
    finally:
        for c in closers:
            c.close()


def _as_frames(items, linktype: int, frame_kw: dict) -> list[Frame]:
    items = list(items)
    if items and isinstance(items[0], TcpSegment):
        return build_frames(items, linktype, **frame_kw)
    return items


def to_bytes(writer, *args, **kw) -> bytes:
    """Run write_pcap / write_pcapng into memory and return the file's bytes."""
    buf = io.BytesIO()
    buf.close = lambda: None  # type: ignore[method-assign]
    writer(buf, *args, **kw)
    return buf.getvalue()
