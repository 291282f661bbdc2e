"""kafka-python 3.0.12 as an oracle: frames its protocol classes encode must
decode to the values they were given.

Two independent encoders live in kafka-python:

* the new-style ``ApiMessage`` classes, built at import time from the JSON
  message definitions kafka-python ships (kafka.protocol.{admin,consumer,
  metadata,producer,sasl});
* the hand-written ``kafka.protocol.old`` Struct classes (positional schemas),
  which also cover the versions Kafka 4.x removed (Produce v0-2, Fetch v0-3...).

For every request and response class and every version in its JSON
``validVersions`` (new style) -- and every old-style version the new style does
not cover -- we generate values (edge values and hypothesis), encode header +
body with kafka-python, decode with kwinspect and compare field by field.
"""

from __future__ import annotations

import base64
import importlib
import pkgutil
import uuid
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kwinspect.protocol import decode_request, decode_response
from kwinspect.protocol.schema.index import APIS

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import kafka.protocol as kp
    import kafka.protocol.old as kp_old
    from kafka.protocol.api_message import ApiMessage
    from kafka.protocol.old import types as old_types
    from kafka.protocol.old.api import Request as OldRequest
    from kafka.protocol.old.api import Response as OldResponse
    from kafka.record.default_records import DefaultRecordBatchBuilder

    for _m in pkgutil.walk_packages(kp.__path__, "kafka.protocol."):
        if ".old" not in _m.name and "generate_stubs" not in _m.name:
            importlib.import_module(_m.name)
    for _m in pkgutil.iter_modules(kp_old.__path__, "kafka.protocol.old."):
        importlib.import_module(_m.name)

CORRELATION_ID = 0x0A0B0C0D
CLIENT_ID = "kafka-python-oracle"
SETTINGS = settings(max_examples=5, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _uuid_str(value) -> str:
    raw = (value or uuid.UUID(int=0)).bytes if isinstance(value, uuid.UUID) or value is None else value
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


# kafka-python patches a few JSON definitions at import time to present int32
# "authorized operations" as a set of bits, renaming the field on the way
# (kafka/protocol/metadata/metadata.py, admin/cluster.py).  Wire format unchanged.
_PATCHED_NAMES = {
    "clusterauthorizedoperations": "authorizedoperations",
    "topicauthorizedoperations": "authorizedoperations",
}


def _norm(name: str) -> str:
    # kafka-python's underscore_name and kwinspect's snake_case agree except
    # around acronyms; compare names without their underscores.
    n = name.replace("_", "")
    return _PATCHED_NAMES.get(n, n)


def _record_batch() -> bytes:
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                  producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                  batch_size=1 << 20)
    b.append(0, timestamp=1_700_000_000_000, key=b"key", value=b"value", headers=[])
    return bytes(b.build())


RECORD_BATCH = _record_batch()


def assert_records(raw: bytes | None, got, path: str) -> None:
    """RECORDS go through protocol/records.py: raw bytes if given back, else the set's size."""
    if raw is None:
        assert got is None, f"{path}: expected null records"
        return
    if isinstance(got, bytes | bytearray | memoryview):
        assert bytes(got) == raw, f"{path}: record bytes differ"
        return
    assert getattr(got, "size", None) == len(raw), f"{path}: {got!r} is not the {len(raw)} record bytes"


# ---------------------------------------------------------------------------
# New-style ApiMessage classes (JSON-driven)
# ---------------------------------------------------------------------------


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def _new_style_cases():
    out = []
    classes = {c for c in _subclasses(ApiMessage) if getattr(c, "_class_version", 1) is None}
    for cls in sorted(classes, key=lambda c: (c.API_KEY, c.type)):
        lo, hi = cls.valid_versions
        for version in range(lo, hi + 1):
            out.append(pytest.param(cls, version, id=f"{cls.__name__}-v{version}"))
    return out


NEW_STYLE_CASES = _new_style_cases()


def _active(field, version):
    return field.for_version_q(version)


def _simple_value(type_str: str, mode: str, draw=None):
    """An edge ("low"/"high") or random (draw given) value for a simple JSON type."""
    bounds = {"int8": 8, "int16": 16, "int32": 32, "int64": 64}
    if type_str in bounds:
        bits = bounds[type_str]
        lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
        return draw(st.integers(lo, hi)) if draw else (lo if mode == "low" else hi)
    if type_str == "uint16":
        return draw(st.integers(0, 65535)) if draw else (0 if mode == "low" else 65535)
    if type_str == "float64":
        if draw:
            return draw(st.floats(allow_nan=False, allow_infinity=False))
        return -1.5e300 if mode == "low" else 1.7976931348623157e308
    if type_str == "bool":
        return draw(st.booleans()) if draw else mode == "high"
    if type_str == "uuid":
        if draw:
            return draw(st.uuids())
        return uuid.UUID(int=0) if mode == "low" else uuid.UUID(int=2**128 - 1)
    if type_str == "string":
        return draw(st.text(max_size=10)) if draw else ("" if mode == "low" else "ünï ✓ 😀 end")
    if type_str == "bytes":
        return draw(st.binary(max_size=16)) if draw else (b"" if mode == "low" else bytes(range(256)))
    if type_str == "bitfield":  # kafka-python's view of int32 "authorized operations" fields
        if draw:
            return draw(st.one_of(st.none(), st.sets(st.integers(0, 31), max_size=6)))
        return set() if mode == "low" else {0, 3, 30}
    if type_str == "records":
        if draw:
            return draw(st.sampled_from([b"", RECORD_BATCH]))
        return b"" if mode == "low" else RECORD_BATCH
    raise TypeError(type_str)


def build_value(field, version: int, mode: str, draw=None):
    """(value for kafka-python, expected kwinspect value)."""
    nullable = field.nullable_for_version_q(version)
    if nullable and (mode == "low" if draw is None else draw(st.integers(0, 4)) == 0):
        return None, None
    if field.is_struct_array():
        n = (0 if mode == "low" else 2) if draw is None else draw(st.integers(0, 2))
        items = [build_struct(field, version, mode, draw) for _ in range(n)]
        return [v for v, _ in items], [e for _, e in items]
    if field.is_struct():
        return build_struct(field, version, mode, draw)
    if field.is_array():
        n = (0 if mode == "low" else 2) if draw is None else draw(st.integers(0, 3))
        items = [build_simple(field.array_of._type_str, mode, draw) for _ in range(n)]
        return [v for v, _ in items], [e for _, e in items]
    return build_simple(field._type_str, mode, draw)


def build_simple(type_str, mode, draw):
    value = _simple_value(type_str, mode, draw)
    if type_str == "uuid":
        return value, _uuid_str(value)
    if type_str == "records":
        return value, ("records", value)
    if type_str == "bitfield":  # a set of bit numbers on the wire as one int32; None is {31}
        bits = sum(1 << b for b in ({31} if value is None else value))
        return value, bits - (1 << 32) if bits >= 1 << 31 else bits
    return value, value


def build_struct(struct_field, version, mode, draw):
    values, want = {}, {}
    for f in struct_field.fields.values():
        if not _active(f, version):
            continue
        value, expect = build_value(f, version, mode, draw)
        if f.tagged_field_q(version) and value == f.default:
            # kafka-python writes a tagged field only when it differs from its
            # default; the absent field then decodes to kwinspect's default,
            # which the kio oracle checks. Only check the name here.
            expect = _ANY
        values[f.name] = value
        want[f.name] = expect
    return struct_field.data_class(**values), want


class _Any:
    def __repr__(self):
        return "<any>"


_ANY = _Any()


def assert_same(want, got, path="body"):
    if want is _ANY:
        return
    if isinstance(want, dict):
        assert isinstance(got, dict), f"{path}: expected a struct, got {got!r}"
        assert "_unknown_tags" not in got, f"{path}: unexpected unknown tags {got['_unknown_tags']!r}"
        by_norm = {_norm(k): k for k in got}
        assert sorted(by_norm) == sorted(_norm(k) for k in want), \
            f"{path}: field names differ: {sorted(got)} vs {sorted(want)}"
        for name, value in want.items():
            assert_same(value, got[by_norm[_norm(name)]], f"{path}.{name}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), f"{path}: {got!r} != {want!r}"
        for i, (w, g) in enumerate(zip(want, got, strict=True)):
            assert_same(w, g, f"{path}[{i}]")
    elif isinstance(want, tuple) and want and want[0] == "records":
        assert_records(want[1], got, path)
    else:
        assert type(got) is type(want) and got == want, f"{path}: {got!r} != {want!r}"


def encode_and_check(cls, version, values, want):
    msg_obj = cls(version=version, **values)
    msg_obj.with_header(correlation_id=CORRELATION_ID, client_id=CLIENT_ID)
    frame = bytes(msg_obj.encode(header=True))
    if cls.is_request():
        msg = decode_request(frame)
        assert msg.header == {"request_api_key": cls.API_KEY, "request_api_version": version,
                              "correlation_id": CORRELATION_ID, "client_id": CLIENT_ID}
    else:
        msg = decode_response(frame, cls.API_KEY, version)
        assert msg.header == {"correlation_id": CORRELATION_ID}
    issues = msg.issues
    if cls.API_KEY == 18 and not cls.is_request() and version > 0 and values.get("error_code") == 35:
        # UNSUPPORTED_VERSION in an ApiVersions answer is flagged (info) with the layout found.
        assert [(i.kind, i.severity) for i in issues] == [("unsupported_version", "info")]
        issues = []
    assert issues == [], [i.as_dict() for i in msg.issues]
    assert msg.decoded_version == version
    assert_same(want, msg.body)


@pytest.mark.parametrize(("cls", "version"), NEW_STYLE_CASES)
def test_kafka_python_new_style(cls, version):
    top = cls._struct
    for mode in ("low", "high"):
        values, want = build_struct_top(top, version, mode, None)
        encode_and_check(cls, version, values, want)

    @SETTINGS
    @given(st.data())
    def random_values(data):
        values, want = build_struct_top(top, version, "random", data.draw)
        encode_and_check(cls, version, values, want)

    random_values()


def build_struct_top(top, version, mode, draw):
    values, want = {}, {}
    for f in top.fields.values():
        if not _active(f, version):
            continue
        value, expect = build_value(f, version, mode, draw)
        if f.tagged_field_q(version) and value == f.default:
            expect = _ANY
        values[f.name] = value
        want[f.name] = expect
    return values, want


# ---------------------------------------------------------------------------
# Old-style Struct classes (kafka.protocol.old), positional schemas
# ---------------------------------------------------------------------------


def _old_style_cases():
    covered = {(c.values[0].API_KEY, c.values[0].is_request(), c.values[1]) for c in NEW_STYLE_CASES}
    out = []
    seen = set()
    for mod in pkgutil.iter_modules(kp_old.__path__, "kafka.protocol.old."):
        for obj in vars(importlib.import_module(mod.name)).values():
            if not (isinstance(obj, type) and issubclass(obj, OldRequest | OldResponse)
                    and isinstance(getattr(obj, "API_KEY", None), int) and hasattr(obj, "SCHEMA")):
                continue
            is_request = issubclass(obj, OldRequest)
            key = (obj.API_KEY, is_request, obj.API_VERSION)
            if key in covered or key in seen or obj.API_KEY not in APIS:
                continue
            seen.add(key)
            out.append(pytest.param(obj, id=obj.__name__))
    return sorted(out, key=lambda p: p.id)


# Oracle bugs in the hand-written old schemas (upstream's JSON is what our tables follow):
OLD_STYLE_ORACLE_BUGS = {
    # kafka-python declares Partitions as a single Int32; upstream
    # DescribeLogDirsRequest v0 has "Partitions": "[]int32".
    "DescribeLogDirsRequest_v0",
}
OLD_STYLE_CASES = [p for p in _old_style_cases() if p.id not in OLD_STYLE_ORACLE_BUGS]

# Old schemas carry no nullability, so only non-null values are generated for them.
_OLD_SIMPLE = {
    old_types.Int8: "int8", old_types.Int16: "int16", old_types.Int32: "int32",
    old_types.Int64: "int64", old_types.Float64: "float64", old_types.Boolean: "bool",
}


def old_value(typ, mode, draw):
    """(value for the old Struct, expected kwinspect value) for an old-style type."""
    if isinstance(typ, old_types.Schema):
        pairs = [old_value(t, mode, draw) for t in typ.fields]
        return tuple(v for v, _ in pairs), [e for _, e in pairs]
    if isinstance(typ, old_types.Array):  # includes CompactArray
        n = (0 if mode == "low" else 2) if draw is None else draw(st.integers(0, 2))
        pairs = [old_value(typ.array_of, mode, draw) for _ in range(n)]
        return [v for v, _ in pairs], [e for _, e in pairs]
    if typ is old_types.TaggedFields:
        return {}, None
    if isinstance(typ, type) and typ in _OLD_SIMPLE:
        v = _simple_value(_OLD_SIMPLE[typ], mode, draw)
        return v, v
    if typ is old_types.UUID:
        v = _simple_value("uuid", mode, draw)
        return v, _uuid_str(v)
    if isinstance(typ, old_types.String) or typ is old_types.CompactString:  # String('utf-8'), CompactString
        v = _simple_value("string", mode, draw)
        return v, v
    if typ in (old_types.Bytes, old_types.CompactBytes):
        v = _simple_value("bytes", mode, draw)
        return v, ("bytes-or-records", v)
    raise TypeError(f"old type {typ!r}")


def assert_old_same(want, got, path):
    """Positional comparison: the old schemas are ordered like upstream's."""
    if isinstance(want, list) and isinstance(got, dict):
        fields = [(k, v) for k, v in got.items() if k != "_unknown_tags"]
        assert len(fields) >= len(want), f"{path}: {len(fields)} fields, expected {len(want)}"
        for i, w in enumerate(want):
            assert_old_same(w, fields[i][1], f"{path}.{fields[i][0]}")
        # Anything after the positional fields can only be absent tagged fields.
        return
    if isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), f"{path}: {got!r} != {want!r}"
        for i, (w, g) in enumerate(zip(want, got, strict=True)):
            assert_old_same(w, g, f"{path}[{i}]")
        return
    if isinstance(want, tuple) and want and want[0] == "bytes-or-records":
        if isinstance(got, bytes):
            assert got == want[1], f"{path}: {got!r} != {want[1]!r}"
        else:
            assert_records(want[1], got, path)
        return
    assert type(got) is type(want) and got == want, f"{path}: {got!r} != {want!r}"


def old_check(cls, mode, draw):
    positional = [(n, t) for n, t in zip(cls.SCHEMA.names, cls.SCHEMA.fields, strict=True)]
    values, want = [], []
    for _name, typ in positional:
        v, e = old_value(typ, mode, draw)
        if typ is old_types.Bytes and mode == "high":  # top-level blobs here are record sets
            v, e = RECORD_BATCH, ("bytes-or-records", RECORD_BATCH)
        values.append(v)
        if typ is not old_types.TaggedFields:
            want.append(e)
    obj = cls(*values)
    obj.with_header(correlation_id=CORRELATION_ID, client_id=CLIENT_ID)
    frame = bytes(obj.encode(header=True))
    if issubclass(cls, OldRequest):
        msg = decode_request(frame)
        assert msg.header["correlation_id"] == CORRELATION_ID
        assert msg.header["client_id"] == CLIENT_ID
    else:
        msg = decode_response(frame, cls.API_KEY, cls.API_VERSION)
        assert msg.header == {"correlation_id": CORRELATION_ID}
    assert msg.issues == [], [i.as_dict() for i in msg.issues]
    assert msg.decoded_version == cls.API_VERSION
    assert_old_same(want, msg.body, "body")


@pytest.mark.parametrize("cls", OLD_STYLE_CASES)
def test_kafka_python_old_style(cls):
    for mode in ("low", "high"):
        old_check(cls, mode, None)

    @SETTINGS
    @given(st.data())
    def random_values(data):
        old_check(cls, "random", data.draw)

    random_values()


def test_kafka_python_coverage_is_broad():
    assert len(NEW_STYLE_CASES) >= 300
    assert len(OLD_STYLE_CASES) >= 10
    keys = {p.values[0].API_KEY for p in NEW_STYLE_CASES}
    assert {0, 1, 2, 3, 8, 9, 10, 11, 18, 19} <= keys
