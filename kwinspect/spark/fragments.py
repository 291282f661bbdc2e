"""Stage 1 of the pipeline: capture files (or byte ranges of them) -> TCP segments as Arrow.

No pyspark here: these functions run inside Spark tasks (and in tests without
Spark).  A task reads one *range* of one file with the project's own readers
and packet parser and emits Arrow record batches of serialised ``TcpSegment``
values, each with its position in the merged capture order.

Splitting: an uncompressed classic pcap file larger than the split size is cut
into byte ranges.  Every cut point is moved forward to the first offset where a
chain of plausible record headers starts (``align_pcap``); the task before a cut
reads up to the same aligned offset, so every record is read exactly once.
pcapng and .gz files are read whole by one task.

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
    ("imsg", pa.string()),       # "issue" rows: message (without the path; seq: the range's start offset)
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


class _RangeFile(io.RawIOBase):
    """The 24-byte pcap file header followed by bytes [start, end) of the file."""

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
               batch_rows: int = 8192) -> Iterator[pa.RecordBatch]:
    """Segments of range `rng` (of `nranges`, each `split_bytes` long) of one capture file.

    Range 0 of a file that cannot be split reads the whole file; its other
    ranges emit nothing.  Unreadable input raises CaptureFormatError (the run fails
    with that message, as the single-process CLI exits 1).
    """
    f = open_input(path)
    try:
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
                             start=0 if h is None else start)
    finally:
        f.close()


def _segments(path: str, fobj: IO[bytes], file_rank: int, rng: int, batch_rows: int,
              batch_bytes: int = 16 << 20, start: int = 0) -> Iterator[pa.RecordBatch]:
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
                             ikind=issue.kind, imsg=issue.message, seq=start)
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
                     imsg=issue.message, seq=start)
        for issue in source.issues:
            snap = None
            if issue.message.endswith(SNAPLEN_TRUNCATED_SUFFIX):
                snap = source.stats.snaplen_truncated  # summed over the file's ranges later
            cols.add(kind="issue", conn="reader", file=file_rank, rng=rng, ikind=issue.kind,
                     imsg=issue.message, npackets=snap, seq=start)
    cols.add(kind="range", file=file_rank, rng=rng, lpm=lpm if count else None, npackets=count,
             idx=parser.stats.tcp)
    yield cols.batch()
