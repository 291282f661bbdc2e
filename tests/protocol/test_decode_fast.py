"""The generated fast decoders (protocol/fastdecode.py) give exactly what the
reference closure decoder gives, for every input, and are really used.

``decode_request`` / ``decode_response`` / ``decode_struct`` try the generated
code first and fall back to ``*_reference`` on anything unusual.  Here both are
run on the same bytes and compared value by value *and type by type* (True is
not 1, dict key order counts, record sets are compared by their contents and
issues): on every frame kwinspect decodes from the shipped and the public
captures, on frames built from the schema tables for every (api key, version,
direction) with random values, and on truncated, bit-flipped and extended
variants of both.  Separate checks make sure the fast path is taken for clean
frames, so the comparisons cannot pass by always falling back.
"""

from __future__ import annotations

import json
import random
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kwinspect.capture.keylog import KeyLog
from kwinspect.dissect import DissectConfig
from kwinspect.protocol import decode as D
from kwinspect.protocol import fastdecode, layout
from kwinspect.protocol.records import RecordBatch, RecordSet
from kwinspect.protocol.schema.index import APIS
from kwinspect.protocol.schema.structs import STRUCTS
from kwinspect.run.files import dissect_file
from kwinspect.stream import conversation
from rig.verify import keylog_of

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "captures"
PUBLIC = ROOT.parent / "shared" / "captures-public"

# ---------------------------------------------------------------------------
# Comparing messages exactly
# ---------------------------------------------------------------------------


def canon(x):
    """A comparable form that keeps types and dict order (1 != True, 0.0 != 0, NaN == NaN)."""
    if isinstance(x, dict):
        return ("dict", [(k, canon(v)) for k, v in x.items()])
    if isinstance(x, list):
        return ("list", [canon(v) for v in x])
    if isinstance(x, RecordSet):
        # every slot of every batch as parsed (the compiled core builds them in C), before
        # the records are decoded
        slots = [[(name, canon(getattr(b, name))) for name in RecordBatch.__slots__ if name not in ("buffer", "sink")]
                 + [b.buffer == x.raw, b.sink is x.issues] for b in x.batches]
        rendered = x.to_json(values="base64")  # decodes the records, which may add issues
        return ("RecordSet", x.size, x.partial_tail_bytes, x.limits, x.origin, x.allow_partial, x.raw, slots,
                canon(rendered), [i.as_dict() for i in x.issues])
    if isinstance(x, float):
        return ("float", struct.pack(">d", x))
    return (type(x).__name__, x)


def canon_msg(m):
    return (m.is_request, m.api_key, m.api_version, canon(m.header), canon(m.body),
            [i.as_dict() for i in m.issues], m.raw_body, m.size, m.decoded_version)


def fast_request(frame: bytes):
    """The generated decoder's own answer (None: it hands the frame to the reference)."""
    fn = D._fast_requests.get(frame[:4]) or D._or_false(D._new_fast_request_decoder, frame)
    try:
        return fn(frame) if fn else None
    except Exception:  # noqa: BLE001
        return None


def fast_response(frame: bytes, key: int, version: int):
    fn = D._fast_responses.get((key, version)) or D._or_false(D._new_fast_response_decoder, key, version)
    try:
        return fn(frame, key, version) if fn else None
    except Exception:  # noqa: BLE001
        return None


_generated: dict = {}


def generated(is_request: bool, key: int, version: int):
    """fastdecode's generated Python decoder, whichever decoder decode.py uses (with the
    compiled core built, decode.py runs the C interpreter of protocol/compiled.py)."""
    k = (is_request, key, version)
    if k not in _generated:
        fn = None
        if key in APIS:
            definition, use_version = D.body_schema(key, version, is_request)
            if definition is not None and use_version == version:
                hv = (D.request_header_version if is_request else D.response_header_version)(key, version)
                try:
                    fn = fastdecode.build(is_request, key, version, hv, definition)
                except Exception:  # noqa: BLE001
                    fn = None
        _generated[k] = fn
    return _generated[k]


def generated_answer(fn, *args):
    try:
        return fn(*args) if fn else None
    except Exception:  # noqa: BLE001
        return None


def same_fast_answers(frame: bytes, is_request: bool, key: int, version: int) -> None:
    """The decoder decode.py uses (compiled or generated) and the generated Python one take
    the same frames and build the same Messages (both cores, frame by frame). Both decode
    afresh: comparing decodes the records, which marks their batches reported."""
    fast = fast_request(frame) if is_request else fast_response(frame, key, version)
    args = (frame,) if is_request else (frame, key, version)
    py = generated_answer(generated(is_request, key, version), *args)
    assert (fast is None) == (py is None), (is_request, key, version, fast is None, frame.hex())
    if fast is not None:
        assert canon_msg(fast) == canon_msg(py), (is_request, key, version, frame.hex())


def check_request(frame: bytes) -> bool:
    """decode_request == the reference on `frame`; True when the fast path answered."""
    got = D.decode_request(frame)
    assert canon_msg(got) == canon_msg(D.decode_request_reference(frame)), frame.hex()
    fast = fast_request(frame)
    if fast is not None:
        assert canon_msg(fast) == canon_msg(D.decode_request_reference(frame)), frame.hex()
    if len(frame) >= 4:
        same_fast_answers(frame, True, *struct.unpack_from(">hh", frame))
    return fast is not None


def check_response(frame: bytes, key: int, version: int) -> bool:
    got = D.decode_response(frame, key, version)
    assert canon_msg(got) == canon_msg(D.decode_response_reference(frame, key, version)), (key, version, frame.hex())
    fast = fast_response(frame, key, version)
    if fast is not None:
        assert canon_msg(fast) == canon_msg(D.decode_response_reference(frame, key, version)), frame.hex()
    same_fast_answers(frame, False, key, version)
    return fast is not None


def mutations(frame: bytes, rnd: random.Random, n: int = 6):
    """Truncated, bit-flipped, byte-replaced and extended variants of a frame."""
    out = [frame[:-1], frame + b"\x00", frame + bytes([rnd.randrange(256)])]
    for _ in range(n):
        cut = rnd.randrange(len(frame) + 1)
        out.append(frame[:cut])
        if frame:
            i = rnd.randrange(len(frame))
            out.append(frame[:i] + bytes([frame[i] ^ (1 << rnd.randrange(8))]) + frame[i + 1:])
            out.append(frame[:i] + bytes([rnd.choice((0, 1, 0x7F, 0x80, 0xFF, rnd.randrange(256)))]) + frame[i + 1:])
    return out


# ---------------------------------------------------------------------------
# Frames built from the tables with random values
# ---------------------------------------------------------------------------


def uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_INT_FORMATS = {"int8": "b", "int16": "h", "uint16": "H", "int32": "i", "uint32": "I", "int64": "q"}


class Encoder:
    """Encodes random values for a schema (the same field rules as layout.compile_struct).

    `tagged` is the chance that a tagged field is sent (then the fast path must
    hand over to the reference); `unusual` the chance of a legal but rarely seen
    encoding: a multi-byte varint for a small length, a bool byte other than 0/1.
    """

    def __init__(self, rnd: random.Random, tagged: float = 0.0, unusual: float = 0.0):
        self.rnd, self.tagged, self.unusual = rnd, tagged, unusual

    def length(self, n: int, compact: bool, width: int) -> bytes:
        if not compact:
            return struct.pack(">h" if width == 2 else ">i", n)
        if self.rnd.random() < self.unusual and n < 0x80:
            return bytes([n | 0x80, 0])  # the same number as a two-byte varint
        return uvarint(n)

    def text(self) -> bytes:
        r = self.rnd.random()
        if r < 0.5:
            return "".join(self.rnd.choice("abc-_.09") for _ in range(self.rnd.randrange(12))).encode()
        if r < 0.85:
            return "".join(chr(self.rnd.choice((0x41, 0xE9, 0x3B1, 0x4E2D, 0x1F600))) for _ in range(5)).encode()
        return bytes(self.rnd.randrange(256) for _ in range(self.rnd.randrange(1, 6)))  # maybe not UTF-8

    def value(self, ftype, nullable, compact, children, version, flexible) -> bytes:
        rnd = self.rnd
        if ftype in _INT_FORMATS:
            bits = struct.calcsize(_INT_FORMATS[ftype]) * 8
            lo, hi = (0, 2 ** bits - 1) if ftype.startswith("u") else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
            v = rnd.choice((0, 1, -1, lo, hi, rnd.randint(lo, hi)))
            return struct.pack(">" + _INT_FORMATS[ftype], min(max(v, lo), hi))
        if ftype == "bool":
            return bytes([rnd.choice((0, 1, 2, 0xFF)) if rnd.random() < self.unusual else rnd.randrange(2)])
        if ftype == "float64":
            return struct.pack(">d", rnd.choice((0.0, -0.0, 1.5, 1e300, rnd.random())))
        if ftype == "uuid":
            return bytes(rnd.randrange(256) for _ in range(16))
        if ftype in ("string", "bytes", "records"):
            if nullable and rnd.random() < 0.2:
                return self.length(0, True, 0) if compact else (b"\xff\xff" if ftype == "string" else b"\xff\xff\xff\xff")
            raw = self.text() if ftype == "string" else bytes(rnd.randrange(256) for _ in range(rnd.randrange(30)))
            if ftype == "records" and rnd.random() < 0.5:
                raw = RECORD_BATCH
            width = 2 if ftype == "string" else 4
            return self.length(len(raw) + 1 if compact else len(raw), compact, width) + raw
        if ftype == "struct":
            return self.struct(children, version, flexible, nullable)
        if ftype.startswith("[]"):
            if nullable and rnd.random() < 0.15:
                return self.length(0, True, 0) if compact else b"\xff\xff\xff\xff"
            inner = ftype[2:]
            # long arrays of numbers take another path than short ones
            n = rnd.choice((0, 1, 1, 2, 3, 16, 17, 40) if inner in _INT_FORMATS else (0, 1, 1, 2, 3))
            items = b"".join(self.struct(children, version, flexible) if inner == "struct"
                             else self.value(inner, False, compact, None, version, flexible) for _ in range(n))
            return self.length(n + 1 if compact else n, compact, 4) + items
        raise AssertionError(ftype)

    def struct(self, fields, version, flexible, nullable=False) -> bytes:
        if nullable:
            if self.rnd.random() < 0.2:
                return b"\xff"
            out = b"\x01"
        else:
            out = b""
        tags = []
        for _name, ftype, versions, nullable_v, tag, tagged_v, flex_override, _default, children in fields:
            if not layout.in_range(versions or (0, 32767), version):
                continue
            compact = flexible and (flex_override is None or layout.in_range(flex_override, version))
            fnull = layout.in_range(nullable_v, version)
            value = self.value(ftype, fnull, compact, children, version, flexible)
            if flexible and tag is not None and layout.in_range(tagged_v, version):
                if self.rnd.random() < self.tagged:
                    tags.append((tag, value))
            else:
                out += value
        if flexible:
            if self.rnd.random() < self.tagged / 4:
                tags.append((10_000 + self.rnd.randrange(5), b"\x01\x02"))  # unknown to the tables
            out += uvarint(len(tags)) + b"".join(uvarint(t) + uvarint(len(v)) + v for t, v in sorted(tags))
        return out


def _record_batch() -> bytes:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                  producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for i in range(3):
        b.append(i, timestamp=1_700_000_000_000 + i, key=b"k", value=b"value", headers=[("h", b"x")])
    return bytes(b.build())


RECORD_BATCH = _record_batch()


def header_bytes(is_request: bool, key: int, version: int, enc: Encoder) -> bytes:
    if not is_request:
        hv = D.response_header_version(key, version)
        out = struct.pack(">i", enc.rnd.randrange(2 ** 31))
        return out + (enc.struct((), 1, True) if hv == 1 else b"")
    hv = D.request_header_version(key, version)
    out = struct.pack(">hhi", key, version, enc.rnd.randrange(2 ** 31))
    if hv >= 1:
        out += enc.value("string", True, False, None, 1, False)
    if hv == 2:
        out += enc.struct((), 2, True)
    return out


def body_bytes(is_request: bool, key: int, version: int, enc: Encoder) -> bytes:
    definition, use_version = D.body_schema(key, version, is_request)
    assert use_version == version
    return enc.struct(definition[3], version, layout.in_range(definition[2], version))


def cases():
    """Every (api key, version, direction) the tables supply."""
    out = []
    for key in sorted(APIS):
        mod = layout.api_module(key)
        for is_request, defs in ((True, mod.REQUEST), (False, mod.RESPONSE)):
            for definition in defs:
                for lo, hi in definition[1]:
                    out.extend((key, v, is_request) for v in range(lo, hi + 1))
    return sorted(set(out))


CASES = cases()


def check(is_request: bool, key: int, version: int, frame: bytes) -> bool:
    return check_request(frame) if is_request else check_response(frame, key, version)


def test_the_tables_supply_many_cases():
    assert len(CASES) > 500
    assert len({k for k, _v, _r in CASES}) == len(APIS)


@pytest.mark.parametrize("key", sorted(APIS))
def test_every_version_of_the_tables_with_random_bodies(key):
    rnd = random.Random(key)
    for case_key, version, is_request in CASES:
        if case_key != key:
            continue
        for i in range(6):
            enc = Encoder(rnd, tagged=0.0 if i < 3 else 0.5, unusual=0.0 if i < 3 else 0.3)
            frame = header_bytes(is_request, key, version, enc) + body_bytes(is_request, key, version, enc)
            ok = check(is_request, key, version, frame)
            clean = D.decode_request_reference(frame) if is_request else D.decode_response_reference(frame, key, version)
            if i < 3 and not clean.issues and not _api_versions_rejection(is_request, key, version, frame):
                assert ok, f"fast path not taken for a clean frame: {(key, version, is_request)} {frame.hex()}"
            for variant in mutations(frame, rnd, 3):
                check(is_request, key, version, variant)


def _api_versions_rejection(is_request, key, version, frame) -> bool:
    return not is_request and key == D.API_VERSIONS_KEY and version > 0 and frame[4:6] == b"\x00\x23"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.sampled_from(CASES), rnd=st.randoms(use_true_random=False),
       tagged=st.sampled_from((0.0, 0.3)), unusual=st.sampled_from((0.0, 0.3)), data=st.data())
def test_hypothesis_frames_and_mutations(case, rnd, tagged, unusual, data):
    key, version, is_request = case
    enc = Encoder(rnd, tagged, unusual)
    frame = header_bytes(is_request, key, version, enc) + body_bytes(is_request, key, version, enc)
    check(is_request, key, version, frame)
    cut = data.draw(st.integers(0, len(frame)))
    check(is_request, key, version, frame[:cut])
    i = data.draw(st.integers(0, max(len(frame) - 1, 0)))
    b = data.draw(st.integers(0, 255))
    check(is_request, key, version, frame[:i] + bytes([b]) + frame[i + 1:])
    check(is_request, key, version, frame + data.draw(st.binary(max_size=4)))


@settings(max_examples=200, deadline=None)
@given(frame=st.binary(max_size=64), key=st.sampled_from(sorted(APIS) + [-1, 200]),
       version=st.integers(-2, 40))
def test_hypothesis_arbitrary_bytes(frame, key, version):
    check_request(struct.pack(">hh", key, version) + frame)
    check_response(frame, key, version)


def test_the_fast_path_does_not_call_the_reference_for_clean_frames(monkeypatch):
    rnd = random.Random(7)
    frames = []
    for key, version, is_request in CASES[::7]:
        enc = Encoder(rnd)
        frame = header_bytes(is_request, key, version, enc) + body_bytes(is_request, key, version, enc)
        clean = D.decode_request_reference(frame) if is_request else D.decode_response_reference(frame, key, version)
        if not clean.issues and not _api_versions_rejection(is_request, key, version, frame):
            frames.append((is_request, key, version, frame))
    assert len(frames) > 50

    def boom(*_args):
        raise AssertionError("reference decoder called")

    monkeypatch.setattr(D, "decode_request_reference", boom)
    monkeypatch.setattr(D, "decode_response_reference", boom)
    for is_request, key, version, frame in frames:
        if is_request:
            D.decode_request(frame)
        else:
            D.decode_response(frame, key, version)


def test_garbage_versions_do_not_grow_the_fast_caches():
    D.decode_request(struct.pack(">hhih", 1, 13, 1, -1) + b"\x00" * 40)
    before = len(D._fast_requests), len(D._fast_responses), len(D._fast_structs)
    for version in range(200, 1200):
        D.decode_request(struct.pack(">hhih", 1, version, 1, -1) + b"\x00" * 40)
        D.decode_response(b"\x00" * 24, 3, version)
        D.decode_struct("TransactionLogValue", version, b"")
    assert (len(D._fast_requests), len(D._fast_responses), len(D._fast_structs)) == before


def test_non_bytes_frames_use_the_reference_and_agree():
    rnd = random.Random(3)
    enc = Encoder(rnd)
    frame = header_bytes(True, 0, 9, enc) + body_bytes(True, 0, 9, enc)
    for buf in (bytearray(frame), memoryview(frame)):
        assert canon_msg(D.decode_request(buf)) == canon_msg(D.decode_request(frame))


# ---------------------------------------------------------------------------
# Named structs (decode_struct)
# ---------------------------------------------------------------------------


def test_named_structs_match_the_reference():
    rnd = random.Random(11)
    taken = 0
    for name, defs in sorted(STRUCTS.items()):
        for definition in defs:
            for lo, hi in definition[1]:
                for version in range(lo, min(hi, lo + 20) + 1):
                    flexible = layout.in_range(definition[2], version)
                    py = fastdecode.build_struct(definition[3], version, flexible)
                    for i in range(4):
                        enc = Encoder(rnd, tagged=0.0 if i < 2 else 0.5, unusual=0.0 if i < 2 else 0.3)
                        data = enc.struct(definition[3], version, flexible)
                        for variant in [data, *mutations(data, rnd, 2)]:
                            got = D.decode_struct(name, version, variant)
                            want = D.decode_struct_reference(name, version, variant)
                            assert (canon(got[0]), [x.as_dict() for x in got[1]]) == \
                                   (canon(want[0]), [x.as_dict() for x in want[1]]), (name, version, variant.hex())
                            # the decoder decode_struct uses (compiled or generated) == the generated one
                            fast = D._fast_structs.get((name, version))
                            assert canon(generated_answer(fast, variant)) == canon(generated_answer(py, variant)), \
                                (name, version, variant.hex())
                        if i < 2 and not D.decode_struct_reference(name, version, data)[1]:
                            fast = D._fast_structs.get((name, version)) or D._or_false(D._new_fast_struct_decoder, name, version)
                            assert fast and fast(data) is not None, (name, version)
                            taken += 1
    assert taken > 50


# ---------------------------------------------------------------------------
# Real captures: every frame kwinspect decodes, and mutations of them
# ---------------------------------------------------------------------------


def _captures():
    out = []
    for path in sorted(SHIPPED.glob("*.pcap*")):
        manifest = path.with_name(path.name.split(".")[0] + ".manifest.json")
        ports = json.loads(manifest.read_text()).get("kafka_ports", []) if manifest.exists() else []
        out.append(pytest.param(path, ports, id=path.name))
    if PUBLIC.is_dir():
        out.extend(pytest.param(path, [], id=path.name) for path in sorted(PUBLIC.glob("*.pcap*")))
    return out


def capture_frames(path: Path, ports, monkeypatch):
    """Every (frame, key, version) the driver hands to the decoder for this capture."""
    requests, responses = [], []
    real_request, real_response = conversation.decode_request, conversation.decode_response

    def record_request(frame):
        requests.append(bytes(frame))
        return real_request(frame)

    def record_response(frame, key, version):
        responses.append((bytes(frame), key, version))
        return real_response(frame, key, version)

    with monkeypatch.context() as m:
        m.setattr(conversation, "decode_request", record_request)
        m.setattr(conversation, "decode_response", record_response)
        keys = None
        if keylog_of(path):  # TLS captures ship their key log: decode what is inside
            keys = KeyLog()
            keys.add_file(keylog_of(path))
        cfg = DissectConfig(kafka_ports=frozenset(ports), tls_keys=keys) if ports else DissectConfig(tls_keys=keys)
        dissect_file(path, cfg)
    return requests, responses


@pytest.mark.parametrize(("path", "ports"), _captures())
def test_capture_frames_match_the_reference(path, ports, monkeypatch):
    requests, responses = capture_frames(path, ports, monkeypatch)
    rnd = random.Random(path.name)
    clean = taken = 0
    for i, frame in enumerate(requests):
        ok = check_request(frame)
        if not D.decode_request_reference(frame).issues:
            clean += 1
            taken += ok
        if i < 150:
            for variant in mutations(frame, rnd, 2):
                check_request(variant)
    for i, (frame, key, version) in enumerate(responses):
        ok = check_response(frame, key, version)
        if not D.decode_response_reference(frame, key, version).issues:
            clean += 1
            taken += ok
        if i < 150:
            for variant in mutations(frame, rnd, 2):
                check_response(variant, key, version)
    if path.parent == SHIPPED and (keylog_of(path) or "tls" not in path.name):
        assert requests and responses
    # Every frame the reference decodes without an issue is decoded by the fast path.
    assert taken == clean, (taken, clean)


def test_responses_keep_the_callers_key_and_version_objects():
    """(0, 9) and (IntLike(0), IntLike(9)) share a cache entry; the Message must still
    carry what the caller passed, as the reference's does."""

    class IntLike(int):
        pass

    rnd = random.Random(5)
    while True:  # a frame the fast path takes
        enc = Encoder(rnd)
        frame = header_bytes(False, 0, 9, enc) + body_bytes(False, 0, 9, enc)
        if not D.decode_response_reference(frame, 0, 9).issues:
            break
    assert check_response(frame, 0, 9)
    for key, version in ((IntLike(0), IntLike(9)), (0, IntLike(9))):
        got = D.decode_response(frame, key, version)
        assert type(got.api_version) is IntLike and type(got.decoded_version) is IntLike
        assert canon_msg(got) == canon_msg(D.decode_response_reference(frame, key, version))


# ---------------------------------------------------------------------------
# Record batch headers: every field and attribute bit, CRCs right (the compiled core
# builds such record sets in C; a wrong CRC hands the field to records.parse_record_set)
# ---------------------------------------------------------------------------

_V2_HEADER = struct.Struct(">qiiBIhiqqqhii")


def _batch_with(header: tuple) -> bytes:
    """RECORD_BATCH with its header fields replaced and its CRC-32C recomputed."""
    from kwinspect.protocol.checksums import crc32c

    (base_offset, ple, attrs, lod, base_ts, max_ts, pid, epoch, base_seq, count) = header
    length = len(RECORD_BATCH) - 12
    head = _V2_HEADER.pack(base_offset, length, ple, 2, 0, attrs, lod, base_ts, max_ts, pid, epoch, base_seq, count)
    body = head[21:] + RECORD_BATCH[_V2_HEADER.size:]
    return head[:17] + struct.pack(">I", crc32c(body)) + body


def _produce_v3(records: bytes) -> bytes:
    return (struct.pack(">hhih", 0, 3, 7, 1) + b"c" + struct.pack(">hhii", -1, 1, 1000, 1)
            + struct.pack(">h", 1) + b"t" + struct.pack(">iii", 1, 0, len(records)) + records)


_int = st.integers
_BATCH_HEADERS = st.tuples(_int(-(2 ** 63), 2 ** 63 - 1), _int(-(2 ** 31), 2 ** 31 - 1), _int(-(2 ** 15), 2 ** 15 - 1),
                           _int(-(2 ** 31), 2 ** 31 - 1), _int(-(2 ** 63), 2 ** 63 - 1), _int(-(2 ** 63), 2 ** 63 - 1),
                           _int(-(2 ** 63), 2 ** 63 - 1), _int(-(2 ** 15), 2 ** 15 - 1), _int(-(2 ** 31), 2 ** 31 - 1),
                           _int(-(2 ** 31), 2 ** 31 - 1))


@settings(max_examples=150, deadline=None)
@given(headers=st.lists(_BATCH_HEADERS, min_size=1, max_size=3), tail=st.sampled_from((b"", b"\x00" * 5)))
def test_record_batch_headers_match(headers, tail):
    frame = _produce_v3(b"".join(_batch_with(h) for h in headers) + tail)
    assert check_request(frame)  # a partial tail is the record set's info issue, not the message's


def test_every_attribute_bit_of_a_batch_matches():
    for attrs in [1 << bit for bit in range(15)] + [-(1 << 15), 0, 0x7F, -1, 0x30, 0x18]:
        frame = _produce_v3(_batch_with((5, 1, attrs, 2, 1, 2, 9, 1, 0, 3)))
        assert check_request(frame)


# ---------------------------------------------------------------------------
# Repeated unusual responses: the reference's result, decoded once and copied
# ---------------------------------------------------------------------------


def test_repeated_unusual_responses_match_the_reference_and_share_nothing(monkeypatch):
    """A small response the fast path declines (a mock broker's ApiVersions rejection that
    fits no layout, a rejection in the v0 layout real brokers use, a Metadata with a
    trailing byte) is the reference's answer on every repeat, whatever its correlation id,
    and each answer is its own (changing one changes no other)."""
    D.clear_caches()
    mock_rejection = bytes.fromhex("00230100120000000200000000")  # error 35, then no v0 nor v3 layout
    v0_rejection = struct.pack(">hi", 35, 2) + struct.pack(">hhh", 0, 0, 9) + struct.pack(">hhh", 18, 0, 3)
    metadata = None
    rnd = random.Random(7)
    while metadata is None:  # a clean Metadata v12 response, then one trailing byte
        enc = Encoder(rnd)
        frame = header_bytes(False, 3, 12, enc) + body_bytes(False, 3, 12, enc)
        if not D.decode_response_reference(frame, 3, 12).issues and len(frame) < 900:
            metadata = frame[4:] + b"\x00"
    cases = [(18, 3, mock_rejection), (18, 3, v0_rejection), (18, 4, v0_rejection), (3, 12, metadata)]
    frames = [(struct.pack(">i", cid) + rest, key, version)
              for cid in (1, 2, -7, 1, 2 ** 31 - 1) for key, version, rest in cases]
    wants = [D.decode_response_reference(*f) for f in frames]
    assert all(want.issues for want in wants)  # (the fast path declines these)
    reference_calls = []
    real = D.decode_response_reference

    def counted(*args):
        reference_calls.append(args)
        return real(*args)

    monkeypatch.setattr(D, "decode_response_reference", counted)
    answers = [D.decode_response(*f) for f in frames]
    for got, want, f in zip(answers, wants, frames, strict=True):
        assert canon_msg(got) == canon_msg(want), f
    assert len(reference_calls) == len(cases)  # each decoded once by the reference
    first, again = answers[0], answers[len(cases)]
    first.body["error_code"] = 0
    first.issues.clear()
    assert again.body["error_code"] == 35 and again.issues
    assert D.decode_response(struct.pack(">i", 9) + mock_rejection, 18, 3).body == {"error_code": 35}


def test_the_repeated_responses_memo_is_bounded():
    D.clear_caches()
    for n in range(D.REPEAT_MAX_ENTRIES + 50):
        frame = struct.pack(">ih", 1, 35) + n.to_bytes(4, "big")  # a rejection cut short: issues
        got = D.decode_response(frame, 18, 3)
        assert canon_msg(got) == canon_msg(D.decode_response_reference(frame, 18, 3))
    assert len(D._repeated) == D.REPEAT_MAX_ENTRIES
    big = struct.pack(">ih", 1, 35) + bytes(D.REPEAT_MAX_FRAME)
    assert canon_msg(D.decode_response(big, 18, 3)) == canon_msg(D.decode_response_reference(big, 18, 3))
    assert (18, 3, big[4:]) not in D._repeated  # too big to keep
