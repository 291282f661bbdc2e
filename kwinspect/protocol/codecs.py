"""Kafka compression codecs with bounded output.

``decompress(codec_id, data, limit) -> (bytes | None, Issue | None)``
``compress(codec_id, data, like=b"") -> bytes`` (re-compressing a rewritten batch)

Codec ids (the low three bits of a batch's or message's attributes):
0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd.

- gzip: stdlib zlib, streamed with ``max_length`` so a bomb stops at the cap;
  concatenated gzip members are accepted (Java's GZIPInputStream does too).
- snappy: cramjam.  Java clients write the xerial block framing
  (``\\x82SNAPPY\\x00`` + version + compat, then big-endian int32 length +
  raw snappy block, repeated); librdkafka and others write raw snappy.  The
  uncompressed length varint that starts every raw snappy block is checked
  against the cap *before* the block is decompressed.
- lz4: the LZ4 frame format via ``lz4.frame.LZ4FrameDecompressor`` with
  ``max_length``.  Kafka < 0.10 (magic 0 messages) computed the frame header
  checksum (HC) over the wrong bytes (magic number included); such frames are
  recognised and their HC byte is fixed before decoding.
- zstd: zstandard's streaming reader, read in chunks up to the cap.

The output cap comes from ``Limits.output_cap(len(data))``: a multiple of the
compressed size, at least ``min_cap`` and at most ``max_decompressed_bytes``.
Exceeding it is a ``limit_exceeded`` issue, corrupt input a
``decompression_failed`` issue; nothing raises.

This is the only module of the sans-IO core that may import compression
libraries (import-linter contract in pyproject.toml).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from kwinspect.model import DECOMPRESSION_FAILED, LIMIT_EXCEEDED, Issue

try:
    import lz4.frame as _lz4frame
except ImportError:  # pragma: no cover
    _lz4frame = None
try:
    import zstandard as _zstd
except ImportError:  # pragma: no cover
    _zstd = None
try:
    import cramjam as _cramjam
except ImportError:  # pragma: no cover
    _cramjam = None

__all__ = [
    "CODEC_NAMES", "NONE", "GZIP", "SNAPPY", "LZ4", "ZSTD", "Limits", "DEFAULT_LIMITS",
    "decompress", "compress", "codec_name", "xxh32", "lz4_fix_legacy_header",
]

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
CODEC_NAMES = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}

MiB = 1 << 20


@dataclass(frozen=True, slots=True)
class Limits:
    """Resource limits for record decoding.

    Defaults:
    - ``max_decompressed_bytes`` = 64 MiB: absolute cap for one decompression
      (one v2 batch or one legacy wrapper message).  Kafka's default
      ``max.message.bytes`` is ~1 MiB compressed; 64 MiB leaves room for very
      compressible real batches.
    - ``max_ratio`` = 256: the cap is at most 256 output bytes per input byte...
    - ``min_cap`` = 1 MiB: ...but never below 1 MiB, so small, highly
      compressible batches (a few repeated values) still decode.
    - ``max_legacy_depth`` = 2: levels of compressed wrapper messages followed
      in legacy message sets (real producers use exactly one).
    - ``max_records_per_batch`` = 1,000,000: records decoded from one batch or
      wrapper; beyond it the rest is skipped with a ``limit_exceeded`` issue
      (64 MiB of minimal 7-byte records would otherwise be ~9.6 M objects).
    """

    max_decompressed_bytes: int = 64 * MiB
    max_ratio: int = 256
    min_cap: int = 1 * MiB
    max_legacy_depth: int = 2
    max_records_per_batch: int = 1_000_000

    def output_cap(self, input_len: int) -> int:
        cap = max(self.min_cap, self.max_ratio * max(0, input_len))
        return min(self.max_decompressed_bytes, cap)


DEFAULT_LIMITS = Limits()


def codec_name(codec_id: int) -> str:
    return CODEC_NAMES.get(codec_id, f"unknown({codec_id})")


def decompress(
    codec_id: int,
    data: bytes | bytearray | memoryview,
    limit: int | Limits | None = None,
) -> tuple[bytes | None, Issue | None]:
    """Decompress ``data`` with Kafka codec ``codec_id``, producing at most ``limit`` bytes.

    ``limit`` is a byte count, or a ``Limits`` whose ``output_cap(len(data))``
    is used (``None`` means the default limits).  Returns ``(output, None)``
    on success, ``(None, issue)`` otherwise.
    """
    data = bytes(data)
    if limit is None:
        limit = DEFAULT_LIMITS
    cap = limit.output_cap(len(data)) if isinstance(limit, Limits) else int(limit)
    if codec_id == NONE:
        if len(data) > cap:
            return None, _bomb("none", cap)
        return data, None
    fn = _DECODERS.get(codec_id)
    if fn is None:
        return None, Issue(DECOMPRESSION_FAILED, f"unknown compression codec id {codec_id}")
    try:
        return fn(data, cap)
    except _Bomb:
        return None, _bomb(codec_name(codec_id), cap)
    except MemoryError:
        return None, Issue(LIMIT_EXCEEDED, f"{codec_name(codec_id)}: out of memory while decompressing")
    except Exception as exc:  # third-party codecs raise assorted types on corrupt input
        return None, Issue(
            DECOMPRESSION_FAILED, f"{codec_name(codec_id)}: {type(exc).__name__}: {exc}"[:300]
        )


class _Bomb(Exception):
    pass


class _Corrupt(Exception):
    pass


class _Sink:
    """Collects output chunks (at most 1 MiB each) and stops at the cap, so a
    bomb costs about cap + 1 MiB of memory and no final copy."""

    __slots__ = ("cap", "chunks", "total")

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.chunks: list[bytes] = []
        self.total = 0

    def step(self) -> int:
        return min(MiB, self.cap + 1 - self.total)

    def add(self, chunk: bytes) -> None:
        if chunk:
            self.total += len(chunk)
            if self.total > self.cap:
                raise _Bomb
            self.chunks.append(chunk)

    def result(self) -> bytes:
        return self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)


def _bomb(name: str, cap: int) -> Issue:
    return Issue(
        LIMIT_EXCEEDED,
        f"{name}: decompressed size exceeds the cap of {cap} bytes (possible decompression bomb)",
    )


# --------------------------------------------------------------------------- gzip


def _gunzip(data: bytes, cap: int) -> tuple[bytes | None, Issue | None]:
    out = _Sink(cap)
    buf = data
    while True:
        d = zlib.decompressobj(47)  # 32 + 15: gzip or zlib header, auto-detected
        while True:
            chunk = d.decompress(buf, out.step())
            out.add(chunk)
            if d.eof:
                break
            buf = d.unconsumed_tail
            if not buf and not chunk:
                # all input consumed, no progress: the stream ends early
                out.add(d.flush(out.step()))
                if not d.eof:
                    raise _Corrupt("truncated gzip stream")
                break
        rest = d.unused_data
        if not rest or not rest.strip(b"\x00"):
            break
        buf = rest  # concatenated gzip members
    return out.result(), None


# --------------------------------------------------------------------------- snappy

XERIAL_MAGIC = b"\x82SNAPPY\x00"


def _uvarint32(data: bytes, pos: int = 0) -> tuple[int, int]:
    result = 0
    for i in range(5):
        if pos + i >= len(data):
            raise _Corrupt("truncated snappy length varint")
        b = data[pos + i]
        result |= (b & 0x7F) << (7 * i)
        if not b & 0x80:
            return result, pos + i + 1
    raise _Corrupt("snappy length varint too long")


def _snappy_block(block: bytes, budget: int) -> bytes:
    n, _ = _uvarint32(block)
    if n > budget:
        raise _Bomb
    out = bytes(_cramjam.snappy.decompress_raw(block))
    if len(out) != n:
        raise _Corrupt(f"snappy block length {len(out)} != declared {n}")
    return out


def _unsnappy(data: bytes, cap: int) -> tuple[bytes | None, Issue | None]:
    if _cramjam is None:  # pragma: no cover
        return None, Issue(DECOMPRESSION_FAILED, "snappy: cramjam is not installed")
    if data[:8] == XERIAL_MAGIC and len(data) >= 16:
        out = bytearray()
        pos = 16
        while pos < len(data):
            if pos + 4 > len(data):
                raise _Corrupt(f"xerial snappy: truncated block length at {pos}")
            (blen,) = struct.unpack_from(">i", data, pos)
            pos += 4
            if blen < 0 or blen > len(data) - pos:
                raise _Corrupt(f"xerial snappy: block length {blen} exceeds the {len(data) - pos} bytes left")
            out += _snappy_block(data[pos : pos + blen], cap - len(out))
            pos += blen
        return bytes(out), None
    return _snappy_block(data, cap), None


# --------------------------------------------------------------------------- lz4

_P1, _P2, _P3, _P4, _P5 = 2654435761, 2246822519, 3266489917, 668265263, 374761393
_M32 = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def xxh32(data: bytes, seed: int = 0) -> int:
    """XXH32 (pure Python; used only on LZ4 frame headers, a few bytes long)."""
    n = len(data)
    pos = 0
    if n >= 16:
        v1 = (seed + _P1 + _P2) & _M32
        v2 = (seed + _P2) & _M32
        v3 = seed & _M32
        v4 = (seed - _P1) & _M32
        while pos + 16 <= n:
            w = struct.unpack_from("<4I", data, pos)
            v1 = _rotl((v1 + w[0] * _P2) & _M32, 13) * _P1 & _M32
            v2 = _rotl((v2 + w[1] * _P2) & _M32, 13) * _P1 & _M32
            v3 = _rotl((v3 + w[2] * _P2) & _M32, 13) * _P1 & _M32
            v4 = _rotl((v4 + w[3] * _P2) & _M32, 13) * _P1 & _M32
            pos += 16
        h = (_rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)) & _M32
    else:
        h = (seed + _P5) & _M32
    h = (h + n) & _M32
    while pos + 4 <= n:
        (w,) = struct.unpack_from("<I", data, pos)
        h = _rotl((h + w * _P3) & _M32, 17) * _P4 & _M32
        pos += 4
    while pos < n:
        h = _rotl((h + data[pos] * _P5) & _M32, 11) * _P1 & _M32
        pos += 1
    h ^= h >> 15
    h = h * _P2 & _M32
    h ^= h >> 13
    h = h * _P3 & _M32
    h ^= h >> 16
    return h


LZ4_FRAME_MAGIC = b"\x04\x22\x4d\x18"


_HC_CACHE: dict[bytes, int] = {}


def _header_checksum(descriptor: bytes) -> int:
    """The LZ4 frame header checksum of ``descriptor`` (FLG..end of the optional
    fields).  Producers write the same few descriptors again and again, and the
    pure-Python xxh32 cost more than decompressing a small batch: cached."""
    hc = _HC_CACHE.get(descriptor)
    if hc is None:
        if len(_HC_CACHE) >= 256:
            _HC_CACHE.clear()
        hc = _HC_CACHE[descriptor] = (xxh32(descriptor) >> 8) & 0xFF
    return hc


def lz4_fix_legacy_header(frame: bytes) -> bytes:
    """Return ``frame`` with a correct LZ4 header checksum if it carries the
    broken one written by Kafka < 0.10 (checksum computed from the magic
    number on, instead of from the FLG byte).  Other input is returned as is."""
    if len(frame) < 7 or frame[:4] != LZ4_FRAME_MAGIC:
        return frame
    flg = frame[4]
    hc_pos = 6 + (8 if flg & 0x08 else 0) + (4 if flg & 0x01 else 0)
    if hc_pos >= len(frame):
        return frame
    good = _header_checksum(frame[4:hc_pos])
    if frame[hc_pos] == good:
        return frame
    broken = (xxh32(frame[0:hc_pos]) >> 8) & 0xFF
    if frame[hc_pos] != broken:
        return frame
    return frame[:hc_pos] + bytes([good]) + frame[hc_pos + 1 :]


def _unlz4(data: bytes, cap: int) -> tuple[bytes | None, Issue | None]:
    if _lz4frame is None:  # pragma: no cover
        return None, Issue(DECOMPRESSION_FAILED, "lz4: the lz4 package is not installed")
    out = _Sink(cap)
    buf = lz4_fix_legacy_header(data)
    while True:
        d = _lz4frame.LZ4FrameDecompressor()
        while True:
            out.add(d.decompress(buf, max_length=out.step()))
            buf = b""
            if d.eof:
                break
            if d.needs_input:
                raise _Corrupt("truncated lz4 frame")
        rest = d.unused_data
        if not rest:
            break
        buf = lz4_fix_legacy_header(rest)
    return out.result(), None


# --------------------------------------------------------------------------- zstd


def _unzstd(data: bytes, cap: int) -> tuple[bytes | None, Issue | None]:
    if _zstd is None:  # pragma: no cover
        return None, Issue(DECOMPRESSION_FAILED, "zstd: the zstandard package is not installed")
    # decompressobj has no output bound, so feed it input in pieces small
    # enough that one piece cannot expand past what is left of the cap: a zstd
    # block yields at most 128 KiB from about 4 input bytes (ratio <= 32768).
    # 2^27 is libzstd's default limit and what Kafka's Java consumer accepts;
    # a smaller one would reject real frames from high compression levels.
    # A new decompressor per call although one costs ~7.5 us: a long-lived one
    # keeps its window buffer mapped, and then glibc never raises its mmap
    # threshold, so other large buffers are mapped and unmapped each time
    # (8x the page faults and +0.17 s of system time on capture (a)).
    dctx = _zstd.ZstdDecompressor(max_window_size=1 << 27)
    if not data:
        raise _Corrupt("empty zstd input")
    out = _Sink(cap)
    # With a 1 MiB cap those pieces are 64 bytes: dozens of calls for a small
    # batch.  When the block headers show that all of the input cannot come
    # near the cap, it is fed at once (same output, same errors: only the
    # piece size differs).
    whole = _zstd_output_bound(data, cap - (256 << 10)) is not None
    buf = data
    while buf:
        d = dctx.decompressobj()
        pos = 0
        while pos < len(buf) and not d.eof:
            step = len(buf) if whole else max(64, (cap - out.total - (256 << 10)) // 32768)
            out.add(d.decompress(buf[pos : pos + step]))
            pos += step
        if not d.eof:
            raise _Corrupt("truncated zstd frame")
        buf = d.unused_data + buf[pos:]
        if not buf.strip(b"\x00"):
            break
    return out.result(), None


ZSTD_BLOCK_MAX = 128 << 10  # the most one compressed block can regenerate


def _zstd_output_bound(data: bytes, limit: int) -> int | None:
    """An upper bound of what decoding the zstd frames in ``data`` can produce,
    from their block headers (raw and RLE blocks say their size, a compressed
    block regenerates at most 128 KiB); None when it passes ``limit`` or the
    input is anything but plain frames (skippable frames, reserved bits,
    truncation, trailing bytes other than zero padding)."""
    n = len(data)
    pos = 0
    total = 0
    while pos < n:
        if n - pos < 5 or data[pos:pos + 4] != b"\x28\xb5\x2f\xfd":
            if pos and not data[pos:].strip(b"\x00"):
                break  # zero padding after a frame, as _unzstd accepts it
            return None
        fhd = data[pos + 4]
        if fhd & 0x08:
            return None
        single = fhd & 0x20
        pos += 5 + (0 if single else 1) + (0, 1, 2, 4)[fhd & 3] + ((1 if single else 0), 2, 4, 8)[fhd >> 6]
        while True:
            if n - pos < 3:
                return None
            h = data[pos] | data[pos + 1] << 8 | data[pos + 2] << 16
            pos += 3
            btype = (h >> 1) & 3
            if btype == 0:  # raw
                total += h >> 3
                pos += h >> 3
            elif btype == 1:  # RLE: one byte, repeated
                total += h >> 3
                pos += 1
            elif btype == 2:  # compressed
                total += ZSTD_BLOCK_MAX
                pos += h >> 3
            else:
                return None
            if pos > n or total > limit:
                return None
            if h & 1:  # last block
                break
        if fhd & 0x04:  # content checksum
            pos += 4
        if pos > n:
            return None
    return total


_DECODERS = {GZIP: _gunzip, SNAPPY: _unsnappy, LZ4: _unlz4, ZSTD: _unzstd}


# --------------------------------------------------------------------------- compression


def _xerial(data: bytes) -> bytes:
    """Java's xerial snappy framing: magic, version 1, compatible version 1, then blocks."""
    out = bytearray(XERIAL_MAGIC + struct.pack(">ii", 1, 1))
    for pos in range(0, len(data), XERIAL_BLOCK):
        block = bytes(_cramjam.snappy.compress_raw(data[pos:pos + XERIAL_BLOCK]))
        out += struct.pack(">i", len(block)) + block
    return bytes(out)


XERIAL_BLOCK = 32 * 1024  # the block size Kafka's Java client writes


def compress(codec_id: int, data: bytes, like: bytes = b"") -> bytes:
    """``data`` compressed with a codec, in the framing ``like`` (the original payload) used.

    Only the framing follows the original (snappy raw or xerial); the compressed
    bytes themselves are this library's.  Raises ValueError for a codec this
    build cannot write (a missing compression library, an unknown id).
    """
    if codec_id == NONE:
        return data
    if codec_id == GZIP:
        c = zlib.compressobj(wbits=31)  # gzip container, as Kafka writes it
        return c.compress(data) + c.flush()
    if codec_id == SNAPPY and _cramjam is not None:
        if like[:8] == XERIAL_MAGIC:
            return _xerial(data)
        return bytes(_cramjam.snappy.compress_raw(data))
    if codec_id == LZ4 and _lz4frame is not None:
        # as Kafka's Java producer writes it: 64 KiB independent blocks, no content
        # size, no checksums (older Java readers refuse linked blocks)
        return _lz4frame.compress(data, block_size=_lz4frame.BLOCKSIZE_MAX64KB, block_linked=False,
                                  content_checksum=False, store_size=False)
    if codec_id == ZSTD and _zstd is not None:
        return _zstd.ZstdCompressor().compress(data)
    raise ValueError(f"cannot compress with codec {codec_id} ({codec_name(codec_id)})")
