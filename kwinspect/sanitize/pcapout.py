"""Writing the sanitized packets: pcap (one link type) or pcapng (one interface per link type).

Nothing of the input file's own blocks is carried over: no section or interface
options (host names, OS, interface names and descriptions, comments), no name
resolution blocks, and never a Decryption Secrets Block.  Timestamps are
written in microseconds.
"""

from __future__ import annotations

import struct
from typing import IO

SNAPLEN = 262144


def _micros(ts: float) -> int:
    return round(ts * 1_000_000)


class PcapWriter:
    def __init__(self, f: IO[bytes], linktype: int) -> None:
        self.f = f
        f.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, SNAPLEN, linktype))

    def write(self, ts: float, linktype: int, data: bytes) -> None:
        sec, usec = divmod(_micros(ts), 1_000_000)
        self.f.write(struct.pack("<IIII", sec, usec, len(data), len(data)) + data)


def _block(kind: int, body: bytes) -> bytes:
    body += b"\0" * (-len(body) % 4)
    n = len(body) + 12
    return struct.pack("<II", kind, n) + body + struct.pack("<I", n)


class PcapngWriter:
    def __init__(self, f: IO[bytes]) -> None:
        self.f = f
        self.interfaces: dict[int, int] = {}  # link type -> interface id
        f.write(_block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1)))

    def write(self, ts: float, linktype: int, data: bytes) -> None:
        iface = self.interfaces.get(linktype)
        if iface is None:
            iface = self.interfaces[linktype] = len(self.interfaces)
            self.f.write(_block(1, struct.pack("<HHI", linktype, 0, SNAPLEN)))
        t = _micros(ts)
        self.f.write(_block(6, struct.pack("<IIIII", iface, t >> 32, t & 0xFFFFFFFF, len(data), len(data)) + data))


def open_writer(f: IO[bytes], path: str, linktypes: set[int]):
    """A pcapng writer for .pcapng paths, else pcap (which needs a single link type: ValueError)."""
    if path.endswith((".pcapng", ".ntar")):
        return PcapngWriter(f)
    if len(linktypes) > 1:
        raise ValueError(f"the packets kept have {len(linktypes)} link types ({sorted(linktypes)}); "
                         "a pcap file holds one: write a .pcapng")
    return PcapWriter(f, next(iter(linktypes), 1))
