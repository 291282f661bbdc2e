"""Terminal safety end to end: ANSI escapes and control characters that arrive in client
ids, topic names, broker hosts, record keys, values and header keys are shown escaped in
every table the CLI prints (exchanges, records, errors, latency, summary) and in the TUI's
rows and detail trees, never written raw to the terminal."""

from __future__ import annotations

import re
import struct

import pytest
from helpers.pcapgen import conversation, write_pcap
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v1 import request as md1_req
from kio.schema.metadata.v1 import response as md1_resp
from kio.static.primitive import i32
from stream.kio_frames import request_frame, response_frame

from kwinspect.cli import main
from kwinspect.protocol.checksums import crc32c

CLIENT_ID = "cli\x1b[2J\x1b]52;c;SGVsbG8=\x07ent\r\n"
TOPIC = "top\x1b[31mic\x07\x08\x7f\u202e"
HOST = "bro\x1b[5mker\x00"
KEY = b"k\x1b[H\x1b[2J"
VALUE = b"val\x1b]0;owned\x07\x9b31m"  # not UTF-8 (0x9b): rendered as base64, which is safe too
VALUE_TEXT = b"v\x1b[41m\x0c\x1b[?1049h"
HEADER_KEY = "h\x1b[1m\x05"

# Raw control bytes a terminal would act on: C0 except newline, DEL, C1, and bidi overrides.
UNSAFE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _varint(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while True:
        b = z & 0x7F
        z >>= 7
        if z:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _record(offset_delta: int, key: bytes, value: bytes, headers: list[tuple[bytes, bytes]]) -> bytes:
    body = (b"\x00" + _varint(0) + _varint(offset_delta) + _varint(len(key)) + key
            + _varint(len(value)) + value + _varint(len(headers))
            + b"".join(_varint(len(k)) + k + _varint(len(v)) + v for k, v in headers))
    return _varint(len(body)) + body


def _batch(records: list[bytes]) -> bytes:
    n = len(records)
    after_crc = struct.pack(">hiqqqhii", 0, n - 1, 1_700_000_000_000, 1_700_000_000_000, -1, -1, -1, n)
    after_crc += b"".join(records)
    body = struct.pack(">ib", 0, 2) + struct.pack(">I", crc32c(after_crc)) + after_crc
    return struct.pack(">qi", 0, len(body)) + body


def _string(s: str) -> bytes:
    b = s.encode()
    return struct.pack(">h", len(b)) + b


def _produce_v3(cid: int, records: bytes) -> bytes:
    return (struct.pack(">hhi", 0, 3, cid) + _string(CLIENT_ID) + struct.pack(">h", -1)
            + struct.pack(">hi", 1, 30000) + struct.pack(">i", 1) + _string(TOPIC)
            + struct.pack(">i", 1) + struct.pack(">i", 0) + struct.pack(">i", len(records)) + records)


def _produce_v3_response(cid: int, error_code: int) -> bytes:
    return (struct.pack(">i", cid) + struct.pack(">i", 1) + _string(TOPIC) + struct.pack(">i", 1)
            + struct.pack(">ihqq", 0, error_code, 42, -1) + struct.pack(">i", 0))


def _sized(frame: bytes) -> bytes:
    return struct.pack(">i", len(frame)) + frame


@pytest.fixture(scope="module")
def hostile_text_pcap(tmp_path_factory) -> str:
    records = _batch([_record(0, KEY, VALUE, [(HEADER_KEY.encode(), b"\x1b[0m")]),
                      _record(1, KEY, VALUE_TEXT, [])])
    metadata = md1_resp.MetadataResponse(
        brokers=(md1_resp.MetadataResponseBroker(node_id=i32(1), host=HOST, port=i32(9092), rack=None),),
        controller_id=i32(1),
        topics=(md1_resp.MetadataResponseTopic(error_code=ErrorCode(3), name=TOPIC, is_internal=False,
                                               partitions=()),))
    messages = [
        ("c", _sized(request_frame(md1_req.MetadataRequest(
            topics=(md1_req.MetadataRequestTopic(name=TOPIC),)), 1, client_id=CLIENT_ID))),
        ("s", _sized(response_frame(metadata, 1))),
        ("c", _sized(_produce_v3(2, records))),
        ("s", _sized(_produce_v3_response(2, 2))),  # CORRUPT_MESSAGE for the topic
    ]
    path = tmp_path_factory.mktemp("term") / "escapes.pcap"
    write_pcap(path, conversation(("10.0.0.1", 40000), ("10.0.0.2", 9092), messages))
    return str(path)


def _table(capsys, *argv: str) -> str:
    assert main(list(argv) + ["-q"]) == 0
    return capsys.readouterr().out


def _assert_safe(text: str, what: str) -> None:
    bad = sorted({repr(m.group(0)) for m in UNSAFE.finditer(text)})
    assert not bad, f"{what} printed raw control characters {bad}"


@pytest.mark.parametrize("argv,expect", [
    (("exchanges", "-F", "table"), ["cli\\x1b[2J", "top\\x1b[31mic\\x07"]),
    (("records", "-F", "table"), ["k\\x1b[H\\x1b[2J", "v\\x1b[41m\\x0c", "h\\x1b[1m\\x05"]),
    (("errors", "-F", "table"), ["top\\x1b[31mic"]),
    (("latency", "--by", "client", "-F", "table"), ["cli\\x1b[2J"]),
    (("latency", "--by", "topic", "-F", "table"), ["top\\x1b[31mic"]),
    (("summary",), ["cli\\x1b[2J", "top\\x1b[31mic"]),
    (("stats", "-F", "table", "--series", "requests", "--by", "client"), ["cli\\x1b[2J"]),
    (("stats", "-F", "table", "--series", "volume", "--by", "topic"), ["top\\x1b[31mic"]),
], ids=lambda x: " ".join(x) if isinstance(x, tuple) else None)
def test_cli_tables_escape_control_characters(hostile_text_pcap, capsys, argv, expect):
    out = _table(capsys, argv[0], hostile_text_pcap, *argv[1:])
    _assert_safe(out, " ".join(argv))
    flat = re.sub(r"\s+", "", out)  # rich wraps and pads cells
    missing = [e for e in expect if re.sub(r"\s+", "", e)[:10] not in flat]
    assert not missing, f"{' '.join(argv)}: escaped values not shown: {missing}\n{out}"


def test_the_capture_really_carries_the_escapes(hostile_text_pcap):
    with open(hostile_text_pcap, "rb") as f:
        wire = f.read()
    for s in (CLIENT_ID.encode(), TOPIC.encode(), HOST.encode(), KEY, VALUE_TEXT):
        assert s in wire


def test_machine_formats_keep_the_exact_values(hostile_text_pcap, capsys):
    # escaping is for terminals: jsonl keeps the exact wire text (JSON-escaped)
    import json

    rows = [json.loads(x) for x in _table(capsys, "records", hostile_text_pcap, "-F", "jsonl").splitlines()]
    assert {r["key"] for r in rows} == {KEY.decode()}
    assert VALUE_TEXT.decode() in {r["value"] for r in rows}


def test_tui_rows_and_trees_escape_control_characters(hostile_text_pcap):
    pytest.importorskip("textual")
    from kwinspect.dissect import DissectConfig
    from kwinspect.tui.indexer import Indexer
    from kwinspect.tui.store import ExchangeStore
    from kwinspect.tui.widgets.detail import _scalar_label
    from kwinspect.tui.widgets.exchange_list import row_cells

    store = ExchangeStore()
    Indexer(store).index_files([hostile_text_pcap], DissectConfig())
    assert store.total >= 2
    shown = []
    for row in range(store.first, store.total):
        for text, _style in row_cells(store, row):
            _assert_safe(text, f"TUI row {row}")
            shown.append(text)
        for msg in store.messages(row):
            stack = [msg.body if msg else None, msg.header if msg else None]
            while stack:
                node = stack.pop()
                if isinstance(node, dict):
                    stack.extend(node.values())
                elif isinstance(node, list):
                    stack.extend(node)
                elif isinstance(node, str | bytes):
                    label = _scalar_label(node).plain
                    _assert_safe(label, "TUI detail tree")
                    shown.append(label)
    assert any("top\\x1b[31mic" in s for s in shown)
    assert any("cli\\x1b[2J" in s for s in shown)
