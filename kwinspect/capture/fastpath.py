"""The compiled fast paths of capture/, or None: readers.py and packets.py (and the
driver's inlined copy of the packet fast path) call them when they are there and
run their own Python code otherwise. The C source is ``_cpackets.c`` beside this
file; what each function does, and where it hands back to Python, is described there.
"""

from __future__ import annotations

from kwinspect.core import load

_c = load("kwinspect.capture._cpackets")

# scan_pcap(buf, pos, big_endian, nano, rec_len, linktype, index, RawPacket, limit)
#   -> (packets, new_pos, bytes_wire, truncated)
scan_pcap = _c.scan_pcap if _c is not None else None
# scan_pcapng(buf, pos, big_endian, interfaces, index, RawPacket, limit)
#   -> (packets, new_pos, bytes_captured, bytes_wire, truncated, last_ts)
scan_pcapng = _c.scan_pcapng if _c is not None else None
# tcp_segment(raw, endpoints, TcpSegment) -> TcpSegment | None
tcp_segment = _c.tcp_segment if _c is not None else None

# RawPackets per scan call: the list a scan builds stays small, and the reader's
# bookkeeping (positions, counters) is updated once per batch, not per packet
BATCH = 512
