"""Codecs: decompression with caps, and the checksums.

Oracles: the compressors of the libraries themselves (stdlib gzip/zlib, lz4.frame,
zstandard, cramjam) and kafka-python's Kafka-specific encoders (xerial snappy
framing, old-Kafka lz4, gzip/zstd); published XXH32 / CRC-32C test vectors and
lz4's own frame-header checksums; kafka-python's pure-Python CRC-32C.
"""

from __future__ import annotations

import gzip
import os
import random
import struct
import tracemalloc
import zlib

import cramjam
import lz4.frame
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka import codec as kp_codec
from kafka.record._crc32c import crc as kp_crc32c_py

from kwinspect.model import DECOMPRESSION_FAILED, LIMIT_EXCEEDED
from kwinspect.protocol import checksums
from kwinspect.protocol.codecs import (
    CODEC_NAMES,
    DEFAULT_LIMITS,
    Limits,
    decompress,
    lz4_fix_legacy_header,
    xxh32,
)

MiB = 1 << 20
PAYLOAD = b"".join(b"record %d: " % i + os.urandom(i % 13) * 3 for i in range(3000))


class _CramjamSnappy:
    @staticmethod
    def compress(b):
        return bytes(cramjam.snappy.compress_raw(bytes(b)))

    @staticmethod
    def decompress(b):
        return bytes(cramjam.snappy.decompress_raw(bytes(b)))


class _XXHash:
    class _H:
        def __init__(self, data):
            self.v = xxh32(bytes(data))

        def digest(self):
            return struct.pack(">I", self.v)

    xxh32 = _H


@pytest.fixture(autouse=True)
def _kafka_python_backends(monkeypatch):
    monkeypatch.setattr(kp_codec, "snappy", _CramjamSnappy)
    monkeypatch.setattr(kp_codec, "xxhash", _XXHash)


def _zstd_streamed(d: bytes) -> bytes:
    c = zstandard.ZstdCompressor().compressobj()  # frame without a content size
    return c.compress(d) + c.flush()


def _compressors():
    return {
        "gzip-stdlib": (1, lambda d: gzip.compress(d)),
        "gzip-kafka-python": (1, lambda d: kp_codec.gzip_encode(d)),
        "zlib-wrapped": (1, lambda d: zlib.compress(d)),
        "gzip-two-members": (1, lambda d: gzip.compress(d[:1000]) + gzip.compress(d[1000:])),
        "snappy-raw": (2, lambda d: bytes(cramjam.snappy.compress_raw(d))),
        "snappy-xerial-kafka-python": (2, lambda d: kp_codec.snappy_encode(d, xerial_compatible=True)),
        "snappy-xerial-small-blocks": (
            2, lambda d: kp_codec.snappy_encode(d, xerial_compatible=True, xerial_blocksize=1000)),
        "lz4-frame": (3, lambda d: lz4.frame.compress(d)),
        "lz4-kafka-python": (3, lambda d: kp_codec.lz4_encode(d)),
        "lz4-content-size-checksums": (
            3, lambda d: lz4.frame.compress(d, store_size=True, content_checksum=True,
                                            block_checksum=True)),
        "lz4-old-kafka": (3, lambda d: kp_codec.lz4_encode_old_kafka(d)),
        "zstd": (4, lambda d: zstandard.ZstdCompressor().compress(d)),
        "zstd-kafka-python": (4, lambda d: kp_codec.zstd_encode(d)),
        "zstd-two-frames": (4, lambda d: zstandard.ZstdCompressor().compress(d[:500])
                            + zstandard.ZstdCompressor().compress(d[500:])),
        "zstd-streamed-no-size": (4, _zstd_streamed),
    }


@pytest.mark.parametrize("name", sorted(_compressors()))
def test_round_trip(name):
    codec_id, fn = _compressors()[name]
    comp = fn(PAYLOAD)
    out, issue = decompress(codec_id, comp)
    assert issue is None
    assert out == PAYLOAD


@pytest.mark.parametrize("name", sorted(_compressors()))
def test_truncated_or_corrupt_input_is_an_issue(name):
    codec_id, fn = _compressors()[name]
    comp = fn(PAYLOAD)
    for bad in (comp[: len(comp) // 2], comp[:7], b"", b"\x00" * 40, os.urandom(64)):
        out, issue = decompress(codec_id, bad)
        if issue is None:  # some garbage is a valid, short stream; never the original
            assert out != PAYLOAD
        else:
            assert out is None
            assert issue.kind in (DECOMPRESSION_FAILED, LIMIT_EXCEEDED)


def test_truncation_is_detected_for_every_codec():
    for name, (codec_id, fn) in _compressors().items():
        comp = fn(PAYLOAD)
        out, issue = decompress(codec_id, comp[: len(comp) - 3])
        assert out is None and issue is not None, name


def test_unknown_codec():
    out, issue = decompress(5, b"abc")
    assert out is None and issue.kind == DECOMPRESSION_FAILED
    assert decompress(0, b"abc") == (b"abc", None)


def test_cap_is_respected_exactly():
    for name, (codec_id, fn) in _compressors().items():
        comp = fn(PAYLOAD)
        assert decompress(codec_id, comp, len(PAYLOAD)) == (PAYLOAD, None), name
        out, issue = decompress(codec_id, comp, len(PAYLOAD) - 1)
        assert out is None and issue.kind == LIMIT_EXCEEDED, name


def test_limits_defaults_and_output_cap():
    assert DEFAULT_LIMITS.max_decompressed_bytes == 64 * MiB
    assert DEFAULT_LIMITS.max_legacy_depth == 2
    assert DEFAULT_LIMITS.output_cap(10) == DEFAULT_LIMITS.min_cap
    assert DEFAULT_LIMITS.output_cap(16 * MiB) == 64 * MiB
    assert Limits(max_ratio=10, min_cap=0).output_cap(1000) == 10_000
    assert CODEC_NAMES == {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}


# --------------------------------------------------------------------------- bombs

GiB = 1 << 30


def _gzip_bomb() -> bytes:
    zc = zlib.compressobj(1, zlib.DEFLATED, 31)
    z = bytes(4 * MiB)
    return b"".join([zc.compress(z) for _ in range(GiB // len(z))] + [zc.flush()])


def _zstd_bomb() -> bytes:
    zc = zstandard.ZstdCompressor(level=1).compressobj()
    z = bytes(4 * MiB)
    return b"".join([zc.compress(z) for _ in range(GiB // len(z))] + [zc.flush()])


def _lz4_bomb() -> bytes:
    c = lz4.frame.LZ4FrameCompressor()
    z = bytes(4 * MiB)
    return b"".join([c.begin(source_size=GiB)] + [c.compress(z) for _ in range(GiB // len(z))]
                    + [c.flush()])


def _snappy_raw_claim() -> bytes:
    # A raw snappy block whose length varint claims 1 GiB: refused before decoding.
    n, out = GiB, bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out) + bytes(cramjam.snappy.compress_raw(bytes(1000)))[2:]


def _snappy_xerial_many_blocks() -> bytes:
    block = bytes(cramjam.snappy.compress_raw(bytes(64 * 1024)))
    head = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    return head + (struct.pack(">i", len(block)) + block) * 2000  # 125 MiB from ~6 MiB


@pytest.mark.parametrize("codec_id,make", [
    (1, _gzip_bomb), (4, _zstd_bomb), (3, _lz4_bomb), (2, _snappy_raw_claim),
    (2, _snappy_xerial_many_blocks),
], ids=["gzip-1GiB", "zstd-1GiB", "lz4-1GiB", "snappy-raw-claims-1GiB", "snappy-xerial-125MiB"])
def test_bomb_stops_at_the_cap(codec_id, make):
    bomb = make()
    cap = DEFAULT_LIMITS.output_cap(len(bomb))
    tracemalloc.start()
    try:
        out, issue = decompress(codec_id, bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert out is None
    assert issue.kind == LIMIT_EXCEEDED and "cap" in issue.message
    assert peak < cap + 3 * MiB + 3 * len(bomb)


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 4), st.binary(max_size=200))
def test_fuzz_garbage_never_raises(codec_id, data):
    out, issue = decompress(codec_id, data, 1 << 20)
    assert (out is None) != (issue is None)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(sorted(_compressors())), st.data())
def test_fuzz_damaged_streams_never_raise(name, data):
    codec_id, fn = _compressors()[name]
    comp = bytearray(fn(PAYLOAD[:5000]))
    for _ in range(data.draw(st.integers(1, 3))):
        pos = data.draw(st.integers(0, len(comp) - 1))
        comp[pos] ^= 1 << data.draw(st.integers(0, 7))
    out, issue = decompress(codec_id, bytes(comp), 1 << 20)
    assert (out is None) != (issue is None)
    if out is not None:
        assert len(out) <= 1 << 20


# --------------------------------------------------------------------------- lz4 / xxh32


def test_xxh32_published_vectors():
    assert xxh32(b"") == 0x02CC5D05
    assert xxh32(b"a") == 0x550D7456
    assert xxh32(b"abc") == 0x32D153FF
    assert xxh32(b"Nobody inspects the spammish repetition") == 0xE2293B2F


def test_xxh32_matches_lz4_frame_header_checksums():
    # lz4 writes HC = (xxh32(FLG..descriptor end) >> 8) & 0xFF: check ours against it.
    seen = 0
    for size in (0, 1, 1000, 70000, 1 << 20, 123456789):
        for checksum in (False, True):
            c = lz4.frame.LZ4FrameCompressor(content_checksum=checksum)
            head = c.begin(source_size=size)
            flg = head[4]
            hc_pos = 6 + (8 if flg & 0x08 else 0)
            assert head[hc_pos] == (xxh32(head[4:hc_pos]) >> 8) & 0xFF
            seen += 1
    assert seen == 12


def test_lz4_legacy_header_fixup():
    good = lz4.frame.compress(PAYLOAD, store_size=False)
    broken = kp_codec.lz4_encode_old_kafka(PAYLOAD)
    assert broken != good[: len(broken)] or broken[6] != good[6]
    fixed = lz4_fix_legacy_header(broken)
    assert lz4.frame.decompress(fixed) == PAYLOAD
    assert kp_codec.lz4_decode_old_kafka(broken) == PAYLOAD  # the oracle agrees
    assert lz4_fix_legacy_header(good) == good  # correct frames untouched
    with pytest.raises(RuntimeError):
        lz4.frame.decompress(broken)  # really broken for a strict reader


# --------------------------------------------------------------------------- checksums


def test_crc32c_vectors_and_oracle():
    assert checksums.crc32c(b"123456789") == 0xE3069283
    assert checksums.crc32c(b"") == 0
    for n in (1, 7, 64, 1000):
        data = os.urandom(n)
        assert checksums.crc32c(data) == kp_crc32c_py(data)
        assert checksums._crc32c_py(data) == kp_crc32c_py(data)


def test_crc32_vector():
    assert checksums.crc32(b"123456789") == 0xCBF43926


# --------------------------------------------------------------------------- zstd: whole input at once


def _zstd_inputs() -> list[bytes]:
    text = b"".join(b"record %d value %s\n" % (i, b"x" * (i % 37)) for i in range(3000))
    frames = [
        zstandard.ZstdCompressor(level=3).compress(text),
        zstandard.ZstdCompressor(level=1, write_checksum=True).compress(text[:5000]),
        zstandard.ZstdCompressor(level=19, write_content_size=False).compress(text),
        zstandard.ZstdCompressor().compress(b""),
        zstandard.ZstdCompressor().compress(random.Random(7).randbytes(3000)),  # raw blocks
        zstandard.ZstdCompressor().compress(b"\x00" * (3 << 20)),  # RLE blocks: bound over the cap
    ]
    cobj = zstandard.ZstdCompressor(write_content_size=False).compressobj()  # streamed, like Java
    frames.append(cobj.compress(text) + cobj.flush())
    out = list(frames)
    out.append(frames[0] + frames[1])  # concatenated frames
    out.append(frames[0] + b"\x00" * 7)  # zero padding
    out.append(frames[0] + b"\x01garbage")
    out.append(b"\x00" * 16)
    out.append(b"\x50\x2a\x4d\x18" + struct.pack("<I", 3) + b"abc" + frames[1])  # skippable frame
    for f in frames[:3]:
        out += [f[:cut] for cut in range(0, len(f), max(1, len(f) // 25))]
        for pos in range(0, len(f), max(1, len(f) // 25)):
            b = bytearray(f)
            b[pos] ^= 0x41
            out.append(bytes(b))
    return out


def test_zstd_whole_input_same_as_pieces(monkeypatch):
    """Feeding all input at once (when the block headers allow it) gives what
    the 64-byte pieces give: output, bombs and error messages."""
    from kwinspect.protocol import codecs

    limits = [Limits(), Limits(min_cap=300 << 10, max_ratio=1), Limits(min_cap=40_000, max_ratio=1),
              1 << 20, 10_000]
    fast = [[decompress(4, d, lim) for lim in limits] for d in _zstd_inputs()]
    monkeypatch.setattr(codecs, "_zstd_output_bound", lambda data, limit: None)
    slow = [[decompress(4, d, lim) for lim in limits] for d in _zstd_inputs()]
    assert len(fast) == len(slow)
    for f_row, s_row in zip(fast, slow, strict=True):
        for (fo, fi), (so, si) in zip(f_row, s_row, strict=True):
            assert fo == so
            assert (fi and fi.as_dict()) == (si and si.as_dict())


def test_zstd_output_bound_is_an_upper_bound():
    from kwinspect.protocol.codecs import _zstd_output_bound

    for d in _zstd_inputs():
        bound = _zstd_output_bound(d, 1 << 30)
        if bound is None:
            continue
        try:
            got = zstandard.ZstdDecompressor().decompressobj().decompress(d)
        except zstandard.ZstdError:
            continue
        assert len(got) <= bound
    rle = zstandard.ZstdCompressor().compress(b"\x00" * (3 << 20))
    assert _zstd_output_bound(rle, 1 << 20) is None  # would pass the cap: pieces, as before


def test_zstd_keeps_no_state_between_inputs():
    """A corrupt, truncated or bombing input before a good one changes nothing
    about the good one."""
    good = zstandard.ZstdCompressor(level=3).compress(PAYLOAD)
    for d in _zstd_inputs():
        decompress(4, d, 10_000)
        decompress(4, d[: len(d) // 2])
        assert decompress(4, good) == (PAYLOAD, None)


def test_lz4_header_checksum_cache_matches_xxh32():
    from kwinspect.protocol import codecs

    rnd = random.Random(3)
    descs = [bytes(rnd.randrange(256) for _ in range(rnd.choice((2, 6, 10, 14)))) for _ in range(600)]
    for d in descs + descs[::-1]:  # more than the cache holds, then again: refills
        assert codecs._header_checksum(d) == (xxh32(d) >> 8) & 0xFF
    assert len(codecs._HC_CACHE) <= 256
