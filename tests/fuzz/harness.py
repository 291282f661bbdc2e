"""End-to-end fuzz targets for hostile input: seeds, mutators, targets, invariants.

Shared by the bounded tests in tests/fuzz/, the regression replay in
tests/fuzz_regressions/ and the long standalone runner bench/fuzz.py.

Seeds are the real frames, record sets, byte streams, segments and files of
captures/*.pcap and ../shared/captures-public/*, plus a few crafted hostile
inputs (compression bombs, giant lengths, deep legacy nesting).  A target
turns ``(rng, corpus)`` into a *case* (a small JSON-able dict with the input
bytes in base64), and ``check(case)`` runs it through the code under test and
raises ``FuzzFailure`` when an invariant breaks:

- no exception escapes (the decoder's last-resort ``internal_error`` issue
  counts as a failure too: it means a bug was caught);
- accounting holds: TCP per-direction identities, framing byte accounting,
  the dissector's packet counts and per-connection byte accounting;
- bounded memory is checked by the runner (tracemalloc peak on sampled inputs),
  bounded work by the runner's per-input alarm.

Targets: decode (the fast decoder against the reference, and the compiled labels of
the body against the Python walks), records, framing, tcp, pcap, dissect, and core: the compiled
core (readers, packet parser, Dissector) against the pure-Python one on the same
mutated file, which must agree exactly (packets, counters, issues, segments, rows);
with the compiled core not built, both sides are the Python one.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import glob
import gzip
import io
import json
import os
import random
import struct
import zlib
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from kwinspect.analyze.record_rows import records_from_exchange
from kwinspect.capture.packets import PacketParser, TcpSegment
from kwinspect.capture.readers import CaptureFormatError, open_capture
from kwinspect.capture.tcp import StreamClosed, StreamData, StreamGap, StreamOpened, TcpReassembler
from kwinspect.dissect import DissectConfig, Dissector
from kwinspect.export import writers
from kwinspect.model import Endpoint, ErrorRow, Exchange
from kwinspect.protocol import decode_request, decode_response
from kwinspect.protocol.checksums import crc32, crc32c
from kwinspect.protocol.codecs import Limits
from kwinspect.protocol.decode import (
    INTERNAL_ERROR,
    decode_request_reference,
    decode_response_reference,
)
from kwinspect.protocol.peek import peek_request_header
from kwinspect.protocol.records import RecordSet, parse_record_set
from kwinspect.protocol.schema.index import APIS
from kwinspect.stream import labels
from kwinspect.stream.framing import FrameSplitter, RequestValidator, ResponseValidator

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PUBLIC = os.path.join(os.path.dirname(ROOT), "shared", "captures-public")
REGRESSIONS = os.path.join(ROOT, "tests", "fuzz_regressions")

TARGETS = ("decode", "records", "framing", "tcp", "pcap", "dissect", "core")


class FuzzFailure(Exception):
    """An invariant broke; ``case`` reproduces it."""

    def __init__(self, message: str, case: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.case = case


# ---------------------------------------------------------------------------
# Encoding cases (JSON-able, for reproducers)
# ---------------------------------------------------------------------------

def b64(data: bytes) -> str:
    return base64.b64encode(bytes(data)).decode("ascii")


def unb64(text: str) -> bytes:
    return base64.b64decode(text)


def _seg_to_json(s: TcpSegment) -> list:
    return [s.ts, s.src.ip, s.src.port, s.dst.ip, s.dst.port, s.seq, s.ack, s.flags,
            b64(s.payload), s.index, s.missing]


def _seg_from_json(x: list) -> TcpSegment:
    return TcpSegment(x[0], Endpoint(x[1], x[2]), Endpoint(x[3], x[4]), x[5], x[6], x[7],
                      unb64(x[8]), x[9], x[10])


# ---------------------------------------------------------------------------
# Seeds
# ---------------------------------------------------------------------------

def capture_paths() -> list[str]:
    paths = sorted(glob.glob(os.path.join(ROOT, "captures", "*.pcap")))
    paths += sorted(p for p in glob.glob(os.path.join(PUBLIC, "*"))
                    if p.endswith((".pcap", ".pcapng", ".gz")))
    return paths


class Corpus:
    """Everything the targets start from (built once per process)."""

    def __init__(self) -> None:
        self.files: list[bytes] = []  # whole capture files (small ones whole, big ones cut)
        self.segments: list[list[TcpSegment]] = []  # per capture file
        self.streams: list[tuple[bytes, bool]] = []  # (one direction's bytes, is_request)
        self.requests: list[bytes] = []
        self.responses: list[tuple[bytes, int, int]] = []  # (frame, api_key, api_version)
        self.record_sets: list[bytes] = []
        self.sasl_files: list[bytes] = []


def _split_frames(data: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos + 4 <= len(data):
        n = int.from_bytes(data[pos:pos + 4], "big", signed=True)
        if n < 0 or pos + 4 + n > len(data):
            break
        out.append(data[pos + 4:pos + 4 + n])
        pos += 4 + n
    return out


def _walk_record_sets(obj: Any, out: list[bytes]) -> None:
    if isinstance(obj, RecordSet):
        if obj.batches:
            out.append(bytes(obj.batches[0].buffer))
    elif isinstance(obj, dict):
        for v in obj.values():
            _walk_record_sets(v, out)
    elif isinstance(obj, list):
        for v in obj:
            _walk_record_sets(v, out)


def _read_file(path: str, corpus: Corpus) -> None:
    with open(path, "rb") as f:
        raw = f.read()
    corpus.files.append(raw if len(raw) <= 64 * 1024 else raw[:64 * 1024])
    try:
        src = open_capture(io.BytesIO(raw))
    except CaptureFormatError:
        return
    parser = PacketParser()
    segs = [s for s in (parser.parse(p) for p in src) if s is not None]
    src.close()
    corpus.segments.append(segs[:400])
    tcp = TcpReassembler()
    dirs: dict[tuple, bytearray] = defaultdict(bytearray)
    order: list[tuple] = []
    for s in segs:
        for ev in tcp.feed(s):
            if isinstance(ev, StreamData):
                key = (ev.conn_id, ev.src)
                if key not in dirs:
                    order.append(key)
                dirs[key] += ev.data
    for ev in tcp.finish():
        if isinstance(ev, StreamData):
            key = (ev.conn_id, ev.src)
            if key not in dirs:
                order.append(key)
            dirs[key] += ev.data
    by_conn: dict[Any, dict[bool, list[bytes]]] = defaultdict(dict)
    for key in order:
        data = bytes(dirs[key])
        frames = _split_frames(data)
        if not frames:
            continue
        reqs = [f for f in frames if (h := peek_request_header(f, 0)) is not None and h.api_key in APIS]
        is_req = len(reqs) * 2 > len(frames)
        corpus.streams.append((data[:256 * 1024], is_req))
        by_conn[key[0]][is_req] = frames
    for sides in by_conn.values():
        reqs = sides.get(True, [])
        versions = {}
        for f in reqs:
            h = peek_request_header(f, 0)
            if h is not None:
                versions[h.correlation_id] = (h.api_key, h.api_version)
            corpus.requests.append(f)
        for f in sides.get(False, []):
            if len(f) >= 4:
                cid = int.from_bytes(f[:4], "big", signed=True)
                if cid in versions:
                    corpus.responses.append((f, *versions[cid]))


def _v2_batch(records_payload: bytes, count: int, codec: int = 0, base_offset: int = 0) -> bytes:
    """A magic-2 batch around an (already encoded, maybe compressed) records section."""
    after_crc = struct.pack(">hiqqqhii", codec, count - 1, 0, 0, -1, -1, -1, count) + records_payload
    crc = crc32c(after_crc)
    body = struct.pack(">ib", 0, 2) + struct.pack(">I", crc) + after_crc
    return struct.pack(">qi", base_offset, len(body)) + body


def _legacy_msg(value: bytes | None, codec: int = 0, magic: int = 1, offset: int = 0) -> bytes:
    ts = struct.pack(">q", 0) if magic == 1 else b""
    v = struct.pack(">i", -1) if value is None else struct.pack(">i", len(value)) + value
    after = struct.pack(">bb", magic, codec) + ts + struct.pack(">i", -1) + v
    msg = struct.pack(">I", crc32(after)) + after
    return struct.pack(">qi", offset, len(msg)) + msg


def hostile_record_sets() -> list[bytes]:
    """Crafted record sets: compression bombs, deep legacy nesting, absurd counts."""
    out = []
    zeros = bytes(8 << 20)
    # gzip bomb: 8 MiB of zeros in a few KiB, declared as one huge record
    out.append(_v2_batch(gzip.compress(zeros, 9), 1, codec=1))
    out.append(_v2_batch(zlib.compress(zeros, 9), 1, codec=1))  # wrong container for gzip
    try:
        import zstandard
        out.append(_v2_batch(zstandard.ZstdCompressor().compress(bytes(32 << 20)), 1, codec=4))
    except ImportError:  # pragma: no cover
        pass
    try:
        import lz4.frame
        out.append(_v2_batch(lz4.frame.compress(zeros), 1, codec=3))
    except ImportError:  # pragma: no cover
        pass
    # a record count of 2**31-1 over a handful of bytes
    out.append(_v2_batch(b"\x10\x00\x00\x00\x02\x01\x02\x00", 0x7FFFFFFF))
    # legacy wrappers nested 40 deep, each gzip'd
    inner = _legacy_msg(b"v")
    for _ in range(40):
        inner = _legacy_msg(gzip.compress(inner), codec=1)
    out.append(inner)
    return out


def hostile_frames() -> list[bytes]:
    """Crafted requests: giant array counts and string lengths over a few bytes."""
    out = []
    # Metadata v1 request: topics array claims 2**31-1 elements in 2 bytes
    out.append(struct.pack(">hhih", 3, 1, 1, 1) + b"c" + struct.pack(">i", 0x7FFFFFFF) + b"\x00\x01")
    # Metadata v12 (flexible): compact array of 2**31-ish via varint
    out.append(struct.pack(">hhih", 3, 12, 2, 1) + b"c\x00" + b"\xff\xff\xff\xff\x07" + b"\x00" * 5)
    # Produce v3: string length 32767 with 3 bytes present
    out.append(struct.pack(">hhih", 0, 3, 3, 1) + b"c" + struct.pack(">h", 32767) + b"abc")
    # Produce v9 (flexible): records compact-bytes length 2**31
    out.append(struct.pack(">hhih", 0, 9, 4, 1) + b"c\x00\x00" + struct.pack(">hi", 1, 30000)
               + b"\x02\x02t\x02" + b"\x00\x00\x00\x00" + b"\xff\xff\xff\xff\x0f" + b"\x00")
    # tagged-field count of 2**31 in a flexible header
    out.append(struct.pack(">hhih", 18, 3, 5, 1) + b"c" + b"\xff\xff\xff\xff\x07")
    return out


@functools.lru_cache(maxsize=1)
def load_corpus() -> Corpus:
    c = Corpus()
    for path in capture_paths():
        _read_file(path, c)
    c.record_sets.extend(hostile_record_sets())
    c.requests.extend(hostile_frames())
    for f in list(c.requests):
        _walk_record_sets(decode_request(f).body, c.record_sets)
    for f, k, v in c.responses:
        _walk_record_sets(decode_response(f, k, v).body, c.record_sets)
    return c


# ---------------------------------------------------------------------------
# Mutators
# ---------------------------------------------------------------------------

_INTERESTING32 = (0, 1, 4, 5, 0x7F, 0x80, 0xFF, 0x7FFF, 0x8000, 0xFFFF, 0x7FFFFFFF,
                  0x80000000, 0xFFFFFFFF, 0x10000, 0x100000)


def mutate(rng: random.Random, data: bytes, pool: list[bytes] | None = None, rounds: int = 0) -> bytes:
    """Apply 1-4 random mutations (bit flips, byte sets, insert/delete, length-field
    corruption, varint corruption, truncation, splicing from ``pool``)."""
    b = bytearray(data)
    for _ in range(rounds or rng.choice((1, 1, 1, 2, 2, 3, 4))):
        op = rng.randrange(12)
        n = len(b)
        if op == 0 and n:  # bit flip
            i = rng.randrange(n)
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1 and n:  # interesting byte
            b[rng.randrange(n)] = rng.choice((0, 1, 0x7F, 0x80, 0xFF, 0xFE))
        elif op == 2:  # insert random bytes
            i = rng.randrange(n + 1)
            b[i:i] = rng.randbytes(rng.choice((1, 2, 4, rng.randrange(1, 64))))
        elif op == 3 and n:  # delete a range
            i = rng.randrange(n)
            del b[i:i + rng.choice((1, 2, 4, rng.randrange(1, 64)))]
        elif op == 4 and n >= 4:  # int32 length-field corruption
            i = rng.randrange(n - 3)
            v = rng.choice(_INTERESTING32 + (n - i, n - i - 4, n - i + 1, rng.randrange(1 << 32)))
            b[i:i + 4] = struct.pack(">I", v & 0xFFFFFFFF)
        elif op == 5 and n >= 2:  # int16 length corruption
            i = rng.randrange(n - 1)
            b[i:i + 2] = struct.pack(">H", rng.choice((0, 0x7FFF, 0x8000, 0xFFFF, 1, n - i)) & 0xFFFF)
        elif op == 6 and n:  # varint corruption (compact lengths, tag counts)
            i = rng.randrange(n)
            b[i:i + 1] = rng.choice((b"\xff\xff\xff\xff\x0f", b"\xff\xff\xff\xff\x07", b"\x80" * 10,
                                     b"\x00", b"\x01", b"\xfe\xff\xff\xff\x0f"))
        elif op == 7 and n:  # truncate
            del b[rng.randrange(n):]
        elif op == 8 and pool:  # splice a piece of another input
            other = rng.choice(pool)
            if other:
                i = rng.randrange(len(other))
                piece = other[i:i + rng.randrange(1, 256)]
                j = rng.randrange(n + 1)
                if rng.random() < 0.5:
                    b[j:j + len(piece)] = piece
                else:
                    b[j:j] = piece
        elif op == 9 and n:  # duplicate a range
            i = rng.randrange(n)
            chunk = b[i:i + rng.randrange(1, 128)]
            j = rng.randrange(n + 1)
            b[j:j] = chunk
        elif op == 10 and n:  # random run
            i = rng.randrange(n)
            k = rng.randrange(1, 16)
            b[i:i + k] = rng.randbytes(k)
        elif op == 11 and n:  # zero run
            i = rng.randrange(n)
            k = rng.randrange(1, 64)
            b[i:i + k] = bytes(min(k, n - i))
    return bytes(b)


# ---------------------------------------------------------------------------
# Targets: generate a case, check a case
# ---------------------------------------------------------------------------

def _all_versions() -> list[tuple[int, int]]:
    out = []
    for key, info in APIS.items():
        lo, hi = _version_range(info)
        out.extend((key, v) for v in range(lo, hi + 1))
    return out


def _version_range(info: Any) -> tuple[int, int]:
    if isinstance(info, dict):
        lo = info.get("min_version", info.get("min", 0))
        hi = info.get("max_version", info.get("max", 0))
        return int(lo), int(hi)
    if isinstance(info, tuple | list) and len(info) >= 3:
        return int(info[1]), int(info[2])
    lo = getattr(info, "min_version", 0)
    hi = getattr(info, "max_version", 0)
    return int(lo), int(hi)


@functools.lru_cache(maxsize=1)
def api_versions() -> tuple[tuple[int, int], ...]:
    return tuple(_all_versions())


def _check_message(msg, what: str) -> None:
    for issue in msg.issues:
        if issue.kind == INTERNAL_ERROR:
            raise FuzzFailure(f"{what}: internal_error: {issue.message}")
    _exercise(msg.body)


def _exercise(obj: Any, depth: int = 0) -> None:
    """Touch what the outputs touch: record sets are decoded fully (records, decompression)."""
    if isinstance(obj, RecordSet):
        obj.to_json("auto", records=True)
        _ = obj.record_count
    elif isinstance(obj, dict):
        for v in obj.values():
            _exercise(v, depth + 1)
    elif isinstance(obj, list):
        for v in obj:
            _exercise(v, depth + 1)


def gen_decode(rng: random.Random, c: Corpus) -> dict:
    pool = c.requests + [r[0] for r in c.responses]
    if rng.random() < 0.5 and c.requests:
        frame = rng.choice(c.requests)
        if rng.random() < 0.15:  # header of one API, body of another
            other = rng.choice(c.requests)
            frame = frame[:rng.randrange(8, 24)] + other[rng.randrange(0, max(1, len(other))):]
        elif rng.random() < 0.2 and len(frame) >= 4:  # every api/version: rewrite the header's key/version
            key, ver = rng.choice(api_versions())
            frame = struct.pack(">hh", key, ver) + frame[4:]
        return {"target": "decode", "kind": "request", "data": b64(mutate(rng, frame, pool))}
    frame, key, ver = rng.choice(c.responses) if c.responses else (b"", 18, 0)
    if rng.random() < 0.25:  # decode with another api/version (frames of other APIs)
        key, ver = rng.choice(api_versions())
    data = mutate(rng, frame, pool) if rng.random() < 0.9 else frame
    return {"target": "decode", "kind": "response", "api_key": key, "api_version": ver,
            "data": b64(data)}


def check_decode(case: dict) -> None:
    data = unb64(case["data"])
    if case["kind"] == "request":
        msg, ref = decode_request(data), decode_request_reference(data)
    else:
        args = (data, case["api_key"], case["api_version"])
        msg, ref = decode_response(*args), decode_response_reference(*args)
    # the fast path (compiled, or generated Python) gives what the reference gives
    if _canon_message(msg) != _canon_message(ref):
        raise FuzzFailure(f"decode_{case['kind']} differs from the reference decoder")
    _check_message(msg, f"decode_{case['kind']}")
    _check_labels(msg, f"decode_{case['kind']}")
    _check_scan(case, data)


def _check_scan(case: dict, data: bytes) -> None:
    """The compiled scan of the same frame (protocol/_cdecode.c scan_message): taken only
    when the reference decodes it cleanly, to the body its DeferredMessage decodes, with
    the notes the label walks give (tests/protocol/test_scan.py's check)."""
    from tests.protocol.test_scan import check_scan

    try:
        if case["kind"] == "request":
            check_scan(True, 0, 0, data)  # (a request's scanner is its own header's)
        else:
            check_scan(False, case["api_key"], case["api_version"], data)
    except AssertionError as exc:
        raise FuzzFailure(f"scan_{case['kind']} differs from the reference: {exc}") from None


def _check_labels(msg, what: str) -> None:
    """The compiled labels (stream/_clabels.c) of the body give what the Python walks give."""
    from helpers.cores import python_labels

    body = msg.body
    if not body or labels.compiled_errors is None:
        return
    names = {"AAAAAAAAAAAAAAAAAAAAAQ": "named"}
    clean = not msg.issues
    results = []
    for core in ("compiled", "python"):
        with python_labels() if core == "python" else contextlib.nullcontext():
            results.append((labels.response_errors(msg.api_key, body, clean, names),
                            labels.message_topics(msg.api_key, body, msg.is_request, clean, names),
                            labels.topics_of(body, names),
                            [(t, p, id(rs)) for t, p, rs in labels.iter_record_sets(msg.api_key, body, names)]))
    if results[0] != results[1]:
        raise FuzzFailure(f"{what}: the compiled labels differ from the Python walks")


def _canon_message(msg) -> tuple:
    return (msg.is_request, msg.api_key, msg.api_version, _canon(msg.header), _canon(msg.body),
            [i.as_dict() for i in msg.issues], msg.raw_body, msg.size, msg.decoded_version)


def _canon(x: Any) -> Any:
    """Values with their types and dict order; a record set by its batch headers and issues."""
    if isinstance(x, dict):
        return ("dict", [(k, _canon(v)) for k, v in x.items()])
    if isinstance(x, list):
        return ("list", [_canon(v) for v in x])
    if isinstance(x, RecordSet):
        return ("RecordSet", x.size, x.partial_tail_bytes, x.raw, [i.as_dict() for i in x.issues],
                [(b.position, b.size, b.base_offset, b.magic, b.crc, b.crc_ok, b.attributes, b.compression,
                  b.is_control, b.is_transactional, b.timestamp_type, b.last_offset_delta, b.base_timestamp,
                  b.max_timestamp, b.producer_id, b.producer_epoch, b.base_sequence, b.record_count,
                  b.body_start, b.end, b.batch_index) for b in x.batches])
    if isinstance(x, float):
        return ("float", struct.pack(">d", x))
    return (type(x).__name__, x)


_SMALL_LIMITS = Limits(max_decompressed_bytes=2 << 20, min_cap=64 << 10, max_ratio=64,
                       max_legacy_depth=2, max_records_per_batch=10_000)


def gen_records(rng: random.Random, c: Corpus) -> dict:
    data = rng.choice(c.record_sets) if c.record_sets else b""
    if rng.random() < 0.9:
        data = mutate(rng, data, c.record_sets)
    return {"target": "records", "data": b64(data), "small_limits": rng.random() < 0.5,
            "allow_partial": rng.random() < 0.5}


def check_records(case: dict) -> None:
    data = unb64(case["data"])
    rs = parse_record_set(data, _SMALL_LIMITS if case.get("small_limits") else None,
                          allow_partial=case.get("allow_partial", True))
    rs.to_json("auto", records=True)
    for rec in rs.iter_records():
        rec.to_json("hex")
    _ = rs.record_count
    if rs.size != len(data):
        raise FuzzFailure(f"record set size {rs.size} != {len(data)}")


def _chunks(rng: random.Random, n: int) -> list[int]:
    style = rng.randrange(4)
    if style == 0:
        return [n]
    if style == 1:
        return [1] * min(n, 4096) + ([n - 4096] if n > 4096 else [])
    out, left = [], n
    while left > 0:
        k = min(left, rng.choice((1, 3, 7, 64, 1460, 4096, 65536)))
        out.append(k)
        left -= k
    return out


def gen_framing(rng: random.Random, c: Corpus) -> dict:
    data, is_req = rng.choice(c.streams) if c.streams else (b"", True)
    if len(data) > 32768:
        start = rng.randrange(len(data) - 16384)
        data = data[start:start + rng.randrange(1024, 32768)] if rng.random() < 0.5 else data[:32768]
    if rng.random() < 0.2 and len(c.streams) > 1:  # splice frames from another stream
        other = rng.choice(c.streams)[0]
        i = rng.randrange(len(data) + 1)
        data = data[:i] + other[:rng.randrange(0, min(len(other), 8192) + 1)] + data[i:]
    data = mutate(rng, data, [s[0][:4096] for s in c.streams[:16]], rounds=rng.randrange(1, 8))
    plan: list[list] = []
    for k in _chunks(rng, len(data)):
        plan.append(["d", k])
        if rng.random() < 0.02:
            plan.append(["g", rng.choice((1, 4, 100, 5000, 1 << 20))])
    return {"target": "framing", "data": b64(data), "is_request": is_req, "plan": plan,
            "synced": rng.random() < 0.7, "max_frame_size": rng.choice((100 << 20, 1 << 16, 300)),
            "hunt_bytes": rng.choice((None, 4096, 64 << 20))}


def check_framing(case: dict) -> None:
    data = unb64(case["data"])
    validator = RequestValidator(known_kafka=True) if case["is_request"] else ResponseValidator()
    kw = {}
    if case.get("hunt_bytes"):
        kw["max_hunt_bytes"] = case["hunt_bytes"]
    sp = FrameSplitter(validator, max_frame_size=case["max_frame_size"], synced=case["synced"], **kw)
    pos = 0
    ts = 0.0
    frame_bytes = 0
    for op, k in case["plan"]:
        ts += 0.001
        if op == "d":
            sp.feed(data[pos:pos + k], ts)
            pos += k
        else:
            sp.gap(k, ts)
        for ev in sp.events():
            if hasattr(ev, "data"):
                frame_bytes += len(ev.data) + 4
        err = sp.accounting_error()
        if err:
            raise FuzzFailure(f"framing accounting: {err}")
    sp.finish()
    for ev in sp.events():
        if hasattr(ev, "data"):
            frame_bytes += len(ev.data) + 4
    err = sp.accounting_error()
    if err:
        raise FuzzFailure(f"framing accounting after finish: {err}")
    if frame_bytes != sp.frame_bytes:
        raise FuzzFailure(f"emitted frames {frame_bytes} != frame_bytes {sp.frame_bytes}")
    if sp.fed_bytes != len(data):
        raise FuzzFailure(f"fed {sp.fed_bytes} != {len(data)}")


def _mutate_segments(rng: random.Random, segs: list[TcpSegment], pool: list[bytes]) -> list[TcpSegment]:
    from helpers.pcapgen import mangle

    segs = mangle(segs, drop=rng.choice((0, 0.05, 0.2)), duplicate=rng.choice((0, 0.1)),
                  reorder=rng.choice((0, 0.1, 0.3)), truncate=rng.choice((0, 0.05)),
                  resegment=rng.choice((0, 0.1)), conflict=rng.choice((0, 0.05)),
                  seed=rng.randrange(1 << 30))
    out = list(segs)
    for _ in range(rng.randrange(0, 6)):
        if not out:
            break
        i = rng.randrange(len(out))
        s = out[i]
        op = rng.randrange(7)
        if op == 0:
            s = s._replace(seq=(s.seq + rng.choice((1, -1, 1 << 20, 1 << 31, rng.randrange(1 << 32)))) & 0xFFFFFFFF)
        elif op == 1:
            s = s._replace(ack=rng.randrange(1 << 32))
        elif op == 2:
            s = s._replace(flags=s.flags ^ (1 << rng.randrange(8)))
        elif op == 3:
            s = s._replace(payload=mutate(rng, s.payload, pool))
        elif op == 4:
            s = s._replace(ts=s.ts - rng.choice((1.0, 1000.0, 0.0001)))
        elif op == 5:
            s = s._replace(missing=rng.choice((0, 1, 1460, 1 << 16)))
        else:
            out.insert(rng.randrange(len(out) + 1), s)
        out[i] = s
    return out


def gen_tcp(rng: random.Random, c: Corpus) -> dict:
    segs = rng.choice([s for s in c.segments if s]) if any(c.segments) else []
    if len(segs) > 120:
        start = rng.randrange(len(segs) - 60)
        segs = segs[start:start + 120] if rng.random() < 0.5 else segs[:120]
    segs = _mutate_segments(rng, segs, c.requests[:32])
    return {"target": "tcp", "segments": [_seg_to_json(s) for s in segs],
            "small_caps": rng.random() < 0.5, "idle_every": rng.choice((0, 5, 50))}


def check_tcp(case: dict) -> None:
    segs = [_seg_from_json(x) for x in case["segments"]]
    kw = dict(max_ooo_bytes=2048, max_total_buffered=4096, max_connections=3,
              max_window=1 << 20) if case.get("small_caps") else {}
    r = TcpReassembler(**kw)
    offsets: dict[tuple, int] = {}

    def handle(events) -> None:
        for ev in events:
            if isinstance(ev, StreamData | StreamGap):
                key = (ev.conn_id, ev.src)
                n = len(ev.data) if isinstance(ev, StreamData) else ev.nbytes
                if n <= 0:
                    raise FuzzFailure(f"empty {type(ev).__name__}")
                expect = offsets.get(key)
                if expect is not None and ev.offset != expect:
                    raise FuzzFailure(f"{key}: offset {ev.offset} != expected {expect} (holes or overlap)")
                offsets[key] = ev.offset + n
            elif isinstance(ev, StreamClosed):
                for st in ev.stats:
                    if not st.balanced():
                        raise FuzzFailure(f"unbalanced direction {st}")
            elif isinstance(ev, StreamOpened):
                pass

    every = case.get("idle_every") or 0
    for i, s in enumerate(segs):
        handle(r.feed(s))
        if every and i % every == 0:
            handle(r.flush_idle(s.ts + (700 if i % (every * 2) == 0 else 0)))
    handle(r.finish())
    t = r.totals()
    if t.payload_bytes != t.delivered + t.duplicate_bytes + t.late_bytes + t.dropped_bytes + t.buffered:
        raise FuzzFailure(f"totals unbalanced: {t}")


def gen_pcap(rng: random.Random, c: Corpus) -> dict:
    data = rng.choice(c.files) if c.files else b""
    data = mutate(rng, data, c.files[:4], rounds=rng.randrange(1, 10))
    wrap = rng.random()
    if wrap < 0.1:
        data = gzip.compress(data, 1)
        if rng.random() < 0.5:
            data = data[:rng.randrange(len(data) + 1)]
    return {"target": "pcap", "data": b64(data)}


def check_pcap(case: dict) -> None:
    data = unb64(case["data"])
    try:
        src = open_capture(io.BytesIO(data))
    except CaptureFormatError:
        return
    parser = PacketParser(max_frag_datagrams=8, max_frag_bytes=1 << 16)
    n = 0
    with src:
        for raw in src:
            n += 1
            parser.parse(raw)
            if n > 1_000_000:
                raise FuzzFailure("more than a million packets from a small file")
    parser.finish()
    if not parser.stats.check():
        raise FuzzFailure(f"parser counts do not add up: {parser.stats}")
    if parser.stats.packets != n:
        raise FuzzFailure(f"parser saw {parser.stats.packets} of {n} packets")


def gen_core(rng: random.Random, c: Corpus) -> dict:
    # a third of the cases are mangled TCP conversations (reordered, lost, duplicated,
    # conflicting segments, forged flags and sequence numbers): the compiled per-segment
    # driver hands them back and forth with the Python path
    r = rng.random()
    case = gen_pcap(rng, c) if r < 0.35 else gen_dissect(rng, c, segments=r < 0.7)
    return {**case, "target": "core"}


def _core_run(data: bytes, config: DissectConfig) -> Any:
    """What the readers, the parser and the Dissector make of a file, for comparison."""
    try:
        src = open_capture(io.BytesIO(data))
    except CaptureFormatError as exc:
        return str(exc)
    parser = PacketParser(max_frag_datagrams=8, max_frag_bytes=1 << 16)
    with src:
        packets = list(src)
    segs = [parser.parse(raw) for raw in packets]
    parser.finish()
    d = Dissector(config)
    rows = []
    for raw in packets:
        d.feed_packet(raw)
        rows += _rendered(d.drain(), d)
    d.finish()
    rows += _rendered(d.drain(), d)
    # the connections' books: what the per-segment path (kwinspect/_cdriver.c) counts
    books = [(info.stream, info.kind, info.bytes, info.gap_bytes, info.packets, info.accounting, info.closed,
              info.last_ts) for info in d.connections.values()]
    return ([tuple(p) for p in packets], repr(src.stats), [(i.kind, i.message, i.offset) for i in src.issues],
            [None if s is None else tuple(s) for s in segs], repr(parser.stats),
            [(i.kind, i.message) for i in parser.issues], rows, d.packet_counts(), d.byte_counts(), books,
            _loop_run(data, config))


def _loop_run(data: bytes, config: DissectConfig) -> Any:
    """The same file through PacketLoop, as the CLI reads it: with the compiled core, the
    records of the reader's buffer go through the compiled packet loop (Dissector.feed_chunk);
    the reader is fed 1-4096 bytes per read, so its buffer ends inside records too."""
    from kwinspect.run.loop import PacketLoop

    class Trickle(io.RawIOBase):
        def __init__(self) -> None:
            self.pos = 0

        def readable(self) -> bool:
            return True

        def readinto(self, b) -> int:
            n = min(len(b), 1 + (self.pos * 2654435761) % 4096, len(data) - self.pos)
            b[:n] = data[self.pos:self.pos + n]
            self.pos += n
            return n

    try:
        src = open_capture(Trickle())
    except CaptureFormatError as exc:
        return str(exc)
    d = Dissector(config)
    src.on_secrets = d.add_tls_secrets
    ticks = []
    loop = PacketLoop(d, tick=lambda n: ticks.append((n, d.stats.packets, repr(d.parser.stats))), eager=True)
    with src:
        rows = _rendered(list(loop.run(src)), d)
    return rows, ticks, loop.count, repr(src.stats), [(i.kind, i.message) for i in src.issues], d.packet_counts()


def _rendered(events, d: Dissector) -> list:
    """Each event's row, with its jsonl line and its records' lines (the row renderers of
    both cores are compared too)."""
    out = []
    for e in events:
        table = "exchanges" if isinstance(e, Exchange) else "errors" if isinstance(e, ErrorRow) else None
        line = writers.open_writer("jsonl", table, io.StringIO()).line(e) if table else None
        records = [writers.open_writer("jsonl", "records", io.StringIO()).line(r)
                   for r in records_from_exchange(e, values="auto", topic_names=d.shared.topic_names)
                   ] if table == "exchanges" else []
        out.append((e.row(), line, records))
    return out


def check_core(case: dict) -> None:
    from helpers.cores import python_core

    data = unb64(case["data"])
    config = _config(case.get("config", {}))
    compiled = _core_run(data, config)
    with python_core():
        python = _core_run(data, config)
    if compiled != python:
        where = "the reader" if type(compiled) is not tuple or type(python) is not tuple else next(
            name for name, a, b in zip(("packets", "reader stats", "reader issues", "segments", "parser stats",
                                        "parser issues", "rows", "packet counts", "byte counts",
                                        "connection books", "PacketLoop"),
                                       compiled, python, strict=True) if a != b)
        raise FuzzFailure(f"compiled and Python cores differ: {where}")


def gen_dissect(rng: random.Random, c: Corpus, segments: bool | None = None) -> dict:
    cfg = {"ports": rng.choice(([9092], [], None)), "max_frame_size": rng.choice((None, 4096)),
           "redact": rng.random() < 0.8}
    if segments is None:
        segments = rng.random() < 0.5
    if segments and any(c.segments):
        from helpers.pcapgen import LINKTYPES, write_pcap

        segs = rng.choice([s for s in c.segments if s])
        if len(segs) > 150:
            segs = segs[:150]
        segs = _mutate_segments(rng, segs, c.requests[:32])
        # IPv4's total length is 16 bits: keep payload + snaplen-cut bytes below it
        segs = [s._replace(payload=s.payload[:60000], missing=max(0, min(s.missing, 60000 - len(s.payload))))
                for s in segs]
        lt = rng.choice(list(LINKTYPES.values())) if rng.random() < 0.3 else 1
        if lt == 229 or (lt == 228 and any(":" in s.src.ip for s in segs)):
            lt = 1
        buf = io.BytesIO()
        kw = {}
        if rng.random() < 0.05 and lt in (1, 101):
            kw["fragment_size"] = rng.choice((8, 64, 512))
        try:
            write_pcap(buf, segs, linktype=lt, **kw)
        except (TypeError, ValueError, OSError, struct.error):
            write_pcap(buf, segs, linktype=1)
        data = buf.getvalue()
        if rng.random() < 0.3:
            data = mutate(rng, data, c.files[:4])
    else:
        data = mutate(rng, rng.choice(c.files) if c.files else b"", c.files[:4],
                      rounds=rng.randrange(1, 6))
    return {"target": "dissect", "data": b64(data), "config": cfg}


def _config(cfg: dict) -> DissectConfig:
    kw: dict[str, Any] = {"redact": cfg.get("redact", True)}
    if cfg.get("ports") is not None:
        kw["kafka_ports"] = frozenset(cfg["ports"])
    if cfg.get("max_frame_size"):
        kw["max_frame_size"] = cfg["max_frame_size"]
    return DissectConfig(**kw)


def run_dissector(data: bytes, config: DissectConfig, *, outputs: bool = True) -> Dissector | None:
    """Dissect capture bytes the way the CLI does and touch every output row."""
    from kwinspect.analyze.record_rows import records_from_exchange
    from kwinspect.analyze.render import exchange_json

    try:
        src = open_capture(io.BytesIO(data))
    except CaptureFormatError:
        return None
    d = Dissector(config)
    events: list = []
    with src:
        for raw in src:
            d.feed_packet(raw)
            events.extend(d.drain())
    d.finish()
    events.extend(d.drain())
    if outputs:
        for ev in events:
            if isinstance(ev, Exchange):
                ev.row()
                json.dumps(exchange_json(ev, "auto"), default=str)
                for rec in records_from_exchange(ev, values="auto", topic_names=d.shared.topic_names):
                    rec.row()
                for m in (ev.request, ev.response):
                    if m is not None:
                        for issue in m.issues:
                            if issue.kind == INTERNAL_ERROR:
                                raise FuzzFailure(f"internal_error in dissect: {issue.message}")
            elif isinstance(ev, ErrorRow):
                if ev.kind == INTERNAL_ERROR:
                    raise FuzzFailure(f"internal_error row: {ev.message}")
                ev.row()
    return d


def dissect_accounting_error(d: Dissector) -> str | None:
    err = d.packet_accounting_error()
    if err:
        return err
    fed = 0
    for info in d.connections.values():
        for direction, a in info.accounting.items():
            held = a["frame_bytes"] + a["skipped_bytes"] + a["tail_bytes"] + a["buffered_bytes"]
            if held != a["fed_bytes"] or a["buffered_bytes"]:
                return f"{info.stream} {direction}: framing accounting {a}"
            fed += a["fed_bytes"]
    pruned = len(d.connections) < d.stats.connections  # keep_closed_connections dropped some
    if not pruned and fed != d.stats.kafka_bytes:
        return f"framed bytes {fed} != kafka bytes {d.stats.kafka_bytes}"
    delivered = d.tcp.totals().delivered
    if d.stats.kafka_bytes + d.stats.non_kafka_bytes != delivered:
        return (f"kafka {d.stats.kafka_bytes} + non-kafka {d.stats.non_kafka_bytes} bytes != "
                f"{delivered} delivered by TCP")
    return None


def check_dissect(case: dict) -> None:
    d = run_dissector(unb64(case["data"]), _config(case.get("config", {})))
    if d is None:
        return
    err = dissect_accounting_error(d)
    if err:
        raise FuzzFailure(f"dissect accounting: {err}")


GENERATORS: dict[str, Callable[[random.Random, Corpus], dict]] = {
    "decode": gen_decode, "records": gen_records, "framing": gen_framing,
    "tcp": gen_tcp, "pcap": gen_pcap, "dissect": gen_dissect, "core": gen_core,
}
CHECKS: dict[str, Callable[[dict], None]] = {
    "decode": check_decode, "records": check_records, "framing": check_framing,
    "tcp": check_tcp, "pcap": check_pcap, "dissect": check_dissect, "core": check_core,
}


def check(case: dict) -> None:
    """Run one case; raise FuzzFailure (with the case attached) on any broken invariant."""
    try:
        CHECKS[case["target"]](case)
    except FuzzFailure as exc:
        exc.case = case
        raise
    except RecursionError as exc:
        raise FuzzFailure(f"RecursionError: {exc}", case) from exc
    except MemoryError as exc:
        raise FuzzFailure("MemoryError", case) from exc
    except Exception as exc:  # noqa: BLE001 - any escaping exception is the finding
        raise FuzzFailure(f"{type(exc).__name__}: {exc}", case) from exc


def save_regression(case: dict, message: str, directory: str = REGRESSIONS) -> str:
    """Write a reproducer: tests/fuzz_regressions/<target>-<hash>.json."""
    import hashlib

    os.makedirs(directory, exist_ok=True)
    blob = json.dumps(case, sort_keys=True).encode()
    name = f"{case['target']}-{hashlib.sha256(blob).hexdigest()[:12]}.json"
    path = os.path.join(directory, name)
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"message": message[:500], "case": case}, f, indent=1, sort_keys=True)
        f.write("\n")
    return path


def load_regressions(directory: str = REGRESSIONS) -> list[tuple[str, dict]]:
    out = []
    for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
        with open(path, encoding="utf-8") as f:
            out.append((os.path.basename(path), json.load(f)["case"]))
    return out
