"""Stage 1 of the pipeline: capture files (or byte ranges of them) -> TCP segments as Arrow.

No pyspark here: these functions run inside Spark tasks (and in tests without
Spark).  A task reads one *range* of one file with the project's own readers
and packet parser and emits Arrow record batches of serialised ``TcpSegment``
values, each with its position in the merged capture order.

Splitting: an uncompressed capture file larger than the split size is cut into
byte ranges.  Every cut point is moved forward to the first offset where a chain
of plausible record headers (classic pcap, ``align_pcap``) or blocks (pcapng,
``align_pcapng``) starts; the task before a cut reads up to the same aligned
offset, so every record is read exactly once.  A pcapng range also needs the
section header and interface description blocks in effect where it starts: a
first, light pass (``scan_pcapng_range``) walks each range's block headers and
returns those blocks, the driver checks that the walks join up (each range ends
exactly where the next one starts, in the same byte order), and each range is
then read with them in front (``read_range(..., prefix=...)``).  .gz files are
read whole by one task.

Capture order: ``dissect_files`` merges the files with ``heapq.merge`` on the
packet timestamp.  For inputs whose timestamps are not monotonic that merge is
not a sort; it equals a stable merge on the *running maximum* timestamp of each
file (what heapq.merge compares at each step), so every segment carries
``lpm`` (the running maximum within its range; the pipeline folds in the
maximum of the file's earlier ranges) plus (file rank, range number, packet
number) as tie breakers.  Sorting by that key reproduces the single-process
packet order exactly.
"""

from __future__ import annotations

import io
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

import pyarrow as pa

from kwinspect.capture.packets import PacketParser
from kwinspect.capture.readers import CaptureFormatError, open_capture

SEGMENT_SCHEMA = pa.schema([
    ("kind", pa.string()),       # "seg" | "range" | "issue" | "secrets" (a pcapng Decryption Secrets Block:
                                 # npackets = its secrets type, payload = its data; read by the driver only)
    ("conn", pa.string()),       # canonical 4-tuple: the shuffle key
    ("lpm", pa.float64()),       # running max ts within the range ("range" rows: the range's max)
    ("file", pa.int32()),        # rank of the file in the sorted input list
    ("rng", pa.int32()),         # range number within the file
    ("idx", pa.int64()),         # packet number within the range ("range" rows: TCP segments)
    ("ts", pa.float64()),
    ("src_ip", pa.string()),
    ("src_port", pa.int32()),
    ("dst_ip", pa.string()),
    ("dst_port", pa.int32()),
    ("seq", pa.int64()),
    ("ack", pa.int64()),
    ("flags", pa.int32()),
    ("payload", pa.binary()),
    ("missing", pa.int64()),
    ("ikind", pa.string()),      # "issue" rows: issue kind (conn: "reader" | "parser" | "parser_end")
    ("imsg", pa.string()),       # "issue" rows: message (without the path; seq: the range's offset delta)
    ("npackets", pa.int64()),    # "range" rows: packets read; "issue" rows: snaplen count
])

PCAP_RECORD = 16
_MAX_RECORD = 1 << 20  # larger records never occur in real captures (readers use a similar cap)
_CHAIN = 8  # consecutive plausible record headers needed to trust a cut point
_MAX_SKEW = 14 * 86400  # a record's seconds must be this close to the file's first record
_PCAP_MAGICS = {
    0xA1B2C3D4: ("<", 1e6), 0xD4C3B2A1: (">", 1e6),
    0xA1B23C4D: ("<", 1e9), 0x4D3CB2A1: (">", 1e9),
}
SNAPLEN_TRUNCATED_SUFFIX = " packet(s) were captured shorter than they were on the wire (snaplen)"


def conn_key(src_ip: str, src_port: int, dst_ip: str, dst_port: int) -> str:
    """The same key for both directions of a TCP 4-tuple."""
    a, b = (src_ip, src_port), (dst_ip, dst_port)
    if b < a:
        a, b = b, a
    return f"{a[0]}|{a[1]}|{b[0]}|{b[1]}"


# ---------------------------------------------------------------------------
# Opening local paths and URIs
# ---------------------------------------------------------------------------


def open_input(path: str) -> IO[bytes]:
    """A seekable binary file for a local path, file:// URI or any pyarrow.fs URI (hdfs, s3, gs)."""
    if path.startswith("file:"):
        from urllib.parse import unquote, urlparse

        return open(unquote(urlparse(path).path), "rb")  # noqa: SIM115
    if "://" not in path:
        return open(path, "rb")  # noqa: SIM115
    from pyarrow import fs

    uri = "s3://" + path[len("s3a://"):] if path.startswith("s3a://") else path
    filesystem, inner = fs.FileSystem.from_uri(uri)
    return filesystem.open_input_file(inner)


def is_splittable_name(path: str) -> bool:
    return not path.lower().endswith((".gz", ".gzip"))


# ---------------------------------------------------------------------------
# pcap byte ranges
# ---------------------------------------------------------------------------


@dataclass
class PcapHeader:
    endian: str
    div: float
    snaplen: int
    first_sec: int | None
    size: int


def pcap_header(f: IO[bytes]) -> PcapHeader | None:
    """The classic-pcap facts a cut needs, or None when the file is not a splittable pcap."""
    f.seek(0, os.SEEK_END)
    size = f.tell()
    f.seek(0)
    head = f.read(24 + PCAP_RECORD)
    if len(head) < 24:
        return None
    magic = struct.unpack_from("<I", head)[0]
    if magic not in _PCAP_MAGICS:  # pcapng, gzip, modified pcap (24-byte records): read whole
        return None
    endian, div = _PCAP_MAGICS[magic]
    snaplen = struct.unpack_from(endian + "I", head, 16)[0]
    first = struct.unpack_from(endian + "I", head, 24)[0] if len(head) >= 24 + PCAP_RECORD else None
    return PcapHeader(endian, div, snaplen, first, size)


def align_pcap(f: IO[bytes], h: PcapHeader, pos: int, window: int = 1 << 20) -> int:
    """The first offset >= pos where a chain of plausible pcap records starts (else the file size).

    Deterministic for a given file and pos, so the task ending at a cut and the
    task starting there agree on it.
    """
    if pos <= 24:
        return 24
    size = h.size
    cap = min(h.snaplen, _MAX_RECORD) if 0 < h.snaplen else _MAX_RECORD
    unpack = struct.Struct(h.endian + "IIII").unpack_from
    first = h.first_sec
    start = pos
    while start < size:
        f.seek(start)
        buf = f.read(window + (PCAP_RECORD + cap) * (_CHAIN + 1))
        base = start
        limit = min(len(buf), window)

        def header_ok(off: int, buf: bytes = buf) -> int | None:
            """Length of the record at buf offset off, or None when implausible."""
            sec, frac, caplen, wire = unpack(buf, off)
            if caplen > cap or frac >= h.div or (wire and wire < caplen) or wire > _MAX_RECORD * 16:
                return None
            if first is not None and abs(sec - first) > _MAX_SKEW:
                return None
            return PCAP_RECORD + caplen

        for off in range(limit):
            o = off
            ok = True
            for _ in range(_CHAIN):
                if base + o == size:
                    break  # a chain may end exactly at the end of the file
                if o + PCAP_RECORD > len(buf):
                    ok = base + len(buf) < size  # ran past the read window: accept; past EOF: no
                    break
                n = header_ok(o)
                if n is None or base + o + n > size:
                    ok = False
                    break
                o += n
            if ok:
                return base + off
        start += limit if limit else window
    return size


# ---------------------------------------------------------------------------
# pcapng byte ranges
# ---------------------------------------------------------------------------

PCAPNG_SHB = 0x0A0D0D0A  # palindromic: the same in both byte orders
PCAPNG_IDB = 0x00000001
_PCAPNG_BOM = 0x1A2B3C4D
_PCAPNG_MAX_BLOCK = 1 << 26  # what the reader takes for a corrupt length
# Block types a cut point may start at: the standard ones and the custom blocks.
_PCAPNG_TYPES = frozenset({PCAPNG_SHB, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0x0A, 0x00000BAD, 0x40000BAD})


class _Window:
    """Forward-only random access over a file: bytes [off, off+n) through one growing buffer."""

    def __init__(self, f: IO[bytes], size: int, chunk: int = 4 << 20) -> None:
        self.f, self.size, self.chunk = f, size, chunk
        self.base, self.data = 0, b""

    def get(self, off: int, n: int) -> bytes:
        end = self.base + len(self.data)
        if off < self.base or off + n > end:
            if off < self.base or off > end:
                self.base, self.data = off, b""
                self.f.seek(off)
            else:
                self.data, self.base = self.data[off - self.base:], off
            want = max(n, self.chunk) - len(self.data)
            if want > 0:
                self.f.seek(self.base + len(self.data))
                self.data += self.f.read(want)
        return self.data[off - self.base:off - self.base + n]


def _block_len(win: _Window, off: int, e: str) -> tuple[int, str] | None:
    """(length, byte order after it) of a plausible pcapng block at off in byte order e, or None.

    Plausible: a known type, a length the reader accepts, inside the file, and the same
    length repeated in the block's last four bytes.
    """
    head = win.get(off, 12)
    if len(head) < 12:
        return None
    btype = struct.unpack_from(e + "I", head)[0]
    if btype not in _PCAPNG_TYPES:
        return None
    if btype == PCAPNG_SHB:
        bom = head[8:12]
        e = "<" if struct.unpack("<I", bom)[0] == _PCAPNG_BOM else (
            ">" if struct.unpack(">I", bom)[0] == _PCAPNG_BOM else "")
        if not e:
            return None
    blen = struct.unpack_from(e + "I", head, 4)[0]
    if blen < 12 or blen % 4 or blen > _PCAPNG_MAX_BLOCK or off + blen > win.size:
        return None
    tail = win.get(off + blen - 4, 4)
    if len(tail) < 4 or struct.unpack(e + "I", tail)[0] != blen:
        return None
    return blen, e


def align_pcapng(f: IO[bytes], size: int, pos: int) -> tuple[int, str]:
    """The first offset >= pos where a chain of plausible pcapng blocks starts, with its byte
    order (else the file size).  Blocks start at multiples of four (every block length is
    one).  Deterministic for a given file and pos, so the tasks on both sides of a cut
    agree on it; the range walks (``scan_pcapng_range``) then prove it a real boundary."""
    win = _Window(f, size)
    off = (pos + 3) & ~3
    while off < size:
        for e in ("<", ">"):
            at, order, ok = off, e, True
            for _ in range(_CHAIN):
                if at == size:
                    break  # a chain may end exactly at the end of the file
                got = _block_len(win, at, order)
                if got is None:
                    ok = False
                    break
                at, order = at + got[0], got[1]
            if ok:
                return off, e
        off += 4
    return size, "<"


def scan_pcapng_range(path: str, rng: int, nranges: int, split_bytes: int) -> dict[str, Any] | None:
    """Walk the block headers of one range of a pcapng file, as the reader would.

    Returns None for a file that is not pcapng; else the range's aligned ``start`` and
    ``end``, the byte order assumed at the start (``order``) and reached at the end
    (``order_end``), whether the walk landed exactly on ``end`` without a block the
    reader would stop at (``ok``), and the section header and interface description
    blocks met on the way (``blocks``: [(offset, bytes)]).
    """
    f = open_input(path)
    try:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(0)
        head = f.read(12)
        if len(head) < 12 or struct.unpack_from("<I", head)[0] != PCAPNG_SHB:
            return None
        if rng == 0:
            start, order = 0, "<"
        else:
            start, order = align_pcapng(f, size, rng * split_bytes)
        end = size if rng == nranges - 1 else align_pcapng(f, size, (rng + 1) * split_bytes)[0]
        win = _Window(f, size)
        off, e, ok = start, order, True
        blocks: list[tuple[int, bytes]] = []
        while off < end:
            head = win.get(off, 12)
            if len(head) < 8:
                ok = rng == nranges - 1  # the file ends inside a header: the reader's issue, once
                break
            btype = struct.unpack_from(e + "I", head)[0]
            if btype == PCAPNG_SHB:
                bom = head[8:12]
                e = "<" if bom == struct.pack("<I", _PCAPNG_BOM) else (">" if bom == struct.pack(
                    ">I", _PCAPNG_BOM) else "")
                if not e:
                    ok = False  # the reader stops here: read the file whole
                    break
            blen = struct.unpack_from(e + "I", head, 4)[0]
            if blen < 12 or blen % 4 or blen > _PCAPNG_MAX_BLOCK:
                ok = False
                break
            if off + blen > end:
                ok = end == size and rng == nranges - 1  # cut short at the end of the file
                break
            if btype in (PCAPNG_SHB, PCAPNG_IDB):
                blocks.append((off, win.get(off, blen)))
            off += blen
        else:
            ok = off == end
        return {"start": start, "end": end, "order": order, "order_end": e, "ok": ok, "blocks": blocks}
    finally:
        f.close()


def pcapng_spans(scans: list[dict[str, Any]]) -> list[tuple[int, int, bytes]] | None:
    """Per range of one pcapng file (scans in range order): (start, end, prefix), where the
    prefix is the section header in effect at the start and the interface blocks of that
    section before it.  None when the walks do not join up (the file is read whole)."""
    for prev, cur in zip(scans, scans[1:], strict=False):
        if not prev["ok"] or prev["end"] != cur["start"] or prev["order_end"] != cur["order"]:
            return None
    if not scans[-1]["ok"]:
        return None
    spans = []
    section: list[bytes] = []  # the current section's header and interfaces, in file order
    for scan in scans:
        spans.append((scan["start"], scan["end"], b"".join(section) if scan["start"] else b""))
        for _off, block in scan["blocks"]:
            if struct.unpack_from("<I", block)[0] == PCAPNG_SHB:
                section = [block]
            else:
                section.append(block)
    return spans


class _RangeFile(io.RawIOBase):
    """Header bytes (the pcap file header; for pcapng, the section and interface blocks
    in effect) followed by bytes [start, end) of the file."""

    def __init__(self, f: IO[bytes], header: bytes, start: int, end: int) -> None:
        self._f = f
        self._head = header
        self._hpos = 0
        self._pos = start
        self._end = end
        f.seek(start)

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        mv = memoryview(b)
        n = 0
        if self._hpos < len(self._head):
            chunk = self._head[self._hpos:self._hpos + len(mv)]
            mv[:len(chunk)] = chunk
            self._hpos += len(chunk)
            n = len(chunk)
            if n == len(mv):
                return n
        want = min(len(mv) - n, self._end - self._pos)
        if want <= 0:
            return n
        data = self._f.read(want)
        mv[n:n + len(data)] = data
        self._pos += len(data)
        return n + len(data)


# ---------------------------------------------------------------------------
# Reading one range into Arrow batches
# ---------------------------------------------------------------------------


class _Columns:
    def __init__(self) -> None:
        self.cols: dict[str, list[Any]] = {f.name: [] for f in SEGMENT_SCHEMA}
        self.n = 0

    def add(self, **values: Any) -> None:
        for name, col in self.cols.items():
            col.append(values.get(name))
        self.n += 1

    def batch(self) -> pa.RecordBatch:
        out = pa.RecordBatch.from_arrays(
            [pa.array(self.cols[f.name], type=f.type) for f in SEGMENT_SCHEMA], schema=SEGMENT_SCHEMA)
        self.cols = {f.name: [] for f in SEGMENT_SCHEMA}
        self.n = 0
        return out


def read_range(path: str, file_rank: int, rng: int, nranges: int, split_bytes: int,
               batch_rows: int = 8192, span: tuple[int, int, bytes] | None = None) -> Iterator[pa.RecordBatch]:
    """Segments of range `rng` (of `nranges`, each `split_bytes` long) of one capture file.

    ``span``: a pcapng range as planned by the driver, (start, end, the section
    header and interface blocks to read first).  Range 0 of a file that cannot be
    split reads the whole file; its other ranges emit nothing.  Unreadable input
    raises CaptureFormatError (the run fails with that message, as the
    single-process CLI exits 1).
    """
    f = open_input(path)
    try:
        if span is not None:
            start, end, prefix = span
            if start >= end and rng != 0:
                return
            source = io.BufferedReader(_RangeFile(f, prefix, start, end), 1 << 20)
            yield from _segments(path, source, file_rank, rng, batch_rows, offset_delta=start - len(prefix))
            return
        h = pcap_header(f) if nranges > 1 else None
        if h is None:
            if rng != 0:
                return
            f.seek(0)
            source_file: IO[bytes] = f
        else:
            start = align_pcap(f, h, rng * split_bytes)
            end = h.size if rng == nranges - 1 else align_pcap(f, h, (rng + 1) * split_bytes)
            if start >= end and rng != 0:
                return
            f.seek(0)
            header = f.read(24)
            source_file = io.BufferedReader(_RangeFile(f, header, start, end), 1 << 20)
        yield from _segments(path, source_file, file_rank, rng, batch_rows,
                             offset_delta=0 if h is None else start - 24)
    finally:
        f.close()


def _segments(path: str, fobj: IO[bytes], file_rank: int, rng: int, batch_rows: int,
              batch_bytes: int = 16 << 20, offset_delta: int = 0) -> Iterator[pa.RecordBatch]:
    """``offset_delta``: what turns a file offset the reader reports into one of the real
    file (the range's start minus the bytes put in front of it); kept in issue rows' seq."""
    try:
        source = open_capture(fobj)
    except CaptureFormatError as exc:
        raise CaptureFormatError(f"{path}: {str(exc).split(': ', 1)[-1]}") from None
    parser = PacketParser()
    cols = _Columns()
    lpm = float("-inf")
    count = nbytes = issues_seen = 0

    def on_secrets(secrets_type: int, data: bytes) -> None:
        cols.add(kind="secrets", conn="reader", file=file_rank, rng=rng, npackets=secrets_type, payload=data)

    source.on_secrets = on_secrets
    with source:
        for raw in source:
            count += 1
            if raw.ts > lpm:
                lpm = raw.ts
            seg = parser.parse(raw)
            if len(parser.issues) > issues_seen:  # as Dissector.feed_packet reports them
                for issue in parser.issues[issues_seen:]:
                    cols.add(kind="issue", conn="parser", file=file_rank, rng=rng, ts=raw.ts,
                             ikind=issue.kind, imsg=issue.message, seq=offset_delta)
                issues_seen = len(parser.issues)
            if seg is None:
                continue
            s, d = seg.src, seg.dst
            cols.add(kind="seg", conn=conn_key(s.ip, s.port, d.ip, d.port), lpm=lpm, file=file_rank,
                     rng=rng, idx=raw.index, ts=seg.ts, src_ip=s.ip, src_port=s.port, dst_ip=d.ip,
                     dst_port=d.port, seq=seg.seq, ack=seg.ack, flags=seg.flags,
                     payload=seg.payload, missing=seg.missing)
            nbytes += len(seg.payload)
            if cols.n >= batch_rows or nbytes >= batch_bytes:
                yield cols.batch()
                nbytes = 0
        parser.finish()
        for issue in parser.issues[issues_seen:]:  # at the end of the capture: ts of its last segment
            cols.add(kind="issue", conn="parser_end", file=file_rank, rng=rng, ikind=issue.kind,
                     imsg=issue.message, seq=offset_delta)
        for issue in source.issues:
            snap = None
            if issue.message.endswith(SNAPLEN_TRUNCATED_SUFFIX):
                snap = source.stats.snaplen_truncated  # summed over the file's ranges later
            cols.add(kind="issue", conn="reader", file=file_rank, rng=rng, ikind=issue.kind,
                     imsg=issue.message, npackets=snap, seq=offset_delta)
    cols.add(kind="range", file=file_rank, rng=rng, lpm=lpm if count else None, npackets=count,
             idx=parser.stats.tcp)
    yield cols.batch()
