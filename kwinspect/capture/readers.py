"""Capture file readers: pcap, pcapng and gzip-compressed variants -> RawPacket.

    with open_capture("dump.pcapng.gz") as src:
        for raw in src:            # RawPacket(ts, linktype, data, wire_len, index)
            ...
        src.issues                 # truncation and corruption, as model.Issue
        src.stats                  # CaptureStats counters

The format is detected from the first bytes (magic numbers), never from the
file name.  A file that is not a capture raises `CaptureFormatError` when it is
opened; anything that goes wrong later (a file cut mid-record, a corrupt block
length) adds an Issue and ends the iteration cleanly.

Implementation choice (measured, see docs/architecture.md "capture (details)"):
the hot loop is our own struct-based parser over large read chunks rather than
dpkt.pcap.Reader / dpkt.pcapng.Reader.  dpkt's pcap reader builds a dpkt Packet
object per record and does two small reads per packet (about 3x slower here);
dpkt's pcapng reader only honours the first interface block (one link type,
one timestamp resolution for the whole file), drops the original packet length,
and raises on a cut block.  dpkt is still the reference for the formats: the
constants below carry its names (not imported: importing dpkt costs ~0.07 s at
the start of every command; tests/capture/test_readers.py checks the values) and
its writers produce the test files (tests/helpers/pcapgen.py).
"""

from __future__ import annotations

import io
import mmap
import os
import stat
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any, NamedTuple

from kwinspect import model
from kwinspect.capture import fastpath

__all__ = [
    "CaptureFormatError",
    "CaptureStats",
    "PacketSource",
    "RawPacket",
    "RecordChunk",
    "open_capture",
]

# Issue kinds reported by this module (in addition to model.TRUNCATED_PACKET).
CORRUPT_CAPTURE = "corrupt_capture"
SNAPLEN_TRUNCATED = "snaplen_truncated"

_CHUNK = 1 << 20  # bytes per read() from the underlying file
_MAX_RECORD = 1 << 26  # a record longer than this is a corrupt length, not a packet

# dpkt.pcap / dpkt.pcapng constants, by their dpkt names
TCPDUMP_MAGIC = 0xA1B2C3D4
PMUDPCT_MAGIC = 0xD4C3B2A1
TCPDUMP_MAGIC_NANO = 0xA1B23C4D
PMUDPCT_MAGIC_NANO = 0x4D3CB2A1
MODPCAP_MAGIC = 0xA1B2CD34
PCAPNG_BT_IDB = 0x00000001
PCAPNG_BT_DSB = 0x0000000A  # Decryption Secrets Block (TLS key logs: editcap --inject-secrets)
PCAPNG_BT_PB = 0x00000002
PCAPNG_BT_SPB = 0x00000003
PCAPNG_BT_EPB = 0x00000006
PCAPNG_BT_SHB = 0x0A0D0D0A
BYTE_ORDER_MAGIC = 0x1A2B3C4D
PCAPNG_OPT_ENDOFOPT = 0
PCAPNG_OPT_IF_TSRESOL = 9
PCAPNG_OPT_IF_TSOFFSET = 14

# pcap magics as read with a little-endian "<I"
_PCAP_MAGICS = {
    # value read as "<I": (endian, nanosecond, modified/Kuznetsov header)
    TCPDUMP_MAGIC: ("<", False, False),  # a1b2c3d4 written LE
    PMUDPCT_MAGIC: (">", False, False),  # a1b2c3d4 written BE
    TCPDUMP_MAGIC_NANO: ("<", True, False),
    PMUDPCT_MAGIC_NANO: (">", True, False),
    MODPCAP_MAGIC: ("<", False, True),  # a1b2cd34 (patched libpcap)
    0x34CDB2A1: (">", False, True),
}
_PCAPNG_SHB = PCAPNG_BT_SHB  # 0x0A0D0D0A, palindromic
_PCAPNG_BOM = BYTE_ORDER_MAGIC  # 0x1A2B3C4D
_GZIP_MAGIC = b"\x1f\x8b"


class CaptureFormatError(Exception):
    """The input is not a capture this reader understands (raised at open time only)."""


class RawPacket(NamedTuple):
    """One captured frame.

    ts: seconds since the epoch (float; nanosecond files lose sub-microsecond
    precision in the float). linktype: the DLT/LINKTYPE value of the interface.
    data: the captured bytes (may be shorter than wire_len when the snaplen
    cut the packet). index: 1-based frame number, as Wireshark numbers frames.
    """

    ts: float
    linktype: int
    data: bytes
    wire_len: int
    index: int


class RecordChunk:
    """The capture records wholly inside a reader's buffer, from ``pos`` on, handed to a
    consumer that reads them itself (``PacketSource.records()``; the Dissector's compiled
    packet loop) instead of one RawPacket each.

    The consumer takes records in order and advances ``pos`` past each one it takes,
    counting it in ``index`` (records handed out so far: the last one's packet number),
    ``bytes_captured``, ``bytes_wire`` (wire length, the captured length when the file
    says less), ``truncated`` (wire length above the captured one) and ``ts`` (its
    timestamp), exactly as the RawPackets it stands for would have been counted. It
    stops at the first record that is not wholly inside ``buf``, or whenever it likes;
    the reader goes on from ``pos``. ``layout`` says how to read the records:
    ``(0, big_endian, nanosecond, record header length, linktype)`` for pcap,
    ``(1, big_endian, 0, 0, ((linktype, div, tsoffset), ...))`` for pcapng (Enhanced
    Packet Blocks only; any other block ends the chunk)."""

    __slots__ = ("buf", "pos", "layout", "index", "bytes_captured", "bytes_wire", "truncated", "ts")

    def __init__(self, buf: bytes, pos: int, layout: tuple, index: int) -> None:
        self.buf = buf
        self.pos = pos
        self.layout = layout
        self.index = index
        self.bytes_captured = self.bytes_wire = self.truncated = 0
        self.ts: float | None = None


@dataclass(slots=True)
class CaptureStats:
    format: str = ""  # "pcap" | "pcapng"
    compressed: bool = False
    packets: int = 0  # RawPackets produced
    bytes_captured: int = 0  # sum of len(data)
    bytes_wire: int = 0  # sum of wire_len
    snaplen_truncated: int = 0  # packets with len(data) < wire_len
    cut_records: int = 0  # a record cut by the end of the file (0 or 1)
    skipped_blocks: int = 0  # pcapng blocks that carry no packet (stats, name resolution...)
    secrets_blocks: int = 0  # Decryption Secrets Blocks read (counted in skipped_blocks too)
    bad_records: int = 0  # records dropped: unknown interface, corrupt length
    interfaces: list[tuple[int, float]] = field(default_factory=list)  # (linktype, resolution)
    file_bytes: int = 0  # bytes consumed from the (decompressed) input


class _ChunkReader:
    """Buffered reading over a file object that turns read errors into a flag.

    Reading 1 MiB chunks and slicing them is cheaper than two small read()
    calls per packet, and a gzip stream that ends early (EOFError) becomes an
    issue instead of an exception.
    """

    __slots__ = ("_f", "buf", "pos", "error", "consumed")  # buf/pos: the pcapng fast path reads them

    def __init__(self, f: IO[bytes], prefix: bytes = b"") -> None:
        self._f = f
        self.buf = prefix
        self.pos = 0
        self.error: str | None = None
        self.consumed = 0

    def more(self, n: int) -> bytes:
        """Read at least n bytes from the file (fewer only at EOF or on a read error).

        Each read asks for a large chunk but takes what is there (read1), so a pipe
        (`tcpdump -U -w - | kwinspect ... -`) delivers a packet as soon as it arrives
        instead of waiting for a megabyte."""
        parts = []
        have = 0
        read = getattr(self._f, "read1", None) or self._f.read
        while have < n and self.error is None:
            try:
                # at most 4 MiB per read(): a file claiming a 64 MiB record but holding a few
                # bytes must not make read() allocate the claimed size up front
                chunk = read(min(max(_CHUNK, n - have), 4 * _CHUNK))
            except (EOFError, OSError, zlib.error) as e:
                # gzip raises EOFError for a stream cut before its end marker
                self.error = f"{type(e).__name__}: {e}"
                break
            if not chunk:
                break
            parts.append(chunk)
            have += len(chunk)
        return b"".join(parts)

    def rest(self) -> bytes:
        """Hand over what is buffered (the caller continues with more())."""
        out = self.buf[self.pos:]
        self.buf, self.pos = b"", 0
        return out

    def take(self, n: int) -> bytes:
        """Exactly n bytes, or fewer at EOF."""
        if len(self.buf) - self.pos < n:
            self.buf = self.buf[self.pos:] + self.more(n - (len(self.buf) - self.pos))
            self.pos = 0
        out = self.buf[self.pos:self.pos + n]
        self.pos += len(out)
        self.consumed += len(out)
        return out


class PacketSource:
    """An iterable of RawPacket over one capture; also a context manager.

    Iterate once.  After (or during) the iteration `issues` lists what went
    wrong and `stats` counts what was read.
    """

    def __init__(self, f: IO[bytes], *, name: str, owns: list[Any], compressed: bool,
                 fmt: str, prefix: bytes, linktype: int | None = None) -> None:
        self.name = name
        self.issues: list[model.Issue] = []
        self.stats = CaptureStats(format=fmt, compressed=compressed)
        self._f = f
        self._owns = owns
        # the file as opened (before any gzip wrapper): its position drives progress bars
        self._raw = owns[0] if owns else f
        self._reader = _ChunkReader(f, prefix)
        self._started = False
        self._chunks = False  # records(): RecordChunks instead of the scanners' RawPackets
        self._mapped = False  # records(mapped=True): the chunk is the map of the whole file
        self.format = fmt
        self.compressed = compressed
        # pcap: the file's link type (known at open); pcapng: the first interface's,
        # known once iteration has reached the first interface block
        self.linktype = linktype
        # pcapng Decryption Secrets Blocks: called with (secrets type, secrets bytes) as each
        # is read (before the packets after it); the driver adds them to its TLS key material
        self.on_secrets: Callable[[int, bytes], None] | None = None

    def position(self) -> int:
        """Bytes of the input file read so far (compressed bytes for .gz); 0 if unknown."""
        try:
            return self._raw.tell()
        except (OSError, ValueError, AttributeError):
            return 0

    # context manager -------------------------------------------------------
    def __enter__(self) -> PacketSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for obj in reversed(self._owns):
            try:
                obj.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
        self._owns = []

    def __iter__(self) -> Iterator[RawPacket]:
        if self._started:
            raise RuntimeError("a PacketSource can be iterated only once")
        self._started = True
        return self._iterate()

    def records(self, mapped: bool = False) -> Iterator[RawPacket | RecordChunk]:
        """Iterate (once, instead of ``iter()``) giving RecordChunks where the reader has whole
        records in its buffer and RawPackets for the rest (cut records, other blocks): for a
        consumer that reads records itself (run.loop.PacketLoop with the compiled core). The
        packets, their numbers, the counters and ``position()`` are those of ``iter()``.
        Without the compiled core (or for a format without chunks) it is ``iter()``.

        ``mapped=True``, for a consumer that reads a chunk's buffer through the buffer
        protocol (the ``--jobs`` reader): a regular uncompressed pcap file is mapped
        (``mmap``) instead of read, and a chunk's ``buf`` is the map of the whole file
        (``pos`` is then the file offset), so the file's bytes are not copied; ``position()``
        is the file's size from the start. Anything else is read as without it."""
        self._chunks = fastpath.scan_pcap is not None
        self._mapped = mapped and self._chunks
        return iter(self)

    def _map(self) -> mmap.mmap | None:
        """The map of the whole file for ``records(mapped=True)``, the file positioned at its
        end (so the buffered reader finds nothing more), or None (read it instead)."""
        if not self._mapped or self.compressed or self._f is not self._raw:
            return None
        try:
            fd = self._f.fileno()
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # a pipe, a device: read as it comes
                return None
            mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
            return None
        try:
            mm.madvise(mmap.MADV_SEQUENTIAL)
        except (OSError, AttributeError):  # (no madvise on this platform)
            pass
        self._f.seek(0, io.SEEK_END)
        return mm

    def _iterate(self) -> Iterator[RawPacket]:  # pragma: no cover - overridden
        raise NotImplementedError

    # helpers -------------------------------------------------------------
    def _issue(self, kind: str, message: str, offset: int | None = None,
               severity: str = model.SEVERITY_WARNING) -> None:
        self.issues.append(model.Issue(kind, message, offset=offset, severity=severity))

    def _cut(self, what: str, offset: int, got: int, need: int) -> None:
        self.stats.cut_records += 1
        self._issue(model.TRUNCATED_PACKET,
                    f"capture ends inside {what} at file offset {offset} "
                    f"({got} of {need} bytes present); reading stopped there",
                    offset=offset)

    def _finish(self) -> None:
        self.stats.file_bytes = self._reader.consumed
        if self._reader.error:  # e.g. a .gz cut short: the packets before it were read
            self._issue(model.TRUNCATED_PACKET,
                        f"compressed input ends early ({self._reader.error}); reading stopped "
                        f"after {model.plural(self.stats.packets, 'packet')}", offset=self._reader.consumed)
        if self.stats.snaplen_truncated:
            self._issue(SNAPLEN_TRUNCATED,
                        f"{self.stats.snaplen_truncated} packet(s) were captured shorter "
                        "than they were on the wire (snaplen)", severity=model.SEVERITY_INFO)


class _PcapSource(PacketSource):
    def __init__(self, *a: Any, endian: str, nano: bool, modified: bool, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self._endian = endian
        self._nano = nano
        self._modified = modified
        prefix = kw["prefix"]
        self.linktype = struct.unpack_from(endian + "I", prefix, 20)[0] & 0xFFFF

    def _iterate(self) -> Iterator[RawPacket]:
        r = self._reader
        hdr = r.take(24)
        if len(hdr) < 24:  # open_capture already checked, but a stream may lie
            self._cut("the pcap file header", 0, len(hdr), 24)
            self._finish()
            return
        e = self._endian
        _magic, _vmaj, _vmin, _tz, _sig, snaplen, linktype = struct.unpack(e + "IHHiIII", hdr)
        linktype &= 0xFFFF  # upper bits carry FCS information
        self.linktype = linktype
        div = 1e9 if self._nano else 1e6
        self.stats.interfaces.append((linktype, 1.0 / div))
        rec_len = 24 if self._modified else 16
        unpack_rec = struct.Struct(e + "IIII").unpack_from
        new = tuple.__new__  # RawPacket(...) without the namedtuple's Python-level __new__
        stats = self.stats
        index = 0
        base = 24  # file offset of buf[0]
        buf = r.rest()
        blen = len(buf)
        pos = 0
        mapped = self._map() if not buf else None
        if mapped is not None:  # records(mapped=True): the whole file is the buffer
            buf, blen, base, pos = mapped, len(mapped), 0, 24
        bytes_wire = trunc = 0
        # The compiled core takes the records wholly inside the buffer, a batch at a time;
        # the record crossing the chunk's end (and everything odd) takes the loop below.
        scan = fastpath.scan_pcap
        big = e == ">"
        batch_max = fastpath.BATCH
        # The hot loop: one unpack_from, one slice, one tuple per packet.  Refills
        # (and the corrupt-length check) only happen when a record crosses the chunk.
        layout = (0, big, self._nano, rec_len, linktype) if self._chunks else None
        try:
            while True:
                if layout is not None:
                    chunk = RecordChunk(buf, pos, layout, index)
                    try:
                        yield chunk
                    finally:  # (also when the consumer stops reading: what it took counts)
                        index = chunk.index
                        pos = chunk.pos
                        bytes_wire += chunk.bytes_wire
                        trunc += chunk.truncated
                    # the consumer stopped at a record not wholly in the buffer: below
                elif scan is not None:
                    batch, end_pos, batch_wire, batch_trunc = scan(
                        buf, pos, big, self._nano, rec_len, linktype, index, RawPacket, batch_max)
                    if batch:
                        given = 0
                        try:
                            for pkt in batch:
                                given += 1
                                yield pkt
                        finally:
                            if given < len(batch):  # closed mid-batch: count what was handed out
                                _b, end_pos, batch_wire, batch_trunc = scan(
                                    buf, pos, big, self._nano, rec_len, linktype, index, RawPacket, given)
                            index += given
                            pos = end_pos
                            bytes_wire += batch_wire
                            trunc += batch_trunc
                        continue
                start = pos + rec_len
                if start > blen:
                    base += pos
                    buf = buf[pos:] + r.more(rec_len - (blen - pos))
                    blen = len(buf)
                    pos = 0
                    start = rec_len
                    if blen < rec_len:
                        if buf:
                            self._cut("a pcap record header", base, blen, rec_len)
                        break
                sec, frac, caplen, wire_len = unpack_rec(buf, pos)
                end = start + caplen
                if end > blen:
                    if caplen > _MAX_RECORD:
                        stats.bad_records += 1
                        self._issue(CORRUPT_CAPTURE,
                                    f"record {index + 1} at file offset {base + pos} claims "
                                    f"{caplen} captured bytes; the rest of the file is unreadable",
                                    offset=base + pos, severity=model.SEVERITY_ERROR)
                        break
                    base += pos
                    buf = buf[pos:]
                    buf += r.more(rec_len + caplen - len(buf))
                    blen = len(buf)
                    pos = 0
                    start = rec_len
                    end = start + caplen
                    if end > blen:
                        self._cut(f"packet {index + 1}", base, blen - rec_len, caplen)
                        data = buf[rec_len:]
                        pos = blen
                        if data:  # keep what was captured: it is real data
                            index += 1
                            bytes_wire += max(wire_len, caplen)
                            trunc += 1
                            yield new(RawPacket, (sec + frac / div, linktype, data,
                                                  max(wire_len, caplen), index))
                        break
                pos = end
                index += 1
                if wire_len != caplen:
                    if wire_len > caplen:
                        trunc += 1
                    else:  # some writers leave orig_len 0
                        wire_len = caplen
                bytes_wire += wire_len
                yield new(RawPacket, (sec + frac / div, linktype, buf[start:end], wire_len, index))
        finally:
            consumed = base + pos
            stats.packets += index
            # every complete record is rec_len header bytes plus its data
            stats.bytes_captured += consumed - 24 - rec_len * index
            stats.bytes_wire += bytes_wire
            stats.snaplen_truncated += trunc
            r.consumed = consumed
        self._finish()


class _Iface:
    __slots__ = ("linktype", "snaplen", "div", "tsoffset")

    def __init__(self, linktype: int, snaplen: int, div: float, tsoffset: int) -> None:
        self.linktype = linktype
        self.snaplen = snaplen
        self.div = div
        self.tsoffset = tsoffset


def _parse_idb_options(body: bytes, e: str) -> tuple[float, int]:
    """(divisor, tsoffset) from the options of an Interface Description Block body."""
    div = 1e6
    tsoffset = 0
    pos = 8  # linktype(2) reserved(2) snaplen(4)
    n = len(body)
    while pos + 4 <= n:
        code, olen = struct.unpack_from(e + "HH", body, pos)
        pos += 4
        if code == PCAPNG_OPT_ENDOFOPT:
            break
        val = body[pos:pos + olen]
        pos += (olen + 3) & ~3
        if code == PCAPNG_OPT_IF_TSRESOL and olen >= 1:
            v = val[0]
            div = float(2 ** (v & 0x7F)) if v & 0x80 else float(10 ** (v & 0x7F))
        elif code == PCAPNG_OPT_IF_TSOFFSET and olen >= 8:
            tsoffset = struct.unpack(e + "q", val[:8])[0]
    return div, tsoffset


class _PcapngSource(PacketSource):
    """pcapng: sections (each with its byte order), interfaces with their own link type,
    snaplen, timestamp resolution and offset; EPB, SPB and the obsolete PB carry packets."""

    def _iterate(self) -> Iterator[RawPacket]:
        r = self._reader
        stats = self.stats
        self._e = "<"
        self._ifaces: list[_Iface] = []
        self._index = self._offset = 0
        self._last_ts = 0.0
        ifaces = self._ifaces  # cleared in place by a new section
        index = offset = 0
        last_ts = 0.0
        epb = PCAPNG_BT_EPB
        new = tuple.__new__
        e = "<"
        hdr2 = struct.Struct(e + "II").unpack_from
        epb5 = struct.Struct(e + "IIIII").unpack_from
        n_pk = n_cap = n_wire = n_trunc = 0  # fast-path counters, added to stats at the end
        # The compiled core takes the Enhanced Packet Blocks wholly inside the buffer, a batch
        # at a time; any other block, or one crossing the chunk's end, takes the loop below.
        scan = fastpath.scan_pcapng
        batch_max = fastpath.BATCH
        iface_info: tuple | None = None  # the interfaces as scan_pcapng takes them
        chunks = self._chunks
        try:
            while True:
                buf = r.buf
                pos = r.pos
                if chunks:
                    if iface_info is None:
                        iface_info = tuple((itf.linktype, itf.div, itf.tsoffset) for itf in ifaces)
                    chunk = RecordChunk(buf, pos, (1, e == ">", 0, 0, iface_info), index)
                    try:
                        yield chunk
                    finally:  # (also when the consumer stops reading: what it took counts)
                        r.pos = chunk.pos
                        offset += chunk.pos - pos
                        n_pk += chunk.index - index
                        index = chunk.index
                        n_cap += chunk.bytes_captured
                        n_wire += chunk.bytes_wire
                        n_trunc += chunk.truncated
                        if chunk.ts is not None:
                            last_ts = chunk.ts
                    buf, pos = r.buf, r.pos  # the consumer stopped at a block it does not take: below
                elif scan is not None:
                    if iface_info is None:
                        iface_info = tuple((itf.linktype, itf.div, itf.tsoffset) for itf in ifaces)
                    batch, end_pos, b_cap, b_wire, b_trunc, b_ts = scan(
                        buf, pos, e == ">", iface_info, index, RawPacket, batch_max)
                    if batch:
                        given = 0
                        try:
                            for pkt in batch:
                                given += 1
                                yield pkt
                        finally:
                            if given < len(batch):  # closed mid-batch: count what was handed out
                                _b, end_pos, b_cap, b_wire, b_trunc, b_ts = scan(
                                    buf, pos, e == ">", iface_info, index, RawPacket, given)
                            r.pos = end_pos
                            offset += end_pos - pos
                            index += given
                            n_pk += given
                            n_cap += b_cap
                            n_wire += b_wire
                            n_trunc += b_trunc
                            last_ts = b_ts
                        continue
                # Fast path: an Enhanced Packet Block wholly inside the read buffer.
                if len(buf) - pos >= 32:
                    btype, blen = hdr2(buf, pos)
                    if btype == epb and 32 <= blen <= len(buf) - pos and not blen & 3:
                        iface_id, hi, lo, caplen, wire_len = epb5(buf, pos + 8)
                        if iface_id < len(ifaces) and 32 + caplen <= blen:
                            itf = ifaces[iface_id]
                            r.pos = pos + blen
                            offset += blen
                            index += 1
                            n_pk += 1
                            n_cap += caplen
                            if wire_len > caplen:
                                n_trunc += 1
                            else:
                                wire_len = caplen
                            n_wire += wire_len
                            last_ts = itf.tsoffset + ((hi << 32) | lo) / itf.div
                            yield new(RawPacket, (last_ts, itf.linktype,
                                                  buf[pos + 28:pos + 28 + caplen], wire_len,
                                                  index))
                            continue
                # General path: any block, cut files, corrupt lengths.
                self._index, self._offset, self._last_ts = index, offset, last_ts
                go_on, pkt = self._block(r)
                index, offset, last_ts = self._index, self._offset, self._last_ts
                iface_info = None  # the block may have been an interface or a section header
                if self._e != e:
                    e = self._e
                    hdr2 = struct.Struct(e + "II").unpack_from
                    epb5 = struct.Struct(e + "IIIII").unpack_from
                if pkt is not None:
                    yield pkt
                if not go_on:
                    break
        finally:
            stats.packets += n_pk
            stats.bytes_captured += n_cap
            stats.bytes_wire += n_wire
            stats.snaplen_truncated += n_trunc
            r.consumed = self._offset = offset
        self._finish()

    def _block(self, r: _ChunkReader) -> tuple[bool, RawPacket | None]:
        """Read one block: (keep reading?, the packet it carried, if any)."""
        stats = self.stats
        e = self._e
        ifaces = self._ifaces
        index = self._index
        offset = self._offset
        last_ts = self._last_ts
        epb = PCAPNG_BT_EPB
        head = r.take(8)
        if len(head) < 8:
            if head:
                self._cut("a pcapng block header", offset, len(head), 8)
            return False, None
        btype = struct.unpack_from(e + "I", head)[0]
        if btype == _PCAPNG_SHB:
            # a new section: byte order may change, interfaces restart
            bom = r.take(4)
            if len(bom) < 4:
                self._cut("a section header block", offset, 8 + len(bom), 12)
                return False, None
            if struct.unpack("<I", bom)[0] == _PCAPNG_BOM:
                e = "<"
            elif struct.unpack(">I", bom)[0] == _PCAPNG_BOM:
                e = ">"
            else:
                stats.bad_records += 1
                self._issue(CORRUPT_CAPTURE, f"section header at offset {offset} has "
                            "an unknown byte-order magic; reading stopped",
                            offset=offset, severity=model.SEVERITY_ERROR)
                return False, None
            blen = struct.unpack_from(e + "I", head, 4)[0]
            rest_len = blen - 12
            ifaces.clear()
            self._e = e
        else:
            blen = struct.unpack_from(e + "I", head, 4)[0]
            rest_len = blen - 8
        if blen < 12 or blen % 4 or blen > _MAX_RECORD:
            stats.bad_records += 1
            self._issue(CORRUPT_CAPTURE, f"pcapng block at offset {offset} has an invalid "
                        f"length {blen}; the rest of the file is unreadable",
                        offset=offset, severity=model.SEVERITY_ERROR)
            return False, None
        body = r.take(rest_len)
        if len(body) < rest_len:
            self._cut("a pcapng block", offset, blen - rest_len + len(body), blen)
            # An EPB cut after its header still holds real packet bytes.
            if btype == epb and len(body) >= 20:
                iface_id, hi, lo, caplen, wire_len = struct.unpack_from(e + "IIIII", body)
                if iface_id < len(ifaces):
                    itf = ifaces[iface_id]
                    data = body[20:20 + min(caplen, len(body) - 20)]
                    if data:
                        index += 1
                        stats.packets += 1
                        stats.bytes_captured += len(data)
                        stats.bytes_wire += max(wire_len, caplen)
                        stats.snaplen_truncated += 1
                        self._index = index
                        return False, RawPacket(itf.tsoffset + ((hi << 32) | lo) / itf.div,
                                                itf.linktype, data, max(wire_len, caplen),
                                                index)
            return False, None
        start_off = offset
        offset += blen
        self._offset = offset
        fixed = {epb: 24, PCAPNG_BT_PB: 24, PCAPNG_BT_SPB: 8}.get(btype, 0)
        if len(body) < fixed:  # shorter than its own fixed fields (+ the trailing length)
            stats.bad_records += 1
            self._issue(CORRUPT_CAPTURE, f"packet block at offset {start_off} is {blen} bytes, "
                        "too short for its header; skipped", offset=start_off)
            return True, None
        if btype == epb:
            iface_id, hi, lo, caplen, wire_len = struct.unpack_from(e + "IIIII", body)
            if iface_id >= len(ifaces) or 20 + caplen > len(body) - 4:
                stats.bad_records += 1
                self._issue(CORRUPT_CAPTURE, f"packet block at offset {start_off} refers to "
                            f"interface {iface_id} of {len(ifaces)} or overruns its block; "
                            "packet skipped", offset=start_off)
                return True, None
            itf = ifaces[iface_id]
            data = body[20:20 + caplen]
            last_ts = ts = itf.tsoffset + ((hi << 32) | lo) / itf.div
            linktype = itf.linktype
        elif btype == PCAPNG_BT_SPB:
            if not ifaces:
                stats.bad_records += 1
                self._issue(CORRUPT_CAPTURE, f"simple packet block at offset {start_off} "
                            "before any interface block; skipped", offset=start_off)
                return True, None
            itf = ifaces[0]
            wire_len = struct.unpack_from(e + "I", body)[0]
            caplen = min(wire_len, len(body) - 8)
            if itf.snaplen:
                caplen = min(caplen, itf.snaplen)
            data = body[4:4 + caplen]
            ts = last_ts  # simple packet blocks carry no timestamp
            linktype = itf.linktype
        elif btype == PCAPNG_BT_PB:  # obsolete Packet Block
            iface_id, _drops, hi, lo, caplen, wire_len = struct.unpack_from(
                e + "HHIIII", body)
            if iface_id >= len(ifaces) or 20 + caplen > len(body) - 4:
                stats.bad_records += 1
                self._issue(CORRUPT_CAPTURE, f"packet block at offset {start_off} is "
                            "inconsistent; skipped", offset=start_off)
                return True, None
            itf = ifaces[iface_id]
            data = body[20:20 + caplen]
            last_ts = ts = itf.tsoffset + ((hi << 32) | lo) / itf.div
            linktype = itf.linktype
        elif btype == PCAPNG_BT_IDB:
            if len(body) < 12:
                stats.bad_records += 1
                self._issue(CORRUPT_CAPTURE, f"interface block at offset {start_off} is "
                            "too short", offset=start_off)
                return True, None
            linktype, _res, snaplen = struct.unpack_from(e + "HHI", body)
            div, tsoffset = _parse_idb_options(body[:-4], e)
            ifaces.append(_Iface(linktype, snaplen, div, tsoffset))
            stats.interfaces.append((linktype, 1.0 / div))
            if self.linktype is None:
                self.linktype = linktype
            return True, None
        else:
            if btype != _PCAPNG_SHB:
                stats.skipped_blocks += 1
            if btype == PCAPNG_BT_DSB and len(body) >= 12:
                stype, slen = struct.unpack_from(e + "II", body)
                if 8 + slen <= len(body) - 4:
                    stats.secrets_blocks += 1
                    if self.on_secrets is not None:
                        self.on_secrets(stype, bytes(body[8:8 + slen]))
            return True, None
        index += 1
        self._index = index
        self._last_ts = ts
        stats.packets += 1
        stats.bytes_captured += len(data)
        if wire_len > len(data):
            stats.snaplen_truncated += 1
        else:
            wire_len = len(data)
        stats.bytes_wire += wire_len
        return True, RawPacket(ts, linktype, data, wire_len, index)


def _sniff(head: bytes) -> tuple[str, Any]:
    if len(head) >= 4:
        le = struct.unpack_from("<I", head)[0]
        if le in _PCAP_MAGICS:
            return "pcap", _PCAP_MAGICS[le]
        if le == _PCAPNG_SHB:
            return "pcapng", None
    return "", None


def open_capture(path: str | os.PathLike[str] | IO[bytes]) -> PacketSource:
    """Open a pcap / pcapng file (optionally gzip-compressed) or an open binary file object.

    Raises CaptureFormatError when the input is not such a capture (empty, wrong
    magic, unreadable).  A file object passed in is not closed by the source.
    """
    owns: list[Any] = []
    if isinstance(path, str | os.PathLike):
        name = os.fspath(path)
        try:
            f: IO[bytes] = open(name, "rb")  # noqa: SIM115 - closed by PacketSource
        except OSError as e:
            raise CaptureFormatError(f"{name}: cannot open: {e.strerror or e}") from e
        owns.append(f)
    else:
        f = path
        name = getattr(f, "name", None) or f"<{type(f).__name__}>"
        if not isinstance(name, str):
            name = str(name)
    try:
        head = _read_exact(f, 4)
        compressed = False
        if head[:2] == _GZIP_MAGIC:
            compressed = True
            gz = _GzipStream(head, f)
            owns.append(gz)
            f = gz
            try:
                head = _read_exact(f, 4)
            except (EOFError, OSError, zlib.error) as e:
                raise CaptureFormatError(f"{name}: gzip data is unreadable: {e}") from e
        fmt, info = _sniff(head)
        if not fmt:
            if not head:
                raise CaptureFormatError(f"{name}: empty file, not a pcap or pcapng capture")
            raise CaptureFormatError(
                f"{name}: not a pcap or pcapng capture (starts with {head.hex()})")
        if fmt == "pcap":
            rest = _read_exact(f, 20)
            if len(rest) < 20:
                raise CaptureFormatError(f"{name}: pcap file header is cut short")
            endian, nano, modified = info
            return _PcapSource(f, name=name, owns=owns, compressed=compressed, fmt=fmt,
                               prefix=head + rest, endian=endian, nano=nano, modified=modified)
        rest = _read_exact(f, 8)
        if len(rest) < 8 or struct.unpack("<I", rest[4:8])[0] not in (
                _PCAPNG_BOM, struct.unpack(">I", struct.pack("<I", _PCAPNG_BOM))[0]):
            raise CaptureFormatError(f"{name}: pcapng section header is invalid")
        return _PcapngSource(f, name=name, owns=owns, compressed=compressed, fmt=fmt,
                             prefix=head + rest)
    except CaptureFormatError:
        for o in reversed(owns):
            o.close()
        raise
    except (OSError, EOFError, zlib.error) as e:
        for o in reversed(owns):
            o.close()
        raise CaptureFormatError(f"{name}: cannot read: {e}") from e


class _GzipStream(io.RawIOBase):
    """Streaming gzip decompression that hands over every byte it recovered.

    gzip.GzipFile raises EOFError from a read() that hit the cut of a truncated
    file and throws away what that read() had decompressed (up to the caller's
    whole request), so a cut file lost every packet of its last megabytes.  Here
    decompressed bytes are always returned first; the cut is raised (EOFError) on
    the next read only.  Concatenated gzip members are read one after the other,
    as gzip(1) does.  Reads the underlying file in small chunks and never seeks,
    so a pipe works like a file.
    """

    _IN = 64 << 10

    def __init__(self, prefix: bytes, f: IO[bytes]) -> None:
        self._f = f
        self._pending = prefix  # compressed bytes not yet fed
        self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._out = b""
        self._pos = 0
        self._error: BaseException | None = None
        self._done = False
        self._member_bytes = 0  # compressed bytes fed to the current member
        self._read = getattr(f, "read1", None) or f.read  # take what a pipe has

    def readable(self) -> bool:
        return True

    def tell(self) -> int:  # progress: the compressed position
        return self._f.tell()

    def _fill(self, want: int) -> None:
        d = self._d
        parts = [self._out[self._pos:]]  # joined once at the end: no quadratic copying
        have = len(parts[0])
        while have < want and not self._done and self._error is None:
            data = self._pending or self._read(self._IN)
            self._pending = b""
            if not data:
                if self._member_bytes and not d.eof:
                    self._error = EOFError("compressed file ended before the end-of-stream marker")
                self._done = True
                break
            self._member_bytes += len(data)
            try:
                # at most what was asked (>= 1 MiB) per call: a bomb allocates no more
                chunk = d.decompress(data, max(want - have, 1 << 20))
            except zlib.error as e:
                self._error = e
                break
            rest = d.unconsumed_tail
            if d.eof:
                rest = d.unused_data
                self._d = d = zlib.decompressobj(16 + zlib.MAX_WBITS)
                self._member_bytes = 0
                rest = rest.lstrip(b"\0")  # trailing zero padding (tape blocks) ends the stream
                if rest and rest[:2] != b"\x1f\x8b":
                    self._done = True  # trailing garbage after a member: ignored, like gzip -d
                    rest = b""
            self._pending = rest
            if chunk:
                parts.append(chunk)
                have += len(chunk)
        if len(parts) > 1:
            self._out = b"".join(parts)
            self._pos = 0

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            parts = []
            while True:
                b = self.read(1 << 20)
                if not b:
                    return b"".join(parts)
                parts.append(b)
        if len(self._out) - self._pos < n:
            self._fill(n)
        out = self._out[self._pos:self._pos + n]
        self._pos += len(out)
        if not out and self._error is not None:
            err, self._error = self._error, None
            self._done = True
            raise err if isinstance(err, EOFError | zlib.error) else EOFError(str(err))
        return out

    def read1(self, n: int = -1) -> bytes:
        """What is decompressed already, or what one more arrival gives (pipes)."""
        if n is None or n < 0:
            n = 1 << 20
        if self._pos >= len(self._out):
            self._fill(1)
        return self.read(max(1, min(n, len(self._out) - self._pos)))

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


def _read_exact(f: IO[bytes], n: int) -> bytes:
    parts = []
    while n > 0:
        b = f.read(n)
        if not b:
            break
        parts.append(b)
        n -= len(b)
    return b"".join(parts)
