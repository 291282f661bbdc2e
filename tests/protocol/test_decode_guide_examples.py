"""The protocol guide's examples and grammar, as an oracle we did not write.

Sources (../shared/seeds, see its README):

* 002: a write-up of framing and headers with hex-dump examples.  Their size
  fields do not match their contents (DESIGN.md section 3: trust the grammar),
  so the frame is taken as the bytes after the size field, and where an example
  contradicts the grammar the grammar wins (and the decoder must say so).
* 003: Kafka's protocol guide with the BNF grammar of every request and
  response version up to api key 43.  Each grammar is parsed here, a frame is
  encoded straight from it (edge values and hypothesis values), and the decoded
  body must hold the same values in the same order.  Names are the guide's, so
  values are compared by position (the wire has no names).
"""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kwinspect.model import DECODE_ERROR
from kwinspect.protocol import decode_request, decode_response
from kwinspect.protocol.decode import request_header_version, response_header_version

SEEDS = Path(__file__).resolve().parents[3] / "shared" / "seeds"
FRAMING_GUIDE = SEEDS / "002_a2b84cbc5b36f45e.txt"
PROTOCOL_GUIDE = SEEDS / "003_cc4873a62a151ebc.txt"

pytestmark = pytest.mark.skipif(not SEEDS.is_dir(), reason=f"{SEEDS} not present")


def hex_example(title: str) -> tuple[int | None, bytes]:
    """(declared size, content bytes) of a hex dump in the framing guide, found by its title.

    The first line is the 4-byte size ("00 00 00 XX" when the guide leaves it
    open); the content runs until the first line that is not hex octets.
    """
    text = FRAMING_GUIDE.read_text(encoding="utf-8")
    start = text.index(title)
    lines = text[text.index("Hex dump:", start):].splitlines()[1:]
    size_code = lines[0].split("//")[0].strip()
    declared = None if "XX" in size_code else struct.unpack(">i", bytes.fromhex(size_code))[0]
    octets = []
    for line in lines[1:]:
        code = line.split("//")[0].strip()
        if not code or not re.fullmatch(r"([0-9A-Fa-f]{2}\s*)+", code):
            break
        octets.append(bytes.fromhex(code))
    return declared, b"".join(octets)


# ---------------------------------------------------------------------------
# 002: the hex-dump examples
# ---------------------------------------------------------------------------


def test_minimal_metadata_v0_request_example():
    declared, frame = hex_example("Minimal Request (Metadata v0)")
    assert declared == 17 and len(frame) == 18  # the example's size field is off by one
    msg = decode_request(frame)
    assert msg.header == {"request_api_key": 3, "request_api_version": 0, "correlation_id": 1,
                          "client_id": "test"}
    # "FF FF FF FF // topics: null (all topics)": the grammar makes topics
    # nullable only from v1 (v0 asks for all topics with an empty array), so a
    # v0 null is malformed and must be reported at the array, not accepted.
    errors = [i for i in msg.issues if i.kind == DECODE_ERROR]
    assert len(errors) == 1 and errors[0].offset == 14 and errors[0].path == "topics"
    # The same bytes as v1, where null is legal, mean "all topics".
    v1 = bytearray(frame)
    v1[3] = 1
    msg = decode_request(bytes(v1))
    assert msg.issues == [] and msg.body == {"topics": None}


def test_minimal_metadata_v0_response_example():
    declared, frame = hex_example("Minimal Response (Metadata v0)")
    assert declared == 6 and len(frame) == 12  # size field disagrees with the content
    msg = decode_response(frame, 3, 0)
    assert msg.issues == []
    assert msg.header == {"correlation_id": 1}
    assert msg.body == {"brokers": [], "topics": []}


def test_flexible_produce_v9_request_header_example():
    _declared, header = hex_example("Flexible Request (Produce v9)")
    assert len(header) == 2 + 2 + 4 + 2 + 5 + 1
    # The example elides the body; complete it from the grammar: transactional_id
    # null (compact 0), acks 1, timeout 1500, topic_data empty (compact 1), no tags.
    body = b"\x00" + struct.pack(">hi", 1, 1500) + b"\x01" + b"\x00"
    msg = decode_request(header + body)
    assert msg.issues == []
    # client_id stays a classic INT16-length string in header v2; the 00 after it is the tag count.
    assert msg.header == {"request_api_key": 0, "request_api_version": 9, "correlation_id": 42,
                          "client_id": "prod1"}
    assert msg.body == {"transactional_id": None, "acks": 1, "timeout_ms": 1500, "topic_data": []}


# "First Flexible Version" table of the framing guide: header v2 / v1 from there on.
FLEXIBLE_TABLE = {
    "Produce": (0, 9), "Fetch": (1, 12), "ListOffsets": (2, 6), "Metadata": (3, 9),
    "OffsetCommit": (8, 8), "OffsetFetch": (9, 6), "FindCoordinator": (10, 3),
    "JoinGroup": (11, 6), "Heartbeat": (12, 4), "LeaveGroup": (13, 4), "SyncGroup": (14, 4),
    "DescribeGroups": (15, 5),
    # The guide says 4; ListGroupsRequest.json says "flexibleVersions": "3+". Grammar wins.
    "ListGroups": (16, 3),
    "CreateTopics": (19, 5), "DeleteTopics": (20, 4), "ApiVersions": (18, 3),
}


@pytest.mark.parametrize("api", sorted(FLEXIBLE_TABLE))
def test_header_versions_follow_first_flexible_version(api):
    key, first = FLEXIBLE_TABLE[api]
    assert request_header_version(key, first) == 2
    assert request_header_version(key, first - 1) == 1
    if key == 18:  # ApiVersions answers with header v0 whatever the version
        assert response_header_version(key, first) == 0
    else:
        assert response_header_version(key, first) == 1
    assert response_header_version(key, first - 1) == 0


def test_controlled_shutdown_v0_uses_header_v0():
    # "Legacy (ControlledShutdown only)" in the header-version table.
    assert request_header_version(7, 0) == 0
    assert request_header_version(7, 1) == 1


# ---------------------------------------------------------------------------
# 003: the BNF grammar of every request/response version
# ---------------------------------------------------------------------------

_HEAD = re.compile(r"^(\w+) (Request|Response) \(Version: (\d+)\) => ?(.*)$")
_API = re.compile(r"^(\w+) API \(Key: (\d+)\):")


class Node:
    """A grammar production: a primitive TYPE, or a sequence of named children."""

    def __init__(self, name, array, type_=None, children=None):
        self.name, self.array, self.type, self.children = name, array, type_, children

    def __repr__(self):
        inner = self.type or " ".join(map(repr, self.children or []))
        return f"{'[' if self.array else ''}{self.name}{']' if self.array else ''}=>{inner}"


def _tokens(rhs: str):
    return [(t.strip("[]"), t.startswith("[")) for t in rhs.split()]


def _parse_fields(tokens, lines, pos, indent):
    nodes = []
    for name, array in tokens:
        line = lines[pos]
        assert line.startswith(" " * indent + name + " =>"), (name, line)
        pos += 1
        rhs = line.split("=>", 1)[1].strip()
        if re.fullmatch(r"[A-Z_0-9]+|ARRAY\([A-Z_0-9]+\)", rhs):
            nodes.append(Node(name, array, type_=rhs))
        else:
            children, pos = _parse_fields(_tokens(rhs), lines, pos, indent + 2)
            nodes.append(Node(name, array, children=children))
    return nodes, pos


def parse_guide():
    lines = PROTOCOL_GUIDE.read_text(encoding="utf-8").splitlines()
    keys, grammars = {}, []
    for i, line in enumerate(lines):
        m = _API.match(line)
        if m:
            keys[m.group(1)] = int(m.group(2))
            continue
        m = _HEAD.match(line.rstrip())
        if m and m.group(1) in keys:
            fields, _ = _parse_fields(_tokens(m.group(4)), lines, i + 1, 2)
            grammars.append((keys[m.group(1)], m.group(1), m.group(2) == "Request", int(m.group(3)), fields))
    return grammars


GRAMMARS = parse_guide() if PROTOCOL_GUIDE.is_file() else []

_INT = {"INT8": (">b", 8), "INT16": (">h", 16), "INT32": (">i", 32), "INT64": (">q", 64)}
_RECORD_SET = bytes.fromhex(  # one magic 1 message, key null, value "guide"
    "0000000000000000" "00000020" "6cbcfd5b" "01" "00" "0000018bcfe56800" "ffffffff" "00000005") + b"guide"


def _value(node_type: str, mode: str, draw):
    if node_type.startswith("ARRAY("):
        inner = node_type[6:-1]
        n = (0 if mode == "low" else 2) if draw is None else draw(st.integers(0, 2))
        return [_value(inner, mode, draw) for _ in range(n)]
    if node_type in _INT:
        bits = _INT[node_type][1]
        lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
        return draw(st.integers(lo, hi)) if draw else (lo if mode == "low" else hi)
    if node_type == "BOOLEAN":
        return draw(st.booleans()) if draw else mode == "high"
    if node_type in ("STRING", "NULLABLE_STRING"):
        if node_type == "NULLABLE_STRING" and (mode == "low" if not draw else draw(st.booleans())):
            return None
        return draw(st.text(max_size=8)) if draw else ("" if mode == "low" else "güide ✓ 😀")
    if node_type in ("BYTES", "NULLABLE_BYTES"):
        return draw(st.binary(max_size=8)) if draw else (b"" if mode == "low" else b"\x00\xffbytes")
    if node_type == "RECORDS":
        return None if mode == "low" and not draw else _RECORD_SET
    raise TypeError(node_type)


def _encode_value(node_type, value) -> bytes:
    if node_type.startswith("ARRAY("):
        inner = node_type[6:-1]
        return struct.pack(">i", len(value)) + b"".join(_encode_value(inner, v) for v in value)
    if node_type in _INT:
        return struct.pack(_INT[node_type][0], value)
    if node_type == "BOOLEAN":
        return b"\x01" if value else b"\x00"
    if node_type in ("STRING", "NULLABLE_STRING"):
        if value is None:
            return struct.pack(">h", -1)
        raw = value.encode()
        return struct.pack(">h", len(raw)) + raw
    if value is None:  # BYTES / RECORDS
        return struct.pack(">i", -1)
    return struct.pack(">i", len(value)) + value


def build(nodes, mode, draw):
    """(wire bytes, expected values in order) for a sequence of grammar nodes."""
    wire, want = bytearray(), []
    for node in nodes:
        if node.array:
            n = (0 if mode == "low" else 2) if draw is None else draw(st.integers(0, 2))
            wire += struct.pack(">i", n)
            items = []
            for _ in range(n):
                if node.type:
                    v = _value(node.type, mode, draw)
                    wire += _encode_value(node.type, v)
                    items.append((node.type, v))
                else:
                    w, e = build(node.children, mode, draw)
                    wire += w
                    items.append(e)
            want.append(items)
        elif node.type:
            v = _value(node.type, mode, draw)
            wire += _encode_value(node.type, v)
            want.append((node.type, v))
        else:
            w, e = build(node.children, mode, draw)
            wire += w
            want += e  # a non-array group is inlined on the wire
    return bytes(wire), want


def _flatten(got: dict):
    """Decoded values in wire order (inline structs expanded, like the grammar's groups)."""
    out = []
    for key, value in got.items():
        if key == "_unknown_tags":
            continue
        if isinstance(value, dict):
            out += _flatten(value)
        else:
            out.append((key, value))
    return out


def assert_positional(want: list, got: dict, path: str = "body"):
    fields = _flatten(got)
    assert len(fields) == len(want), f"{path}: {len(fields)} fields {[k for k, _ in fields]}, grammar has {len(want)}"
    for (name, value), w in zip(fields, want, strict=True):
        _compare(w, value, f"{path}.{name}")


def _compare(want, got, path):
    if isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), f"{path}: {got!r} vs {want!r}"
        for i, (w, g) in enumerate(zip(want, got, strict=True)):
            if isinstance(w, list):
                if isinstance(g, dict):
                    assert_positional(w, g, f"{path}[{i}]")
                else:  # the guide writes a one-field struct as its bare type
                    assert len(w) == 1, path
                    _compare(w[0], g, f"{path}[{i}]")
            elif isinstance(g, dict):  # [topics] => STRING where upstream has {name}
                assert len(g) == 1, f"{path}[{i}]: {g!r}"
                _compare(w, next(iter(g.values())), f"{path}[{i}]")
            else:
                _compare(w, g, f"{path}[{i}]")
        return
    node_type, value = want
    if node_type.startswith("ARRAY("):
        _compare([(node_type[6:-1], v) for v in value], got, path)
        return
    if node_type == "RECORDS":
        if value is None:
            assert got is None, path
        elif isinstance(got, bytes):
            assert got == value, path
        else:
            assert getattr(got, "size", None) == len(value), f"{path}: {got!r}"
        return
    assert type(got) is type(value) and got == value, f"{path}: {got!r} != {value!r}"


def _frame(key, is_request, version, body):
    if is_request:
        if (key, version) == (7, 0):
            # The guide gives one request header with client_id for all; upstream's
            # RequestHeader.json (header v0) says ControlledShutdown v0 has none.
            return struct.pack(">hhi", key, version, 99) + body
        header = struct.pack(">hhih", key, version, 99, 5) + b"guide"
        return header + body
    return struct.pack(">i", 99) + body


def check_grammar(key, is_request, version, fields, mode, draw):
    body, want = build(fields, mode, draw)
    frame = _frame(key, is_request, version, body)
    msg = decode_request(frame) if is_request else decode_response(frame, key, version)
    assert msg.issues == [], [i.as_dict() for i in msg.issues]
    assert msg.decoded_version == version
    if is_request:
        assert msg.header["correlation_id"] == 99
        assert msg.header.get("client_id") == (None if (key, version) == (7, 0) else "guide")
    assert_positional(want, msg.body)


@pytest.mark.parametrize(
    ("key", "name", "is_request", "version", "fields"),
    [pytest.param(*g, id=f"{g[1]}-v{g[3]}-{'request' if g[2] else 'response'}") for g in GRAMMARS],
)
def test_guide_grammar(key, name, is_request, version, fields):
    for mode in ("low", "high"):
        check_grammar(key, is_request, version, fields, mode, None)

    @settings(max_examples=3, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(st.data())
    def random_values(data):
        check_grammar(key, is_request, version, fields, "random", data.draw)

    random_values()


def test_guide_grammar_was_parsed():
    assert len(GRAMMARS) >= 280
    assert {g[0] for g in GRAMMARS} == set(range(44))
