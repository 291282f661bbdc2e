"""Crafted hostile inputs: each hits a hard limit (docs/limits.md), produces a clear issue,
stays within bounded memory (tracemalloc), and the command line exits 0 (or 1 with one
line for unreadable files), never with a traceback."""

from __future__ import annotations

import gzip
import json
import os
import struct
import subprocess
import sys
import tracemalloc

import pytest
from fuzz import harness
from helpers.pcapgen import conversation, write_pcap

from kwinspect.capture.packets import ACK, PSH, TcpSegment
from kwinspect.capture.tcp import StreamIssue, TcpReassembler
from kwinspect.cli import main
from kwinspect.model import Endpoint
from kwinspect.protocol import decode_request
from kwinspect.protocol.codecs import Limits
from kwinspect.protocol.records import parse_record_set
from kwinspect.stream.framing import FrameSplitter, RequestValidator

ROOT = harness.ROOT


def _peak(fn) -> tuple[object, int]:
    tracemalloc.start()
    try:
        out = fn()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# ---------------------------------------------------------------------------
# protocol: giant lengths, bombs, nesting
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("frame", harness.hostile_frames(), ids=lambda f: f[:4].hex())
def test_giant_lengths_are_issues_not_allocations(frame):
    decode_request(frame)  # compile the schema first: that cost is not the input's
    msg, peak = _peak(lambda: decode_request(frame))
    assert peak < 256 << 10, f"{peak} bytes for a {len(frame)}-byte frame"
    assert any(i.kind == "decode_error" and ("fit" in i.message or "exceeds" in i.message)
               for i in msg.issues), msg.issues


def test_array_of_2_31_elements_in_10_bytes():
    frame = struct.pack(">hhih", 3, 1, 7, 0) + struct.pack(">i", 0x7FFFFFFF) + b"\x00" * 6
    decode_request(frame)
    msg, peak = _peak(lambda: decode_request(frame))
    assert peak < 64 << 10
    assert [i.path for i in msg.issues] == ["topics"]


BOMBS = harness.hostile_record_sets()


@pytest.mark.parametrize("codec_index", [0, 2])  # gzip and zstd bombs
def test_compression_bomb_stops_at_the_cap(codec_index):
    data = BOMBS[codec_index]
    limits = Limits()
    cap = limits.output_cap(len(data))

    def run():
        rs = parse_record_set(data, limits)
        return rs, list(rs.iter_records())

    (rs, records), peak = _peak(run)
    assert records == []
    assert any(i.kind == "limit_exceeded" and "bomb" in i.message for i in rs.issues), rs.issues
    assert peak < cap + (4 << 20), (peak, cap)


def test_small_decompression_cap_is_honoured():
    data = BOMBS[0]
    limits = Limits(max_decompressed_bytes=256 << 10, min_cap=64 << 10, max_ratio=8)
    rs, peak = _peak(lambda: (r := parse_record_set(data, limits), list(r.iter_records()))[0])
    assert any(i.kind == "limit_exceeded" for i in rs.issues)
    assert peak < 2 << 20


def test_deep_legacy_nesting_is_cut_at_the_depth_limit():
    rs = parse_record_set(BOMBS[5])  # 40 levels of gzip'd wrappers
    assert list(rs.iter_records()) == []
    assert any("nested deeper than 2" in i.message for i in rs.issues), rs.issues
    deeper = parse_record_set(BOMBS[5], Limits(max_legacy_depth=100))
    records = list(deeper.iter_records())  # followed all the way down, no recursion error
    assert [r.value for r in records] == [b"v"]


def test_record_count_of_2_31_over_a_few_bytes():
    rs, peak = _peak(lambda: (r := parse_record_set(BOMBS[4]), list(r.iter_records()))[0])
    assert peak < 64 << 10
    assert rs.issues and rs.issues[0].kind == "decode_error"


# ---------------------------------------------------------------------------
# stream and capture limits
# ---------------------------------------------------------------------------

def test_oversized_frame_is_skipped_without_buffering():
    header = struct.pack(">hhih", 0, 3, 1, 1) + b"c"
    sp = FrameSplitter(RequestValidator(), max_frame_size=1 << 20)
    chunk = bytes(64 << 10)

    def run():
        sp.feed(struct.pack(">i", 0x7FFFFFF0) + header, 0.0)
        for _ in range(64):  # 4 MiB of the frame stream past
            sp.feed(chunk, 0.0)
        return sp.events()

    events, peak = _peak(run)
    assert any(getattr(e, "kind", None) == "oversized_frame" for e in events), events
    assert sp.buffered_bytes < (1 << 20)
    assert peak < 1 << 20
    assert sp.accounting_error() is None


def _seg(seq: int, payload: bytes, src=("10.0.0.1", 40000), dst=("10.0.0.2", 9092), ts=1.0):
    return TcpSegment(ts, Endpoint(*src), Endpoint(*dst), seq & 0xFFFFFFFF, 0, ACK | PSH, payload, 1)


def test_out_of_order_buffer_cap_per_connection():
    r = TcpReassembler(max_ooo_bytes=64 << 10)
    events = r.feed(_seg(1000, b"a" * 100))
    for k in range(40):  # a hole of 100 bytes, then 40 KiB chunks out of order beyond it
        events += r.feed(_seg(1200 + k * 40960, b"b" * 40960))
        assert r.buffered_bytes() <= (64 << 10) + 40960
    kinds = [e.issue.kind for e in events if isinstance(e, StreamIssue)]
    assert "limit_exceeded" in kinds
    for ev in r.finish():
        if hasattr(ev, "stats"):
            assert all(st.balanced() for st in ev.stats)


def test_total_buffered_cap_across_connections():
    r = TcpReassembler(max_ooo_bytes=1 << 30, max_total_buffered=256 << 10)
    events = []
    for c in range(8):
        src = ("10.0.0.1", 40000 + c)
        events += r.feed(_seg(1000, b"a", src=src))
        for k in range(4):
            events += r.feed(_seg(2000 + k * 32768, b"b" * 32768, src=src))
        assert r.buffered_bytes() <= (256 << 10) + 32768
    assert any(isinstance(e, StreamIssue) and e.issue.kind == "limit_exceeded"
               and "across connections" in e.issue.message for e in events)


# ---------------------------------------------------------------------------
# the command line on hostile captures
# ---------------------------------------------------------------------------

def _produce_v3(cid: int, topic: bytes, records: bytes) -> bytes:
    body = (struct.pack(">h", -1) + struct.pack(">hi", 1, 30000) + struct.pack(">i", 1)
            + struct.pack(">h", len(topic)) + topic + struct.pack(">i", 1)
            + struct.pack(">i", 0) + struct.pack(">i", len(records)) + records)
    return struct.pack(">hhih", 0, 3, cid, 1) + b"c" + body


def _sized(frame: bytes) -> bytes:
    return struct.pack(">i", len(frame)) + frame


@pytest.fixture(scope="module")
def hostile_pcap(tmp_path_factory):
    path = tmp_path_factory.mktemp("hostile") / "hostile.pcap"
    frames = [
        _produce_v3(1, b"bomb", BOMBS[0]),  # gzip bomb
        _produce_v3(2, b"deep", BOMBS[5]),  # deep nesting
        struct.pack(">hhih", 3, 1, 3, 1) + b"c" + struct.pack(">i", 0x7FFFFFFF) + b"\x00\x01",
    ]
    client = b"".join(_sized(f) for f in frames)
    client += struct.pack(">i", 0x7FFFFFF0) + struct.pack(">hhih", 0, 3, 4, 1) + b"c" + bytes(3000)
    segs = conversation(("10.0.0.1", 40000), ("10.0.0.2", 9092), [("c", client)], mss=1400)
    write_pcap(path, segs)
    return str(path)


def _jsonl(capsys) -> list[dict]:
    out = capsys.readouterr().out
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_cli_errors_report_each_hostile_input(hostile_pcap, capsys):
    assert main(["errors", hostile_pcap, "-F", "jsonl", "-q"]) == 0
    rows = _jsonl(capsys)
    kinds = {r["kind"] for r in rows}
    assert "decode_error" in kinds  # the 2**31-element array
    assert "oversized_frame" in kinds or "truncated_frame" in kinds
    assert any("cannot fit" in (r["message"] or "") for r in rows)


def test_cli_decode_shows_the_bomb_and_the_nesting(hostile_pcap, capsys):
    assert main(["decode", hostile_pcap, "-q"]) == 0
    text = capsys.readouterr().out
    assert "possible decompression bomb" in text
    assert "nested deeper than" in text


def test_cli_records_and_summary_survive(hostile_pcap, capsys):
    assert main(["records", hostile_pcap, "-F", "jsonl", "-q"]) == 0
    capsys.readouterr()
    assert main(["summary", hostile_pcap, "-F", "json", "-q"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["exchanges"] >= 3
    assert main(["stats", hostile_pcap, "-F", "jsonl", "-q"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sum(r["amount"] for r in rows if r["series"] == "requests") == summary["exchanges"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "kwinspect.cli", *args], capture_output=True,
                          text=True, env=env, timeout=300)


@pytest.fixture(scope="module")
def broken_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("broken")
    real = os.path.join(ROOT, "captures", "confluent-mock-produce-consume.pcap")
    with open(real, "rb") as f:
        data = f.read()
    files = {
        "garbage": os.urandom(4096),
        "empty": b"",
        "gzip-garbage": b"\x1f\x8b\x08\x00" + os.urandom(500),
        "truncated": data[: len(data) * 2 // 3 + 7],
        "truncated-gzip": gzip.compress(data)[:5000],
    }
    out = {}
    for name, blob in files.items():
        p = d / f"{name}.pcap"
        p.write_bytes(blob)
        out[name] = str(p)
    return out


@pytest.mark.parametrize("name", ["garbage", "empty", "gzip-garbage"])
def test_unreadable_files_fail_with_one_line(broken_files, name):
    res = _cli("errors", broken_files[name], "-F", "jsonl")
    assert res.returncode == 1, res
    assert "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr


@pytest.mark.parametrize("name", ["truncated", "truncated-gzip"])
def test_truncated_captures_are_reported_and_exit_0(broken_files, name):
    res = _cli("errors", broken_files[name], "-F", "jsonl")
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    kinds = {json.loads(line)["kind"] for line in res.stdout.splitlines()}
    assert "truncated_packet" in kinds, kinds


def test_tiny_out_of_order_segments_are_capped_by_count():
    # found while hunting hangs: 1-byte segments arriving in reverse order behind a hole
    # stayed under the byte cap, and each one was a list insert at the front (quadratic
    # time, ~80 bytes of objects per payload byte)
    r = TcpReassembler()
    events = r.feed(_seg(1000, b"a"))
    for k in range(50_000, 0, -1):
        events += r.feed(_seg(1002 + 2 * k, b"b"))
        assert r.buffered_bytes() <= r.max_ooo_segments + 1
    assert any(isinstance(e, StreamIssue) and e.issue.kind == "limit_exceeded" for e in events)
    for ev in r.finish():
        if hasattr(ev, "stats"):
            assert all(st.balanced() for st in ev.stats)


def test_orphan_responses_do_not_try_hundreds_of_schemas():
    # a connection that used every api/version, then answers nobody asked for: each orphan
    # response used to be decoded with every api/version seen (~5 ms each, unbounded work)
    from kwinspect.stream.conversation import MAX_ORPHAN_CANDIDATES, Conversation

    conv = Conversation(Endpoint("10.0.0.1", 40000), Endpoint("10.0.0.2", 9092))
    for cid, (key, version) in enumerate(harness.api_versions()):
        if key in (17, 36):  # SASL changes the conversation's state
            continue
        conv.on_request(struct.pack(">hhih", key, version, cid, -1), 1.0, 1.0)
    assert len(conv._api_versions_seen) > MAX_ORPHAN_CANDIDATES
    conv.pop_events()
    calls = []
    import kwinspect.stream.conversation as conversation_module

    real = conversation_module.decode_response
    conversation_module.decode_response = lambda *a: calls.append(a) or real(*a)
    try:
        conv.on_response(struct.pack(">i", 10**9) + b"\x00" * 64, 2.0, 2.0)
    finally:
        conversation_module.decode_response = real
    assert len(calls) <= MAX_ORPHAN_CANDIDATES
    assert any(getattr(e, "status", None) == "request_missing" for e in conv.pop_events())


def test_a_record_claiming_60_mib_in_a_small_gzip_file_costs_little_memory():
    # found by make fuzz (tracemalloc peak 64 MiB on an 8 KB input): the reader asked
    # the gzip stream for the whole claimed record in one read()
    import io

    from kwinspect.capture.readers import open_capture

    header = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 1 << 26, 1)
    record = struct.pack("<IIII", 1, 0, 60 << 20, 60 << 20) + b"\x00" * 500
    data = gzip.compress(header + record)

    def run():
        src = open_capture(io.BytesIO(data))
        packets = list(src)
        return src, packets

    (src, packets), peak = _peak(run)
    assert peak < 16 << 20, peak
    assert [i.kind for i in src.issues if i.kind == "truncated_packet"] == ["truncated_packet"]


def test_unknown_api_key_after_api_versions_is_named_as_such(tmp_path, capsys):
    """An api key no table knows, sent after ApiVersions: the errors row and the diagnose
    finding name it `api key 999 (unknown)`, never `None v0 ... not at all`."""
    import kio.schema.api_versions.v3.request as avq
    import kio.schema.api_versions.v3.response as avr
    from kio.schema.errors import ErrorCode
    from kio.static.primitive import i16, i32Timedelta
    from stream.kio_frames import request_frame, response_frame

    def sized(b: bytes) -> bytes:
        return len(b).to_bytes(4, "big") + b

    req = avq.ApiVersionsRequest(client_software_name="x", client_software_version="1")
    resp = avr.ApiVersionsResponse(
        error_code=ErrorCode(0), throttle_time=i32Timedelta.parse(__import__("datetime").timedelta(0)),
        api_keys=(avr.ApiVersion(api_key=i16(18), min_version=i16(0), max_version=i16(3)),),
        supported_features=(), finalized_features_epoch=-1, finalized_features=(), zk_migration_ready=False)
    unknown = struct.pack(">hhih", 999, 0, 2, 1) + b"c" + b"\x00" * 8
    msgs = [("c", sized(request_frame(req, 1))), ("s", sized(response_frame(resp, 1))),
            ("c", sized(unknown)), ("s", sized(struct.pack(">i", 2) + b"\x00\x00"))]
    path = tmp_path / "unknown.pcap"
    write_pcap(path, conversation(("10.0.0.1", 40000), ("10.0.0.2", 9092), msgs, ts0=1_700_000_000.0))
    assert main(["errors", str(path), "-F", "jsonl", "-q"]) == 0
    errors = capsys.readouterr().out
    assert "api key 999 (unknown) v0 used, broker advertised no version of it" in errors
    assert main(["diagnose", str(path), "-q"]) == 0
    text = capsys.readouterr().out
    assert "api key 999 (unknown) v0 sent" in text
    assert "None" not in errors + text and "not at all" not in errors + text
